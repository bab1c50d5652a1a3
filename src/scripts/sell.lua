-- sell.lua — requests decided at their home segment, in one atomic step (the hot path).
-- (prelude.lua is prepended.)
--
-- One call decides n >= 1 requests bound for the same segment and generation: the client
-- coalesces concurrent requests into one call, and a lone request is a batch of one. In order:
--   1. every argument is validated before the first write (a bad request of a batch gets its
--      own {"bad", ...} reply and is skipped; the others still run);
--   2. the segment: missing, of another generation or loaded with another home function
--      -> every request "stale"; a fence token given that is not the segment's -> every
--      request "lock_lost"; nothing written in either case;
--   3. the credits: each transfer id is credited once per generation (HSETNX on the credits
--      hash): stock += units, tin += units — whatever the requests' answers;
--   4. every expired reservation goes back to stock (the prelude's reclaim, no cap);
--   5. each request, in the order given, exactly as Segment::sell (src/store/memory/segment.rs)
--      decides it: a live record of its request id -> replay or mismatch (qty, then kind);
--      with a per-user limit, the user's held units + qty over the limit -> limit; stock below
--      qty -> short; otherwise applied: the units sold (or held as a reservation), the record
--      written into the user's ledger, the outbox event appended.
-- A request id repeated within one call sees its twin exactly as if the twin had been written
-- before (replay, or mismatch).
--
-- Writes: counters before records (the segment's stock, sold, reserved, tin move once, after
-- every decision), then each applied request's record, ledger units, TTL, reservation index
-- entry and event. Should a write fail half-way (it cannot in practice: arguments are checked
-- first, and Redis refuses OOM only before a script's first write), units are counted as taken
-- without a record — lost stock the audit shows — never handed out twice.
--
-- Cost: one HMGET of the segment, one HMGET (no limit: one HGET) per user's ledger, one HSET of
-- the counters, and per request applied HLEN + HSET (+ PEXPIREAT for a sale without a limit,
-- + ZADD (and PERSIST) for a reservation, + XADD with the outbox). TIME only when needed: reservations to reclaim, a
-- record with a lifetime to check, a record to write with a lifetime (every sale without a
-- limit, every reservation). A sale under a per-user limit reads no clock at all.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]     segment hash        <prefix>:{<tag>}:seg   (fields gen, stock, sold, reserved,
--                                  tin, lim, hf, out, fence; loaded, restocked, tout untouched)
-- KEYS[2]     reservation index   <prefix>:{<tag>}:g<gen>:resv
-- KEYS[3]     credits             <prefix>:{<tag>}:g<gen>:in
-- KEYS[4]     outbox stream       <prefix>:{<tag>}:out (appended to when the segment's `out` is
--                                  1: one `sold` / `reserved` event per request applied,
--                                  `expired` per reservation reclaimed)
-- KEYS[4+j]   ledger of request j's user   <prefix>:{<tag>}:g<gen>:u:<user j> (must be exactly
--             that name; the reclaim builds other users' ledger names the same way, from
--             KEYS[1]: all under the segment's hash tag, see the prelude)
-- ARGV[1]     gen        the generation the caller believes in
-- ARGV[2]     hf         the caller's home function version (segments.rs HOME_FN)
-- ARGV[3]     index      this segment's index (the events' parts "<index>:<qty>")
-- ARGV[4]     fence      0: none; else the lock strategies' fence token, which must still be the
--                        segment's `fence`
-- ARGV[5]     c          credits (0..64)
-- ARGV[5+3(i-1)+1..3]    credit i: transfer id (decimal u64, kept as text), donor index, units (> 0)
-- ARGV[6+3c]  n          requests (1..1000)
-- ARGV[6+3c+5(j-1)+1..5] request j: user, request id, qty (0: no request, the call only credits
--                        and reclaims: answered with the stock), resv_ttl_ms (0: a sale; > 0: a
--                        reservation held this long), ttl_ms (the record's lifetime without a
--                        per-user limit, and how long an ended reservation's record outlives
--                        its expiry)
--
-- Publishes: `R <gen> <segment key>` on <prefix>:stock when credits added units or expired
-- reservations came back (stock_event).
--
-- Reply: an array of n replies, reply j for request j:
--   stock_after (an integer)      applied (sold, or held as a reservation)
--   {"replay"}                    this (user, request id) applied before; nothing changed
--   {"short", stock}              not enough stock here (after credits and reclaim)
--   {"limit", limit, held, sold}  the user's units here would pass the segment's limit
--   {"mismatch", "qty" | "kind"}  same (user, request id), other qty or kind
--   {"stale"}                     segment missing, of another generation or home function
--   {"lock_lost"}                 the fence token is no longer the caller's; nothing written
--   {"bad", "ERR shardstock bad argument: <name>"}   request j refused; nothing written for it
-- Errors (whole call, before any write): a bad gen, hf, index, fence, credit, n, or a KEYS/ARGV
-- count or name that does not match.
local gen = ARGV[1]
uint('gen', gen)
local hf = ARGV[2]
uint('hf', hf)
local index = ARGV[3]
uint('index', index)
local fence = ARGV[4]
uint('fence', fence)
local c = uint('credits', ARGV[5])
if c > 64 then bad('credits') end
local credits = {}
for i = 1, c do
  local b = 5 + 3 * (i - 1)
  uint('donor', ARGV[b + 2])
  credits[i] = { id = txid('transfer_id', ARGV[b + 1]), units = posint('units', ARGV[b + 3]), us = ARGV[b + 3] }
