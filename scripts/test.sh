#!/usr/bin/env bash
# The whole test suite: installs what it needs (redis-server, prometheus, docker-compose,
# postgresql), then format, lints, tests, docs, benches compile.
# Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
# tests/metrics.rs: a real Prometheus scraping a live sim, promtool, docker-compose config -q.
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need_apt+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
# tests/common/postgres.rs: throwaway clusters with initdb (as the postgres OS user when root).
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

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --locked --all-features
echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked
echo "== cargo bench --no-run"
cargo bench --no-run --locked
echo "== all green"
