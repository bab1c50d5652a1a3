-- outbox_lag.lua — how far one consumer group is behind on one outbox stream (read only).
--
-- KEYS[1]  outbox stream   <prefix>:{<sku>#<i>}:out
-- ARGV[1]  group
--
-- Reply: {pending, undelivered, oldest_pending_id or "", entries_added, length}
--   pending        entries delivered and not yet acknowledged
--   undelivered    entries not yet delivered to the group (XINFO GROUPS `lag`, else counted)
--   entries_added  every entry ever appended to the stream (XINFO STREAM)
if redis.call('EXISTS', KEYS[1]) == 0 then return { 0, 0, '', 0, 0 } end
local s = redis.call('XINFO', 'STREAM', KEYS[1])
local sinfo = {}
for i = 1, #s, 2 do sinfo[s[i]] = s[i + 1] end
local pending, undelivered, oldest = 0, 0, ''
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  if info['name'] == ARGV[1] then
    pending = tonumber(info['pending'])
    if type(info['lag']) == 'number' then
      undelivered = info['lag']
    else
      -- Redis cannot tell (entries deleted in the middle): count what follows the last
      -- delivered entry, up to 100000 (a lower bound beyond that).
      undelivered = #redis.call('XRANGE', KEYS[1], '(' .. info['last-delivered-id'], '+', 'COUNT', 100000)
    end
    if pending > 0 then oldest = redis.call('XPENDING', KEYS[1], ARGV[1])[2] end
  end
end
return { pending, undelivered, oldest, tonumber(sinfo['entries-added']) or 0, tonumber(sinfo['length']) or 0 }
