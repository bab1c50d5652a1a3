#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR/../lib
# Suite fcall-cost: the selling script as EVALSHA against a Redis Function (FCALL); CALLGRIND=1: instructions per call, LADDER=1: step by step
# Tables: docs/benchmarks.md "Exactly-once against the bare script" (instructions per call and the ladder, "Scripts, not Redis Functions", "A one-unit sale's ledger is its request id", "Ids packed per run")
# Needs: redis-server redis-cli redis-benchmark python3 git
# Time: ~20 s with the defaults (3 rounds × 3 batch sizes × 2 variants); CALLGRIND=1 LADDER=1: ~5 min; ROUNDS=1 NS=21 CALLS=300: ~2 s; CALLGRIND=1 LADDER=1 NS=21 CALLS=50: ~15 s
#
# What a coalesced sale would cost inside Redis as a Redis Function (FCALL of a library loaded
# once) instead of a script (EVALSHA), on one private redis-server.
#
# A script runs prelude.lua on every call: the helpers' closures and tables are made again each
# time. A library runs its top level once, at FUNCTION LOAD, so the prelude's helpers would
# exist once. Two variants of the working tree's selling script, interleaved:
#   evalsha  prelude.lua + sell.lua, as src/store/redis/lua.rs composes and sends it;
#   fcall    `#!lua name=…`, prelude.lua at library scope, sell.lua's body as the registered
#            function's callback (KEYS and ARGV its two parameters), no flags.
# With BASE=1 also the floors: `return '1'` as EVALSHA and as FCALL (the call and its arguments
# alone), and prelude.lua + `return '1'` as EVALSHA (the prelude's share).
# Each variant: N fresh one-unit sales per call (random users and request ids), per-user limit
# SELL_LIMIT, at a segment written by the real load_segment.lua (scripts/lib/sell_bench.sh).
#
# Two ways to count:
#   default     redis-benchmark (50 clients, pipeline 4): µs per call by INFO commandstats and
#               redis-server main-thread CPU µs per call (INFO cpu): noisy on a shared machine,
#               so ROUNDS interleaved rounds;
#   CALLGRIND=1 redis-server under valgrind's callgrind, instructions per call counted only
#               while the measured calls run (callgrind_control): repeatable whatever else the
#               machine does; one round is enough. LADDER=1 adds the EVALSHA script cut after
#               each step of sell.lua (SELL_CUTS, scripts/lib/sell_bench.sh): where a call's
#               instructions go.
#
# Usage: scripts/bench.sh fcall-cost   env: NS ("1 21 64": requests per call), ROUNDS (3), CALLS
#        (calls per run; default 30000/N, at least 3000; under callgrind 2000/N, at least 200),
#        SELL_LIMIT (1), BASE=1, CALLGRIND=1, LADDER=1 (with CALLGRIND=1)
# Needs redis-server 7.0+ (Functions); valgrind (callgrind_control) for CALLGRIND=1.
set -euo pipefail
. "$(dirname "$0")/../lib/harness.sh"
. "$(dirname "$0")/../lib/sell_bench.sh"
harness_init
NS=${NS:-1 21 64}; ROUNDS=${ROUNDS:-3}; CALLGRIND=${CALLGRIND:-0}
export SELL_LIMIT=${SELL_LIMIT:-1}
[ "$CALLGRIND" = 1 ] && ROUNDS=${ROUNDS_CG:-1}
need redis-server redis-cli redis-benchmark python3
DIR=$WORK
if [ "$CALLGRIND" = 1 ]; then
  need valgrind callgrind_control
  REDIS_LAUNCHER=(valgrind --tool=callgrind --instr-atstart=no --dump-instr=no
    --callgrind-out-file="$DIR/cg.%p")
fi
redis_start
PORT=$REDIS_PORT
PID=$REDIS_PID
CLI=(redis-cli -p "$PORT")
SEG='fc:{fc#0}:seg'

sell_compose "$ROOT" "$DIR/sell.lua"
[ "$SELL_KIND" = runs ] || { echo "sell.lua's contract is not the one this script sends" >&2; exit 1; }
sell_load_lua "$ROOT" "$DIR/load.lua"
HF=$(sell_home_fn "$ROOT")
{
  echo '#!lua name=fcall_cost'
  cat "$ROOT/src/scripts/prelude.lua"
  echo 'local function sell(KEYS, ARGV)'
  cat "$ROOT/src/scripts/sell.lua"
  echo 'end'
  echo "redis.register_function{function_name = 'fc_sell', callback = sell}"
  echo "redis.register_function{function_name = 'fc_nop', callback = function() return '1' end}"
} > "$DIR/lib.lua"
"${CLI[@]}" -x FUNCTION LOAD REPLACE < "$DIR/lib.lua" >/dev/null
echo "return '1'" > "$DIR/nop.lua"
{ cat "$ROOT/src/scripts/prelude.lua"; echo "return '1'"; } > "$DIR/prelude_nop.lua"
sha() { "${CLI[@]}" -x SCRIPT LOAD < "$1"; }
SHA_SELL=$(sha "$DIR/sell.lua"); SHA_NOP=$(sha "$DIR/nop.lua"); SHA_PNOP=$(sha "$DIR/prelude_nop.lua")

