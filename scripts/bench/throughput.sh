#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR/../lib
# Suite throughput: the script ceiling, the peers (bare script, PostgreSQL hot row) and every engine configuration, with the ratios
# Tables: docs/benchmarks.md "Throughput vs the Redis ceiling" (the run tables and their ratios), the runs quoted in "Exactly-once against the bare script"
# Needs: redis-server redis-cli redis-benchmark python3 cargo
# Time: ~3 min after the build on a quiet 2-core machine, up to ~9 with the cores busy; SCALE=0.01 CEILING_REQUESTS=20000 PG_SECONDS=2: ~15 s
#
# 1. Starts its own redis-server on a free loopback port.
# 2. Measures the ceiling: redis-benchmark running EVALSHA of the selling script for a lone
#    request (src/scripts/prelude.lua + sell.lua, a batch of one, loaded with SCRIPT LOAD), 50
#    clients, pipeline 64, against a segment hash written by the real load_segment.lua, with a
#    random user and request id per call (scripts/lib/sell_bench.sh), so every call is a new
#    buyer's one-unit sale, not a replay.
# 3. Peer: the usual bare check-and-DECRBY script on one key through fred
#    (examples/bare_script.rs, the engine's client settings), 64 and 256 tasks.
#    Then the library alone (examples/embedded_rate.rs, no harness either): coalesced on Redis,
#    one segment, 64 and 256 tasks; and the embedded store at 1 and 16 segments.
# 4. Runs `shardstock sim --json` for lua (coalescing off and on) and lock at 1 and 16 segments
#    and for the embedded store, each with enough requests for a few seconds, never selling out;
#    then the sold-out storm (16 units, 800k buyers, coalesced, 1 segment, 256 buyers) on Redis
#    and on the embedded store.
# 5. Peer: PostgreSQL's hot row — a throwaway cluster (initdb in a temp dir, loopback, free
#    port, fsync default), `pgbench -n -c 64 -j 2 -T 10` of one
#    `UPDATE stock SET n = n - 1 WHERE id = 1 AND n >= 1`; removed on exit. Installs Debian's
#    `postgresql` with apt-get when initdb is missing and the script runs as root (else n/a).
# 6. Prints a Markdown table — throughput, ratio to the ceiling, p50/p99, Redis CPU µs per
#    deduction (redis-server main-thread CPU over the row, INFO cpu, ÷ units sold; ÷
#    requests for the storm and the bare script), client CPU µs per request (getrusage of the
#    child) and requests per script call — and every ratio with its target.
#    Every sale is a new buyer's under the per-user limit 1 (the engine's default), except the
#    ceiling's lone-request script (no limit: see the batch-cost suite for a coalesced call
#    under a limit).
#
# Usage: scripts/bench.sh throughput [SCALE]   (SCALE multiplies every request count; default 1,
#        or the environment's SCALE)
#        CEILING_REQUESTS=N overrides the redis-benchmark call count (default 1,000,000);
#        PG_SECONDS=N the pgbench duration (default 10; 0 skips PostgreSQL).
set -euo pipefail
. "$(dirname "$0")/../lib/harness.sh"
. "$(dirname "$0")/../lib/sell_bench.sh"
harness_init
SCALE=${1:-${SCALE:-1}}
CEILING_REQUESTS=${CEILING_REQUESTS:-1000000}
PG_SECONDS=${PG_SECONDS:-10}
need redis-server redis-cli redis-benchmark python3
build_release --features cli --bins --example bare_script --example embedded_rate
BIN=$RELEASE/shardstock
BARE=$RELEASE/examples/bare_script
LIB=$RELEASE/examples/embedded_rate
DIR=$WORK

redis_start
PORT=$REDIS_PORT
CLI=(redis-cli -p "$PORT")
URL=$REDIS_URL

