-- holds_due.lua — the order items held at a segment past their hint (read only). (prelude.lua
-- is prepended.)
--
-- The sweeper's look (Segment::holds_due in src/store/memory/segment/holds.rs): each item
-- held for an order is indexed by its hint — its order's deadline on this master's clock —
-- and, once that has passed, the sweeper asks the order's record what became of it and
-- settles the item (settle.lua). Entries whose record is no longer O are passed over.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash          <prefix>:{<tag>}:seg
-- KEYS[2]  hold index            <prefix>:{<tag>}:g<gen>:hold
-- ARGV[1]  gen
-- ARGV[2]  max                   at most this many items (> 0)
--
-- Reply: {"due", user, request id, qty, ...} oldest hint first | {"stale"}
local gen = ARGV[1]
uint('gen', gen)
local max = posint('max', ARGV[2])
local base = seg_base(KEYS[1])
local gbase = base .. 'g' .. gen
if string.sub(KEYS[1], -4) ~= ':seg' or KEYS[2] ~= gbase .. ':hold' then bad('keys') end
local v = redis.call('HMGET', KEYS[1], 'gen', 'lim', 'hf')
if not v[1] or v[1] ~= gen then return { 'stale' } end
local read = index_reader(gbase, tonumber(v[2] or '0'), tonumber(v[3] or '0'))
local out = { 'due' }
-- Entries whose record is no longer O are passed over before the bound counts (as
-- Segment::holds_due filters first).
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', int(now_ms()))) do
  if #out >= 1 + 3 * max then break end
  local user, rid, _, rec = read(m)
  if rec then
    local s, _, _, _, qs = rec_parse(rec)
    if s == 'O' then
      out[#out + 1] = user
      out[#out + 1] = rid
      out[#out + 1] = qs
    end
  end
end
return out
