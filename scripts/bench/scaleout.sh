#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR/../lib
# Suite scaleout: the same sale on 1, 2 and 3 cluster masters — Redis CPU per sale per master, their sum ÷ 1 master, spread, calls, per-script split, transfers, ceilings
# Tables: docs/capacity.md (every table: the cost of a sale, a transfer against a local sale); docs/benchmarks.md "Scale-out" (an older build's table)
# Needs: redis-server redis-cli redis-benchmark python3 cargo
# Time: ~3 min after the build with the defaults; masters 1 2, ROUNDS=1 CEILING_REQUESTS=20000 and a sale of 2,000 units (SIM_ARGS, TRANSFER_ARGS): ~12 s
#
# The same sale on 1, 2 and 3 masters, measured where it scales. Each master count is a cluster
# of its own without replicas (scripts/cluster.sh start, REPLICAS=0), stopped when done.
#
# On a 2-core box more masters cannot add throughput (client and servers share the cores), so
# this measures what does scale, per master count:
#   - sales/s, and redis-server main-thread CPU per sale on each master (INFO cpu
#     `used_cpu_{user,sys}_main_thread` deltas ÷ units sold: everything a master did once;
#     INFO commandstats counts a script and the commands it calls both), their sum, the sum ÷
#     the 1-master figure of the same binary and round, and the spread: busiest master ÷ mean;
#   - EVALSHA calls per master and sales per call (units sold from the master's segments ÷ its
#     calls), the coalesced requests per call of the whole run, the client's CPU per sale;
#   - where the CPU goes (DIAG=1): one more run of the sale with SLOWLOG recording every command
#     (slowlog-log-slower-than 0), so each script's calls and µs inside Redis are known by its
#     SHA1 (prelude.lua + the script, as src/store/redis/lua.rs composes it); a sell-out run
#     (TRANSFER_ARGS: segments run short, units move between segments) the same way, to count
#     transfers (transfer.lua calls: a debit at the donor, then `done`) and price one against a
#     local sale; and the shares around the sale: a master's idle CPU per second, one
#     `shardstock load` and one `shardstock audit` of the same SKU (each a new process: its
#     connection and SCRIPT LOAD included, as in `sim`);
#   - each master's script ceiling alone (CEILING_REQUESTS > 0): redis-benchmark EVALSHA of the
#     selling script for a lone request (prelude + sell.lua, 50 clients, pipeline 64, a new user
#     and request id per call — see scripts/lib/sell_bench.sh) against a segment written by the
#     real load_segment.lua under a hash tag that master serves, and their sum: the projected
#     capacity when every master has a core of its own.
# The sale: shardstock sim --stock 100000 --segments 16 --users 200000 --requests 60000
# --per-user-limit 1 --concurrency 64 (SIM_ARGS overrides; coalescing as configured: on).
#
# Before/after in one run: BINS="before=/path/to/shardstock now=target/release/shardstock"
# runs each binary in turn on the same cluster, ROUNDS times (interleaved: on a shared machine
# one run moves by ±30 %; compare ratios within a round).
#
# Usage: scripts/bench.sh scaleout [MASTER COUNTS...]   (default: 1 2 3; ports from 7300 + 10 × masters,
#        or the next free block of ports when those, or their cluster bus ports, are taken)
#        env: SIM_ARGS, ROUNDS (1), BINS (now=<this tree's release build>), DIAG (1),
#        TRANSFER_ARGS, CEILING_REQUESTS (500000; 0 skips the ceilings)
set -euo pipefail
. "$(dirname "$0")/../lib/harness.sh"
. "$(dirname "$0")/../lib/sell_bench.sh"
harness_init
COUNTS=("${@:-1 2 3}")
read -r -a COUNTS <<< "${COUNTS[*]}"
SIM_ARGS=${SIM_ARGS:-"--stock 100000 --segments 16 --users 200000 --requests 60000 --per-user-limit 1 --concurrency 64"}
TRANSFER_ARGS=${TRANSFER_ARGS:-"--stock 30000 --segments 16 --users 200000 --requests 40000 --per-user-limit 1 --concurrency 64"}
CEILING_REQUESTS=${CEILING_REQUESTS:-500000}
ROUNDS=${ROUNDS:-1}
DIAG=${DIAG:-1}
need redis-server redis-cli redis-benchmark python3
OUT=$WORK
# shellcheck disable=SC2016 # expanded when the trap runs
on_exit 'for d in "$OUT"/c*; do [ -d "$d/cluster" ] && CLUSTER_DIR="$d/cluster" scripts/cluster.sh stop >/dev/null 2>&1; done'
if [ -z "${BINS:-}" ]; then
  build_release --features cli
  cp "$RELEASE/shardstock" "$OUT/now"
  BINS="now=$OUT/now"
