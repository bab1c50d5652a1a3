-- load_segment.lua — write one segment of a new load generation, replacing what was there.
--
-- KEYS[1]  segment hash   <prefix>:{<sku>#<i>}:seg
-- ARGV[1]  gen
-- ARGV[2]  units
--
-- Reply: {"ok"}
local gen = uint('gen', ARGV[1])
local units = uint('units', ARGV[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'gen', gen, 'stock', units, 'loaded', units, 'restocked', 0, 'sold', 0,
  'reserved', 0)
return { 'ok' }
