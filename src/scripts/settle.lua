-- settle.lua — an order's decision brought to one of its items at the item's home segment,
-- exactly once. (prelude.lua is prepended.)
--
-- An order item is held by sell.lua (record O, indexed in the hold index, counted in
-- `reserved`) and has no clock of its own: only this script ends it, with what the order's
-- record decided (src/cart.rs). Mirrors Segment::settle (src/store/memory/segment/holds.rs):
-- first every expired reservation returns (the prelude's reclaim), then
--   O + post -> P (reserved -> sold; with a per-user limit the units count in the user's `f`
--               and the record is kept for the generation);
--   O + void -> V (reserved -> stock; with a limit the user's `h` drops);
--   P + post, V + void -> done again (idempotent); P + void, V + post -> ended;
--   no live record + void -> a V record of `ttl_ms`, nothing else: the hold, should it arrive
--               later (a slow or re-sent call), replays it and takes nothing;
--   no live record + post -> unknown (nothing is sold that was not held);
--   a record of another kind or quantity -> mismatch.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash          <prefix>:{<tag>}:seg
-- KEYS[2]  reservation index     <prefix>:{<tag>}:g<gen>:resv (the reclaim)
-- KEYS[3]  outbox stream         <prefix>:{<tag>}:out (outbox on: `confirmed` / `cancelled`
--                                 when this call ends a held item, `expired` per reservation
--                                 reclaimed first)
-- KEYS[4]  limited ledgers       <prefix>:{<tag>}:g<gen>:led (declared: see sell.lua)
-- KEYS[5]  hold index            <prefix>:{<tag>}:g<gen>:hold
-- ARGV[1]  gen
-- ARGV[2]  user
-- ARGV[3]  request id            the item's: `<order request id>#<n>`
-- ARGV[4]  qty                   the item's units (> 0)
-- ARGV[5]  action                "post" | "void"
-- ARGV[6]  ttl_ms                how long an ended record is remembered
--
-- Publishes: `R <gen> <segment key>` on <prefix>:stock when units came back.
--
-- Reply: {"done", state} (state P or V: now or already) | {"ended", state} | {"unknown"} |
--        {"mismatch"} | {"stale"} (segment missing or of another generation)
-- Errors: "ERR shardstock bad argument: <name>" before any write.
local gen = ARGV[1]
uint('gen', gen)
local user = ident('user', ARGV[2])
local rid = ident('request_id', ARGV[3])
local qty = posint('qty', ARGV[4])
local action = ARGV[5]
if action ~= 'post' and action ~= 'void' then bad('action') end
local ttl = uint('ttl_ms', ARGV[6])
local base = seg_base(KEYS[1])
local gbase = base .. 'g' .. gen
if string.sub(KEYS[1], -4) ~= ':seg' or KEYS[2] ~= gbase .. ':resv' or KEYS[3] ~= base .. 'out'
    or KEYS[4] ~= gbase .. ':led' or KEYS[5] ~= gbase .. ':hold' then
  bad('keys')
end

local v = redis.call('HMGET', KEYS[1], 'gen', 'stock', 'sold', 'reserved', 'lim', 'out', 'hf', 'rw')
if not v[1] or v[1] ~= gen then return { 'stale' } end
local st = open(KEYS[1], { 'gen', 'stock', 'sold', 'reserved', 'lim', 'out', 'hf', 'rw' }, v)
local ob = outbox(KEYS[1], KEYS[3], st.out)
outbox_ready(ob)
local back = reclaim(st, gen, KEYS[2], ob)
local now = clock(st)

local function answer(reply)
  flush(st)
  if back > 0 then stock_event('R', gen, KEYS[1]) end
  return reply
end

local post = action == 'post'
local want = post and 'P' or 'V'
local l = ledger(gbase, st.lim, user, st.hfv)
-- Without a limit a sale of this id is in a sales window (a mismatch, not nothing held).
local rec = l.pre and sale_rec(l, st.rw, user, rid, now) or led_rec(l, rid)
local s, q, u, exp, qs
if rec then s, q, u, exp, qs = rec_parse(rec) end
if not s or not live(u, now) then
  if post then return answer({ 'unknown' }) end
  -- Nothing held: remember the void, so that a late hold takes nothing (without a limit, in
  -- the record hash: it goes with the generation).
  local fresh = st.lim == 0 and not l.pre and redis.call('EXISTS', l.key) == 0
  led_put(l, rid, 'V:' .. int(qty) .. ':' .. int(now + ttl) .. ':0')
  -- The record hash holds a record now: sell.lua reads it from here on (segment field rr).
  if l.pre then redis.call('HSET', KEYS[1], 'rr', '1') end
  if st.lim == 0 and not l.pre then
    if fresh then
      redis.call('PEXPIREAT', l.key, int(now + ttl))
    else
      redis.call('PEXPIREAT', l.key, int(now + ttl), 'GT')
    end
  end
  return answer({ 'done', 'V' })
end
if (s ~= 'O' and s ~= 'P' and s ~= 'V') or q ~= qty then return answer({ 'mismatch' }) end
if s ~= 'O' then
  if s == want then return answer({ 'done', s }) end
  return answer({ 'ended', s })
end

st.reserved = st.reserved - q
if post then
  st.sold = st.sold + q
  if l.f then l.f = l.f + q end
  u = st.lim > 0 and 0 or now + ttl
else
  st.stock = st.stock + q
  if l.h then l.h = l.h - q end
  u = now + ttl
  back = back + q
end
flush(st)
led_put(l, rid, want .. ':' .. qs .. ':' .. int(u) .. ':' .. int(exp))
redis.call('ZREM', KEYS[5], user .. ' ' .. rid)
emit(ob, post and 'confirmed' or 'cancelled', gen, rid, user, qs, seg_index(KEYS[1]) .. ':' .. qs)
if back > 0 then stock_event('R', gen, KEYS[1]) end
return { 'done', want }
