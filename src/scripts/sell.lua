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
-- whatever the batch size. Per request only table lookups and, for a new buyer's sale (the hot
-- path), one string built: the Lua of this Redis costs ~0.3 µs per table or string made and
-- ~1 µs per pattern match with captures (measured), so none is made per request that a
-- per-call table or a cache can replace. Without a limit, per request one HGET of its record and, applied,
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
-- KEYS[5]     limited ledgers     <prefix>:{<tag>}:g<gen>:led (one field per user; declared so
--                                  that Redis refuses a call it may not run — ACL key rights,
--                                  a slot being migrated — before it writes anything)
-- Without a limit, each user's ledger `…:g<gen>:u:<user>` is named here from KEYS[1] (same hash
-- tag, see the prelude); every request's record is read before the first write, so a key Redis
-- refuses fails the call before it wrote anything.
-- ARGV[1]     gen        the generation the caller believes in
-- ARGV[2]     hf         the caller's home function version (segments.rs HOME_FN)
-- ARGV[3]     index      this segment's index (the events' parts "<index>:<qty>")
-- ARGV[4]     fence      0: none; else the lock strategies' fence token, which must still be the
--                        segment's `fence`
-- ARGV[5]     c          credits (0..64)
-- ARGV[5+3(i-1)+1..3]    credit i: transfer id (decimal u64, kept as text), donor index, units (> 0)
-- ARGV[6+3c]  n          requests (1..1000)
-- ARGV[6+3c+3(j-1)+1..3] request j: user, request id, spec `<qty>:<resv_ttl_ms>:<ttl_ms>`:
--                        qty 0 is no request (the call only credits and reclaims); resv_ttl_ms
--                        0 a sale, > 0 a reservation held this long; ttl_ms the record's
--                        lifetime without a per-user limit, and how long an ended reservation's
--                        record outlives its expiry
--
-- Publishes: `R <gen> <segment key>` on <prefix>:stock when expired reservations came back,
-- `M …` when credits added units (stock_event).
--
-- Reply: one string: the stock once credited and reclaimed (before the first request; 0 when
-- every request is refused), then the n requests' answers in order, each after one space:
--   a                      applied (sold, held as a reservation, or qty 0): the stock after it
--                          is the first figure less the qty of every `a` up to this one
--   p                      replay: this (user, request id) applied before; nothing changed
--   s                      short: not enough stock here (the stock is the figure above)
--   l<limit>/<held>/<sold> limit: the user's units here would pass the segment's limit
--   mq | mk                mismatch: same (user, request id), other qty | kind
--   t                      stale: segment missing, of another generation or home function
--   o                      lock lost: the fence token is no longer the caller's
--   b<name>                request refused: argument <name> is bad; nothing written for it
-- Errors (whole call, before any write): a bad gen, hf, index, fence, credit or n, or KEYS or
-- an ARGV count that do not match.
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
if n > 1000 or #KEYS ~= 5 or #ARGV ~= nb + 3 * n then bad('n') end
local base = seg_base(KEYS[1])
local gbase = base .. 'g' .. gen
if string.sub(KEYS[1], -4) ~= ':seg' or KEYS[2] ~= gbase .. ':resv' or KEYS[3] ~= gbase .. ':in'
    or KEYS[4] ~= base .. 'out' or KEYS[5] ~= gbase .. ':led' then
  bad('keys')
end

-- The requests. Every id's characters at once: the requests' arguments joined by ':' and
-- searched for each byte ident() refuses (whitespace, braces) with plain finds — a pattern with
-- a character class costs ~20 ns per byte here, a plain find ~1. Only when one is found is
-- each id checked on its own (naming the bad one); else each id's length alone. Each distinct
-- spec is parsed once per call.
local strict = false
do
  local all, find = table.concat(ARGV, ':', nb + 1), string.find
  for _, ch in ipairs({ ' ', '{', '}', '\n', '\r', '\t', '\v', '\f' }) do
    if find(all, ch, 1, true) then
      strict = true
      break
    end
  end
end
local specs = {}
local function spec(v)
  local x = specs[v]
  if x then return x end
  local q, rv, tt = string.match(v, '^([^:]*):([^:]*):([^:]*)$')
  if not q then bad('qty') end
  x = { qty = uint('qty', q), q = q, resv = uint('resv_ttl_ms', rv), ttl = uint('ttl_ms', tt) }
  specs[v] = x
  return x
end
local U, R, S = {}, {}, {}
local function check(j)
  local b = nb + 3 * (j - 1)
  local u, rid = ARGV[b + 1], ARGV[b + 2]
  if strict then
    ident('user', u)
    ident('request_id', rid)
  else
    local lu, lr = #u, #rid
    if lu == 0 or lu > 128 then bad('user') end
    if lr == 0 or lr > 128 then bad('request_id') end
  end
  S[j] = spec(ARGV[b + 3])
  U[j], R[j] = u, rid
