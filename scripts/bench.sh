#!/usr/bin/env bash
# Throughput against the Redis ceiling, in one run (issue 7).
#
# 1. Starts its own redis-server on a free loopback port.
# 2. Measures the ceiling: redis-benchmark running EVALSHA of the single-request deduct script
#    (src/scripts/prelude.lua + deduct_core.lua + deduct.lua, loaded with SCRIPT LOAD), 50 clients,
#    pipeline 64, against a segment hash prepared like load_segment.lua does, with a random
#    request id per call (__rand_int__), so every call is a new one-unit sale, not a replay.
# 3. Runs `shardstock sim --json` for lua (coalescing off and on) and lock at 1 and 16 segments
#    and for the embedded store, each with enough requests for a few seconds, never selling out.
# 4. Prints a Markdown table: throughput, ratio to the ceiling, p50/p99.
#
# Usage: scripts/bench.sh [SCALE]   (SCALE multiplies every request count; default 1)
#        CEILING_REQUESTS=N overrides the redis-benchmark call count (default 1,000,000).
set -euo pipefail
cd "$(dirname "$0")/.."
SCALE=${1:-1}
CEILING_REQUESTS=${CEILING_REQUESTS:-1000000}
for b in redis-server redis-cli redis-benchmark python3; do
  command -v "$b" >/dev/null || { echo "$b missing (scripts/test.sh installs redis)"; exit 1; }
done
cargo build --release --quiet
BIN=target/release/shardstock
DIR=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --maxmemory-policy noeviction \
  --dir "$DIR" --logfile "$DIR/redis.log" >/dev/null 2>&1 &
PID=$!
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-cli -p "$PORT" ping >/dev/null || { echo "redis-server did not start"; exit 1; }
CLI=(redis-cli -p "$PORT")
URL="redis://127.0.0.1:$PORT"

# --- the ceiling ------------------------------------------------------------------------------
cat src/scripts/prelude.lua src/scripts/deduct_core.lua src/scripts/deduct.lua > "$DIR/deduct.lua"
SHA=$("${CLI[@]}" -x SCRIPT LOAD < "$DIR/deduct.lua")
SEG='ceil:{ceiling#0}:seg'
# Exactly the fields load_segment.lua writes, generation 1, stock far beyond the call count.
"${CLI[@]}" HSET "$SEG" gen 1 stock 999999999999 loaded 999999999999 restocked 0 sold 0 reserved 0 >/dev/null
# Sanity: one call must apply.
probe=$("${CLI[@]}" EVALSHA "$SHA" 3 "$SEG" 'ceil:{ceiling#0}:g1:rq:probe' 'ceil:{ceiling#0}:g1:resv' \
  1 u1 1 0 600000 5000 1 lua 0 0 | head -1)
[ "$probe" = applied ] || { echo "deduct script probe answered '$probe', not 'applied'"; exit 1; }
# KEYS: segment, request record (random id per call), reservation index.
# ARGV: gen user qty index ttl_ms lease_ms claim mode fence resv_ttl_ms
CEIL_CSV=$(redis-benchmark -p "$PORT" -c 50 -P 64 -n "$CEILING_REQUESTS" -r 100000000000 --csv \
  EVALSHA "$SHA" 3 "$SEG" 'ceil:{ceiling#0}:g1:rq:__rand_int__' 'ceil:{ceiling#0}:g1:resv' \
  1 u1 1 0 600000 5000 1 lua 0 0)
SOLD=$("${CLI[@]}" HGET "$SEG" sold)
# Time spent inside Redis per script call (where the ceiling comes from).
USEC=$("${CLI[@]}" INFO commandstats | tr -d '\r' | grep '^cmdstat_evalsha:' | sed -E 's/.*usec_per_call=([0-9.]+).*/\1/')
CEIL=$(python3 - "$CEIL_CSV" <<'PY'
import csv, io, sys
rows = list(csv.reader(io.StringIO(sys.argv[1])))
print(rows[-1][1])
PY
)
"${CLI[@]}" FLUSHALL >/dev/null

