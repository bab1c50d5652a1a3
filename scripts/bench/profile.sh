#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR/../lib
# Suite profile: where a sale's time goes — the Lua cost ladder inside Redis, redis-server and the client under perf, as a Markdown report
# Tables: docs/benchmarks.md "Where the time goes"
# Needs: redis-server redis-cli redis-benchmark perf python3 git cargo
# Time: its own release build with line tables (minutes), then ~3 min; QUICK=1 LADDER_CALLS=20000 PROFILE_BIN=<a release shardstock>: ~30 s, no build
#
# Where does the time of a deduction (a sale) go? Measurements, printed as a Markdown report on
# stdout (progress goes to stderr).
#
# 1. Lua cost ladder: variants of the selling script (sell.lua, a lone request: a batch of one),
#    each driven by redis-benchmark (EVALSHA, 50 clients, -P 64, a random user and request id
#    per call) against a private redis-server; the time per call inside Redis comes from INFO
#    commandstats (CONFIG RESETSTAT before each variant), the inner commands' figures and the
#    residual (Lua interpreter + script call) too.
# 2. perf profile of redis-server while the real selling script runs, in buckets (keyspace dict,
#    number formatting, malloc, Lua VM, kernel, other) plus the top symbols.
# 3. perf profile of the client: `shardstock sim` against that redis (strategy lua), and the
#    embedded store (1 and 16 segments, concurrency 64; 1 segment with one task), by
#    crate/module, top symbols, a per-deduction cost breakdown from the call chains (DWARF
#    unwinding, inlined frames included) and a timeline check for stalls (records-map rehash).
#
# The ladder's rows: the call alone (`return 1`), the prelude, the bare check-and-decrement,
# and the real script (prelude.lua + sell.lua as the build composes it). Where the real
# script's own instructions go, step by step, is the fcall-cost suite's LADDER=1 (callgrind:
# the script cut after each step; repeatable to < 1 %), for batches of any size.
# Fresh buyers: the request carries redis-benchmark's __rand_int__ as user and request id
# (scripts/lib/sell_bench.sh); the segment is written by the real load_segment.lua.
#
# Which code: SRC_REF=HEAD (default) exports that commit with `git archive` into
# <target>/profile/src-<sha> and builds/reads the Lua scripts from there, so edits in progress
# in the working tree neither break nor skew the run. SRC_REF=worktree uses the working tree as
# it is. The binary is built with CARGO_PROFILE_RELEASE_DEBUG=line-tables-only into
# <target>/profile, <target> being CARGO_TARGET_DIR (default target): never the main target
# directory itself. The ladder needs sell.lua at SRC_REF; an older commit's script can still be
# measured as the "2b" row (LADDER_BASE_REF).
#
# Usage: scripts/bench.sh profile > report.md
#   QUICK=1         smaller counts, shorter perf windows (about a minute after the build)
#   SRC_REF=<ref>   git ref to measure (default HEAD), or "worktree"
#   LADDER_CALLS=N  redis-benchmark calls per ladder variant (default 300000; QUICK 100000)
#   ROUNDS=N        times the whole ladder is measured, interleaved; the median is shown (default 1)
#   SKIP_BUILD=1    use <target>/profile/release/shardstock as it is
#   PROFILE_BIN=<path>  use that binary as it is (no build; e.g. target/release/shardstock when it
#                   is fresh: it has symbols but no line tables, so the client's call chains lose
#                   inlined frames and attribute more to their callers)
#   LADDER_BASE_REF=<ref>  also measure the real selling script of that commit (a "2b" row):
#                   prelude + sell.lua, or, for a commit from before sell.lua, prelude +
#                   deduct_core.lua + deduct.lua with that script's own KEYS/ARGV
#   KEEP=1          keep the temporary directory (perf data, sim JSON) and print its path
set -euo pipefail
. "$(dirname "$0")/../lib/harness.sh"
. "$(dirname "$0")/../lib/sell_bench.sh"
harness_init
QUICK=${QUICK:-0}
SRC_REF=${SRC_REF:-HEAD}
ROUNDS=${ROUNDS:-1}
if [ "$QUICK" = 1 ]; then
  LADDER_CALLS=${LADDER_CALLS:-100000}
  PERF_SECS=2
  SIM_LUA_REQUESTS=60000
  EMB_REQUESTS=500000
else
  LADDER_CALLS=${LADDER_CALLS:-300000}
  PERF_SECS=5
  SIM_LUA_REQUESTS=160000
  EMB_REQUESTS=2000000
fi
CLIENT_FREQ=199 # perf sampling frequency for the client (DWARF stacks are 8 KiB each)

need redis-server redis-cli redis-benchmark perf python3 git cargo
log() { echo "[profile] $*" >&2; }

DIR=$WORK
BPID=
# shellcheck disable=SC2016 # expanded when the trap runs
on_exit '[ -z "$BPID" ] || kill "$BPID" 2>/dev/null'
T_START=$(date +%s)

# --- the code to measure and the binary -------------------------------------------------------
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/profile"
export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
if [ "$SRC_REF" = worktree ]; then
  SRC=$ROOT
  WANT="worktree" # never matches a stamp: always rebuilt
  SRC_DESC="working tree at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock || echo ' + uncommitted changes')"
