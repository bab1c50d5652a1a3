-- lock_release.lua — compare-and-delete: release a lock only if this token still owns it.
--
-- A plain DEL would release somebody else's lock when ours already expired and they took it.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token
--
-- Reply: 1 released | 0 not held by this token
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
