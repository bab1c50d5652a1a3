-- seal.lua — decide, at a request's home segment, whether a request that a per-user claim is
-- waiting for can still apply; if it has not, make sure it never will.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  request record at the home segment   <prefix>:{<sku>#<home>}:g<gen>:rq:<request id>
-- KEYS[2]  the home segment hash (not read: declared so a slot move answers TRYAGAIN rather
--          than run where the compact entries have not arrived yet; see record.lua)
-- ARGV[1]  user
-- ARGV[2]  qty
-- ARGV[3]  ttl_ms   lifetime of the seal (the request TTL)
-- ARGV[4]  kind     's' (a sale) | 'r' (a reservation): the kind the per-user entry counts
--
-- Publishes: `X <gen> <record key>` on <prefix>:stock when it seals (prelude's stock_event: an
-- instance answering sold out from memory must answer this id from its record).
--
-- Reply: {"sealed"} (it never applied; now it cannot) | {"applied"} (it applied: for a
--        reservation, the caller still has to ask the reservation's state)
--        | {"pending", lease_left_ms} (a fallback claim is in progress) | {"mismatch", field}
--        (the record belongs to another request: this one can never apply under this id)
local user = ident('user', ARGV[1])
local qty = posint('qty', ARGV[2])
posint('ttl_ms', ARGV[3])
local kind = kindarg('kind', ARGV[4])

local rec = record(KEYS[1])
if not rec or rec.s == 'F' then -- no record, or a released claim ('F'): the id is free
  redis.call('HSET', KEYS[1], 's', 'X', 'u', user, 'q', ARGV[2], 'e', '0', 'k', kind)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  stock_event('X', string.match(KEYS[1], '}:g(%d+):rq:'), KEYS[1])
  return { 'sealed' }
end
local f = conflict(rec, user, qty, kind)
if f then return { 'mismatch', f } end
if rec.s == 'A' then return { 'applied' } end
if rec.s == 'X' then return { 'sealed' } end
local left = tonumber(rec.l) - now_ms()
if left < 0 then left = 0 end
return { 'pending', left }