else
  SHA=$(git rev-parse --verify "$SRC_REF^{commit}")
  SRC="$CARGO_TARGET_DIR/src-$SHA"
  WANT=$SHA
  if [ ! -f "$SRC/Cargo.toml" ]; then
    mkdir -p "$CARGO_TARGET_DIR"
    find "$CARGO_TARGET_DIR" -maxdepth 1 -name 'src-*' -exec rm -rf {} + # older exports
    mkdir -p "$SRC.tmp"
    git archive "$SHA" | tar -x -C "$SRC.tmp"
    mv "$SRC.tmp" "$SRC"
  fi
  SRC_DESC="commit $(git rev-parse --short "$SHA") ($SRC_REF), exported with git archive"
fi
BIN="$CARGO_TARGET_DIR/release/shardstock"
# Cargo's freshness check can take another export (or the working tree) for the same package, so
# the stamp says which code the binary was built from; anything else is rebuilt from clean.
STAMP="$CARGO_TARGET_DIR/.profile-built-from"
T_BUILD=0
if [ -n "${PROFILE_BIN:-}" ]; then
  BIN=$(cd "$(dirname "$PROFILE_BIN")" && pwd)/$(basename "$PROFILE_BIN")
  SRC_DESC="$SRC_DESC; PROFILE_BIN=$PROFILE_BIN used as it is (built $(date -u -r "$BIN" '+%Y-%m-%d %H:%M UTC'), no line tables unless it was built with them)"
elif [ "${SKIP_BUILD:-0}" != 1 ]; then
  log "building $SRC_DESC (release + line tables) ..."
  t0=$(date +%s)
  if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ] || [ "$WANT" = worktree ]; then
    rm -f "$STAMP"
    (cd "$SRC" && cargo clean --release -p shardstock --quiet)
  fi
  (cd "$SRC" && cargo build --release --quiet --features cli --bin shardstock)
  echo "$WANT" > "$STAMP"
  T_BUILD=$(($(date +%s) - t0))
else
  SRC_DESC="$SRC_DESC; SKIP_BUILD=1, binary built from: $(cat "$STAMP" 2>/dev/null || echo unknown)"
fi
[ -x "$BIN" ] || { echo "$BIN missing" >&2; exit 1; }
T_MEASURE0=$(date +%s)

# --- a private redis-server -------------------------------------------------------------------
redis_start
PORT=$REDIS_PORT
PID=$REDIS_PID
CLI=(redis-cli -p "$PORT")
URL=$REDIS_URL

# --- the Lua variants ---------------------------------------------------------------------------
PRELUDE="$SRC/src/scripts/prelude.lua"
SELL="$SRC/src/scripts/sell.lua"
[ -f "$SELL" ] || { echo "$SELL missing: the ladder is written for sell.lua (SRC_REF=$SRC_REF predates it; measure an older script with LADDER_BASE_REF)" >&2; exit 1; }
HF=$(sell_home_fn "$SRC")
# The real script, composed like the build does.
sell_compose "$SRC" "$DIR/real.lua"
REAL_DESC="prelude.lua + sell.lua"
sell_load_lua "$SRC" "$DIR/load.lua"
# Optionally the real script of another commit too, for a before/after row.
LADDER_BASE_REF=${LADDER_BASE_REF:-}
BASE_KIND=
if [ -n "$LADDER_BASE_REF" ]; then
  BASE_SHA=$(git rev-parse --short "$LADDER_BASE_REF^{commit}")
  BASE_KIND=$(sell_compose_ref "$ROOT" "$BASE_SHA" single "$DIR/base-src.lua")
  BASE_HF=$(sell_home_fn_ref "$ROOT" "$BASE_SHA")
  if [ "$BASE_KIND" = sell ]; then
    { git show "$BASE_SHA:src/scripts/prelude.lua"; git show "$BASE_SHA:src/scripts/load_segment.lua"; } > "$DIR/base-load.lua"
    BASE_DESC="prelude.lua + sell.lua"
  else
    BASE_DESC="prelude.lua + deduct_core.lua + deduct.lua, its own KEYS/ARGV"
  fi
fi
make_variant() { # $1 = id
  case $1 in
    v0) echo "return 1" ;;
    v0p) cat "$PRELUDE"; echo "return 1" ;;
    v1)
      cat <<'LUA'
local stock = tonumber(redis.call('HGET', KEYS[1], 'stock'))
local qty = 1
if stock >= qty then
  redis.call('HINCRBY', KEYS[1], 'stock', -qty)
  return { stock - qty }
end
return { { 'short', stock } }
LUA
      ;;
    v6) cat "$DIR/real.lua" ;;
    base) cat "$DIR/base-src.lua" ;;
  esac
}
VARIANTS=(v0 v0p v1 v6)
[ -n "$LADDER_BASE_REF" ] && VARIANTS+=(base)
declare -A VDESC=(
  [v0]="\`return 1\` (EVALSHA with the same keys and args as the real script)"
  [v0p]="prelude.lua prepended (its local functions are created on every call), then \`return 1\`"
  [v1]="bare check-and-decrement: HGET stock, HINCRBY stock -1 (no prelude)"
  [v6]="the real script: $REAL_DESC"
  [base]="the real script at ${BASE_SHA:-?} (LADDER_BASE_REF=$LADDER_BASE_REF): ${BASE_DESC:-?}"
)
declare -A VSTEP=([v0]=0 [v0p]=0p [v1]=1 [v6]=2 [base]=2b)
for v in "${VARIANTS[@]}"; do make_variant "$v" > "$DIR/$v.lua"; done

