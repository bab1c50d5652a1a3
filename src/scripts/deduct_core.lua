-- deduct_core.lua — deductions at their home segment, in three phases. Shared, word for word,
-- by deduct.lua (one request per call) and deduct_batch.lua (many requests per call, coalesced
-- by the client), so a coalesced request gets exactly the semantics of a lone one.
--
--   1. decide  (reads only) each request in order against the running stock `st.stock`;
--   2. counters: the segment's stock and sold move once for everything decided;
--   3. act: each request's record is written (applied or claimed), with its TTL.
--
-- Counters before records: should a write fail half-way (it cannot in practice — arguments are
-- validated first, and Redis 7 refuses OOM only before a script's first write), units are
-- counted as taken without a record (lost stock the audit shows), never handed out twice.
--
-- `st` is the segment as this call sees it: st.stock (including lazy reclaim), st.fresh
-- (records decided earlier in this call, by key: a request id repeated within one batch sees
-- its twin exactly as if the twin had been written), and the server clock, read at most once
-- per call and only when needed (clock(st)). Record letters and fields: the tables in
-- src/store/redis/lua.rs.
--
-- Cost notes (scripts/profile.sh measures them): Redis formats every Lua number handed to
-- redis.call with printf, so the hot path passes the canonical ARGV strings instead; TIME and
-- the reclaim range query run only when the segment holds reservations.

-- The segment state a call starts from, or nil and the reason (other generation / missing).
-- `gen` is the canonical generation string; `okey` the segment's outbox stream.
local function open_segment(seg, zkey, gen, okey)
  local v = redis.call('HMGET', seg, 'gen', 'stock', 'reserved', 'out')
  if not v[1] then return nil, 'missing' end
  if v[1] ~= gen then return nil, v[1] end
  local st = { stock = tonumber(v[2]), fresh = {}, taken = 0, sold = 0, napplied = 0, acts = {} }
  st.ob = outbox(seg, okey)
  st.ob.on = v[4] == '1'
  outbox_ready(st.ob)
  if v[3] and v[3] ~= '0' then
    -- Only a segment holding reservations can have expired ones to take back.
    st.now = now_ms()
    st.stock = st.stock + reclaim(seg, zkey, st.now, st.ob)
  end
  return st
end

-- Server time in ms, read once per call.
local function clock(st)
  if not st.now then st.now = now_ms() end
  return st.now
end

-- Phase 1 for one request. Returns its reply; queues its write in st.acts.
-- `r` = { rk, u (user), qty (number), q (canonical qty string), index (string), ttl_s
-- (canonical string), lease, claim ("0"|"1"), mode ("lua"|"claim"|"fenced"), fence_token, resv_ttl,
-- k (kind: 'r' when resv_ttl > 0, else 's') }.
-- Once decided, `r` itself becomes the fresh record (fields s, u, q, parts / e, l as in a
-- stored record) and the queued write: no further tables per request. Writing over a
-- released claim ('F', which holds only s, u, q, e, k) needs no DEL: every write sets them all.
local function decide(st, seg, r)
  local rec = st.fresh[r.rk] or record(r.rk)
  -- 'F': a released claim (settle.lua). The id is free, as if absent; a new claim continues
  -- above its epoch, which the released claim's shut-out markers may still carry elsewhere.
  local past = 0
  if rec and rec.s == 'F' then past, rec = tonumber(rec.e), nil end
  if rec then
    local f = conflict(rec, r.u, r.qty, r.k)
    if f then return { 'mismatch', f } end
    if rec.s == 'A' then return { 'replay', rec.parts } end
    if rec.s == 'X' then return { 'sealed' } end
    -- 'P': somebody (maybe a crashed process) holds the fallback claim.
    local left = tonumber(rec.l) - clock(st)
    if left < 0 then left = 0 end
    return { 'pending', tonumber(rec.e), left }
  end

  if r.mode == 'fenced' then
    if tonumber(redis.call('HGET', seg, 'fence') or '0') ~= r.fence_token then return { 'lock_lost' } end
    if st.stock < r.qty then return { 'invariant', st.stock } end
  end

  if r.mode ~= 'claim' and st.stock >= r.qty then
    st.stock = st.stock - r.qty
    st.taken = st.taken + r.qty
    st.napplied = st.napplied + 1
    st.last_qty_s = r.q
    if r.resv_ttl == 0 then st.sold = st.sold + r.qty end
    r.s = 'A'
    r.parts = r.index .. ':' .. r.q
    st.fresh[r.rk] = r
    st.acts[#st.acts + 1] = r
    return { 'applied', st.stock }
  end

  if r.claim == '1' then
    r.s, r.e, r.l = 'P', int(past + 1), clock(st) + r.lease
    st.fresh[r.rk] = r
    st.acts[#st.acts + 1] = r
    return { 'short', st.stock, past + 1 }
  end
  return { 'short', st.stock, 0 }
end

-- Phases 2 and 3: move the counters once, then write every decided record. `ckey` is the
-- segment's claim index (ZSET of pending claim records by lease end): the sweeper finds claims
-- whose holder vanished there (see claims_due.lua).
local function commit(st, seg, zkey, ckey)
  if st.taken > 0 then
    -- One applied request: its canonical qty string (no number formatting).
    local one = st.napplied == 1 and st.last_qty_s
    redis.call('HINCRBY', seg, 'stock', '-' .. (one or int(st.taken)))
    if st.sold > 0 then redis.call('HINCRBY', seg, 'sold', st.sold == st.taken and one or int(st.sold)) end
  end
  for _, r in ipairs(st.acts) do
    if r.s == 'A' then
      redis.call('HSET', r.rk, 's', 'A', 'u', r.u, 'q', r.q, 'e', '0', 'parts', r.parts, 'k', r.k)
      redis.call('PEXPIRE', r.rk, r.ttl_s)
      if r.resv_ttl > 0 then
        hold(seg, zkey, r.rk, r.qty, clock(st), r.resv_ttl, tonumber(r.ttl_s))
      end
      if st.ob.on then emit(st.ob, r.resv_ttl > 0 and 'reserved' or 'sold', r.rk, r.u, r.q, r.parts) end
    else
      redis.call('HSET', r.rk, 's', 'P', 'u', r.u, 'q', r.q, 'e', r.e, 'l', int(r.l), 'hp', '0',
        'k', r.k, 'o', st.ob.on and '1' or '0')
      redis.call('PEXPIRE', r.rk, r.ttl_s)
      redis.call('ZADD', ckey, int(r.l), r.rk)
      stock_event('C', string.match(r.rk, '}:g(%d+):rq:'), r.rk) -- sold-out flags: a record
    end
  end
end
