-- outbox_dead.lua — move one outbox event that no handler could take to the dead letters.
--
-- One atomic step in the segment's slot: the event is copied to the dead-letter stream with
-- why it died, acknowledged in its group, and its failure reason forgotten. An event that is
-- no longer pending in the group (another consumer acknowledged it meanwhile) is left alone,
-- so an event is never both handled and dead; nor is one that another consumer claimed (and
-- may be handling) since this one decided: its owner and delivery count must still be the
-- ones the caller saw.
--
-- KEYS[1]  outbox stream        <prefix>:{<sku>#<i>}:out
-- KEYS[2]  dead-letter stream   <prefix>:{<sku>#<i>}:dead
-- KEYS[3]  failure reasons      <prefix>:{<sku>#<i>}:why (hash: entry id -> last reason)
-- ARGV[1]  group
-- ARGV[2]  entry id
-- ARGV[3]  the delivery count the caller saw on the pending entry
-- ARGV[4]  reason when no handler left one ("" = none known)
-- ARGV[5]  the consumer the caller saw owning it (the caller itself)
-- ARGV[6]  deliveries to record (failed ones: ARGV[3], or one fewer when the caller claimed it
--          only to dead-letter it)
--
-- Reply: {"dead", dead_letter_id} | {"gone"} (not pending any more: nothing changed)
local group, id = ARGV[1], ARGV[2]
uint('deliveries', ARGV[3])
uint('failed', ARGV[6])
if type(group) ~= 'string' or #group == 0 or #group > 128 then bad('group') end
if type(id) ~= 'string' or not string.match(id, '^%d+%-%d+$') then bad('id') end

local p = redis.call('XPENDING', KEYS[1], group, id, id, 1)
if #p == 0 or p[1][2] ~= ARGV[5] or tonumber(p[1][4]) ~= tonumber(ARGV[3]) then return { 'gone' } end
local e = redis.call('XRANGE', KEYS[1], id, id)
local fields = {}
if #e > 0 then fields = e[1][2] end
local reason = redis.call('HGET', KEYS[3], id) or ARGV[4]
if reason == '' then reason = 'not acknowledged after ' .. ARGV[6] .. ' deliveries' end
local add = { 'XADD', KEYS[2], '*' }
for _, f in ipairs(fields) do add[#add + 1] = f end
for _, f in ipairs({ 'origin', id, 'group', group, 'deliveries', ARGV[6], 'reason', reason }) do
  add[#add + 1] = f
end
local dead = redis.call(unpack(add))
redis.call('XACK', KEYS[1], group, id)
redis.call('HDEL', KEYS[3], id)
return { 'dead', dead }
