#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR/../lib
# Suite locust: a Locust flash sale over HTTP against one `shardstock serve`, then the audit against what buyers were told
# Tables: README.md "Measured" (a Locust flash sale over HTTP) and "Over HTTP"; docs/http.md "Under load (Locust)"
# Needs: redis-server redis-cli curl python3 cargo
# Time: ~1 min after the build (45 s of load, then the audit); the first run also installs Locust into a venv; DURATION=6s USERS=20 SPAWN=20 PROCESSES=1 STOCK=100 SEGMENTS=4: ~15 s
#
# A flash sale over HTTP with Locust (scripts/bench/locustfile.py): one redis-server, one release
# `shardstock serve` (buyer and admin tokens set), STOCK units loaded with a per-user limit of 1,
# then USERS concurrent Locust users for DURATION, every task a new buyer (its own user id and
# request id, retried with the same id on a 503, a timeout or a broken connection). Then the
# SKU's audit (`GET /skus/{sku}/audit`) is checked against what the buyers were told:
#   - units sold (audit) == units acknowledged to buyers (applied + replayed answers), with no
#     buyer left without an answer;
#   - no oversell (sold <= loaded), and the audit balances (`ok`: loaded + restocked =
#     remaining + in transit + reserved + sold, per segment and in total).
# With REDIS_PAUSE_MS, Redis stops answering writes for that long a third into the run
# (`CLIENT PAUSE ms WRITE`): past serve's request timeout (10 s) calls answer 503 and buyers
# retry with the same request id, so the checks then cover unknown outcomes resolved by retries.
# Prints Locust's request rate and failures and the comparison; exits 1 when a check fails.
#
# Usage: scripts/bench.sh locust
# Env:   STOCK (1000) SEGMENTS (8) USERS (200) SPAWN (50/s) DURATION (45s, in seconds) PROCESSES
#        (2: Locust processes; one tops out near 1,800 req/s here) REDIS_PAUSE_MS (none)
#        LOCUST_VENV (target/py/locust)
# Installs locust from PyPI into the venv (and python3-venv with apt-get when missing). Not part of CI (a release build and a minute of load). KEEP=1 keeps the work
#        directory (Locust's CSV, the buyers' tallies, the audit).
set -euo pipefail
. "$(dirname "$0")/../lib/harness.sh"
harness_init
STOCK=${STOCK:-1000}
SEGMENTS=${SEGMENTS:-8}
USERS=${USERS:-200}
SPAWN=${SPAWN:-50}
DURATION=${DURATION:-45s}
PROCESSES=${PROCESSES:-2}
VENV=${LOCUST_VENV:-$ROOT/target/py/locust}
VERSION=2.47.0
ADMIN=locust-admin
BUYER=locust-buyer
SKU=flash

need redis-server redis-cli curl python3
if ! "$VENV/bin/locust" --version 2>/dev/null | grep -q "locust $VERSION"; then
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo -n"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv
  fi
  echo "== installing locust $VERSION into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "locust==$VERSION"
fi

echo "== building shardstock (release)"
build_release --locked --all-features --bin shardstock
BIN=$RELEASE/shardstock
DIR=$WORK

redis_start
PORT=$REDIS_PORT
: >"$DIR/serve.out"
SHARDSTOCK_SERVE__ADMIN_TOKEN=$ADMIN SHARDSTOCK_SERVE__BUYER_TOKEN=$BUYER \
  "$BIN" serve --redis "redis://127.0.0.1:$PORT" --listen 127.0.0.1:0 \
  >"$DIR/serve.out" 2>"$DIR/serve.err" &
track_pid $!
URL=""
for _ in $(seq 200); do
  URL=$(sed -n 's/^listening on //p' "$DIR/serve.out")
  [ -n "$URL" ] && break
  sleep 0.05
done
[ -n "$URL" ] || { echo "serve did not start" >&2; cat "$DIR/serve.err" >&2; exit 1; }
curl -sf -X PUT "$URL/skus/$SKU" -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' \
  -d "{\"stock\":$STOCK,\"segments\":$SEGMENTS,\"per_user_limit\":1}" >/dev/null
echo "== serve at $URL over redis :$PORT; $STOCK units of $SKU over $SEGMENTS segments"

echo "== locust: $USERS users, $PROCESSES processes, $DURATION"
if [ -n "${REDIS_PAUSE_MS:-}" ]; then
  secs=${DURATION%s}
  (sleep $((secs / 3)) && redis-cli -p "$PORT" CLIENT PAUSE "$REDIS_PAUSE_MS" WRITE >/dev/null \
    && echo "== redis: writes paused for $REDIS_PAUSE_MS ms") &
  track_pid $!
fi
SHARDSTOCK_SKU=$SKU SHARDSTOCK_TOKEN=$BUYER SHARDSTOCK_LOCUST_OUT=$DIR \
  "$VENV/bin/locust" -f scripts/bench/locustfile.py --headless --host "$URL" -u "$USERS" -r "$SPAWN" \
  -t "$DURATION" --processes "$PROCESSES" --csv "$DIR/stats" --only-summary \
  >"$DIR/locust.out" 2>&1 || true
# In-flight retries end with their buyers; the sweeper credits what any dropped call left in
# transit (leases of 5 s): give it a moment before the audit.
sleep 6
curl -sf "$URL/skus/$SKU/audit" -H "Authorization: Bearer $ADMIN" >"$DIR/audit.json"
python3 - "$DIR" <<'PY'
import csv, glob, json, sys
d = sys.argv[1]
tally = {}
for f in glob.glob(f"{d}/acks-*.json"):
    for k, v in json.load(open(f)).items():
        tally[k] = tally.get(k, 0) + v
audit = json.load(open(f"{d}/audit.json"))
rows = {r["Name"]: r for r in csv.DictReader(open(f"{d}/stats_stats.csv"))}
agg = rows.get("Aggregated", {})
reqs, fails = int(agg.get("Request Count", 0)), int(agg.get("Failure Count", 0))
rps = float(agg.get("Requests/s", 0))
p50, p99 = agg.get("50%", "?"), agg.get("99%", "?")
acked, unknown = tally.get("acknowledged", 0), tally.get("unknown", 0)
outcomes = {k.split(":", 1)[1]: v for k, v in sorted(tally.items()) if k.startswith("outcome:")}
statuses = {k.split(":", 1)[1]: v for k, v in sorted(tally.items()) if k.startswith("status:")}
print(f"requests {reqs} at {rps:.0f}/s (p50 {p50} ms, p99 {p99} ms), failures {fails} {statuses or ''}")
print(f"buyers {tally.get('buyers', 0)}, retries {tally.get('retries', 0)}, unknown {unknown}, outcomes {outcomes}")
print(f"audit: loaded {audit['loaded']}, sold {audit['sold']}, remaining {audit['remaining']}, "
      f"in transit {audit['in_transit']}, reserved {audit['reserved']}, ok {audit['ok']}")
print(f"acknowledged to buyers {acked} vs sold {audit['sold']}")
bad = []
if audit["sold"] != acked:
    bad.append(f"sold {audit['sold']} != acknowledged {acked}")
if unknown:
    bad.append(f"{unknown} buyers without an answer")
if audit["sold"] > audit["loaded"] + audit["restocked"]:
    bad.append("oversold")
if not audit["ok"]:
    bad.append(f"audit failed: {audit['problems']}")
if reqs == 0:
    bad.append("no requests ran")
if bad:
    print("FAIL: " + "; ".join(bad))
    sys.exit(1)
print("OK: every unit sold was acknowledged to its buyer, none oversold, the audit balances")
PY
