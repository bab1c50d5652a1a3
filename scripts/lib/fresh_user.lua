-- fresh_user.lua — a benchmark shim, never part of the engine: placed between prelude.lua and
-- sell.lua by the suites under scripts/bench/ that drive sell.lua with redis-benchmark.
--
-- sell.lua wants request j's user twice: in ARGV (the user) and in KEYS[4+j] (the ledger
-- `<prefix>:{<tag>}:g<gen>:u:<user>`, which must be exactly that name). redis-benchmark (7.0)
-- gives every `__rand_int__` its own random number, so it cannot put one random user in both.
-- This block sets each request's user argument to the name its ledger key ends with, so a
-- `…:u:u__rand_int__` key makes every request a new buyer with a ledger of its own, as in a real
-- sale. Cost: one string.match and one table write per request (< 1 µs, measured in the ladder
-- of `scripts/bench.sh profile` as part of step 2).
do
  local nb = 6 + 3 * tonumber(ARGV[5])
  for j = 1, tonumber(ARGV[nb]) do
    ARGV[nb + 5 * (j - 1) + 1] = string.match(KEYS[4 + j], ':u:([^:]*)$')
  end
end
