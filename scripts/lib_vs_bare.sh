#!/usr/bin/env bash
# lib_vs_bare.sh — the library against the bare check-and-DECRBY script, interleaved: on a shared
# 2-core machine one run of each moves by ±30 %, so every round runs every binary once, in turn,
# on one private redis-server.
#
# Binaries: examples/bare_script.rs and examples/embedded_rate.rs of the working tree (`lib`),
# `shardstock sim` of the working tree (`sim`: the CLI's whole sale, load and audit included),
# and with REF also embedded_rate.rs (`ref-lib`) and `shardstock sim` (`ref-sim`) of git REF
# (built in a temporary worktree: a full release build). Each run: REQUESTS one-unit sales, each a new buyer's; the library coalesced on Redis.
# Per run it prints sales/s, the ratio to the bare run of the same round, Redis CPU µs per
# request (redis-server main-thread CPU by INFO cpu ÷ requests), the client's CPU µs per request
# (the example's own /proc/self/stat reading) and, for the library, bytes per remembered request
# (INFO memory used_memory growth ÷ requests: every sale's record is still kept).
#
# Usage: scripts/lib_vs_bare.sh [REF]   env: ROUNDS (3), REQUESTS (300000),
#        CONFIGS ("256:1 64:1 64:16": tasks:segments[:per-user limit, default 1]),
#        SIM (1: also run `shardstock sim` per config; 0: not)
set -euo pipefail
cd "$(dirname "$0")/.."
REF=${1:-}
ROUNDS=${ROUNDS:-3}
REQUESTS=${REQUESTS:-300000}
CONFIGS=${CONFIGS:-256:1 64:1 64:16}
SIM=${SIM:-1}
for b in redis-server redis-cli python3; do
  command -v "$b" >/dev/null || { echo "$b missing (scripts/test.sh installs redis)"; exit 1; }
done
DIR=$(mktemp -d)
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  [ -n "$REF" ] && git worktree remove --force "$DIR/ref" 2>/dev/null
  rm -rf "$DIR"
}
trap cleanup EXIT

cargo build --release --quiet --example bare_script --example embedded_rate
cargo build --release --quiet --features cli --bin shardstock
cp target/release/examples/bare_script "$DIR/bare"
cp target/release/examples/embedded_rate "$DIR/lib"
cp target/release/shardstock "$DIR/sim"
LIBS=(lib)
if [ -n "$REF" ]; then
  git worktree add --detach "$DIR/ref" "$REF" >/dev/null
  (cd "$DIR/ref" && CARGO_TARGET_DIR="$DIR/ref-target" cargo build --release --quiet --example embedded_rate)
  cp "$DIR/ref-target/release/examples/embedded_rate" "$DIR/ref-lib"
  LIBS=(ref-lib lib)
  if [ "$SIM" = 1 ]; then
    (cd "$DIR/ref" && CARGO_TARGET_DIR="$DIR/ref-target" cargo build --release --quiet --features cli --bin shardstock)
    cp "$DIR/ref-target/release/shardstock" "$DIR/ref-sim"
    LIBS+=(ref-sim)
  fi
fi
[ "$SIM" = 1 ] && LIBS+=(sim)

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" \
  --logfile "$DIR/redis.log" >/dev/null 2>&1 &
PID=$!
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
CLI=(redis-cli -p "$PORT")
URL="redis://127.0.0.1:$PORT"
# redis-server main-thread CPU µs so far (INFO cpu, user + system): all its work counted once
# (a sum of INFO commandstats counts each command a script calls twice).
usec() {
  "${CLI[@]}" INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user)_main_thread:/ { s += $2 }
    END { printf "%d\n", s * 1e6 }'
}

mem() { "${CLI[@]}" INFO memory | tr -d '\r' | sed -n 's/^used_memory:\(.*\)/\1/p'; }

echo "| round | tasks:segments:limit | binary | sales/s | ÷ bare | Redis CPU µs/request | client CPU µs/request | bytes/request |"
echo "|---|---|---|---:|---:|---:|---:|---:|"
for r in $(seq "$ROUNDS"); do
  for c in $CONFIGS; do
    IFS=: read -r tasks segments limit <<<"$c"
    limit=${limit:-1}
    bare_rate=
    for b in bare "${LIBS[@]}"; do
      "${CLI[@]}" FLUSHALL >/dev/null
      u0=$(usec)
      m0=$(mem)
      bytes=-
      if [ "$b" = bare ]; then
        out=$("$DIR/bare" --url "$URL" --tasks "$tasks" --requests "$REQUESTS" | tail -1)
        rate=$(sed -n 's/.* \([0-9]*\)\/s .*/\1/p' <<<"$out")
        cpu=-
        bare_rate=$rate
      elif [ "$b" = sim ] || [ "$b" = ref-sim ]; then
        out=$("$DIR/$b" sim --redis "$URL" --stock $((REQUESTS * 2)) --segments "$segments" \
          --users "$REQUESTS" --requests "$REQUESTS" --per-user-limit "$limit" \
          --concurrency "$tasks" --json)
        read -r rate ok < <(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(int(j["throughput_per_s"]), j["audit_ok"] and j["oversold"] == 0)' "$out")
        [ "$ok" = True ] || { echo "sim: $out" >&2; exit 1; }
        cpu=-
      else
        out=$("$DIR/$b" "$REQUESTS" "$tasks" "$segments" "$URL" "--per-user-limit=$limit" | tail -1)
        [[ $out == *"audit ok"* ]] || { echo "$b: $out" >&2; exit 1; }
        rate=$(sed -n 's/.*: \([0-9]*\)\/s.*/\1/p' <<<"$out")
        cpu=$(sed -n 's/.*, \([0-9.]*\) µs CPU.*/\1/p' <<<"$out")
        bytes=$(python3 -c "print(round(($(mem) - $m0) / $REQUESTS))")
      fi
      us=$(($(usec) - u0))
      ratio=$(python3 -c "print(f'{$rate / $bare_rate:.2f}')")
      redis=$(python3 -c "print(f'{$us / $REQUESTS:.2f}')")
      echo "| $r | $tasks:$segments:$limit | $b | $rate | $ratio | $redis | $cpu | $bytes |"
    done
  done
done
