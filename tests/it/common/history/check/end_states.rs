//! Check 4: every reservation in exactly one end state, at the place its id names.

use super::super::record::{Val, resv_key, resv_place};
use super::*;
use shardstock::Reserved;

pub(super) fn check(cx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let facts = cx.facts;
    for (&key, os) in &cx.by_key {
        let f = cx.fact(key);
        let rid = key_text(key);
        let confirms: Vec<&&Op> = os
            .iter()
            .filter(|o| o.kind == Kind::Confirm && o.end_done())
            .collect();
        let cancels: Vec<&&Op> = os
            .iter()
            .filter(|o| o.kind == Kind::Cancel && o.end_done())
            .collect();
        if let (Some(c), Some(k)) = (confirms.first(), cancels.first()) {
            out.push(v(
                C4,
                "both confirmed and cancelled",
                format!(
                    "{rid}: both confirmed (op #{}) and cancelled (op #{})",
                    c.seq, k.seq
                ),
                &[key],
                &[],
            ));
        }
        if let Effect::Resv { state, exp_ms, .. } = &f.effect {
            if let Some(k) = cancels.first()
                && *state != 'K'
            {
                out.push(v(
                    C4,
                    "cancelled, but not cancelled in the store",
                    format!(
                        "{rid}: cancelled (op #{} done) but the store's state is {state}",
                        k.seq
                    ),
                    &[key],
                    &[],
                ));
            }
            if *state == 'R' {
                out.push(v(
                    C4,
                    "still held after expiry and sweep",
                    format!("{rid}: still held after its expiry and the sweeper"),
                    &[key],
                    &[],
                ));
            }
            let all_confirms: Vec<&&Op> = os.iter().filter(|o| o.kind == Kind::Confirm).collect();
            if *state == 'C'
                && !all_confirms.is_empty()
                && all_confirms
                    .iter()
                    .all(|o| o.inv > exp_ms * 1000 + SLACK_US)
            {
                out.push(v(
                    C4,
                    "confirmed after expiry",
                    format!(
                        "{rid}: confirmed although every confirm came after its expiry ({} ms)",
                        exp_ms
                    ),
                    &[key],
                    &[],
                ));
            }
        }
        for o in os.iter().filter(|o| o.kind == Kind::Reserve) {
            let id = match &o.out {
                Out::Ok(Val::Res(Reserved::Held { id, .. } | Reserved::Replayed { id, .. })) => id,
                _ => continue,
            };
            let here = resv_place(&id.to_string());
            let want = match &f.effect {
                Effect::Resv { seg, .. } => Some((facts.audit.generation, *seg)),
                _ => None,
            };
            if resv_key(&id.to_string()) != Some(key) {
                out.push(v(
                    C4,
                    "reservation id names another request",
                    format!("{rid}: op #{} returned reservation id {id}", o.seq),
                    &[key],
                    &[],
                ));
            }
            if want.is_some() && here != want {
                out.push(v(
                    C4, "reservation id names the wrong place",
                    format!(
                        "{rid}: op #{} returned reservation id {id}, but the units are held at (generation, segment) {want:?}",
                        o.seq
                    ),
                    &[key],
                    &[],
                ));
            }
        }
    }
}