# --- the ceiling ------------------------------------------------------------------------------
sell_compose . "$DIR/sell.lua"
SHA=$("${CLI[@]}" -x SCRIPT LOAD < "$DIR/sell.lua")
SEG='ceil:{ceiling#0}:seg'
HF=$(sell_home_fn .)
# The real load_segment.lua: generation 1, stock far beyond the call count, no limit, outbox off.
sell_load_lua . "$DIR/load.lua"
loaded=$(sell_load_segment "$DIR/load.lua" "$SEG" 999999999999 "$HF" "${CLI[@]}" | head -1)
[ "$loaded" = ok ] || { echo "load_segment.lua answered '$loaded', not 'ok'"; exit 1; }
CEIL_CSV=$(sell_ceiling_csv "$PORT" "$SHA" "$SEG" "$HF" "$CEILING_REQUESTS")
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


# Runs a command whose stdout is one JSON object; prints that object with "_cpu_s" added: the
# child's user + system CPU seconds (getrusage RUSAGE_CHILDREN delta). Fails as the child fails.
measure() {
  python3 -c '
import json, resource, subprocess, sys
t = lambda r: r.ru_utime + r.ru_stime
before = t(resource.getrusage(resource.RUSAGE_CHILDREN))
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, text=True)
cpu = t(resource.getrusage(resource.RUSAGE_CHILDREN)) - before
if p.returncode != 0:
    sys.stderr.write(p.stdout)
    sys.exit(p.returncode)
d = json.loads(p.stdout)
d["_cpu_s"] = cpu
print(json.dumps(d))
' "$@"
}
# --- the peer: the bare script through fred ---------------------------------------------------
RESULTS="$DIR/results.jsonl"
add_row() { # json name conc redis_usec
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["_name"]=sys.argv[2]; d["_conc"]=int(sys.argv[3]); d["_usec"]=None if sys.argv[4]=="-" else int(sys.argv[4]); d.setdefault("segments", 1); print(json.dumps(d))' \
    "$1" "$2" "$3" "$4" >> "$RESULTS"
  echo "throughput: $2 ${segments:-1} seg $3 tasks done after ${SECONDS}s" >&2
}
for conc in 64 256; do
  requests=$(python3 -c "print(int(300000 * $SCALE))")
  u0=$(redis_cpu_usec)
  out=$(measure "$BARE" --url "$URL" --tasks "$conc" --requests "$requests" --key "bare:{$conc}" --json)
  add_row "$out" bare "$conc" $(($(redis_cpu_usec) - u0))
  "${CLI[@]}" FLUSHALL >/dev/null
done

# --- the library alone (examples/embedded_rate.rs: no harness, like the bare script) -----------
# Coalesced on Redis, one hot segment; and on the embedded store. The sim rows below carry the
# CLI's harness (ids formatted, a latency histogram and per-user tallies per request).
for conc in 64 256; do
  requests=$(python3 -c "print(int(300000 * $SCALE))")
  u0=$(redis_cpu_usec)
  out=$(measure "$LIB" "$requests" "$conc" 1 "$URL" --json)
  segments=1 add_row "$out" lib-coalesced "$conc" $(($(redis_cpu_usec) - u0))
  "${CLI[@]}" FLUSHALL >/dev/null
done
# The same at a tenth of the requests: does the store slow down as the records it keeps grow?
requests=$(python3 -c "print(int(30000 * $SCALE))")
u0=$(redis_cpu_usec)
out=$(measure "$LIB" "$requests" 256 1 "$URL" --json)
segments=1 add_row "$out" lib-coalesced-small 256 $(($(redis_cpu_usec) - u0))
"${CLI[@]}" FLUSHALL >/dev/null
for segments in 1 16; do
  requests=$(python3 -c "print(int(2000000 * $SCALE))")
  out=$(measure "$LIB" "$requests" 64 "$segments" --json)
  add_row "$out" lib-embedded 64 -
done
unset segments

