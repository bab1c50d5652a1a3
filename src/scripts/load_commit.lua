-- load_commit.lua — mark a load generation ready once all its segments are written.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  SKU metadata hash   <prefix>:{<sku>}:meta
-- ARGV[1]  gen
--
-- Publishes: `L <gen> <meta key>` on <prefix>:stock once ready (stock_event).
--
-- Reply: {"ok"} | {"superseded", current_gen}
local gen = uint('gen', ARGV[1])
local cur = tonumber(redis.call('HGET', KEYS[1], 'gen'))
if cur ~= gen then return { 'superseded', cur or 0 } end
redis.call('HSET', KEYS[1], 'state', 'ready')
stock_event('L', ARGV[1], KEYS[1])
return { 'ok' }
