-- deduct.lua — the hot path: one request at its home segment, all or nothing.
-- (prelude.lua and deduct_core.lua are prepended; deduct_batch.lua runs the same core for many
-- requests in one call.)
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash   <prefix>:{<sku>#<i>}:seg   (fields gen, stock, sold, loaded, restocked,
--                                                      reserved; fence: the lock fence token)
-- KEYS[2]  request record <prefix>:{<sku>#<i>}:g<gen>:rq:<request id>   (same hash tag as KEYS[1])
-- KEYS[3]  reservation index <prefix>:{<sku>#<i>}:g<gen>:resv (ZSET of record keys by expiry)
-- KEYS[4]  claim index       <prefix>:{<sku>#<i>}:g<gen>:claims (ZSET of claim records by lease end)
-- KEYS[5]  outbox stream     <prefix>:{<sku>#<i>}:out (appended to when the segment's `out` is 1)
-- KEYS[6]  mode "decr" only: the decrement's one-time token <prefix>:{<sku>#<i>}:dt:<nonce>
-- ARGV[1]  gen        load generation the caller believes in
-- ARGV[2]  user       user id
-- ARGV[3]  qty        units wanted (> 0)
-- ARGV[4]  index      this segment's index (written into the outcome)
-- ARGV[5]  ttl_ms     how long the outcome record lives (> 0)
-- ARGV[6]  lease_ms   lease of a fallback claim (> 0)
-- ARGV[7]  claim      "1": when short, claim the request for a cross-segment fallback; "0": don't
-- ARGV[8]  mode       "lua": check stock >= qty here (the atomic strategy)
--                     "claim": only check the record and claim (the caller saw the segment short)
--                     "fenced": lock strategies — the caller read the stock under a lock and
--                     decided; apply only while the segment's fence token still equals ARGV[9]
--                     "decr": decr-compensate — the caller already decremented the stock by
--                     qty with HINCRBY; it is given back and the request decided as "lua"
-- ARGV[9]  fence_token  mode "fenced": the fence token the caller's lock acquisition got
--                     (fence_read.lua); mode "decr": the nonce naming KEYS[6]; otherwise 0
-- ARGV[10] resv_ttl_ms 0: sell; > 0: reserve the units for this long (server clock), they go
--                     to `reserved` instead of `sold` and return by themselves when unconfirmed.
--                     It also sets the request's kind: a reservation ('r') or a sale ('s'); a
--                     record of the other kind under the same request id is a conflict.
--
-- Reply (first element is the tag):
--   {"applied", stock_after}            qty taken here; record = applied, parts "<index>:<qty>";
--                                       outbox on: a "sold" (or "reserved") event appended
--   {"short", stock, epoch}             not enough here; epoch = the epoch of the pending
--                                       claim written for the caller (1, or one above a
--                                       released claim's of this request id), 0 when none
--   {"replay", parts}                   this request id already applied; nothing changed
--   {"pending", epoch, lease_left_ms}   another caller holds the fallback claim of this request id
--   {"mismatch", field}                 this request id was used with another user, qty or kind
--   {"stale", gen_or_missing}           the segment is missing or of another generation
--   {"sealed"}                          the request id was sealed (its per-user claim expired and
--                                       was verified void, or the sweeper recovered its abandoned
--                                       fallback claim): it can never apply
--   {"lock_lost"}                       mode "fenced": a newer lock holder exists; nothing written
--   {"invariant", stock}                mode "fenced": the decision was stale (stock < qty);
--                                       refused rather than oversold — a locking bug signal
-- Errors: "ERR shardstock bad argument: <name>" before any write.
uint('gen', ARGV[1])
local gen = ARGV[1] -- canonical once validated
local user = ident('user', ARGV[2])
local qty = posint('qty', ARGV[3])
local index = uint('index', ARGV[4])
posint('ttl_ms', ARGV[5])
local lease = posint('lease_ms', ARGV[6])
local claim = ARGV[7]
if claim ~= '0' and claim ~= '1' then bad('claim') end
local mode = ARGV[8]
if mode ~= 'lua' and mode ~= 'claim' and mode ~= 'fenced' and mode ~= 'decr' then bad('mode') end
local fence_token = uint('fence_token', ARGV[9])
local resv_ttl = uint('resv_ttl_ms', ARGV[10])

if mode == 'decr' then
  -- decr-compensate: give the caller's decrement back (once, see give_back_once) and decide
  -- as "lua" would, in this one atomic step: a twin (the same request id sent twice, each
  -- with its own decrement) finds the first one's record and replays, so both never sell.
  give_back_once(KEYS[1], KEYS[6], ARGV[3], ARGV[5])
  mode = 'lua'
end
local st, other = open_segment(KEYS[1], KEYS[3], gen, KEYS[5],
  { index = ARGV[4], ttl_s = ARGV[5], lease = lease, mode = mode, fence_token = fence_token })
if not st then return { 'stale', other } end
local r = { rk = KEYS[2], u = user, qty = qty, q = ARGV[3], claim = claim,
  resv_ttl = resv_ttl, k = resv_ttl > 0 and 'r' or 's' }
prefetch(st, { r })
local reply = decide(st, KEYS[1], r)
if type(reply) == 'number' then reply = { 'applied', reply } end
commit(st, KEYS[1], KEYS[3], KEYS[4])
return reply
