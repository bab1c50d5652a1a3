#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR/../lib
# Suite outbox: what the outbox costs — µs inside Redis and req/s with and without it, and the consumer's events/s into PostgreSQL
# Tables: docs/benchmarks.md "The outbox"
# Needs: redis-server redis-cli python3 cargo
# Time: ~2.5 min after the build with the defaults (24 sims of 100,000 requests, 4 drains into PostgreSQL); REQUESTS=2000 REPS=1 PG_UNITS=1000 PG_REPS=1: ~5 s
#
# 1. Starts its own redis-server (no persistence) on a free loopback port.
# 2. Redis side: for coalescing off and on, with and without the outbox, loads a SKU that never
#    sells out (`shardstock load --per-user-limit 0 [--outbox]`), resets the command statistics
#    (CONFIG RESETSTAT), runs `shardstock sim --skip-load --json` (strategy lua, one unit per
#    request), and reads
#      - µs inside Redis per deduction: (cmdstat_evalsha + cmdstat_eval usec) ÷ requests — the
#        whole script run, its XADD included (one coalesced call carries many deductions, hence
#        per deduction, not per call);
#      - Redis CPU µs per deduction: the main thread's user+sys CPU time (INFO cpu) over the run
#        ÷ requests — everything Redis did for the sale (network, parsing, scripts), and unlike
#        the commandstats figure not inflated when the OS preempts Redis mid-script on a busy
#        machine;
#      - XADDs per deduction (cmdstat_xadd calls ÷ requests: 1 with the outbox, 0 without) and
#        the XADD's own µs per deduction (cmdstat_xadd usec ÷ requests: Redis times the commands
#        a script calls too), the part of the script time the stream append itself takes;
#      - the sim's throughput_per_s (requests/s end to end, client included).
#    The four configurations run interleaved, REPS times (the machine may be noisy), FLUSHALL
#    between runs.
# 3. Consumer side: starts a throwaway PostgreSQL (initdb into a temporary directory, trust
#    authentication, loopback TCP only; as root it runs as the `postgres` OS user), twice: with
#    fsync=on (the default durability: every commit flushed to disk) and with fsync=off. For
#    each, PG_REPS times interleaved: a sale of PG_UNITS units with the outbox (PG_UNITS requests
#    of one unit, all applied, stock to spare), then `shardstock orders --postgres URL --until-idle --json` timed
#    from start to exit (connect, create the table, drain every stream, count the rows); events/s
#    = events handled ÷ that wall time. The orders table is dropped between runs.
# 4. Prints Markdown tables: every run, then the medians.
#
# Usage: scripts/bench.sh outbox   (env: REQUESTS=100000 SEGMENTS=16 CONCURRENCY=64 REPS=6
#        PG_UNITS=100000 PG_REPS=2; PG=0 skips the PostgreSQL part)
set -euo pipefail
. "$(dirname "$0")/../lib/harness.sh"
harness_init
REQUESTS=${REQUESTS:-100000}
SEGMENTS=${SEGMENTS:-16}
CONCURRENCY=${CONCURRENCY:-64}
REPS=${REPS:-6}
PG_UNITS=${PG_UNITS:-100000}
PG_REPS=${PG_REPS:-2}
PG=${PG:-1}
need redis-server redis-cli python3
pg_find
if [ "$PG" = 1 ] && [ ! -x "$PGBIN/initdb" ]; then
  echo "PostgreSQL missing (scripts/test.sh installs postgresql); PG=0 skips that part"; exit 1
fi
build_release --features cli
BIN=$RELEASE/shardstock
DIR=$WORK
redis_start
CLI=(redis-cli -p "$REDIS_PORT")
URL=$REDIS_URL
SS=("$BIN" --redis "$URL")

# "calls usec" of one command from INFO commandstats (0 0 when absent).
cmdstat() {
  "${CLI[@]}" INFO commandstats | tr -d '\r' | python3 -c '
import re, sys
name = sys.argv[1]
for l in sys.stdin:
    if l.startswith("cmdstat_" + name + ":"):
        m = dict(kv.split("=") for kv in l.split(":", 1)[1].strip().split(","))
        print(m["calls"], m["usec"]); break
else:
    print(0, 0)' "$1"
}

RUNS="$DIR/runs.tsv"
: > "$RUNS"
echo "Redis $(redis_version), $(nproc) cores;" \
  "sim: $REQUESTS requests of 1 unit, $SEGMENTS segments, concurrency $CONCURRENCY, strategy lua" >&2
for rep in $(seq "$REPS"); do
  for coalesce in off on; do
    for outbox in off on; do
      "${CLI[@]}" FLUSHALL >/dev/null
      ob=(); [ "$outbox" = on ] && ob=(--outbox)
      "${SS[@]}" load --sku cost --stock $((REQUESTS * 2)) --segments "$SEGMENTS" \
        --per-user-limit 0 "${ob[@]}" >/dev/null
      "${CLI[@]}" CONFIG RESETSTAT >/dev/null
      cpu0=$(redis_cpu_usec)
      out=$("${SS[@]}" sim --coalesce "$coalesce" --skip-load --sku cost --requests "$REQUESTS" \
        --users "$REQUESTS" --concurrency "$CONCURRENCY" --json)
      cpu1=$(redis_cpu_usec)
      read -r _ es_usec < <(cmdstat evalsha)
      read -r _ e_usec < <(cmdstat eval)
      read -r xadds x_usec < <(cmdstat xadd)
      python3 - "$out" "$es_usec" "$e_usec" "$xadds" "$coalesce" "$outbox" "$rep" "$cpu0" "$cpu1" "$x_usec" >> "$RUNS" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
