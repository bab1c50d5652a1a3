-- order.lua — one step on an order's record, the one source of truth of a cart. (prelude.lua
-- is prepended.)
--
-- Mirrors step() in src/cart/record.rs, answer for answer. The record lives in a slot of its
-- own (no item is in it); its clock is the only one that decides the deadline: an open record
-- (O holding, H held) at or past its deadline is first made X (expired) by any step that
-- writes, and read as X by `read`. Then:
--   open    none -> O (deadline = now + hold_ms); a record made for other items -> conflict
--           (nothing written); else the record as it is (a retry);
--   held    O -> H;            refuse  O -> F (with `why`);
--   confirm H -> C;            cancel  O, H -> K; none -> K (a cancel that overtook its hold);
--   expire  none -> X (the sweeper asks about an item whose record is gone);
--   read    nothing written.
-- A decision (C, K, X, F) is written once; the record is then kept `ttl_ms` from the decision
-- at least (every item must find it: the sweeper settles held items from it).
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  order record          <prefix>:{o<shard>}:order:<order id> (hash: s, dl, items,
--                                 why, un; PEXPIREAT un)
-- ARGV[1]  step                  open | held | refuse | confirm | cancel | expire | read
-- ARGV[2]  hold_ms               open: the hold (> 0); else 0
-- ARGV[3]  items                 open: `<sku>:<qty>` joined by `,` (1..4096 bytes); else ""
-- ARGV[4]  why                   refuse: `<item number> <outcome>[ <figure>]`; else ""
-- ARGV[5]  ttl_ms                how long a decided record is kept
--
-- Reply: {"none"} | {state, changed (0/1), left_ms, items, why, conflict (0/1)}
-- Errors: "ERR shardstock bad argument: <name>" before any write.
local step = ARGV[1]
local STEPS = { open = true, held = true, refuse = true, confirm = true, cancel = true, expire = true, read = true }
if not STEPS[step] then bad('step') end
local hold = uint('hold_ms', ARGV[2])
local items, why = ARGV[3], ARGV[4]
local ttl = uint('ttl_ms', ARGV[5])
if step == 'open' and (hold == 0 or #items == 0 or #items > 4096 or string.find(items, '[%s{}]')) then
  bad(hold == 0 and 'hold_ms' or 'items')
end
if step == 'refuse' and (#why == 0 or #why > 64) then bad('why') end
if #KEYS ~= 1 or not string.find(KEYS[1], ':order:', 1, true) then bad('keys') end

local now = now_ms()
local v = redis.call('HMGET', KEYS[1], 's', 'dl', 'items', 'why', 'un')
local rec
if v[1] then
  rec = { s = v[1], dl = tonumber(v[2]), items = v[3] or '', why = v[4] or '', un = tonumber(v[5]) }
  if rec.un <= now then rec = nil end
end
local function is_open(r) return r.s == 'O' or r.s == 'H' end
local function reply(r, changed, conflict)
  if not r then return { 'none' } end
  local left = is_open(r) and math.max(r.dl - now, 0) or 0
  return { r.s, changed and 1 or 0, int(left), r.items, r.why, conflict and 1 or 0 }
end
local function write(r)
  redis.call('HSET', KEYS[1], 's', r.s, 'dl', int(r.dl), 'items', r.items, 'why', r.why, 'un', int(r.un))
  redis.call('PEXPIREAT', KEYS[1], int(r.un))
end

if step == 'read' then
  if rec and is_open(rec) and now >= rec.dl then rec.s = 'X' end
  return reply(rec, false, false)
end
local changed = false
if rec and is_open(rec) and now >= rec.dl then
  rec.s = 'X'
  rec.un = math.max(rec.un, now + ttl)
  changed = true
end
if not rec then
  if step == 'open' then
    rec = { s = 'O', dl = now + hold, items = items, why = '', un = now + hold + ttl }
  elseif step == 'cancel' or step == 'expire' then
    rec = { s = step == 'cancel' and 'K' or 'X', dl = 0, items = '', why = '', un = now + ttl }
  else
    return { 'none' }
  end
  write(rec)
  return reply(rec, true, false)
end
-- A record found is written back even when this step changes nothing: in durability mode the
-- WAIT after this call then covers the write it answers from (another caller's, whose own WAIT
-- may have fallen short), so nothing acts on a decision a failover could still lose.
if step == 'open' and rec.items ~= '' and items ~= rec.items then
  write(rec)
  return reply(rec, changed, true)
end
local to
if step == 'held' and rec.s == 'O' then
  to = 'H'
elseif step == 'refuse' and rec.s == 'O' then
  to = 'F'
  rec.why = why
elseif step == 'confirm' and rec.s == 'H' then
  to = 'C'
elseif step == 'cancel' and is_open(rec) then
  to = 'K'
end
if to then
  rec.s = to
  if to ~= 'H' then rec.un = math.max(rec.un, now + ttl) end
  changed = true
end
write(rec)
return reply(rec, changed, false)
