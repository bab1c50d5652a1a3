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

-- Server time in ms, read at most once per call, and only when needed.
local function clock(st)
  if not st.now then st.now = now_ms() end
  return st.now
end

-- `<prefix>:{<tag>}:g<gen>`, the base of segment `seg`'s record keys in generation `gen`.
local function records_base(seg, gen)
  return string.sub(seg, 1, -5) .. ':g' .. gen
end

-- The segment state a call starts from, or nil and the reason (other generation / missing).
-- `gen` is the canonical generation string; `okey` the segment's outbox stream.
local function open_segment(seg, zkey, gen, okey, call)
  local v = redis.call('HMGET', seg, 'gen', 'stock', 'reserved', 'out', 'rw')
  if not v[1] then return nil, 'missing' end
  if v[1] ~= gen then return nil, v[1] end
  -- rw = 1: compact entries were written for this generation (set by the first one; a reload
  -- of another generation drops it with the hash, load_segment keeps it for the same one).
  -- Without it, a call reads no window. A compact call (deduct_batch) reads the clock at once.
  local st = { stock = tonumber(v[2]), fresh = {}, pre = {}, full = {}, taken = 0, sold = 0,
    napplied = 0, acts = {}, index = call.index, ttl_s = call.ttl_s, lease = call.lease,
    mode = call.mode, fence_token = call.fence_token, compact = call.compact, rw = v[5] == '1' }
  if st.compact then st.now = now_ms() end
  -- The record keys of this segment and generation: <base>:rq:<request id> (see the prelude).
  st.base = st.compact and records_base(seg, gen)
  st.seg, st.gen = seg, gen
  st.ob = outbox(seg, okey)
  st.ob.on = v[4] == '1'
  outbox_ready(st.ob)
  if v[3] and v[3] ~= '0' then
    -- Only a segment holding reservations can have expired ones to take back.
    st.stock = st.stock + reclaim(seg, zkey, clock(st), st.ob)
  end
  return st
end

