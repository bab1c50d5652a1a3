-- outbox_trim.lua — drop the outbox events every consumer group has acknowledged.
--
-- For each group the bound is its oldest pending entry (still owed to a handler) or, with
-- nothing pending, the entry after its last delivered one. Entries below the smallest bound
-- over all groups are acknowledged by every group and go; nothing pending and nothing not yet
-- delivered to some group is ever trimmed. A stream no group reads keeps everything.
--
-- KEYS[1]  outbox stream   <prefix>:{<sku>#<i>}:out
--
-- Reply: {"trimmed", entries_removed, bound_id} | {"kept"} (no group yet)
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function less(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am < bm or (am == bm and as < bs)
end

if redis.call('EXISTS', KEYS[1]) == 0 then return { 'kept' } end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then return { 'kept' } end
local bound
for _, g in ipairs(groups) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  local b
  if tonumber(info['pending']) > 0 then
    b = redis.call('XPENDING', KEYS[1], info['name'])[2]
  else
    local ms, seq = parse(info['last-delivered-id'])
    b = string.format('%d-%d', ms, seq + 1)
  end
  if not bound or less(b, bound) then bound = b end
end
local n = redis.call('XTRIM', KEYS[1], 'MINID', bound)
return { 'trimmed', n, bound }
