-- reclaim.lua — the sweeper's step: return a segment's expired reservations to its stock.
--
-- The same reclaim runs lazily inside every deduct/take/confirm/cancel on the segment, so
-- stock comes back even when no sweeper runs; a reservation is returned at most once however
-- many sweepers and scripts race (its record's `rs` moves R -> X inside one atomic script).
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash          <prefix>:{<sku>#<i>}:seg
-- KEYS[2]  reservation index     <prefix>:{<sku>#<i>}:g<gen>:resv
-- KEYS[3]  outbox stream         <prefix>:{<sku>#<i>}:out (an `expired` event per reservation returned)
-- ARGV[1]  gen
--
-- Publishes: `R <gen> <segment key>` on <prefix>:stock when units came back (prelude's reclaim).
--
-- Reply: {"reclaimed", units, reserved} (reserved = units still held by live reservations)
--        | {"stale", g}
uint('gen', ARGV[1])
local gen = ARGV[1]
local stock, other = segment(KEYS[1], gen)
if not stock then return { 'stale', other } end
local ob = outbox(KEYS[1], KEYS[3])
outbox_ready(ob)
local back = reclaim(KEYS[1], KEYS[2], now_ms(), ob)
return { 'reclaimed', back, tonumber(redis.call('HGET', KEYS[1], 'reserved') or '0') }
