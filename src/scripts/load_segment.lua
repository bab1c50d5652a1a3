-- load_segment.lua — write one segment of a new load generation, replacing an older one.
-- (prelude.lua is prepended.)
--
-- Loads can race (two operators, two instances reloading at once). The segment keeps the
-- highest generation ever written to it: a slower load of an older generation never overwrites
-- a newer one (its load_commit then answers "superseded"), so the generation that wins the
-- metadata always finds all of its segments.
--
-- The generation the segment held ends here: its live reservations end unsold (a `cancelled`
-- event each when its outbox was on; see the prelude's end_reservations), and every script
-- checks the generation, so its other keys (ledgers, credits, transfers, restock records, all
-- named `…:g<old>:…`) are unreachable from now on: the caller unlinks them afterwards (SCAN,
-- best effort), named by the generation this reply gives. The same load again (the generation
-- the segment holds, with its units, limit, outbox and home function: a re-sent load) writes
-- nothing and answers "ok": the first one wrote it, and the sales since may have moved its
-- counters — writing it again would hand out sold units a second time. Another load that drew
-- the same generation (only after Redis lost the SKU's metadata) writes as a new one.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- Both hashes the hot path reads are written so that Redis keeps them as hash tables: a field
-- `pad` in the segment, and with a per-user limit a field ` pad` (a leading space: no user id
-- can be it) in the generation's ledgers, each of PAD_BYTES bytes. A hash holding a value
-- longer than hash-max-listpack-value (64 by default) is a hash table for good; a smaller one
-- is a listpack, where a field is found by scanning every entry and inserted by moving the
-- rest: a ledger of a few hundred users cost a call of 21 sales 777,000 instructions instead of
-- 442,000 (callgrind), and the segment's nine-field read and four-field write ~8,000 more per
-- call. A server configured with hash-max-listpack-value at PAD_BYTES or above keeps listpacks:
-- only slower.
--
-- KEYS[1]  segment hash   <prefix>:{<tag>}:seg
-- KEYS[2]  outbox stream  <prefix>:{<tag>}:out
-- KEYS[3]  limited ledgers <prefix>:{<tag>}:g<gen>:led (created, padded, when lim > 0)
-- ARGV[1]  gen
-- ARGV[2]  units
-- ARGV[3]  outbox   "1": the selling scripts append events to the segment's stream (field out)
-- ARGV[4]  lim      units one user may hold at this segment (0: no limit; field lim)
-- ARGV[5]  hf       the home function version of the load (field hf; sell.lua compares it)
--
-- Publishes: `S <gen> <segment key>` on <prefix>:stock once written (stock_event): a flag of
-- the replaced generation goes before its metadata names the new one.
--
-- Reply: {"ok", replaced_gen} (0: the segment held none, or this very generation) |
--        {"superseded", newer_gen}
uint('gen', ARGV[1])
uint('units', ARGV[2])
if ARGV[3] ~= '0' and ARGV[3] ~= '1' then bad('outbox') end
uint('lim', ARGV[4])
uint('hf', ARGV[5])
local base = seg_base(KEYS[1])
if string.sub(KEYS[1], -4) ~= ':seg' or KEYS[2] ~= base .. 'out'
    or KEYS[3] ~= base .. 'g' .. ARGV[1] .. ':led' then
  bad('keys')
end
local PAD_BYTES = 256
local pad = string.rep('.', PAD_BYTES)
local v = redis.call('HMGET', KEYS[1], 'gen', 'out', 'loaded', 'lim', 'hf')
local cur = v[1]
if cur and tonumber(cur) > tonumber(ARGV[1]) then return { 'superseded', tonumber(cur) } end
if cur == ARGV[1] and v[2] == ARGV[3] and v[3] == ARGV[2] and v[4] == ARGV[4] and v[5] == ARGV[5] then
  return { 'ok', 0 }
end
local replaced = 0
if cur and cur ~= ARGV[1] then
  end_reservations(KEYS[1], cur, v[2], KEYS[2])
  replaced = tonumber(cur)
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'stock', ARGV[2], 'loaded', ARGV[2], 'restocked', '0',
  'sold', '0', 'reserved', '0', 'tin', '0', 'tout', '0', 'lim', ARGV[4], 'hf', ARGV[5], 'out', ARGV[3],
  'pad', pad)
if ARGV[4] ~= '0' then redis.call('HSET', KEYS[3], ' pad', pad) end
stock_event('S', ARGV[1], KEYS[1])
return { 'ok', replaced }
