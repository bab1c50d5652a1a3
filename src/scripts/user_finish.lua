-- user_finish.lua — second step of the per-user limit (see user_claim.lua).
--
-- KEYS[1]  user record   <prefix>:{<sku>@<user>}:g<gen>:user
-- ARGV[1]  request id
-- ARGV[2]  action   "sold": the request's units are the user's for good (entry -> S)
--                   "reserved": the units are reserved (entry -> R, verified when needed)
--                   "void": the request sold nothing and can never sell (entry removed)
--
-- Reply: {"ok"} | {"absent"} (no such entry; nothing to do)
local rid = ident('request_id', ARGV[1])
local action = ARGV[2]
if action ~= 'sold' and action ~= 'void' and action ~= 'reserved' then bad('action') end
local field = 'r:' .. rid
local v = redis.call('HGET', KEYS[1], field)
if not v then return { 'absent' } end
if action == 'void' then
  redis.call('HDEL', KEYS[1], field)
else
  local q, k = string.match(v, '^(%d+):%a:%d+:?(%a?)$')
  if k == '' then k = 's' end
  redis.call('HSET', KEYS[1], field, q .. ':' .. (action == 'sold' and 'S' or 'R') .. ':0:' .. k)
end
return { 'ok' }
