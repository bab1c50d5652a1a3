#!/usr/bin/env bash
# The benchmarks, one entry point: `scripts/bench.sh SUITE [ARGS...]` runs the suite
# scripts/bench/SUITE.sh with ARGS; its knobs are environment variables, as each suite's header
# says. Every suite starts what it needs (its own redis-server, cluster or PostgreSQL on free
# loopback ports, in a temporary directory removed on exit), builds the release binaries it runs
# (CARGO_TARGET_DIR is honoured) and prints Markdown on stdout, progress on stderr.
#
#   scripts/bench.sh --list          every suite: what it measures, the tables it makes, what it
#                                    needs, how long it takes
#   scripts/bench.sh SUITE [ARGS]    one suite
#   scripts/bench.sh all [SUITE...]  every suite (or those named) in turn with its defaults: the
#                                    knobs in the environment apply to every suite that reads
#                                    them; a suite whose tools are missing is skipped; a summary
#                                    (result and time per suite) at the end
#
# The suites' shared setup is scripts/lib/harness.sh; how they drive the selling script with
# redis-benchmark, scripts/lib/sell_bench.sh. docs/benchmarks.md, "How to reproduce", lists the
# suites with the tables they made.
set -euo pipefail
SUITES=$(cd "$(dirname "$0")" && pwd)/bench
# The order of --list and of `all`: the headline figures first, then the diagnostics.
ORDER=(throughput ceiling sale lib-vs-bare strategies scaleout outbox multi-instance locust
  batch-cost fcall-cost profile criterion)

field() { sed -n "s/^# $2: //p" "$SUITES/$1.sh" | head -1; }

list() {
  local s
  for s in "${ORDER[@]}"; do
    printf '%-15s %s\n' "$s" "$(field "$s" "Suite $s")"
    printf '%-15s   tables: %s\n' "" "$(field "$s" Tables)"
    printf '%-15s   needs: %s; time: %s\n' "" "$(field "$s" Needs)" "$(field "$s" Time)"
  done
}

help() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
usage() {
  echo "usage: scripts/bench.sh SUITE [ARGS...] | --list | --help | all [SUITE...]"
  echo "suites: ${ORDER[*]}"
}

# The tools a suite's "Needs:" line names that are not on PATH.
missing() {
  local t out=()
  for t in $(field "$1" Needs); do command -v "$t" >/dev/null || out+=("$t"); done
  echo "${out[*]}"
}

all() {
  local s m t0 rc summary=() failed=0
  for s in "$@"; do
    m=$(missing "$s")
    if [ -n "$m" ]; then
      summary+=("| $s | skipped: $m missing | |")
      echo "== $s: skipped ($m missing)" >&2
      continue
    fi
    echo "== $s" >&2
    printf '\n## %s\n\n' "$s"
    t0=$SECONDS
    rc=0
    bash "$SUITES/$s.sh" || rc=$?
    [ "$rc" = 0 ] || failed=1
    summary+=("| $s | $([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)") | $((SECONDS - t0)) s |")
  done
  printf '\n## Summary\n\n| suite | result | time |\n|---|---|---|\n'
  printf '%s\n' "${summary[@]}"
  return "$failed"
}

case ${1:-} in
  -l | --list) list ;;
  -h | --help) help; echo; usage ;;
  '') usage >&2; exit 2 ;;
  all)
    shift
    for s in "$@"; do
      [ -f "$SUITES/$s.sh" ] || { echo "no suite '$s'" >&2; usage >&2; exit 2; }
    done
    if [ $# -eq 0 ]; then all "${ORDER[@]}"; else all "$@"; fi
    ;;
  *)
    s=$1
    shift
    if ! [[ $s =~ ^[a-z-]+$ ]] || [ ! -f "$SUITES/$s.sh" ]; then
      echo "no suite '$s'" >&2
      usage >&2
      exit 2
    fi
    exec bash "$SUITES/$s.sh" "$@"
    ;;
esac
