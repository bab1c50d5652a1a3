-- record.lua — one request's record at its home segment (read only). (prelude.lua is prepended.)
--
-- Mirrors Segment::record (src/store/memory/segment.rs): the record of `request id` in the
-- user's ledger, unless it is forgotten (past its `until`); a reservation still R past its
-- expiry reads as expired (X) — the reclaim that will make it so has not run yet.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash     <prefix>:{<tag>}:seg (its generation is checked)
-- KEYS[2]  the user's ledger <prefix>:{<tag>}:g<gen>:u:<user>
-- ARGV[1]  gen
-- ARGV[2]  user
-- ARGV[3]  request id
--
-- Reply: {state, qty} with state the record's letter (A sold, R reserved, C confirmed,
--        K cancelled, X expired) | {} (no record, forgotten, or the segment is missing or of
--        another generation)
local gen = ARGV[1]
uint('gen', gen)
local user = ident('user', ARGV[2])
local rid = ident('request_id', ARGV[3])
if string.sub(KEYS[1], -4) ~= ':seg' or KEYS[2] ~= seg_base(KEYS[1]) .. 'g' .. gen .. ':u:' .. user then
  bad('keys')
end
if redis.call('HGET', KEYS[1], 'gen') ~= gen then return {} end
local rec = redis.call('HGET', KEYS[2], '=' .. rid)
if not rec then return {} end
local s, q, u, exp = rec_parse(rec)
if not s then return {} end
local now
if u ~= 0 or s == 'R' then now = now_ms() end
if not live(u, now) then return {} end
if s == 'R' and exp <= now then s = 'X' end
return { s, q }
