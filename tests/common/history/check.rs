//! The checks: each promise of issue 11 in its own file, run in order over one indexed history
//! ([`Ctx`]); each broken promise is a [`Violation`] of a check (`C0`..`C6`) and a class.

use super::facts::{Effect, Facts, RidFacts, rid_facts};
use super::record::{Kind, Op, Out};
use holdings::Holdings;
use std::collections::BTreeMap;

mod conservation;
mod end_states;
mod holdings;
mod limit;
mod one_effect;
mod refusals;
mod sold;

/// Slack (µs) when comparing client clocks with the server's `TIME` (same host).
pub const SLACK_US: u64 = 20_000;

/// A broken promise.
#[derive(Debug, Clone)]
pub struct Violation {
    pub check: &'static str,
    /// What kind of failure (violations of one class are shown by example).
    pub class: &'static str,
    pub text: String,
    pub rids: Vec<String>,
    pub users: Vec<String>,
    /// Time window (µs) of interest for the users' operations.
    pub window: Option<(u64, u64)>,
}

fn v(
    check: &'static str,
    class: &'static str,
    text: String,
    rids: &[&str],
    users: &[&str],
) -> Violation {
    Violation {
        check,
        class,
        text,
        rids: rids.iter().map(|s| s.to_string()).collect(),
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
pub const C0: &str = "0 unexpected errors";

/// Options the checks need.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub limit: u64,
    pub loaded: u64,
    /// The engines' user claim TTL (µs): a dropped attempt may keep the user busy that long.
    /// How long after a call with an unknown outcome its user may still be answered UserBusy
    /// (the per-user claim TTL plus the fallback claim lease, with slack).
    pub user_claim_ttl_us: u64,
    /// Engines of the workload; the final purchase may also use a new one (index `engines`).
    pub engines: usize,
}

/// What every check reads: the history and the store's facts, indexed.
struct Ctx<'a> {
    ops: &'a [Op],
    facts: &'a Facts,
    p: Params,
    /// The store's verdict per request id.
    rf: BTreeMap<&'a str, RidFacts>,
    /// Ops by request id (confirm / cancel under their reservation's request id).
    by_rid: BTreeMap<&'a str, Vec<&'a Op>>,
    /// Ops that take units (deduct, final, reserve) by user.
    by_user: BTreeMap<&'a str, Vec<&'a Op>>,
    /// The verdict on a request id without records.
    none: RidFacts,
}

impl<'a> Ctx<'a> {
    fn new(ops: &'a [Op], facts: &'a Facts, p: Params) -> Self {
        let rf: BTreeMap<&str, RidFacts> = facts
            .records
            .iter()
            .map(|(rid, recs)| (rid.as_str(), rid_facts(rid, recs, facts.segments)))
            .collect();
        let none = RidFacts {
            effect: Effect::None,
            sold: 0,
            reserved: 0,
            stranded: 0,
            problems: Vec::new(),
        };
        // Ops by request id (confirm / cancel under their reservation's request id).
        let mut by_rid: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
        for o in ops {
            if o.kind != Kind::Restock {
                by_rid.entry(o.rid.as_str()).or_default().push(o);
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
            by_rid,
            by_user,
            none,
        }
    }

    /// The store's verdict on `rid` (no effect when it left no record).
    fn fact(&self, rid: &str) -> &RidFacts {
        self.rf.get(rid).unwrap_or(&self.none)
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
                &[&o.rid],
                &[],
            ));
        }
    }
}