SEG='prof:{prof#0}:seg'
# sell.lua's KEYS (segment, reservation index, credits, outbox, the buyer's ledger with a random
# user) and ARGV (gen hf index fence credits=0 n=1, user from the key, random request id, qty 1,
# a sale, record TTL 600 s).
sell_keys_args "$SEG" "$HF" 1 600000
SELL_CALL=("${#SELL_KEYS[@]}" "${SELL_KEYS[@]}" "${SELL_ARGS[@]}")
# deduct.lua's (a LADDER_BASE_REF from before sell.lua): segment, request record (random id),
# reservation index, claim index, outbox; gen user qty index ttl_ms lease_ms claim mode fence
# resv_ttl_ms.
DEDUCT_CALL=(5 "$SEG" 'prof:{prof#0}:g1:rq:__rand_int__' 'prof:{prof#0}:g1:resv' 'prof:{prof#0}:g1:claims'
  'prof:{prof#0}:out' 1 u1 1 0 600000 5000 1 lua 0 0)
# The call, load script and home function version of variant $1 (sets CALL, LOAD, VHF, KIND).
variant_call() {
  if [ "$1" = base ] && [ "$BASE_KIND" = deduct ]; then
    CALL=("${DEDUCT_CALL[@]}"); KIND=deduct; LOAD=; VHF=
  elif [ "$1" = base ]; then
    # That commit's own contract (runs, spec or sell).
    sell_keys_args "$SEG" "$BASE_HF" 1 600000 "$BASE_KIND"
    CALL=("${#SELL_KEYS[@]}" "${SELL_KEYS[@]}" "${SELL_ARGS[@]}"); KIND=sell; LOAD="$DIR/base-load.lua"; VHF=$BASE_HF
  else
    CALL=("${SELL_CALL[@]}"); KIND=sell; LOAD="$DIR/load.lua"; VHF=$HF
  fi
}
reset_keyspace() { # $1 = variant (default v6)
  variant_call "${1:-v6}"
  "${CLI[@]}" FLUSHALL >/dev/null
  if [ "$KIND" = sell ]; then
    # The real load_segment.lua: generation 1, stock far beyond any call count here, no limit.
    local r; r=$(sell_load_segment "$LOAD" "$SEG" 999999999999 "$VHF" "${CLI[@]}" | head -1)
    [ "$r" = ok ] || { echo "load_segment.lua answered '$r', not 'ok'" >&2; exit 1; }
  else
    # The fields the deduct-era load_segment.lua wrote, generation 1.
    "${CLI[@]}" HSET "$SEG" gen 1 stock 999999999999 loaded 999999999999 restocked 0 sold 0 reserved 0 out 0 >/dev/null
  fi
}
bench_evalsha() { # $1 = sha, $2 = calls, $3 = variant; prints the redis-benchmark CSV
  variant_call "$3"
  redis-benchmark -p "$PORT" -c 50 -P 64 -n "$2" -r 100000000000 --csv EVALSHA "$1" "${CALL[@]}"
}
commandstats() { "${CLI[@]}" INFO commandstats | tr -d '\r' | grep '^cmdstat_' || true; }

LADDER="$DIR/ladder.jsonl"
declare -A SHAS
for v in "${VARIANTS[@]}"; do
  SHAS[$v]=$("${CLI[@]}" -x SCRIPT LOAD < "$DIR/$v.lua")
done
for round in $(seq "$ROUNDS"); do
  for v in "${VARIANTS[@]}"; do
    log "ladder round $round: $v ($LADDER_CALLS calls)"
    reset_keyspace "$v"
    sha=${SHAS[$v]}
    probe=$("${CLI[@]}" EVALSHA "$sha" "${CALL[@]//__rand_int__/probe}" 2>&1 | head -1)
    if ! sell_probe_ok "$probe"; then
      python3 -c 'import json,sys; print(json.dumps({"v":sys.argv[1],"round":int(sys.argv[2]),"error":sys.argv[3]}))' \
        "$v" "$round" "$probe" >> "$LADDER"
      continue
    fi
    "${CLI[@]}" CONFIG RESETSTAT >/dev/null
    csv=$(bench_evalsha "$sha" "$LADDER_CALLS" "$v")
    stats=$(commandstats)
    python3 - "$v" "$round" "$csv" "$stats" >> "$LADDER" <<'PY'
import csv, io, json, re, sys
v, rnd, csvtext, stats = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = list(csv.reader(io.StringIO(csvtext)))
cmds = {}
for line in stats.splitlines():
    m = re.match(r"cmdstat_([^:]+):calls=(\d+),usec=(\d+),usec_per_call=([\d.]+)", line)
    if m:
        cmds[m.group(1)] = {"calls": int(m.group(2)), "usec": int(m.group(3)), "upc": float(m.group(4))}
print(json.dumps({"v": v, "round": rnd, "rps": float(rows[-1][1]), "cmds": cmds}))
PY
  done
done

