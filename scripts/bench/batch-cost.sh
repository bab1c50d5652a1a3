#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR/../lib
# Suite batch-cost: the Redis-side cost per request of a coalesced call of the selling script and bytes per remembered request, the tree against a git ref
# Tables: docs/benchmarks.md "Exactly-once against the bare script" (the wall-time and bytes figures of the selling script, "Several users per ledger field", the short form), "Where the time goes" (coalesced deduction, Redis side)
# Needs: redis-server redis-cli redis-benchmark python3 git
# Time: ~5 s with the defaults (2 rounds × 2 sides × 3,000 calls of 64 requests); ROUNDS=1 CALLS=300: ~1 s; LADDER=1 adds 7 runs
#
# The selling script at REF (default main) against the working tree, interleaved ROUNDS times on
# one private redis-server. Each side is composed as its build did: prelude + sell.lua (one call
# decides N requests; the tree always, a ref when it has sell.lua), or, for a ref from before the
# redesign, prelude + deduct_core + deduct_batch.lua with that script's own KEYS/ARGV (see
# scripts/lib/sell_bench.sh).
# redis-benchmark sends EVALSHA with N fresh requests per call (random users and request ids,
# 1 unit each, per-user limit SELL_LIMIT, record TTL 600 s, stock far beyond the run), 50
# clients, pipeline 4, in each side's own contract (scripts/lib/sell_bench.sh). The segment is
# written by that side's own load_segment.lua (deduct-era refs: the fields their load_segment
# wrote).
# Per request it prints: redis-server main-thread CPU (INFO cpu, the figure least disturbed by
# other load), the script's time by INFO commandstats, and used_memory growth per request sold
# (bytes per remembered request).
#
# Usage: scripts/bench.sh batch-cost [REF]
#        env: CALLS (3000), N (64), ROUNDS (2), VERBOSE=1 (commandstats),
#        SELL_LIMIT (the segment's per-user limit, default 0; 1 is a flash sale's one per buyer)
#        LADDER=1 (also the tree's script cut after each step: where its time goes)
set -euo pipefail
. "$(dirname "$0")/../lib/harness.sh"
. "$(dirname "$0")/../lib/sell_bench.sh"
harness_init
REF=${1:-main}
CALLS=${CALLS:-3000}; N=${N:-64}; ROUNDS=${ROUNDS:-2}
need redis-server redis-cli redis-benchmark python3 git
DIR=$WORK
redis_start
PORT=$REDIS_PORT
CLI=(redis-cli -p "$PORT")
SEG='bc:{bc#0}:seg'

# Each side: its script file, its contract, how to write its segment, its KEYS and ARGV.
REF_KIND=$(sell_compose_ref "$ROOT" "$REF" batch "$DIR/ref.lua")
sell_compose "$ROOT" "$DIR/tree.lua"
if [ "$REF_KIND" != deduct ]; then
  { git -C "$ROOT" show "$REF:src/scripts/prelude.lua"; git -C "$ROOT" show "$REF:src/scripts/load_segment.lua"; } > "$DIR/ref-load.lua"
