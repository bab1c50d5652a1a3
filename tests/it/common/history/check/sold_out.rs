//! Check 7: `SoldOut` only when nothing is left — at some moment of the call, no unit in any
//! segment and none in transit.
//!
//! Judged from a sure lower bound of the units in the SKU (remaining + in transit) during the
//! call: units loaded, plus restocks surely applied before it, minus every unit any request
//! that may have run by its end could keep (a sale, a confirmed or a live reservation; the
//! store's records say which requests took units, and none is ever forgotten within a
//! generation under a per-user limit), plus the units of reservations surely ended before it.
//! A proven sell-out may be answered from memory a little after units came back (the
//! sold-out TTL): restocks and ended reservations count only from `sold_out_grace_us` after
//! they surely happened. A bound above zero: the answer was wrong.

use super::super::record::Val;
use super::*;
use shardstock::{Deduction, Reserved};
use std::collections::BTreeMap;

pub(super) fn check(cx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let (ops, p) = (cx.ops, cx.p);
    // Restock request id → when it surely had applied (its first ok answer).
    let mut restocked: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for o in ops.iter().filter(|o| o.kind == Kind::Restock) {
        if let Out::Ok(Val::Stock(_)) = &o.out {
            let e = restocked.entry(o.rid.as_str()).or_insert((o.ret, o.qty));
            e.0 = e.0.min(o.ret);
        }
    }
    // Requests whose records took units: (first invocation, units kept at the end, ended at).
    let mut takers: Vec<(u64, u64, Option<u64>, Key<'_>)> = Vec::new();
    for (&key, f) in &cx.rf {
        let qty = match &f.effect {
            Effect::Sale { qty, .. } | Effect::Resv { qty, .. } => *qty,
            Effect::None => continue,
        };
        let os = cx.by_key.get(&key).map(Vec::as_slice).unwrap_or(&[]);
        let first = os
            .iter()
            .filter(|o| o.kind.takes())
            .map(|o| o.inv)
            .min()
            .unwrap_or(0);
        // When a reservation surely gave its units back (client clock, µs).
        let ended = match &f.effect {
            Effect::Resv {
                state: 'X', exp_ms, ..
            } => Some(exp_ms * 1000 + SLACK_US),
            Effect::Resv { state: 'K', .. } => os
                .iter()
                .filter(|o| o.kind == Kind::Cancel && o.end_done())
                .map(|o| o.ret)
                .min(),
            _ => None,
        };
        takers.push((first, qty, ended, key));
    }
    for o in ops {
        let sold_out = matches!(
            &o.out,
            Out::Ok(Val::Ded(Deduction::SoldOut))
                | Out::Ok(Val::Res(Reserved::NotHeld(Deduction::SoldOut)))
        );
        if !sold_out {
            continue;
        }
        let since = o.inv.saturating_sub(p.sold_out_grace_us);
        let added: u64 = restocked
            .values()
            .filter(|(t, _)| *t < since)
            .map(|(_, q)| q)
            .sum();
        let (mut taken, mut back) = (0u64, 0u64);
        for (first, qty, ended, key) in &takers {
            if *key == o.key() || *first > o.ret {
                continue; // not yet sent when the answer came (or this very request)
            }
            taken += qty;
            if ended.is_some_and(|t| t < since) {
                back += qty;
            }
        }
        let left = (p.loaded + added + back).saturating_sub(taken);
        if left > 0 {
            let mut x = v(
                C7,
                "sold out while units surely remained",
                format!(
                    "{} (op #{} {} {} qty {}, engine {}) answered SoldOut, yet at least {left} unit(s) were in the SKU throughout: loaded {} + restocked {added} (surely, {} ms before) + given back {back} by ended reservations - {taken} taken by every request that may have run",
                    o.user,
                    o.seq,
                    o.kind.name(),
                    o.rid,
                    o.qty,
                    o.engine,
                    p.loaded,
                    p.sold_out_grace_us / 1000
                ),
                &[o.key()],
                &[&o.user],
            );
            x.window = Some((o.inv.saturating_sub(1_000_000), o.ret));
            out.push(x);
        }
    }
}