# --- redis-server under perf, real script ------------------------------------------------------
log "perf record redis-server for ${PERF_SECS}s while redis-benchmark runs the real script"
reset_keyspace v6
"${CLI[@]}" CONFIG RESETSTAT >/dev/null
redis-benchmark -p "$PORT" -c 50 -P 64 -n 100000000 -r 100000000000 --csv \
  EVALSHA "${SHAS[v6]}" "${SELL_CALL[@]}" > /dev/null 2>&1 &
BPID=$! # redis-benchmark itself (not a subshell), so that kill stops it
sleep 1
perf record -F 999 -g -p "$PID" -o "$DIR/redis.perf" -- sleep "$PERF_SECS" >/dev/null 2>"$DIR/redis.perf.err" || true
kill "$BPID" 2>/dev/null || true
wait "$BPID" 2>/dev/null || true
BPID=
REDIS_PERF_STATS=$(commandstats)
perf report -i "$DIR/redis.perf" --no-children --sort dso,sym --stdio -g none --percent-limit 0 \
  2>/dev/null > "$DIR/redis.report" || true

# --- the client under perf ----------------------------------------------------------------------
ANALYZE="$DIR/analyze.py"
cat > "$ANALYZE" <<'PY'
import collections, json, re, sys

HDR = re.compile(r"^(\S.*?)\s+(\d+)\s+(\d+\.\d+):\s+(\d+)\s*$")

def parse(path):
    """perf script -F comm,tid,time,period,ip,sym,dso with call chains -> samples."""
    samples, cur = [], None
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            if not line[0].isspace():
                m = HDR.match(line.rstrip("\n"))
                if m:
                    cur = {"comm": m.group(1), "tid": int(m.group(2)), "t": float(m.group(3)),
                           "period": int(m.group(4)), "frames": []}
                    samples.append(cur)
                continue
            if cur is None:
                continue
            s = line.strip()
            ip, _, rest = s.partition(" ")
            inlined = rest.endswith("(inlined)")
            dso = None
            if inlined:
                sym = rest[: -len("(inlined)")].rstrip()
            elif rest.endswith(")") and " (" in rest:
                i = rest.rindex(" (")
                sym, dso = rest[:i], rest[i + 2 : -1]
            else:
                sym = rest
            cur["frames"].append((ip, sym, dso, inlined))
    for s in samples:
        leaf = next(((ip, sym, dso) for ip, sym, dso, inl in s["frames"] if not inl),
                    s["frames"][0][:3] if s["frames"] else ("?", "[unknown]", "?"))
        s["leaf"], s["leaf_dso"] = leaf[1], leaf[2] or "?"
        s["kernel"] = leaf[0].startswith("ffffffff") or "kernel" in (leaf[2] or "")
        s["chain"] = [f[1] for f in s["frames"]]
        s["fns"] = [strip_generics(f[1]) for f in s["frames"]]
    return samples

LEAF_BUCKETS = [
    ("kernel (syscalls, networking, page faults, scheduler)", lambda s: s["kernel"]),
    ("alloc/malloc (libc malloc/free, Rust alloc, Vec/String growth)", lambda s: re.search(
        r"^(malloc|free|cfree|_int_|realloc|calloc|__libc_|tcache|sysmalloc|alloc_perturb|"
        r"__rust_(alloc|dealloc|realloc)|alloc::alloc|<alloc::alloc|<alloc::raw_vec|alloc::raw_vec|"
        r"__GI___libc_|unlink_chunk|malloc_consolidate|arena_)", s["leaf"])),
    ("libc mem*/str* (memcpy, memcmp)", lambda s: re.search(r"^__(mem|str)|^mem(cpy|move|cmp|set)", s["leaf"])),
    ("hashing + hash tables (SipHash/foldhash, hashbrown, DashMap)", lambda s: re.search(
        r"sip::Hasher|foldhash|hash_one|BuildHasher|rapidhash|fnv|hashbrown|dashmap|Hash>::hash|::hash::", s["leaf"])),
    ("fred (Redis client)", lambda s: "fred::" in s["leaf"]),
    ("redis_protocol / bytes (RESP codec)", lambda s: re.search(r"redis_protocol|bytes::|bytes_utils", s["leaf"])),
    ("tokio (runtime, I/O driver, mio)", lambda s: re.search(r"tokio::|mio::|<tokio", s["leaf"])),
    ("metrics (metrics crate, exporter, shardstock::metrics)", lambda s: re.search(r"metrics", s["leaf"])),
    ("shardstock::store::memory", lambda s: "shardstock::store::memory" in s["leaf"]),
    ("shardstock::store::redis", lambda s: "shardstock::store::redis" in s["leaf"]),
    ("shardstock::engine (+ segments, router, guard, ids)", lambda s: re.search(
        r"shardstock::(engine|segments|router|guard|ids|coalesce|strategy|store::)", s["leaf"])),
    ("sim harness (shardstock::sim, hdrhistogram)", lambda s: re.search(r"shardstock::sim|hdrhistogram|shardstock::dispatch|shardstock::run", s["leaf"])),
    ("formatting (core::fmt)", lambda s: re.search(r"core::fmt|alloc::fmt|fmt::", s["leaf"])),
    ("clock (clock_gettime, Instant)", lambda s: re.search(r"clock_gettime|Instant|vdso", s["leaf"])),
    ("locks/futex (std Mutex, parking)", lambda s: re.search(r"futex|Mutex|Condvar|parking|park", s["leaf"])),
    ("other shardstock", lambda s: "shardstock" in s["leaf"]),
]

