//! A local Redis Cluster: masters and replicas as real `redis-server --cluster-enabled yes`
//! processes on loopback, joined with `redis-cli --cluster create`, killed on drop.
//!
//! Facts this harness respects (measured here, see `../shared/NOTES.md`): a node on port P also
//! needs P + 10000 free (the cluster bus), so ports are drawn below 55535 with both free; the
//! cluster is ready only when every node says `cluster_state:ok` **and** every replica's link to
//! its master is up (a master killed before its replica synced is never replaced); a short
//! `cluster-node-timeout` (2 s) makes a failover take seconds instead of ~16 s.

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use super::redis_server::{RedisServer, redis_cli};

/// One cluster sale at a time across the suites that kill masters mid-sale: two at once would
/// share two cores, and a starved node misses its cluster heartbeats.
static ONE_SALE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `sale` (which starts its own cluster) on a 4-thread runtime of its own, after any
/// other such sale has ended.
pub fn one_sale_at_a_time<T>(sale: impl std::future::Future<Output = T>) -> T {
    let _one = ONE_SALE.lock().unwrap_or_else(|p| p.into_inner());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
        .block_on(sale)
}

/// A running cluster; `nodes[..masters]` were created as masters, the rest as their replicas
/// (roles change after a failover: ask the nodes, not this order).
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    pub masters: usize,
}