# --- the engine -------------------------------------------------------------------------------
# name strategy segments concurrency requests (before SCALE) stock (- = twice the requests)
CONFIGS=(
  "lua lua 1 64 300000 -"
  "lua lua 16 64 300000 -"
  "lua lua 1 256 300000 -"
  "lua lua 16 256 300000 -"
  "lua-coalesced lua 1 64 300000 -"
  "lua-coalesced lua 16 64 300000 -"
  "lua-coalesced lua 1 256 300000 -"
  "lua-coalesced lua 16 256 300000 -"
  "lock lock 1 64 15000 -"
  "lock lock 16 64 60000 -"
  "storm lua 1 256 800000 16"
  "embedded - 1 64 2000000 -"
  "embedded - 16 64 2000000 -"
  "storm-embedded - 1 256 800000 16"
)
for c in "${CONFIGS[@]}"; do
  read -r name strategy segments conc requests stock <<<"$c"
  requests=$(python3 -c "print(int($requests * $SCALE))")
  [ "$stock" = - ] && stock=$((requests * 2))
  args=(sim --sku "bench-$name-$segments-$conc" --stock "$stock" --segments "$segments"
    --users "$requests" --requests "$requests" --concurrency "$conc" --per-user-limit 1 --json)
  if [ "${name#storm-}" = embedded ]; then
    out=$(measure env -u SHARDSTOCK_STORE__REDIS_URL "$BIN" "${args[@]}")
    add_row "$out" "$name" "$conc" -
  else
    coalesce=off
    case $name in lua-coalesced | storm) coalesce=on ;; esac
    u0=$(redis_cpu_usec)
    out=$(measure "$BIN" --redis "$URL" "${args[@]}" --coalesce "$coalesce" --strategy "$strategy")
    add_row "$out" "$name" "$conc" $(($(redis_cpu_usec) - u0))
    "${CLI[@]}" FLUSHALL >/dev/null # records of the last run would only cost memory
  fi
done

# --- the peer: PostgreSQL's hot row -----------------------------------------------------------
PG="n/a"
pg_find
if [ "$PG_SECONDS" != 0 ] && [ -z "$PGBIN" ] && [ "$(id -u)" = 0 ]; then
  echo "installing PostgreSQL (apt-get install -y postgresql) for the hot-row peer" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null 2>&1 || true
  pg_find
fi
if [ "$PG_SECONDS" != 0 ] && [ -n "$PGBIN" ] && [ -x "$PGBIN/pgbench" ]; then
  pg_init
  pg_start
  PSQL=("$PGBIN/psql" -X -q "${PG_CONN[@]}")
  "${PSQL[@]}" -c 'CREATE TABLE stock (id int PRIMARY KEY, n bigint); INSERT INTO stock VALUES (1, 1000000000000)'
  echo 'UPDATE stock SET n = n - 1 WHERE id = 1 AND n >= 1;' > "$DIR/hot_row.sql"
  chmod 644 "$DIR/hot_row.sql"
  PGOUT=$("$PGBIN/pgbench" -n -c 64 -j 2 -T "$PG_SECONDS" -f "$DIR/hot_row.sql" \
    -h 127.0.0.1 -p "$PGPORT" -U postgres postgres 2>&1)
  PG=$(grep -m1 '^tps = ' <<<"$PGOUT" | sed -E 's/^tps = ([0-9.]+).*/\1/')
  PGTX=$(grep -m1 'number of transactions actually processed' <<<"$PGOUT" | sed -E 's/.*: ([0-9]+).*/\1/')
  PGSOLD=$("${PSQL[@]}" -At -c 'SELECT 1000000000000 - n FROM stock WHERE id = 1')
  PGVER=$("$PGBIN/postgres" --version | grep -o '[0-9][0-9.]*' | head -1)
  pg_stop
  python3 -c 'import json,sys; print(json.dumps({"_name":"postgres","_conc":64,"_usec":None,"segments":1,"requests":int(sys.argv[2]),"sold_units":int(sys.argv[3]),"throughput_per_s":float(sys.argv[1]),"_version":sys.argv[4]}))' \
    "$PG" "${PGTX:-0}" "${PGSOLD:-0}" "$PGVER" >> "$RESULTS"
fi

CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)
python3 - "$RESULTS" "$CEIL" "$SOLD" "$CEILING_REQUESTS" "${USEC:-?}" "$(date -u '+%Y-%m-%d %H:%M UTC')" \
  "$(nproc) cores${CPU:+ ($CPU)}, $(free -g | awk '/Mem:/{print $2}') GiB, $(. /etc/os-release && echo "$PRETTY_NAME"), redis-server $(redis_version)" \
  "$PG_SECONDS" "$SCALE" <<'PY'
import json, sys
path, ceil, sold, n, usec, when, machine, pg_seconds, scale = sys.argv[1:]
ceil = float(ceil)
rows = [json.loads(l) for l in open(path)]
print(f"Run {when} on {machine}, loopback; every client, redis-benchmark, redis-server and "
      f"PostgreSQL share the cores.\n")
print(f"Ceiling: redis-benchmark EVALSHA sell (prelude + sell.lua, a lone request), 50 clients, -P 64, "
      f"{int(n):,} calls, random user and request id per call: **{ceil:,.0f}/s** ({int(sold):,} units sold by it; "
      f"{usec} µs per call inside Redis by INFO commandstats).\n")
NAMES = {
    "bare": "bare script via fred (peer)",
    "embedded": "embedded (memory)",
    "storm": "sold-out storm, lua-coalesced",
    "storm-embedded": "sold-out storm, embedded",
    "lib-coalesced": "library alone, lua-coalesced (no harness)",
    "lib-coalesced-small": "library alone, lua-coalesced (no harness), a tenth of the requests",
    "lib-embedded": "library alone, embedded (no harness)",
}
print("| configuration | segments | concurrency | requests | sold | oversold | audit | throughput "
      "| × ceiling | p50 | p99 | Redis CPU µs per deduction | client CPU µs per request "
      "| requests per script call |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
def fmt_ms(d, k):
    return f"{d[k]:.3f} ms" if k in d else "—"
for d in rows:
    name = d["_name"]
    if name == "postgres":
        label = f"PostgreSQL {d['_version']} hot row, pgbench (peer)"
    else:
        label = NAMES.get(name, name)
    audit = ("ok" if d["audit_ok"] else "FAILED") if "audit_ok" in d else "—"
    co = d.get("coalescing")
    batch = f"{co['mean_batch']:.1f}" if co else "—"
    storm = name.startswith("storm") or name == "bare"
    per = d["requests"] if storm else d["sold_units"]
    rus = f"{d['_usec'] / per:.2f}" if d.get("_usec") is not None and per else "—"
    cpu = f"{d['_cpu_s'] * 1e6 / d['requests']:.2f}" if "_cpu_s" in d else "—"
    ovs = d.get("oversold", "—")
    print(f"| {label} | {d['segments']} | {d['_conc']} | {d['requests']:,} | {d['sold_units']:,} | "
          f"{ovs} | {audit} | {d['throughput_per_s']:,.0f}/s | "
          f"{d['throughput_per_s'] / ceil:.3f}× | {fmt_ms(d, 'p50_ms')} | {fmt_ms(d, 'p99_ms')} | "
          f"{rus} | {cpu} | {batch} |")
rowof = {(d["_name"], d["segments"], d["_conc"]): d for d in rows}
by = {k: d["throughput_per_s"] for k, d in rowof.items()}
def ratio(a, b):
    return by[a] / by[b] if a in by and b in by and by[b] else None
def x(v):
    return f"{v:.2f}×" if v is not None else "n/a"
def met(v, ok):
    return "n/a" if v is None else ("met" if ok(v) else "MISSED")
best_lua = max((v for (k, _, _), v in by.items() if k == "lua"), default=0)
best_co = max((v for (k, _, _), v in by.items() if k == "lua-coalesced"), default=0)
emb = max((v for (k, _, _), v in by.items() if k in ("embedded", "lib-embedded")), default=0)
best_redis = max(best_lua, best_co)
print()
print("Exactly-once against the bare script (every ratio from this run):\n")
for conc, want in ((64, 1.0), (256, 1.5)):
    v = ratio(("lib-coalesced", 1, conc), ("bare", 1, conc))
    print(f"- library alone (no harness, as the bare script), lua-coalesced 1 seg / bare script, "
          f"{conc} tasks: {x(v)} (target ≥ {want}×: {met(v, lambda v: v >= want)})")
small = ratio(("lib-coalesced-small", 1, 256), ("bare", 1, 256))
big = ratio(("lib-coalesced", 1, 256), ("bare", 1, 256))
print(f"- the same ratio at {int(30000 * float(scale)):,} requests: {x(small)}, at "
      f"{int(300000 * float(scale)):,}: {x(big)} (target: the same; "
      f"{met(big / small if big and small else None, lambda v: v >= 0.9)} at ≥ 0.9 of it)")
lc = rowof.get(("lib-coalesced", 1, 256))
if lc:
    rus = lc["_usec"] / lc["sold_units"] if lc["sold_units"] else None
    cpu = lc["_cpu_s"] * 1e6 / lc["requests"]
    print(f"- library alone, lua-coalesced 1 seg 256 tasks (batch {lc['coalescing']['mean_batch']:.1f}): "
          f"Redis CPU {rus:.2f} µs per deduction (target ≤ 2 µs: {met(rus, lambda v: v <= 2)}), client CPU "
          f"{cpu:.2f} µs per request (target ≤ 3 µs: {met(cpu, lambda v: v <= 3)})")
print()
print("Other ratios:\n")
for conc in (64, 256):
    v = ratio(("lua-coalesced", 1, conc), ("bare", 1, conc))
    print(f"- lua-coalesced 1 seg (sim, with its harness) / bare script via fred, {conc} tasks: {x(v)}")
co = rowof.get(("lua-coalesced", 1, 256))
if co:
    rus = co["_usec"] / co["sold_units"] if co["sold_units"] else None
    cpu = co["_cpu_s"] * 1e6 / co["requests"]
    print(f"- lua-coalesced 1 seg 256 buyers (sim, batch {co['coalescing']['mean_batch']:.1f}): "
          f"Redis CPU {rus:.2f} µs per deduction, client CPU {cpu:.2f} µs per request (harness included)")
v = ratio(("storm", 1, 256), ("lua-coalesced", 1, 256))
print(f"- sold-out storm / own sale (lua-coalesced 1 seg 256 buyers): {x(v)} (target ≥ 10×: "
      f"{met(v, lambda v: v >= 10)})")
se = by.get(("storm-embedded", 1, 256))
if se is not None:
    print(f"- sold-out storm in-process (embedded): {se:,.0f} answers/s (target ≥ 1,000,000/s: "
          f"{met(se, lambda v: v >= 1e6)})")
pg = by.get(("postgres", 1, 64))
if pg:
    v = best_redis / pg
    print(f"- best shardstock on Redis / PostgreSQL hot row: {x(v)} ({best_redis:,.0f}/s vs {pg:,.0f} tps; "
          f"target ≥ 10×: {met(v, lambda v: v >= 10)})")
else:
    print("- best shardstock / PostgreSQL hot row: n/a (PostgreSQL not run"
          f"{'' if pg_seconds != '0' else ': PG_SECONDS=0'})")
v = ratio(("lock", 16, 64), ("lock", 1, 64))
print(f"- lock 16 seg / lock 1 seg: {x(v)} (target ≥ 10×: {met(v, lambda v: v >= 10)})")
print(f"- embedded (best, the library alone or sim): {emb:,.0f}/s (target ≥ 5,000,000/s: {met(emb, lambda v: v >= 5e6)})")
print()
print(f"- lua (best) / ceiling: {best_lua / ceil:.2f}× (target ≥ 0.5×)")
print(f"- lua 16 seg / lock 16 seg: {x(ratio(('lua', 16, 64), ('lock', 16, 64)))} (target ≥ 5×)")
print(f"- lua with coalescing (best) / ceiling: {best_co / ceil:.2f}× (target ≥ 1.5×); "
      f"vs lua without, same run: {best_co / best_lua:.2f}×" if best_lua else "- no lua rows")
PY
