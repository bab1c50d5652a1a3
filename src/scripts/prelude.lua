-- prelude.lua — shared helpers, prepended to every shardstock script at build time.
--
-- Redis scripts have no rollback: a write made before a runtime error stays applied. Every
-- script therefore validates *all* of its arguments with these strict helpers before its first
-- write. `tonumber` alone is not enough: it accepts "0x10", "1e3", " 5 ", "5.9" and "inf".
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).

-- Abort the script with an error reply naming the offending argument.
local function bad(name)
  error({ err = 'ERR shardstock bad argument: ' .. name })
end

-- A canonical non-negative decimal integer below 10^15 (exact in a Lua double).
local function uint(name, v)
  if type(v) ~= 'string' or #v == 0 or #v > 15 or not string.match(v, '^[0-9]+$')
      or (#v > 1 and string.sub(v, 1, 1) == '0') then
    bad(name)
  end
  return tonumber(v)
end

-- Same, but zero is refused.
local function posint(name, v)
  local n = uint(name, v)
  if n == 0 then bad(name) end
  return n
end

-- An identifier from the whitelist the Rust side enforces: [A-Za-z0-9_.:-], 1..128 bytes.
local function ident(name, v)
  if type(v) ~= 'string' or #v == 0 or #v > 128 or not string.match(v, '^[A-Za-z0-9_.:%-]+$') then
    bad(name)
  end
  return v
end

-- An integer as exact decimal text. Lua's `..` and `tostring` format numbers with %.14g, which
-- turns 10^14 and above into "1e+14"-style text that no parser here accepts; %d is exact for
-- every integer a double holds exactly (below 2^53).
local function int(n)
  return string.format('%d', n)
end

-- A request kind: 's' (a sale) or 'r' (a reservation). A request id names one request of one
-- kind: a sale and a reservation sharing an id conflict, they never replay each other.
local function kindarg(name, v)
  if v ~= 's' and v ~= 'r' then bad(name) end
  return v
end

-- Which parameter of a request differs from the record `rec` kept for its request id, or nil.
-- Records written before kinds existed are sales.
local function conflict(rec, user, qty, kind)
  if rec.u ~= user then return 'user' end
  if tonumber(rec.q) ~= qty then return 'qty' end
  if (rec.k or 's') ~= kind then return 'kind' end
  return nil
end

-- decr-compensate: the caller already took `units` off the segment's stock with HINCRBY; give
-- them back once per decrement. `token` is that decrement's one-time key (same hash tag), so a
-- script run re-sent after a lost reply gives nothing back twice. Called before the generation
-- check: the decrement hit whatever generation the segment holds.
local function give_back_once(seg, token, units, ttl)
  if not token then bad('decr token') end
  if redis.call('SET', token, '1', 'NX', 'PX', ttl) then
    redis.call('HINCRBY', seg, 'stock', units)
  end
end

-- Server time in milliseconds: leases use the Redis clock, never a client's.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The segment hash, or nil when it is missing or belongs to another load generation.
local function segment(key, gen)
  local v = redis.call('HMGET', key, 'gen', 'stock')
  if not v[1] then return nil, 'missing' end
  if v[1] ~= gen then return nil, v[1] end
  return tonumber(v[2])
end

-- Compact sale entries. A sale applied wholly at its home segment (the hot path) is not given
-- a record key of its own: it is one field of a per-window hash of its segment and generation,
--   <base>:rw            string "<W>:<w>": the window width in ms (set by the first writer, kept
--                        as long as any window: expires with the newest one, w)
--   <base>:rw:<W>:<w>    hash: request id -> "<qty>:<expiry ms>:<user>", entries written while
--                        floor(now / W) = w; the hash expires at (w + 2) * W
-- where <base> is the record key's `<prefix>:{<tag>}:g<gen>` and now the server clock. Only a
-- call whose record TTL is at most W writes compact entries (others write full records), so an
-- entry written in window w expires before (w + 2) * W, and a reader finds every live entry in
-- the current window or the one before. An entry past its expiry reads as absent, exactly like
-- an expired record key. Everything else (claims, reservations, seals, a sale over a released
-- claim, fallback parts) keeps its full record key: at most one of the two exists per id.

-- The record key's base (`<prefix>:{<tag>}:g<gen>`) and request id.
local function record_base(rk)
  return string.match(rk, '^(.-}:g%d+):rq:(.+)$')
end

-- The window width in force under `base` (a number) and the newest window written (a number),
-- or nil when no compact entry can be live.
local function compact_width(base)
  local v = redis.call('GET', base .. ':rw')
  if not v then return nil end
  local width, last = string.match(v, '^(%d+):(%d+)$')
  return tonumber(width), tonumber(last)
end

-- The live compact entries of request ids `rids` under `base` at server time `now`, with
-- window width `width` and newest window written `last`: a table request id -> entry text.
-- At most two HMGETs whatever the count (windows newer than `last` were never written).
local function compact_find(base, width, last, rids, now)
  local found = {}
  local w = math.floor(now / width)
  -- Windows `last` and the one before, never one ahead of `last` (never written) nor two or
  -- more behind the clock (expired). Read from `last`, not from the clock: writes never go below
  -- `last` (commit), so a clock that stepped back (a failover to a lagging replica) still finds
  -- every entry written in the last TTL.
  for win = last, math.max(last - 1, w - 1), -1 do
    local v = redis.call('HMGET', base .. ':rw:' .. int(width) .. ':' .. int(win), unpack(rids))
    for i = 1, #rids do
      local e = v[i]
      if e and not found[rids[i]] then
        local exp = string.match(e, '^%d+:(%d+):')
        if tonumber(exp) > now then found[rids[i]] = e end
      end
    end
  end
  return found
end

-- A compact entry as the record table a full record would give: an applied sale at home.
local function compact_record(e, index)
  local q, u = string.match(e, '^(%d+):%d+:(.*)$')
  return { s = 'A', u = u, q = q, e = '0', k = 's', parts = index .. ':' .. q }
end

-- Record fields of request record `key` as a table (HGETALL flattened), or its compact entry
-- read as the same table (see above), or nil. `now` (server ms) is read when needed.
local function record(key, now)
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then
    local base, rid = record_base(key)
    if not base then return nil end
    local width, last = compact_width(base)
    if not width then return nil end
    local e = compact_find(base, width, last, { rid }, now or now_ms())[rid]
    return e and compact_record(e, string.match(key, '{[^#}]*#(%d+)'))
  end
  local r = {}
  for i = 1, #flat, 2 do r[flat[i]] = flat[i + 1] end
  return r
end

-- The outbox (see src/orders.rs): when the SKU was loaded with it on (segment field out = 1),
-- every script that changes what a request's units are (sold, reserved, confirmed, cancelled,
-- expired) appends one event to the segment's stream in the same atomic step. `ob` is
-- { seg = segment hash key, key = stream key (KEYS, same hash tag), on = nil | true | false }:
-- the flag is read at most once per call, and only when there is something to say.
local function outbox(seg, key)
  if not key then return nil end
  return { seg = seg, key = key }
