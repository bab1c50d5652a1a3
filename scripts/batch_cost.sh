#!/usr/bin/env bash
# batch_cost.sh — the Redis-side cost of a coalesced deduction: deduct_batch.lua (prelude +
# deduct_core + deduct_batch, as the build composes it) at REF (default main) against the
# working tree, interleaved ROUNDS times on one private redis-server. redis-benchmark sends
# EVALSHA with N fresh requests per call (random request ids and users, 1 unit each, stock far
# beyond the run), 50 clients, pipeline 4. Per request it prints: redis-server main-thread CPU
# (INFO cpu, the figure least disturbed by other load), the script's time by INFO commandstats,
# and used_memory growth per request sold (bytes per remembered request).
#
# Usage: scripts/batch_cost.sh [REF]   env: CALLS (3000), N (64), ROUNDS (2), VERBOSE=1 (commandstats)
# Needs: redis-server, redis-cli, redis-benchmark, python3, git.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REF=${1:-main}
CALLS=${CALLS:-3000}; N=${N:-64}; ROUNDS=${ROUNDS:-2}
DIR=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --maxmemory-policy noeviction \
  --dir "$DIR" --logfile "$DIR/redis.log" >/dev/null 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
CLI=(redis-cli -p "$PORT")
for f in prelude deduct_core deduct_batch; do git -C "$ROOT" show "$REF:src/scripts/$f.lua"; done > "$DIR/ref.lua"
cat "$ROOT"/src/scripts/{prelude,deduct_core,deduct_batch}.lua > "$DIR/tree.lua"
SEG='bc:{bc#0}:seg'
KEYS=("$SEG" 'bc:{bc#0}:g1:resv' 'bc:{bc#0}:g1:claims' 'bc:{bc#0}:out')
ARGS=(1 0 600000 5000 "$N")
for _ in $(seq "$N"); do KEYS+=('bc:{bc#0}:g1:rq:__rand_int__'); ARGS+=(u__rand_int__ 1 1 0); done
cpu() { "${CLI[@]}" INFO cpu | tr -d '\r' | awk -F: '/used_cpu_(user|sys)_main_thread/{t+=$2} END{printf "%.0f", t*1000000}'; }
mem() { "${CLI[@]}" INFO memory | tr -d '\r' | sed -n 's/^used_memory:\(.*\)/\1/p'; }
run() { # $1 = label, $2 = script file
  "${CLI[@]}" FLUSHALL >/dev/null
  "${CLI[@]}" HSET "$SEG" gen 1 stock 999999999999 loaded 999999999999 restocked 0 sold 0 reserved 0 out 0 >/dev/null
  local sha; sha=$("${CLI[@]}" -x SCRIPT LOAD < "$2")
  "${CLI[@]}" CONFIG RESETSTAT >/dev/null
  local m0 c0 m1 c1; m0=$(mem); c0=$(cpu)
  redis-benchmark -p "$PORT" -c 50 -P 4 -n "$CALLS" -r 100000000000 --csv \
    EVALSHA "$sha" "${#KEYS[@]}" "${KEYS[@]}" "${ARGS[@]}" >/dev/null
  c1=$(cpu); m1=$(mem)
  local stats; stats=$("${CLI[@]}" INFO commandstats | tr -d '\r')
  [ "${VERBOSE:-0}" = 1 ] && grep '^cmdstat_' <<<"$stats" | grep -v 'config\|info' | cut -d, -f1-3
  python3 - "$1" "$stats" "$("${CLI[@]}" HGET "$SEG" sold)" "$m0" "$m1" "$c0" "$c1" "$N" <<'PY'
import re, sys
label, stats, sold, m0, m1, c0, c1, n = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
m = re.search(r"cmdstat_evalsha:calls=(\d+),usec=(\d+)", stats)
calls, usec = int(m.group(1)), int(m.group(2))
req = calls * n
print(f"{label:5s} {calls} calls × {n}: {(c1 - c0) / req:6.2f} µs CPU/request, "
      f"{usec / req:6.2f} µs/request by commandstats, {(m1 - m0) / max(sold, 1):4.0f} B/request sold")
PY
}
echo "deduct_batch.lua, $N fresh requests per call, $CALLS calls; ref = $REF, tree = $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- src/scripts || echo '+changes')"
for _ in $(seq "$ROUNDS"); do run ref "$DIR/ref.lua"; run tree "$DIR/tree.lua"; done
