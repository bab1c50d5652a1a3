# shellcheck shell=bash
# sell_bench.sh — sourced by the suites under scripts/bench/ that drive the selling script with
# redis-benchmark (ceiling, throughput, batch-cost, fcall-cost, profile, scaleout): how they
# compose and call it.
#
# Every sale is decided by src/scripts/sell.lua (prelude.lua prepended, as
# src/store/redis/lua.rs composes it; a lone request is a batch of one). Its contract has had
# four forms, each named by a kind scripts compare across git refs with:
#   runs    (today) KEYS as `spec`; the requests as runs of one spec: the spec, the run's length
#           m, its m users, then their m request ids. N fresh requests are one run
#           `1:0:<ttl> N u__rand_int__ … r__rand_int__ …`.
#   spec    KEYS segment, reservations, credits, outbox, limited ledgers; three ARGV per request: user,
#           request id, `<qty>:<resv_ttl_ms>:<ttl_ms>`; one string as the reply. A fresh request
#           per call: `u__rand_int__ r__rand_int__ 1:0:<ttl>` (each __rand_int__ gets its own
#           random number: a new buyer, a new request id).
#   sell    KEYS[4+j] the ledger of request j's user, five ARGV per request; the ledger key ends
#           in `u__rand_int__` and scripts/lib/fresh_user.lua (placed after the prelude) sets the
#           user argument from it, since redis-benchmark cannot repeat one random value.
#   deduct  before sell.lua: deduct.lua (prelude + deduct_core + deduct.lua) and a coalesced
#           call deduct_batch.lua (prelude + deduct_core + deduct_batch.lua), their own KEYS/ARGV.
# The segment is written by the real load_segment.lua (prelude + load_segment.lua run with
# EVAL), generation 1, per-user limit SELL_LIMIT (default 0: none), outbox off, the home function
# version of the measured code.

SELL_BENCH_LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The home function version (src/segments.rs HOME_FN) in source tree $1 (default 1).
sell_home_fn() {
  local v
  v=$(sed -n 's/^pub const HOME_FN: u32 = \([0-9]*\);.*/\1/p' "$1/src/segments.rs" 2>/dev/null | head -1)
  echo "${v:-1}"
}

# sell_kind FILE: the contract of the sell.lua in FILE (runs, spec or sell).
sell_kind() {
  if grep -q 'as runs of one spec' "$1"; then echo runs
  elif grep -q 'request j: user, request id, spec' "$1"; then echo spec
  else echo sell; fi
}

# sell_compose DIR OUT: prelude (+ the fresh_user shim for the `sell` contract) + sell.lua from
# the source tree DIR into OUT; sets SELL_KIND to its contract.
sell_compose() {
  SELL_KIND=$(sell_kind "$1/src/scripts/sell.lua")
  if [ "$SELL_KIND" != sell ]; then
    cat "$1/src/scripts/prelude.lua" "$1/src/scripts/sell.lua" > "$2"
  else
    cat "$1/src/scripts/prelude.lua" "$SELL_BENCH_LIB/fresh_user.lua" "$1/src/scripts/sell.lua" > "$2"
  fi
}

# sell_compose_ref REPO REF FORM OUT: the selling script at git REF of REPO into OUT, composed as
# that commit's build did. FORM: single (one request per call) or batch (a coalesced call).
# Prints the contract it used (deduct, sell or spec); fails when the ref has no selling script.
sell_compose_ref() {
  local repo=$1 ref=$2 form=$3 out=$4 last kind
  last=deduct.lua
  [ "$form" = batch ] && last=deduct_batch.lua
  if git -C "$repo" cat-file -e "$ref:src/scripts/$last" 2>/dev/null; then
    {
      git -C "$repo" show "$ref:src/scripts/prelude.lua"
      git -C "$repo" show "$ref:src/scripts/deduct_core.lua" 2>/dev/null || true
      git -C "$repo" show "$ref:src/scripts/$last"
    } > "$out"
    echo deduct
  elif git -C "$repo" cat-file -e "$ref:src/scripts/sell.lua" 2>/dev/null; then
    git -C "$repo" show "$ref:src/scripts/sell.lua" > "$out.sell"
    kind=$(sell_kind "$out.sell")
    {
      git -C "$repo" show "$ref:src/scripts/prelude.lua"
      [ "$kind" = sell ] && cat "$SELL_BENCH_LIB/fresh_user.lua"
      cat "$out.sell"
    } > "$out"
    rm -f "$out.sell"
    echo "$kind"
  else
    echo "neither sell.lua nor $last at $ref" >&2
    return 1
  fi
}

# The home function version at git REF of REPO (default 1).
sell_home_fn_ref() {
  local v
  v=$(git -C "$1" show "$2:src/segments.rs" 2>/dev/null | sed -n 's/^pub const HOME_FN: u32 = \([0-9]*\);.*/\1/p' | head -1)
  echo "${v:-1}"
}

# sell_load_segment LOADLUA SEG UNITS HF CLI...: writes segment hash SEG (`<prefix>:{<tag>}:seg`),
# generation 1, UNITS units, per-user limit SELL_LIMIT (default 0), outbox off, with the real
# load_segment.lua (the composed
# prelude + load_segment.lua in file LOADLUA), through the redis-cli command CLI...
# Prints load_segment's reply (first line "ok" when written); redis-cli's errors (MOVED on a
# cluster node that does not serve the slot) go to stdout too.
sell_load_segment() {
  local lua=$1 seg=$2 units=$3 hf=$4
  shift 4
  if grep -q '^-- KEYS\[3\]' "$lua"; then
    # Today's loader also pads the generation's ledgers (declared as KEYS[3]).
    "$@" EVAL "$(cat "$lua")" 3 "$seg" "${seg%seg}out" "${seg%seg}g1:led" 1 "$units" 0 "${SELL_LIMIT:-0}" "$hf" 2>&1
  else
    "$@" EVAL "$(cat "$lua")" 2 "$seg" "${seg%seg}out" 1 "$units" 0 "${SELL_LIMIT:-0}" "$hf" 2>&1
  fi
}

