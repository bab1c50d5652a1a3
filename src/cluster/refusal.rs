//! Masters that refuse writes. A master with fewer replicas in sync than its
//! `min-replicas-to-write` (say, after its replica was promoted) answers every write
//! `NOREPLICAS`: the stock and the buyers homed on it freeze until its slots move
//! ([`super::evacuate`]). Here: whether a master refuses, or could take slots, read from
//! `INFO replication` and `CONFIG GET` ([`Health`], [`setting`]); and which masters have refused
//! since when ([`RefusalWatch`]), so that each refusal is evacuated once.
//!
//! No I/O: [`super::node`] asks the nodes and the replies come in as values. Touches std only.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// A master as `INFO replication` and `CONFIG GET min-replicas-to-write` describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Health {
    /// It is a master.
    pub(crate) master: bool,
    /// Replicas in sync (online, lag ≤ 2 s; `min_slaves_good_slaves` when Redis counts them).
    pub(crate) good: u32,
    /// Its `min-replicas-to-write` (0: off).
    pub(crate) required: u32,
}

impl Health {
    /// It refuses every write now (`NOREPLICAS`).
    pub(crate) fn refusing(&self) -> bool {
        self.master && self.good < self.required
    }

    /// It may take slots from an evacuation waiting for `replicas`.
    pub(crate) fn can_take(&self, replicas: u32) -> bool {
        self.master && !self.refusing() && self.good >= replicas
    }

    /// Parses `INFO replication` and the `min-replicas-to-write` setting.
    pub(crate) fn parse(info: &str, required: u32) -> Self {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
        };
        let master = field("role") == Some("master");
        let good = match field("min_slaves_good_slaves").and_then(|v| v.parse().ok()) {
            Some(g) => g,
            // Without min-replicas-to-write Redis does not count them: online replicas whose
            // last acknowledgement is at most 2 s old.
            None => info
                .lines()
                .filter(|l| {
                    let l = l.trim();
                    l.starts_with("slave")
                        && l.contains("state=online")
                        && l.split(',')
                            .find_map(|kv| kv.strip_prefix("lag="))
                            .and_then(|v| v.parse::<u64>().ok())
                            .is_some_and(|lag| lag <= 2)
                })
                .count() as u32,
        };
        Self {
            master,
            good,
            required,
        }
    }
}

/// The numeric value of `key` in a `CONFIG GET` reply (name, value, name, value, …).
pub(crate) fn setting(pairs: &[String], key: &str) -> Option<u64> {
    pairs
        .chunks(2)
        .find(|p| p[0] == key)
        .and_then(|p| p.get(1)?.parse().ok())
}

/// Evacuates masters that keep refusing writes
/// ([`RedisStore::evacuate_refusing`](crate::RedisStore::evacuate_refusing)): remembers since
/// when each master has refused, and which were evacuated during their refusal (nothing of the
/// store can come back to a master that refuses writes, so one evacuation per refusal is
/// enough).
#[derive(Debug, Default)]
pub struct RefusalWatch {
    since: HashMap<String, Instant>,
    evacuated: HashSet<String>,
}

impl RefusalWatch {
    /// A watch that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records what `health` says of each master (absent: not reachable, forgotten) and
    /// answers the ones refusing for at least `grace` and not yet evacuated.
    pub(crate) fn due(
        &mut self,
        health: &BTreeMap<String, Health>,
        grace: Duration,
    ) -> Vec<String> {
        let now = Instant::now();
        let refusing = |m: &String| health.get(m).is_some_and(Health::refusing);
        self.since.retain(|m, _| refusing(m));
        self.evacuated.retain(|m| refusing(m));
        let mut due = Vec::new();
        for (m, h) in health {
            if h.refusing() {
                let t = *self.since.entry(m.clone()).or_insert(now);
                if now.duration_since(t) >= grace && !self.evacuated.contains(m) {
                    due.push(m.clone());
                }
            }
        }
        due
    }

    /// Records that `master` was evacuated: not again until it has written in between.
    pub(crate) fn evacuated(&mut self, master: &str) {
        self.evacuated.insert(master.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO_REFUSING: &str = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\
        min_slaves_good_slaves:0\r\nmaster_failover_state:no-failover\r\n";
    const INFO_HEALTHY: &str = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n\
        slave0:ip=127.0.0.1,port=7104,state=online,offset=1190,lag=0\r\n";

    #[test]
    fn a_master_below_its_setting_refuses() {
        let h = Health::parse(INFO_REFUSING, 1);
        assert_eq!(
            h,
            Health {
                master: true,
                good: 0,
                required: 1
            }
        );
        assert!(h.refusing());
        assert!(!h.can_take(1));
        assert!(
            !Health::parse(INFO_REFUSING, 0).refusing(),
            "no setting, no refusal"
        );
    }

    #[test]
    fn online_replicas_count_without_the_setting() {
        let h = Health::parse(INFO_HEALTHY, 0);
        assert_eq!(h.good, 1);
        assert!(h.can_take(1));
        assert!(!h.can_take(2));
        let lagging = INFO_HEALTHY.replace("lag=0", "lag=7");
        assert_eq!(
            Health::parse(&lagging, 0).good,
            0,
            "a replica 7 s behind is not in sync"
        );
        let replica = "role:slave\r\nmaster_host:127.0.0.1\r\n";
        assert!(
            !Health::parse(replica, 1).refusing(),
            "a replica is no master"
        );
        assert!(!Health::parse(replica, 0).can_take(0));
    }

    #[test]
    fn a_master_is_due_after_refusing_for_the_grace_once_per_refusal() {
        let mut w = RefusalWatch::new();
        let refusing = Health::parse(INFO_REFUSING, 1);
        let healthy = Health::parse(INFO_HEALTHY, 1);
        let mut h = BTreeMap::from([("a:1".to_string(), refusing), ("b:2".to_string(), healthy)]);
        assert!(w.due(&h, Duration::from_secs(60)).is_empty(), "not yet");
        assert_eq!(w.due(&h, Duration::ZERO), vec!["a:1".to_string()]);
        w.evacuated("a:1");
        assert!(
            w.due(&h, Duration::ZERO).is_empty(),
            "evacuated during this refusal"
        );
        // Writable again: the clock starts over, and a new refusal is due again.
        h.insert("a:1".to_string(), healthy);
        assert!(w.due(&h, Duration::ZERO).is_empty());
        assert!(w.since.is_empty() && w.evacuated.is_empty());
        h.insert("a:1".to_string(), refusing);
        assert_eq!(w.due(&h, Duration::ZERO).len(), 1);
        // Unreachable: forgotten.
        h.remove("a:1");
        assert!(w.due(&h, Duration::ZERO).is_empty());
        assert!(w.since.is_empty());
    }
}
