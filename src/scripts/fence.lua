-- fence.lua — a new claim holder shuts an older one out of one segment.
--
-- After takeover.lua raised the claim epoch, the new holder fences every other segment: from
-- then on take.lua refuses the older epoch there, so a paused or slow old holder can never take
-- stock it would not account for. The reply tells the new holder what the old one already took.
--
-- KEYS[1]  request record at the segment   <prefix>:{<sku>#<i>}:g<gen>:rq:<request id>
-- ARGV[1]  epoch    the new holder's epoch
-- ARGV[2]  user
-- ARGV[3]  qty
-- ARGV[4]  ttl_ms
-- ARGV[5]  kind     's' | 'r'
--
-- Reply: {"clear"} (nothing taken here, now fenced) | {"applied", part} (an older epoch's part
--        is here; it is re-stamped with the new epoch, so only the new holder may refund it)
--        | {"fenced"} (a newer epoch got here first) | {"mismatch", field}
local epoch = posint('epoch', ARGV[1])
local user = ident('user', ARGV[2])
local qty = posint('qty', ARGV[3])
posint('ttl_ms', ARGV[4])
local kind = kindarg('kind', ARGV[5])

local rec = record(KEYS[1])
if rec and conflict(rec, user, qty, kind) and rec.s ~= 'A' then
  -- What an earlier request under this id left here when it ended (see take.lua): not ours
  -- to respect, fenced over.
  rec = nil
end
if rec then
  local f = conflict(rec, user, qty, kind)
  if f then return { 'mismatch', f } end
  if tonumber(rec.e) > epoch then return { 'fenced' } end
  if rec.s == 'A' then
    redis.call('HSET', KEYS[1], 'e', ARGV[1])
    return { 'applied', tonumber(rec.p) }
  end
end
redis.call('HSET', KEYS[1], 's', 'V', 'u', user, 'q', ARGV[3], 'e', ARGV[1], 'p', '0', 'k', kind)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return { 'clear' }
