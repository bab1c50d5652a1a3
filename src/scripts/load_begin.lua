-- load_begin.lua — start (re)loading a SKU: bump its generation in the metadata hash.
--
-- KEYS[1]  SKU metadata hash   <prefix>:{<sku>}:meta   (fields gen, segments, loaded, limit, state)
-- ARGV[1]  segments (> 0)
-- ARGV[2]  total    units loaded
-- ARGV[3]  replace  "1" to replace an existing SKU, "0" to refuse
-- ARGV[4]  limit    units one user may buy (0 = no limit)
--
-- Reply: {"exists", gen} | {"started", gen, old_segments}
local segments = posint('segments', ARGV[1])
local total = uint('total', ARGV[2])
local replace = ARGV[3]
if replace ~= '0' and replace ~= '1' then bad('replace') end
local limit = uint('limit', ARGV[4])

local v = redis.call('HMGET', KEYS[1], 'gen', 'segments')
if v[1] and replace == '0' then return { 'exists', tonumber(v[1]) } end
local gen = (tonumber(v[1]) or 0) + 1
redis.call('HSET', KEYS[1], 'gen', gen, 'segments', segments, 'loaded', total, 'limit', limit,
  'state', 'loading')
return { 'started', gen, tonumber(v[2]) or 0 }