fi
read -r -a BINS <<< "$BINS"
for lb in "${BINS[@]}"; do
  [ -x "${lb#*=}" ] || { echo "not an executable: ${lb#*=} (BINS entries are label=path)"; exit 2; }
done
sell_compose . "$OUT/sell.lua"
sell_load_lua . "$OUT/load.lua"
HF=$(sell_home_fn .)
# Every script's SHA1 as the store sends it: "#!lua[ flags=…]\n" + prelude.lua + <name>.lua.
python3 - src/scripts > "$OUT/shas" <<'PY'
import hashlib, os, sys
d = sys.argv[1]
prelude = open(os.path.join(d, "prelude.lua"), "rb").read()
for f in sorted(os.listdir(d)):
    if f.endswith(".lua") and f != "prelude.lua":
        body = open(os.path.join(d, f), "rb").read()
        for head in (b"#!lua\n", b"#!lua flags=no-writes\n"):
            print(hashlib.sha1(head + prelude + body).hexdigest(), f[:-4])
PY
# A block of N ports from $1 on whose cluster bus ports (+10000) are free too.
free_block() { # $1 = first candidate, $2 = N
  python3 - "$1" "$2" <<'PY'
import socket, sys
p, n = int(sys.argv[1]), int(sys.argv[2])
def free(q):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", q)); return True
    except OSError:
        return False
    finally:
        s.close()
while not all(free(q) and free(q + 10000) for q in range(p, p + n)):
    p += 100
    if p + n > 55535: sys.exit("no free port block")
print(p)
PY
}
# Main-thread CPU µs of every port in $ports, one "port µs" line each.
cpu_snap() { for p in $ports; do echo "$p $(redis_cpu_usec "$p")"; done; }
reset_stats() { for p in $ports; do redis-cli -p "$p" CONFIG RESETSTAT >/dev/null; done; }
slowlog() { # on|off: record every command (and clear), or back to the defaults
  for p in $ports; do
    if [ "$1" = on ]; then
      redis-cli -p "$p" CONFIG SET slowlog-max-len 1000000 >/dev/null
      redis-cli -p "$p" CONFIG SET slowlog-log-slower-than 0 >/dev/null
      redis-cli -p "$p" SLOWLOG RESET >/dev/null
    else
      redis-cli -p "$p" CONFIG SET slowlog-log-slower-than 10000 >/dev/null
      redis-cli -p "$p" CONFIG SET slowlog-max-len 128 >/dev/null
      redis-cli -p "$p" SLOWLOG RESET >/dev/null
    fi
  done
}
# Per script (by SHA) on each port: "port name calls usec" lines from the slowlog.
slowlog_scripts() {
  for p in $ports; do
    redis-cli -p "$p" --json SLOWLOG GET -1 > "$OUT/slow.json"
    python3 - "$p" "$OUT/shas" "$OUT/slow.json" <<'PY'
import json, sys
p, shas, path = sys.argv[1:]
name = dict(l.split() for l in open(shas))
agg = {}
for e in json.load(open(path)):
    args = e[3]
    if not args:
        continue
    if e[4] == "?:0":
        continue  # a command a script called: inside its script's time already
    cmd = args[0].lower()
    if cmd in ("evalsha", "eval_ro", "evalsha_ro") and len(args) > 1:
        key = name.get(args[1].lower(), "other script")
        # ARGV[1] at args[3 + numkeys]: transfer.lua's op; sell.lua's ARGV[5] counts credits
        # (a request with units to credit goes alone, uncoalesced).
        try:
            argv = 3 + int(args[2])
            if key == "transfer":
                key += " " + args[argv]
            elif key == "sell" and args[argv + 4] != "0":
                key = "sell with credits"
        except (ValueError, IndexError):
            pass
    elif cmd == "eval":
        key = "eval (inline)"
    elif cmd in ("slowlog", "config", "info"):
        continue  # this script's own look
    else:
        key = cmd
    c = agg.setdefault(key, [0, 0])
    c[0] += 1; c[1] += e[2]
for k, (n, us) in sorted(agg.items()):
    print(p, k.replace(" ", "_"), n, us)
PY
  done
}

