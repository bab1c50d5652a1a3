-- settle.lua — end a fallback claim at the home segment.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  home request record   <prefix>:{<sku>#<home>}:g<gen>:rq:<request id>
-- KEYS[2]  claim index           <prefix>:{<sku>#<home>}:g<gen>:claims
-- KEYS[3]  home segment hash     <prefix>:{<sku>#<home>}:seg (its `out` field: outbox on?)
-- KEYS[4]  outbox stream         <prefix>:{<sku>#<home>}:out ("applied", outbox on: a `sold` or
--                                 `reserved` event with the parts, wherever they were taken)
-- ARGV[1]  epoch     the caller's claim epoch
-- ARGV[2]  outcome   "applied": applied with `parts`; "release": nothing was sold and the
--                    request id stays free (a later retry is a fresh attempt): the record
--                    becomes a released claim 'F' keeping only u, q, k and the epoch e, so the
--                    id's next claim (deduct_core.lua) continues above the epochs this one's
--                    shut-out markers still carry at the other segments;
--                    "seal": nothing was sold and the request id may never apply (record
--                    state 'X') — a verified-void per-user claim, or a claim abandoned by its
--                    holder and recovered by the sweeper
-- ARGV[3]  parts     "<segment>:<units>[,<segment>:<units>...]" for "applied", "" otherwise
-- ARGV[4]  ttl_ms    the record lives at least this long from now (never shortened: a record
--                    holding a live reservation keeps its longer life)
--
-- Publishes: `X <gen> <record key>` on <prefix>:stock on "seal" (prelude's stock_event). A
-- release gives nothing back (refund.lua notifies for the parts).
--
-- Reply:
--   {"ok"}                           settled as asked
--   {"superseded", state, detail}    the claim is no longer the caller's: the record's state
--                                    letter "A" (detail = parts of the applied outcome), "P"
--                                    (detail = epoch) or "X" (sealed)
--   {"gone"}                         no record, or a released one (released by a newer
--                                    holder, or expired)
local epoch = posint('epoch', ARGV[1])
local outcome = ARGV[2]
local parts = ARGV[3]
posint('ttl_ms', ARGV[4])
if outcome == 'applied' then
  if type(parts) ~= 'string' or #parts > 20000 or not string.match(parts, '^[0-9]+:[0-9]+[0-9:,]*$') then
    bad('parts')
  end
elseif outcome == 'release' or outcome == 'seal' then
  if parts ~= '' then bad('parts') end
else
  bad('outcome')
end

local rec = record(KEYS[1])
if not rec or rec.s == 'F' then return { 'gone' } end
if rec.s ~= 'P' or tonumber(rec.e) ~= epoch then
  if rec.s == 'A' then return { 'superseded', 'A', rec.parts } end
  return { 'superseded', rec.s, rec.e }
end
-- The claim says whether its generation had the outbox on (field o, written at claim time):
-- a reload since may have changed the segment's flag.
local ob = outbox(KEYS[3], KEYS[4])
if rec.o then ob.on = rec.o == '1' end
if outcome == 'applied' then outbox_ready(ob) end
redis.call('ZREM', KEYS[2], KEYS[1])
if outcome == 'applied' then
  redis.call('HSET', KEYS[1], 's', 'A', 'parts', parts)
  redis.call('HDEL', KEYS[1], 'l', 'hp')
  redis.call('PEXPIRE', KEYS[1], ARGV[4], 'GT')
  emit(ob, rec.k == 'r' and 'reserved' or 'sold', KEYS[1], rec.u, rec.q, parts)
elseif outcome == 'seal' then
  redis.call('HSET', KEYS[1], 's', 'X')
  redis.call('HDEL', KEYS[1], 'l', 'hp')
  redis.call('PEXPIRE', KEYS[1], ARGV[4], 'GT')
  stock_event('X', string.match(KEYS[1], '}:g(%d+):rq:'), KEYS[1])
else
  redis.call('HSET', KEYS[1], 's', 'F')
  redis.call('HDEL', KEYS[1], 'l', 'hp', 'rs', 'rq', 'exp')
  redis.call('PEXPIRE', KEYS[1], ARGV[4], 'GT')
end
return { 'ok' }
