#!/usr/bin/env bash
# Prints the least-privilege Redis ACL line for shardstock: keys under the key prefix only, and
# only the commands the client and the Lua scripts use. Pipe it into redis-cli as an admin:
#   scripts/acl.sh shop shardstock 's3cret' | redis-cli -p 6379
# then connect with redis://shardstock:s3cret@host:6379 (store.key_prefix = "shop").
# Usage: scripts/acl.sh PREFIX [USER] [PASSWORD] [--redlock]
#   --redlock  a RedLock node's user instead: the lock scripts and the quarantine marker
#              (`shardstock:redlock:quarantine`) besides the prefix (lock keys live under it).
# tests/it/acl.rs applies this very line (and checks a missing command is named in the error).
set -euo pipefail
prefix=${1:?usage: scripts/acl.sh PREFIX [USER] [PASSWORD] [--redlock]}
user=${2:-shardstock}
password=${3:-}
redlock=${4:-}
# The prefix is a glob pattern's literal part: refuse anything but shardstock's prefix
# alphabet (letters, digits, `_.:-`), as `store.key_prefix` does.
if ! [[ $prefix =~ ^[A-Za-z0-9_.:-]{1,32}$ ]]; then
  echo "bad prefix $prefix: letters, digits and _.:- only, at most 32" >&2
  exit 2
fi
if ! [[ $user =~ ^[A-Za-z0-9_.-]+$ ]]; then
  echo "bad user name $user" >&2
  exit 2
fi
if [ -z "$password" ]; then
  pass="nopass"
elif [[ $password =~ [[:space:]\"\'] ]]; then
  echo "the password must not contain spaces or quotes" >&2
  exit 2
else
  pass=">$password"
fi
keys="~$prefix:*"
[ "$redlock" = "--redlock" ] && keys="$keys ~shardstock:redlock:quarantine"
# The client: PING/SELECT at connect (fred; AUTH/HELLO need no grant), EVALSHA and SCRIPT LOAD
# (scripts), HMGET/HGETALL (status, audit, metadata), SADD/SMEMBERS (SKU registry, outbox SKU
# set), XGROUP CREATE/XREADGROUP/XACK + HSET/HDEL (the orders consumer), HSETNX/HINCRBY (the
# unsafe baseline strategies), SCAN/UNLINK (a reload unlinks the replaced generation's keys),
# WAIT (durability mode), CLUSTER INFO/SLOTS (fred on a cluster).
client="+ping +select +evalsha +script|load +hmget +hgetall +hset +hdel +hsetnx +hincrby +sadd +smembers +scan +unlink +xgroup|create +xreadgroup +xack +wait +cluster|info +cluster|slots"
# Inside the scripts (src/scripts/*.lua): every redis.call there.
scripts="+del +exists +get +set +hget +hlen +hsetnx +hincrby +pexpire +pexpireat +persist +time +xadd +xautoclaim +xinfo|stream +xinfo|groups +xpending +xrange +xtrim +zadd +zrange +zrangebyscore +zrem +zremrangebyscore"
# Stock notifications (the engine's sold-out flags): the scripts PUBLISH, the store SUBSCRIBEs,
# on the one channel <prefix>:stock.
channels="&$prefix:stock"
notify="+publish +subscribe"
echo "ACL SETUSER $user reset on $pass resetkeys $keys resetchannels $channels -@all $client $scripts $notify"