# --- the engine -------------------------------------------------------------------------------
# name strategy segments concurrency requests (before SCALE)
CONFIGS=(
  "lua lua 1 64 300000"
  "lua lua 16 64 300000"
  "lua lua 1 256 300000"
  "lua lua 16 256 300000"
  "lua-coalesced lua 1 64 300000"
  "lua-coalesced lua 16 64 300000"
  "lua-coalesced lua 1 256 300000"
  "lua-coalesced lua 16 256 300000"
  "lock lock 1 64 15000"
  "lock lock 16 64 60000"
  "embedded - 1 64 2000000"
  "embedded - 16 64 2000000"
)
RESULTS="$DIR/results.jsonl"
for c in "${CONFIGS[@]}"; do
  read -r name strategy segments conc requests <<<"$c"
  requests=$(python3 -c "print(int($requests * $SCALE))")
  args=(sim --sku "bench-$name-$segments-$conc" --stock $((requests * 2)) --segments "$segments"
    --users "$requests" --requests "$requests" --concurrency "$conc" --per-user-limit 0 --json)
  if [ "$name" = embedded ]; then
    out=$(env -u SHARDSTOCK_STORE__REDIS_URL "$BIN" "${args[@]}")
  else
    coalesce=off
    [ "$name" = lua-coalesced ] && coalesce=on
    out=$("$BIN" --redis "$URL" --coalesce "$coalesce" "${args[@]}" --strategy "$strategy")
    "${CLI[@]}" FLUSHALL >/dev/null # records of the last run would only cost memory
  fi
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["_name"]=sys.argv[2]; d["_conc"]=int(sys.argv[3]); print(json.dumps(d))' \
    "$out" "$name" "$conc" >> "$RESULTS"
done

CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)
python3 - "$RESULTS" "$CEIL" "$SOLD" "$CEILING_REQUESTS" "${USEC:-?}" "$(date -u '+%Y-%m-%d %H:%M UTC')" \
  "$(nproc) cores${CPU:+ ($CPU)}, $(free -g | awk '/Mem:/{print $2}') GiB, $(. /etc/os-release && echo "$PRETTY_NAME"), redis-server $(redis-server --version | grep -o 'v=[^ ]*' | cut -c3-)" <<'PY'
import json, sys
path, ceil, sold, n, usec, when, machine = sys.argv[1:]
ceil = float(ceil)
rows = [json.loads(l) for l in open(path)]
print(f"Run {when} on {machine}, loopback; sim, redis-benchmark and redis-server share the cores.\n")
print(f"Ceiling: redis-benchmark EVALSHA deduct (prelude + deduct_core + deduct.lua), 50 clients, -P 64, "
      f"{int(n):,} calls, random request id per call: **{ceil:,.0f}/s** ({int(sold):,} units sold by it; "
      f"{usec} µs per call inside Redis by INFO commandstats).\n")
print("| configuration | segments | concurrency | requests | sold | oversold | audit | throughput | × ceiling | p50 | p99 | requests per script call |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for d in rows:
    name = d["_name"] if d["_name"] != "embedded" else "embedded (memory)"
    audit = "ok" if d["audit_ok"] else "FAILED"
    co = d.get("coalescing")
    batch = f"{co['mean_batch']:.1f}" if co else "—"
    print(f"| {name} | {d['segments']} | {d['_conc']} | {d['requests']:,} | {d['sold_units']:,} | "
          f"{d['oversold']} | {audit} | {d['throughput_per_s']:,.0f}/s | "
          f"{d['throughput_per_s'] / ceil:.3f}× | {d['p50_ms']:.3f} ms | {d['p99_ms']:.3f} ms | "
          f"{batch} |")
by = {(d["_name"], d["segments"], d["_conc"]): d["throughput_per_s"] for d in rows}
def r(a, b):
    return f"{by[a] / by[b]:.2f}×" if a in by and b in by and by[b] else "n/a"
best_lua = max((v for (k, _, _), v in by.items() if k == "lua"), default=0)
best_co = max((v for (k, _, _), v in by.items() if k == "lua-coalesced"), default=0)
emb = max((v for (k, _, _), v in by.items() if k == "embedded"), default=0)
print()
print(f"- lua (best) / ceiling: {best_lua / ceil:.2f}× (target ≥ 0.5×)")
print(f"- lock 16 seg / lock 1 seg: {r(('lock', 16, 64), ('lock', 1, 64))} (target ≥ 10×)")
print(f"- lua 16 seg / lock 16 seg: {r(('lua', 16, 64), ('lock', 16, 64))} (target ≥ 5×)")
print(f"- embedded (best): {emb:,.0f}/s (target ≥ 5,000,000/s)")
print(f"- lua with coalescing (best) / ceiling: {best_co / ceil:.2f}× (target ≥ 1.5×); "
      f"vs lua without, same run: {best_co / best_lua:.2f}×" if best_lua else "- no lua rows")
PY
