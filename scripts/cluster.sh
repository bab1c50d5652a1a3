#!/usr/bin/env bash
# A local Redis Cluster for trying shardstock on several masters: plain redis-server processes
# (no Docker), masters with one replica each, on 127.0.0.1.
#
#   scripts/cluster.sh start [MASTERS]   # default 3 masters + 3 replicas, ports 7000.. (CLUSTER_PORT)
#                                        # REPLICAS=0 for masters only (any count, even 1 or 2)
#   scripts/cluster.sh stop
#   scripts/cluster.sh status
#
# `start` prints the URL to use: --redis "redis-cluster://127.0.0.1:7000?node=127.0.0.1:7001&..."
# (every node is a seed; the client also rediscovers from every node it has learned).
# Each port P needs P+10000 free too (the cluster bus). Data lives in $CLUSTER_DIR
# (default /tmp/shardstock-cluster), without persistence.
set -euo pipefail
DIR="${CLUSTER_DIR:-/tmp/shardstock-cluster}"
BASE="${CLUSTER_PORT:-7000}"
cmd="${1:-}"

ports() { cat "$DIR/ports" 2>/dev/null || true; }

case "$cmd" in
start)
  masters="${2:-3}"
  command -v redis-server >/dev/null || { echo "redis-server missing: apt-get install -y redis-server"; exit 1; }
  [ -f "$DIR/ports" ] && { echo "already running ($DIR/ports); run: $0 stop"; exit 1; }
  mkdir -p "$DIR"
  replicas="${REPLICAS:-1}"
  case "$replicas" in 0|1) ;; *) echo "REPLICAS must be 0 or 1"; exit 2 ;; esac
  n=$((masters * (1 + replicas)))
  list=()
  for i in $(seq 0 $((n - 1))); do
    p=$((BASE + i))
    mkdir -p "$DIR/$p"
    redis-server --port "$p" --bind 127.0.0.1 --daemonize yes --dir "$DIR/$p" \
      --pidfile "$DIR/$p/redis.pid" --logfile "$DIR/$p/redis.log" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
      --cluster-announce-ip 127.0.0.1 \
      --save "" --appendonly no
    list+=("127.0.0.1:$p")
  done
  printf '%s\n' "${list[@]#127.0.0.1:}" > "$DIR/ports"
  for p in $(ports); do
    until redis-cli -p "$p" PING >/dev/null 2>&1; do sleep 0.1; done
  done
  if [ "$replicas" = 1 ]; then
    redis-cli --cluster create "${list[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
  else
    # redis-cli --cluster create wants 3 masters at least: split the slots by hand.
    i=0
    for p in $(ports); do
      lo=$((16384 * i / masters)); hi=$((16384 * (i + 1) / masters - 1))
      redis-cli -p "$p" CLUSTER ADDSLOTSRANGE "$lo" "$hi" >/dev/null
      [ "$p" != "$BASE" ] && redis-cli -p "$p" CLUSTER MEET 127.0.0.1 "$BASE" >/dev/null
      i=$((i + 1))
    done
  fi
  # Ready: every node sees state ok and every replica is in sync with its master.
  for _ in $(seq 1 300); do
    ok=1
    for p in $(ports); do
      redis-cli -p "$p" CLUSTER INFO | grep -q "cluster_state:ok" || ok=0
      if redis-cli -p "$p" INFO replication | grep -q "role:slave"; then
        redis-cli -p "$p" INFO replication | grep -q "master_link_status:up" || ok=0
      fi
    done
    [ "$ok" = 1 ] && break
    sleep 0.1
  done
  [ "$ok" = 1 ] || { echo "cluster not ready; logs in $DIR/*/redis.log"; exit 1; }
  url="redis-cluster://${list[0]}"
  sep="?"
  for a in "${list[@]:1}"; do url="$url${sep}node=$a"; sep="&"; done
  echo "$url" > "$DIR/url"
  echo "cluster ready: $masters masters + $((masters * replicas)) replicas"
  echo "$url"
  ;;
stop)
  for p in $(ports); do
    redis-cli -p "$p" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  done
  rm -rf "$DIR"
  echo "stopped"
  ;;
status)
  [ -f "$DIR/ports" ] || { echo "not running"; exit 1; }
  cat "$DIR/url"
  redis-cli -p "$(head -1 "$DIR/ports")" CLUSTER NODES | awk '{print $2, $3, $9}'
  ;;
*)
  sed -n 2,12p "$0"; exit 2 ;;
esac