load_seg() {
  local r; r=$(sell_load_segment "$DIR/load.lua" "$SEG" 999999999999 "$HF" "${CLI[@]}" | head -1)
  [ "$r" = ok ] || { echo "load_segment.lua answered '$r', not 'ok'" >&2; exit 1; }
}
bench() { # $1 = calls, rest: the command before the key count
  local calls=$1; shift
  redis-benchmark -p "$PORT" -c 50 -P 4 -n "$calls" -r 100000000000 --csv \
    "$@" "${#SELL_KEYS[@]}" "${SELL_KEYS[@]}" "${SELL_ARGS[@]}" >/dev/null
}
# run LABEL N PROBE(1: the reply must be a sale's) COMMAND...: one measured run.
run() {
  local label=$1 n=$2 probe=$3 calls; shift 3
  if [ "$CALLGRIND" = 1 ]; then calls=${CALLS:-$((2000 / n > 200 ? 2000 / n : 200))}
  else calls=${CALLS:-$((30000 / n > 3000 ? 30000 / n : 3000))}; fi
  sell_keys_args "$SEG" "$HF" "$n" 600000 runs
  "${CLI[@]}" FLUSHALL >/dev/null; load_seg
  if [ "$probe" = 1 ]; then
    local r
    r=$("${CLI[@]}" "$@" "${#SELL_KEYS[@]}" "${SELL_KEYS[@]//__rand_int__/probe}" "${SELL_ARGS[@]//__rand_int__/probe}" 2>&1 | head -1)
    sell_probe_ok "$r" || { echo "$label: probe answered '$r', not a sale" >&2; exit 1; }
  fi
  if [ "$CALLGRIND" = 1 ]; then
    bench "$calls" "$@" # warm-up: the ledger hash and Lua's heap past their first growth
    callgrind_control -z "$PID" >/dev/null
    callgrind_control -i on "$PID" >/dev/null
    bench "$calls" "$@"
    callgrind_control -i off "$PID" >/dev/null
    callgrind_control -d "$PID" >/dev/null
    local f ir
    for _ in $(seq 100); do f=$(compgen -G "$DIR/cg.*.*" | head -1 || true); [ -n "$f" ] && grep -q '^totals:' "$f" && break; sleep 0.1; done
    ir=$(awk '/^totals:/{print $2; exit}' "$f"); [ -n "$ir" ] || { ls -l "$DIR" >&2; tail -3 "$f" >&2; exit 1; }; rm -f "$DIR"/cg.*.*
    python3 -c "import sys; l, n, c, ir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]); print(f'| {l} | {n} | {c} | {ir / c:,.0f} | {ir / c / n:,.0f} |', flush=True)" \
      "$label" "$n" "$calls" "$ir"
  else
    "${CLI[@]}" CONFIG RESETSTAT >/dev/null
    local c0 c1; c0=$(redis_cpu_usec)
    bench "$calls" "$@"
    c1=$(redis_cpu_usec)
    python3 - "$label" "$n" "$calls" "$c0" "$c1" "$("${CLI[@]}" INFO commandstats | tr -d '\r')" <<'PY'
import re, sys
label, n, calls, c0, c1, stats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
m = re.search(r"cmdstat_(?:evalsha|fcall):calls=(\d+),usec=(\d+)", stats)
k, usec = int(m.group(1)), int(m.group(2))
print(f"| {label} | {n} | {k} | {usec / k:.2f} | {usec / k / n:.2f} | {(c1 - c0) / k:.2f} | {(c1 - c0) / k / n:.2f} |", flush=True)
PY
  fi
}

echo "tree $(sell_tree_desc "$ROOT"), per-user limit $SELL_LIMIT, redis-server $(redis_version)$([ "$CALLGRIND" = 1 ] && echo ', under callgrind')"
echo
if [ "$CALLGRIND" = 1 ]; then
  echo "| variant | requests per call | calls | instructions per call | per request |"
  echo "|---|---:|---:|---:|---:|"
else
  echo "| variant | requests per call | calls | µs per call (commandstats) | per request | main-thread CPU µs per call | per request |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
fi
for _ in $(seq "$ROUNDS"); do
  for n in $NS; do
    run "EVALSHA prelude + sell.lua" "$n" 1 EVALSHA "$SHA_SELL"
    run "FCALL, prelude at library scope" "$n" 1 FCALL fc_sell
    if [ "${BASE:-0}" = 1 ]; then
      run "EVALSHA return '1'" "$n" 0 EVALSHA "$SHA_NOP"
      run "FCALL return '1'" "$n" 0 FCALL fc_nop
      run "EVALSHA prelude + return '1'" "$n" 0 EVALSHA "$SHA_PNOP"
    fi
  done
done
# LADDER=1 (callgrind): the EVALSHA script cut after each of sell.lua's steps, cumulative.
if [ "$CALLGRIND" = 1 ] && [ "${LADDER:-0}" = 1 ]; then
  for n in $NS; do
    run "EVALSHA return '1'" "$n" 0 EVALSHA "$SHA_NOP"
    run "prelude" "$n" 0 EVALSHA "$SHA_PNOP"
    for k in "${!SELL_CUTS[@]}"; do
      sell_cut "$DIR/sell.lua" "$k" "$DIR/cut.lua"
      run "${SELL_STEPS[$k]}" "$n" 0 EVALSHA "$(sha "$DIR/cut.lua")"
    done
    run "+ the rest (the whole script)" "$n" 1 EVALSHA "$SHA_SELL"
  done
fi
