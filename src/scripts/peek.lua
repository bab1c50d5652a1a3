-- peek.lua — one segment's counters and what its reservations hold, in one atomic step that
-- writes nothing. (prelude.lua is prepended; declared `no-writes`.)
--
-- survey.lua without the reclaim (Segment::peek in src/store/memory/segment.rs): the audit's,
-- the status's and the live audit's read. Declared `no-writes`, so a master that refuses
-- writes (below its `min-replicas-to-write`) still answers it and an operator can see the stock
-- during the incident. Reservations past their expiry are not returned: their units stay in
-- `reserved` and in `held`, and `expired` says how many of them are on their way back (the next
-- script that writes at this segment returns them).
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash          <prefix>:{<tag>}:seg
-- KEYS[2]  reservation index     <prefix>:{<tag>}:g<gen>:resv
-- KEYS[3]  limited ledgers       <prefix>:{<tag>}:g<gen>:led (declared: see sell.lua)
-- ARGV[1]  gen
-- ARGV[2]  detail   "1": look at every reservation of the index (held, live, orphans: the
--                   audit's); "0": only those past their expiry (held, live, orphans answered 0)
--
-- Reply: {"peek", stock, sold, loaded, restocked, reserved, tin, tout, held, live, orphans,
--         expired} where held = units of the index entries whose record is R (expired or not; and
--         of the hold index entries whose record is O),
--         live = those entries, orphans = entries whose record is gone or no longer R, expired =
--         units of the R entries past their expiry | {"stale"}
-- Cost: one HGET per reservation read (every live one with detail, the expired ones without).
local gen = ARGV[1]
uint('gen', gen)
local detail = ARGV[2]
if detail ~= '0' and detail ~= '1' then bad('detail') end
local base = seg_base(KEYS[1])
if string.sub(KEYS[1], -4) ~= ':seg' or KEYS[2] ~= base .. 'g' .. gen .. ':resv'
    or KEYS[3] ~= base .. 'g' .. gen .. ':led' or #KEYS ~= 3 then
  bad('keys')
end
local names = { 'gen', 'stock', 'sold', 'loaded', 'restocked', 'reserved', 'tin', 'tout', 'lim', 'hf' }
local v = redis.call('HMGET', KEYS[1], unpack(names))
if not v[1] or v[1] ~= gen then return { 'stale' } end
local st = open(KEYS[1], names, v)
local now = clock(st)
local read = index_reader(base .. 'g' .. gen, st.lim, st.hfv)
local held, nlive, orphans, expired = 0, 0, 0, 0
local index
if detail == '1' then
  index = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
else
  index = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', int(now), 'WITHSCORES')
end
for i = 1, #index, 2 do
  local _, _, _, rec = read(index[i])
  local s, q = nil, nil
  if rec then s, q = rec_parse(rec) end
  if s == 'R' then
    -- The reclaim returns every entry whose expiry is <= now (ZRANGEBYSCORE -inf now).
    if tonumber(index[i + 1]) <= now then expired = expired + q end
    held = held + q
    nlive = nlive + 1
  else
    orphans = orphans + 1
  end
end
if detail ~= '1' then
  held, nlive, orphans = 0, 0, 0
else
  local h, n, o = holds_detail(base .. 'g' .. gen, read)
  held, nlive, orphans = held + h, nlive + n, orphans + o
end
return { 'peek', st.stock, st.sold, tonumber(st.loaded or '0'), tonumber(st.restocked or '0'),
  st.reserved, st.tin, st.tout, held, nlive, orphans, expired }
