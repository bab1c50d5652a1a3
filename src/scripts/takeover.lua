-- takeover.lua — take over a fallback claim whose holder let its lease run out.
--
-- A process can die between claiming a request (deduct.lua, "short") and settling it. The
-- claim stays, so duplicates of the request wait instead of deducting twice; once its lease
-- has passed on the Redis clock, one caller wins the claim with a higher epoch and then
-- reconciles (fence.lua on every other segment).
--
-- KEYS[1]  home request record   <prefix>:{<sku>#<home>}:g<gen>:rq:<request id>
-- ARGV[1]  user
-- ARGV[2]  qty
-- ARGV[3]  lease_ms
--
-- Reply: {"won", epoch, home_part} | {"pending", epoch, lease_left_ms} | {"replay", parts}
--        | {"gone"} | {"sealed"} | {"mismatch", field}
local user = ident('user', ARGV[1])
local qty = posint('qty', ARGV[2])
local lease = posint('lease_ms', ARGV[3])

local rec = record(KEYS[1])
if not rec then return { 'gone' } end
if rec.u ~= user then return { 'mismatch', 'user' } end
if tonumber(rec.q) ~= qty then return { 'mismatch', 'qty' } end
if rec.s == 'A' then return { 'replay', rec.parts } end
if rec.s == 'X' then return { 'sealed' } end
local now = now_ms()
local left = tonumber(rec.l) - now
if left > 0 then return { 'pending', tonumber(rec.e), left } end
local epoch = tonumber(rec.e) + 1
redis.call('HSET', KEYS[1], 'e', epoch, 'l', now + lease)
return { 'won', epoch, tonumber(rec.hp) }