def leaf_bucket(s):
    for name, f in LEAF_BUCKETS:
        if f(s):
            return name
    return "other"

def strip_generics(name):
    """foo<T, U>::bar -> foo::bar (a leading qualified-path '<' is kept)."""
    out, depth, prev = [], 0, ""
    for ch in name:
        if depth:
            depth += (ch == "<") - (ch == ">")
            continue
        if ch == "<" and (prev.isalnum() or prev in "_}"):
            depth = 1
            continue
        out.append(ch)
        prev = ch
    return "".join(out)

def has(chain, *subs):
    """Raw frame names (generic arguments included)."""
    return any(all(x in fr for x in subs) for fr in chain)

def fn(s, *subs):
    """Function identity: frame names without generic arguments (so a type parameter such as
    MemoryStore in an async block's name does not count as being inside the store)."""
    return any(all(x in fr for x in subs) for fr in s["fns"])

def rehash_target(s):
    frames = s["frames"]
    idx = [i for i, f in enumerate(frames) if "reserve_rehash" in f[1]]
    if not idx:
        return None
    if any("memory::Rec" in frames[i][1] for i in idx):
        return "records"
    # Without inline info: the first real caller after the last reserve_rehash frame.
    for ip, sym, dso, inl in frames[idx[-1] + 1 :]:
        if not inl and "reserve_rehash" not in sym:
            return "records" if "store::memory" in strip_generics(sym) else "other"
    return "other"

# Per-deduction paths, first match wins (so they add up to 100 %).
MALLOC_LEAF = re.compile(r"malloc|free|_int_|realloc|calloc|tcache|arena_|__mem|memcpy|memmove|memcmp")

def path(s):
    c = s["chain"]
    main = not s["comm"].startswith("tokio-rt")
    if main:
        if fn(s, "sim::Tally::merge"):
            return "main thread: merging the workers' Tally maps (counted in the sim's elapsed time)"
        if has(c, "drop_in_place<") or fn(s, "Drop>::drop"):
            return "main thread: dropping the store after the run"
        return "main thread: other (start-up, load, audit, exit; libc frames not unwound)"
    r = rehash_target(s)
    if r == "records":
        return "store: records HashMap grow (reserve_rehash: rehash + move every entry, page faults)"
    if has(c, "retain<", "store::memory"):
        return "store: records sweep (HashMap::retain over the records, from Seg::put)"
    if fn(s, "sim::Tally::"):
        return "sim harness: Tally (per-user HashMap<u64,u64> per worker, merged at the end)"
    if r == "other":
        return "other HashMap/DashMap growth"
    if has(c, "insert<", "store::memory::Rec"):
        return "store: record insert (hash + probe, no growth)"
    if fn(s, "store::memory::Seg::rec"):
        return "store: record lookup + expiry check (Seg::rec)"
    if fn(s, "shardstock::store::memory"):
        return "store: rest (segment DashMap lookup, mutex lock/unlock incl. futex wake, Rec::new, reclaim)"
    if fn(s, "shardstock::store::redis") or fn(s, "fred::") or fn(s, "redis_protocol"):
        return "redis client: store::redis + fred + RESP (incl. the I/O and syscalls they make)"
    if fn(s, "metrics"):
        return "metrics (counters/histograms recorded per deduction)"
    if fn(s, "shardstock::engine") or fn(s, "shardstock::segments") or fn(s, "shardstock::router") or fn(s, "shardstock::guard") or fn(s, "shardstock::ids"):
        return "engine: routing, layout cache, request building, guard"
    if fn(s, "hdrhistogram") or fn(s, "format_inner") or fn(s, "sim::run_sim") or fn(s, "Instant"):
        return "sim harness: format! ids, Deduct::new, latency histogram, Instant"
    if s["kernel"]:
        return "kernel, outside the above (scheduler, futex wake-ups, idle work)"
    if fn(s, "tokio::"):
        return "tokio runtime (scheduler, task polling, wake-ups)"
    if len(s["frames"]) <= 3 and MALLOC_LEAF.search(s["leaf"]):
        return "worker: libc malloc/free/mem* whose caller perf could not unwind"
    if not s["frames"] or s["leaf"] == "[unknown]":
        return "unresolved (no usable stack)"
    return "other"

def ms(ns):
    return ns / 1e6

