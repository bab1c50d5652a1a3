-- takeover.lua — take over a fallback claim whose holder let its lease run out.
--
-- A process can die (or drop the call's future) between claiming a request (deduct.lua,
-- "short") and settling it. The claim stays, so duplicates of the request wait instead of
-- deducting twice; once its lease has passed on the Redis clock, one caller — a retry, or the
-- engine's sweeper — wins the claim with a higher epoch and then reconciles (shut_out.lua on
-- every other segment).
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  home request record   <prefix>:{<sku>#<home>}:g<gen>:rq:<request id>
-- KEYS[2]  claim index           <prefix>:{<sku>#<home>}:g<gen>:claims
-- ARGV[1]  user
-- ARGV[2]  qty
-- ARGV[3]  lease_ms
-- ARGV[4]  kind      's' | 'r'
--
-- Reply: {"won", epoch, home_part} | {"pending", epoch, lease_left_ms} | {"replay", parts}
--        | {"gone"} (no claim: no record, or a released one) | {"sealed"} | {"mismatch", field}
local user = ident('user', ARGV[1])
local qty = posint('qty', ARGV[2])
local lease = posint('lease_ms', ARGV[3])
local kind = kindarg('kind', ARGV[4])

local rec = record(KEYS[1])
if not rec or rec.s == 'F' then return { 'gone' } end -- 'F': released
local f = conflict(rec, user, qty, kind)
if f then return { 'mismatch', f } end
if rec.s == 'A' then return { 'replay', rec.parts } end
if rec.s == 'X' then return { 'sealed' } end
local now = now_ms()
local left = tonumber(rec.l) - now
if left > 0 then return { 'pending', tonumber(rec.e), left } end
local epoch = tonumber(rec.e) + 1
redis.call('HSET', KEYS[1], 'e', int(epoch), 'l', int(now + lease))
redis.call('ZADD', KEYS[2], int(now + lease), KEYS[1])
return { 'won', epoch, tonumber(rec.hp) }