end

-- Appends event `kind` about the request whose record is `rk`; `units` and `parts` are
-- canonical strings. The SKU and segment come from the segment key's hash tag
-- ({<sku>#<i>[.<k>]}), the request id and generation from the record key (...:g<gen>:rq:<id>).
local function emit(ob, kind, rk, user, units, parts)
  if not ob then return end
  if ob.on == nil then ob.on = redis.call('HGET', ob.seg, 'out') == '1' end
  if not ob.on then return end
  local gen, rid = string.match(rk, '}:g(%d+):rq:(.+)$')
  redis.call('XADD', ob.key, '*', 'kind', kind, 'rid', rid, 'sku', string.match(ob.seg, '{([^#}]*)#'),
    'user', user, 'units', units, 'parts', parts, 'gen', gen)
end

-- Called before a script's first write when it may append: with the outbox on, refuse the
-- whole call while the Redis user may not XADD to the stream. Redis does not roll a script
-- back, so a refusal at the XADD itself would leave the sale written without its event.
local function outbox_ready(ob)
  if not ob then return end
  if ob.on == nil then ob.on = redis.call('HGET', ob.seg, 'out') == '1' end
  if ob.on and not redis.acl_check_cmd('XADD', ob.key, '*', 'kind', 'sold') then
    error({ err = 'NOPERM this user has no permissions to run the \'xadd\' command on the outbox stream '
      .. ob.key .. ' (shardstock refused the call before writing: a sale must not go without its event)' })
  end
end

-- The segment index named by the segment key's hash tag, as text.
local function seg_index(seg)
  return string.match(seg, '{[^#}]*#(%d+)')
end

-- Stock notification (src/store/redis/invalidate.rs): PUBLISH on `<prefix>:stock` that units of
-- the SKU named by `key`'s hash tag may be sellable again, so every instance drops its sold-out
-- flag for it. `kind`: S restocked, R units returned (refund, cancel, expiry), L generation `gen`
-- became ready, X / C the request whose record `key` is was sealed / claimed (an instance
-- answering sold out from memory answers that id from its record). Sent after the writes; best
-- effort (pcall: a user without the channel right sells on, and its instances, refused
-- SUBSCRIBE too, keep no flags).
local function stock_event(kind, gen, key)
  redis.pcall('PUBLISH', string.match(key, '^(.-):{') .. ':stock', kind .. ' ' .. gen .. ' ' .. key)
end

-- Lazy reclaim: return expired reservations of this segment to its stock (at most 64 per call;
-- the sweeper and later calls take the rest). A reservation's units sit on the record that
-- holds them (fields rs = R|C|X|K, rq = units, exp = expiry ms); the segment's index ZSET
-- (score = expiry) names those records. Everything is in the segment's slot, so deciding
-- "expired" and returning the units is one atomic step: a confirm racing its own expiry ends
-- in exactly one state. Each reservation returned is an `expired` event in the outbox `ob`.
local function reclaim(seg, zkey, now, ob)
  local due = redis.call('ZRANGEBYSCORE', zkey, '-inf', now, 'LIMIT', 0, 64)
  local back = 0
  for _, rk in ipairs(due) do
    local v = redis.call('HMGET', rk, 'rs', 'rq', 'u')
    if v[1] == 'R' then
      local q = tonumber(v[2])
      redis.call('HSET', rk, 'rs', 'X')
      redis.call('HINCRBY', seg, 'reserved', -q)
      redis.call('HINCRBY', seg, 'stock', q)
      back = back + q
      emit(ob, 'expired', rk, v[3], v[2], seg_index(seg) .. ':' .. v[2])
    end
    redis.call('ZREM', zkey, rk)
  end
  if back > 0 then stock_event('R', string.match(zkey, ':g(%d+):resv$'), seg) end
  return back
end

-- A reload replaces the generation segment `seg` holds: its live reservations end with it,
-- unsold; with the outbox on (that generation's `out`) each one gets a `cancelled` event, so
-- an order service does not keep an unpaid order forever. Runs before the segment hash is
-- replaced. `zkey` is the reservation index of generation `old`, the one the SKU metadata
-- named; when the segment holds another (a concurrent load wrote it first, or an earlier
-- load failed half-way and is being retried), that generation's index is named by putting
-- its number into `zkey` instead — the same hash tag, so the same slot on a cluster.
local function end_reservations(seg, old, zkey, okey)
  local v = redis.call('HMGET', seg, 'gen', 'out')
  if not v[1] then return end
  if v[1] ~= old then
    zkey = string.gsub(zkey, ':g%d+:resv$', ':g' .. v[1] .. ':resv')
  end
  local ob = outbox(seg, okey)
  ob.on = v[2] == '1'
  outbox_ready(ob)
  for _, rk in ipairs(redis.call('ZRANGE', zkey, 0, -1)) do
    local r = redis.call('HMGET', rk, 'rs', 'rq', 'u')
    if r[1] == 'R' then
      redis.call('HSET', rk, 'rs', 'K')
      emit(ob, 'cancelled', rk, r[3], r[2], seg_index(seg) .. ':' .. r[2])
    end
  end
  redis.call('DEL', zkey)
end

-- Marks the record `rk` as a reservation of `q` units expiring `ttl` ms from now, and makes the
-- record outlive the reservation by `rec_ttl` ms (the request TTL): reclaim needs the record to
-- return the units, so a record must never expire before its reservation is over. Invariant:
-- a record is in the index exactly while its reservation is live (rs = R).
local function hold(seg, zkey, rk, q, now, ttl, rec_ttl)
  redis.call('HINCRBY', seg, 'reserved', q)
  redis.call('HSET', rk, 'rs', 'R', 'rq', q, 'exp', int(now + ttl))
  redis.call('ZADD', zkey, int(now + ttl), rk)
  redis.call('PEXPIRE', rk, int(ttl + rec_ttl), 'GT')
end

