#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR/../lib
# Suite sale: the README's flash sales through `shardstock sim` on one redis-server — one unit per user over 16 segments, the last units, a cart storm
# Tables: README.md "Measured" (a flash sale on one Redis, the last units, a cart storm); docs/benchmarks.md "The sale on one Redis" (the "now" rows), "Carts" (the base row)
# Needs: redis-server redis-cli python3 cargo
# Time: ~1 min after the build with the defaults; SCALE=0.05: ~10 s
#
# Starts a private redis-server on a free loopback port and runs each sale below as one
# `shardstock sim --json` (64 workers, coalescing on unless the row says otherwise), FLUSHALL
# and CONFIG RESETSTAT before each, ROUNDS times in turn:
#   limit-1       100,000 units, 16 segments, 200,000 buyers, one unit per user
#   uncoalesced   the same units, 20,000 buyers, `--coalesce off`: script calls per sale
#   limit-1-100k  100,000 units, 16 segments, 100,000 buyers, one unit per user, and
#   limit-0-100k  the same without a per-user limit (their ratio)
#   last-units    1,000 units, 16 segments, 200,000 buyers, one unit per user
#   cart          two-item orders over two SKUs of 1,000 units and 16 segments each, 50,000
#                 buyers, limit 1, holds of 2 s, half confirmed, the rest cancelled or expired
# Prints one Markdown table of the sales (sold, oversold, in transit at the end, audit,
# requests/s, p50, p99, EVALSHA calls of the whole run by INFO commandstats and per unit sold,
# requests per coalesced call) and one of the cart storms (orders/s, held, confirmed,
# cancelled, expired, refused, every check). Exits 1 when a sale oversold or an audit failed.
#
# Usage: scripts/bench.sh sale   env: SCALE (1: multiplies units, buyers and requests),
#        ROUNDS (1), SALES (all six: the names above, space-separated)
set -euo pipefail
. "$(dirname "$0")/../lib/harness.sh"
harness_init
SCALE=${SCALE:-1}
ROUNDS=${ROUNDS:-1}
SALES=${SALES:-limit-1 uncoalesced limit-1-100k limit-0-100k last-units cart}
need redis-server redis-cli python3
build_release --features cli --bin shardstock
BIN=$RELEASE/shardstock
redis_start
CLI=(redis-cli -p "$REDIS_PORT")

n() { python3 -c "print(max(1, int($1 * $SCALE)))"; }
# sale NAME: the sim arguments of that sale.
sale() {
  case $1 in
    limit-1) echo "--stock $(n 100000) --segments 16 --users $(n 200000) --requests $(n 200000) --per-user-limit 1" ;;
    uncoalesced) echo "--stock $(n 100000) --segments 16 --users $(n 20000) --requests $(n 20000) --per-user-limit 1 --coalesce off" ;;
    limit-1-100k) echo "--stock $(n 100000) --segments 16 --users $(n 100000) --requests $(n 100000) --per-user-limit 1" ;;
    limit-0-100k) echo "--stock $(n 100000) --segments 16 --users $(n 100000) --requests $(n 100000) --per-user-limit 0" ;;
    last-units) echo "--stock $(n 1000) --segments 16 --users $(n 200000) --requests $(n 200000) --per-user-limit 1" ;;
    cart) echo "--cart 2 --stock $(n 1000) --segments 16 --users $(n 50000) --requests $(n 50000) --per-user-limit 1 --hold-ms 2000 --confirm-ratio 0.5" ;;
    *) echo "no sale '$1' (SALES: limit-1 uncoalesced limit-1-100k limit-0-100k last-units cart)" >&2; return 1 ;;
  esac
}

RESULTS=$WORK/results.jsonl
for r in $(seq "$ROUNDS"); do
  for name in $SALES; do
    args=$(sale "$name")
    "${CLI[@]}" FLUSHALL >/dev/null
    "${CLI[@]}" CONFIG RESETSTAT >/dev/null
    # shellcheck disable=SC2086 # the sale's flags, one word each
    out=$("$BIN" --redis "$REDIS_URL" sim --sku "sale-$name" $args --json) || true
    calls=$("${CLI[@]}" INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p')
    python3 -c 'import json, sys; d = json.loads(sys.argv[1]); d.update(_name=sys.argv[2], _round=int(sys.argv[3]), _args=sys.argv[4], _evalsha=int(sys.argv[5] or 0)); print(json.dumps(d))' \
      "$out" "$name" "$r" "$args" "${calls:-0}" >> "$RESULTS"
    echo "sale: $name, round $r done after ${SECONDS}s" >&2
  done
done

python3 - "$RESULTS" "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(nproc)" "$(redis_version)" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"Run {sys.argv[2]}, {sys.argv[3]} cores, redis-server {sys.argv[4]}, loopback; `shardstock sim "
      "--json`, 64 workers, one private redis-server.\n")
bad = []
sales = [d for d in rows if not d.get("cart")]
if sales:
    print("| sale | sim flags | round | sold | oversold | in transit at the end | audit | requests/s | p50 | p99 "
          "| EVALSHA calls (whole run) | per unit sold | requests per coalesced call |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d in sales:
        co = d.get("coalescing")
        sold = d["sold_units"]
        batch = f"{co['mean_batch']:.2f}" if co else "—"
        per = f"{d['_evalsha'] / sold:.3f}" if sold else "—"
        print(f"| {d['_name']} | `{d['_args']}` | {d['_round']} | {sold:,} | {d['oversold']} | {d['in_transit']} "
              f"| {'ok' if d['audit_ok'] else 'FAILED'} | {d['throughput_per_s']:,.0f} | {d['p50_ms']:.2f} ms "
              f"| {d['p99_ms']:.1f} ms | {d['_evalsha']:,} | {per} | {batch} |")
        if d["oversold"] or not d["audit_ok"]:
            bad.append(d["_name"])
    by = {(d["_name"], d["_round"]): d["throughput_per_s"] for d in sales}
    for (name, r), v in sorted(by.items()):
        if name == "limit-1-100k" and ("limit-0-100k", r) in by:
            print(f"\nRound {r}: one unit per user ÷ no limit, 100k buyers: {v:,.0f} ÷ "
                  f"{by[('limit-0-100k', r)]:,.0f} = **{v / by[('limit-0-100k', r)]:.2f}×**")
carts = [d for d in rows if d.get("cart")]
if carts:
    print("\n| cart storm | round | orders/s | p50 / p99 | held | confirmed | cancelled | expired | refused "
          "| sold (both SKUs) | sweeps | checks |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d in carts:
        c = d["cart"]
        checks = "every one true" if c["ok"] else ", ".join(k for k, v in c["checks"].items() if not v) + " FAILED"
        print(f"| `{d['_args']}` | {d['_round']} | {c['orders_per_s']:,.0f} | {d['p50_ms']:.1f} / {d['p99_ms']:.0f} ms "
              f"| {c['held']:,} | {c['confirmed']:,} | {c['cancelled']:,} | {c['expired']:,} | {c['refused']:,} "
              f"| {sum(s['sold'] for s in c['skus']):,} | {c['sweeps']} | {checks} |")
        if not c["ok"]:
            bad.append(d["_name"])
if bad:
    sys.exit("FAILED: " + ", ".join(bad))
PY
