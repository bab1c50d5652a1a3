#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR/../lib
# Suite ceiling: the script ceiling alone — redis-benchmark sending the lone-request selling script to one redis-server
# Tables: the ceiling every throughput run starts with (docs/benchmarks.md "Throughput vs the Redis ceiling"); the single-node ceiling docs/cluster.md multiplies by 100 masters
# Needs: redis-server redis-cli redis-benchmark python3 git
# Time: ~25 s with the defaults (1,000,000 calls); CEILING_REQUESTS=20000: ~1 s
#
# The first step of the throughput suite on its own: a private redis-server on a free loopback
# port, a segment hash written by the real load_segment.lua (generation 1, stock far beyond the
# call count, no per-user limit, outbox off), then redis-benchmark (50 clients, pipeline 64)
# sending EVALSHA of the working tree's selling script (prelude.lua + sell.lua, a batch of one),
# each call a new buyer's one-unit sale with a new request id (scripts/lib/sell_bench.sh). The
# scaleout suite measures the same per cluster master.
# Prints calls/s, the units sold, µs per call inside Redis by INFO commandstats and
# redis-server main-thread CPU µs per call (INFO cpu).
#
# Usage: scripts/bench.sh ceiling   env: CEILING_REQUESTS (calls, default 1,000,000)
set -euo pipefail
. "$(dirname "$0")/../lib/harness.sh"
. "$(dirname "$0")/../lib/sell_bench.sh"
harness_init
CEILING_REQUESTS=${CEILING_REQUESTS:-1000000}
need redis-server redis-cli redis-benchmark python3
redis_start
CLI=(redis-cli -p "$REDIS_PORT")
SEG='ceil:{ceiling#0}:seg'
HF=$(sell_home_fn .)
sell_compose . "$WORK/sell.lua"
sell_load_lua . "$WORK/load.lua"
SHA=$("${CLI[@]}" -x SCRIPT LOAD < "$WORK/sell.lua")
loaded=$(sell_load_segment "$WORK/load.lua" "$SEG" 999999999999 "$HF" "${CLI[@]}" | head -1)
[ "$loaded" = ok ] || { echo "load_segment.lua answered '$loaded', not 'ok'" >&2; exit 1; }
"${CLI[@]}" CONFIG RESETSTAT >/dev/null
c0=$(redis_cpu_usec)
csv=$(sell_ceiling_csv "$REDIS_PORT" "$SHA" "$SEG" "$HF" "$CEILING_REQUESTS")
c1=$(redis_cpu_usec)
python3 - "$csv" "$("${CLI[@]}" HGET "$SEG" sold)" "$("${CLI[@]}" INFO commandstats | tr -d '\r')" \
  "$c0" "$c1" "$(sell_tree_desc "$ROOT")" "$(redis_version)" "$(date -u '+%Y-%m-%d %H:%M UTC')" <<'PY'
import csv, io, re, sys
text, sold, stats, c0, c1, tree, version, when = sys.argv[1:]
rate = float(list(csv.reader(io.StringIO(text)))[-1][1])
m = re.search(r"cmdstat_evalsha:calls=(\d+),usec=(\d+)", stats)
calls, usec = int(m.group(1)), int(m.group(2))
print(f"Run {when}, tree {tree}, redis-server {version}; redis-benchmark EVALSHA sell (prelude + "
      f"sell.lua, a lone request), 50 clients, -P 64, a new user and request id per call.\n")
print("| calls | calls/s | units sold | µs per call inside Redis (commandstats) | main-thread CPU µs per call |")
print("|---:|---:|---:|---:|---:|")
print(f"| {calls:,} | **{rate:,.0f}** | {int(sold):,} | {usec / calls:.2f} | {(int(c1) - int(c0)) / calls:.2f} |")
PY
