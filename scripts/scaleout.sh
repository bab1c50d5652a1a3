#!/usr/bin/env bash
# Scale-out figures: the same sale on 1, 2 and 3 masters, measured where it scales.
#
# On a 2-core box more masters cannot add throughput (client and servers share the cores), so
# this measures what does scale, per master count:
#   - the Redis-side cost of the sale on each master (INFO commandstats: calls and µs inside
#     Redis; INFO cpu: CPU seconds), and the spread: busiest master ÷ mean (goal ≤ 1.15);
#   - the segments per master (`shardstock status`);
#   - each master's script ceiling alone (redis-benchmark EVALSHA of the selling script for a
#     lone request, prelude + sell.lua, 50 clients, pipeline 64, a new user and request id per
#     call — see scripts/lib/sell_bench.sh — against a segment written by the real
#     load_segment.lua under a hash tag that master serves), and their sum: the projected
#     capacity when every master has a core of its own.
# The sale: shardstock sim --stock 100000 --segments 16 --users 200000 --requests 200000
# --per-user-limit 0 --concurrency 64 --coalesce on (SIM_ARGS overrides).
#
# Usage: scripts/scaleout.sh [MASTER COUNTS...]   (default: 1 2 3; ports from 7300 + 10 × masters,
#        or the next free block of ports when those, or their cluster bus ports, are taken)
set -euo pipefail
cd "$(dirname "$0")/.."
COUNTS=("${@:-1 2 3}")
read -r -a COUNTS <<< "${COUNTS[*]}"
SIM_ARGS=${SIM_ARGS:-"--stock 100000 --segments 16 --users 200000 --requests 200000 --per-user-limit 0 --concurrency 64 --coalesce on"}
CEILING_REQUESTS=${CEILING_REQUESTS:-500000}
for b in redis-server redis-cli redis-benchmark python3; do
  command -v "$b" >/dev/null || { echo "$b missing (scripts/test.sh installs redis)"; exit 1; }
done
cargo build --release --quiet --features cli
BIN=target/release/shardstock
OUT=$(mktemp -d)
trap 'for d in "$OUT"/c*; do [ -d "$d/cluster" ] && CLUSTER_DIR="$d/cluster" scripts/cluster.sh stop >/dev/null 2>&1; done; rm -rf "$OUT"' EXIT
. scripts/lib/sell_bench.sh
sell_compose . "$OUT/sell.lua"
sell_load_lua . "$OUT/load.lua"
HF=$(sell_home_fn .)
# A block of N ports from $1 on whose cluster bus ports (+10000) are free too.
free_block() { # $1 = first candidate, $2 = N
  python3 - "$1" "$2" <<'PY'
import socket, sys
p, n = int(sys.argv[1]), int(sys.argv[2])
def free(q):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", q)); return True
    except OSError:
        return False
    finally:
        s.close()
while not all(free(q) and free(q + 10000) for q in range(p, p + n)):
    p += 100
    if p + n > 55535: sys.exit("no free port block")
print(p)
PY
}