usec = int(sys.argv[2]) + int(sys.argv[3])
cpu_us = float(sys.argv[9]) - float(sys.argv[8])
n = r["requests"]
assert r["applied"] == n and r["oversold"] == 0 and r["audit_ok"], r
print("\t".join(map(str, [sys.argv[5], sys.argv[6], sys.argv[7], n,
    round(usec / n, 3), round(cpu_us / n, 3), round(int(sys.argv[4]) / n, 3),
    round(int(sys.argv[10]) / n, 3),
    r["throughput_per_s"], r["p99_ms"]])))
PY
      tail -1 "$RUNS" >&2
    done
  done
done

PGRUNS="$DIR/pg.tsv"
: > "$PGRUNS"
if [ "$PG" = 1 ]; then
  pg_init
  psql_() { "$PGBIN/psql" "${PG_CONN[@]}" -At -v ON_ERROR_STOP=1 -c "$1"; }
  echo "PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'): sale of $PG_UNITS units with the outbox, then orders --until-idle" >&2
  for rep in $(seq "$PG_REPS"); do
    for fsync in on off; do
      pg_start -c fsync="$fsync" -c shared_buffers=128MB
      [ "$(psql_ 'SHOW fsync')" = "$fsync" ] || { echo "fsync is not $fsync"; exit 1; }
      psql_ 'DROP TABLE IF EXISTS shardstock_orders' >/dev/null 2>&1
      "${CLI[@]}" FLUSHALL >/dev/null
      sale=$("${SS[@]}" sim --sku pgcost --stock $((PG_UNITS * 2)) --segments "$SEGMENTS" \
        --requests "$PG_UNITS" --users "$PG_UNITS" --per-user-limit 0 --outbox \
        --concurrency "$CONCURRENCY" --json)
      t0=$(date +%s.%N)
      got=$("${SS[@]}" orders --postgres "$PGURL" --until-idle --json --timeout-s 900)
      t1=$(date +%s.%N)
      rows=$(psql_ 'SELECT count(*) FROM shardstock_orders')
      python3 - "$sale" "$got" "$t0" "$t1" "$rows" "$fsync" "$rep" >> "$PGRUNS" <<'PY'
import json, sys
sale, got = json.loads(sys.argv[1]), json.loads(sys.argv[2])
secs = float(sys.argv[4]) - float(sys.argv[3])
handled = got["polled"]["handled"]
assert sale["applied"] == int(sys.argv[5]) == handled, (sale["applied"], sys.argv[5], got)
print("\t".join(map(str, [sys.argv[6], sys.argv[7], handled, round(secs, 2),
    round(handled / secs), sale["throughput_per_s"]])))
PY
      tail -1 "$PGRUNS" >&2
      pg_stop
    done
  done
fi

python3 - "$RUNS" "$PGRUNS" <<'PY'
import statistics, sys
runs = [l.split("\t") for l in open(sys.argv[1]).read().splitlines()]
pg = [l.split("\t") for l in open(sys.argv[2]).read().splitlines()]
print("| coalescing | outbox | run | requests | µs in scripts / deduction | Redis CPU µs / deduction | XADD / deduction | XADD µs / deduction | req/s | p99 ms |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in runs:
    print("| " + " | ".join(r) + " |")
print()
print("Medians:")
print()
print("| coalescing | µs in scripts / deduction, outbox off → on | Redis CPU µs / deduction, off → on | XADD µs / deduction (outbox on) | req/s, off → on |")
print("|---|---|---|---|---|")
med = lambda c, o, i: statistics.median(float(r[i]) for r in runs if r[0] == c and r[1] == o)
for c in ("off", "on"):
    u0, u1 = med(c, "off", 4), med(c, "on", 4)
    c0, c1 = med(c, "off", 5), med(c, "on", 5)
    t0, t1 = med(c, "off", 8), med(c, "on", 8)
    x1 = med(c, "on", 7)
    print(f"| {c} | {u0:.2f} → {u1:.2f} ({u1 - u0:+.2f} µs, {100 * (u1 / u0 - 1):+.0f} %) "
          f"| {c0:.2f} → {c1:.2f} ({c1 - c0:+.2f} µs) | {x1:.2f} "
          f"| {t0:,.0f} → {t1:,.0f} ({100 * (t1 / t0 - 1):+.0f} %) |")
if pg:
    print()
    print("| PostgreSQL fsync | run | events | orders --until-idle s | events/s |")
    print("|---|---|---|---|---|")
    for r in pg:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {int(r[4]):,} |")
    for f in ("on", "off"):
        xs = [float(r[4]) for r in pg if r[0] == f]
        if xs:
            print(f"| {f} | median | | | {statistics.median(xs):,.0f} |")
PY