def client(path_txt, json_path, label, requests, top_n=20, stall=False):
    samples = parse(path_txt)
    try:
        rep = json.load(open(json_path))
    except Exception:
        rep = {}
    total = sum(s["period"] for s in samples) or 1
    print(f"#### {label}\n")
    if rep:
        print(f"sim: {rep.get('requests', 0):,} requests, {rep.get('applied', 0):,} applied, "
              f"{rep.get('errors', 0)} errors, audit {'ok' if rep.get('audit_ok') else 'FAILED'}, "
              f"{rep.get('elapsed_s', 0):.2f} s, **{rep.get('throughput_per_s', 0):,.0f}/s**, "
              f"p50 {rep.get('p50_ms', 0):.3f} ms, p99 {rep.get('p99_ms', 0):.3f} ms, "
              f"p99.9 {rep.get('p999_ms', 0):.3f} ms, max **{rep.get('max_ms', 0):.1f} ms**.  ")
        if rep.get("first_error"):
            print(f"first error: `{rep['first_error'][:200]}`  ")
    work = sum(s["period"] for s in samples if s["comm"].startswith("tokio-rt"))
    print(f"perf: {len(samples):,} samples ({CLIENT_FREQ} Hz, DWARF stacks), {ms(total):,.0f} ms of CPU "
          f"in the process = {total / max(requests, 1) / 1e3:.2f} µs CPU per request (whole process, "
          f"start-up and teardown included); on the tokio worker threads alone (the sale itself): "
          f"**{work / max(requests, 1) / 1e3:.2f} µs CPU per request**.\n")
    b = collections.Counter()
    for s in samples:
        b[leaf_bucket(s)] += s["period"]
    print("Self time by crate/module (leaf symbol; inlined code counts for the function it is inlined into):\n")
    print("| bucket | share | µs per request |")
    print("|---|---:|---:|")
    for k, v in b.most_common():
        print(f"| {k} | {100 * v / total:.1f} % | {v / requests / 1e3:.3f} |")
    p = collections.Counter()
    for s in samples:
        p[path(s)] += s["period"]
    print("\nPer-request cost by code path (from the call chains, first match wins, so the rows add up):\n")
    print("| path | share | ns per request |")
    print("|---|---:|---:|")
    for k, v in p.most_common():
        print(f"| {k} | {100 * v / total:.1f} % | {v / requests:,.0f} |")
    sym = collections.Counter()
    for s in samples:
        sym[(s["leaf"][:110], (s["leaf_dso"] or "?").rsplit("/", 1)[-1])] += s["period"]
    print(f"\nTop {top_n} symbols (self):\n")
    print("| self | symbol | dso |")
    print("|---:|---|---|")
    for (k, d), v in sym.most_common(top_n):
        print(f"| {100 * v / total:.1f} % | `{k}` | {d} |")
    if stall:
        stall_timeline(samples)
    print()

def stall_timeline(samples, width=0.1):
    if not samples:
        return
    t0 = min(s["t"] for s in samples)
    tot = collections.Counter()
    rh = collections.Counter()
    sw = collections.Counter()
    for s in samples:
        k = int((s["t"] - t0) / width)
        tot[k] += s["period"]
        r = rehash_target(s)
        if r == "records":
            rh[k] += s["period"]
        elif has(s["chain"], "retain<", "store::memory"):
            sw[k] += s["period"]
    windows, cur = [], None
    for k in range(max(tot) + 1):
        hot = tot[k] and rh[k] / tot[k] >= 0.5
        if hot:
            if cur and cur[1] == k - 1:
                cur[1] = k
            else:
                cur = [k, k]
                windows.append(cur)
    print("\nRecords-map rehash windows (100 ms buckets where ≥ 50 % of the CPU samples are in the "
          "records HashMap's reserve_rehash, adjacent buckets merged):\n")
    if not windows:
        print("none found.")
        return
    print("| from (s after start) | length | rehash CPU in the window | all CPU in the window |")
    print("|---:|---:|---:|---:|")
    for a, z in windows:
        r = sum(rh[k] for k in range(a, z + 1))
        t = sum(tot[k] for k in range(a, z + 1))
        print(f"| {a * width:.1f} | {(z - a + 1) * width * 1000:.0f} ms | {ms(r):.0f} ms | {ms(t):.0f} ms |")
    print(f"\n(Sweep CPU outside those windows: {ms(sum(sw.values())):.0f} ms in total over "
          f"{len(tot)} buckets.)")

def redis_report(path, secs):
    rows = []
    for line in open(path, errors="replace"):
        m = re.match(r"^\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*?)\s*$", line)
        if m:
            rows.append((float(m.group(1)), m.group(2), m.group(3), m.group(4)))
    def bucket(pct, dso, priv, sym):
        if priv == "k" or "kernel" in dso:
            return "kernel (syscalls: networking read/write, epoll, scheduler)"
        if re.search(r"printf|__printf_fp|hack_digit|mpn_|strtod|strtol|str_to_mpn|round_and_return|"
                     r"fpconv|d2string|ld2string|string2ll|string2l|ll2string|snprintf|_IO_|__strto|"
                     r"____strto|__mpn|_itoa", sym):
            return "number formatting/parsing (printf %.17g, strtod, mpn)"
        if "jemalloc" in dso or re.search(r"^(je_|malloc|free|calloc|realloc|zmalloc|zfree|ztry|zcalloc|"
                                           r"zrealloc|_int_malloc|_int_free|cfree|sallocx|malloc_usable)", sym):
            return "malloc/free (jemalloc, zmalloc)"
        if re.search(r"^(dict|_dict|siphash|lookupKey|dbAdd|dbFind|setKey|keyIsExpired|expireIfNeeded|"
                     r"getExpire|setExpire|dbGenericDelete|dbSyncDelete|dbAsyncDelete|rehash|dictSds)", sym):
            return "keyspace dict (dictFind, rehash, siphash, lookupKey, expires)"
        if (dso.startswith("redis-") and sym.startswith("0x")) or re.search(r"^lua|^luaRedis|^scriptCall|^eval", sym):
            return "Lua VM + script glue (unresolved addresses in redis-server, lua* symbols)"
        return "other (hash/listpack/zset code, client protocol, memcpy, ...)"
    b = collections.Counter()
    for pct, dso, priv, sym in rows:
        b[bucket(pct, dso, priv, sym)] += pct
    tot = sum(b.values()) or 1
    print("| bucket | share of redis-server CPU samples |")
    print("|---|---:|")
    for k, v in b.most_common():
        print(f"| {k} | {100 * v / tot:.1f} % |")
    print("\nTop 15 symbols (self):\n")
    print("| self | dso | symbol |")
    print("|---:|---|---|")
    for pct, dso, priv, sym in sorted(rows, key=lambda r: -r[0])[:15]:
        print(f"| {pct:.2f} % | {dso} | `{sym[:90]}` |")

