#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR/../lib
# Suite strategies: every deduction strategy through `shardstock sim`, 1 and 16 segments, safety (oversold, audit) and throughput
# Tables: docs/benchmarks.md "Strategies"
# Needs: redis-server redis-cli python3 cargo
# Time: ~15 s after the build with the defaults; 200 600: ~3 s
#
# Starts four redis-servers on free loopback ports: one for the stock, three independent ones
# as RedLock's lock nodes. Runs every strategy (lua, lock, redlock, decr-compensate, local-mutex,
# naive) for 1 and 16 segments: STOCK units, REQUESTS buyers (one request each, no per-user
# limit), 64 concurrent workers, one run each; prints a Markdown table (sold, oversold, audit,
# throughput, p50, p99, lock acquisitions / contended / fenced).
#
# Usage: scripts/bench.sh strategies [STOCK] [REQUESTS]        (defaults 2000 and 6000)
set -euo pipefail
. "$(dirname "$0")/../lib/harness.sh"
harness_init
STOCK=${1:-2000}
REQUESTS=${2:-6000}
need redis-server redis-cli python3
build_release --features cli
BIN=$RELEASE/shardstock
redis_start
MAIN=$REDIS_PORT
redlock_nodes

echo "| strategy | segments | sold | oversold | audit | throughput | p50 | p99 | lock acquired / contended / fenced |"
echo "|---|---|---|---|---|---|---|---|---|"
for s in lua lock redlock decr-compensate local-mutex naive; do
  for k in 1 16; do
    extra=()
    [ "$s" = redlock ] && extra=(--lock-nodes "$LOCK_NODES")
    out=$("$BIN" sim --redis "redis://127.0.0.1:$MAIN" --strategy "$s" "${extra[@]}" --sku "cmp-$s-$k" \
      --stock "$STOCK" --segments "$k" --users "$REQUESTS" --requests "$REQUESTS" --per-user-limit 0 \
      --concurrency 64 --json || true)
    python3 - "$s" "$k" "$out" <<'PY'
import json, sys
s, k, out = sys.argv[1], sys.argv[2], sys.argv[3]
d = json.loads(out)
l = d.get("lock") or {}
locks = f"{l['acquired']} / {l['contended']} / {l['fenced_rejected']}" if l else "–"
unsafe = "" if d["strategy_safe"] else " (unsafe)"
print(f"| {s}{unsafe} | {k} | {d['sold_units']} | {d['oversold']} | {'ok' if d['audit_ok'] else 'FAILED'} | "
      f"{d['throughput_per_s']:,.0f}/s | {d['p50_ms']:.2f} ms | {d['p99_ms']:.2f} ms | {locks} |")
PY
  done
done
