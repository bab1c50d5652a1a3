-- user_finish.lua — second step of the per-user limit (see user_claim.lua).
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  user record   <prefix>:{<sku>@<user>}:g<gen>:user
-- ARGV[1]  request id
-- ARGV[2]  action   "sold": the request's units are the user's for good (entry -> S)
--                   "reserved": the units are reserved (entry -> R, verified when needed)
--                   "void": the request sold nothing and can never sell (entry removed)
--                   "release": this attempt sold nothing; other attempts of the request
--                     (twins, see user_claim.lua) may still sell: only this attempt leaves a
--                     Pending entry, which goes when no attempt is left
--
-- ARGV[3]  qty       the request's units (entry written when missing)
-- ARGV[4]  kind      's' | 'r'
-- ARGV[5]  record_ttl_ms  lifetime of the user record when this writes it
-- ARGV[6]  attempt   this call's attempt token (decimal; "0": none) — read by "release"
--
-- "sold" / "reserved" write the entry even when it is missing: a twin of the request (the
-- same id, sent again through another instance) may have removed it after selling nothing,
-- while this call sold; units sold must always count against the limit.
--
-- Reply: {"ok"} | {"absent"} (void or release of a missing entry; nothing to do)
--        | {"kept"} (release: another attempt still holds the entry, or a twin sold)
local rid = ident('request_id', ARGV[1])
local action = ARGV[2]
if action ~= 'sold' and action ~= 'void' and action ~= 'reserved' and action ~= 'release' then
  bad('action')
end
posint('qty', ARGV[3])
local kind = kindarg('kind', ARGV[4])
posint('record_ttl_ms', ARGV[5])
local attempt = ARGV[6]
if type(attempt) ~= 'string' or not string.match(attempt, '^%d+$') or #attempt > 20 then bad('attempt') end
local field = 'r:' .. rid
if action == 'void' then
  if redis.call('HDEL', KEYS[1], field) == 0 then return { 'absent' } end
  return { 'ok' }
end
if action == 'release' then
  local v = redis.call('HGET', KEYS[1], field)
  if not v then return { 'absent' } end
  local head, state, att = string.match(v, '^(%d+:(%a):%d+:?%a?):?([%d.]*)$')
  if state ~= 'P' then return { 'kept' } end -- a twin sold or reserved: it counts
  local left = {}
  for a in string.gmatch(att, '[^.]+') do
    if a ~= attempt then left[#left + 1] = a end
  end
  if #left == 0 then
    redis.call('HDEL', KEYS[1], field)
    return { 'ok' }
  end
  redis.call('HSET', KEYS[1], field, head .. ':' .. table.concat(left, '.'))
  return { 'kept' }
end
redis.call('HSET', KEYS[1], field, ARGV[3] .. ':' .. (action == 'sold' and 'S' or 'R') .. ':0:' .. kind)
redis.call('PEXPIRE', KEYS[1], ARGV[5], 'NX') -- a record this call created gets its lifetime
return { 'ok' }
