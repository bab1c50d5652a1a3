-- held.lua — the audit's look at one segment: its counters and what its live reservations hold,
-- read in one atomic step (no write).
--
-- `reserved` must equal the units held by live reservations: a record is in the reservation
-- index exactly while its reservation is live (rs = R), so the sum of `rq` over the index is
-- what `reserved` may hold. A unit counted in `reserved` that no live reservation holds would
-- never come back (a leak); the audit names it.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash          <prefix>:{<sku>#<i>}:seg
-- KEYS[2]  reservation index     <prefix>:{<sku>#<i>}:g<gen>:resv
-- ARGV[1]  gen
--
-- Reply: {"held", stock, sold, loaded, restocked, reserved, held_units, live, orphans}
--        where live = index entries whose record holds a live reservation, orphans = index
--        entries whose record is gone or no longer reserved | {"stale", gen_or_missing}
-- Cost: one HMGET per live reservation of the segment (audit only, not the sale path).
uint('gen', ARGV[1])
local v = redis.call('HMGET', KEYS[1], 'gen', 'stock', 'sold', 'loaded', 'restocked', 'reserved')
if not v[1] then return { 'stale', 'missing' } end
if v[1] ~= ARGV[1] then return { 'stale', v[1] } end
local held, live, orphans = 0, 0, 0
for _, rk in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local r = redis.call('HMGET', rk, 'rs', 'rq')
  if r[1] == 'R' then
    held = held + tonumber(r[2])
    live = live + 1
  else
    orphans = orphans + 1
  end
end
return { 'held', tonumber(v[2]), tonumber(v[3]), tonumber(v[4]), tonumber(v[5]),
  tonumber(v[6] or '0'), held, live, orphans }
