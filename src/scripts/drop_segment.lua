-- drop_segment.lua — delete a segment left over from an older generation with more segments.
--
-- Only a segment of an older generation than the caller's is deleted: a concurrent load of a
-- newer generation may already have written this index, and it must keep it.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash   <prefix>:{<sku>#<i>}:seg
-- KEYS[2]  reservation index of the replaced generation <prefix>:{<sku>#<i>}:g<old>:resv
-- KEYS[3]  outbox stream  <prefix>:{<sku>#<i>}:out
-- ARGV[1]  gen     the dropping load's generation
-- ARGV[2]  old     the generation the load replaces: its live reservations here end (a
--                  `cancelled` event each, if its outbox was on)
--
-- Reply: {"ok"} (deleted, or nothing there) | {"kept", newer_gen}
uint('gen', ARGV[1])
uint('old', ARGV[2])
local cur = redis.call('HGET', KEYS[1], 'gen')
if cur and tonumber(cur) >= tonumber(ARGV[1]) then return { 'kept', tonumber(cur) } end
if cur then end_reservations(KEYS[1], ARGV[2], KEYS[2], KEYS[3]) end
redis.call('DEL', KEYS[1])
return { 'ok' }
