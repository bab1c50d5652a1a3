//! RedLock: one lock over a quorum of independent Redis nodes.
//!
//! # What it does
//! Each of N independent masters (N odd, at least 3) votes on its own. An attempt records the
//! start time, runs `redlock_acquire.lua` (a `SET key token NX PX lease`) on **all** nodes
//! concurrently with a short per-node timeout, and wins when at least `N/2 + 1` nodes granted
//! *and* time is left: validity = lease − elapsed − drift, with drift = lease/100 + 2 ms for
//! clock-rate differences. A lost attempt is undone at once (compare-and-delete on the nodes
//! that granted or whose answer is unknown), so split votes between contenders do not block
//! anyone for a lease. Renewal (the watchdog's compare-and-`PEXPIRE`) counts as renewed only
//! when a quorum renewed (nodes whose answer was lost are asked again within lease/3); release
//! is a compare-and-delete everywhere (retried in the background where the answer was lost).
//! A node that errors, times out or is disconnected simply votes "no": a minority of nodes can
//! be down. When so many nodes *failed* that no quorum is possible (more than N − quorum), the
//! attempt returns [`Error::Redis`] at once instead of letting the caller wait for a lock it
//! cannot get.
//!
//! # What it guarantees, and what it does not
//! Under timing assumptions — node clocks advance at about the same rate (no jumps), and no
//! process or network pause exceeds the validity — at most one client holds a valid lock at a
//! time, and the lock survives a minority of nodes being down or partitioned. Those assumptions
//! are exactly what Martin Kleppmann's critique ("How to do distributed locking", 2016)
//! attacks: a holder paused by GC, `SIGSTOP`, swapping or a slow network after it checked its
//! lock resumes after the lease expired and acts as if it still held it; a node whose clock is
//! stepped forward expires keys early; and RedLock hands out no fencing token that a resource
//! could check. No lock service can stop a paused client. That is why shardstock treats the
//! lock as an efficiency device only and **fences writes at the stock store**: each acquisition
//! bumps a fence token stored with the segment, and the write scripts apply only while the
//! token is still the holder's (`sell.lua` given the token). Redisson reached
//! the same verdict and deprecated its `RedissonRedLock`; prefer the single-Redis backend
//! unless you need the lock to survive the loss of one Redis, and keep the fence token either
//! way.
//!
//! # Restarted nodes: quarantine
//! A node restarted without its data (no persistence, `FLUSHALL`, a fresh replacement) has
//! forgotten the locks it granted; voting at once would let a second client win a quorum made
//! of it plus free nodes while the first holder still owns the lock on the rest. Each node
//! therefore keeps a marker key, [`QUARANTINE_KEY`] (no TTL), holding the end of its
//! quarantine in milliseconds of the node's own clock (`TIME`). The acquire script sees a
//! missing marker as "new or restarted empty", sets it to now + quarantine and refuses to vote
//! until then (the attempt sees "contended", not an error). Renewals
//! cannot revive a forgotten lock (they compare the token), so the old holder's watchdog sees
//! the lock lost unless it still has a quorum *without* that node — in which case the
//! newcomer cannot win a quorum either.
//!
//! The quarantine is `3 × lease` of the requesting locker. One lease is enough when every
//! locker sharing the nodes uses the same lease: a lock the node forgot was last granted or
//! renewed before the restart, so it either expires within one lease of it or is still held
//! by a quorum of the other nodes. The factor 3 adds margin for clock-rate drift and tolerates
//! lockers with leases up to 3× this one's; **all lockers sharing a node set must use leases
//! within a factor of 3** (ideally the same lease).
//!
//! **First contact.** A brand-new node looks exactly like a restarted one (both are empty), so
//! a new deployment refuses locks for `3 × lease` after its first acquisition attempt (6 s with
//! the default 2 s lease; attempts in that window return "contended"). The marker is
//! deliberately *not* pre-seeded when a locker connects: a node that restarted between a lock
//! grant and a new process connecting would then skip its quarantine, and a rolling deployment
//! makes that likely. An operator who *knows* a node is brand new may set
//! the marker to `0` by hand (`SET shardstock:redlock:quarantine 0`) to skip the wait.
//!
//! The quarantine only detects restarts that lost the marker too. Run the nodes without
//! persistence (then a restart always loses both) or with `appendfsync always`; an RDB or
//! `everysec` AOF can come back with the marker but without a recent lock. Use `noeviction`:
//! an evicted lock key is a forgotten lock.
//!
//! # Connections
//! One fred client per node: 200 ms connection timeout, reconnection forever in the
//! background (exponential, 10 ms to 500 ms), a 100 ms command timeout so one slow node cannot
//! hold up the quorum, and a single attempt per command (fred must not silently re-send a lock
//! `SET` after a reconnect). A node that is down when connecting is not an error; a node that
//! is not connected is not even asked (no command queued behind a reconnection can land late).
//! The scripts run through the store's Lua layer ([`crate::store::redis::lua`]) on each node's
//! client: a `NOSCRIPT` (a restarted node) reloads them there, counted like every reload.
use crate::error::{Error, Result};
use crate::store::redis::lua::lock::{LockRelease, LockRenew, RedlockAcquire, Vote};
use crate::store::redis::lua::{self, Call, Script};
use fred::error::{Error as FredError, ErrorKind};
use fred::prelude::{Builder, Client, ClientLike, Config, ReconnectPolicy};
use fred::types::ConnectHandle;
use futures::future::join_all;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The per-node quarantine marker (no TTL; value: end of quarantine in server-clock ms).
///
/// Missing means the node is new or restarted empty; see the [module docs](self).
pub const QUARANTINE_KEY: &str = "shardstock:redlock:quarantine";

