//! Check 1: one effect per request (never applied twice, replays match the store's record —
//! the request's units, at its home —, no spurious conflict).

use super::*;
use std::collections::BTreeSet;

pub(super) fn check(cx: &Ctx<'_>, out: &mut Vec<Violation>) {
    for (&key, os) in &cx.by_key {
        let f = cx.fact(key);
        let k = key_text(key);
        let home = cx.facts.home(key);
        let takers: Vec<&&Op> = os.iter().filter(|o| o.kind.takes()).collect();
        let applied: Vec<&&&Op> = takers.iter().filter(|o| o.applied().is_some()).collect();
        if applied.len() > 1 {
            out.push(v(
                C1,
                "applied more than once",
                format!(
                    "{k}: applied {} times: {}",
                    applied.len(),
                    applied
                        .iter()
                        .map(|o| format!("#{} {} qty {}", o.seq, o.kind.name(), o.qty))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                &[key],
                &[],
            ));
        }
        let first_part = applied.first().and_then(|o| o.applied());
        for o in &takers {
            let Some(part) = o.holds() else { continue };
            let how = if o.applied().is_some() {
                "applied"
            } else {
                "replayed"
            };
            let kind = if o.kind.sells() {
                Kind::Deduct
            } else {
                Kind::Reserve
            };
            // Every unit of an applied request is at its home.
            let at_home = shardstock::Part {
                segment: home,
                units: o.qty,
            };
            if part != at_home {
                out.push(v(
                    C1,
                    "units are not the request's at home",
                    format!(
                        "{k}: op #{} answered {how} with {part:?}; the request's home is segment {home}",
                        o.seq
                    ),
                    &[key],
                    &[],
                ));
            }
            match f.effect.owner() {
                Some((u, q, kd)) if (u, q, kd) == (o.user.as_str(), o.qty, kind) => {}
                Some((_, q, kd)) => out.push(v(
                    C1,
                    if q == o.qty {
                        "replayed across kinds (sale vs reservation)"
                    } else {
                        "answer disagrees with the store's record"
                    },
                    format!(
                        "{k}: op #{} ({} qty {}) answered {how}, but the request's effect in the store is a {} qty {q}{}",
                        o.seq,
                        o.kind.name(),
                        o.qty,
                        kd.name(),
                        match &f.effect {
                            Effect::Resv { state, .. } => format!(" (reservation state {state})"),
                            _ => String::new(),
                        }
                    ),
                    &[key],
                    &[&o.user],
                )),
                None => out.push(v(
                    C1,
                    "holds per the answer, no record in the store",
                    format!(
                        "{k}: op #{} ({} qty {}) answered {how}, but the store has no record of it: {:?}",
                        o.seq,
                        o.kind.name(),
                        o.qty,
                        f.effect
                    ),
                    &[key],
                    &[&o.user],
                )),
            }
            if let Some(fp) = first_part
                && fp != part
            {
                out.push(v(
                    C1,
                    "replay units differ from the applying op",
                    format!(
                        "{k}: op #{} answered {how} with {part:?}, the applying op with {fp:?}",
                        o.seq
                    ),
                    &[key],
                    &[],
                ));
            }
            if let Effect::Sale { part: sp, .. } = &f.effect
                && *sp != part
            {
                out.push(v(
                    C1,
                    "units differ from the store's record",
                    format!(
                        "{k}: op #{} answered {how} with {part:?}, the store's record says {sp:?}",
                        o.seq
                    ),
                    &[key],
                    &[],
                ));
            }
        }
        // A conflict when every sender used the very same parameters is spurious.
        let shapes: BTreeSet<(u64, bool)> =
            takers.iter().map(|o| (o.qty, o.kind.sells())).collect();
        if shapes.len() == 1
            && let Some(o) = takers
                .iter()
                .find(|o| matches!(&o.out, Out::Fail(e) if e.starts_with("RequestIdConflict") || e.starts_with("409")))
        {
            out.push(v(
                C1,
                "spurious conflict",
                format!(
                    "{k}: op #{} answered a conflict, but every use of the request had the same qty and kind",
                    o.seq
                ),
                &[key],
                &[],
            ));
        }
    }
}
