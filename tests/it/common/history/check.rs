//! The checks: each promise in its own file, run in order over one indexed history
//! ([`Ctx`]); each broken promise is a [`Violation`] of a check (`C0`..`C7`) and a class.
//!
//! A request is a (user, request id) pair ([`Key`]): request ids are scoped per user, so the
//! same id sent by two users is two requests, each with at most one effect.

use super::facts::{Effect, Facts, ReqFacts, req_facts};
use super::record::{Key, Kind, Op, Out, OwnedKey, key_text};
use holdings::Holdings;
use std::collections::BTreeMap;

mod conservation;
mod end_states;
mod holdings;
mod limit;
mod one_effect;
mod refusals;
mod sold;
mod sold_out;

/// Slack (µs) when comparing client clocks with the server's `TIME` (same host).
pub const SLACK_US: u64 = 20_000;

/// A broken promise.
#[derive(Debug, Clone)]
pub struct Violation {
    pub check: &'static str,
    /// What kind of failure (violations of one class are shown by example).
    pub class: &'static str,
    pub text: String,
    /// The requests involved: (user, request id).
    pub keys: Vec<OwnedKey>,
    pub users: Vec<String>,
    /// Time window (µs) of interest for the users' operations.
    pub window: Option<(u64, u64)>,
}

fn v(
    check: &'static str,
    class: &'static str,
    text: String,
    keys: &[Key<'_>],
    users: &[&str],
) -> Violation {
    Violation {
        check,
        class,
        text,
        keys: keys
            .iter()
            .map(|(u, r)| (u.to_string(), r.to_string()))
            .collect(),
        users: users.iter().map(|s| s.to_string()).collect(),
        window: None,
    }
}

pub const C1: &str = "1 one effect per request id";
pub const C2: &str = "2 ok sales counted once, unknown all-or-nothing";
pub const C3: &str = "3 no user above the limit";
pub const C4: &str = "4 one end state per reservation";
pub const C5: &str = "5 conservation";
pub const C6: &str = "6 no user refused below the limit";
pub const C7: &str = "7 sold out only when nothing is left";
pub const C0: &str = "0 unexpected errors";

/// Options the checks need.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub limit: u64,
    pub loaded: u64,
    /// How long after a call with an unknown outcome its user may still be answered UserBusy
    /// by the same target (µs): an in-process engine forgets a dropped call at once, a `serve`
    /// process runs a call its client gave up on to its end (a fault may hold it that long).
    pub busy_grace_us: u64,
    /// How long a proven sell-out may be answered from memory after units came back (µs): the
    /// engines' sold-out TTL, with slack.
    pub sold_out_grace_us: u64,
    /// Engines of the workload; the final purchase may also use a new one (index `engines`).
    pub engines: usize,
}

/// What every check reads: the history and the store's facts, indexed.
struct Ctx<'a> {
    ops: &'a [Op],
    facts: &'a Facts,
    p: Params,
    /// The store's verdict per request.
    rf: BTreeMap<Key<'a>, ReqFacts>,
    /// Ops by request (confirm / cancel under their reservation's request).
    by_key: BTreeMap<Key<'a>, Vec<&'a Op>>,
    /// Ops that take units (deduct, final, reserve) by user.
    by_user: BTreeMap<&'a str, Vec<&'a Op>>,
    /// The verdict on a request without records.
    none: ReqFacts,
}

impl<'a> Ctx<'a> {
    fn new(ops: &'a [Op], facts: &'a Facts, p: Params) -> Self {
        let rf: BTreeMap<Key<'_>, ReqFacts> = facts
            .records
            .iter()
            .map(|((u, r), recs)| {
                let key = (u.as_str(), r.as_str());
                (key, req_facts(key, recs, facts))
            })
            .collect();
        // Ops by request (confirm / cancel under their reservation's request).
        let mut by_key: BTreeMap<Key<'_>, Vec<&Op>> = BTreeMap::new();
        for o in ops {
            if o.kind != Kind::Restock {
                by_key.entry(o.key()).or_default().push(o);
            }
        }
        let mut by_user: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
        for o in ops.iter().filter(|o| o.kind.takes()) {
            by_user.entry(o.user.as_str()).or_default().push(o);
        }
        Ctx {
            ops,
            facts,
            p,
            rf,
            by_key,
            by_user,
            none: ReqFacts::none(),
        }
    }

    /// The store's verdict on request `key` (no effect when it left no record).
    fn fact<'k>(&'k self, key: Key<'k>) -> &'k ReqFacts {
        self.rf.get(&key).unwrap_or(&self.none)
    }
}

/// Runs every check; `facts` were read after the sweeper ran and everything expired.
pub fn check(ops: &[Op], facts: &Facts, p: Params) -> Vec<Violation> {
    let cx = Ctx::new(ops, facts, p);
    let mut out = Vec::new();
    unexpected_errors(&cx, &mut out);
    one_effect::check(&cx, &mut out);
    sold::check(&cx, &mut out);
    let held = Holdings::new(&cx);
    limit::check(&cx, &held, &mut out);
    end_states::check(&cx, &mut out);
    conservation::check(&cx, &mut out);
    refusals::check(&cx, &held, &mut out);
    sold_out::check(&cx, &mut out);
    out
}

/// Check 0: errors that are neither "nothing happened" nor infrastructure.
fn unexpected_errors(cx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let ops = cx.ops;
    for o in ops {
        if let Out::Unknown(e) = &o.out
            && (e.starts_with("unexpected") || e.contains("store reply"))
        {
            out.push(v(
                C0,
                "unexpected error",
                format!("op #{} answered an unexpected error: {e}", o.seq),
                &[o.key()],
                &[],
            ));
        }
    }
}