fi
sell_load_lua "$ROOT" "$DIR/tree-load.lua"
REF_HF=$(sell_home_fn_ref "$ROOT" "$REF")
TREE_HF=$(sell_home_fn "$ROOT")
# KEYS[4+j] / ARGV of N requests for either contract (sets KEYS and ARGS).
call_args() { # $1 = kind, $2 = hf
  if [ "$1" != deduct ]; then
    sell_keys_args "$SEG" "$2" "$N" 600000 "$1"
    KEYS=("${SELL_KEYS[@]}"); ARGS=("${SELL_ARGS[@]}")
  else
    # deduct_batch.lua: KEYS segment, resv, claims, outbox, then a request record per request;
    # ARGV gen index ttl_ms lease_ms n, then per request: user qty claim resv_ttl_ms.
    KEYS=("$SEG" 'bc:{bc#0}:g1:resv' 'bc:{bc#0}:g1:claims' 'bc:{bc#0}:out')
    ARGS=(1 0 600000 5000 "$N")
    for _ in $(seq "$N"); do KEYS+=('bc:{bc#0}:g1:rq:__rand_int__'); ARGS+=(u__rand_int__ 1 1 0); done
  fi
}
load_seg() { # $1 = kind, $2 = load script (sell, spec), $3 = hf
  if [ "$1" != deduct ]; then
    local r; r=$(sell_load_segment "$2" "$SEG" 999999999999 "$3" "${CLI[@]}" | head -1)
    [ "$r" = ok ] || { echo "load_segment.lua answered '$r', not 'ok'" >&2; exit 1; }
  else
    "${CLI[@]}" HSET "$SEG" gen 1 stock 999999999999 loaded 999999999999 restocked 0 sold 0 reserved 0 out 0 >/dev/null
  fi
}
run() { # $1 = label, $2 = script file, $3 = kind, $4 = load script, $5 = hf
  "${CLI[@]}" FLUSHALL >/dev/null
  load_seg "$3" "$4" "$5"
  call_args "$3" "$5"
  local sha; sha=$("${CLI[@]}" -x SCRIPT LOAD < "$2")
  # Sanity: a call of N requests must apply them (the first reply line: a stock).
  local probe
  probe=$("${CLI[@]}" EVALSHA "$sha" "${#KEYS[@]}" "${KEYS[@]//__rand_int__/probe}" "${ARGS[@]//__rand_int__/probe}" 2>&1 | head -1)
  sell_probe_ok "$probe" || { echo "$1 ($3): probe answered '$probe', not the stock after a sale" >&2; exit 1; }
  "${CLI[@]}" FLUSHALL >/dev/null
  load_seg "$3" "$4" "$5"
  "${CLI[@]}" CONFIG RESETSTAT >/dev/null
  local m0 c0 m1 c1; m0=$(redis_used_memory); c0=$(redis_cpu_usec)
  redis-benchmark -p "$PORT" -c 50 -P 4 -n "$CALLS" -r 100000000000 --csv \
    EVALSHA "$sha" "${#KEYS[@]}" "${KEYS[@]}" "${ARGS[@]}" >/dev/null
  c1=$(redis_cpu_usec); m1=$(redis_used_memory)
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
desc() {
  case $1 in
    runs) echo "prelude + sell.lua, runs of one spec: two arguments per request" ;;
    spec) echo "prelude + sell.lua, three arguments per request" ;;
    sell) echo "prelude + sell.lua, five arguments and a ledger key per request" ;;
    *) echo "prelude + deduct_core + deduct_batch.lua" ;;
  esac
}
echo "$N fresh requests per call, $CALLS calls, per-user limit ${SELL_LIMIT:-0}; ref = $REF ($(desc "$REF_KIND")), tree = $(sell_tree_desc "$ROOT") ($(desc "$SELL_KIND"))"
for _ in $(seq "$ROUNDS"); do
  run ref "$DIR/ref.lua" "$REF_KIND" "$DIR/ref-load.lua" "$REF_HF"
  run tree "$DIR/tree.lua" "$SELL_KIND" "$DIR/tree-load.lua" "$TREE_HF"
done
# LADDER=1: where the tree's call spends its time — the real script cut short after each of its
# steps (everything up to the step's first line, then `return '1'`), cumulative, same calls.
if [ "${LADDER:-0}" = 1 ]; then
  for k in "${!SELL_CUTS[@]}"; do
    sell_cut "$DIR/tree.lua" "$k" "$DIR/cut.lua"
    echo "step $((k + 1)): ${SELL_STEPS[$k]}"
    run "cut$((k + 1))" "$DIR/cut.lua" "$SELL_KIND" "$DIR/tree-load.lua" "$TREE_HF"
  done
fi
