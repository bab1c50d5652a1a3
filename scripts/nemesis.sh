#!/usr/bin/env bash
# scripts/nemesis.sh — the nemesis suite, longer: every fault test run ROUNDS times with a
# bigger workload, and one table of what was injected and checked.
#
#   scripts/nemesis.sh [ROUNDS] [HISTORY_OPS]      (defaults: 5 rounds, 12000 operations)
#
# Each test prints lines `nemesis <fault>: struck N, ops M, anomalies A[, ...]`; this script
# sums them per fault (every number that follows a word), stops at the first failing run
# (its output is kept under target/nemesis/), and prints the totals as a Markdown table.
# The suites: tests/it/nemesis.rs (Redis killed / paused, a partitioned engine),
# tests/it/nemesis_empty.rs (Redis restarted empty), tests/it/nemesis_serve.rs (serve processes
# paused / partitioned), tests/it/nemesis_cluster.rs (cluster masters killed),
# tests/it/failover.rs (a master killed for good mid-sale: recovery figures), and the
# connection-kill variant of tests/it/history.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
export HISTORY_OPS=${2:-12000}
if ! command -v redis-server >/dev/null; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo -n"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools
fi
out=target/nemesis
mkdir -p "$out"
: >"$out/lines"
suites=(nemesis nemesis_empty nemesis_serve nemesis_cluster failover "history history_connection_kills")
cargo build --tests --quiet --all-features
start=$(date +%s)
for r in $(seq 1 "$ROUNDS"); do
    for s in "${suites[@]}"; do
        set -- $s
        [ -f "tests/it/$1.rs" ] || continue
        log="$out/$1-round$r.log"
        # One test binary, a module per suite: `SUITE::[TEST]` picks the suite (or one test).
        if ! cargo test --quiet --all-features --test it -- "$1::${2:-}" --test-threads 1 --nocapture \
            >"$log" 2>&1; then
            echo "FAILED: round $r, cargo test --all-features --test it -- $1::${2:-} (log: $log)" >&2
            grep -E "VIOLATIONS|history check failed|panicked" -A12 "$log" | head -60 >&2
            exit 1
        fi
        # The history variant prints no nemesis line: name it from its summary.
        grep -E '^nemesis ' "$log" >>"$out/lines" || true
        grep -E '^\[kills\] [0-9]+ ops' "$log" |
            sed -nE 's/^\[kills\] ([0-9]+) ops.*fault struck: ([0-9]+).*/nemesis client connections killed every 5 ms: struck \2, ops \1, anomalies 0/p' \
                >>"$out/lines" || true
        echo "round $r/$ROUNDS: $s ok ($(( $(date +%s) - start )) s)" >&2
    done
done
echo
echo "| fault | runs | injected | operations checked | anomalies | other |"
echo "|---|---|---|---|---|---|"
awk '
{
    line = $0; sub(/^nemesis /, "", line)
    fault = line; sub(/: .*/, "", fault)
    rest = line; sub(/^[^:]*: /, "", rest)
    runs[fault]++
    if (!(fault in seen)) { seen[fault] = 1; order[++n] = fault }
    m = split(rest, parts, /, /)
    for (i = 1; i <= m; i++) {
        k = parts[i]; v = parts[i]
        sub(/ [0-9]+.*$/, "", k); sub(/^[^0-9]*/, "", v); sub(/[^0-9].*$/, "", v)
        if (v == "") continue
        sum[fault, k] += v
        if (!((fault, k) in kseen)) { kseen[fault, k] = 1; keys[fault] = keys[fault] "|" k }
    }
}
END {
    for (j = 1; j <= n; j++) {
        f = order[j]; other = ""
        nk = split(substr(keys[f], 2), ks, "|")
        for (i = 1; i <= nk; i++) {
            k = ks[i]
            if (k == "struck" || k == "kills" || k == "restarts" || k == "ops" || k == "anomalies") continue
            other = other (other == "" ? "" : ", ") k " " sum[f, k]
        }
        inj = sum[f, "struck"] + sum[f, "kills"] + sum[f, "restarts"]
        printf "| %s | %d | %d | %d | %d | %s |\n", f, runs[f], inj, sum[f, "ops"], sum[f, "anomalies"], other
    }
}' "$out/lines"
echo
echo "($ROUNDS rounds, HISTORY_OPS=$HISTORY_OPS, $(( $(date +%s) - start )) s; lines in $out/lines)"
