-- load_begin.lua — start (re)loading a SKU: bump its generation in the metadata hash.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  SKU metadata hash   <prefix>:{<sku>}:meta
--          (fields gen, segments, loaded, limit, state, place, outmax, hf)
-- ARGV[1]  segments (> 0)
-- ARGV[2]  total    units loaded
-- ARGV[3]  replace  "1" to replace an existing SKU, "0" to refuse
-- ARGV[4]  limit    units one user may buy (0 = no limit)
-- ARGV[5]  place    proposed placement: tag suffixes (0..=65535) by segment index,
--                   comma-separated ("" = unplaced; see src/cluster/placement.rs); a placed
--                   SKU must end with a suffix for each of its segments, or the load is
--                   refused (bad argument "place")
-- ARGV[6]  outbox   "1" when the new generation has the outbox on: `outmax` becomes the largest
--                   segment count the SKU ever had with it, so a consumer finds every stream
--                   (events stay in a stream after a reload shrinks the SKU)
-- ARGV[7]  hf       the home function version the loading instance places requests with
--                   (segments.rs HOME_FN); kept as `hf` in the metadata (load_segment writes it
--                   into each segment, where sell.lua checks it)
--
-- Reply: {"exists", gen} | {"started", gen, old_segments, place, old_gen (0 when new)}
--
-- Placement is append-only: a SKU keeps every suffix it ever had (so each segment index keeps
-- one key for the SKU's life and a reload overwrites it in place); only indexes beyond the
-- stored list take the proposal's suffixes. A SKU that exists without a placement (loaded on a
-- single Redis, or before placement existed) stays unplaced.
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
local proposed = ARGV[5]
local ob = ARGV[6]
if ob ~= '0' and ob ~= '1' then bad('outbox') end
uint('hf', ARGV[7])
if type(proposed) ~= 'string' or (proposed ~= '' and not proposed:match('^%d+[%d,]*$'))
  or proposed:match(",,") or proposed:match(",$") or #proposed > 6 * 1024 then
  bad('place')
end

for k in proposed:gmatch('%d+') do
  if #k > 5 or tonumber(k) > 65535 then bad('place') end
end

local v = redis.call('HMGET', KEYS[1], 'gen', 'segments', 'place', 'outmax')
if v[1] and replace == '0' then return { 'exists', tonumber(v[1]) } end
local place = v[3] or ''
if not v[1] then
  place = proposed
elseif place ~= '' then
  -- Keep every stored suffix; take the proposal's for indexes beyond them.
  local have = select(2, place:gsub(',', ',')) + 1
  local i = 0
  for k in proposed:gmatch('%d+') do
    i = i + 1
    if i > have then place = place .. ',' .. k end
  end
end
-- A placed SKU has a suffix for every segment: a shorter list would leave segments under
-- plain tags that a later load would change.
if place ~= '' and select(2, place:gsub(',', ',')) + 1 < segments then bad('place') end
local gen = math.max((tonumber(v[1]) or 0) + 1, now_ms())
redis.call('HSET', KEYS[1], 'gen', int(gen), 'segments', ARGV[1], 'loaded', ARGV[2], 'limit',
  ARGV[4], 'state', 'loading', 'hf', ARGV[7])
if place ~= '' then redis.call('HSET', KEYS[1], 'place', place) end
if ob == '1' and (tonumber(v[4]) or 0) < segments then redis.call('HSET', KEYS[1], 'outmax', ARGV[1]) end
return { 'started', gen, tonumber(v[2]) or 0, place, tonumber(v[1]) or 0 }