/// A port P with P and P + 10000 free on loopback, P below 55535.
fn cluster_port() -> u16 {
    loop {
        let p = fastrand::u16(20_000..45_000);
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(p) && free(p + 10_000) {
            return p;
        }
    }
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas_per_master` replicas each and waits until the
    /// cluster is ready (state ok on every node, every replica in sync).
    pub fn start(masters: usize, replicas_per_master: usize) -> Self {
        Self::start_with(masters, replicas_per_master, &[])
    }

    /// [`start`](Self::start), every node with these extra `--flag value` arguments (kept when a
    /// node is started again), e.g. `--min-replicas-to-write 1`.
    pub fn start_with(masters: usize, replicas_per_master: usize, extra: &[&str]) -> Self {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 masters"
        );
        let total = masters * (1 + replicas_per_master);
        let mut nodes = Vec::with_capacity(total);
        while nodes.len() < total {
            let port = cluster_port();
            let conf = format!("nodes-{port}.conf");
            let mut args = vec![
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &conf,
                "--cluster-node-timeout",
                "2000",
            ];
            args.extend_from_slice(extra);
            if let Some(node) = RedisServer::start_on(port, &args) {
                nodes.push(node);
            }
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas_per_master.to_string()])
            .arg("--cluster-yes")
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Self { nodes, masters };
        cluster.wait_ready(Duration::from_secs(30));
        cluster
    }

    /// Waits until every node reports `cluster_state:ok`, every replica's master link is up
    /// and, under `min-replicas-to-write`, every master counts a good replica (a master
    /// refreshes that count once a second, after the link is up: until then it refuses
    /// writes); panics with the nodes' views after `timeout`.
    pub fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let ready = self.nodes.iter().filter(|n| n.is_running()).all(|n| {
                let info = n.cli(&["CLUSTER", "INFO"]);
                let repl = n.cli(&["INFO", "replication"]);
                let replicated = !repl.contains("min_slaves_good_slaves:0")
                    || repl.contains("connected_slaves:0");
                info.contains("cluster_state:ok")
                    && (!repl.contains("role:slave") || repl.contains("master_link_status:up"))
                    && replicated
            });
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cluster not ready after {timeout:?}: {}",
                self.live().cli(&["CLUSTER", "NODES"])
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A `redis-cluster://` URL naming every node as a seed, so losing any one of them never
    /// leaves the client without a node to rediscover the cluster from.
    pub fn url(&self) -> String {
        let mut url = format!("redis-cluster://127.0.0.1:{}", self.nodes[0].port);
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            url.push(if i == 1 { '?' } else { '&' });
            url.push_str(&format!("node=127.0.0.1:{}", n.port));
        }
        url
    }

    /// The ports of the nodes that are masters now (from `CLUSTER NODES` of a live node).
    pub fn master_ports(&self) -> Vec<u16> {
        let view = redis_cli(self.live().port, &["CLUSTER", "NODES"]);
        let mut ports: Vec<u16> = view
            .lines()
            .filter(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("master")))
            .filter_map(|l| {
                let addr = l.split(' ').nth(1)?; // 127.0.0.1:P@BUS
                addr.split('@').next()?.rsplit(':').next()?.parse().ok()
            })
            .collect();
        ports.sort_unstable();
        ports
    }

    /// A running node.
    fn live(&self) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.is_running())
            .expect("a running node")
    }

    /// A `redis-cluster://` URL naming only `nodes[i]` as its seed.
    pub fn url_of(&self, i: usize) -> String {
        format!("redis-cluster://127.0.0.1:{}", self.nodes[i].port)
    }

    /// Makes the replica of `nodes[master]` take over (`CLUSTER FAILOVER` on the replica: no
    /// acknowledged write is lost) and waits until the cluster is ready with the new roles.
    pub fn fail_over(&mut self, master: usize) {
        let id = self.nodes[master].cli(&["CLUSTER", "MYID"]);
        let replica = self
            .nodes
            .iter()
            .find(|n| {
                n.cli(&["INFO", "replication"])
                    .contains(&format!("master_port:{}", self.nodes[master].port))
            })
            .unwrap_or_else(|| panic!("no replica of node {master} ({id})"));
        assert_eq!(replica.cli(&["CLUSTER", "FAILOVER"]), "OK");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.nodes[master]
            .cli(&["INFO", "replication"])
            .contains("role:slave")
        {
            assert!(
                Instant::now() < deadline,
                "failover of node {master} did not happen"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.wait_ready(Duration::from_secs(30));
    }

    /// The index of the node replicating `nodes[master]` now.
    pub fn replica_of(&self, master: usize) -> usize {
        let port = self.nodes[master].port;
        self.nodes
            .iter()
            .position(|n| {
                n.is_running()
                    && n.cli(&["INFO", "replication"])
                        .lines()
                        .any(|l| l.trim() == format!("master_port:{port}"))
            })
            .unwrap_or_else(|| panic!("no replica of node {master} (:{port})"))
    }

    /// Freezes `nodes[i]` (`SIGSTOP`): it neither answers nor replicates until the returned
    /// [`Frozen`] is thawed or dropped. Keep it short: frozen longer than
    /// `cluster-node-timeout`, the others flag it failed.
    pub fn freeze(&self, i: usize) -> Frozen {
        let info = self.nodes[i].cli(&["INFO", "server"]);
        let pid = info
            .lines()
            .find_map(|l| l.trim().strip_prefix("process_id:"))
            .unwrap_or_else(|| panic!("no process_id in INFO of node {i}"))
            .to_string();
        signal(&pid, "-STOP");
        Frozen { pid }
    }

    /// After a `kill -9` of a master (`nodes[i].stop()`; no failover asked for, its replica
    /// takes over once the other masters flag it failed, `cluster-node-timeout` 2 s): waits
    /// until `nodes[replica]` has become a master and the cluster is ready again.
    pub fn wait_failed_over(&self, replica: usize) {
        self.wait_role(replica, "role:master");
        self.wait_ready(Duration::from_secs(30));
    }

    /// Starts a killed node again (empty, same port and cluster config): it learns that its
    /// slots moved on, rejoins as a replica of the node that took them, and syncs; waits until
    /// the cluster is ready.
    pub fn rejoin(&mut self, node: usize) {
        self.nodes[node].boot();
        self.wait_role(node, "role:slave");
        self.wait_ready(Duration::from_secs(30));
    }

    /// Waits (at most 30 s) until `nodes[i]` reports `role` (`role:master` / `role:slave`).
    fn wait_role(&self, i: usize, role: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.nodes[i].cli(&["INFO", "replication"]).contains(role) {
            assert!(
                Instant::now() < deadline,
                "node {i} never reported {role}: {}",
                self.nodes[i].cli(&["CLUSTER", "NODES"])
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The number of keys on each node now, in `nodes` order (`DBSIZE`).
    pub fn key_counts(&self) -> Vec<u64> {
        self.nodes.iter().map(RedisServer::dbsize).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Resharding and script caches (the tests of `tests/it/cluster.rs`): a slot moved to
// another master while clients use it, and every master's script cache emptied.
// ---------------------------------------------------------------------------------------------

/// The admin side of a [`RedisCluster`] by ports only: `Send + 'static`, so a blocking thread
/// can reshard while the test's tasks sell.
#[derive(Debug, Clone)]
pub struct ClusterAdmin {
    /// Every node's port (masters and replicas, running or not).
    pub ports: Vec<u16>,
}

/// One step of [`ClusterAdmin::migrate_slot_with`], for a test that wants work done between
/// steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrateStep {
    /// `CLUSTER SETSLOT IMPORTING` / `MIGRATING` are set: the slot is in flux.
    Marked,
    /// One batch of keys moved (`MIGRATE ... KEYS`); `moved` so far.
    Batch { moved: usize },
    /// `CLUSTER SETSLOT NODE` on every master: the slot is the target's.
    Assigned,
}

/// One line of `CLUSTER NODES`: id, port, is master, slot ranges owned.
type NodeView = (String, u16, bool, Vec<(u16, u16)>);

/// `CLUSTER NODES` of one node.
fn nodes_view(port: u16) -> Vec<NodeView> {
    redis_cli(port, &["CLUSTER", "NODES"])
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let p = f
                .get(1)?
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let master = f.get(2)?.contains("master");
            // "0-5460", "5461", and "[5461->-id]" / "[5461-<-id]" (migrating / importing:
            // not an ownership) from field 8 on.
            let ranges = f
                .iter()
                .skip(8)
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|a| (a, a)),
                })
                .collect();
            Some((f[0].to_string(), p, master, ranges))
        })
        .collect()
}