CLIENT_FREQ = 0
if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "client":
        _, _, freq, txt, js, label, req, stall = sys.argv
        CLIENT_FREQ = int(freq)
        client(txt, js, label, int(req), stall=stall == "1")
    elif mode == "redis":
        redis_report(sys.argv[2], sys.argv[3])
PY

SIMS="$DIR/sims.txt"
: > "$SIMS"
# $1 = id, $2 = label, $3 = requests, $4 = stall analysis (0/1), rest = sim args
profile_sim() {
  local id=$1 label=$2 requests=$3 stall=$4
  shift 4
  log "perf record: $label"
  perf record -F "$CLIENT_FREQ" --call-graph dwarf,8192 -o "$DIR/$id.perf" -- "$@" \
    > "$DIR/$id.json" 2> "$DIR/$id.err" || log "  (sim exited with $?; see the report)"
  perf script -i "$DIR/$id.perf" -F comm,tid,time,period,ip,sym,dso 2>/dev/null > "$DIR/$id.txt" || true
  python3 "$ANALYZE" client "$CLIENT_FREQ" "$DIR/$id.txt" "$DIR/$id.json" "$label" "$requests" "$stall" >> "$SIMS"
  [ "${KEEP:-0}" = 1 ] || rm -f "$DIR/$id.perf" "$DIR/$id.txt"
}

# (a) against redis, strategy lua, 16 segments, concurrency 64
reset_keyspace
"${CLI[@]}" CONFIG RESETSTAT >/dev/null
cpu_ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
T0=$(cpu_ticks)
W0=$(date +%s.%N)
profile_sim lua "Client: shardstock sim --strategy lua --segments 16 --concurrency 64 (against the private redis)" \
  "$SIM_LUA_REQUESTS" 0 "$BIN" --redis "$URL" sim --sku prof-lua --stock $((SIM_LUA_REQUESTS * 2)) --segments 16 \
  --users "$SIM_LUA_REQUESTS" --requests "$SIM_LUA_REQUESTS" --concurrency 64 --per-user-limit 0 --strategy lua --json
T1=$(cpu_ticks)
W1=$(date +%s.%N)
SIM_LUA_STATS=$(commandstats)
SIM_LUA_SERVER_CPU=$(python3 -c "print(($T1 - $T0) / $(getconf CLK_TCK))")
SIM_LUA_WALL=$(python3 -c "print($W1 - $W0)")
reset_keyspace

# (b) the embedded store
for segs in 1 16; do
  profile_sim "emb$segs" "Embedded store (no --redis): $segs segment(s), concurrency 64" "$EMB_REQUESTS" 1 \
    env -u SHARDSTOCK_STORE__REDIS_URL "$BIN" sim --sku "prof-emb-$segs" --stock $((EMB_REQUESTS * 2)) \
    --segments "$segs" --users "$EMB_REQUESTS" --requests "$EMB_REQUESTS" --concurrency 64 --per-user-limit 0 --json
done
profile_sim emb1c1 "Embedded store (no --redis): 1 segment, concurrency 1 (one task)" "$EMB_REQUESTS" 1 \
  env -u SHARDSTOCK_STORE__REDIS_URL "$BIN" sim --sku prof-emb-c1 --stock $((EMB_REQUESTS * 2)) \
  --segments 1 --users "$EMB_REQUESTS" --requests "$EMB_REQUESTS" --concurrency 1 --per-user-limit 0 --json
T_END=$(date +%s)

# --- the report ----------------------------------------------------------------------------------
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)
echo "# shardstock profile: where the time of a deduction goes"
echo
echo "Run $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores${CPU:+ ($CPU)}, $(. /etc/os-release && echo "$PRETTY_NAME"), redis-server $(redis_version), $(perf --version)."
echo "Code: $SRC_DESC. Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the same cores makes absolute figures noisy; ratios and INFO commandstats µs per call are steadier)."
echo "QUICK=$QUICK, ladder: $LADDER_CALLS calls per variant × $ROUNDS round(s). Build ${T_BUILD}s, measurements $((T_END - T_MEASURE0))s, total $((T_END - T_START))s."
echo
echo "## 1. Lua cost ladder (inside Redis, INFO commandstats)"
echo
for v in "${VARIANTS[@]}"; do printf '%s\t%s\t%s\n' "$v" "${VSTEP[$v]}" "${VDESC[$v]}"; done > "$DIR/variants.tsv"
python3 - "$LADDER" "$DIR/variants.tsv" <<'PY'
import json, statistics, sys
VDESC, STEP, ORDER = {}, {}, []
for line in open(sys.argv[2]):
    v, step, desc = line.rstrip("\n").split("\t", 2)
    VDESC[v], STEP[v] = desc, step
    ORDER.append(v)
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["v"], []).append(r)
def med(xs):
    return statistics.median(xs) if xs else float("nan")
