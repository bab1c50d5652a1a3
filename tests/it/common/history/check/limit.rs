//! Check 3: no user above the limit — units surely held at once (from definite answers and the
//! store's records), units sold at the end, and each user's ledger (the units it counts
//! against the limit must be what its records hold).

use super::*;

pub(super) fn check(cx: &Ctx<'_>, held: &Holdings, out: &mut Vec<Violation>) {
    let p = cx.p;
    let (sure, final_units) = (&held.sure, &held.final_units);
    for (user, (units, rids)) in final_units {
        if *units > p.limit {
            let r: Vec<Key<'_>> = rids.iter().map(|r| (user.as_str(), r.as_str())).collect();
            out.push(v(
                C3,
                "sold above the limit at the end",
                format!(
                    "{user} ends with {units} units sold (limit {}): {}",
                    p.limit,
                    rids.join(", ")
                ),
                &r,
                &[user],
            ));
        }
    }
    for (user, iv) in sure {
        let mut worst: Option<(u64, u64, Vec<&str>)> = None;
        for (t, ..) in iv {
            let at: Vec<&(u64, u64, u64, String)> =
                iv.iter().filter(|(a, b, ..)| a <= t && *t < *b).collect();
            let units: u64 = at.iter().map(|x| x.2).sum();
            if units > p.limit && worst.as_ref().is_none_or(|w| units > w.1) {
                worst = Some((*t, units, at.iter().map(|x| x.3.as_str()).collect()));
            }
        }
        if let Some((t, units, rids)) = worst {
            let keys: Vec<Key<'_>> = rids.iter().map(|r| (user.as_str(), *r)).collect();
            let mut x = v(
                C3,
                "held above the limit at once",
                format!(
                    "{user} held {units} units at once (limit {}): {}",
                    p.limit,
                    rids.join(", ")
                ),
                &keys,
                &[user],
            );
            x.window = Some((t.saturating_sub(2_000_000), t));
            out.push(x);
        }
    }
    ledgers(cx, out);
}

/// With a per-user limit, each ledger's `h` (units held: sold, confirmed, reserved and live)
/// and `f` (held for good) are exactly what its records hold, and `h` is within the limit;
/// without one a ledger has neither.
fn ledgers(cx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let facts = cx.facts;
    for (seg, user, field, value) in &facts.malformed {
        out.push(v(
            C3,
            "malformed ledger field",
            format!("ledger of {user} at segment {seg}: {field}={value:?}"),
            &[],
            &[user],
        ));
    }
    for ((seg, user), l) in &facts.ledgers {
        let recs = facts
            .records
            .iter()
            .filter(|((u, _), _)| u == user)
            .flat_map(|(_, rs)| rs.iter().filter(|r| r.seg == *seg));
        let (mut held, mut good) = (0u64, 0u64);
        for r in recs {
            if matches!(r.state, 'A' | 'C' | 'R') {
                held += r.qty;
            }
            if matches!(r.state, 'A' | 'C') {
                good += r.qty;
            }
        }
        let shown = || format!("{:?}", l.fields);
        if facts.limit == 0 {
            if l.h.is_some() || l.f.is_some() {
                out.push(v(
                    C3,
                    "ledger counts units without a limit",
                    format!("ledger of {user} at segment {seg}: {}", shown()),
                    &[],
                    &[user],
                ));
            }
            continue;
        }
        let (h, f) = (l.h.unwrap_or(0), l.f.unwrap_or(0));
        if (h, f) != (held, good) {
            out.push(v(
                C3,
                "ledger disagrees with its records",
                format!(
                    "ledger of {user} at segment {seg} counts held {h}, for good {f}; its records hold {held}, for good {good}: {}",
                    shown()
                ),
                &[],
                &[user],
            ));
        }
        if h > facts.limit {
            out.push(v(
                C3,
                "ledger above the limit",
                format!(
                    "ledger of {user} at segment {seg} holds {h} (limit {}): {}",
                    facts.limit,
                    shown()
                ),
                &[],
                &[user],
            ));
        }
    }
}
