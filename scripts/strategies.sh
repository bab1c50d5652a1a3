#!/usr/bin/env bash
# Runs every deduction strategy through `shardstock sim` against local redis-servers (one for
# stock, three independent ones for RedLock), for 1 and 16 segments, and prints a Markdown table.
# Usage: scripts/strategies.sh [STOCK] [REQUESTS]        (defaults 2000 and 6000)
set -euo pipefail
cd "$(dirname "$0")/.."
STOCK=${1:-2000}
REQUESTS=${2:-6000}
command -v redis-server >/dev/null || { echo "redis-server missing (scripts/test.sh installs it)"; exit 1; }
cargo build --release --quiet --features cli
BIN=target/release/shardstock
DIR=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT
start() { # port
  redis-server --port "$1" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" \
    --logfile "$DIR/$1.log" >/dev/null 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do redis-cli -p "$1" ping >/dev/null 2>&1 && return; sleep 0.05; done
  echo "redis on $1 did not start"; exit 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MAIN=$(free_port); start "$MAIN"
NODES=()
for _ in 1 2 3; do
  p=$(free_port); start "$p"; NODES+=("redis://127.0.0.1:$p")
  # Fresh nodes: mark them new so they vote at once (see the quarantine in src/lock/redlock.rs).
  redis-cli -p "$p" SET shardstock:redlock:quarantine 0 >/dev/null
done
LOCK_NODES=$(IFS=,; echo "${NODES[*]}")

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
