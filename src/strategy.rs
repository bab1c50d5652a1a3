//! Deduction strategies: the rungs of the ladder common flash-sale write-ups climb, all selectable over
//! the same segments, router, request ids and audit, so they can be compared side by side.
//!
//! | strategy | safe? | how one segment is deducted |
//! |---|---|---|
//! | `lua` (default) | yes | one atomic check-and-decrement script |
//! | `lock` | yes | per-segment lock (SET NX PX, watchdog), read, decide, **fenced** write |
//! | `redlock` | yes* | the same with the lock on a quorum of independent nodes |
//! | `naive` | **no** | GET, decide, SET — oversells under concurrency |
//! | `local-mutex` | **no** | naive inside an in-process mutex — oversells across processes |
//! | `decr-compensate` | **no** | HINCRBY −q, then `sold` (or +q back): no oversell among concurrent buyers of one generation, but **not exactly-once**, and its second command can land in the generation a reload wrote meanwhile — it can oversell across a reload |
//!
//! \* RedLock's safety rests on timing assumptions; the fence token at the stock store is what
//! actually stops a paused holder (see [`crate::store::redis::lock::redlock`]).

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// How a segment's stock is checked and decremented.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Strategy {
    /// Atomic Lua check-and-decrement (default).
    #[default]
    Lua,
    /// Per-segment distributed lock with fenced writes.
    Lock,
    /// RedLock over independent nodes, fenced writes.
    Redlock,
    /// UNSAFE baseline: read, decide, write back, no lock.
    Naive,
    /// UNSAFE baseline: naive inside an in-process mutex.
    LocalMutex,
    /// Baseline: decrement, then add back when it went negative. Concurrent buyers of one
    /// generation never oversell, but the
    /// transient negatives turn buyers away while stock remains, and it is not exactly-once:
    /// its decrement and compensation are separate commands, so a crash between them or a
    /// command re-sent after a lost reply loses units (the audit reports the hole).
    DecrCompensate,
}

impl Strategy {
    /// Every strategy, safest first.
    pub const ALL: [Strategy; 6] = [
        Strategy::Lua,
        Strategy::Lock,
        Strategy::Redlock,
        Strategy::DecrCompensate,
        Strategy::LocalMutex,
        Strategy::Naive,
    ];

    /// The name used in config and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Lua => "lua",
            Strategy::Lock => "lock",
            Strategy::Redlock => "redlock",
            Strategy::Naive => "naive",
            Strategy::LocalMutex => "local-mutex",
            Strategy::DecrCompensate => "decr-compensate",
        }
    }

    /// False for the baselines that can oversell (kept to demonstrate the failure):
    /// `naive` and `local-mutex` under concurrency, `decr-compensate` across a reload (its
    /// give-back or its `sold` can land in the generation a reload wrote meanwhile).
    pub fn never_oversells(self) -> bool {
        matches!(self, Strategy::Lua | Strategy::Lock | Strategy::Redlock)
    }

    /// True for the strategies whose every step on the stock is one atomic, request-id-keyed
    /// script: a retry, a re-sent command or a crash between steps never changes the stock
    /// twice or loses a unit. The baselines are not. This is what `strategy_safe` reports.
    pub fn exactly_once(self) -> bool {
        matches!(self, Strategy::Lua | Strategy::Lock | Strategy::Redlock)
    }

    /// True for the strategies that take a distributed lock per segment.
    pub fn uses_locks(self) -> bool {
        matches!(self, Strategy::Lock | Strategy::Redlock)
    }

    /// One line on what it guarantees.
    pub fn summary(self) -> &'static str {
        match self {
            Strategy::Lua => "safe: one atomic check-and-decrement script per segment",
            Strategy::Lock => {
                "safe: per-segment lock + watchdog, writes fenced against stale holders"
            }
            Strategy::Redlock => {
                "safe while fenced: lock on a node quorum (timing assumptions), writes fenced"
            }
            Strategy::Naive => {
                "UNSAFE: read-decide-write without a lock oversells under concurrency"
            }
            Strategy::LocalMutex => {
                "UNSAFE: an in-process mutex protects one process only; several oversell"
            }
            Strategy::DecrCompensate => {
                "UNSAFE: no oversell among concurrent buyers of one generation, but NOT exactly-once (a crash or a re-sent command between its two commands loses units) and it can oversell across a reload; transient negatives turn buyers away while stock remains"
            }
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Strategy::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Strategy::ALL.iter().map(|x| x.name()).collect();
                Error::invalid(
                    "strategy",
                    format!("{s:?} is not one of {}", names.join(", ")),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_named() {
        for s in Strategy::ALL {
            assert_eq!(s.name().parse::<Strategy>().unwrap(), s);
        }
        // The metrics' `strategy` label values, in this order.
        assert_eq!(
            Strategy::ALL.map(Strategy::name),
            crate::metrics::STRATEGIES
        );
        let e = "redlok".parse::<Strategy>().unwrap_err();
        assert!(e.to_string().contains("redlok") && e.to_string().contains("redlock"));
        assert!(!Strategy::Naive.never_oversells());
        assert!(!Strategy::DecrCompensate.never_oversells());
        assert!(Strategy::Lock.never_oversells());
        assert!(!Strategy::DecrCompensate.exactly_once() && Strategy::Lua.exactly_once());
        assert!(Strategy::Lock.uses_locks() && !Strategy::Lua.uses_locks());
    }
}
