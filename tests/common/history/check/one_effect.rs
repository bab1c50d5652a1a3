//! Check 1: one effect per request id (never applied twice, replays match the store's record,
//! sealed never applies, no spurious conflict).

use super::*;
use std::collections::BTreeSet;

pub(super) fn check(cx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let by_rid = &cx.by_rid;
    for (rid, os) in by_rid {
        let f = cx.fact(rid);
        let takers: Vec<&&Op> = os.iter().filter(|o| o.kind.takes()).collect();
        let applied: Vec<&&&Op> = takers.iter().filter(|o| o.applied().is_some()).collect();
        if applied.len() > 1 {
            out.push(v(
                C1,
                "applied more than once",
                format!(
                    "{rid}: applied {} times: {}",
                    applied.len(),
                    applied
                        .iter()
                        .map(|o| format!("#{} {} {} qty {}", o.seq, o.kind.name(), o.user, o.qty))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                &[rid],
                &[],
            ));
        }
        let first_parts = applied.first().and_then(|o| o.applied());
        for o in &takers {
            let Some(parts) = o.holds() else { continue };
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
            match f.effect.owner() {
                Some((u, q, k)) if (u, q, k) == (o.user.as_str(), o.qty, kind) => {}
                Some((u, q, k)) => out.push(v(
                    C1,
                    if u != o.user {
                        "replayed to another user"
                    } else if q == o.qty {
                        "replayed across kinds (sale vs reservation)"
                    } else {
                        "answer disagrees with the store's record"
                    },
                    format!(
                        "{rid}: op #{} ({} by {} qty {}) answered {how}, but the request id's effect in the store is a {} by {u} qty {q}{}",
                        o.seq,
                        o.kind.name(),
                        o.user,
                        o.qty,
                        k.name(),
                        match &f.effect {
                            Effect::Resv { state, .. } => format!(" (reservation state {state})"),
                            _ => String::new(),
                        }
                    ),
                    &[rid],
                    &[&o.user],
                )),
                None => out.push(v(
                    C1, "holds per the answer, no applied record in the store",
                    format!(
                        "{rid}: op #{} ({} by {} qty {}) answered {how}, but the store has no applied record: {:?}",
                        o.seq,
                        o.kind.name(),
                        o.user,
                        o.qty,
                        f.effect
                    ),
                    &[rid],
                    &[&o.user],
                )),
            }
            if let Some(fp) = first_parts
                && fp != parts
            {
                out.push(v(
                    C1, "replay parts differ from the applying op",
                    format!(
                        "{rid}: op #{} answered {how} with parts {parts:?}, the applying op with {fp:?}",
                        o.seq
                    ),
                    &[rid],
                    &[],
                ));
            }
            if let Effect::Sale { parts: sp, .. } = &f.effect
                && sp != parts
            {
                out.push(v(
                    C1, "parts differ from the store's record",
                    format!(
                        "{rid}: op #{} answered {how} with parts {parts:?}, the store's record says {sp:?}",
                        o.seq
                    ),
                    &[rid],
                    &[],
                ));
            }
        }
        // Sealed means it can never apply.
        if let Some(o) = takers
            .iter()
            .find(|o| matches!(&o.out, Out::Fail(e) if e.starts_with("Sealed")))
            && f.effect.owner().is_some()
        {
            out.push(v(
                C1,
                "sealed, yet applied",
                format!(
                    "{rid}: op #{} answered Sealed, yet the request id applied: {:?}",
                    o.seq, f.effect
                ),
                &[rid],
                &[],
            ));
        }
        // A conflict when every sender used the very same parameters is spurious.
        let keys: BTreeSet<(&str, u64, bool)> = takers
            .iter()
            .map(|o| (o.user.as_str(), o.qty, o.kind.sells()))
            .collect();
        if keys.len() == 1
            && let Some(o) = takers
                .iter()
                .find(|o| matches!(&o.out, Out::Fail(e) if e.starts_with("RequestIdConflict")))
        {
            out.push(v(
                C1, "spurious conflict",
                format!(
                    "{rid}: op #{} answered a conflict, but every use of the id had the same user, qty and kind",
                    o.seq
                ),
                &[rid],
                &[],
            ));
        }
    }
}
