-- record.lua — one request's record at its home segment (read only). (prelude.lua is prepended.)
--
-- Mirrors Segment::record (src/store/memory/segment.rs): the record of `request id` in the
-- user's ledger, unless it is forgotten (past its `until`); a reservation still R past its
-- expiry reads as expired (X) — the reclaim that will make it so has not run yet.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash     <prefix>:{<tag>}:seg (its generation, limit and sales windows
--                            are read; the keys holding records are named from it, see the
--                            prelude's ledger and sale_rec)
-- ARGV[1]  gen
-- ARGV[2]  user
-- ARGV[3]  request id
--
-- Reply: {state, qty} with state the record's letter (A sold, R reserved, C confirmed,
--        K cancelled, X expired; an order item's O held, P posted, V voided) | {} (no record, forgotten, or the segment is missing or of
--        another generation)
local gen = ARGV[1]
uint('gen', gen)
local user = ident('user', ARGV[2])
local rid = ident('request_id', ARGV[3])
if string.sub(KEYS[1], -4) ~= ':seg' or #KEYS ~= 1 then bad('keys') end
local v = redis.call('HMGET', KEYS[1], 'gen', 'lim', 'hf', 'rw')
if v[1] ~= gen then return {} end
local l = ledger(seg_base(KEYS[1]) .. 'g' .. gen, tonumber(v[2] or '0'), user, tonumber(v[3] or '0'))
local now, rec
if l.pre then
  -- Without a limit: the record hash, then the sales windows.
  now = now_ms()
  rec = sale_rec(l, v[4], user, rid, now)
else
  rec = led_rec(l, rid)
end
if not rec then return {} end
local s, q, u, exp = rec_parse(rec)
if not s then return {} end
if not now and (u ~= 0 or s == 'R') then now = now_ms() end
if not live(u, now) then return {} end
if s == 'R' and exp <= now then s = 'X' end
return { s, q }
