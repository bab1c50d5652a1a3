-- redlock_acquire.lua — one node's vote in a RedLock acquisition, with restart quarantine.
--
-- A node that lost its data (restarted without persistence, FLUSHALL, a new empty replica
-- promoted) no longer knows which locks it granted. If it voted at once, a second client could
-- win a quorum made of it plus the other empty/free nodes while the first holder still owns the
-- lock on the rest. So every node keeps a marker key (no TTL) holding "quarantined until <ms>"
-- on the node's own clock. A missing marker means "new or restarted empty": the node starts a
-- quarantine of `quarantine_ms` (longer than any lease it may have forgotten can still run) and
-- refuses to vote until it ends. Afterwards it votes with `SET key token NX PX lease`.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  lock key
-- KEYS[2]  quarantine marker   shardstock:redlock:quarantine   (no TTL; value: end of quarantine,
--                              server-clock ms; an operator may set "0" on a node known to be new)
-- ARGV[1]  owner token
-- ARGV[2]  lease_ms        (> 0)
-- ARGV[3]  quarantine_ms   (> 0) started when the marker is missing or unreadable
--
-- Reply (first element is the tag):
--   {"ok"}                    granted: KEYS[1] = token with a fresh lease (also when this token
--                             already held it, e.g. an earlier attempt of the same acquisition)
--   {"taken"}                 held by another token; nothing changed
--   {"quarantine", ms_left}   this node is quarantined; nothing changed but (maybe) the marker
-- Errors: "ERR shardstock bad argument: <name>" before any write.
local token = ident('token', ARGV[1])
local lease = posint('lease_ms', ARGV[2])
local quarantine = posint('quarantine_ms', ARGV[3])

local now = now_ms()
local until_ms = tonumber(redis.call('GET', KEYS[2]))
if not until_ms then
  until_ms = now + quarantine
  redis.call('SET', KEYS[2], string.format('%d', until_ms))
end
if now < until_ms then return { 'quarantine', until_ms - now } end

local holder = redis.call('GET', KEYS[1])
if holder == token then
  redis.call('PEXPIRE', KEYS[1], lease)
  return { 'ok' }
end
if holder then return { 'taken' } end
redis.call('SET', KEYS[1], token, 'PX', lease)
return { 'ok' }
