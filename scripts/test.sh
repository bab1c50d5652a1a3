#!/usr/bin/env bash
# The whole test suite: installs what it needs (redis-server, prometheus, docker-compose,
# postgresql), then format, lints (every feature, the default ones, none), the default
# dependency set, tests, docs, benches compile.
# Usage: scripts/test.sh [--acl-tls [SUITE...]]
#   --acl-tls  instead: the tests only (every suite, or the SUITEs named, e.g. deduct safety),
#              with the engines logged in as the least-privilege user scripts/acl.sh describes
#              and every single-node redis-server speaking TLS only (SHARDSTOCK_TEST_ACL=1
#              SHARDSTOCK_TEST_TLS=1, see tests/it/common/mod.rs). Cluster nodes and RedLock lock
#              nodes stay plain; the CLI tests log in as the default user.
set -euo pipefail
cd "$(dirname "$0")/.."
acl_tls=false
if [ "${1:-}" = "--acl-tls" ]; then
  acl_tls=true
  shift
fi
if [ $# -gt 0 ] && ! $acl_tls; then
  echo "usage: scripts/test.sh [--acl-tls [SUITE...]]" >&2
  exit 2
fi

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
# tests/it/metrics.rs: a real Prometheus scraping a live sim, promtool, docker-compose config -q.
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need_apt+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
# tests/it/common/postgres.rs: throwaway clusters with initdb (as the postgres OS user when root).
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need_apt+=(postgresql)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing ${need_apt[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo -n"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi
# The distribution's services (redis, prometheus, postgresql) are not needed: tests start their
# own servers on free loopback ports. (Debian's postgresql package creates a cluster on 5432 and
# starts it where a service manager runs; the tests never use it.)

if $acl_tls; then
  # The suites are one test binary (tests/it/main.rs), a module per suite: a test's name
  # starts with `SUITE::`. Name filters are substrings (`cluster::` would also pick
  # `nemesis_cluster::`), so a named suite's tests are listed and passed by exact name.
  targets=(--tests)
  filters=()
  if [ $# -gt 0 ]; then
    targets=(--test it)
    names=$(cargo test --locked --all-features --test it -- --list | sed -n 's/: test$//p')
    for suite in "$@"; do
      picked=$(grep -E "^${suite}::" <<<"$names" || true)
      if [ -z "$picked" ]; then
        echo "no suite $suite (tests/it/$suite.rs)" >&2
        exit 2
      fi
      mapfile -t -O "${#filters[@]}" filters <<<"$picked"
    done
    filters=(--exact "${filters[@]}")
  fi
  echo "== cargo test as the ACL user over TLS: ${*:-every suite}"
  # Same features as the default run: its test binaries are reused, nothing is rebuilt.
  SHARDSTOCK_TEST_ACL=1 SHARDSTOCK_TEST_TLS=1 cargo test --locked --all-features "${targets[@]}" \
    -- "${filters[@]}"
  echo "== green as the ACL user over TLS"
  exit 0
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets --locked --all-features -- -D warnings
# The library as a service embeds it (default features) and bare: no cfg left behind.
echo "== cargo clippy --lib: default features, none"
cargo clippy --lib --examples --locked -- -D warnings
cargo clippy --lib --locked --no-default-features -- -D warnings
echo "== the default features stay lean"
heavy='^(clap|indicatif|hdrhistogram|metrics-exporter-prometheus|tracing-subscriber|tokio-postgres|figment|yansi) '
if cargo tree --locked -e normal --prefix none | grep -E "$heavy"; then
  echo "the default features pull the crates above (the binary's, PostgreSQL's or figment's)" >&2
  exit 1
fi
echo "== cargo test"
cargo test --locked --all-features
echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked
# The benches built and linked (clippy --all-targets has checked them already). With the dev
# profile the test run's dependencies are reused: `cargo bench --no-run` rebuilt everything
# optimised, 6 of CI's 22 minutes, to prove nothing more.
echo "== cargo build --benches"
cargo build --benches --locked --all-features
echo "== all green"
