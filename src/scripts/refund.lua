-- refund.lua — compensation: give back a part taken for a claim that could not complete.
--
-- Idempotent: a part is refunded at most once (the record moves to "R" / hp back to 0).
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash          <prefix>:{<sku>#<i>}:seg
-- KEYS[2]  request record here   <prefix>:{<sku>#<i>}:g<gen>:rq:<request id>
-- KEYS[3]  reservation index     <prefix>:{<sku>#<i>}:g<gen>:resv
-- ARGV[1]  gen
-- ARGV[2]  epoch     the refunding claim holder's epoch; parts of this or an older epoch are
--                    refunded (a newer holder reconciles what an older, dead one left behind)
-- ARGV[3]  is_home   "1" at the home segment (part kept in the claim's hp field)
--
-- Publishes: `R <gen> <segment key>` on <prefix>:stock when units went back (stock_event).
--
-- Reply: {"refunded", units}  (0 when there was nothing to refund) | {"stale", gen_or_missing}
uint('gen', ARGV[1])
local gen = ARGV[1]
local epoch = posint('epoch', ARGV[2])
local is_home = ARGV[3]
if is_home ~= '0' and is_home ~= '1' then bad('is_home') end

local stock, other = segment(KEYS[1], gen)
if not stock then return { 'stale', other } end
local rec = record(KEYS[2])
if not rec then return { 'refunded', 0 } end

local units = 0
if is_home == '1' then
  if rec.s == 'P' and tonumber(rec.e) == epoch then
    units = tonumber(rec.hp)
    if units > 0 then redis.call('HSET', KEYS[2], 'hp', 0) end
  end
elseif rec.s == 'A' and tonumber(rec.e) <= epoch then
  units = tonumber(rec.p)
  redis.call('HSET', KEYS[2], 's', 'R', 'e', epoch, 'p', 0)
end
if units > 0 then
  if rec.rs == 'R' then
    -- A reserved part: it leaves `reserved` and the index (a record is indexed exactly while
    -- its reservation is live).
    redis.call('HINCRBY', KEYS[1], 'reserved', -units)
    redis.call('HINCRBY', KEYS[1], 'stock', units)
    redis.call('HSET', KEYS[2], 'rs', 'K')
    redis.call('ZREM', KEYS[3], KEYS[2])
  elseif rec.rs == 'X' or rec.rs == 'K' then
    -- An expired or cancelled reservation: its units are back already.
    units = 0
  else
    redis.call('HINCRBY', KEYS[1], 'stock', units)
    redis.call('HINCRBY', KEYS[1], 'sold', -units)
  end
end
if units > 0 then stock_event('R', gen, KEYS[1]) end
return { 'refunded', units }
