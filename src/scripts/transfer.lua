-- transfer.lua — moving stock between segments, at the donor: debit, done, and the due list.
-- (prelude.lua is prepended.)
--
-- A transfer moves units from a donor segment to a request's home: the donor debits them here
-- (stock -= units, tout += units) and remembers the transfer by id for the whole generation; the
-- home credits them once per id (sell.lua). Until the credit is known done, the transfer is in
-- the donor's due index: once its lease runs out, any sweeper may credit it home. Mirrors
-- Segment::transfer, transfer_done and transfers_due (src/store/memory/segment.rs).
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  segment hash        <prefix>:{<tag>}:seg   (gen, stock, reserved, tout, lim, out)
-- KEYS[2]  reservation index   <prefix>:{<tag>}:g<gen>:resv
-- KEYS[3]  transfers           <prefix>:{<tag>}:g<gen>:tx  (hash: id -> <dest>:<units>:<lease end>,
--                              lease end 0 once done)
-- KEYS[4]  due index           <prefix>:{<tag>}:g<gen>:txq (ZSET: id zero-padded to 20 digits, by
--                              lease end; only transfers not done)
-- KEYS[5]  outbox stream       <prefix>:{<tag>}:out (an `expired` event per reservation reclaimed)
-- KEYS[6]  limited ledgers     <prefix>:{<tag>}:g<gen>:led (the reclaim's, under a per-user limit;
--                               declared so Redis refuses the call up front, not half-way)
-- ARGV[1]  op    "debit" | "done" | "due"
-- ARGV[2]  gen
-- op debit:  ARGV[3] id (decimal u64 text, never 0), ARGV[4] dest (segment index), ARGV[5] want
--            (> 0), ARGV[6] floor (the donor keeps at least this many units), ARGV[7] lease_ms.
--            Returns every expired reservation first (the prelude's reclaim). A known id replays
--            its units (and, not done, renews its lease to now + lease_ms: the replay writes, so
--            a durability WAIT after it covers the debit); otherwise gives
--            min(want, max(0, stock - floor)) units, none -> short (nothing recorded).
-- op done:   ARGV[3] id. Marks the transfer done (lease end 0) and drops it from the due
--            index; its id stays known. An unknown id: nothing.
-- op due:    ARGV[3] max (> 0). Read only: the transfers not done, by lease end then id, at
--            most max, each with its lease left (0 once it ran out: any sweeper may credit it).
--
-- Publishes: `R <gen> <segment key>` on <prefix>:stock when expired reservations came back.
--
-- Reply: debit: {"debited", units, stock_after} | {"short", stock} | {"stale"}
--        done:  {"ok"} | {"stale"}
--        due:   {{id, dest, units, lease_left_ms}, ...} (ids as text) | {"stale"}
-- Errors: "ERR shardstock bad argument: <name>" before any write.
local op = ARGV[1]
local gen = ARGV[2]
uint('gen', gen)
local base = seg_base(KEYS[1])
local gbase = base .. 'g' .. gen
if string.sub(KEYS[1], -4) ~= ':seg' or KEYS[2] ~= gbase .. ':resv' or KEYS[3] ~= gbase .. ':tx'
    or KEYS[4] ~= gbase .. ':txq' or KEYS[5] ~= base .. 'out' or KEYS[6] ~= gbase .. ':led' then
  bad('keys')
end
local id, dest, want, floor, lease, max
if op == 'debit' then
  if #ARGV ~= 7 then bad('argc') end
  id = txid('transfer_id', ARGV[3])
  dest = uint('dest', ARGV[4])
  want = posint('want', ARGV[5])
  floor = uint('floor', ARGV[6])
  lease = uint('lease_ms', ARGV[7])
elseif op == 'done' then
  if #ARGV ~= 3 then bad('argc') end
  id = txid('transfer_id', ARGV[3])
elseif op == 'due' then
  if #ARGV ~= 3 then bad('argc') end
  max = posint('max', ARGV[3])
else
  bad('op')
end

local v = redis.call('HMGET', KEYS[1], 'gen', 'stock', 'reserved', 'tout', 'lim', 'out', 'hf')
if not v[1] or v[1] ~= gen then return { 'stale' } end

if op == 'due' then
  local now = now_ms()
  local z = redis.call('ZRANGE', KEYS[4], 0, max - 1, 'WITHSCORES')
  local due = {}
  for i = 1, #z, 2 do
    local tid = string.match(z[i], '^0*(%d+)$')
    local x = redis.call('HGET', KEYS[3], tid)
    if x then
      local d, u = string.match(x, '^(%d+):(%d+):')
      local left = tonumber(z[i + 1]) - now
      if left < 0 then left = 0 end
      due[#due + 1] = { tid, tonumber(d), tonumber(u), left }
    end
  end
  return due
end

if op == 'done' then
  local x = redis.call('HGET', KEYS[3], id)
  if x then
    local d, u, l = string.match(x, '^(%d+):(%d+):(%d+)$')
    if l ~= '0' then
      redis.call('HSET', KEYS[3], id, d .. ':' .. u .. ':0')
      redis.call('ZREM', KEYS[4], txmember(id))
    end
  end
  return { 'ok' }
end

-- debit
local st = open(KEYS[1], { 'gen', 'stock', 'reserved', 'tout', 'lim', 'out', 'hf' }, v)
local ob = outbox(KEYS[1], KEYS[5], st.out)
outbox_ready(ob)
local back = reclaim(st, gen, KEYS[2], ob)
local until_ms = int(clock(st) + lease)
local reply
local x = redis.call('HGET', KEYS[3], id)
if x then
  local d, u, l = string.match(x, '^(%d+):(%d+):(%d+)$')
  flush(st)
  if l ~= '0' then
    redis.call('HSET', KEYS[3], id, d .. ':' .. u .. ':' .. until_ms)
    redis.call('ZADD', KEYS[4], until_ms, txmember(id))
  end
  reply = { 'debited', tonumber(u), st.stock }
else
  local give = st.stock - floor
  if give > want then give = want end
  if give <= 0 then
    flush(st)
    reply = { 'short', st.stock }
  else
    st.stock = st.stock - give
    st.tout = st.tout + give
    flush(st)
    redis.call('HSET', KEYS[3], id, ARGV[4] .. ':' .. int(give) .. ':' .. until_ms)
    redis.call('ZADD', KEYS[4], until_ms, txmember(id))
    reply = { 'debited', give, st.stock }
  end
end
if back > 0 then stock_event('R', gen, KEYS[1]) end
return reply
