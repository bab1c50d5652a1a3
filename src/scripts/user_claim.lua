-- user_claim.lua — the authoritative per-user limit: claim `qty` units for a request.
--
-- The user's record lives in its own slot (tag {<sku>@<user>}), not the segment's, so on a
-- Redis Cluster claiming the user and deducting stock cannot be one script. It is a
-- compensated two-step that stays exact:
--   1. this script counts every request of the user that might hold units (entries) and adds
--      this one as Pending with an expiry, or answers "limit";
--   2. the engine deducts, then marks the entry Sold (user_finish.lua "sold") or removes it
--      (user_finish.lua "void": sold out, insufficient — the chance is given back).
-- A process that dies in between leaves a Pending entry that still counts. Once it is past
-- its expiry, the engine *verifies* it at the request's home segment (seal.lua): if the
-- request applied, the entry becomes Sold; if not, the request id is sealed there (it can
-- never apply later, even from a paused process) and only then is the entry removed. So an
-- entry is never dropped while its units might still be sold: no user exceeds the limit, and
-- no user stays locked out by a dead process.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  user record   <prefix>:{<sku>@<user>}:g<gen>:user   (fields r:<request id>)
-- ARGV[1]  request id
-- ARGV[2]  qty (> 0)
-- ARGV[3]  limit (> 0)
-- ARGV[4]  claim_ttl_ms   after this a Pending entry may be verified (> 0)
-- ARGV[5]  record_ttl_ms  lifetime of the user record (> 0)
-- ARGV[6]  kind      's' (a sale) | 'r' (a reservation)
-- ARGV[7]  attempt   this call's attempt token (decimal; "0": none)
--
-- Entry value: "<qty>:<P|R|S>:<expiry ms, server clock>:<s|r>[:<attempt>.<attempt>...]"
-- (Pending, Reserved, Sold; the request's kind; while Pending, the attempts of the request that
-- joined it and have not released it). Entries written before kinds existed have no kind and
-- are sales; entries without attempts are released by any attempt.
--
-- Why attempts: the same request id may run twice at once (a client re-send through another
-- instance, or the background finish of a dropped call next to a retry). One twin may sell
-- nothing (shut out by the other's takeover, sold out) while the other sells. If the first
-- removed the entry, the user's record would not count the second's units until it marks them,
-- and a concurrent request of the user could pass the limit in between. So a twin that joins a
-- pending entry adds its attempt, and a twin that sold nothing only removes its own attempt
-- (user_finish.lua "release"); the entry goes when no attempt is left, and an attempt that died
-- is covered by the verification after expiry.
-- Reply: {"ok"} | {"dup", state} (this request id is already counted) | {"mismatch", field}
--        (qty or kind differ) | {"limit", used, stale, final, fresh} where stale =
--          "rid:qty:state:kind,..." Pending entries past expiry and Reserved entries, final =
--          units of Sold entries (never coming back), fresh = units of Pending entries not yet
--          past expiry (an attempt in flight: the user may not be refused for those)
local rid = ident('request_id', ARGV[1])
local qty = posint('qty', ARGV[2])
local limit = posint('limit', ARGV[3])
local claim_ttl = posint('claim_ttl_ms', ARGV[4])
posint('record_ttl_ms', ARGV[5])
local kind = kindarg('kind', ARGV[6])
local attempt = ARGV[7]
if type(attempt) ~= 'string' or not string.match(attempt, '^%d+$') or #attempt > 20 then bad('attempt') end

-- "<qty>:<state>:<expiry>[:<kind>[:<attempts>]]" -> qty, state, expiry, kind, attempts
local function entry(v)
  local q, state, exp, k, att = string.match(v, '^(%d+):(%a):(%d+):?(%a?):?([%d.]*)$')
  if k == '' then k = 's' end
  return tonumber(q), state, tonumber(exp), k, att
end

local now = now_ms()
local field = 'r:' .. rid
local mine = redis.call('HGET', KEYS[1], field)
if mine then
  local q, state, exp, k, att = entry(mine)
  if q ~= qty then return { 'mismatch', 'qty' } end
  if k ~= kind then return { 'mismatch', 'kind' } end
  if state == 'P' and attempt ~= '0' then
    -- A twin joins: its attempt counts. The expiry stays: past it the entry is verified at the
    -- request's home (seal.lua), which a twin in flight survives (a live claim is left alone;
    -- otherwise the twin finds its id sealed and sells nothing).
    local joined = false
    for a in string.gmatch(att, '[^.]+') do
      if a == attempt then joined = true end
    end
    if not joined then
      att = (att == '' and attempt) or (att .. '.' .. attempt)
      redis.call('HSET', KEYS[1], field, ARGV[2] .. ':P:' .. int(exp) .. ':' .. kind .. ':' .. att)
    end
  end
  return { 'dup', state }
end

local flat = redis.call('HGETALL', KEYS[1])
local used, final, fresh, stale = 0, 0, 0, {}
for i = 1, #flat, 2 do
  local q, state, exp, k = entry(flat[i + 1])
  used = used + q
  if state == 'S' then final = final + q end
  -- Pending past expiry: its claimer may be dead. Reserved: it may have expired or been
  -- cancelled since. Both are verified by the engine before the user is refused.
  if (state == 'P' and exp < now) or state == 'R' then
    stale[#stale + 1] = string.sub(flat[i], 3) .. ':' .. int(q) .. ':' .. state .. ':' .. k
  elseif state == 'P' then
    fresh = fresh + q
  end
end
if used + qty > limit then
  return { 'limit', used, table.concat(stale, ','), final, fresh }
end
local att = (attempt == '0' and '') or attempt
redis.call('HSET', KEYS[1], field, ARGV[2] .. ':P:' .. int(now + claim_ttl) .. ':' .. kind .. ':' .. att)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return { 'ok' }
