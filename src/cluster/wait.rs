//! Durability mode (`store.wait_replicas`, `store.wait_timeout_ms`): a mutating script call
//! answers only once `WAIT <replicas> <timeout>` confirmed that many replicas hold its writes.
//!
//! Redis replicates asynchronously: a master that is killed before its replica received a
//! write loses that write when the replica takes over, acknowledged or not. `WAIT n ms` blocks
//! the connection it is sent on until `n` replicas acknowledged every write that connection
//! made so far (or until `ms` pass) and answers how many did. So the `WAIT` must go on the same
//! connection as the script: the same fred [`Client`], routed to the node of the script's keys
//! (on a cluster, by the slot of its first key; every key of a script shares one hash tag).
//!
//! `WAIT` blocks the whole connection, and a fred client multiplexes every task over one
//! connection per node, so one `WAIT` per call would queue the calls of all tasks behind each
//! other. Waits are therefore grouped like a group commit: per (client, node) at most one
//! `WAIT` is out; callers whose script answered while it was out share the next one, which is
//! sent after their writes and so covers them all. The node of a slot comes from fred's cached
//! slot map (the one that routed the script); a slot that moved in between sends the `WAIT` to
//! its new owner, where it covers nothing of the script — the window is the one of a
//! resharding or failover racing the call. A coalesced batch (`batch`) is one script call and
//! waits once.
//!
//! Fewer acknowledgements than asked within the timeout answer [`Error::NotDurable`]
//! (retryable; counted in `shardstock_wait_shortfalls_total`): the call ran on the master, but
//! whether it survives a failover is unknown. A `WAIT` is sent once (no re-send on a new
//! connection, which would count that connection's writes, not the script's): a connection
//! lost in between answers [`Error::Redis`], outcome unknown, like any failed call.

use crate::cluster::refusal::setting;
use crate::error::{Error, Result};
use dashmap::DashMap;
use fred::prelude::{Client, ClientLike, ClusterInterface, ServerInterface};
use fred::types::ClusterHash;
use fred::types::config::{Options, Server};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// Most replicas one call may wait for.
pub(crate) const MAX_REPLICAS: u32 = 16;
/// Longest `WAIT` timeout.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// Checks the durability options: `replicas` 0 (off) ..= [`MAX_REPLICAS`], `timeout` 1 ms ..=
/// [`MAX_TIMEOUT`] in whole milliseconds.
///
/// # Errors
/// [`Error::Config`] naming the setting.
pub(crate) fn check(replicas: u32, timeout: Duration) -> Result<()> {
    if replicas > MAX_REPLICAS {
        return Err(Error::Config(format!(
            "store.wait_replicas must be 0..={MAX_REPLICAS} (0 = durability mode off), got {replicas}"
        )));
    }
    if timeout < Duration::from_millis(1) || timeout > MAX_TIMEOUT {
        return Err(Error::Config(format!(
            "store.wait_timeout_ms must be 1..={}, got {}",
            MAX_TIMEOUT.as_millis(),
            timeout.as_millis()
        )));
    }
    Ok(())
}

