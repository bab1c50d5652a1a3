-- drop_segment.lua — delete a segment left over from an older generation with more segments.
-- (prelude.lua is prepended.)
--
-- Only a segment of an older generation than the caller's is deleted: a concurrent load of a
-- newer generation may already have written this index, and it must keep it. The generation
-- it held ends as in load_segment.lua (live reservations cancelled, with events when its
-- outbox was on); the caller unlinks that generation's other keys afterwards. The outbox
-- stream stays (its events outlive the segment).
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash   <prefix>:{<tag>}:seg
-- KEYS[2]  outbox stream  <prefix>:{<tag>}:out
-- ARGV[1]  gen     the dropping load's generation
--
-- Reply: {"ok", dropped_gen} (0: nothing there) | {"kept", newer_gen}
uint('gen', ARGV[1])
if string.sub(KEYS[1], -4) ~= ':seg' or KEYS[2] ~= seg_base(KEYS[1]) .. 'out' then bad('keys') end
local v = redis.call('HMGET', KEYS[1], 'gen', 'out')
local cur = v[1]
if cur and tonumber(cur) >= tonumber(ARGV[1]) then return { 'kept', tonumber(cur) } end
if not cur then return { 'ok', 0 } end
end_reservations(KEYS[1], cur, v[2], KEYS[2])
redis.call('DEL', KEYS[1])
return { 'ok', tonumber(cur) }
