-- take.lua — fallback: take `part` units for a claimed request at one segment.
--
-- Used after deduct.lua answered "short" and claimed the request at its home segment. At the
-- home segment the part is written into the claim itself (field hp); at any other segment a
-- part record is written. Part records carry the claim's epoch, so a claim holder that was
-- taken over (see takeover.lua / shut_out.lua) can never take stock after the new holder shut
-- its epoch out.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash          <prefix>:{<sku>#<i>}:seg
-- KEYS[2]  request record here   <prefix>:{<sku>#<i>}:g<gen>:rq:<request id>
-- KEYS[3]  reservation index     <prefix>:{<sku>#<i>}:g<gen>:resv
-- KEYS[4]  outbox stream         <prefix>:{<sku>#<i>}:out (expired reservations reclaimed here)
-- KEYS[5]  mode "decr" only: the decrement's one-time token <prefix>:{<sku>#<i>}:dt:<nonce>
-- ARGV[1]  gen
-- ARGV[2]  user
-- ARGV[3]  qty       the request's whole quantity (checked against the records)
-- ARGV[4]  part      units to take here (> 0, <= qty)
-- ARGV[5]  epoch     the caller's claim epoch (> 0)
-- ARGV[6]  ttl_ms
-- ARGV[7]  is_home   "1" when KEYS[1] is the request's home segment
-- ARGV[8]  mode      "lua" (check stock here) | "fenced" (lock strategies: the caller decided
--                    under a lock; apply only while the segment's fence token equals ARGV[9]) |
--                    "decr" (decr-compensate: the caller already took `part` off the stock
--                    with HINCRBY; it is given back here and the part decided as "lua")
-- ARGV[9]  fence_token  mode "fenced": the lock fence token (fence_read.lua); mode "decr": the
--                    nonce naming KEYS[5]; otherwise 0
-- ARGV[10] resv_ttl_ms   0: sell; > 0: reserve the part (see deduct.lua); also the kind
--                        ('r' / 's') the records must carry
--
-- Reply:
--   {"taken", stock_after, part}   units taken now, or already taken by this epoch (idempotent)
--   {"short", stock}               fewer than `part` units here; nothing changed
--   {"superseded"}                 the caller's claim epoch was superseded; nothing changed
--   {"mismatch", field}
--   {"stale", gen_or_missing}
--   {"invariant", stock}           mode "fenced": stock < part despite the lock; refused
--   {"lock_lost"}                  mode "fenced": a newer lock holder exists; nothing written
uint('gen', ARGV[1])
local gen = ARGV[1]
local user = ident('user', ARGV[2])
local qty = posint('qty', ARGV[3])
local part = posint('part', ARGV[4])
local epoch = posint('epoch', ARGV[5])
local ttl = posint('ttl_ms', ARGV[6])
local is_home = ARGV[7]
if is_home ~= '0' and is_home ~= '1' then bad('is_home') end
if part > qty then bad('part') end
local mode = ARGV[8]
if mode ~= 'lua' and mode ~= 'fenced' and mode ~= 'decr' then bad('mode') end
local fence_token = uint('fence_token', ARGV[9])
local resv_ttl = uint('resv_ttl_ms', ARGV[10])
local kind = resv_ttl > 0 and 'r' or 's'

local ob = outbox(KEYS[1], KEYS[4])
outbox_ready(ob)
if mode == 'decr' then
  give_back_once(KEYS[1], KEYS[5], ARGV[4], ARGV[6]) -- see deduct.lua
  mode = 'lua'
end
local stock, other = segment(KEYS[1], gen)
if not stock then return { 'stale', other } end
local now = now_ms()
stock = stock + reclaim(KEYS[1], KEYS[3], now, ob)

local rec = record(KEYS[2])
if rec and rec.s == 'F' then rec = nil end -- a released claim (home only): no claim
if rec then
  local f = conflict(rec, user, qty, kind)
  if f then
    -- Away from home, a refunded ('R') or shut-out ('V') record of another request is what an
    -- earlier request under this id left when it ended without selling here (released at
    -- home, so the id was free to claim again): the caller's claim at home is the authority
    -- now, and the record is treated as absent. A part that is live ('A') still conflicts.
    if is_home == '1' or rec.s == 'A' then return { 'mismatch', f } end
    rec = nil
  end
end
if mode == 'fenced' then
  if tonumber(redis.call('HGET', KEYS[1], 'fence') or '0') ~= fence_token then return { 'lock_lost' } end
end
-- Under a lock the caller already decided; a short segment here means the lock failed.
local function short()
  if mode == 'fenced' then return { 'invariant', stock } end
  return { 'short', stock }
end

if is_home == '1' then
  if not rec or rec.s ~= 'P' or tonumber(rec.e) ~= epoch then return { 'superseded' } end
  local hp = tonumber(rec.hp)
  if hp > 0 then return { 'taken', stock, hp } end
  if stock < part then return short() end
  redis.call('HINCRBY', KEYS[1], 'stock', -part)
  redis.call('HSET', KEYS[2], 'hp', part)
  if resv_ttl > 0 then
    hold(KEYS[1], KEYS[3], KEYS[2], part, now, resv_ttl, ttl)
  else
    redis.call('HINCRBY', KEYS[1], 'sold', part)
  end
  return { 'taken', stock - part, part }
end

if rec then
  local e = tonumber(rec.e)
  if rec.s == 'A' then
    if e == epoch then return { 'taken', stock, tonumber(rec.p) } end
    return { 'superseded' }
  end
  -- 'V' (shut-out marker) or 'R' (refunded part): only an equal or newer epoch may go on.
  if e > epoch then return { 'superseded' } end
end

if stock < part then return short() end
redis.call('HINCRBY', KEYS[1], 'stock', -part)
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 's', 'A', 'u', user, 'q', ARGV[3], 'e', ARGV[5], 'p', ARGV[4], 'k', kind)
redis.call('PEXPIRE', KEYS[2], ARGV[6])
if resv_ttl > 0 then
  hold(KEYS[1], KEYS[3], KEYS[2], part, now, resv_ttl, ttl)
else
  redis.call('HINCRBY', KEYS[1], 'sold', ARGV[4])
end
return { 'taken', stock - part, part }