/// Durability mode's Redis side, checked on every master `client` knows: a master that cannot
/// reach `replicas` replicas should refuse writes (`min-replicas-to-write` ≥ `replicas`), so a
/// call there fails fast with nothing written ([`Error::NoReplicas`]) instead of running and
/// then waiting out the `WAIT` timeout for an answer that is only "not durable". One warning
/// per node that falls short or cannot be asked (an ACL without `CONFIG GET`); none when every
/// master is set up. Replicas are not reachable from here: set them up alike, they become
/// masters on failover.
pub(crate) async fn setup_warnings(client: &Client, replicas: u32) -> Vec<String> {
    use fred::types::CustomCommand;
    let nodes: Vec<Option<Server>> = match client.cached_cluster_state() {
        Some(state) if client.is_clustered() => {
            state.unique_primary_nodes().into_iter().map(Some).collect()
        }
        _ => vec![None],
    };
    let mut out = Vec::new();
    for node in nodes {
        let cmd = CustomCommand::new_static("CONFIG", ClusterHash::Random, false);
        let args = vec!["GET", "min-replicas-to-write", "min-replicas-max-lag"];
        let got: std::result::Result<Vec<String>, fred::error::Error> = match &node {
            Some(n) => client.with_cluster_node(n.clone()).custom(cmd, args).await,
            None => client.custom(cmd, args).await,
        };
        let name = node.map_or_else(|| "the Redis server".to_string(), |n| format!("node {n}"));
        let hint = format!(
            "set min-replicas-to-write {replicas} and min-replicas-max-lag (e.g. 2) on every \
             node, replicas included, so a master without its replicas refuses at once with \
             nothing written (docs/operations.md)"
        );
        match got {
            Ok(pairs) => {
                let (to_write, max_lag) = (
                    setting(&pairs, "min-replicas-to-write"),
                    setting(&pairs, "min-replicas-max-lag"),
                );
                if to_write.is_none_or(|v| v < u64::from(replicas)) {
                    out.push(format!(
                        "durability mode waits for {replicas} replica(s) but {name} has \
                         min-replicas-to-write {}: a master that lost its replicas (or a \
                         replica promoted without one) runs each call, then answers \
                         not_durable after store.wait_timeout_ms; {hint}",
                        to_write.map_or("(unknown)".to_string(), |v| v.to_string())
                    ));
                } else if max_lag == Some(0) {
                    out.push(format!(
                        "durability mode: {name} has min-replicas-max-lag 0, which turns \
                         min-replicas-to-write off; {hint}"
                    ));
                }
            }
            Err(e) => out.push(format!(
                "durability mode: cannot check min-replicas-to-write on {name} ({e}); {hint}"
            )),
        }
    }
    out
}

/// What a `WAIT` answered: the replicas that acknowledged.
type Acks = std::result::Result<i64, fred::error::Error>;

#[derive(Default)]
struct LaneState {
    /// A `WAIT` is out (its sender task runs).
    sending: bool,
    /// Callers whose writes the next `WAIT` must cover.
    waiting: Vec<oneshot::Sender<Acks>>,
}

/// The waits of one (client, node): one connection.
#[derive(Default)]
struct Lane(Mutex<LaneState>);

impl Lane {
    fn lock(&self) -> std::sync::MutexGuard<'_, LaneState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Idle lanes kept for reuse before idle ones are dropped.
const MAX_IDLE_LANES: usize = 1024;

/// Client id and node (`None` on a single node, or on a cluster whose slot map fred has not
/// loaded: then the slot routes the `WAIT`).
type LaneKey = (String, Option<Server>, u16);

/// Durability mode of one store: replicas to wait for, the timeout, the lanes.
pub(crate) struct Durable {
    replicas: u32,
    timeout_ms: i64,
    /// The fred timeout of a `WAIT`: its own timeout plus the command timeout.
    call_timeout: Duration,
    lanes: DashMap<LaneKey, Arc<Lane>>,
}

/// The sender slot of a lane: a sender task that ends any other way than by finding the lane
/// empty (a panic, a runtime shutdown) frees the lane on drop, and its waiting callers get an
/// error instead of waiting forever.
struct Sending {
    lane: Arc<Lane>,
    done: bool,
}

impl Drop for Sending {
    fn drop(&mut self) {
        if !self.done {
            let mut st = self.lane.lock();
            st.sending = false;
            st.waiting.clear();
        }
    }
}

impl Durable {
    /// `None` when `replicas` is 0 (mode off). The options are [`check`]ed by the caller.
    pub(crate) fn new(
        replicas: u32,
        timeout: Duration,
        command_timeout: Duration,
    ) -> Option<Arc<Self>> {
        (replicas > 0).then(|| {
            Arc::new(Self {
                replicas,
                timeout_ms: timeout.as_millis() as i64,
                call_timeout: timeout + command_timeout,
                lanes: DashMap::new(),
            })
        })
    }

    /// The replicas each write waits for.
    pub(crate) fn replicas(&self) -> u32 {
        self.replicas
    }

