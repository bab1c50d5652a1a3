-- restock.lua — add units to one segment, once per request id.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash          <prefix>:{<tag>}:seg
-- KEYS[2]  restock record        <prefix>:{<tag>}:g<gen>:rs:<request id> (string <qty>:<total>,
--                                 expiring after ttl_ms)
-- ARGV[1]  gen
-- ARGV[2]  qty      units to add to this segment (> 0)
-- ARGV[3]  ttl_ms
-- ARGV[4]  total    units of the whole restock request (>= qty); a retry must repeat it
--
-- Publishes: `S <gen> <segment key>` on <prefix>:stock after restocking (prelude's stock_event).
--
-- Reply: {"restocked", stock_after} | {"replay", stock} | {"mismatch", "qty"} | {"stale"}
-- Errors: "ERR shardstock bad argument: qty" also when the segment would pass 10^15 units.
uint('gen', ARGV[1])
local gen = ARGV[1]
local qty = posint('qty', ARGV[2])
local ttl = posint('ttl_ms', ARGV[3])
local total = posint('total', ARGV[4])
if qty > total then bad('total') end
local mark = ARGV[2] .. ':' .. ARGV[4] -- canonical (validated) text, never a formatted number
local pre = seg_base(KEYS[1]) .. 'g' .. gen .. ':rs:'
if string.sub(KEYS[1], -4) ~= ':seg' or string.sub(KEYS[2], 1, #pre) ~= pre or #KEYS[2] == #pre then
  bad('keys')
end

local v = redis.call('HMGET', KEYS[1], 'gen', 'stock', 'restocked')
if not v[1] or v[1] ~= gen then return { 'stale' } end
local stock, restocked = tonumber(v[2]), tonumber(v[3] or '0')
local done = redis.call('GET', KEYS[2])
if done then
  if done ~= mark then return { 'mismatch', 'qty' } end
  return { 'replay', stock }
end
if stock + qty >= 1e15 or restocked + qty >= 1e15 then bad('qty') end
redis.call('HINCRBY', KEYS[1], 'stock', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'restocked', ARGV[2])
redis.call('SET', KEYS[2], mark, 'PX', ARGV[3])
stock_event('S', gen, KEYS[1])
return { 'restocked', stock + qty }
