//! What a failed run prints: the violations grouped by check and class, each with the operations
//! and store records involved ([`report`]), a one-line-per-class table, and outcome counts.

use super::check::{C3, Violation};
use super::facts::Facts;
use super::record::{Op, Out, Val};
use shardstock::Reserved;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// The violations, grouped by check, each with the operations of its request ids and users
/// (at most `per_check` examples per check).
pub fn report(ops: &[Op], facts: &Facts, vs: &[Violation], per_check: usize) -> String {
    let t0 = ops.iter().map(|o| o.inv).min().unwrap_or(0);
    let mut by: BTreeMap<&str, BTreeMap<&str, Vec<&Violation>>> = BTreeMap::new();
    for x in vs {
        by.entry(x.check)
            .or_default()
            .entry(x.class)
            .or_default()
            .push(x);
    }
    let mut s = String::new();
    for (check, classes) in &by {
        let n: usize = classes.values().map(Vec::len).sum();
        let _ = writeln!(s, "\n=== check {check}: {n} violation(s)");
        for (class, xs) in classes {
            let _ = writeln!(s, "\n  ## {class}: {} violation(s)", xs.len());
            for x in xs.iter().take(per_check) {
                let _ = writeln!(s, "--- {}", x.text);
                let mut shown = BTreeSet::new();
                let mut lines = Vec::new();
                for o in ops {
                    let by_rid = x.keys.iter().any(|(u, r)| *u == o.user && *r == o.rid);
                    // The user's other operations only where the user's holdings matter.
                    let by_user = x.users.contains(&o.user)
                        && (x.window.is_some() || x.check == C3)
                        && o.kind.takes()
                        && x.window.is_none_or(|(a, b)| o.ret >= a && o.inv <= b);
                    if (by_rid || by_user) && shown.insert(o.seq) {
                        lines.push(o);
                    }
                }
                let n = lines.len();
                for o in lines.iter().take(40) {
                    let _ = writeln!(s, "    {}", o.line(t0));
                }
                if n > 40 {
                    let _ = writeln!(s, "    ... {} more", n - 40);
                }
                for k in x.keys.iter().take(6) {
                    for r in facts.records.get(k).map(Vec::as_slice).unwrap_or(&[]) {
                        let _ = writeln!(
                            s,
                            "    store {}/{} @ segment {}: {}",
                            k.0, k.1, r.seg, r.raw
                        );
                    }
                }
                for u in &x.users {
                    for ((seg, lu), l) in &facts.ledgers {
                        if lu == u {
                            let _ = writeln!(
                                s,
                                "    store ledger of {u} @ segment {seg}: {:?}",
                                l.fields
                            );
                        }
                    }
                }
            }
            if xs.len() > per_check {
                let _ = writeln!(s, "    ({} more of this class)", xs.len() - per_check);
                for x in xs.iter().skip(per_check).take(6) {
                    let _ = writeln!(s, "    - {}", x.text);
                }
            }
        }
    }
    s
}

/// One line per check and class: `check | class | count | first example`.
pub fn table(vs: &[Violation]) -> String {
    let mut by: BTreeMap<(&str, &str), Vec<&Violation>> = BTreeMap::new();
    for x in vs {
        by.entry((x.check, x.class)).or_default().push(x);
    }
    let mut s = String::new();
    for ((check, class), xs) in by {
        let _ = writeln!(s, "  [{check}] {class}: {} (e.g. {})", xs.len(), xs[0].text);
    }
    s
}

/// Counts per outcome, for the run summary.
pub fn summary(ops: &[Op]) -> String {
    let mut c: BTreeMap<String, usize> = BTreeMap::new();
    for o in ops {
        let k = match &o.out {
            Out::Ok(Val::Ded(d)) => format!("{} {}", o.kind.name(), d.kind()),
            Out::Ok(Val::Res(Reserved::Held { .. })) => "reserve held".into(),
            Out::Ok(Val::Res(Reserved::Replayed { .. })) => "reserve replayed".into(),
            Out::Ok(Val::Res(Reserved::NotHeld(d))) => format!("reserve {}", d.kind()),
            Out::Ok(Val::Res(other)) => format!("reserve {other:?}"),
            Out::Ok(Val::End(e)) => format!("{} {:?} done={}", o.kind.name(), e.state, e.done),
            Out::Ok(Val::Stock(_)) => "restock ok".into(),
            Out::Fail(e) => format!(
                "{} fail {}",
                o.kind.name(),
                e.split(['(', ' ', '{']).next().unwrap_or("")
            ),
            Out::Unknown(e) => format!(
                "{} unknown {}",
                o.kind.name(),
                e.split([':', '(', ' ']).next().unwrap_or("")
            ),
        };
        *c.entry(k).or_default() += 1;
    }
    c.iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