    /// The slot whose node holds `key` (0 when `client` is not clustered).
    pub(crate) fn slot(client: &Client, key: Option<&str>) -> u16 {
        match key {
            Some(k) if client.is_clustered() => crate::cluster::placement::slot_of_key(k),
            _ => 0,
        }
    }

    /// Returns once the configured number of replicas acknowledged every write `client` made
    /// so far on its connection to `slot`'s node.
    ///
    /// # Errors
    /// [`Error::NotDurable`] when fewer acknowledged within the timeout; [`Error::Redis`] when
    /// the `WAIT` itself failed.
    pub(crate) async fn acked(self: &Arc<Self>, client: &Client, slot: u16) -> Result<()> {
        let node = if client.is_clustered() {
            client
                .cached_cluster_state()
                .and_then(|s| s.get_server(slot).cloned())
        } else {
            None
        };
        // The slot only matters when no node is known (then it routes the WAIT).
        let slot = if node.is_some() { 0 } else { slot };
        self.acked_on(client, (client.id().to_owned(), node, slot))
            .await
    }

    /// [`Durable::acked`] on the lane `key`.
    async fn acked_on(self: &Arc<Self>, client: &Client, key: LaneKey) -> Result<()> {
        let lane = self.lanes.entry(key.clone()).or_default().clone();
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut st = lane.lock();
            st.waiting.push(tx);
            !std::mem::replace(&mut st.sending, true)
        };
        if start {
            let sending = Sending { lane, done: false };
            tokio::spawn(self.clone().send_loop(client.clone(), key, sending));
        }
        // A sender that ended without answering (runtime shutting down, a panic): the script
        // ran, its durability is unknown — the retryable answer, like a short WAIT.
        let acked = rx.await.map_err(|_| Error::NotDurable {
            acked: 0,
            wanted: self.replicas,
        })??;
        if acked < i64::from(self.replicas) {
            crate::metrics::wait_shortfall();
            return Err(Error::NotDurable {
                acked: acked.max(0) as u32,
                wanted: self.replicas,
            });
        }
        Ok(())
    }

    /// Sends `WAIT`s for the lane's waiting callers until none is left.
    async fn send_loop(self: Arc<Self>, client: Client, key: LaneKey, mut sending: Sending) {
        let options = Options {
            cluster_node: key.1.clone(),
            cluster_hash: Some(ClusterHash::Custom(key.2)),
            timeout: Some(self.call_timeout),
            max_attempts: Some(1),
            ..Default::default()
        };
        let lane = sending.lane.clone();
        loop {
            let waiting = {
                let mut st = lane.lock();
                if st.waiting.is_empty() {
                    st.sending = false;
                    sending.done = true;
                    break;
                }
                std::mem::take(&mut st.waiting)
            };
            let acks: Acks = client
                .with_options(&options)
                .wait(i64::from(self.replicas), self.timeout_ms)
                .await;
            for tx in waiting {
                let _ = tx.send(acks.clone());
            }
        }
        if self.lanes.len() > MAX_IDLE_LANES {
            // Many lanes (many SKUs, resharding): forget this idle one. A caller that already
            // holds it still works through it (it starts its own sender).
            self.lanes
                .remove_if(&key, |_, l| Arc::ptr_eq(l, &lane) && !l.lock().sending);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_bounded() {
        let ms = Duration::from_millis;
        assert!(check(0, ms(1000)).is_ok());
        assert!(check(MAX_REPLICAS, MAX_TIMEOUT).is_ok());
        assert!(check(1, ms(1)).is_ok());
        for (replicas, timeout, named) in [
            (MAX_REPLICAS + 1, ms(1000), "wait_replicas"),
            (1, Duration::ZERO, "wait_timeout_ms"),
            (1, Duration::from_micros(500), "wait_timeout_ms"),
            (1, MAX_TIMEOUT + ms(1), "wait_timeout_ms"),
        ] {
            match check(replicas, timeout) {
                Err(Error::Config(m)) => assert!(m.contains(named), "{m}"),
                other => panic!("{replicas} {timeout:?}: {other:?}"),
            }
        }
        assert!(
            Durable::new(0, ms(10), ms(10)).is_none(),
            "0 replicas is off"
        );
    }
}