/// Quarantine of a node found empty, in leases of the requesting locker.
const QUARANTINE_LEASES: u32 = 3;
/// Connection (and handshake) timeout per node.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// Timeout of one command on one node.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(100);
/// Bound of one script call on one node (EVALSHA, and on NOSCRIPT: SCRIPT LOAD + EVALSHA).
const CALL_TIMEOUT: Duration = Duration::from_millis(250);

/// The scripts the nodes run (preloaded where reachable at connect).
const SCRIPTS: [Script; 3] = [
    Script::RedlockAcquire,
    Script::LockRenew,
    Script::LockRelease,
];

/// One node's client (cheap to clone: background release retries keep a copy).
#[derive(Clone)]
struct Peer {
    url: Arc<str>,
    client: Client,
}

struct Node {
    peer: Peer,
    task: ConnectHandle,
}

/// A lock over a quorum of independent nodes.
pub struct RedLock {
    nodes: Vec<Node>,
    quorum: usize,
}

impl std::fmt::Debug for RedLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedLock")
            .field(
                "nodes",
                &self.nodes.iter().map(|n| &*n.peer.url).collect::<Vec<_>>(),
            )
            .field("quorum", &self.quorum)
            .finish()
    }
}

/// One node's answer to an acquisition.
enum Ballot {
    Granted,
    Refused,
    /// Unknown outcome (error, timeout, unexpected reply) or not asked (disconnected).
    Failed {
        error: Error,
        sent: bool,
    },
}

impl RedLock {
    /// Checks a node list without connecting: an odd number ≥ 3 of distinct, parseable,
    /// non-cluster URLs. Returns each node's client config. A bad URL is a config error that
    /// names the node (not a Redis error about the store's server).
    pub(crate) fn check_nodes(urls: &[String]) -> Result<Vec<Config>> {
        if urls.len() < 3 || urls.len().is_multiple_of(2) {
            return Err(Error::Config(format!(
                "redlock needs an odd number of nodes, at least 3 (got {})",
                urls.len()
            )));
        }
        for (i, u) in urls.iter().enumerate() {
            if urls[..i].contains(u) {
                return Err(Error::Config(format!(
                    "redlock node {u:?} is listed twice (it would vote twice)"
                )));
            }
        }
        urls.iter()
            .map(|url| {
                let config = crate::store::redis::endpoint::parse(url).map_err(|e| match e {
                    Error::Config(m) => Error::Config(format!("redlock node: {m}")),
                    e => e,
                })?;
                if config.server.is_clustered() {
                    return Err(Error::Config(format!(
                        "redlock node {url:?} is a cluster URL; the nodes must be independent servers"
                    )));
                }
                Ok(config)
            })
            .collect()
    }

