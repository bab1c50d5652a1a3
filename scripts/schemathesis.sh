#!/usr/bin/env bash
# schemathesis against a real `shardstock serve` over a real redis-server, from the OpenAPI
# document the server itself serves (GET /openapi.json). What it checks:
#
#   1. Rejected requests write nothing. A negative run (`--mode negative`, the coverage and
#      fuzzing phases: every request breaks the document somewhere: a body, a field, a path, a
#      header, a missing token, a method the route lacks, a media type; the examples phase sends
#      the document's own examples, valid ones, so it belongs to the second run) with every check; Redis's DEBUG DIGEST of the whole dataset
#      (values and TTLs) must be the same before and after. Every write route needs a valid
#      body, id and token, so no request of this run may change anything.
#   2. The API keeps its contract. A run of every mode (positive and negative) and every phase
#      (schema examples, coverage, fuzzing, stateful: load -> deduct/reserve/restock/status/
#      audit, reserve -> confirm/cancel and an order -> its read/confirm/cancel follow the
#      document's links) with every check
#      (`--checks all`: no 5xx, statuses, content types, headers and bodies as documented,
#      valid data accepted, invalid data rejected, a missing token refused, 405 with `Allow`
#      for other methods, ...). Then the audit of every SKU the run loaded must balance
#      (`loaded + restocked = remaining + in transit + reserved + sold`, per segment and in
#      total), and the server must not have logged a panic.
#   3. The document alone is the contract. schemathesis as a user runs it: no hooks, its default
#      checks and modes (`st run URL/openapi.json` with the token), which must pass too: every
#      request the document allows is accepted, whatever the hooks of run 2 would have changed.
#
# Run 2 applies scripts/schemathesis/hooks.py to its positive cases: the one bound a pattern
# cannot state (an id is at most 128 *bytes* of UTF-8, an order's request id 125; the pattern
# counts characters). Both
# tokens are set (the same value), so the document the server serves declares bearer auth on the
# admin and buyer routes, as docs/openapi.json does.
#
# Usage: scripts/schemathesis.sh
# Env:   EXAMPLES (100: test cases per operation and mode), SEED (a fixed one; `random` for a new
#        one each run), SCHEMATHESIS_VENV (target/py/schemathesis), KEEP=1 keeps the work dir.
# Needs: python3 with venv (installs Debian's python3-venv when missing), redis-server,
#        redis-cli, curl; installs schemathesis from PyPI into the venv. ~35 s after the build.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
EXAMPLES=${EXAMPLES:-100}
SEED=${SEED:-20261126}
VENV=${SCHEMATHESIS_VENV:-$ROOT/target/py/schemathesis}
VERSION=4.32.5
TOKEN=schemathesis-token

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo -n"
apt_install() {
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@"
}
need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
[ ${#need_apt[@]} -gt 0 ] && apt_install "${need_apt[@]}"
if ! "$VENV/bin/schemathesis" --version 2>/dev/null | grep -q "version $VERSION"; then
  # Debian's python3 has no ensurepip without python3-venv; `python3 -m venv` fails without it.
  python3 -c 'import ensurepip, venv' 2>/dev/null || apt_install python3-venv
  echo "== installing schemathesis $VERSION into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "schemathesis==$VERSION"
fi
ST="$VENV/bin/schemathesis"

echo "== building shardstock"
cargo build --locked --all-features --bin shardstock
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug/shardstock

DIR=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "work dir kept: $DIR"; else rm -rf "$DIR"; fi
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

PORT=$(free_port)
# DEBUG (for DIGEST) is refused unless enabled; local connections are enough.
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" \
  --enable-debug-command local --logfile "$DIR/redis.log" >/dev/null 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-cli -p "$PORT" ping >/dev/null || { echo "redis-server did not start" >&2; cat "$DIR/redis.log" >&2; exit 1; }
digest() { redis-cli -p "$PORT" DEBUG DIGEST; }

# No sweeper tick or live audit during the run: nothing but the requests touches Redis.
: >"$DIR/serve.out"
SHARDSTOCK_SERVE__ADMIN_TOKEN=$TOKEN SHARDSTOCK_SERVE__BUYER_TOKEN=$TOKEN \
  "$BIN" serve --redis "redis://127.0.0.1:$PORT" --listen 127.0.0.1:0 \
  --sweep-ms 3600000 --audit-every-ms 0 >"$DIR/serve.out" 2>"$DIR/serve.err" &
PIDS+=($!)
URL=""
for _ in $(seq 200); do
  URL=$(sed -n 's/^listening on //p' "$DIR/serve.out")
  [ -n "$URL" ] && break
  sleep 0.05
done
[ -n "$URL" ] || { echo "serve did not start" >&2; cat "$DIR/serve.err" >&2; exit 1; }
echo "== serve at $URL over redis :$PORT"

# The SKU the document's examples name, with stock to sell and no per-user limit.
curl -sf -X PUT "$URL/skus/phone" -H "Authorization: Bearer $TOKEN" \
  -H 'Content-Type: application/json' -d '{"stock":1000,"segments":4,"per_user_limit":0}' >/dev/null
# A reservation to confirm and one to cancel, so those routes meet live ids too.
for r in st-held-1 st-held-2; do
  curl -sf -X POST "$URL/skus/phone/reservations" -H "Authorization: Bearer $TOKEN" \
    -H 'Content-Type: application/json' \
    -d "{\"user\":\"st-user\",\"request_id\":\"$r\",\"ttl_ms\":600000}" >/dev/null
done

seed=()
[ "$SEED" != random ] && seed=(--seed "$SEED")
run() { # label, schemathesis options...
  local label=$1
  shift
  echo "== schemathesis: $label"
  (cd "$DIR" && SCHEMATHESIS_HOOKS=hooks PYTHONPATH="$ROOT/scripts/schemathesis" \
    "$ST" run "$URL/openapi.json" -H "Authorization: Bearer $TOKEN" --checks all \
    --max-examples "$EXAMPLES" "${seed[@]}" --generation-database none --no-color \
    --report junit --report-junit-path "$DIR/$label.xml" "$@") | tee "$DIR/$label.out" \
    | sed -n '/^=* *\(FAILURES\|ERRORS\|SUMMARY\) *=*$/,$p'
  return "${PIPESTATUS[0]}"
}

before=$(digest)
keys_before=$(redis-cli -p "$PORT" DBSIZE)
status=0
run negative --mode negative --phases coverage,fuzzing || status=1
after=$(digest)
if [ "$before" != "$after" ]; then
  echo "FAIL: the negative run changed Redis (digest $before -> $after, keys $keys_before ->" \
    "$(redis-cli -p "$PORT" DBSIZE)): a rejected request wrote" >&2
  status=1
else
  echo "== negative run: Redis unchanged (digest $after, $keys_before keys)"
fi

run all --mode all || status=1

# As a user runs it: the document and the token, nothing else (a fixed seed unless SEED=random,
# so CI runs the same cases each time).
echo "== schemathesis: as a user runs it (no hooks, default checks)"
(cd "$DIR" && "$ST" run "$URL/openapi.json" -H "Authorization: Bearer $TOKEN" "${seed[@]}" \
  --no-color) >"$DIR/user.out" 2>&1 || status=1
sed -n '/^=* *\(FAILURES\|ERRORS\|SUMMARY\) *=*$/,$p' "$DIR/user.out"

# Every SKU in Redis (the run loads some of its own) must balance.
skus=$(redis-cli -p "$PORT" --scan --pattern '*}:meta' | sed -n 's/^[^{]*{\([^}]*\)}:meta$/\1/p' | sort)
audited=0
for sku in $skus; do
  reply=$(curl -s "$URL/skus/$sku/audit" -H "Authorization: Bearer $TOKEN")
  if ! grep -q '"ok":true' <<<"$reply"; then
    echo "FAIL: audit of $sku: $reply" >&2
    status=1
  fi
  audited=$((audited + 1))
done
echo "== audits: $audited SKUs checked"
curl -s "$URL/skus/phone/audit" -H "Authorization: Bearer $TOKEN" | python3 -c '
import json, sys
a = json.load(sys.stdin)
print("   phone:", {k: a[k] for k in ("ok", "loaded", "restocked", "remaining", "in_transit", "reserved", "sold")})'
if grep -q "panicked" "$DIR/serve.err"; then
  echo "FAIL: serve panicked:" >&2
  grep -A5 panicked "$DIR/serve.err" >&2
  status=1
fi
kill -0 "${PIDS[1]}" 2>/dev/null || { echo "FAIL: serve died" >&2; status=1; }
if [ "$status" -ne 0 ]; then
  KEEP=1
  echo "== schemathesis: FAILED (outputs in $DIR)" >&2
  exit 1
fi
echo "== schemathesis: green"
