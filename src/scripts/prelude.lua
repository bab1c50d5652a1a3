-- prelude.lua — shared helpers, prepended to every shardstock script at build time.
--
-- Redis scripts have no rollback: a write made before a runtime error stays applied. Every
-- script therefore validates *all* of its arguments with these strict helpers before its first
-- write. `tonumber` alone is not enough: it accepts "0x10", "1e3", " 5 ", "5.9" and "inf".
--
-- Keys built here. A segment's scripts reach the ledgers of users named by its reservation index
-- (reclaim, the end of a generation), whose names no caller can know in advance, so those keys
-- are built inside the script from the segment's own key names: `<prefix>:{<tag>}:` + suffix.
-- Every such key carries the segment's hash tag, so it lives in the same slot as the KEYS the
-- call declared: safe on Redis Cluster (one slot, one node, never CROSSSLOT). Only a store that
-- insists on every key in KEYS (Dragonfly's atomic mode) would object; Redis does not.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).

-- Abort the script with an error reply naming the offending argument.
local function bad(name)
  error({ err = 'ERR shardstock bad argument: ' .. name })
end

-- A canonical non-negative decimal integer below 10^15 (exact in a Lua double).
local function uint(name, v)
  local x = type(v) == 'string' and #v <= 15 and tonumber(v)
  if not x or string.find(v, '%D') or (#v > 1 and string.byte(v) == 48) then bad(name) end
  return x
end

-- Same, but zero is refused.
local function posint(name, v)
  local n = uint(name, v)
  if n == 0 then bad(name) end
  return n
end

-- An identifier: 1..128 bytes without whitespace or braces. Whitespace would break the stored
-- formats that split at a space (`<user> <request id>` in the reservation index, a limited
-- ledger's text); braces have no place in a name that becomes part of a key. The engine's id
-- types refuse more (control characters) before anything is sent.
local function ident(name, v)
  if type(v) ~= 'string' or #v == 0 or #v > 128 or string.find(v, '[%s{}]') then
    bad(name)
  end
  return v
end

-- A transfer id: a canonical decimal u64 other than 0, kept as TEXT. Never `tonumber` it: a Lua
-- double is exact only below 2^53, and ids are drawn from the whole u64 range.
local function txid(name, v)
  if type(v) ~= 'string' or #v == 0 or #v > 20 or not string.match(v, '^[1-9][0-9]*$')
      or (#v == 20 and v > '18446744073709551615') then
    bad(name)
  end
  return v
end

-- A transfer id as a member of the due index: zero-padded to 20 digits, so the ZSET's order
-- among equal lease ends (members compare as bytes) is the ids' numeric order.
local function txmember(id)
  return string.rep('0', 20 - #id) .. id
end

-- An integer as exact decimal text. Lua's `..` and `tostring` format numbers with %.14g, which
-- turns 10^14 and above into "1e+14"-style text that no parser here accepts; %d is exact for
-- every integer a double holds exactly (below 2^53).
local function int(n)
  return string.format('%d', n)
end

-- Server time in milliseconds: leases, expiries and record lifetimes use the Redis clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- `<prefix>:{<tag>}:`, the start of every key of the segment whose hash is `seg`
-- (`<prefix>:{<tag>}:seg`).
local function seg_base(seg)
  return string.sub(seg, 1, -4)
end

-- The segment index named by the segment key's hash tag ({<sku>#<i>[.<k>]}), as text.
local function seg_index(seg)
  return string.match(seg, '{[^#}]*#(%d+)')
end

-- A request record (a field `=<request id>` of its user's ledger): `<S>:<qty>:<until>:<exp>`.
-- Returns the state letter, qty (number), until (number), exp (number) and the qty text.
local function rec_parse(v)
  local s, q, u, e = string.match(v, '^(%u):(%d+):(%d+):(%d+)$')
  return s, tonumber(q), tonumber(u), tonumber(e), q
end

-- A record is live while `until` is 0 (kept for the generation) or ahead of `now`.
local function live(until_ms, now)
  return until_ms == 0 or now < until_ms
end

-- The segment as a call sees it. `v` holds the segment hash's fields as HMGET read them, named
-- by `names`; counters are numbers, changed in place by the script and written back once by
-- flush(). `st.now` is the server clock, read at most once and only when needed (clock()).
local COUNTERS = { stock = true, sold = true, reserved = true, tin = true, tout = true }
local COUNTER_ORDER = { 'stock', 'sold', 'reserved', 'tin', 'tout' }
local function open(seg, names, v)
  local st = { seg = seg, was = {} }
  for i, name in ipairs(names) do
    local x = v[i]
    if COUNTERS[name] then
      -- A counter the hash lacks (written before it existed) counts from 0.
      x = tonumber(x or '0')
      st.was[name] = x
    end
    st[name] = x
  end
  st.lim = tonumber(st.lim or '0')
  -- The generation's home function / ledger layout version (missing: written before versions).
  st.hfv = tonumber(st.hf or '0')
  return st
end

local function clock(st)
  if not st.now then st.now = now_ms() end
  return st.now
end

-- Writes the counters this call changed, in one HSET. As text from int(), never as Lua
-- numbers: how redis.call turns a number into text depends on the Redis version (7.2.0–7.2.4
-- write 100000000 as "1e+08", which HINCRBY and every reader then refuse).
local function flush(st)
  local args, n = { 'HSET', st.seg }, 2
  for _, c in ipairs(COUNTER_ORDER) do
    if st.was[c] and st[c] ~= st.was[c] then
      args[n + 1], args[n + 2], n = c, int(st[c]), n + 2
      st.was[c] = st[c]
    end
  end
  if n > 2 then redis.call(unpack(args)) end
end

-- The outbox (see src/orders.rs): when the SKU was loaded with it on (segment field out = 1),
-- every script that changes what a request's units are (sold, reserved, confirmed, cancelled,
-- expired) appends one event to the segment's stream in the same atomic step. `ob` is
-- { seg = segment hash key, key = stream key (KEYS, same hash tag), on = the segment's `out`
-- is 1 }.
local function outbox(seg, key, out)
  return { seg = seg, key = key, on = out == '1' }
end

-- Appends event `kind` about request `rid` of `user` in generation `gen` (all text); `units`
-- and `parts` are canonical strings. The SKU comes from the segment key's hash tag.
local function emit(ob, kind, gen, rid, user, units, parts)
  if not ob.on then return end
  redis.call('XADD', ob.key, '*', 'kind', kind, 'rid', rid, 'sku', string.match(ob.seg, '{([^#}]*)#'),
    'user', user, 'units', units, 'parts', parts, 'gen', gen)
end

-- Called before a script's first write when it may append: with the outbox on, refuse the
-- whole call while the Redis user may not XADD to the stream. Redis does not roll a script
-- back, so a refusal at the XADD itself would leave the sale written without its event.
local function outbox_ready(ob)
  if ob.on and not redis.acl_check_cmd('XADD', ob.key, '*', 'kind', 'sold') then
    error({ err = 'NOPERM this user has no permissions to run the \'xadd\' command on the outbox stream '
      .. ob.key .. ' (shardstock refused the call before writing: a sale must not go without its event)' })
  end
end

-- Stock notification (src/store/redis/invalidate.rs): PUBLISH on `<prefix>:stock` that units of
-- the SKU named by `key`'s hash tag may be sellable again, so every instance drops its sold-out
-- flag for it. `kind`: S restocked or (re)loaded, M units moved in by a transfer's credit, R
-- units returned (expiry, cancel), L generation `gen` became ready. Sent after the writes; best effort (pcall: a
-- user without the channel right sells on, and its instances, refused SUBSCRIBE too, keep no
-- flags).
local function stock_event(kind, gen, key)
  redis.pcall('PUBLISH', string.match(key, '^(.-):{') .. ':stock', kind .. ' ' .. gen .. ' ' .. key)
end

-- Ledgers (the tables in src/store/redis/lua.rs). Under a per-user limit (the segment's `lim` >
-- 0) every ledger of a generation is one field of one hash, `<prefix>:{<tag>}:g<gen>:led`:
-- field <user>, value `<h> <f>` then ` <request id> <record>` per record (neither has a
-- space) — or, for a new buyer's one sale of one unit (the flash sale's every buyer), the short
-- form `<request id>` alone, which stands for `1 1 <request id> A:1:0:0` and saves the sale a
-- string and ~12 bytes — so a coalesced call reads every ledger it needs with one HMGET and
-- writes them back with one HSET, and a buyer costs one field, not a key. Without a limit
-- (version 4 on) a record is one field `<user> <request id>` of a hash shared by the segment's
-- users, never a key of its own: a sale's in the sales window of its time (sale_windows, below),
-- which Redis drops whole once every record in it is forgotten; a reservation's or an order
-- item's in `…:g<gen>:rec`, which lives as long as the generation (the reclaim must find it
-- however late it runs). Versions before 4 kept a hash per user, `…:g<gen>:u:<user>` (field
-- `=<request id>`), still read here for a generation an older build loaded.
--
-- A limited ledger's text, parsed: { h, f, n (records), recs = { [request id] = record } }.
local function led_parse(v)
  local l = { h = 0, f = 0, n = 0, recs = {} }
  if v and not string.find(v, ' ', 1, true) then
    -- The short form: a new buyer's one sale of one unit, `<request id>` alone.
    l.h, l.f, l.n = 1, 1, 1
    l.recs[v] = 'A:1:0:0'
  elseif v then
    local h, f, rest = string.match(v, '^(%d+) (%d+)(.*)$')
    l.h, l.f = tonumber(h), tonumber(f)
    for rid, rec in string.gmatch(rest, ' (%S+) (%S+)') do
      if not l.recs[rid] then l.n = l.n + 1 end
      l.recs[rid] = rec
    end
  end
  return l
end

-- The text of a parsed limited ledger: the short form when that is what it holds.
local function led_text(l)
  if l.h == 1 and l.f == 1 then
    local rid, rec = next(l.recs)
    if rec == 'A:1:0:0' and next(l.recs, rid) == nil then return rid end
  end
  local t, k = { int(l.h), int(l.f) }, 2
  for rid, rec in pairs(l.recs) do
    t[k + 1], t[k + 2], k = rid, rec, k + 2
  end
  return table.concat(t, ' ')
end

-- prunes_at (segment.rs): a ledger holding `n` records forgets the ones past their `until`
-- before taking another at 32 records and at every larger power of two (amortised O(1)).
local function prunes_at(n)
  if n < 32 then return false end
  local p = 32
  while p < n do p = p * 2 end
  return p == n
end

-- User `user`'s ledger in the generation whose keys start `gbase` (`<prefix>:{<tag>}:g<gen>`),
-- `lim` the segment's per-user limit, `hfv` its layout version (segments.rs HOME_FN). Limited
-- (version 2 on): a field of the ledger hash, read and parsed now. Otherwise a hash of its own,
-- only named (records are read one by one with led_rec); a limited one of version 1 (written
-- by an older build, still read and ended here: a reload, an audit, a confirm) keeps `h` and
-- `f` as fields beside the records, read now.
local function ledger(gbase, lim, user, hfv)
  if lim > 0 and hfv >= 2 then
    local l = led_parse(redis.call('HGET', gbase .. ':led', user) or nil)
    l.key, l.user, l.lim = gbase .. ':led', user, lim
    return l
  end
  if lim == 0 and hfv >= 4 then
    -- Reservations' and order items' records (sales' are in the windows: sale_rec).
    return { key = gbase .. ':rec', user = user, lim = 0, pre = user .. ' ' }
  end
  local l = { key = gbase .. ':u:' .. user, user = user, lim = 0 }
  if lim > 0 then
    local x = redis.call('HMGET', l.key, 'h', 'f')
    l.own, l.h, l.f = true, tonumber(x[1] or '0'), tonumber(x[2] or '0')
  end
  return l
end

-- The record of request `rid` in ledger `l` (its text), or nil.
local function led_rec(l, rid)
  if l.lim > 0 then return l.recs[rid] end
  if l.pre then return redis.call('HGET', l.key, l.pre .. rid) or nil end
  return redis.call('HGET', l.key, '=' .. rid) or nil
end

-- Sales windows (version 4 on, no per-user limit). A sale's record `<user> <request id>` goes
-- into `…:g<gen>:w<w>:<b>`: `w` the window of its record's lifetime (the segment's `rw` lists the
-- windows in use, comma-separated; a sale takes the smallest one at least its `ttl_ms`), `b` =
-- floor(the sale's time / w). Every record there was written before (b + 1)·w and lives at most
-- w, so the hash expires at (b + 2)·w, and a record still live at `now` is in window
-- floor(now / w) or the one before: a lookup reads two hashes per window in use, whatever the
-- number of buyers. A one-unit sale's record there is kept short: `<until - b·w>` (digits
-- only) stands for `A:1:<until>:0`, so the value fits Redis's smallest string allocation.
-- Returns the names of the hashes to read at `now`, in order, and the start (b·w) of each.
local function sale_windows(gbase, rw, now)
  local keys, starts, n = {}, {}, 0
  for w in string.gmatch(rw or '', '%d+') do
    local wn = tonumber(w)
    local b = math.floor(now / wn)
    keys[n + 1], starts[n + 1] = gbase .. ':w' .. w .. ':' .. int(b), b * wn
    keys[n + 2], starts[n + 2] = gbase .. ':w' .. w .. ':' .. int(b - 1), (b - 1) * wn
    n = n + 2
  end
  return keys, starts
end

-- A record as read from a sales window starting at `start` (sale_windows), in full.
local function win_rec(v, start)
  if string.find(v, ':', 1, true) then return v end
  return 'A:1:' .. int(start + tonumber(v)) .. ':0'
end

-- The live record of `user`'s request `rid` without a limit (version 4 on): in the record hash
-- of ledger `l` (ledger()), else in a sales window (segment field `rw`, the clock `now`).
-- Returns the record's text (in full) and the key it is in, or nil.
local function sale_rec(l, rw, user, rid, now)
  local f = user .. ' ' .. rid
  local rec = redis.call('HGET', l.key, f)
  if rec then
    local s, _, u = rec_parse(rec)
    if s and live(u, now) then return rec, l.key end
  end
  local keys, starts = sale_windows(string.sub(l.key, 1, -5), rw, now)
  for i, key in ipairs(keys) do
    rec = redis.call('HGET', key, f)
    if rec then
      rec = win_rec(rec, starts[i])
      local s, _, u = rec_parse(rec)
      if s and live(u, now) then return rec, key end
    end
  end
  return nil
end

-- Writes record `rec` of request `rid` into ledger `l`, with the units held (`h`, `f`) as `l`
-- holds them now when it keeps them (limited ledgers).
local function led_put(l, rid, rec)
  if l.lim > 0 then
    l.recs[rid] = rec
    redis.call('HSET', l.key, l.user, led_text(l))
  elseif l.pre then
    redis.call('HSET', l.key, l.pre .. rid, rec)
  elseif l.own then
    redis.call('HSET', l.key, '=' .. rid, rec, 'h', int(l.h), 'f', int(l.f))
  else
    redis.call('HSET', l.key, '=' .. rid, rec)
  end
end

-- Reads the records named by reservation index members (`<user> <request id>`), each user's
-- ledger once per call: returns a function of a member answering its user, request id, ledger
-- and record text (nothing for a malformed member; the record nil when it is gone).
local function index_reader(gbase, lim, hfv)
  local ls = {}
  return function(m)
    local user, rid = string.match(m, '^(%S+) (%S+)$')
    if not user then return nil end
    local l = ls[user]
    if not l then
      l = ledger(gbase, lim, user, hfv)
      ls[user] = l
    end
    return user, rid, l, led_rec(l, rid)
  end
end

-- The hold index of generation `gbase` (`<prefix>:{<tag>}:g<gen>`) as the audit reads it
-- (Segment::holds_detail): units of the order items held (records O), those items, and
-- entries whose record is gone or no longer O. `read` is an index_reader of the generation.
local function holds_detail(gbase, read)
  local held, n, orphans = 0, 0, 0
  for _, m in ipairs(redis.call('ZRANGE', gbase .. ':hold', 0, -1)) do
    local _, _, _, rec = read(m)
    local s, q
    if rec then s, q = rec_parse(rec) end
    if s == 'O' then
      held, n = held + q, n + 1
    else
      orphans = orphans + 1
    end
  end
  return held, n, orphans
end

-- Returns every expired reservation of the segment `st` (generation `gen`, reservation index
-- `resv`) to its stock — all of them, no cap — and answers the units returned. The index is a
-- ZSET of `<user> <request id>` by expiry; each one's record is in the user's ledger. A record
-- still R becomes X; its units leave `reserved` for `stock` (st's counters, written by the
-- caller's flush) and, with a per-user limit, the user's `h`. Entries whose record is gone or
-- no longer R are just dropped (Segment::reclaim). Each reservation returned is an `expired`
-- event in the outbox `ob`. Everything is in the segment's slot, so deciding "expired" and
-- returning the units is one atomic step: a confirm racing its own expiry ends in exactly one
-- state.
local function reclaim(st, gen, resv, ob)
  local now = clock(st)
  local due = redis.call('ZRANGEBYSCORE', resv, '-inf', int(now))
  if #due == 0 then return 0 end
  local gbase = seg_base(st.seg) .. 'g' .. gen
  local index = seg_index(st.seg)
  local back, read = 0, index_reader(gbase, st.lim, st.hfv)
  for _, m in ipairs(due) do
    local user, rid, l, v = read(m)
    if v then
      local s, q, _, _, qs = rec_parse(v)
      if s == 'R' then
        if l.h then l.h = l.h - q end
        led_put(l, rid, 'X' .. string.sub(v, 2))
        st.reserved = st.reserved - q
        st.stock = st.stock + q
        back = back + q
        emit(ob, 'expired', gen, rid, user, qs, index .. ':' .. qs)
      end
    end
  end
  redis.call('ZREMRANGEBYSCORE', resv, '-inf', int(now))
  return back
end

-- A reload (or a drop) ends generation `old` of segment `seg` while the segment still holds it:
-- its live reservations end with it, unsold (their records become K), and so do its order
-- items held (V); with the outbox on (that
-- generation's `out`, given) each one gets a `cancelled` event, so an order service does not
-- keep an unpaid order forever. Runs before the segment hash is replaced; the generation's other
-- keys are unlinked afterwards by the caller (RedisStore, SCAN of `…:g<old>:*`).
local function end_reservations(seg, old, out, okey)
  local gbase = seg_base(seg) .. 'g' .. old
  local resv = gbase .. ':resv'
  local x = redis.call('HMGET', seg, 'lim', 'hf')
  local lim, hfv = tonumber(x[1] or '0'), tonumber(x[2] or '0')
  local ob = outbox(seg, okey, out)
  outbox_ready(ob)
  local index = seg_index(seg)
  local read = index_reader(gbase, lim, hfv)
  -- Each index's records still live (`from`) become `to`, with a `cancelled` event; then the
  -- index goes. Order items held end with the generation too (V: given back with it); their
  -- orders' confirms name them as reloaded.
  for _, x in ipairs({ { resv, 'R', 'K' }, { gbase .. ':hold', 'O', 'V' } }) do
    local key, from, to = x[1], x[2], x[3]
    for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
      local user, rid, l, v = read(m)
      if v and string.sub(v, 1, 1) == from then
        local _, _, _, _, qs = rec_parse(v)
        led_put(l, rid, to .. string.sub(v, 2))
        emit(ob, 'cancelled', old, rid, user, qs, index .. ':' .. qs)
      end
    end
    redis.call('DEL', key)
  end
end
