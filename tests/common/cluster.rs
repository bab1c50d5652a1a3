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
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 masters"
        );
        let total = masters * (1 + replicas_per_master);
        let mut nodes = Vec::with_capacity(total);
        while nodes.len() < total {
            let port = cluster_port();
            let conf = format!("nodes-{port}.conf");
            if let Some(node) = RedisServer::start_on(
                port,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &conf,
                    "--cluster-node-timeout",
                    "2000",
                ],
            ) {
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

    /// Waits until every node reports `cluster_state:ok` and every replica's master link is
    /// up; panics with the nodes' views after `timeout`.
    pub fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let ready = self.nodes.iter().filter(|n| n.is_running()).all(|n| {
                let info = n.cli(&["CLUSTER", "INFO"]);
                let repl = n.cli(&["INFO", "replication"]);
                info.contains("cluster_state:ok")
                    && (!repl.contains("role:slave") || repl.contains("master_link_status:up"))
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
