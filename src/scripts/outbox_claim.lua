-- outbox_claim.lua — claim outbox events idle too long (their consumer died, or their
-- handler failed), with each one's delivery count, in one atomic step.
--
-- XAUTOCLAIM alone does not say how often an entry was delivered, and a range XPENDING
-- afterwards can be cut short by other entries the consumer already holds in that range;
-- asking per entry inside the script is exact, and no other claimer can come in between.
--
-- KEYS[1]  outbox stream   <prefix>:{<sku>#<i>}:out
-- ARGV[1]  group
-- ARGV[2]  consumer        the claimer
-- ARGV[3]  min_idle_ms
-- ARGV[4]  cursor          stream id to scan from ("0-0": the start)
-- ARGV[5]  count           most entries to claim (1..10000)
--
-- Reply: {next_cursor, {{id, {field, value, ...}, deliveries}, ...}} (next_cursor "0-0": the
-- scan went through the whole pending list); deliveries include this one.
local group, consumer, cursor = ARGV[1], ARGV[2], ARGV[4]
if type(group) ~= 'string' or #group == 0 or #group > 128 then bad('group') end
if type(consumer) ~= 'string' or #consumer == 0 or #consumer > 128 then bad('consumer') end
uint('min_idle_ms', ARGV[3])
if type(cursor) ~= 'string' or not string.match(cursor, '^%d+%-%d+$') then bad('cursor') end
local count = posint('count', ARGV[5])
if count > 10000 then bad('count') end

local r = redis.call('XAUTOCLAIM', KEYS[1], group, consumer, ARGV[3], cursor, 'COUNT', ARGV[5])
local out = {}
for _, e in ipairs(r[2]) do
  if e then
    local p = redis.call('XPENDING', KEYS[1], group, e[1], e[1], 1)
    out[#out + 1] = { e[1], e[2], p[1] and p[1][4] or 1 }
  end
end
return { r[1], out }
