#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR/../lib
# Suite lib-vs-bare: the library against the bare check-and-DECRBY script, interleaved rounds on one redis-server (optionally a git ref's build too)
# Tables: README.md "Measured" (the library against a bare script; Redis CPU per sale and per remembered request; without a per-user limit); docs/benchmarks.md "Exactly-once against the bare script", "Without a per-user limit"; docs/capacity.md (the busy-loop table)
# Needs: redis-server redis-cli python3 cargo git
# Time: ~2 min after the build with the defaults (3 rounds of 3 configurations × bare, library, sim at 300,000 requests); ROUNDS=1 REQUESTS=20000 CONFIGS="256:1 64:1:0": ~10 s; a REF adds a full release build
#
# On a shared 2-core machine one run of each moves by ±30 %, so every round runs every binary
# once, in turn, on one private redis-server.
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
# Usage: scripts/bench.sh lib-vs-bare [REF]   env: ROUNDS (3), REQUESTS (300000),
#        CONFIGS ("256:1 64:1 64:16": tasks:segments[:per-user limit, default 1]),
#        SIM (1: also run `shardstock sim` per config; 0: not)
set -euo pipefail
. "$(dirname "$0")/../lib/harness.sh"
harness_init
REF=${1:-}
ROUNDS=${ROUNDS:-3}
REQUESTS=${REQUESTS:-300000}
CONFIGS=${CONFIGS:-256:1 64:1 64:16}
SIM=${SIM:-1}
need redis-server redis-cli python3
DIR=$WORK
[ -z "$REF" ] || on_exit "git worktree remove --force \"$DIR/ref\" 2>/dev/null"

build_release --example bare_script --example embedded_rate
cp "$RELEASE/examples/bare_script" "$DIR/bare"
cp "$RELEASE/examples/embedded_rate" "$DIR/lib"
build_release --features cli --bin shardstock
cp "$RELEASE/shardstock" "$DIR/sim"
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

redis_start
CLI=(redis-cli -p "$REDIS_PORT")
URL=$REDIS_URL

echo "| round | tasks:segments:limit | binary | sales/s | ÷ bare | Redis CPU µs/request | client CPU µs/request | bytes/request |"
echo "|---|---|---|---:|---:|---:|---:|---:|"
for r in $(seq "$ROUNDS"); do
  for c in $CONFIGS; do
    IFS=: read -r tasks segments limit <<<"$c"
    limit=${limit:-1}
    bare_rate=
    for b in bare "${LIBS[@]}"; do
      "${CLI[@]}" FLUSHALL >/dev/null
      u0=$(redis_cpu_usec)
      m0=$(redis_used_memory)
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
        bytes=$(python3 -c "print(round(($(redis_used_memory) - $m0) / $REQUESTS))")
      fi
      us=$(($(redis_cpu_usec) - u0))
      ratio=$(python3 -c "print(f'{$rate / $bare_rate:.2f}')")
      redis=$(python3 -c "print(f'{$us / $REQUESTS:.2f}')")
      echo "| $r | $tasks:$segments:$limit | $b | $rate | $ratio | $redis | $cpu | $bytes |"
    done
  done
done
