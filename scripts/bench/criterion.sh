#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR/../lib
# Suite criterion: the criterion matrix of benches/deduct.rs — deductions/s for {lua, lua coalesced, lock, memory} × segments {1, 4, 16, 64} × tasks {1, 16, 64, 256}
# Tables: docs/benchmarks.md "Criterion"
# Needs: redis-server redis-cli cargo
# Time: ~4 min after the bench build (64 benchmarks, 10 samples of 2 s each); `-- --test '16_segments/64'`: four benchmarks once, ~1 s after the build
#
# `cargo bench --bench deduct` with the arguments given (after `--`, criterion's own: a filter,
# --test, --save-baseline NAME, --baseline NAME). The bench starts its own redis-server
# (tests/it/common) and builds with the bench profile; criterion keeps its reports under
# <target>/criterion.
#
# Usage: scripts/bench.sh criterion [-- CRITERION ARGS...]
set -euo pipefail
. "$(dirname "$0")/../lib/harness.sh"
harness_init
need redis-server redis-cli
cargo bench --bench deduct "$@"