fn ok(port: u16, args: &[&str]) {
    let out = redis_cli(port, args);
    assert_eq!(out, "OK", "redis-cli -p {port} {args:?}");
}

/// The slot of `key` (CRC16/XMODEM of its hash tag, or of the whole key, mod 16384): what
/// `CLUSTER KEYSLOT` answers, without a round trip per key.
pub fn key_slot(key: &str) -> u16 {
    shardstock::placement::slot_of_key(key)
}

impl ClusterAdmin {
    /// A node that answers.
    fn live(&self) -> u16 {
        *self
            .ports
            .iter()
            .find(|p| redis_cli(**p, &["PING"]) == "PONG")
            .expect("a running node")
    }

    /// The ports of the masters now.
    pub fn masters(&self) -> Vec<u16> {
        let mut m: Vec<u16> = nodes_view(self.live())
            .into_iter()
            .filter(|n| n.2 && !n.3.is_empty())
            .map(|n| n.1)
            .collect();
        m.sort_unstable();
        m
    }

    /// The slot ranges the node on `port` serves now (as one live node sees it; none for a
    /// replica).
    pub fn slots_of(&self, port: u16) -> Vec<(u16, u16)> {
        nodes_view(self.live())
            .into_iter()
            .find(|n| n.1 == port)
            .map(|n| n.3)
            .unwrap_or_default()
    }

    /// The slot of `key` as the server computes it (`CLUSTER KEYSLOT`; [`key_slot`] computes
    /// the same without a round trip).
    pub fn keyslot(&self, key: &str) -> u16 {
        let out = redis_cli(self.live(), &["CLUSTER", "KEYSLOT", key]);
        out.parse()
            .unwrap_or_else(|_| panic!("CLUSTER KEYSLOT answered {out:?}"))
    }

