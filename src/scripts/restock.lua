-- restock.lua — add units to one segment, once per request id.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash          <prefix>:{<sku>#<i>}:seg
-- KEYS[2]  restock record        <prefix>:{<sku>#<i>}:g<gen>:rs:<request id>
-- ARGV[1]  gen
-- ARGV[2]  qty      units to add to this segment (> 0)
-- ARGV[3]  ttl_ms
-- ARGV[4]  total    units of the whole restock request (>= qty); a retry must repeat it
--
-- Publishes: `S <gen> <segment key>` on <prefix>:stock after restocking (prelude's stock_event).
--
-- Reply: {"restocked", stock_after} | {"replay", stock} | {"mismatch", "qty"} | {"stale", g}
-- Errors: "ERR shardstock bad argument: qty" also when the segment would pass 10^15 units.
uint('gen', ARGV[1])
local gen = ARGV[1]
local qty = posint('qty', ARGV[2])
local ttl = posint('ttl_ms', ARGV[3])
local total = posint('total', ARGV[4])
if qty > total then bad('total') end
local mark = ARGV[2] .. ':' .. ARGV[4] -- canonical (validated) text, never a formatted number

local stock, other = segment(KEYS[1], gen)
if not stock then return { 'stale', other } end
local done = redis.call('GET', KEYS[2])
if done then
  if done ~= mark then return { 'mismatch', 'qty' } end
  return { 'replay', stock }
end
local restocked = tonumber(redis.call('HGET', KEYS[1], 'restocked'))
if stock + qty >= 1e15 or restocked + qty >= 1e15 then bad('qty') end
redis.call('HINCRBY', KEYS[1], 'stock', qty)
redis.call('HINCRBY', KEYS[1], 'restocked', qty)
redis.call('SET', KEYS[2], mark, 'PX', ttl)
stock_event('S', gen, KEYS[1])
return { 'restocked', stock + qty }
