-- survey.lua — one segment's counters and what its live reservations hold, in one atomic step,
-- after returning every expired reservation. (prelude.lua is prepended.)
--
-- The audit's and the sweeper's look at a segment (Segment::survey in
-- src/store/memory/segment.rs). `reserved` must equal the units held by live reservations: a
-- reservation is in the index exactly while its record is R, so the sum over the index is what
-- `reserved` may hold. A unit counted in `reserved` that no live reservation holds would never
-- come back (a leak); the audit names it. Writes only what the reclaim returns.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash          <prefix>:{<tag>}:seg
-- KEYS[2]  reservation index     <prefix>:{<tag>}:g<gen>:resv
-- KEYS[3]  outbox stream         <prefix>:{<tag>}:out (an `expired` event per reservation returned)
-- KEYS[4]  limited ledgers       <prefix>:{<tag>}:g<gen>:led (declared: see sell.lua)
-- ARGV[1]  gen
-- ARGV[2]  detail   "1": also look at every live reservation (held, live, orphans: the
--                   audit's); "0": counters only (held, live, orphans answered 0)
--
-- Publishes: `R <gen> <segment key>` on <prefix>:stock when expired reservations came back.
--
-- Reply: {"survey", stock, sold, loaded, restocked, reserved, tin, tout, held, live, orphans,
--         reclaimed} where held = units of the index entries whose record is R (and of the hold index
--         entries whose record is O: order items), live = those
--         entries, orphans = entries whose record is gone or no longer R, reclaimed = units
--         this call returned to stock | {"stale"}
-- Cost: with detail, one HGET per live reservation's ledger (the audit only).
local gen = ARGV[1]
uint('gen', gen)
local detail = ARGV[2]
if detail ~= '0' and detail ~= '1' then bad('detail') end
local base = seg_base(KEYS[1])
if string.sub(KEYS[1], -4) ~= ':seg' or KEYS[2] ~= base .. 'g' .. gen .. ':resv'
    or KEYS[3] ~= base .. 'out' or KEYS[4] ~= base .. 'g' .. gen .. ':led' then
  bad('keys')
end
local names = { 'gen', 'stock', 'sold', 'loaded', 'restocked', 'reserved', 'tin', 'tout', 'lim', 'out', 'hf' }
local v = redis.call('HMGET', KEYS[1], unpack(names))
if not v[1] or v[1] ~= gen then return { 'stale' } end
local st = open(KEYS[1], names, v)
local ob = outbox(KEYS[1], KEYS[3], st.out)
outbox_ready(ob)
local back = reclaim(st, gen, KEYS[2], ob)
flush(st)
if back > 0 then stock_event('R', gen, KEYS[1]) end
local gbase = base .. 'g' .. gen
local held, nlive, orphans, read = 0, 0, 0, index_reader(gbase, st.lim, st.hfv)
local index = detail == '1' and redis.call('ZRANGE', KEYS[2], 0, -1) or {}
for _, m in ipairs(index) do
  local _, _, _, rec = read(m)
  local s, q = nil, nil
  if rec then s, q = rec_parse(rec) end
  if s == 'R' then
    held = held + q
    nlive = nlive + 1
  else
    orphans = orphans + 1
  end
end
if detail == '1' then
  local h, n, o = holds_detail(gbase, read)
  held, nlive, orphans = held + h, nlive + n, orphans + o
end
return { 'survey', st.stock, st.sold, tonumber(st.loaded or '0'), tonumber(st.restocked or '0'),
  st.reserved, st.tin, st.tout, held, nlive, orphans, back }
