-- lock_renew.lua — extend a lock's lease, only for its owner (watchdog renewal).
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token
-- ARGV[2]  lease_ms (> 0)
--
-- Reply: 1 renewed | 0 not held by this token (expired or taken by someone else)
local lease = posint('lease_ms', ARGV[2])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], lease)
  return 1
end
return 0