-- The request id of record key `rk`, which must be a record key of this segment and generation
-- (a compact entry lives in the segment's windows, found by id).
-- `pre` is `<base>:rq:` (records_base .. ':rq:').
local function record_id(pre, rk)
  if string.find(rk, pre, 1, true) ~= 1 or #rk == #pre then bad('record key') end
  return string.sub(rk, #pre + 1)
end

-- Reads the stored records of requests `rs` (each with rk and rid) in a few calls whatever
-- their count: one EXISTS over every record key (HGETALL of each only when some exist), and
-- the compact entries of all of them (two HMGETs, only when a window width is set).
-- st.pre[rk] = the record (table) or nil; st.full[rk] = true when a full record key exists.
local function prefetch(st, rs)
  if #rs == 0 then return end
  local keys = { rs[1].rk }
  if #rs > 1 then
    for i, r in ipairs(rs) do keys[i] = r.rk end
  end
  if #keys == 1 or redis.call('EXISTS', unpack(keys)) > 0 then
    for _, rk in ipairs(keys) do
      local flat = redis.call('HGETALL', rk)
      if #flat > 0 then
        local rec = {}
        for i = 1, #flat, 2 do rec[flat[i]] = flat[i + 1] end
        st.pre[rk], st.full[rk] = rec, true
      end
    end
  end
  if not st.rw then return end
  -- Compact entries exist for this generation: look the ids up (deduct.lua's request names
  -- its id here, from its record key, checked against this segment's; nothing of the request
  -- is written before).
  if not st.base then st.base = records_base(st.seg, st.gen) end
  local rids = {}
  for i, r in ipairs(rs) do
    if not r.rid then r.rid = record_id(st.base .. ':rq:', r.rk) end
    rids[i] = r.rid
  end
  st.width, st.wlast = compact_width(st.base)
  if st.width then
    local found = compact_find(st.base, st.width, st.wlast, rids, clock(st))
    for _, r in ipairs(rs) do
      local e = found[r.rid]
      if e and not st.full[r.rk] then st.pre[r.rk] = compact_record(e, st.index) end
    end
  end
end


-- Phase 1 for one request. Returns its reply — for a request applied, only the stock after it
-- (a number; deduct.lua answers {"applied", stock}, deduct_batch.lua the bare integer) —
-- and queues its write in st.acts.
-- `r` = { rk, rid (request id), u (user), qty (number), q (canonical qty string), claim
-- ("0"|"1"), resv_ttl, k (kind: 'r' when resv_ttl > 0; nil or 's' for a sale) }; the call's
-- index, ttl_s, lease, mode ("lua"|"claim"|"fenced") and fence_token are in `st`.
-- Once decided, `r` itself becomes the fresh record (fields s, u, q, parts / e, l as in a
-- stored record) and the queued write: no further tables per request. Writing over a
-- released claim ('F', which holds only s, u, q, e, k) needs no DEL: every write sets them all.
local function decide(st, seg, r)
  local rec = st.fresh[r.rk] or st.pre[r.rk]
  -- 'F': a released claim (settle.lua). The id is free, as if absent; a new claim continues
  -- above its epoch, which the released claim's shut-out markers may still carry elsewhere.
  local past = 0
  if rec and rec.s == 'F' then past, rec = tonumber(rec.e), nil end
  if rec then
    local f = conflict(rec, r.u, r.qty, r.k or 's')
    if f then return { 'mismatch', f } end
    if rec.s == 'A' then return { 'replay', rec.parts or st.index .. ':' .. rec.q } end
    if rec.s == 'X' then return { 'sealed' } end
    -- 'P': somebody (maybe a crashed process) holds the fallback claim.
    local left = tonumber(rec.l) - clock(st)
    if left < 0 then left = 0 end
    return { 'pending', tonumber(rec.e), left }
  end

  if st.mode == 'fenced' then
    if tonumber(redis.call('HGET', seg, 'fence') or '0') ~= st.fence_token then return { 'lock_lost' } end
    if st.stock < r.qty then return { 'invariant', st.stock } end
  end

  if st.mode ~= 'claim' and st.stock >= r.qty then
    st.stock = st.stock - r.qty
    st.taken = st.taken + r.qty
    st.napplied = st.napplied + 1
    st.last_qty_s = r.q
    if r.resv_ttl == 0 then st.sold = st.sold + r.qty end
    r.s = 'A'
    st.fresh[r.rk] = r
    st.acts[#st.acts + 1] = r
    return st.stock -- {'applied', st.stock}: the callers wrap it (see applied())
  end

  if r.claim == '1' then
    r.s, r.e, r.l = 'P', int(past + 1), clock(st) + st.lease
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
  -- A sale applied here over no full record, with a TTL the windows cover: a compact entry.
  local ttl = st.compact and tonumber(st.ttl_s)
  local width = st.width or ttl
  local compact, exp = st.compact and {}, nil
  for _, r in ipairs(st.acts) do
    if compact and r.s == 'A' and r.resv_ttl == 0 and not st.full[r.rk] and ttl <= width then
      exp = exp or int(st.now + ttl)
      compact[#compact + 1] = r.rid
      compact[#compact + 1] = r.q .. ':' .. exp .. ':' .. r.u
      if st.ob.on then emit(st.ob, 'sold', r.rk, r.u, r.q, st.index .. ':' .. r.q) end
    elseif r.s == 'A' then
      r.parts = st.index .. ':' .. r.q
      redis.call('HSET', r.rk, 's', 'A', 'u', r.u, 'q', r.q, 'e', '0', 'parts', r.parts, 'k', r.k or 's')
      redis.call('PEXPIRE', r.rk, st.ttl_s)
      if r.resv_ttl > 0 then
        hold(seg, zkey, r.rk, r.qty, clock(st), r.resv_ttl, tonumber(st.ttl_s))
      end
      if st.ob.on then emit(st.ob, r.resv_ttl > 0 and 'reserved' or 'sold', r.rk, r.u, r.q, r.parts) end
    else
      redis.call('HSET', r.rk, 's', 'P', 'u', r.u, 'q', r.q, 'e', r.e, 'l', int(r.l), 'hp', '0',
        'k', r.k or 's', 'o', st.ob.on and '1' or '0')
      redis.call('PEXPIRE', r.rk, st.ttl_s)
      redis.call('ZADD', ckey, int(r.l), r.rk)
      stock_event('C', string.match(r.rk, '}:g(%d+):rq:'), r.rk) -- sold-out flags: a record
    end
  end
  if compact and #compact > 0 then
    -- Never below the newest window written: readers look there first (compact_find), even
    -- when the server clock stepped back.
    local w = math.floor(st.now / width)
    if st.wlast and st.wlast > w then w = st.wlast end
    local wkey = st.base .. ':rw:' .. int(width) .. ':' .. int(w)
    redis.call('HSET', wkey, unpack(compact))
    if not st.rw then redis.call('HSET', seg, 'rw', '1') end
    if st.wlast ~= w then
      -- The window's first write: it expires at (w + 2) * W, after every entry in it (ttl <= W),
      -- and the width key with it (later writes of this window need neither call).
      local left = int((w + 2) * width - st.now)
      redis.call('PEXPIRE', wkey, left)
      redis.call('SET', st.base .. ':rw', int(width) .. ':' .. int(w), 'PX', left)
    end
  end
end
