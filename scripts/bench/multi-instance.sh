#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR/../lib
# Suite multi-instance: three `shardstock serve` processes on one Redis under wrk, per strategy — oversold, one unit per user, throughput, p99
# Tables: docs/benchmarks.md "Over HTTP: three instances, one Redis"; docs/http.md "Several instances"
# Needs: redis-server redis-cli wrk curl python3 cargo
# Time: ~1 min after the build with the defaults (4 strategies × 2 phases × 5 s of load); DURATION=1s CONNS=8 THREADS=1 and three strategies: ~10 s
#
# The classic multi-instance experiment with real processes: one redis-server, three
# `shardstock serve` instances on different ports sharing it, and HTTP load from `wrk` (one wrk
# per instance, all at once) POSTing deducts with unique users and request ids. Afterwards the
# SKU is audited. Per strategy it runs two phases:
#   1. "stock": STOCK units, 1 segment, no per-user limit  -> sold, oversold, remaining;
#   2. "one per user": STOCK units, per_user_limit 1, buyers drawn from USERS user ids
#      -> units sold must equal USERS (each user got exactly one) for the safe strategies. The
#      baselines (local-mutex, naive, decr-compensate) keep no per-user ledgers, so the engine
#      refuses to load a SKU with a limit under them: their cell says so ("refused").
# It needs no Lua script of the engine's own: the deducts go through the HTTP API (the `wrk`
# request script below is Lua for wrk, not for Redis).
# Prints a Markdown table (strategy, requests, sold, oversold, remaining, throughput, p99,
# one-per-user sold).
#
# Usage: scripts/bench.sh multi-instance [STRATEGY...]      (default: lua lock redlock local-mutex)
# Env:   STOCK (300) USERS (100) DURATION (5s) CONNS (32 per instance) THREADS (2 per wrk)
#        PAUSE_MS (1: --critical-pause-ms, a slow call inside every critical section)
# wrk: apt-get install wrk.
set -euo pipefail
. "$(dirname "$0")/../lib/harness.sh"
harness_init
STOCK=${STOCK:-300}
USERS=${USERS:-100}
DURATION=${DURATION:-5s}
CONNS=${CONNS:-32}
THREADS=${THREADS:-2}
PAUSE_MS=${PAUSE_MS:-1}
STRATEGIES=("$@")
[ ${#STRATEGIES[@]} -eq 0 ] && STRATEGIES=(lua lock redlock local-mutex)
need redis-server redis-cli wrk python3 curl
build_release --features cli --bin shardstock
BIN=$RELEASE/shardstock
DIR=$WORK
redis_start
REDIS=$REDIS_URL
redlock_nodes

# wrk request script: unique request ids per wrk process/thread/request; users either unique too
# (USERS=0) or drawn from u1..uUSERS. Reports requests, non-2xx and p99 (µs) as one line.
cat > "$DIR/wrk-deduct.lua" <<'LUA'
local prefix, sku, users = "w", "sku", 0
local counter, tid = 0, 0
local next_tid = 0
function setup(thread)
  -- Runs in the main state; `thread:set` makes `thread_no` a global of that thread's state.
  next_tid = next_tid + 1
  thread:set("thread_no", next_tid)
end
function init(args)
  prefix, sku, users = args[1], args[2], tonumber(args[3])
  tid = thread_no or 0
  math.randomseed(os.time() * 1000 + (tonumber(string.match(prefix, "%d+")) or 0) * 101 + tid)
end
function request()
  counter = counter + 1
  local rid = prefix .. "-" .. tostring(tid) .. "-" .. tostring(counter) .. "-" .. tostring(math.random(1000000000))
  local user = rid
  if users > 0 then user = "u" .. tostring(math.random(users)) end
  local body = '{"user":"' .. user .. '","qty":1,"request_id":"' .. rid .. '"}'
  return wrk.format("POST", "/skus/" .. sku .. "/deduct", {["Content-Type"] = "application/json"}, body)
end
function done(summary, latency, requests)
  local non2xx = summary.errors.status
  io.write(string.format("RESULT %d %d %d %d\n", summary.requests, non2xx,
    latency:percentile(99), summary.duration))
end
LUA

# Runs one phase; prints "requests non2xx p99_us duration_us sold oversold remaining ok", or
# "refused - - - - - - -" when the load is refused (a per-user limit under a baseline strategy;
# the server's answer goes to stderr).
phase() { # strategy sku per_user_limit users
  local s=$1 sku=$2 limit=$3 users=$4
  local extra=(--strategy "$s" --critical-pause-ms "$PAUSE_MS")
  [ "$s" = redlock ] && extra+=(--lock-nodes "$LOCK_NODES")
  local ports=() spids=()
  for i in 1 2 3; do
    local port; port=$(free_port)
    "$BIN" serve --redis "$REDIS" --listen "127.0.0.1:$port" "${extra[@]}" \
      >"$DIR/serve-$s-$i.out" 2>"$DIR/serve-$s-$i.err" &
    spids+=($!); track_pid $!; ports+=("$port")
  done
  for port in "${ports[@]}"; do
    for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.05; done
  done
  local code
  code=$(curl -s -o "$DIR/load-$sku.json" -w '%{http_code}' -X PUT "http://127.0.0.1:${ports[0]}/skus/$sku" \
    -H 'content-type: application/json' -d "{\"stock\":$STOCK,\"segments\":1,\"per_user_limit\":$limit}")
  if [ "${code:0:1}" != 2 ]; then
    echo "$s: loading $sku (per_user_limit $limit) answered $code: $(cat "$DIR/load-$sku.json")" >&2
    for p in "${spids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${spids[@]}"; do wait "$p" 2>/dev/null || true; done
    echo "refused - - - - - - -"
    return
  fi
  local wpids=()
  for i in 0 1 2; do
    wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --timeout 5s -s "$DIR/wrk-deduct.lua" \
      "http://127.0.0.1:${ports[$i]}" -- "w$i" "$sku" "$users" >"$DIR/wrk-$sku-$i.out" 2>&1 &
    wpids+=($!)
  done
  for p in "${wpids[@]}"; do wait "$p"; done
  local audit
  audit=$(curl -sf "http://127.0.0.1:${ports[1]}/skus/$sku/audit")
  for p in "${spids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${spids[@]}"; do wait "$p" 2>/dev/null || true; done
  python3 - "$audit" "$DIR"/wrk-"$sku"-*.out <<'PY'
import json, sys
a = json.loads(sys.argv[1])
reqs = non2xx = p99 = dur = 0
for f in sys.argv[2:]:
    line = [l for l in open(f) if l.startswith("RESULT ")]
    if not line:
        sys.exit("wrk failed: " + open(f).read())
    r, n, p, d = map(int, line[0].split()[1:])
    reqs += r; non2xx += n; p99 = max(p99, p); dur = max(dur, d)
oversold = max(0, a["sold"] - a["loaded"] - a["restocked"])
print(reqs, non2xx, p99, dur, a["sold"], oversold, a["remaining"], "ok" if a["ok"] else "FAILED")
PY
}

echo "| strategy | requests | sold | oversold | remaining | audit | throughput | p99 | one per user: $USERS users sold | non-2xx |"
echo "|---|---|---|---|---|---|---|---|---|---|"
RUN=$(date +%s)
for s in "${STRATEGIES[@]}"; do
  read -r reqs non2xx p99 dur sold oversold remaining ok < <(phase "$s" "exp-$RUN-$s" 0 0) ||
    { echo "$s: the stock phase failed" >&2; exit 1; }
  [ "$reqs" = refused ] && { echo "$s: the stock phase was refused" >&2; exit 1; }
  read -r _ non2xx_u _ _ sold_u _ _ ok_u < <(phase "$s" "exp-$RUN-$s-u" 1 "$USERS") ||
    { echo "$s: the one-per-user phase failed" >&2; exit 1; }
  python3 - "$s" "$reqs" "$non2xx" "$p99" "$dur" "$sold" "$oversold" "$remaining" "$ok" "$sold_u" "$ok_u" "$non2xx_u" "$USERS" <<'PY'
import sys
s, reqs, non2xx, p99, dur, sold, over, rem, ok, sold_u, ok_u, non2xx_u, users = sys.argv[1:]
thr = int(reqs) / (int(dur) / 1e6)
mark = "" if s in ("lua", "lock", "redlock") else " (unsafe)"
if sold_u == "-":
    per_user = "refused (no per-user ledgers under a baseline)"
    non2xx_u = "0"
else:
    per_user = f"{sold_u}" + ("" if int(sold_u) == int(users) else f" (≠ {users})") + ("" if ok_u == "ok" else ", audit FAILED")
print(f"| {s}{mark} | {int(reqs):,} | {sold} | {over} | {rem} | {ok} | {thr:,.0f}/s | {int(p99)/1000:.1f} ms | {per_user} | {int(non2xx) + int(non2xx_u)} |")
PY
done