end
local nb = 6 + 3 * c
local n = posint('n', ARGV[nb])
if n > 1000 or #KEYS ~= 4 + n or #ARGV ~= nb + 5 * n then bad('n') end
local base = seg_base(KEYS[1])
local gbase = base .. 'g' .. gen
if string.sub(KEYS[1], -4) ~= ':seg' or KEYS[2] ~= gbase .. ':resv' or KEYS[3] ~= gbase .. ':in'
    or KEYS[4] ~= base .. 'out' then
  bad('keys')
end
local lpre = gbase .. ':u:'

-- Each distinct qty and TTL text is checked once per call.
local okn = {}
local function num(name, v, positive)
  local x = okn[v]
  if x == nil then
    x = positive and posint(name, v) or uint(name, v)
    okn[v] = x
  elseif positive and x == 0 then
    bad(name)
  end
  return x
end
local function parse(j)
  local b = nb + 5 * (j - 1)
  local u = ident('user', ARGV[b + 1])
  local rid = ident('request_id', ARGV[b + 2])
  local r = { u = u, rid = rid, q = ARGV[b + 3], lk = KEYS[4 + j] }
  r.qty = num('qty', r.q, false)
  r.resv = num('resv_ttl_ms', ARGV[b + 4], false)
  r.ttl = num('ttl_ms', ARGV[b + 5], false)
  if r.lk ~= lpre .. u then bad('ledger_key') end
  return r
end

local out, rs, js = {}, {}, {}
-- Every request parsed under one pcall; only when one is refused, each under its own.
if pcall(function() for j = 1, n do rs[j] = parse(j) end end) then
  for j = 1, n do js[j] = j end
else
  rs = {}
  for j = 1, n do
    local ok, r = pcall(parse, j)
    if ok then
      local k = #rs + 1
      rs[k], js[k] = r, j
    else
      out[j] = { 'bad', type(r) == 'table' and r.err or tostring(r) }
    end
  end
end

local v = redis.call('HMGET', KEYS[1], 'gen', 'stock', 'sold', 'reserved', 'tin', 'lim', 'hf', 'out', 'fence')
local refuse
if not v[1] or v[1] ~= gen or v[7] ~= hf then
  refuse = { 'stale' }
elseif fence ~= '0' and (v[9] or '0') ~= fence then
  refuse = { 'lock_lost' }
end
if refuse then
  for i = 1, #rs do out[js[i]] = refuse end
  return out
end
local st = open(KEYS[1], { 'gen', 'stock', 'sold', 'reserved', 'tin', 'lim', 'hf', 'out' }, v)
local lim = st.lim
local ob = outbox(KEYS[1], KEYS[4], st.out)
outbox_ready(ob)

-- Credits, once per transfer id and generation.
local credited = 0
for _, cr in ipairs(credits) do
  if redis.call('HSETNX', KEYS[3], cr.id, cr.us) == 1 then
    st.stock = st.stock + cr.units
    st.tin = st.tin + cr.units
    credited = credited + cr.units
  end
end

-- Expired reservations (only a segment holding some can have any).
local back = 0
if st.reserved > 0 then back = reclaim(st, gen, KEYS[2], ob) end

