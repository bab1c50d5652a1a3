-- sell.lua — requests decided at their home segment, in one atomic step (the hot path).
-- (prelude.lua is prepended.)
--
-- One call decides n >= 1 requests bound for the same segment and generation: the client
-- coalesces concurrent requests into one call, and a lone request is a batch of one. In order:
--   1. every argument is validated before the first write (a bad request of a batch gets its
--      own `b<name>` reply and is skipped; the others still run);
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
-- every decision), then the ledgers, reservation index entries and events. Should a write fail
-- half-way (it cannot in practice: arguments are checked first, and Redis refuses OOM only
-- before a script's first write), units are counted as taken without a record — lost stock the
-- audit shows — never handed out twice.
--
-- Cost, under a per-user limit: one HMGET of the segment, one HMGET of every ledger the call
-- needs (the generation's ledger hash, a field per user), one HSET of the counters and one
-- HSET of every ledger written (+ ZADD per reservation, + XADD per request with the outbox),
-- whatever the batch size. Without a limit, per request one HGET of its record and, applied,
-- HLEN + HSET + PEXPIREAT of the user's own ledger. TIME only when needed: reservations to
-- reclaim, a record with a lifetime to check or write (every sale without a limit, every
-- reservation). A sale under a per-user limit reads no clock at all.
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
-- The ledgers are not in KEYS: their names are built here from KEYS[1] (`…:g<gen>:led`, or
-- `…:g<gen>:u:<user>` without a limit), all under the segment's hash tag (see the prelude).
-- ARGV[1]     gen        the generation the caller believes in
-- ARGV[2]     hf         the caller's home function version (segments.rs HOME_FN)
-- ARGV[3]     index      this segment's index (the events' parts "<index>:<qty>")
-- ARGV[4]     fence      0: none; else the lock strategies' fence token, which must still be the
--                        segment's `fence`
-- ARGV[5]     c          credits (0..64)
-- ARGV[5+3(i-1)+1..3]    credit i: transfer id (decimal u64, kept as text), donor index, units (> 0)
-- ARGV[6+3c]  n          requests (1..1000)
-- ARGV[7+3c]  requests   one line per request, each ended by "\n":
--                        `<user> <request id> <qty> <resv_ttl_ms> <ttl_ms>`: qty 0 is no request
--                        (the call only credits and reclaims: answered with the stock);
--                        resv_ttl_ms 0 a sale, > 0 a reservation held this long; ttl_ms the
--                        record's lifetime without a per-user limit, and how long an ended
--                        reservation's record outlives its expiry
--
-- Publishes: `R <gen> <segment key>` on <prefix>:stock when expired reservations came back,
-- `M …` when credits added units (stock_event).
--
-- Reply: one string, the n requests' answers in order, separated by one space:
--   <stock_after>          applied (sold, or held as a reservation): the stock after it
--   p                      replay: this (user, request id) applied before; nothing changed
--   s<stock>               short: not enough stock here (after credits and reclaim)
--   l<limit>/<held>/<sold> limit: the user's units here would pass the segment's limit
--   mq | mk                mismatch: same (user, request id), other qty | kind
--   t                      stale: segment missing, of another generation or home function
--   o                      lock lost: the fence token is no longer the caller's
--   b<name>                request refused: argument <name> is bad; nothing written for it
-- Errors (whole call, before any write): a bad gen, hf, index, fence, credit, n, request
-- lines or KEYS that do not match.
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
if n > 1000 or #KEYS ~= 4 or #ARGV ~= nb + 1 or type(ARGV[nb + 1]) ~= 'string' then bad('n') end
local base = seg_base(KEYS[1])
local gbase = base .. 'g' .. gen
if string.sub(KEYS[1], -4) ~= ':seg' or KEYS[2] ~= gbase .. ':resv' or KEYS[3] ~= gbase .. ':in'
    or KEYS[4] ~= base .. 'out' then
  bad('keys')
end

-- The request lines. Each distinct qty and TTL text is checked once per call.
local packed = ARGV[nb + 1]
local lines, nl, total = {}, 0, 0
for line in string.gmatch(packed, '([^\n]*)\n') do
  nl = nl + 1
  lines[nl] = line
  total = total + #line + 1
end
if nl ~= n or total ~= #packed then bad('requests') end
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
-- One line's request: one pattern checks the ids' characters and splits the line; when it
-- fails, each field is checked on its own, so the reply names the bad one.
local function parse(line)
  local u, rid, q, rv, tt = string.match(line, '^([%w_.:%-]+) ([%w_.:%-]+) (%d+) (%d+) (%d+)$')
  if u then
    if #u > 128 then bad('user') end
    if #rid > 128 then bad('request_id') end
  else
    u, rid, q, rv, tt = string.match(line, '^([^ ]*) ([^ ]*) ([^ ]*) ([^ ]*) ([^ ]*)$')
    if not u then bad('request') end
    ident('user', u)
    ident('request_id', rid)
  end
  local r = { u = u, rid = rid, q = q }
  r.qty = num('qty', q, false)
  r.resv = num('resv_ttl_ms', rv, false)
  r.ttl = num('ttl_ms', tt, false)
  return r
end

local out, rs, js = {}, {}, {}
-- Every request parsed under one pcall; only when one is refused, each under its own.
if pcall(function() for j = 1, n do rs[j] = parse(lines[j]) end end) then
  for j = 1, n do js[j] = j end
else
  rs = {}
  for j = 1, n do
    local ok, r = pcall(parse, lines[j])
    if ok then
      local k = #rs + 1
      rs[k], js[k] = r, j
    else
      local msg = type(r) == 'table' and r.err or tostring(r)
      out[j] = 'b' .. (string.match(msg, 'bad argument: (%S+)') or 'request')
    end
  end
end

local v = redis.call('HMGET', KEYS[1], 'gen', 'stock', 'sold', 'reserved', 'tin', 'lim', 'hf', 'out', 'fence')
local refuse
if not v[1] or v[1] ~= gen or v[7] ~= hf then
  refuse = 't'
elseif fence ~= '0' and (v[9] or '0') ~= fence then
  refuse = 'o'
end
if refuse then
  for i = 1, #rs do out[js[i]] = refuse end
  return table.concat(out, ' ')
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

-- The ledgers the requests need. Limited: every one in one HMGET, parsed when first used.
local ledgers = {}
local lkey = gbase .. ':led'
if lim > 0 then
  local users, nu = {}, 0
  for _, r in ipairs(rs) do
    if r.qty > 0 and ledgers[r.u] == nil then
      ledgers[r.u] = false
      nu = nu + 1
      users[nu] = r.u
    end
  end
  if nu > 0 then
    local texts = redis.call('HMGET', lkey, unpack(users))
    for k = 1, nu do
      local l = led_parse(texts[k] or nil)
      l.key, l.user, l.lim = lkey, users[k], lim
      ledgers[users[k]] = l
    end
  end
end

-- Decide each request (reads only; the ledgers as this call changes them).
local acts, dirty, replays = {}, {}, {}
for i, r in ipairs(rs) do
  local reply
  if r.qty == 0 then
    -- No request: the call only credits (and reclaims); the stock after.
    reply = st.stock
  else
    local l = ledgers[r.u]
    if not l then
      l = { key = gbase .. ':u:' .. r.u, user = r.u, lim = 0, recs = {} }
      ledgers[r.u] = l
    end
    local rec = l.recs[r.rid]
    if rec == nil and lim == 0 then
      rec = redis.call('HGET', l.key, '=' .. r.rid) or false
      l.recs[r.rid] = rec
    end
    if rec then
      local s, q, u = rec_parse(rec)
      if s and live(u, u ~= 0 and clock(st) or 0) then
        if q ~= r.qty then
          reply = 'mq'
        elseif (s == 'A') ~= (r.resv == 0) then
          reply = 'mk'
        else
          reply = 'p'
          -- A replay rewrites its record as it is: the call then has a write of its own, so
          -- the durability mode's WAIT after it covers the original write too (replication
          -- is in order), without relying on how a WAIT after a read-only call behaves.
          replays[#replays + 1] = { l, r.rid, rec }
        end
      end
    end
    if not reply then
      if lim > 0 and l.h + r.qty > lim then
        reply = 'l' .. int(lim) .. '/' .. int(l.h) .. '/' .. int(l.f)
      elseif st.stock < r.qty then
        reply = 's' .. int(st.stock)
      else
        st.stock = st.stock - r.qty
        local val
        if r.resv == 0 then
          st.sold = st.sold + r.qty
          r.untl = lim > 0 and 0 or clock(st) + r.ttl
          val = 'A:' .. r.q .. ':' .. int(r.untl) .. ':0'
        else
          st.reserved = st.reserved + r.qty
          r.exp = clock(st) + r.resv
          r.untl = r.exp + r.ttl
          val = 'R:' .. r.q .. ':' .. int(r.untl) .. ':' .. int(r.exp)
        end
        if lim > 0 then
          -- The ledger forgets its records past `until` first when it holds 32, 64, 128, …
          -- of them (prunes_at); a dead record of this very id is then replaced.
          if prunes_at(l.n) then
            local now = clock(st)
            for id, x in pairs(l.recs) do
              local _, _, xu = rec_parse(x)
              if not live(xu, now) then
                l.recs[id] = nil
                l.n = l.n - 1
              end
            end
          end
          if l.recs[r.rid] == nil then l.n = l.n + 1 end
          l.h = l.h + r.qty
          if r.resv == 0 then l.f = l.f + r.qty end
          if not dirty[r.u] then
            dirty[r.u] = true
            dirty[#dirty + 1] = l
          end
        end
        l.recs[r.rid] = val
        r.val, r.l = val, l
        acts[#acts + 1] = r
        reply = int(st.stock)
      end
    end
  end
  out[js[i]] = reply
end

-- Counters once, then the records.
flush(st)
if lim > 0 then
  -- Every ledger written (and every replayed one rewritten as it is) in one HSET.
  local args, k = { 'HSET', lkey }, 2
  for _, l in ipairs(dirty) do
    args[k + 1], args[k + 2], k = l.user, led_text(l), k + 2
  end
  for _, x in ipairs(replays) do
    if not dirty[x[1].user] then
      dirty[x[1].user] = true
      args[k + 1], args[k + 2], k = x[1].user, led_text(x[1]), k + 2
    end
  end
  if k > 2 then redis.call(unpack(args)) end
else
  for _, x in ipairs(replays) do redis.call('HSET', x[1].key, '=' .. x[2], x[3]) end
end
for _, r in ipairs(acts) do
  if lim == 0 then
    local lk = r.l.key
    local had = redis.call('HLEN', lk)
    if prunes_at(had) then
      -- Forget the records past their `until` before taking another (prunes_at).
      local now, all, gone = clock(st), redis.call('HGETALL', lk), {}
      for k = 1, #all, 2 do
        local s, _, u = rec_parse(all[k + 1])
        if s and not live(u, now) then gone[#gone + 1] = all[k] end
      end
      for k = 1, #gone, 1000 do
        redis.call('HDEL', lk, unpack(gone, k, math.min(k + 999, #gone)))
      end
    end
    redis.call('HSET', lk, '=' .. r.rid, r.val)
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
return table.concat(out, ' ')
