-- drop_segment.lua — delete a segment left over from an older generation with more segments.
--
-- Only a segment of an older generation than the caller's is deleted: a concurrent load of a
-- newer generation may already have written this index, and it must keep it.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash   <prefix>:{<sku>#<i>}:seg
-- ARGV[1]  gen     the dropping load's generation
--
-- Reply: {"ok"} (deleted, or nothing there) | {"kept", newer_gen}
uint('gen', ARGV[1])
local cur = redis.call('HGET', KEYS[1], 'gen')
if cur and tonumber(cur) >= tonumber(ARGV[1]) then return { 'kept', tonumber(cur) } end
redis.call('DEL', KEYS[1])
return { 'ok' }
