#!/usr/bin/env bash
# fcall_cost.sh — what a coalesced sale would cost inside Redis as a Redis Function (FCALL of a
# library loaded once) instead of a script (EVALSHA), on one private redis-server.
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
#               each step of sell.lua (scripts/batch_cost.sh's markers): where a call's
#               instructions go.
#
# Usage: scripts/fcall_cost.sh   env: NS ("1 21 64": requests per call), ROUNDS (3), CALLS
#        (calls per run; default 30000/N, at least 3000; under callgrind 2000/N, at least 200),
#        SELL_LIMIT (1), BASE=1, CALLGRIND=1, LADDER=1 (with CALLGRIND=1)
# Needs: redis-server 7.0+, redis-cli, redis-benchmark, python3; valgrind for CALLGRIND=1.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/scripts/lib/sell_bench.sh"
NS=${NS:-1 21 64}; ROUNDS=${ROUNDS:-3}; CALLGRIND=${CALLGRIND:-0}
export SELL_LIMIT=${SELL_LIMIT:-1}
[ "$CALLGRIND" = 1 ] && ROUNDS=${ROUNDS_CG:-1}
DIR=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
SERVER=(redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no
  --maxmemory-policy noeviction --dir "$DIR" --logfile "$DIR/redis.log")
if [ "$CALLGRIND" = 1 ]; then
  valgrind --tool=callgrind --instr-atstart=no --dump-instr=no --callgrind-out-file="$DIR/cg.%p" \
    "${SERVER[@]}" >"$DIR/valgrind.log" 2>&1 &
else
  "${SERVER[@]}" >/dev/null 2>&1 &
fi
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 600); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
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
cpu() { "${CLI[@]}" INFO cpu | tr -d '\r' | awk -F: '/used_cpu_(user|sys)_main_thread/{t+=$2} END{printf "%.0f", t*1000000}'; }
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
    for _ in $(seq 100); do f=$(ls "$DIR"/cg.*.* 2>/dev/null | head -1); [ -n "$f" ] && grep -q '^totals:' "$f" && break; sleep 0.1; done
    ir=$(awk '/^totals:/{print $2; exit}' "$f"); [ -n "$ir" ] || { ls -l "$DIR" >&2; tail -3 "$f" >&2; exit 1; }; rm -f "$DIR"/cg.*.*
    python3 -c "import sys; l, n, c, ir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]); print(f'| {l} | {n} | {c} | {ir / c:,.0f} | {ir / c / n:,.0f} |', flush=True)" \
      "$label" "$n" "$calls" "$ir"
  else
    "${CLI[@]}" CONFIG RESETSTAT >/dev/null
    local c0 c1; c0=$(cpu)
    bench "$calls" "$@"
    c1=$(cpu)
    python3 - "$label" "$n" "$calls" "$c0" "$c1" "$("${CLI[@]}" INFO commandstats | tr -d '\r')" <<'PY'
import re, sys
label, n, calls, c0, c1, stats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
m = re.search(r"cmdstat_(?:evalsha|fcall):calls=(\d+),usec=(\d+)", stats)
k, usec = int(m.group(1)), int(m.group(2))
print(f"| {label} | {n} | {k} | {usec / k:.2f} | {usec / k / n:.2f} | {(c1 - c0) / k:.2f} | {(c1 - c0) / k / n:.2f} |", flush=True)
PY
  fi
}

echo "tree $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- src/scripts || echo '+changes'), per-user limit $SELL_LIMIT, redis-server $(redis-server --version | grep -o 'v=[^ ]*' | cut -c3-)$([ "$CALLGRIND" = 1 ] && echo ', under callgrind')"
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
  cuts=("${SELL_CUTS[@]}")
  labels=("${SELL_STEPS[@]}")
  for n in $NS; do
    run "EVALSHA return '1'" "$n" 0 EVALSHA "$SHA_NOP"
    run "prelude" "$n" 0 EVALSHA "$SHA_PNOP"
    for k in "${!cuts[@]}"; do
      awk -v pat="${cuts[$k]}" 'index($0, pat) == 1 { found = 1; exit } { print } END { exit !found }' \
        "$DIR/sell.lua" > "$DIR/cut.lua" || { echo "step marker not in sell.lua: ${cuts[$k]}" >&2; exit 1; }
      echo "return '1'" >> "$DIR/cut.lua"
      run "${labels[$k]}" "$n" 0 EVALSHA "$(sha "$DIR/cut.lua")"
    done
    run "+ the rest (the whole script)" "$n" 1 EVALSHA "$SHA_SELL"
  done
fi