    pub(crate) async fn connect(urls: &[String]) -> Result<Self> {
        let configs = Self::check_nodes(urls)?;
        let mut clients = Vec::with_capacity(urls.len());
        for (url, mut config) in urls.iter().zip(configs) {
            // Keep retrying a node that is down at start; it votes once it is reachable.
            config.fail_fast = false;
            let client = Builder::from_config(config)
                .with_connection_config(|c| {
                    c.connection_timeout = CONNECT_TIMEOUT;
                    c.internal_command_timeout = CONNECT_TIMEOUT;
                    c.max_command_attempts = 1;
                    c.tcp.nodelay = Some(true);
                })
                .with_performance_config(|p| p.default_command_timeout = COMMAND_TIMEOUT)
                .set_policy(ReconnectPolicy::new_exponential(0, 10, 500, 2))
                .build()?;
            clients.push((url.clone(), client));
        }
        let red = Self {
            nodes: clients
                .into_iter()
                .map(|(url, client)| {
                    let task = client.connect();
                    Node {
                        peer: Peer {
                            url: url.into(),
                            client,
                        },
                        task,
                    }
                })
                .collect(),
            quorum: urls.len() / 2 + 1,
        };
        // Wait briefly for the nodes (concurrently) and preload the scripts where reachable;
        // the Lua layer's reload on NOSCRIPT covers the rest (late nodes, restarts).
        join_all(red.nodes.iter().map(|n| async {
            let _ = tokio::time::timeout(CONNECT_TIMEOUT, async {
                // Poll rather than `wait_for_connect` (which can miss a connection that
                // completes between its state check and its subscription).
                while !n.peer.client.is_connected() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                lua::load(&n.peer.client, &SCRIPTS).await
            })
            .await;
        }))
        .await;
        Ok(red)
    }

    /// The error for "so many nodes failed that no quorum is possible".
    fn no_quorum(&self, what: &str, failed: usize, first: Option<&Error>) -> Error {
        let (kind, cause) = match first {
            Some(Error::Redis(e)) => (e.kind().clone(), format!("; first: {e}")),
            Some(e) => (ErrorKind::Protocol, format!("; first: {e}")),
            None => (ErrorKind::IO, String::new()),
        };
        Error::Redis(FredError::new(
            kind,
            format!(
                "redlock {what}: no quorum possible, {failed} of {} nodes failed (need {}){cause}",
                self.nodes.len(),
                self.quorum
            ),
        ))
    }

    pub(crate) async fn try_lock(
        &self,
        key: &str,
        token: &str,
        lease: Duration,
    ) -> Result<Option<Duration>> {
        let lease_ms = lease.as_millis().max(1);
        let call = RedlockAcquire {
            key,
            marker: QUARANTINE_KEY,
            token,
            lease_ms,
            quarantine_ms: lease_ms * u128::from(QUARANTINE_LEASES),
        };
        let start = Instant::now();
        let votes: Vec<Ballot> = join_all(self.nodes.iter().map(|n| ask(&n.peer, call)))
            .await
            .into_iter()
            .zip(&self.nodes)
            .map(|((r, sent), node)| match r {
                Err(error) => Ballot::Failed { error, sent },
                Ok(Vote::Granted) => Ballot::Granted,
                Ok(Vote::Taken) => Ballot::Refused,
                Ok(Vote::Quarantined { ms_left }) => {
                    let url = &node.peer.url;
                    tracing::debug!(node = %url, ms_left, "redlock node in quarantine");
                    Ballot::Refused
                }
            })
            .collect();
        let elapsed = start.elapsed();
        let granted = votes
            .iter()
            .filter(|v| matches!(v, Ballot::Granted))
            .count();
        let drift = lease / 100 + Duration::from_millis(2);
        let validity = lease.saturating_sub(elapsed + drift);
        if granted >= self.quorum && !validity.is_zero() {
            return Ok(Some(validity));
        }
        // Lost: undo where we hold the key or may hold it (a timed-out SET may have landed).
        let undo: Vec<&Peer> = self
            .nodes
            .iter()
            .zip(&votes)
            .filter(|(_, v)| matches!(v, Ballot::Granted | Ballot::Failed { sent: true, .. }))
            .map(|(n, _)| &n.peer)
            .collect();
        self.release_on(undo, key, token).await;
        let mut failures = votes.iter().filter_map(|v| match v {
            Ballot::Failed { error, .. } => Some(error),
            _ => None,
        });
        let first = failures.next();
        let failed = usize::from(first.is_some()) + failures.count();
        if failed > self.nodes.len() - self.quorum {
            return Err(self.no_quorum("acquire", failed, first));
        }
        Ok(None)
    }

