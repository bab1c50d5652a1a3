-- user_finish.lua — second step of the per-user limit (see user_claim.lua).
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  user record   <prefix>:{<sku>@<user>}:g<gen>:user
-- ARGV[1]  request id
-- ARGV[2]  action   "sold": the request's units are the user's for good (entry -> S)
--                   "reserved": the units are reserved (entry -> R, verified when needed)
--                   "void": the request sold nothing and can never sell (entry removed)
--
-- ARGV[3]  qty       the request's units (entry written when missing)
-- ARGV[4]  kind      's' | 'r'
-- ARGV[5]  record_ttl_ms  lifetime of the user record when this writes it
--
-- "sold" / "reserved" write the entry even when it is missing: a twin of the request (the
-- same id, sent again through another instance) may have removed it after selling nothing,
-- while this call sold; units sold must always count against the limit.
--
-- Reply: {"ok"} | {"absent"} (void of a missing entry; nothing to do)
local rid = ident('request_id', ARGV[1])
local action = ARGV[2]
if action ~= 'sold' and action ~= 'void' and action ~= 'reserved' then bad('action') end
posint('qty', ARGV[3])
local kind = kindarg('kind', ARGV[4])
posint('record_ttl_ms', ARGV[5])
local field = 'r:' .. rid
if action == 'void' then
  if redis.call('HDEL', KEYS[1], field) == 0 then return { 'absent' } end
  return { 'ok' }
end
redis.call('HSET', KEYS[1], field, ARGV[3] .. ':' .. (action == 'sold' and 'S' or 'R') .. ':0:' .. kind)
redis.call('PEXPIRE', KEYS[1], ARGV[5], 'NX') -- a record this call created gets its lifetime
return { 'ok' }
