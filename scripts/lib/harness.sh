# shellcheck shell=bash
# shellcheck disable=SC2034 # the variables set here are the suites' to read
# harness.sh — sourced by every suite under scripts/bench/ (run them with scripts/bench.sh): the
# setup they share, so that each suite file holds only what it measures.
#
#   harness_init         cd to the repository root (ROOT), make a private work directory WORK
#                        (removed on exit; KEEP=1 keeps it and prints its path), set the exit trap
#   on_exit CMD...       one more command for the exit trap (run last-registered first)
#   track_pid PID...     processes for the exit trap to kill (and wait for)
#   need TOOL...         fail unless every TOOL is on PATH
#   free_port            a free loopback TCP port
#   redis_start [ARG...] a redis-server on a free loopback port: no persistence, noeviction, its
#                        log in WORK, ARGs added; sets REDIS_PORT, REDIS_PID and REDIS_URL; stopped
#                        on exit. REDIS_LAUNCHER=(cmd ...) runs it under that command (valgrind)
#   redis_cpu_usec [PORT]     redis-server main-thread CPU µs so far (INFO cpu, user + system)
#   redis_used_memory [PORT]  INFO memory used_memory, bytes
#   redis_version        redis-server's version (7.0.15)
#   build_release ARG... cargo build --release --quiet ARG...; RELEASE is where it put them
#                        (honours CARGO_TARGET_DIR)
#   pg_find              PGBIN: the newest /usr/lib/postgresql/*/bin, or empty
#   pg_init              a throwaway PostgreSQL cluster in WORK/pg (initdb, trust, loopback; as
#                        the postgres OS user when run as root): PGPORT, PGURL, PG_CONN, AS_PG
#   pg_start [-c K=V]... start it (pg_ctl -w) with those settings; pg_stop stops it; the exit
#                        trap stops it too
#
# Redis CPU is read from INFO cpu (`used_cpu_{user,sys}_main_thread`): everything the server did
# — scripts, the commands they call, reading requests, writing replies — counted once. A sum of
# INFO commandstats would count every command a script calls twice: once as itself and again
# inside the script's own time.

HARNESS_HOOKS=()
HARNESS_PIDS=()
WORK=

harness_init() {
  # A relative CARGO_TARGET_DIR means the caller's directory, not the root the suites run in.
  if [ -n "${CARGO_TARGET_DIR:-}" ] && [ "${CARGO_TARGET_DIR#/}" = "$CARGO_TARGET_DIR" ]; then
    export CARGO_TARGET_DIR="$PWD/$CARGO_TARGET_DIR"
  fi
  ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  cd "$ROOT" || exit 1
  WORK=$(mktemp -d)
  trap harness_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

on_exit() { HARNESS_HOOKS+=("$*"); }
track_pid() { HARNESS_PIDS+=("$@"); }

harness_cleanup() {
  local i p
  for ((i = ${#HARNESS_HOOKS[@]} - 1; i >= 0; i--)); do eval "${HARNESS_HOOKS[$i]}" || true; done
  for p in "${HARNESS_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${HARNESS_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "${KEEP:-0}" = 1 ]; then
    echo "work directory kept: $WORK" >&2
  else
    rm -rf "$WORK"
  fi
}

need() {
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null || {
      echo "$t missing (scripts/test.sh installs redis-server and postgresql; scripts/bench.sh --list says what each suite needs)" >&2
      exit 1
    }
  done
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# shellcheck disable=SC2120 # arguments optional
redis_start() {
  REDIS_PORT=$(free_port)
  "${REDIS_LAUNCHER[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' \
    --appendonly no --maxmemory-policy noeviction --dir "$WORK" \
    --logfile "$WORK/redis-$REDIS_PORT.log" "$@" >"$WORK/redis-$REDIS_PORT.out" 2>&1 &
  REDIS_PID=$!
  track_pid "$REDIS_PID"
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  # Up to a minute: under valgrind a server takes seconds to answer.
  local _
  for _ in $(seq 1200); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && return 0
    kill -0 "$REDIS_PID" 2>/dev/null || break
    sleep 0.05
  done
  echo "redis-server on port $REDIS_PORT did not start:" >&2
  tail -5 "$WORK/redis-$REDIS_PORT.log" "$WORK/redis-$REDIS_PORT.out" >&2 2>/dev/null || true
  exit 1
}

# Three independent redis-servers for the redlock strategy, as LOCK_NODES (URL,URL,URL). Fresh
# nodes are marked new so they vote at once (see the quarantine in
# src/store/redis/lock/redlock.rs). REDIS_PORT / REDIS_URL are left at the last node's.
redlock_nodes() {
  local nodes=() _
  for _ in 1 2 3; do
    redis_start
    nodes+=("$REDIS_URL")
    redis-cli -p "$REDIS_PORT" SET shardstock:redlock:quarantine 0 >/dev/null
  done
  LOCK_NODES=$(IFS=,; echo "${nodes[*]}")
}

# shellcheck disable=SC2120 # arguments optional
redis_cpu_usec() {
  redis-cli -p "${1:-$REDIS_PORT}" INFO cpu | tr -d '\r' |
    awk -F: '/^used_cpu_(user|sys)_main_thread:/ { s += $2 } END { printf "%.0f\n", s * 1e6 }'
}

# shellcheck disable=SC2120 # arguments optional
redis_used_memory() {
  redis-cli -p "${1:-$REDIS_PORT}" INFO memory | tr -d '\r' | sed -n 's/^used_memory:\(.*\)/\1/p'
}

redis_version() { redis-server --version | grep -o 'v=[^ ]*' | cut -c3-; }

build_release() {
  cargo build --release --quiet "$@"
  RELEASE=${CARGO_TARGET_DIR:-$ROOT/target}/release
}

pg_find() {
  PGBIN=$(printf '%s\n' /usr/lib/postgresql/*/bin | grep -v '\*' | sort -V | tail -1 || true)
}

pg_init() {
  PGDIR="$WORK/pg"
  mkdir -p "$PGDIR"
  AS_PG=()
  if [ "$(id -u)" = 0 ]; then # postgres refuses to run as root
    AS_PG=(runuser -u postgres --)
    chmod 755 "$WORK"
    chown postgres "$PGDIR"
  fi
  "${AS_PG[@]}" "$PGBIN/initdb" -D "$PGDIR/data" -U postgres -A trust -E UTF8 --locale=C \
    --no-sync --no-instructions >"$PGDIR/initdb.log" 2>&1 || { cat "$PGDIR/initdb.log" >&2; exit 1; }
  PGPORT=$(free_port)
  PGURL="postgres://postgres@127.0.0.1:$PGPORT/postgres"
  PG_CONN=(-h 127.0.0.1 -p "$PGPORT" -U postgres -d postgres)
  PG_RUNNING=
  # shellcheck disable=SC2016 # expanded when the trap runs
  on_exit '[ -z "$PG_RUNNING" ] || "${AS_PG[@]}" "$PGBIN/pg_ctl" -D "$PGDIR/data" -m immediate -w stop >/dev/null 2>&1'
}

# shellcheck disable=SC2120 # arguments optional
pg_start() {
  "${AS_PG[@]}" "$PGBIN/pg_ctl" -D "$PGDIR/data" -l "$PGDIR/log" -w -o \
    "-p $PGPORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$PGDIR $*" start >/dev/null ||
    { tail -20 "$PGDIR/log" >&2; exit 1; }
  PG_RUNNING=1
}

pg_stop() {
  "${AS_PG[@]}" "$PGBIN/pg_ctl" -D "$PGDIR/data" -m fast -w stop >/dev/null
  PG_RUNNING=
}
