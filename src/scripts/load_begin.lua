-- load_begin.lua — start (re)loading a SKU: bump its generation in the metadata hash.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  SKU metadata hash   <prefix>:{<sku>}:meta   (fields gen, segments, loaded, limit, state)
-- ARGV[1]  segments (> 0)
-- ARGV[2]  total    units loaded
-- ARGV[3]  replace  "1" to replace an existing SKU, "0" to refuse
-- ARGV[4]  limit    units one user may buy (0 = no limit)
--
-- Reply: {"exists", gen} | {"started", gen, old_segments}
--
-- Generations are unique across data loss: the new one is the old one + 1, but at least the
-- server clock in ms. A Redis that lost its data (restarted empty, flushed, failed over to an
-- empty replica) would otherwise hand out generation 1 again, and instances that cached the
-- old generation 1 — with its segment count and per-user limit — would take the new segments
-- for theirs.
local segments = posint('segments', ARGV[1])
local total = uint('total', ARGV[2])
local replace = ARGV[3]
if replace ~= '0' and replace ~= '1' then bad('replace') end
local limit = uint('limit', ARGV[4])

local v = redis.call('HMGET', KEYS[1], 'gen', 'segments')
if v[1] and replace == '0' then return { 'exists', tonumber(v[1]) } end
local gen = math.max((tonumber(v[1]) or 0) + 1, now_ms())
redis.call('HSET', KEYS[1], 'gen', int(gen), 'segments', ARGV[1], 'loaded', ARGV[2], 'limit',
  ARGV[4], 'state', 'loading')
return { 'started', gen, tonumber(v[2]) or 0 }
