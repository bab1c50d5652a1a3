-- shut_out.lua — a new claim holder shuts older claim epochs out of one fallback segment.
--
-- After takeover.lua raised the claim epoch, the new holder shuts older epochs out of every
-- other segment: from then on take.lua refuses them there, so a paused or slow old holder can
-- never take stock it would not account for. The reply tells the new holder what the old one
-- already took. (Claim epochs are not lock fence tokens: see fence_read.lua for those.)
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  request record at the segment   <prefix>:{<sku>#<i>}:g<gen>:rq:<request id>
-- KEYS[2]  the segment hash (not read: declared for slot moves, see record.lua)
-- ARGV[1]  epoch    the new holder's epoch
-- ARGV[2]  user
-- ARGV[3]  qty
-- ARGV[4]  ttl_ms
-- ARGV[5]  kind     's' | 'r'
--
-- Reply: {"clear"} (nothing taken here; a shut-out marker 'V' now refuses older epochs) |
--        {"applied", part} (an older epoch's part is here; it is re-stamped with the new epoch,
--        so only the new holder may refund it) | {"superseded"} (a newer epoch got here first)
--        | {"mismatch", field}
local epoch = posint('epoch', ARGV[1])
local user = ident('user', ARGV[2])
local qty = posint('qty', ARGV[3])
posint('ttl_ms', ARGV[4])
local kind = kindarg('kind', ARGV[5])

local rec = record(KEYS[1])
if rec and conflict(rec, user, qty, kind) and rec.s ~= 'A' then
  -- What an earlier request under this id left here when it ended (see take.lua): not ours
  -- to respect, shut out over.
  rec = nil
end
if rec then
  local f = conflict(rec, user, qty, kind)
  if f then return { 'mismatch', f } end
  if tonumber(rec.e) > epoch then return { 'superseded' } end
  if rec.s == 'A' then
    redis.call('HSET', KEYS[1], 'e', ARGV[1])
    return { 'applied', tonumber(rec.p) }
  end
end
redis.call('HSET', KEYS[1], 's', 'V', 'u', user, 'q', ARGV[3], 'e', ARGV[1], 'p', '0', 'k', kind)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return { 'clear' }
