-- reserve_end.lua — confirm or cancel a reservation at its home segment, exactly once (or read
-- its state). (prelude.lua is prepended.)
--
-- The reservation is a record in its user's ledger at the request's home segment, so this
-- script first returns every expired reservation (server clock) and then decides: a confirm
-- racing its own expiry ends in exactly one state, and a unit is never both sold and returned.
-- Mirrors Segment::reserve_end (src/store/memory/segment.rs): no live record, or a sale's
-- record -> unknown; R + confirm -> C (reserved -> sold; with a per-user limit the record is
-- kept for the generation and the units count in the user's `f`); R + cancel -> K (reserved ->
-- stock; with a limit the user's `h` drops); C + confirm, K + cancel -> done again (idempotent);
-- any other pair, and every inspect -> ended with the record's state.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash          <prefix>:{<tag>}:seg
-- KEYS[2]  reservation index     <prefix>:{<tag>}:g<gen>:resv
-- KEYS[3]  outbox stream         <prefix>:{<tag>}:out (outbox on: a `confirmed` or `cancelled`
--                                 event when this call ends the reservation, `expired` for
--                                 each one reclaimed first)
-- KEYS[4]  limited ledgers       <prefix>:{<tag>}:g<gen>:led (declared: see sell.lua; a ledger
--                                 without a limit is named from KEYS[1], see the prelude)
-- ARGV[1]  gen
-- ARGV[2]  user
-- ARGV[3]  request id
-- ARGV[4]  action   "confirm" (units become sold) | "cancel" (units go back to stock) |
--                   "inspect" (only reclaim and report the state)
--
-- Publishes: `R <gen> <segment key>` on <prefix>:stock on a cancel, and when expired ones came
-- back first (stock_event).
--
-- Reply (state: the record's letter R, C, K or X):
--   {"done", state, user, units}    now (or already) in the asked state (C or K)
--   {"ended", state, user, units}   it had ended otherwise; for inspect, its state
--   {"unknown"}                     no live reservation record of this request id
--   {"stale"}                       segment missing or of another generation
-- Errors: "ERR shardstock bad argument: <name>" before any write.
local gen = ARGV[1]
uint('gen', gen)
local user = ident('user', ARGV[2])
local rid = ident('request_id', ARGV[3])
local action = ARGV[4]
if action ~= 'confirm' and action ~= 'cancel' and action ~= 'inspect' then bad('action') end
local base = seg_base(KEYS[1])
local gbase = base .. 'g' .. gen
if string.sub(KEYS[1], -4) ~= ':seg' or KEYS[2] ~= gbase .. ':resv' or KEYS[3] ~= base .. 'out'
    or KEYS[4] ~= gbase .. ':led' then
  bad('keys')
end

local v = redis.call('HMGET', KEYS[1], 'gen', 'stock', 'sold', 'reserved', 'lim', 'out', 'hf')
if not v[1] or v[1] ~= gen then return { 'stale' } end
local st = open(KEYS[1], { 'gen', 'stock', 'sold', 'reserved', 'lim', 'out', 'hf' }, v)
local ob = outbox(KEYS[1], KEYS[3], st.out)
outbox_ready(ob)
local back = reclaim(st, gen, KEYS[2], ob)

local function answer(reply)
  flush(st)
  if back > 0 then stock_event('R', gen, KEYS[1]) end
  return reply
end

local l = ledger(gbase, st.lim, user, st.hfv)
local rec = led_rec(l, rid)
if not rec then return answer({ 'unknown' }) end
local s, q, u, exp, qs = rec_parse(rec)
-- A sale, or an order's item (O, P, V: only its order's decision ends it, settle.lua), is no
-- reservation.
if not s or not live(u, st.now) or s == 'A' or s == 'O' or s == 'P' or s == 'V' then
  return answer({ 'unknown' })
end
local to
if s == 'R' and action == 'confirm' then
  to = 'C'
elseif s == 'R' and action == 'cancel' then
  to = 'K'
elseif (s == 'C' and action == 'confirm') or (s == 'K' and action == 'cancel') then
  return answer({ 'done', s, user, q })
else
  return answer({ 'ended', s, user, q })
end

st.reserved = st.reserved - q
local lim = st.lim
if to == 'C' then
  st.sold = st.sold + q
  if lim > 0 then u = 0 end
  if l.f then l.f = l.f + q end
else
  st.stock = st.stock + q
  if l.h then l.h = l.h - q end
end
flush(st)
led_put(l, rid, to .. ':' .. qs .. ':' .. int(u) .. ':' .. int(exp))
redis.call('ZREM', KEYS[2], user .. ' ' .. rid)
emit(ob, to == 'C' and 'confirmed' or 'cancelled', gen, rid, user, qs, seg_index(KEYS[1]) .. ':' .. qs)
if to == 'K' then back = back + q end
if back > 0 then stock_event('R', gen, KEYS[1]) end
return { 'done', to, user, q }
