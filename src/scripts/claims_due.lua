-- claims_due.lua — the sweeper's view of fallback claims whose holder let the lease run out.
--
-- A fallback claim (a pending record at the request's home segment, see deduct.lua) normally
-- ends within its lease: settled as applied, released, or sealed. A holder that crashed, or
-- whose future was dropped (a client disconnected), leaves it — with units possibly taken at
-- other segments — until someone retries the same request id, which a disconnected client
-- never does. The engine's sweeper lists them here and takes them over (takeover.lua), then
-- settles what was complete or refunds and seals the rest.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  claim index   <prefix>:{<sku>#<i>}:g<gen>:claims (ZSET of claim records by lease end)
-- ARGV[1]  max     most claims to return (1..1000)
-- ARGV[2]  grace_ms  how long past its lease a claim must be: holders do not renew their
--                    lease, so a slow but live holder gets this much more before the sweeper
--                    takes over (a retry of the request may take over right at the lease end)
--
-- Reply: a flat array of {request_id, user, qty, kind} per due claim, for claims whose lease
-- ended more than grace_ms ago on the server clock. Index entries whose record is gone or no
-- longer pending are dropped on the way (they need nothing).
local max = posint('max', ARGV[1])
if max > 1000 then bad('max') end
local grace = uint('grace_ms', ARGV[2])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now_ms() - grace), 'LIMIT', 0, max)
local out = {}
for _, rk in ipairs(due) do
  local v = redis.call('HMGET', rk, 's', 'u', 'q', 'k')
  local rid = string.match(rk, ':rq:(.+)$')
  if v[1] ~= 'P' or not rid then
    redis.call('ZREM', KEYS[1], rk)
  else
    out[#out + 1] = rid
    out[#out + 1] = v[2]
    out[#out + 1] = v[3]
    out[#out + 1] = v[4] or 's'
  end
end
return out