for m in "${COUNTS[@]}"; do
  d="$OUT/c$m"; mkdir -p "$d"
  CLUSTER_PORT=$(free_block $((7300 + 10 * m)) "$m")
  export CLUSTER_DIR="$d/cluster" CLUSTER_PORT REPLICAS=0
  scripts/cluster.sh start "$m" > "$d/start.txt"
  url=$(cat "$CLUSTER_DIR/url")
  ports=$(cat "$CLUSTER_DIR/ports")
  first=${BINS[0]#*=}
  # Shares around the sale (first binary): idle masters, a load, an audit.
  if [ "$DIAG" = 1 ]; then
    cpu_snap > "$d/idle0"; sleep 2; cpu_snap > "$d/idle1"
    cpu_snap > "$d/load0"
    # shellcheck disable=SC2046 # the flags, one word each
    "$first" load --redis "$url" --sku scaleout-share --replace \
      $(python3 -c 'import sys,re; a=sys.argv[1]; print(" ".join(f"--{k} {v}" for k,v in re.findall(r"--(stock|segments|per-user-limit) (\S+)", a)))' "$SIM_ARGS") >/dev/null
    cpu_snap > "$d/load1"
    "$first" audit --redis "$url" --sku scaleout-share >/dev/null
    cpu_snap > "$d/audit1"
  fi
  for r in $(seq "$ROUNDS"); do
    for lb in "${BINS[@]}"; do
      label=${lb%%=*} bin=${lb#*=}
      f="$d/run.$r.$label"
      reset_stats
      cpu_snap > "$f.cpu0"
      # shellcheck disable=SC2086
      /usr/bin/time -f "%U %S" -o "$f.time" "$bin" sim --redis "$url" $SIM_ARGS --json > "$f.sim"
      cpu_snap > "$f.cpu1"
      for p in $ports; do redis-cli -p "$p" INFO commandstats | tr -d '\r' > "$f.cmd.$p"; done
      "$bin" status --redis "$url" --sku "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["sku"])' "$f.sim")" --json > "$f.status"
    done
  done
  if [ "$DIAG" = 1 ]; then
    for lb in "${BINS[@]}"; do
      label=${lb%%=*} bin=${lb#*=}
      for pass in sale transfer; do
        args=$SIM_ARGS; [ "$pass" = transfer ] && args=$TRANSFER_ARGS
        slowlog on
        # shellcheck disable=SC2086
        "$bin" sim --redis "$url" $args --json > "$d/diag.$pass.$label.sim"
        slowlog_scripts > "$d/diag.$pass.$label"
        slowlog off
      done
    done
  fi
  # Each master's ceiling alone: a segment hash on that master (a tag whose slot it serves).
  if [ "$CEILING_REQUESTS" -gt 0 ]; then
    for p in $ports; do
      sha=$(redis-cli -p "$p" -x SCRIPT LOAD < "$OUT/sell.lua")
      # The first tag whose slot this master serves (load_segment.lua elsewhere answers MOVED).
      k=0
      until [ "$(sell_load_segment "$OUT/load.lua" "ceil:{ceil.$k#0}:seg" 999999999999 "$HF" \
          redis-cli -p "$p" | head -1)" = ok ]; do
        k=$((k + 1))
        [ "$k" -lt 100000 ] || { echo "load_segment.lua never answered ok on $p: $(sell_load_segment \
          "$OUT/load.lua" "ceil:{ceil.0#0}:seg" 999999999999 "$HF" redis-cli -p "$p" | head -3)" >&2; exit 1; }
      done
      sell_ceiling_csv "$p" "$sha" "ceil:{ceil.$k#0}:seg" "$HF" "$CEILING_REQUESTS" > "$d/ceil.$p"
    done
  fi
  CLUSTER_DIR="$CLUSTER_DIR" scripts/cluster.sh stop >/dev/null
  unset CLUSTER_DIR
done

python3 - "$OUT" "$ROUNDS" "${BINS[*]}" "${COUNTS[@]}" <<'PY'
import csv, io, json, os, re, sys
out, rounds, bins, counts = sys.argv[1], int(sys.argv[2]), [b.split('=', 1)[0] for b in sys.argv[3].split()], sys.argv[4:]
def ports_of(m):
    return open(os.path.join(out, f"c{m}", "cluster", "ports")).read().split() \
        if os.path.exists(os.path.join(out, f"c{m}", "cluster", "ports")) else None
def snap(path):
    return {l.split()[0]: int(l.split()[1]) for l in open(path)}
def delta(a, b):  # main-thread CPU µs per port, user + sys
    a, b = snap(a), snap(b)
    return {p: b[p] - a[p] for p in b}
def evalsha(path):
    for line in open(path):
        m = re.match(r'cmdstat_evalsha:calls=(\d+)', line)
        if m: return int(m[1])
    return 0
def per_segment_sold(st):
    n, loaded = len(st['remaining_per_segment']), st['loaded']
    return [loaded // n + (1 if i < loaded % n else 0) - rem for i, rem in enumerate(st['remaining_per_segment'])]
f1 = lambda x: f"{x:.2f}"

# Ports in order, per master count (the cluster dir is gone: read them from the snapshots).
runs = {}
for m in counts:
    d = os.path.join(out, f"c{m}")
    for r in range(1, rounds + 1):
        for b in bins:
            f = os.path.join(d, f"run.{r}.{b}")
            if not os.path.exists(f + ".sim"): continue
            sim, st = json.load(open(f + ".sim")), json.load(open(f + ".status"))
            cpu = delta(f + ".cpu0", f + ".cpu1")
            ports = sorted(cpu)
            sold = sim['sold_units'] or 1
            seg_sold = per_segment_sold(st)
            by_master = {p: 0 for p in ports}
            for h in st.get('placement') or [{'index': i, 'master': ':' + ports[0]} for i in range(len(seg_sold))]:
                by_master[h['master'].rsplit(':', 1)[-1]] += seg_sold[h['index']]
            calls = {p: evalsha(f"{f}.cmd.{p}") for p in ports}
            client = sum(map(float, open(f + ".time").read().split())) * 1e6
            runs[(m, r, b)] = dict(sim=sim, ports=ports, per={p: cpu[p] / sold for p in ports}, sold=sold,
                                   calls=calls, by_master=by_master, client=client / sim['requests'])

print("Per run (redis-server main-thread CPU, INFO cpu deltas ÷ units sold; \"sum ÷ 1\" against the 1-master run of the same binary and round):\n")
print("| masters | binary | round | sold / oversold / audit | sales/s | p99 ms | Redis CPU µs per sale, per master | sum | sum ÷ 1 master | spread (max ÷ mean) | EVALSHA calls per master | sales per call, per master | requests per coalesced call | client CPU µs per request |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for m in counts:
    for r in range(1, rounds + 1):
        for b in bins:
            x = runs.get((m, r, b))
            if not x: continue
            s, per = x['sim'], x['per']
            tot = sum(per.values())
            one = runs.get(('1', r, b))
            ratio = f"{tot / sum(one['per'].values()):.2f}×" if one else "—"
            mean = tot / len(per)
            co = s.get('coalescing') or {}
            print(f"| {m} | {b} | {r} | {s['sold_units']} / {s['oversold']} / {'ok' if s['audit_ok'] else 'FAILED'} "
                  f"| {s['throughput_per_s']:,.0f} | {s['p99_ms']:.1f} "
                  f"| {' / '.join(f1(per[p]) for p in x['ports'])} | **{tot:.2f}** | {ratio} "
                  f"| {max(per.values()) / mean:.2f} "
                  f"| {' / '.join(format(x['calls'][p], ',') for p in x['ports'])} "
                  f"| {' / '.join(f1(x['by_master'][p] / x['calls'][p]) if x['calls'][p] else '—' for p in x['ports'])} "
                  f"| {co.get('mean_batch', 0):.2f} | {x['client']:.2f} |")

# Where the CPU goes.
for m in counts:
    d = os.path.join(out, f"c{m}")
    if not os.path.exists(os.path.join(d, "idle0")): continue
    idle = delta(os.path.join(d, "idle0"), os.path.join(d, "idle1"))
    load = delta(os.path.join(d, "load0"), os.path.join(d, "load1"))
    audit = delta(os.path.join(d, "load1"), os.path.join(d, "audit1"))
    x = runs.get((m, 1, bins[0]))
    tot = x['sold'] * sum(x['per'].values()) if x else 0
    el = x['sim']['elapsed_s'] if x else 0
    print(f"\n**{m} master(s): around the sale** ({bins[0]}, round 1: {tot / 1e3:,.0f} ms of Redis CPU in all, "
          f"{el:.2f} s of sale): idle {sum(idle.values()) / 2e3:.2f} ms per second over all masters "
          f"(≈ {sum(idle.values()) / 2 * el / 1e3:.1f} ms during the sale); one `load` {sum(load.values()) / 1e3:.1f} ms; "
          f"one `audit` {sum(audit.values()) / 1e3:.1f} ms (each a new process: connection, SCRIPT LOAD of every script "
          f"on every master, then the work)"
          + (f"; together {(sum(idle.values()) / 2 * el + sum(load.values()) + sum(audit.values())) / x['sold']:.2f} µs of the "
             f"{sum(x['per'].values()):.2f} µs per sale" if x else "") + ".\n")
    print("| pass | binary | sold | script | calls (all masters) | µs inside Redis per call (SLOWLOG) | calls per sale | µs per sale |")
    print("|---|---|---|---|---|---|---|---|")
    for b in bins:
        for pas in ("sale", "transfer"):
            p = os.path.join(d, f"diag.{pas}.{b}")
            if not os.path.exists(p): continue
            sim = json.load(open(p + ".sim"))
            sold = sim['sold_units'] or 1
            agg = {}
            for line in open(p):
                _, name, n, us = line.split()
                a = agg.setdefault(name, [0, 0]); a[0] += int(n); a[1] += int(us)
            for name, (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
                print(f"| {pas} | {b} | {sim['sold_units']} | {name.replace('_', ' ')} | {n:,} | {us / n:.1f} | {n / sold:.4f} | {us / sold:.2f} |")
            # A transfer: its debit and done at the donor, the credit at the home (a lone
            # sell.lua call with credits, which also decides that one request), against a sale's
            # share of a coalesced sell.lua call.
            if 'transfer_debit' in agg and 'sell' in agg:
                tn, tus = agg['transfer_debit']
                dn, dus = agg.get('transfer_done', (0, 0))
                cn, cus = agg.get('sell_with_credits', (0, 0))
                sn, sus = agg['sell']
                per_sale = sus / max(1, sold - cn)
                cost = tus / tn + (dus / dn if dn else 0) + (cus / cn if cn else 0)
                print(f"| {pas} | {b} | | **a transfer (debit {tus / tn:.1f} + done {dus / max(dn, 1):.1f} + credited sale "
                      f"{cus / max(cn, 1):.1f} µs) ÷ a coalesced sale ({per_sale:.2f} µs)** | {tn:,} debits | "
                      f"**{cost / per_sale:.1f}×** | | |")

ceil_rows = []
for m in counts:
    d = os.path.join(out, f"c{m}")
    fs = sorted(f for f in os.listdir(d) if f.startswith("ceil."))
    if fs:
        c = [float(list(csv.reader(io.StringIO(open(os.path.join(d, f)).read())))[-1][1]) for f in fs]
        ceil_rows.append(f"| {m} | {' / '.join(f'{v:,.0f}' for v in c)} | {sum(c):,.0f} |")
if ceil_rows:
    print("\n| masters | ceiling per master (lone-request EVALSHA calls/s, redis-benchmark -c 50 -P 64) | projected capacity |")
    print("|---|---|---|")
    print("\n".join(ceil_rows))
PY
