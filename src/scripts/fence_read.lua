-- fence_read.lua — lock strategies: bump the segment's fence and read it, in one round trip.
--
-- Run right after acquiring the segment's lock. The new fence number is this holder's: the
-- fenced write (deduct.lua / take.lua mode "fenced") applies only while the segment's fence
-- still equals it, so a holder whose lease lapsed can never write after a newer one fenced.
--
-- KEYS[1]  segment hash <prefix>:{<sku>#<i>}:seg
-- Reply: {fence, gen, stock}   gen/stock are false when the segment is missing
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
local v = redis.call('HMGET', KEYS[1], 'gen', 'stock')
return { fence, v[1], v[2] }
