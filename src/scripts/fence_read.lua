-- fence_read.lua — lock strategies: bump the segment's fence token and read the stock, in one
-- round trip.
--
-- Run right after acquiring the segment's lock. The new fence token is this holder's: its
-- sell.lua call (ARGV fence) applies only while the segment's fence token (field `fence`) still
-- equals it, so a holder whose lease lapsed can never write after a newer holder bumped it.
--
-- A missing segment is not written: bumping the token would re-create the segment's hash
-- (with only `fence`, no expiry) after Redis lost its data, or outside the layout of a reload
-- with fewer segments. Nobody can write to a missing segment anyway (every write checks its
-- generation first).
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash <prefix>:{<sku>#<i>}:seg
-- Reply: {fence_token, gen, stock}   {0, false, false} when the segment is missing
local v = redis.call('HMGET', KEYS[1], 'gen', 'stock')
if not v[1] then return { 0, false, false } end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
return { fence, v[1], v[2] }
