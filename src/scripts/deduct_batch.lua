-- deduct_batch.lua — request coalescing: many deductions bound for one segment in one call.
-- (prelude.lua and deduct_core.lua are prepended.)
--
-- The client gathers concurrent deductions for the same segment, generation, record TTL and
-- claim lease, and sends them here together. Each request is decided by the very code
-- deduct.lua runs (deduct_core.lua), in the order given, with its own record (request id),
-- validation and reply. What a call pays once instead of once per request: the script
-- dispatch, reading the segment and checking its generation, TIME, the reservation reclaim,
-- and the two counter writes (stock, sold).
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]     segment hash        <prefix>:{<sku>#<i>}:seg
-- KEYS[2]     reservation index   <prefix>:{<sku>#<i>}:g<gen>:resv
-- KEYS[3]     claim index         <prefix>:{<sku>#<i>}:g<gen>:claims
-- KEYS[4]     outbox stream       <prefix>:{<sku>#<i>}:out (appended to when the segment's
--                                  `out` is 1: one event per request applied)
-- KEYS[4+j]   request record of request j (1..n), same hash tag as KEYS[1]
-- ARGV[1]     gen        load generation of every request in the batch
-- ARGV[2]     index      this segment's index
-- ARGV[3]     ttl_ms     lifetime of the records (> 0)
-- ARGV[4]     lease_ms   lease of a fallback claim (> 0)
-- ARGV[5]     n          number of requests (1..1000)
-- ARGV[5+4(j-1)+1..4]    request j: user, qty, claim ("0"|"1"), resv_ttl_ms — meanings as
--                        in deduct.lua, mode "lua" (check the stock here)
--
-- Reply: an array of n replies, reply j for request j: an integer, the stock after it, for a
-- request applied (deduct.lua's {"applied", stock_after}; the bare number spares a nested
-- reply per sale), otherwise one of deduct.lua's replies ({"short", stock, epoch}, {"replay", parts}, {"pending", epoch,
-- lease_left_ms}, {"mismatch", field}, {"stale", gen_or_missing}, {"sealed"}) or
--   {"bad", "ERR shardstock bad argument: <name>"}   request j's arguments were refused; nothing
--                                                    was written for it (the others still ran)
-- Errors (whole call, before any write): a bad gen, index, ttl_ms, lease_ms, n, or a KEYS/ARGV
-- count that does not match n.
uint('gen', ARGV[1])
local gen = ARGV[1] -- canonical once validated
local index_s = ARGV[2]
uint('index', index_s)
posint('ttl_ms', ARGV[3])
local ttl_s = ARGV[3]
local lease = posint('lease_ms', ARGV[4])
local n = posint('n', ARGV[5])
if n > 1000 or #KEYS ~= n + 4 or #ARGV ~= 5 + 4 * n then bad('n') end

local pre = records_base(KEYS[1], gen) .. ':rq:'
-- Each distinct qty, reservation TTL and user text is checked once per call.
local okq, okr, oku = {}, {}, {}
local function parse(j)
  local b = 5 + 4 * (j - 1)
  local rk = KEYS[4 + j]
  local rid = record_id(pre, rk)
  local u, q, claim, rt = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  if not oku[u] then oku[u] = ident('user', u) end
  local qty = okq[q]
  if not qty then qty = posint('qty', q); okq[q] = qty end
  if claim ~= '0' and claim ~= '1' then bad('claim') end
  local resv_ttl = okr[rt]
  if not resv_ttl then resv_ttl = uint('resv_ttl_ms', rt); okr[rt] = resv_ttl end
  -- Seven fields and the `s` decide() sets: one table of eight slots (kind 'r' only for a
  -- reservation; a sale reads as 's'). Claims and reservations grow it, rarely.
  local r = { rk = rk, rid = rid, u = u, q = q, qty = qty, claim = claim, resv_ttl = resv_ttl,
    s = false }
  if resv_ttl > 0 then r.k = 'r' end
  return r
end

local out, rs, js = {}, {}, {}
local st, other = open_segment(KEYS[1], KEYS[2], gen, KEYS[4],
  { index = index_s, ttl_s = ttl_s, lease = lease, mode = 'lua', fence_token = 0, compact = true })
-- Every request parsed under one pcall; only when one is refused, each under its own.
local all_ok = pcall(function()
  for j = 1, n do rs[j] = parse(j) end
end)
if all_ok and st then
  for j = 1, n do js[j] = j end
else
  rs = {}
  for j = 1, n do
    local ok, r = pcall(parse, j)
    if not ok then
      out[j] = { 'bad', type(r) == 'table' and r.err or tostring(r) }
    elseif not st then
      out[j] = { 'stale', other }
    else
      local i = #rs + 1
      rs[i], js[i] = r, j
    end
  end
end
if st then
  prefetch(st, rs)
  for i, r in ipairs(rs) do out[js[i]] = decide(st, KEYS[1], r) end
  commit(st, KEYS[1], KEYS[2], KEYS[3])
end
return out