for m in "${COUNTS[@]}"; do
  d="$OUT/c$m"; mkdir -p "$d"
  export CLUSTER_DIR="$d/cluster" CLUSTER_PORT=$(free_block $((7300 + 10 * m)) "$m") REPLICAS=0
  scripts/cluster.sh start "$m" > "$d/start.txt"
  url=$(cat "$CLUSTER_DIR/url")
  ports=$(cat "$CLUSTER_DIR/ports")
  for p in $ports; do
    redis-cli -p "$p" CONFIG RESETSTAT >/dev/null
    redis-cli -p "$p" INFO cpu | tr -d '\r' > "$d/cpu0.$p"
  done
  # shellcheck disable=SC2086
  "$BIN" sim --redis "$url" $SIM_ARGS --json > "$d/sim.json"
  for p in $ports; do
    redis-cli -p "$p" INFO commandstats | tr -d '\r' > "$d/cmd.$p"
    redis-cli -p "$p" INFO cpu | tr -d '\r' > "$d/cpu1.$p"
  done
  "$BIN" status --redis "$url" --sku "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["sku"])' "$d/sim.json")" --json > "$d/status.json"
  # Each master's ceiling alone: a segment hash on that master (a tag whose slot it serves).
  for p in $ports; do
    sha=$(redis-cli -p "$p" -x SCRIPT LOAD < "$OUT/sell.lua")
    # The first tag whose slot this master serves (load_segment.lua elsewhere answers MOVED).
    k=0
    until [ "$(sell_load_segment "$OUT/load.lua" "ceil:{ceil.$k#0}:seg" 999999999999 "$HF" \
        redis-cli -p "$p" | head -1)" = ok ]; do
      k=$((k + 1))
      [ "$k" -lt 100000 ] || { echo "load_segment.lua never answered ok on $p: $(sell_load_segment \
        "$OUT/load.lua" "ceil:{ceil.0#0}:seg" 999999999999 "$HF" redis-cli -p "$p" | head -3)" >&2; exit 1; }
    done
    sell_keys_args "ceil:{ceil.$k#0}:seg" "$HF" 1 600000
    probe=$(redis-cli -p "$p" EVALSHA "$sha" "${#SELL_KEYS[@]}" "${SELL_KEYS[@]//__rand_int__/probe}" \
      "${SELL_ARGS[@]//__rand_int__/probe}" 2>&1 | head -1)
    sell_probe_ok "$probe" || { echo "sell script probe on $p answered '$probe'" >&2; exit 1; }
    redis-benchmark -p "$p" -c 50 -P 64 -n "$CEILING_REQUESTS" -r 100000000000 --csv \
      EVALSHA "$sha" "${#SELL_KEYS[@]}" "${SELL_KEYS[@]}" "${SELL_ARGS[@]}" > "$d/ceil.$p"
  done
  CLUSTER_DIR="$CLUSTER_DIR" scripts/cluster.sh stop >/dev/null
done

python3 - "$OUT" "${COUNTS[@]}" <<'PY'
import csv, io, json, os, re, sys
out, counts = sys.argv[1], sys.argv[2:]
def stats(path):
    calls = usec = 0
    evalsha = 0
    for line in open(path):
        m = re.match(r'cmdstat_(\w+):calls=(\d+),usec=(\d+)', line)
        if m:
            calls += int(m[2]); usec += int(m[3])
            if m[1] == 'evalsha': evalsha = int(m[2])
    return calls, usec, evalsha
def cpu(path):
    v = dict(l.strip().split(':', 1) for l in open(path) if ':' in l)
    return float(v['used_cpu_user']) + float(v['used_cpu_sys'])
print("| masters | sold / oversold / audit | req/s | p99 ms | segments per master | EVALSHA calls per master | Redis µs per master | spread (max ÷ mean µs) | Redis CPU s (sum) | ceiling per master (calls/s) | projected capacity |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for m in counts:
    d = os.path.join(out, f"c{m}")
    ports = open(os.path.join(d, "cluster", "ports")).read().split() if os.path.exists(os.path.join(d, "cluster", "ports")) else sorted({f.split('.')[1] for f in os.listdir(d) if f.startswith('cmd.')})
    sim = json.load(open(os.path.join(d, "sim.json")))
    st = json.load(open(os.path.join(d, "status.json")))
    per = {}
    for h in st.get("placement") or []:
        per[h["master"].rsplit(':', 1)[-1]] = per.get(h["master"].rsplit(':', 1)[-1], 0) + 1
    rows = [(p, *stats(os.path.join(d, f"cmd.{p}")), cpu(os.path.join(d, f"cpu1.{p}")) - cpu(os.path.join(d, f"cpu0.{p}"))) for p in ports]
    us = [r[2] for r in rows]
    spread = max(us) / (sum(us) / len(us)) if sum(us) else float('nan')
    ceil = []
    for p in ports:
        r = list(csv.reader(io.StringIO(open(os.path.join(d, f"ceil.{p}")).read())))
        ceil.append(float(r[-1][1]))
    print(f"| {m} | {sim['sold']} / {sim['oversold']} / {'ok' if sim['audit_ok'] else 'FAILED'} "
          f"| {sim['throughput_per_s']:,.0f} | {sim['p99_ms']:.1f} "
          f"| {' / '.join(str(per.get(p, 0)) for p in ports)} "
          f"| {' / '.join(f'{r[3]:,}' for r in rows)} | {' / '.join(f'{r[2]/1e3:,.0f}k' for r in rows)} "
          f"| {spread:.2f} | {sum(r[4] for r in rows):.1f} "
          f"| {' / '.join(f'{c:,.0f}' for c in ceil)} | {sum(ceil):,.0f} |")
PY
