-- seal.lua — decide, at a request's home segment, whether a request that a per-user claim is
-- waiting for can still apply; if it has not, make sure it never will.
--
-- KEYS[1]  request record at the home segment   <prefix>:{<sku>#<home>}:g<gen>:rq:<request id>
-- ARGV[1]  user
-- ARGV[2]  qty
-- ARGV[3]  ttl_ms   lifetime of the seal (the request TTL)
--
-- Reply: {"sealed"} (it never applied; now it cannot) | {"applied"}
--        | {"pending", lease_left_ms} (a fallback claim is in progress) | {"mismatch", field}
local user = ident('user', ARGV[1])
local qty = posint('qty', ARGV[2])
local ttl = posint('ttl_ms', ARGV[3])

local rec = record(KEYS[1])
if not rec then
  redis.call('HSET', KEYS[1], 's', 'X', 'u', user, 'q', qty, 'e', 0)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return { 'sealed' }
end
if rec.u ~= user then return { 'mismatch', 'user' } end
if tonumber(rec.q) ~= qty then return { 'mismatch', 'qty' } end
if rec.s == 'A' then return { 'applied' } end
if rec.s == 'X' then return { 'sealed' } end
local left = tonumber(rec.l) - now_ms()
if left < 0 then left = 0 end
return { 'pending', left }
