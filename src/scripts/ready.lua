#!lua
-- ready.lua — the readiness probe: would this master run a script that may write, now?
-- (Sent as is, without prelude.lua: it is no step of the protocol, so it stays out of the
-- `scripts!` registry of src/store/redis/lua.rs; src/store/redis/health.rs sends it.)
--
-- Its `#!lua` line declares no `no-writes` flag, like every script that sells: Redis decides
-- *before running it* whether it may run here, exactly as it decides for a sale, and refuses it
-- with NOREPLICAS (fewer replicas in sync than `min-replicas-to-write`), OOM (over `maxmemory`),
-- MISCONF (a failed background save with `stop-writes-on-bgsave-error`) or READONLY (a
-- replica). Where it runs, it writes nothing and calls no command.
--
-- KEYS: none (the caller routes it to the master it asks). ARGV: none.
-- Reply: 1.
return 1