    /// Compare-and-`PEXPIRE` on every node; `true` once a quorum renewed. Nodes whose answer
    /// was lost are asked again while time is left (lease/3: the watchdog calls this lease/3
    /// after the previous renewal, so the lock is still valid for about another lease/3 at
    /// the end). Renewing late is safe: a node renews only while it still holds this token.
    pub(crate) async fn renew(&self, key: &str, token: &str, lease: Duration) -> Result<bool> {
        let deadline = Instant::now() + lease / 3;
        let call = LockRenew { key, token, lease };
        let mut pending: Vec<&Peer> = self.nodes.iter().map(|n| &n.peer).collect();
        let mut renewed = 0;
        loop {
            let results = join_all(pending.iter().map(|p| ask(p, call))).await;
            let mut failed = Vec::new();
            let mut first = None;
            for (p, (r, _)) in pending.into_iter().zip(results) {
                match r {
                    Ok(true) => renewed += 1,
                    Ok(false) => {} // not (or no longer) held by this token there
                    Err(e) => {
                        first.get_or_insert(e);
                        failed.push(p);
                    }
                }
            }
            if renewed >= self.quorum {
                return Ok(true);
            }
            let out_of_time = Instant::now() + Duration::from_millis(5) >= deadline;
            if renewed + failed.len() < self.quorum || out_of_time {
                if failed.len() > self.nodes.len() - self.quorum {
                    return Err(self.no_quorum("renew", failed.len(), first.as_ref()));
                }
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            pending = failed;
        }
    }

    pub(crate) async fn unlock(&self, key: &str, token: &str) -> Result<()> {
        let peers = self.nodes.iter().map(|n| &n.peer).collect();
        self.release_on(peers, key, token).await;
        Ok(())
    }

    /// Compare-and-delete on `peers`, best effort. A node whose answer was lost (sent, then an
    /// error or a timeout) is retried a few times in the background: the delete is idempotent
    /// and only ever removes this token, and a lock left behind would block its node for a
    /// whole lease. Nodes that still miss it let the key expire by its lease.
    async fn release_on(&self, peers: Vec<&Peer>, key: &str, token: &str) {
        if peers.is_empty() {
            return;
        }
        let call = LockRelease { key, token };
        let results = join_all(peers.iter().map(|p| ask(p, call))).await;
        let unknown: Vec<Peer> = peers
            .into_iter()
            .zip(results)
            .filter(|(_, (r, sent))| r.is_err() && *sent)
            .map(|(p, _)| p.clone())
            .collect();
        if unknown.is_empty() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(retry_release(unknown, key.to_string(), token.to_string()));
        }
    }
}

/// Background retries of a release whose outcome is unknown on some nodes (about 0.3 s).
async fn retry_release(mut peers: Vec<Peer>, key: String, token: String) {
    let call = LockRelease {
        key: &key,
        token: &token,
    };
    let mut delay = Duration::from_millis(20);
    for _ in 0..4 {
        tokio::time::sleep(delay).await;
        delay *= 2;
        let results = join_all(peers.iter().map(|p| ask(p, call))).await;
        peers = peers
            .into_iter()
            .zip(results)
            .filter(|(_, (r, _))| r.is_err())
            .map(|(p, _)| p)
            .collect();
        if peers.is_empty() {
            return;
        }
    }
    for p in &peers {
        let node = &p.url;
        tracing::debug!(%node, %key, "redlock release unconfirmed; the lease expires it");
    }
}

/// Runs `call` on one node through the Lua layer, bounded in time. A disconnected node is not
/// asked (nothing is queued behind its reconnection to land late); the flag tells whether the
/// command was sent.
async fn ask<C: Call>(peer: &Peer, call: C) -> (Result<C::Output>, bool) {
    if !peer.client.is_connected() {
        let e = FredError::new(ErrorKind::IO, format!("{} is not connected", peer.url));
        return (Err(Error::Redis(e)), false);
    }
    let r = tokio::time::timeout(CALL_TIMEOUT, lua::run(&peer.client, call)).await;
    let r = r.unwrap_or_else(|_| {
        Err(Error::Redis(FredError::new(
            ErrorKind::Timeout,
            format!("{} timed out", peer.url),
        )))
    });
    (r, true)
}

impl Drop for RedLock {
    fn drop(&mut self) {
        // The clients reconnect forever: stop their tasks, nothing uses them any more.
        for n in &self.nodes {
            n.task.abort();
        }
    }
}