print("| step | variant | EVALSHA µs/call | Δ vs previous step | inner commands µs/call | residual: Lua + call overhead | redis-benchmark calls/s |")
print("|---|---|---:|---:|---:|---:|---:|")
prev = None
summary = {}
for v in ORDER:
    rs = by.get(v, [])
    errs = [r for r in rs if "error" in r]
    ok = [r for r in rs if "error" not in r]
    if not ok:
        msg = errs[0]["error"][:120] if errs else "not measured"
        print(f"| {STEP[v]} | {VDESC[v]} | n/a: `{msg}` | | | | |")
        continue
    upc = med([r["cmds"]["evalsha"]["upc"] for r in ok])
    inn = med([sum(c["usec"] for k, c in r["cmds"].items() if k != "evalsha" and not k.startswith(("config", "info", "ping", "script")))
               / r["cmds"]["evalsha"]["calls"] for r in ok])
    rps = med([r["rps"] for r in ok])
    summary[v] = (upc, inn)
    d = "" if prev is None else f"{upc - prev:+.2f}"
    print(f"| {STEP[v]} | {VDESC[v]} | **{upc:.2f}** | {d} | {inn:.2f} | {upc - inn:.2f} | {rps:,.0f} |")
    if v not in ("v0p", "v6", "base"):  # (0p), (1) and (2) are measured against (0)
        prev = upc
print()
if len(ORDER) and all(len(by.get(v, [])) > 1 for v in ORDER):
    print("Spread over rounds (min–max EVALSHA µs/call): " + ", ".join(
        f"{STEP[v]}: {min(r['cmds']['evalsha']['upc'] for r in by[v] if 'error' not in r):.2f}–"
        f"{max(r['cmds']['evalsha']['upc'] for r in by[v] if 'error' not in r):.2f}" for v in ORDER if any('error' not in r for r in by[v])))
    print()
real = [r for r in by.get("v6", []) if "error" not in r]
if real:
    r = real[len(real) // 2]
    n = r["cmds"]["evalsha"]["calls"]
    print(f"Inner commands of the real script (step 2, one round, {n:,} EVALSHA calls):\n")
    print("| command | calls per EVALSHA | µs per call | µs per EVALSHA |")
    print("|---|---:|---:|---:|")
    tot = 0.0
    for k, c in sorted(r["cmds"].items(), key=lambda kv: -kv[1]["usec"]):
        if k == "evalsha" or k.startswith(("config", "info", "ping", "script")):
            continue
        per = c["usec"] / n
        tot += per
        print(f"| {k.upper()} | {c['calls'] / n:.2f} | {c['upc']:.2f} | {per:.2f} |")
    e = r["cmds"]["evalsha"]["upc"]
    print(f"| **Σ inner commands** | | | **{tot:.2f}** |")
    print(f"| **EVALSHA** | 1 | {e:.2f} | {e:.2f} |")
    print(f"| **residual = Lua interpreter + script call overhead** | | | **{e - tot:.2f}** ({100 * (e - tot) / e:.0f} % of the call) |")
    print()
PY

echo "## 2. redis-server under perf (real script, redis-benchmark -c 50 -P 64, ${PERF_SECS} s at 999 Hz)"
echo
grep -o '([0-9]* samples)' "$DIR/redis.perf.err" | head -1 | sed 's/^/perf: /' || true
RS_REAL=$(basename "$(readlink -f "$(command -v redis-server)")")
if [ "$RS_REAL" != redis-server ]; then
  echo "(redis-server is $RS_REAL on this system, so perf names the server's own code after $RS_REAL.)"
fi
echo
python3 "$ANALYZE" redis "$DIR/redis.report" "$PERF_SECS"
echo
echo "EVALSHA during the perf window: $(echo "$REDIS_PERF_STATS" | grep '^cmdstat_evalsha:' | sed -E 's/.*calls=([0-9]+),.*usec_per_call=([0-9.]+).*/\1 calls, \2 µs per call (perf sampling adds overhead)/')."
echo
echo "## 3. The client under perf"
echo
echo "Against redis: redis-server used $(printf '%.2f' "$SIM_LUA_SERVER_CPU") s CPU in $(printf '%.2f' "$SIM_LUA_WALL") s wall during the lua sim = $(python3 -c "print(f'{$SIM_LUA_SERVER_CPU / $SIM_LUA_REQUESTS * 1e6:.1f}')") µs server CPU per request; EVALSHA inside Redis: $(echo "$SIM_LUA_STATS" | grep '^cmdstat_evalsha:' | sed -E 's/.*calls=([0-9]+),.*usec_per_call=([0-9.]+).*/\1 calls, \2 µs per call/')."
echo
cat "$SIMS"