    /// The number of keys `port` holds in `slot` (`CLUSTER COUNTKEYSINSLOT`).
    pub fn keys_in_slot(&self, port: u16, slot: u16) -> u64 {
        let out = redis_cli(port, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]);
        out.parse()
            .unwrap_or_else(|_| panic!("COUNTKEYSINSLOT answered {out:?}"))
    }

    /// The master serving `slot` now (as one live node sees it).
    pub fn owner_of(&self, slot: u16) -> u16 {
        nodes_view(self.live())
            .into_iter()
            .find(|n| n.2 && n.3.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
            .1
    }

    /// The keys matching `pattern` on each master now (`KEYS`: test-sized data only).
    pub fn keys_by_master(&self, pattern: &str) -> Vec<(u16, Vec<String>)> {
        self.masters()
            .into_iter()
            .map(|p| {
                let keys = redis_cli(p, &["KEYS", pattern])
                    .lines()
                    .filter(|l| !l.is_empty())
                    .map(str::to_string)
                    .collect();
                (p, keys)
            })
            .collect()
    }

    /// Moves `slot` to the master on port `to` (see [`Self::migrate_slot_with`]).
    pub fn migrate_slot(&self, slot: u16, to: u16) -> usize {
        self.migrate_slot_with(slot, to, 50, |_| {})
    }

    /// Moves `slot` to the master on port `to` the way `redis-cli --cluster reshard` does:
    /// `SETSLOT IMPORTING` on the target, `SETSLOT MIGRATING` on the source, `MIGRATE` the
    /// slot's keys `batch` at a time until `GETKEYSINSLOT` finds none, then `SETSLOT NODE` on
    /// the target, the source and every other master. `between` runs after each step (while
    /// clients keep using the slot: they get `ASK` / `TRYAGAIN` / `MOVED` meanwhile). Returns
    /// the keys moved; a slot already on `to` moves nothing.
    pub fn migrate_slot_with(
        &self,
        slot: u16,
        to: u16,
        batch: usize,
        mut between: impl FnMut(MigrateStep),
    ) -> usize {
        let from = self.owner_of(slot);
        if from == to {
            return 0;
        }
        let id = |p: u16| redis_cli(p, &["CLUSTER", "MYID"]);
        let (from_id, to_id) = (id(from), id(to));
        let s = slot.to_string();
        ok(to, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id]);
        ok(from, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id]);
        between(MigrateStep::Marked);
        let mut moved = 0;
        let assign = |p: u16| redis_cli(p, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
        loop {
            let n = batch.to_string();
            let keys = redis_cli(from, &["CLUSTER", "GETKEYSINSLOT", &s, &n]);
            let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
            if keys.is_empty() {
                // The source refuses NODE while it still holds keys of the slot (none can be
                // created there once it is empty: a command on missing keys is sent on).
                assert_eq!(assign(to), "OK", "SETSLOT {slot} NODE on the target");
                let at_source = assign(from);
                if at_source == "OK" {
                    break;
                }
                assert!(
                    at_source.contains("still hold keys"),
                    "SETSLOT {slot} NODE on the source: {at_source}"
                );
                continue;
            }
            let port = to.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(&keys);
            let out = redis_cli(from, &args);
            assert!(
                out == "OK" || out == "NOKEY",
                "MIGRATE of slot {slot} to :{to}: {out}"
            );
            moved += keys.len();
            between(MigrateStep::Batch { moved });
        }
        for p in self.masters() {
            if p != to && p != from {
                assert_eq!(assign(p), "OK", "SETSLOT {slot} NODE on :{p}");
            }
        }
        between(MigrateStep::Assigned);
        moved
    }

    /// `SCRIPT FLUSH` on every master (what a restart or a failover does to a script cache).
    pub fn flush_scripts(&self) {
        for p in self.masters() {
            ok(p, &["SCRIPT", "FLUSH"]);
        }
    }
}

impl RedisCluster {
    /// The admin handle of this cluster (ports only).
    pub fn admin(&self) -> ClusterAdmin {
        ClusterAdmin {
            ports: self.nodes.iter().map(|n| n.port).collect(),
        }
    }

