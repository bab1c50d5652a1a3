-- load_segment.lua — write one segment of a new load generation, replacing an older one.
--
-- Loads can race (two operators, two instances reloading at once). The segment keeps the
-- highest generation ever written to it: a slower load of an older generation never overwrites
-- a newer one (its load_commit then answers "superseded"), so the generation that wins the
-- metadata always finds all of its segments.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash   <prefix>:{<sku>#<i>}:seg
-- KEYS[2]  reservation index of the replaced generation <prefix>:{<sku>#<i>}:g<old>:resv
-- KEYS[3]  outbox stream  <prefix>:{<sku>#<i>}:out
-- ARGV[1]  gen
-- ARGV[2]  units
-- ARGV[3]  outbox   "1": the selling scripts append events to the segment's stream (field out)
-- ARGV[4]  old      the generation this load replaces (0: none) as the metadata named it; the
--                   live reservations of whatever generation the segment holds end (a
--                   `cancelled` event each, if its outbox was on; see end_reservations)
--
-- Publishes: `S <gen> <segment key>` on <prefix>:stock once written (stock_event): a flag of
-- the replaced generation goes before its metadata names the new one.
--
-- Reply: {"ok"} | {"superseded", newer_gen}
uint('gen', ARGV[1])
uint('units', ARGV[2])
if ARGV[3] ~= '0' and ARGV[3] ~= '1' then bad('outbox') end
uint('old', ARGV[4])
local v = redis.call('HMGET', KEYS[1], 'gen', 'rw')
local cur = v[1]
if cur and tonumber(cur) > tonumber(ARGV[1]) then return { 'superseded', tonumber(cur) } end
if cur and cur ~= ARGV[1] then end_reservations(KEYS[1], ARGV[4], KEYS[2], KEYS[3]) end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'stock', ARGV[2], 'loaded', ARGV[2], 'restocked', '0',
  'sold', '0', 'reserved', '0', 'out', ARGV[3])
-- The same generation written again: its compact entries (deduct_core.lua) stay findable.
if cur == ARGV[1] and v[2] then redis.call('HSET', KEYS[1], 'rw', v[2]) end
stock_event('S', ARGV[1], KEYS[1])
return { 'ok' }