end

-- out[j]: request j's answer (see the header); js: the requests to decide, in order.
local out, js = {}, {}
-- Every request checked under one pcall; only when one is refused, each under its own.
if pcall(function() for j = 1, n do check(j) end end) then
  for j = 1, n do js[j] = j end
else
  for j = 1, n do
    local ok, e = pcall(check, j)
    if ok then
      js[#js + 1] = j
    else
      U[j] = nil
      local msg = type(e) == 'table' and e.err or tostring(e)
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
  for _, j in ipairs(js) do out[j] = refuse end
  return '0 ' .. table.concat(out, ' ')
end
local st = open(KEYS[1], { 'gen', 'stock', 'sold', 'reserved', 'tin', 'lim', 'hf', 'out' }, v)
local lim = st.lim
local ob = outbox(KEYS[1], KEYS[4], st.out)
outbox_ready(ob)

-- ledgers[user]: false (none: a new buyer), a text (as stored, or written by this call for a
-- new buyer's sale; parsed when next needed) or a parsed ledger.
local ledgers = {}
local lkey = KEYS[5]

-- Without a limit: the user's own ledger, and the record of `rid` in it (read once per call).
local function own_rec(u, rid)
  local l = ledgers[u]
  if not l then
    l = { key = gbase .. ':u:' .. u, user = u, lim = 0, recs = {} }
    ledgers[u] = l
  end
  local rec = l.recs[rid]
  if rec == nil then
    rec = redis.call('HGET', l.key, '=' .. rid) or false
    l.recs[rid] = rec
  end
  return l, rec
end
if lim == 0 then
  for _, j in ipairs(js) do
    if S[j].qty > 0 then own_rec(U[j], R[j]) end
  end
end

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
-- The reclaim rewrote records (R to X): read them again.
if back > 0 and lim == 0 then ledgers = {} end
local stock0 = st.stock

-- The ledgers the requests need. Limited: every one in one HMGET.
if lim > 0 then
  local users, nu = {}, 0
  for _, j in ipairs(js) do
    local u = U[j]
    if ledgers[u] == nil and S[j].qty > 0 then
      ledgers[u] = false
      nu = nu + 1
      users[nu] = u
    end
  end
  if nu > 0 then
    local texts = redis.call('HMGET', lkey, unpack(users))
    for k = 1, nu do ledgers[users[k]] = texts[k] end
  end
end

-- The ledger of `u`, parsed (lim > 0).
local function parsed(u)
  local l = ledgers[u]
  if type(l) ~= 'table' then
    l = led_parse(l or nil)
    l.key, l.user, l.lim = lkey, u, lim
    ledgers[u] = l
  end
  return l
end

-- A new buyer's one sale, as a ledger text: `<q> <q> <request id> A:<q>:0:0`.
local fresh_pre, fresh_suf = {}, {}
local function fresh_sale(sp, rid)
  local pre = fresh_pre[sp.q]
  if not pre then
    pre = sp.q .. ' ' .. sp.q .. ' '
    fresh_pre[sp.q], fresh_suf[sp.q] = pre, ' A:' .. sp.q .. ':0:0'
  end
  return pre .. rid .. fresh_suf[sp.q]
end

-- Decide each request (reads only; the ledgers as this call changes them).
local acts, ax, dirty, replays = {}, {}, {}, {}
local na, nd, held = 0, 0, false
-- Lists user `u`'s ledger once among those the final HSET writes (limited ledgers).
local function touch(u)
  if not dirty[u] then
    nd = nd + 1
    dirty[nd] = u
    dirty[u] = true
  end
end
for _, j in ipairs(js) do
  local u, rid, sp = U[j], R[j], S[j]
  local qty = sp.qty
  local reply
  if qty == 0 then
    -- No request: the call only credits (and reclaims); the stock after.
    reply = 'a'
  elseif lim > 0 and ledgers[u] == false and sp.resv == 0 then
    -- The hot path: a new buyer's sale. No record, nothing held.
    if qty > lim then
      reply = 'l' .. int(lim) .. '/0/0'
    elseif st.stock < qty then
      reply = 's'
    else
      st.stock = st.stock - qty
      st.sold = st.sold + qty
      ledgers[u] = fresh_sale(sp, rid)
      touch(u)
      na = na + 1
      acts[na] = j
      reply = 'a'
    end
  else
    local l
    local rec
    if lim > 0 then
      l = parsed(u)
      rec = l.recs[rid]
    else
      l, rec = own_rec(u, rid)
    end
    if rec then
      local s, q, un = rec_parse(rec)
      if s and live(un, un ~= 0 and clock(st) or 0) then
        if q ~= qty then
          reply = 'mq'
        elseif (s == 'A') ~= (sp.resv == 0) then
          reply = 'mk'
        else
          reply = 'p'
          -- A replay rewrites its record as it is: the call then has a write of its own, so
          -- the durability mode's WAIT after it covers the original write too (replication
          -- is in order), without relying on how a WAIT after a read-only call behaves.
          if lim > 0 then
            touch(u)
          else
            replays[#replays + 1] = { l.key, '=' .. rid, rec }
          end
        end
      end
    end
    if not reply then
      if lim > 0 and l.h + qty > lim then
        reply = 'l' .. int(lim) .. '/' .. int(l.h) .. '/' .. int(l.f)
      elseif st.stock < qty then
        reply = 's'
      else
        st.stock = st.stock - qty
        local val
        if sp.resv == 0 then
          st.sold = st.sold + qty
          l.untl = lim > 0 and 0 or clock(st) + sp.ttl
          val = 'A:' .. sp.q .. ':' .. int(l.untl) .. ':0'
        else
          st.reserved = st.reserved + qty
          held = true
          l.exp = clock(st) + sp.resv
          l.untl = l.exp + sp.ttl
          val = 'R:' .. sp.q .. ':' .. int(l.untl) .. ':' .. int(l.exp)
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
          if l.recs[rid] == nil then l.n = l.n + 1 end
          l.h = l.h + qty
          if sp.resv == 0 then l.f = l.f + qty end
          touch(u)
        end
        l.recs[rid] = val
        na = na + 1
        acts[na] = j
        -- What the writes below need, by request.
        if lim == 0 then
          ax[j] = { l = l, val = val, untl = l.untl, exp = l.exp }
        elseif sp.resv > 0 then
          ax[j] = { exp = l.exp }
        end
        reply = 'a'
      end
    end
  end
  out[j] = reply
end

-- Counters once, then the records.
flush(st)
if lim > 0 then
  -- Every ledger written (and every replayed one rewritten as it is) in one HSET.
  local args, k = { 'HSET', lkey }, 2
  for _, u in ipairs(dirty) do
    local l = ledgers[u]
    args[k + 1], args[k + 2], k = u, type(l) == 'table' and led_text(l) or l, k + 2
  end
  if k > 2 then redis.call(unpack(args)) end
end
-- The writes each applied request needs beyond its ledger: none for a sale under a limit
-- without the outbox (the hot path).
if lim > 0 and not ob.on and not held then na = 0 end
for i = 1, na do
  local j = acts[i]
  local u, rid, sp, a = U[j], R[j], S[j], ax[j]
  if lim == 0 then
    local lk = a.l.key
    local had = redis.call('HLEN', lk)
    if prunes_at(had) then
      -- Forget the records past their `until` before taking another (prunes_at).
      local now, all, gone = clock(st), redis.call('HGETALL', lk), {}
      for k = 1, #all, 2 do
        local s, _, un = rec_parse(all[k + 1])
        if s and not live(un, now) then gone[#gone + 1] = all[k] end
      end
      for k = 1, #gone, 1000 do
        redis.call('HDEL', lk, unpack(gone, k, math.min(k + 999, #gone)))
      end
    end
    redis.call('HSET', lk, '=' .. rid, a.val)
    if sp.resv > 0 then
      -- A ledger holding a reservation keeps no TTL from now on (as with a limit: it goes with
      -- the generation): its record must be there when the reclaim returns the units, however
      -- late that runs (Segment::reclaim never misses one).
      if had > 0 then redis.call('PERSIST', lk) end
    elseif had == 0 then
      -- The ledger lives as long as its latest record: a fresh key gets the record's `until`,
      redis.call('PEXPIREAT', lk, int(a.untl))
    else
      -- an older one the later of the two (GT: a ledger without a TTL keeps none).
      redis.call('PEXPIREAT', lk, int(a.untl), 'GT')
    end
  end
  if sp.resv > 0 then redis.call('ZADD', KEYS[2], int(a.exp), u .. ' ' .. rid) end
  if ob.on then emit(ob, sp.resv > 0 and 'reserved' or 'sold', gen, rid, u, sp.q, index .. ':' .. sp.q) end
end
-- Without a limit, replays rewrite their records last: a twin's replay written before its
-- twin's ledger write would count as a record already there (no TTL for a fresh ledger).
for _, x in ipairs(replays) do redis.call('HSET', x[1], x[2], x[3]) end
if back > 0 then
  stock_event('R', gen, KEYS[1])
elseif credited > 0 then
  stock_event('M', gen, KEYS[1])
end
return int(stock0) .. ' ' .. table.concat(out, ' ')