    /// Moves `slot` to the master on port `to_master` ([`ClusterAdmin::migrate_slot_with`]);
    /// returns the keys moved.
    pub fn migrate_slot(&self, slot: u16, to_master: u16) -> usize {
        self.admin().migrate_slot(slot, to_master)
    }
}

/// A node stopped by [`RedisCluster::freeze`]; runs again (`SIGCONT`) when dropped.
pub struct Frozen {
    pid: String,
}

impl Frozen {
    /// Lets the node run again.
    pub fn thaw(self) {}
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(&self.pid, "-CONT");
    }
}

fn signal(pid: &str, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, pid])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok || std::thread::panicking(), "kill {sig} {pid}");
}

// ---------------------------------------------------------------------------------------------
// Nemesis (`tests/it/nemesis_cluster.rs`): `kill -9` of a master, its replica promoted,
// the killed node back as a replica.
// ---------------------------------------------------------------------------------------------

/// What one [`RedisCluster::kill_master`] did, with its moments (µs since the UNIX epoch, the
/// clock the histories record).
#[derive(Debug, Clone)]
pub struct Kill {
    /// The node killed (`kill -9`).
    pub victim: usize,
    /// Its replica, promoted in its place.
    pub promoted: usize,
    /// When the replica was cut off (= `killed_us` without a lag).
    pub lag_us: u64,
    /// When the master was killed.
    pub killed_us: u64,
    /// When the replica was a master and the cluster ready again.
    pub promoted_us: u64,
    /// When the killed node was back as a replica (cluster ready).
    pub rejoined_us: u64,
}

/// Now, µs since the UNIX epoch (the clock the histories record).
fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

impl RedisCluster {
    /// `kill -9` of the master `nodes[victim]`, and nothing more: its replica is promoted once
    /// the other masters flag it failed, and the killed node stays down, so the promoted master
    /// has no replica. Returns (the replica promoted, when killed, when promoted), times in µs.
    /// Blocking (seconds).
    pub fn kill_master_for_good(&mut self, victim: usize) -> (usize, u64, u64) {
        let promoted = self.replica_of(victim);
        self.nodes[victim].stop();
        let killed_us = now_us();
        self.wait_role(promoted, "role:master");
        (promoted, killed_us, now_us())
    }

    /// The indexes (into `nodes`) of the running nodes that are masters now.
    pub fn master_nodes(&self) -> Vec<usize> {
        let masters = self.master_ports();
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_running() && masters.contains(&self.nodes[i].port))
            .collect()
    }

    /// `kill -9` of the master `nodes[victim]` with no failover asked for: its replica is
    /// promoted once the other masters flag it failed (`cluster-node-timeout` 2 s); then the
    /// killed node is started again (empty) and rejoins as the new master's replica. With
    /// `lag`, the replica is first cut off for that long (frozen, its link killed by the
    /// master: it misses every write of that window, acknowledged or not — what an
    /// asynchronous replica that fell behind loses), then the master dies, then the replica
    /// runs again and takes over. Blocking (seconds): call it from a blocking thread.
    pub fn kill_master(&mut self, victim: usize, lag: Option<Duration>) -> Kill {
        let promoted = self.replica_of(victim);
        let lag_us = now_us();
        let frozen = lag.map(|d| {
            let f = self.freeze(promoted);
            self.nodes[victim].cli(&["CLIENT", "KILL", "TYPE", "replica"]);
            std::thread::sleep(d);
            f
        });
        self.nodes[victim].stop();
        let killed_us = now_us();
        drop(frozen);
        self.wait_failed_over(promoted);
        let promoted_us = now_us();
        self.rejoin(victim);
        Kill {
            victim,
            promoted,
            lag_us: if lag.is_some() { lag_us } else { killed_us },
            killed_us,
            promoted_us,
            rejoined_us: now_us(),
        }
    }
}