# sell_load_lua DIR OUT: prelude + load_segment.lua of source tree DIR into OUT.
sell_load_lua() {
  cat "$1/src/scripts/prelude.lua" "$1/src/scripts/load_segment.lua" > "$2"
}

# sell_keys_args SEG HF N TTL_MS [KIND]: fills the arrays SELL_KEYS and SELL_ARGS with an
# EVALSHA's KEYS and ARGV for sell.lua (without the key count): N fresh one-unit sales (no
# reservation, record TTL TTL_MS) at segment SEG (index 0, generation 1, no fence, no credits),
# in contract KIND (default $SELL_KIND, else runs).
sell_keys_args() {
  local seg=$1 hf=$2 n=$3 ttl=$4 kind=${5:-${SELL_KIND:-runs}} base g j
  base=${seg%seg}
  g="${base}g1"
  SELL_KEYS=("$seg" "$g:resv" "$g:in" "${base}out")
  SELL_ARGS=(1 "$hf" 0 0 0 "$n")
  if [ "$kind" = runs ]; then
    SELL_KEYS+=("$g:led" "$g:hold")
    SELL_ARGS+=("1:0:$ttl" "$n")
    for ((j = 0; j < n; j++)); do SELL_ARGS+=(u__rand_int__); done
    for ((j = 0; j < n; j++)); do SELL_ARGS+=(r__rand_int__); done
  elif [ "$kind" = spec ]; then
    SELL_KEYS+=("$g:led")
    for ((j = 0; j < n; j++)); do
      SELL_ARGS+=(u__rand_int__ r__rand_int__ "1:0:$ttl")
    done
  else
    for ((j = 0; j < n; j++)); do
      SELL_KEYS+=("$g:u:u__rand_int__")
      SELL_ARGS+=(from-key r__rand_int__ 1 0 "$ttl")
    done
  fi
}

# sell_probe_ok REPLY: true when a probe call's first reply line is an applied sale: a number
# (sell.lua's stock after, deduct_batch.lua's too; the stock before in today's one-string reply,
# then `a` per applied request) or "applied" (deduct.lua).
sell_probe_ok() {
  [[ "$1" =~ ^[0-9]+( a|$) ]] || [ "$1" = applied ]
}

# The steps of today's sell.lua, for the ladders (`scripts/bench.sh batch-cost`, `fcall-cost`):
# SELL_CUTS[k] is the first line of the step after step k (the script is cut there and returns
# '1'), SELL_STEPS[k] what the cut so far has done, cumulative.
SELL_CUTS=("local v = redis.call('HMGET', KEYS[1]" "-- Each run's spec" "-- out[j]: request j's answer"
  "-- Decide each request" "-- Counters once, then the records" "-- Every ledger written"
  "-- The writes each applied request needs beyond its ledger")
# shellcheck disable=SC2034 # read by the suites
SELL_STEPS=("header checked (generation, credits, keys, runs)" "+ segment read"
  "+ specs parsed, ids scanned" "+ counters opened, credits, reclaim"
  "+ ledgers read (one HMGET per run), every request decided" "+ counters written (HSET)"
  "+ ledgers written (HSET)")

# sell_cut FILE K OUT: the composed script in FILE cut short before SELL_CUTS[K] (everything up
# to that step's first line, then `return '1'`) into OUT; fails when the marker is not in FILE.
sell_cut() {
  awk -v pat="${SELL_CUTS[$2]}" 'index($0, pat) == 1 { found = 1; exit } { print } END { exit !found }' \
    "$1" > "$3" || { echo "step marker not in sell.lua: ${SELL_CUTS[$2]}" >&2; return 1; }
  echo "return '1'" >> "$3"
}

# sell_ceiling_csv PORT SHA SEG HF N: the script ceiling on the redis-server at PORT —
# redis-benchmark (50 clients, pipeline 64) sending N EVALSHA calls of the selling script SHA,
# each a lone one-unit sale of a new buyer with a new request id, at segment SEG (written
# already, home function HF). One probe call must sell first. Prints redis-benchmark's CSV.
sell_ceiling_csv() {
  local port=$1 sha=$2 seg=$3 hf=$4 n=$5 probe
  sell_keys_args "$seg" "$hf" 1 600000
  probe=$(redis-cli -p "$port" EVALSHA "$sha" "${#SELL_KEYS[@]}" "${SELL_KEYS[@]//__rand_int__/probe}" \
    "${SELL_ARGS[@]//__rand_int__/probe}" 2>&1 | head -1)
  sell_probe_ok "$probe" || { echo "sell script probe on port $port answered '$probe', not the stock after a sale" >&2; return 1; }
  redis-benchmark -p "$port" -c 50 -P 64 -n "$n" -r 100000000000 --csv \
    EVALSHA "$sha" "${#SELL_KEYS[@]}" "${SELL_KEYS[@]}" "${SELL_ARGS[@]}"
}

# sell_tree_desc: the working tree's commit, `+changes` when src/scripts differs from it.
sell_tree_desc() {
  echo "$(git -C "$1" rev-parse --short HEAD)$(git -C "$1" diff --quiet HEAD -- src/scripts || echo '+changes')"
}
