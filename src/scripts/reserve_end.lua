-- reserve_end.lua — confirm or cancel a reservation, exactly once (or read its state).
--
-- The reservation lives on the record holding its units, in the segment's slot, so this
-- script first reclaims what has expired (server clock) and then decides: a confirm racing
-- its own expiry ends in exactly one state, and a unit is never both sold and returned.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash          <prefix>:{<sku>#<i>}:seg
-- KEYS[2]  record holding it     <prefix>:{<sku>#<i>}:g<gen>:rq:<request id>
-- KEYS[3]  reservation index     <prefix>:{<sku>#<i>}:g<gen>:resv
-- KEYS[4]  outbox stream         <prefix>:{<sku>#<i>}:out (outbox on: a `confirmed` or `cancelled`
--                                 event when this call ends the reservation, `expired` for
--                                 each one reclaimed first)
-- ARGV[1]  gen
-- ARGV[2]  action   "confirm" (units become sold) | "cancel" (units go back to stock) |
--                   "peek" (only reclaim and report the state)
--
-- Publishes: `R <gen> <segment key>` on <prefix>:stock on a cancel, and for expired ones reclaimed
-- first (stock_event).
--
-- Reply (state: the record's `rs` letter):
--        {"done", state, user, units} with state C (confirmed) or K (cancelled) — also when
--        it was already in that state (idempotent) | {"ended", state, user, units} when it had
--        already ended otherwise (X expired, C confirmed, K cancelled) | {"unknown"} |
--        {"stale", gen_or_missing}
uint('gen', ARGV[1])
local gen = ARGV[1]
local action = ARGV[2]
if action ~= 'confirm' and action ~= 'cancel' and action ~= 'peek' then bad('action') end

local stock, other = segment(KEYS[1], gen)
if not stock then return { 'stale', other } end
local ob = outbox(KEYS[1], KEYS[4])
outbox_ready(ob)
reclaim(KEYS[1], KEYS[3], now_ms(), ob)
local v = redis.call('HMGET', KEYS[2], 'rs', 'rq', 'u')
if not v[1] then return { 'unknown' } end
local rs, q, user = v[1], tonumber(v[2]), v[3]
if action == 'peek' then return { 'ended', rs, user, q } end
local want = (action == 'confirm') and 'C' or 'K'
if rs == want then return { 'done', rs, user, q } end
if rs ~= 'R' then return { 'ended', rs, user, q } end
redis.call('HINCRBY', KEYS[1], 'reserved', -q)
if action == 'confirm' then
  redis.call('HINCRBY', KEYS[1], 'sold', q)
else
  redis.call('HINCRBY', KEYS[1], 'stock', q)
  stock_event('R', gen, KEYS[1])
end
redis.call('HSET', KEYS[2], 'rs', want)
redis.call('ZREM', KEYS[3], KEYS[2])
emit(ob, want == 'C' and 'confirmed' or 'cancelled', KEYS[2], user, v[2], seg_index(KEYS[1]) .. ':' .. v[2])
return { 'done', want, user, q }