-- Decide each request (reads only; the ledgers as this call changes them, by user).
local ledgers, acts, replays = {}, {}, {}
for i, r in ipairs(rs) do
  local l = ledgers[r.u]
  local f = '=' .. r.rid
  if r.qty == 0 then
    -- No request: the call only credits (and reclaims); the stock after.
    l = false
  elseif not l then
    if lim > 0 then
      local x = redis.call('HMGET', r.lk, 'h', 'f', f)
      l = { h = tonumber(x[1] or '0'), f = tonumber(x[2] or '0'), recs = { [r.rid] = x[3] or false } }
    else
      l = { h = 0, f = 0, recs = { [r.rid] = redis.call('HGET', r.lk, f) or false } }
    end
    ledgers[r.u] = l
  elseif l.recs[r.rid] == nil then
    l.recs[r.rid] = redis.call('HGET', r.lk, f) or false
  end
  local reply
  local rec = l and l.recs[r.rid]
  if not l then
    reply = st.stock
  elseif rec then
    local s, q, u = rec_parse(rec)
    if s and live(u, u ~= 0 and clock(st) or 0) then
      if q ~= r.qty then
        reply = { 'mismatch', 'qty' }
      elseif (s == 'A') ~= (r.resv == 0) then
        reply = { 'mismatch', 'kind' }
      else
        reply = { 'replay' }
        -- A replay rewrites its record as it is: the call then has a write of its own, so the
        -- durability mode's WAIT after it covers the original write too (replication is in
        -- order), without relying on how a WAIT after a read-only call behaves.
        replays[#replays + 1] = { r.lk, f, rec }
      end
    end
  end
  if not reply then
    if lim > 0 and l.h + r.qty > lim then
      reply = { 'limit', lim, l.h, l.f }
    elseif st.stock < r.qty then
      reply = { 'short', st.stock }
    else
      st.stock = st.stock - r.qty
      if r.resv == 0 then
        st.sold = st.sold + r.qty
        r.untl = lim > 0 and 0 or clock(st) + r.ttl
        r.val = 'A:' .. r.q .. ':' .. int(r.untl) .. ':0'
      else
        st.reserved = st.reserved + r.qty
        r.exp = clock(st) + r.resv
        r.untl = r.exp + r.ttl
        r.val = 'R:' .. r.q .. ':' .. int(r.untl) .. ':' .. int(r.exp)
      end
      l.recs[r.rid] = r.val
      if lim > 0 then
        l.h = l.h + r.qty
        if r.resv == 0 then l.f = l.f + r.qty end
      end
      r.f, r.l = f, l
      acts[#acts + 1] = r
      reply = st.stock
    end
  end
  out[js[i]] = reply
end

-- Counters once, then the records.
flush(st)
for _, x in ipairs(replays) do redis.call('HSET', x[1], x[2], x[3]) end
for _, r in ipairs(acts) do
  local lk = r.lk
  local had = redis.call('HLEN', lk)
  -- Record fields: with a limit the ledger also holds `h` and `f` (both, once written).
  local nrec = (lim > 0 and had > 0) and had - 2 or had
  local p = 32
  while p < nrec do p = p * 2 end
  if nrec >= 32 and p == nrec then
    -- prunes_at (segment.rs): at 32 records or any larger power of two, forget the records
    -- past their `until` before taking another (amortised O(1) per write).
    local now, all, gone = clock(st), redis.call('HGETALL', lk), {}
    for k = 1, #all, 2 do
      if string.sub(all[k], 1, 1) == '=' then
        local s, _, u = rec_parse(all[k + 1])
        if s and not live(u, now) then gone[#gone + 1] = all[k] end
      end
    end
    for k = 1, #gone, 1000 do
      redis.call('HDEL', lk, unpack(gone, k, math.min(k + 999, #gone)))
    end
  end
  if lim > 0 then
    redis.call('HSET', lk, r.f, r.val, 'h', int(r.l.h), 'f', int(r.l.f))
  else
    redis.call('HSET', lk, r.f, r.val)
    if r.resv > 0 then
      -- A ledger holding a reservation keeps no TTL from now on (as with a limit: it goes with
      -- the generation): its record must be there when the reclaim returns the units, however
      -- late that runs (Segment::reclaim never misses one).
      if had > 0 then redis.call('PERSIST', lk) end
    elseif had == 0 then
      -- The ledger lives as long as its latest record: a fresh key gets the record's `until`,
      redis.call('PEXPIREAT', lk, int(r.untl))
    else
      -- an older one the later of the two (GT: a ledger without a TTL keeps none).
      redis.call('PEXPIREAT', lk, int(r.untl), 'GT')
    end
  end
  if r.resv > 0 then redis.call('ZADD', KEYS[2], int(r.exp), r.u .. ' ' .. r.rid) end
  emit(ob, r.resv > 0 and 'reserved' or 'sold', gen, r.rid, r.u, r.q, index .. ':' .. r.q)
end
if back > 0 then
  stock_event('R', gen, KEYS[1])
elseif credited > 0 then
  stock_event('M', gen, KEYS[1])
end
return out
