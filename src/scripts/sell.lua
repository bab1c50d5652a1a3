-- sell.lua — requests decided at their home segment, in one atomic step (the hot path).
-- (prelude.lua is prepended.)
--
-- One call decides n >= 1 requests bound for the same segment and generation: the client
-- coalesces concurrent requests into one call, and a lone request is a batch of one. In order:
--   1. the call's own arguments (generation, index, fence, credits, keys, the runs) are
--      validated before the first write; a bad request of a batch (an id, its run's spec) gets
--      its own `b<name>` reply and nothing is written for it; the others still run;
--   2. the segment: missing, of another generation or loaded with another home function
--      -> every request "stale"; a fence token given that is not the segment's -> every
--      request "lock_lost"; nothing written in either case;
--   3. the credits: each transfer id is credited once per generation (HSETNX on the credits
--      hash): stock += units, tin += units — whatever the requests' answers;
--   4. every expired reservation goes back to stock (the prelude's reclaim, no cap);
--   5. each request, in the order given, exactly as Segment::sell (src/store/memory/segment.rs)
--      decides it: a live record of its request id -> replay or mismatch (qty, then kind);
--      with a per-user limit, the user's held units + qty over the limit -> limit; stock below
--      qty -> short; otherwise applied: the units sold (or held as a reservation), the record
--      written into the user's ledger, the outbox event appended.
-- A request id repeated within one call sees its twin exactly as if the twin had been written
-- before (replay, or mismatch).
--
-- Writes: counters before records (the segment's stock, sold, reserved, tin move once, after
-- every decision), then the ledgers, reservation index entries and events. Should a write fail
-- half-way (it cannot in practice: arguments are checked first, and Redis refuses OOM only
-- before a script's first write), units are counted as taken without a record — lost stock the
-- audit shows — never handed out twice.
--
-- Cost. What a call pays for here is Lua's allocations and redis.call itself (this Redis,
-- counted by callgrind: a table ~600 instructions, a closure more with every upvalue it
-- captures, a redis.call ~4,000 plus ~2,500 per field a hash read returns, a pattern match with
-- captures ~1 µs), so nothing is made per request that a flat per-call table, a table sized
-- once or an argument as sent can replace. Under a per-user limit a call makes four
-- redis.calls whatever its size: one HMGET of the segment, one HMGET of each run's ledgers
-- (its users, as sent), one HSET of the counters and one HSET of every ledger written (+ ZADD
-- per reservation, + XADD per request with the outbox). A new buyer's one-unit sale (the hot
-- path) makes no string: its ledger text is its request id as sent (the short form). Without
-- a limit a call also makes a fixed number of redis.calls: one HMGET of the record hash and of
-- each sales window that may hold a live record (two per window in use), one HSET per hash
-- written and one PEXPIREAT of the sales window. TIME only when needed:
-- reservations to reclaim, a record with a lifetime to check or write (every call without a
-- limit, every reservation). A sale under a per-user limit reads no clock at all. Where a
-- call's instructions go, step by step: `CALLGRIND=1 LADDER=1 scripts/bench.sh fcall-cost`.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]     segment hash        <prefix>:{<tag>}:seg   (fields gen, stock, sold, reserved,
--                                  tin, lim, hf, out, fence; without a limit rw, rr, rx (where
--                                  records are, see the end); loaded, restocked, tout untouched)
-- KEYS[2]     reservation index   <prefix>:{<tag>}:g<gen>:resv
-- KEYS[3]     credits             <prefix>:{<tag>}:g<gen>:in
-- KEYS[4]     outbox stream       <prefix>:{<tag>}:out (appended to when the segment's `out` is
--                                  1: one `sold` / `reserved` event per request applied,
--                                  `expired` per reservation reclaimed)
-- KEYS[5]     limited ledgers     <prefix>:{<tag>}:g<gen>:led (one field per user; declared so
--                                  that Redis refuses a call it may not run — ACL key rights,
--                                  a slot being migrated — before it writes anything)
-- KEYS[6]     hold index          <prefix>:{<tag>}:g<gen>:hold (order items held: declared, so
--                                  that a call Redis may not run fails before its first write)
-- Without a limit, the record hash `…:g<gen>:rec` and the sales windows `…:g<gen>:w<w>:<b>`
-- are named here from KEYS[1] (same hash tag; the prelude's ledger and sale_windows); every
-- request's record is read before the first write, so a key Redis refuses fails the call
-- before it wrote anything.
-- ARGV[1]     gen        the generation the caller believes in
-- ARGV[2]     hf         the caller's home function version (segments.rs HOME_FN)
-- ARGV[3]     index      this segment's index (the events' parts "<index>:<qty>")
-- ARGV[4]     fence      0: none; else the lock strategies' fence token, which must still be the
--                        segment's `fence`
-- ARGV[5]     c          credits (0..64)
-- ARGV[5+3(i-1)+1..3]    credit i: transfer id (decimal u64, kept as text), donor index, units (> 0)
-- ARGV[6+3c]  n          requests (1..1000)
-- ARGV[7+3c..] the requests in order, as runs of one spec: each run is its spec
--                        `<qty>:<resv_ttl_ms>:<ttl_ms>`, its length m (>= 1), its m users, then
--                        their m request ids (2 + 2m arguments; the runs' lengths add up to n):
--                        qty 0 is no request (the call only credits and reclaims); resv_ttl_ms
--                        0 a sale, > 0 a reservation held this long (or, with `:o` after the
--                        spec, an order's item: record O, no end of its own, indexed in
--                        `…:g<gen>:hold` by this hint; see settle.lua); ttl_ms the record's
--                        lifetime without a per-user limit (a sale's sales window is the
--                        smallest in use at least this long, see below), and how long an ended
--                        reservation's record outlives its expiry. A coalesced batch of sales is one run, and
--                        its users are the fields of the run's one HMGET of ledgers as sent.
--
-- Publishes: `R <gen> <segment key>` on <prefix>:stock when expired reservations came back,
-- `M …` when credits added units (stock_event).
--
-- Reply: one string: the stock once credited and reclaimed (before the first request; 0 when
-- every request is refused), then the n requests' answers in order, each after one space:
--   a                      applied (sold, held as a reservation, or qty 0): the stock after it
--                          is the first figure less the qty of every `a` up to this one
--   p                      replay: this (user, request id) applied before; nothing changed
--   s                      short: not enough stock here (the stock is the figure above)
--   l<limit>/<held>/<sold> limit: the user's units here would pass the segment's limit
--   mq | mk                mismatch: same (user, request id), other qty | kind (sale, reservation,
--                          order item)
--   t                      stale: segment missing, of another generation or home function
--   o                      lock lost: the fence token is no longer the caller's
--   b<name>                request refused: argument <name> is bad; nothing written for it
-- Errors (whole call, before any write): a bad gen, hf, index, fence, credit or n, or KEYS or
-- an ARGV count that do not match.
local ARGV = ARGV
local gen, hf, index, fence = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
uint('index', index)
local c, credits = 0, nil
if ARGV[5] ~= '0' then
  c = uint('credits', ARGV[5])
  if c > 64 then bad('credits') end
  credits = {}
  for i = 1, c do
    local b = 5 + 3 * (i - 1)
    uint('donor', ARGV[b + 2])
    credits[i] = { id = txid('transfer_id', ARGV[b + 1]), units = posint('units', ARGV[b + 3]), us = ARGV[b + 3] }
  end
end
local nb = 6 + 3 * c
local n = posint('n', ARGV[nb])
if n > 1000 or #KEYS ~= 6 then bad('n') end
local base = seg_base(KEYS[1])
local gbase = base .. 'g' .. gen
if string.sub(KEYS[1], -4) ~= ':seg' or KEYS[2] ~= gbase .. ':resv' or KEYS[3] ~= gbase .. ':in'
    or KEYS[4] ~= base .. 'out' or KEYS[5] ~= gbase .. ':led' or KEYS[6] ~= gbase .. ':hold' then
  bad('keys')
end
-- The runs, flat (no table per run or request: allocations are most of what Lua costs here):
-- run r is RUN[o + 1 .. o + 10], o = 10(r - 1): the place of its spec in ARGV, its first and
-- last request, then the spec parsed: qty, qty as text, resv_ttl_ms, ttl_ms, a new buyer's sale
-- ledger text before and after the request id (nil for one unit: the id alone is the text),
-- and `b<name>` when the spec is bad (every request of the run is refused with it). Request j of run r: user ARGV[p + 2 + j - j0],
-- request id m places after it (p the spec's place, j0 the run's first request). The runs
-- must add up to n, and to the arguments sent.
local RUN, nr = {}, 0
do
  local p, j = nb + 1, 0
  while j < n do
    local m = posint('n', ARGV[p + 1] or '')
    if j + m > n then bad('n') end
    local o = 10 * nr
    nr = nr + 1
    RUN[o + 1], RUN[o + 2], RUN[o + 3] = p, j + 1, j + m
    j = j + m
    p = p + 2 + 2 * m
  end
  if p ~= #ARGV + 1 then bad('n') end
end
-- The generation, the home function and the fence are compared with the segment's own (below)
-- and checked as numbers only when they differ (a value equal to the segment's is canonical):
-- a malformed one is still an error before any write.

local v = redis.call('HMGET', KEYS[1], 'gen', 'stock', 'sold', 'reserved', 'tin', 'lim', 'hf', 'out', 'fence', 'rw', 'rr', 'rx')
local lim = tonumber(v[6] or '0')
local lkey = KEYS[5]
local refuse
if not v[1] or v[1] ~= gen or v[7] ~= hf then
  uint('gen', gen)
  uint('hf', hf)
  if fence ~= '0' then uint('fence', fence) end
  refuse = 't'
elseif fence ~= '0' and (v[9] or '0') ~= fence then
  uint('fence', fence)
  refuse = 'o'
end

-- Each run's spec: the common canonical form in one match, else part by part (naming the bad
-- part).
local ITEM
for r = 1, nr do
  local o = 10 * (r - 1)
  local sv = ARGV[RUN[o + 1]]
  if string.byte(sv, -1) == 111 and string.sub(sv, -2) == ':o' then
    -- An order item's run (`<qty>:<hint_ms>:<ttl_ms>:o`): ITEM[r], made only when one comes.
    ITEM = ITEM or {}
    ITEM[r] = true
    sv = string.sub(sv, 1, -3)
  end
  local q, rv, tt = string.match(sv, '^(%d+):(%d+):(%d+)$')
  if not q or #q > 15 or #rv > 15 or #tt > 15 or (#q > 1 and string.byte(q) == 48)
      or (#rv > 1 and string.byte(rv) == 48) or (#tt > 1 and string.byte(tt) == 48) then
    local ok, e = pcall(function()
      q, rv, tt = string.match(sv, '^([^:]*):([^:]*):([^:]*)$')
      if not q then bad('qty') end
      uint('qty', q)
      uint('resv_ttl_ms', rv)
      uint('ttl_ms', tt)
    end)
    if not ok then
      local msg = type(e) == 'table' and e.err or tostring(e)
      RUN[o + 10] = 'b' .. (string.match(msg, 'bad argument: (%S+)') or 'qty')
    end
  end
  if not RUN[o + 10] and ITEM and ITEM[r] and rv == '0' then RUN[o + 10] = 'bresv_ttl_ms' end
  if not RUN[o + 10] then
    RUN[o + 4], RUN[o + 5], RUN[o + 6], RUN[o + 7] = tonumber(q), q, tonumber(rv), tonumber(tt)
    -- A one-unit sale's ledger is its request id alone (the short form, see led_parse).
    if q ~= '1' then RUN[o + 8], RUN[o + 9] = q .. ' ' .. q .. ' ', ' A:' .. q .. ':0:0' end
  end
end

-- Without a limit, each sale run's window (the prelude's sale_windows): the smallest in use
-- (the segment's `rw`) at least its ttl_ms, else a new one of its ttl_ms or twice the widest
-- in use, whichever is more — so widths at least double and a generation never has more than
-- ~50 (ttl_ms < 10^15), one or two when every instance has one request_ttl. RW[r]: run r's
-- window (text); rwnew: `rw` to write.
local RW, rwnew
if lim == 0 and not refuse then
  RW = {}
  local wins, widest = {}, 0
  for w in string.gmatch(v[10] or '', '%d+') do
    wins[#wins + 1] = tonumber(w)
    widest = math.max(widest, tonumber(w))
  end
  for r = 1, nr do
    local o = 10 * (r - 1)
    if not RUN[o + 10] and RUN[o + 4] > 0 and RUN[o + 6] == 0 then
      local t, best = math.max(RUN[o + 7], 1), nil
      for _, w in ipairs(wins) do
        if w >= t and (not best or w < best) then best = w end
      end
      if not best then
        best = math.max(t, 2 * widest)
        wins[#wins + 1], widest = best, best
        rwnew = (rwnew or v[10] or '') .. ((rwnew or v[10] or '') == '' and '' or ',') .. int(best)
      end
      RW[r] = int(best)
    end
  end
end

-- Every id's characters at once: the requests' arguments joined by ':' and searched for each
-- byte an id may not hold (whitespace, braces) with plain finds — a pattern with a character
-- class costs ~20 ns per byte here, a plain find far less. Only when one is found is each id
-- searched on its own; else each id's length alone is checked.
local strict
do
  local all, find = table.concat(ARGV, ':', nb + 1), string.find
  strict = find(all, ' ', 1, true) or find(all, '{', 1, true) or find(all, '}', 1, true)
    or find(all, '\n', 1, true) or find(all, '\r', 1, true) or find(all, '\t', 1, true)
    or find(all, '\v', 1, true) or find(all, '\f', 1, true)
end
-- The refusal a request's own arguments earn (`b<name>`), or nil.
local function refused(u, rid, e)
  local lu, lr = #u, #rid
  if lu == 0 or lu > 128 or strict and string.find(u, '[%s{}]') then return 'buser' end
  if lr == 0 or lr > 128 or strict and string.find(rid, '[%s{}]') then return 'brequest_id' end
  return e
end

-- out[j]: request j's answer (see the header).
local out = {}
if refuse then
  for r = 1, nr do
    local o = 10 * (r - 1)
    local p, j0, j1 = RUN[o + 1], RUN[o + 2], RUN[o + 3]
    for j = j0, j1 do
      local k = p + 2 + j - j0
      out[j] = refused(ARGV[k], ARGV[k + j1 - j0 + 1], RUN[o + 10]) or refuse
    end
  end
  return '0 ' .. table.concat(out, ' ')
end

-- ledgers[user]: with a limit, the user's ledger as this call changed it: the place in W
-- (below) of the text written for a new buyer's sale, or a parsed ledger (absent: as the run's
-- HMGET read it).
local ledgers = {}

-- Without a limit (the prelude's ledger and sale_windows): request j's record is field F[J[j]]
-- (`<user> <request id>`) of the record hash or of a sales window. NREC[field]: its live record
-- as this call changed it, in full (nil: none), NAT[field]: the key it is in, NRAW[field]: the
-- text kept there (a replay rewrites it as it is). Every request is checked
-- and every record read (one HMGET per hash, whatever the batch) before the first write, so a
-- key Redis refuses fails the call before it wrote anything. rej[j]: the refusal of request j
-- (its own arguments).
local F, J, nf, NREC, NAT, NRAW, rej, look
local gbase_rec = gbase .. ':rec'
if lim == 0 then
  F, J, nf = {}, {}, 0
  for r = 1, nr do
    local o = 10 * (r - 1)
    local p, j0, j1, e = RUN[o + 1], RUN[o + 2], RUN[o + 3], RUN[o + 10]
    for j = j0, j1 do
      local k = p + 2 + j - j0
      local u, rid = ARGV[k], ARGV[k + j1 - j0 + 1]
      local x = refused(u, rid, e)
      if x then
        rej = rej or {}
        rej[j] = x
      elseif RUN[o + 4] > 0 then
        nf = nf + 1
        F[nf], J[j] = u .. ' ' .. rid, nf
      end
    end
  end
  -- Reads every request's record at `now` (again after the reclaim rewrote some).
  look = function(now)
    NREC, NAT, NRAW = {}, {}, {}
    if nf == 0 then return end
    local keys, starts = sale_windows(gbase, v[10], now)
    -- The record hash only once something was written there (the segment's `rr`).
    if v[11] then
      table.insert(keys, 1, gbase_rec)
      table.insert(starts, 1, false)
    end
    for k, key in ipairs(keys) do
      local x = redis.call('HMGET', key, unpack(F, 1, nf))
      for i = 1, nf do
        local rec = x[i]
        if rec and not NREC[F[i]] then
          local full = starts[k] and win_rec(rec, starts[k]) or rec
          local sx, _, un = rec_parse(full)
          if sx and live(un, now) then NREC[F[i]], NAT[F[i]], NRAW[F[i]] = full, key, rec end
        end
      end
    end
  end
end

-- The segment as the prelude's open() would make it (the fields reclaim, clock and flush
-- use), built in one constructor: open()'s name list and a table grown field by field cost
-- ~18,000 instructions a call here (callgrind), 4 % of a call of 21.
local st = {
  seg = KEYS[1], lim = lim, hfv = tonumber(v[7] or '0'),
  stock = tonumber(v[2] or '0'), sold = tonumber(v[3] or '0'), reserved = tonumber(v[4] or '0'),
  tin = tonumber(v[5] or '0'),
}
st.was = { stock = st.stock, sold = st.sold, reserved = st.reserved, tin = st.tin }
local ob = outbox(KEYS[1], KEYS[4], v[8])
outbox_ready(ob)
if look then look(clock(st)) end

-- Credits, once per transfer id and generation.
local credited = 0
for i = 1, c do
  local cr = credits[i]
  if redis.call('HSETNX', KEYS[3], cr.id, cr.us) == 1 then
    st.stock = st.stock + cr.units
    st.tin = st.tin + cr.units
    credited = credited + cr.units
  end
end

-- Expired reservations (only a segment holding some can have any).
local back = 0
if st.reserved > 0 then back = reclaim(st, gen, KEYS[2], ob) end
-- The reclaim rewrote records (R to X): read them again.
if back > 0 and look then look(st.now) end
local stock0 = st.stock

-- Decide each request (reads only; the ledgers as this call changes them). With a limit, each
-- run's ledgers are read first, in one HMGET of its users as sent. A new buyer's sale under a
-- limit (the hot path) is decided inline; any other request by `decide`, made on first use.
-- W: the one HSET of every limited ledger written (user, text). A: the applied requests that
-- need writes beyond their ledger (reservations, sales without a limit, every one with the
-- outbox), flat: A[o + 1 .. o + 8] = user, request id, qty text, resv_ttl_ms, the key its
-- record goes into (without a limit), record, until, expiry. WE[key]: a sales window's expiry.
-- (out and W are made at their full size at once, filled with arguments that each request
-- then overwrites: a table grown one slot at a time is rebuilt at every power of two.)
out = { unpack(ARGV, nb + 1, nb + n) }
local W, nw = { 'HSET', lkey, unpack(ARGV, nb + 1, nb + 2 * n) }, 2
local A, na = nil, 0
local AI -- AI[i]: applied request i is an order item (made only when one is)
local replays
local stock, sold, reserved = st.stock, st.sold, st.reserved
local decide
local track = ob.on or lim == 0
local WE
for r = 1, nr do
  local o = 10 * (r - 1)
  local p, j0, j1, e = RUN[o + 1], RUN[o + 2], RUN[o + 3], RUN[o + 10]
  local qty, q, resv, ttl = RUN[o + 4], RUN[o + 5], RUN[o + 6], RUN[o + 7]
  local hot, pre, suf = lim > 0 and resv == 0, RUN[o + 8], RUN[o + 9]
  local item = ITEM and ITEM[r] or false
  local m = j1 - j0 + 1
  local texts
  if lim > 0 and not e and qty > 0 then
    texts = redis.call('HMGET', lkey, unpack(ARGV, p + 2, p + 1 + m))
  end
  -- Without a limit, a sale run's record (`A:<qty>:<until>:0`, one clock for the call), as
  -- kept (stext: a one-unit sale's short form, the prelude's sale_windows) and its sales window
  -- now (wk).
  local wk, atext, stext, untl
  if RW and RW[r] then
    local w = tonumber(RW[r])
    local b = math.floor(st.now / w)
    wk = gbase .. ':w' .. RW[r] .. ':' .. int(b)
    WE = WE or {}
    WE[wk] = (b + 2) * w
    untl = st.now + ttl
    atext = 'A:' .. q .. ':' .. int(untl) .. ':0'
    stext = qty == 1 and int(untl - b * w) or atext
  end
  for j = j0, j1 do
    local k = p + 2 + j - j0
    local u, rid = ARGV[k], ARGV[k + m]
    local x
    if lim > 0 then
      local lu, lr = #u, #rid
      if lu == 0 or lu > 128 or lr == 0 or lr > 128 or e or strict then x = refused(u, rid, e) end
    elseif rej then
      x = rej[j]
    end
    if x then
      out[j] = x
    elseif qty == 0 then
      -- No request: the call only credits (and reclaims); the stock after.
      out[j] = 'a'
    else
      local l = ledgers[u]
      if l == nil and texts then l = texts[j - j0 + 1] end
      if lim == 0 then l = J[j] end
      if wk and not NREC[F[l]] then
        -- The hot path without a limit: a sale of a request with no live record.
        if stock < qty then
          out[j] = 's'
        else
          stock, sold = stock - qty, sold + qty
          local f = F[l]
          NREC[f], NAT[f], NRAW[f] = atext, wk, stext
          A = A or {}
          local a = 8 * na
          na = na + 1
          A[a + 1], A[a + 2], A[a + 3], A[a + 4] = u, rid, q, 0
          A[a + 5], A[a + 6], A[a + 7], A[a + 8] = wk, stext, untl, 0
          out[j] = 'a'
        end
      elseif hot and l == false then
        -- The hot path: a new buyer's sale under a limit. No record, nothing held.
        if qty > lim then
          out[j] = 'l' .. int(lim) .. '/0/0'
        elseif stock < qty then
          out[j] = 's'
        else
          stock, sold = stock - qty, sold + qty
          nw = nw + 2
          W[nw - 1], W[nw] = u, pre and pre .. rid .. suf or rid
          ledgers[u] = nw
          if track then
            A = A or {}
            local a = 8 * na
            na = na + 1
            A[a + 1], A[a + 2], A[a + 3], A[a + 4] = u, rid, q, 0
          end
          out[j] = 'a'
        end
      else
        if not decide then
          -- at[u]: the place of u's text in W; pw: the places holding a parsed ledger, made
          -- text once, at the end.
          local at, pw, npw = {}, {}, 0
          -- The ledger of `u` (`l` as ledgers[] or the HMGET has it), parsed (lim > 0).
          local function parsed(u, l)
            if type(l) ~= 'table' then
              local k
              if type(l) == 'number' then k, l = l, W[l] end
              l = led_parse(l or nil)
              l.key, l.user, l.lim = lkey, u, lim
              ledgers[u] = l
              if k then at[u] = k end
            end
            return l
          end
          -- Lists user `u`'s parsed ledger `l` among those the final HSET writes.
          local function touch(u, l)
            local k = at[u]
            if not k then
              nw = nw + 2
              W[nw - 1], k = u, nw
              at[u] = k
            end
            if W[k] ~= l then
              W[k] = l
              npw = npw + 1
              pw[npw] = k
            end
          end
          -- `l`: with a limit, the ledger as ledgers[] or the HMGET has it; without one, the
          -- place of the request's field in F. `wk`: a sale's window without a limit.
          decide = function(u, rid, l, qty, q, resv, ttl, item, wk)
            if not u then
              -- The end: every parsed ledger written as text.
              for k = 1, npw do
                local x = W[pw[k]]
                if type(x) == 'table' then W[pw[k]] = led_text(x) end
              end
              return
            end
            local rec, f
            if lim > 0 then
              l = parsed(u, l)
              rec = l.recs[rid]
            else
              f = F[l]
              rec = NREC[f]
            end
            if rec then
              local s, rq, un = rec_parse(rec)
              if s and live(un, un ~= 0 and clock(st) or 0) then
                if rq ~= qty then return 'mq' end
                -- Kinds: 0 sale (A), 2 order item (O, P, V), 1 reservation (the rest).
                local rk = s == 'A' and 0 or ((s == 'O' or s == 'P' or s == 'V') and 2 or 1)
                if rk ~= (resv == 0 and 0 or (item and 2 or 1)) then return 'mk' end
                -- A replay rewrites its record as it is: the call then has a write of its own,
                -- so the durability mode's WAIT after it covers the original write too
                -- (replication is in order), without relying on how a WAIT after a read-only
                -- call behaves.
                if lim > 0 then
                  touch(u, l)
                else
                  replays = replays or {}
                  replays[#replays + 1] = { NAT[f], f, NRAW[f] }
                end
                return 'p'
              end
            end
            if lim > 0 and l.h + qty > lim then
              return 'l' .. int(lim) .. '/' .. int(l.h) .. '/' .. int(l.f)
            end
            if stock < qty then return 's' end
            stock = stock - qty
            local val, untl, ex
            if resv == 0 then
              sold = sold + qty
              untl = lim > 0 and 0 or clock(st) + ttl
              val = 'A:' .. q .. ':' .. int(untl) .. ':0'
            elseif item then
              -- An order item: no end of its own (until 0); exp is the sweeper's hint.
              reserved = reserved + qty
              ex = clock(st) + resv
              untl = 0
              val = 'O:' .. q .. ':0:' .. int(ex)
            else
              reserved = reserved + qty
              ex = clock(st) + resv
              untl = ex + ttl
              val = 'R:' .. q .. ':' .. int(untl) .. ':' .. int(ex)
            end
            if lim > 0 then
              -- The ledger forgets its records past `until` first when it holds 32, 64, 128,
              -- … of them (prunes_at); a dead record of this very id is then replaced.
              if prunes_at(l.n) then
                local now = clock(st)
                for id, x in pairs(l.recs) do
                  local _, _, xu = rec_parse(x)
                  if not live(xu, now) then
                    l.recs[id] = nil
                    l.n = l.n - 1
                  end
                end
              end
              if l.recs[rid] == nil then l.n = l.n + 1 end
              l.h = l.h + qty
              if resv == 0 then l.f = l.f + qty end
              touch(u, l)
              l.recs[rid] = val
            else
              -- Without a limit: a sale into its window, the rest into the record hash.
              NREC[f], NAT[f], NRAW[f] = val, resv == 0 and wk or gbase_rec, val
            end
            if track or resv > 0 then
              A = A or {}
              local a = 8 * na
              na = na + 1
              A[a + 1], A[a + 2], A[a + 3], A[a + 4] = u, rid, q, resv
              A[a + 5], A[a + 6], A[a + 7], A[a + 8] = lim == 0 and NAT[f], val, untl, ex or 0
              if item then
                AI = AI or {}
                AI[na] = true
              end
            end
            return 'a'
          end
        end
        out[j] = decide(u, rid, l, qty, q, resv, ttl, item, wk)
      end
    end
  end
end
st.stock, st.sold, st.reserved = stock, sold, reserved
if decide then decide() end

-- Counters once, then the records.
flush(st)
-- Every ledger written (and every replayed one rewritten as it is) in one HSET.
if nw > 2 then redis.call(unpack(W, 1, nw)) end
-- The writes each applied request needs beyond its ledger: none for a sale under a limit
-- without the outbox (the hot path). Without a limit, one HSET per hash written (the call's
-- sales window, the record hash), and each sales window's expiry.
local G, GK -- G[key]: the HSET of the records going into key; GK: those keys in order
for i = 1, na do
  local a = 8 * (i - 1)
  local u, rid, q, resv = A[a + 1], A[a + 2], A[a + 3], A[a + 4]
  local key = A[a + 5]
  if key then
    G = G or {}
    local g = G[key]
    if not g then
      g = { 'HSET', key }
      G[key] = g
      GK = GK or {}
      GK[#GK + 1] = key
    end
    g[#g + 1] = u .. ' ' .. rid
    g[#g + 1] = A[a + 6]
  end
  if AI and AI[i] then
    -- An order item: in the hold index (same hash tag), never in the reservation index.
    redis.call('ZADD', KEYS[6], int(A[a + 8]), u .. ' ' .. rid)
  elseif resv > 0 then
    redis.call('ZADD', KEYS[2], int(A[a + 8]), u .. ' ' .. rid)
  end
  if ob.on then emit(ob, resv > 0 and 'reserved' or 'sold', gen, rid, u, q, index .. ':' .. q) end
end
if GK then
  -- The segment's fields that say where records are: `rw` the windows in use, `rr` 1 once the
  -- record hash holds one, `rx` the newest window given its expiry (a window's expiry is set by
  -- the first call writing into it).
  local sg = { 'HSET', KEYS[1] }
  if rwnew then
    sg[#sg + 1], sg[#sg + 2] = 'rw', rwnew
  end
  for _, key in ipairs(GK) do
    redis.call(unpack(G[key]))
    if key == gbase_rec then
      if not v[11] then sg[#sg + 1], sg[#sg + 2] = 'rr', '1' end
    elseif WE[key] and v[12] ~= key then
      -- A window hash goes once every record in it is forgotten (the prelude's sale_windows).
      redis.call('PEXPIREAT', key, int(WE[key]))
      sg[#sg + 1], sg[#sg + 2] = 'rx', key
    end
  end
  if #sg > 2 then redis.call(unpack(sg)) end
elseif rwnew then
  redis.call('HSET', KEYS[1], 'rw', rwnew)
end
-- Without a limit, replays rewrite their records last, where each was found (after a twin's
-- own write, when the twin is in this call).
if replays then
  for _, x in ipairs(replays) do redis.call('HSET', x[1], x[2], x[3]) end
end
if back > 0 then
  stock_event('R', gen, KEYS[1])
elseif credited > 0 then
  stock_event('M', gen, KEYS[1])
end
return int(stock0) .. ' ' .. table.concat(out, ' ')
