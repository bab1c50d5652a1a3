//! Check 2: every ok sale and confirmed reservation counted in `sold` once; unknown ones all or
//! nothing.

use super::*;

pub(super) fn check(cx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let facts = cx.facts;
    let mut hist_sold = 0u64;
    let mut unknown_max = 0u64;
    for (&key, os) in &cx.by_key {
        let f = cx.fact(key);
        let rid = key_text(key);
        for (pc, p) in &f.problems {
            out.push(v(C2, pc, format!("{rid}: {p}"), &[key], &[]));
        }
        let ok_sale = os.iter().find(|o| o.kind.sells() && o.holds().is_some());
        let confirmed = os.iter().find(|o| o.kind == Kind::Confirm && o.end_done());
        if let Some(o) = ok_sale {
            hist_sold += o.qty;
            if !matches!(&f.effect, Effect::Sale { user, qty, .. } if *user == o.user && *qty == o.qty)
            {
                out.push(v(
                    C2, "ok sale not in sold as a sale",
                    format!(
                        "{rid}: ok sale (op #{}, {} qty {}) is not in `sold` as a sale; the store says {:?}",
                        o.seq, o.user, o.qty, f.effect
                    ),
                    &[key],
                    &[&o.user],
                ));
            }
        }
        if let Some(c) = confirmed {
            let q = match &f.effect {
                Effect::Resv { qty, .. } => *qty,
                _ => os
                    .iter()
                    .find(|o| o.kind == Kind::Reserve)
                    .map_or(0, |o| o.qty),
            };
            if ok_sale.is_none() {
                hist_sold += q;
            }
            if !matches!(&f.effect, Effect::Resv { state: 'C', .. }) {
                out.push(v(
                    C2,
                    "confirmed, but not confirmed in the store",
                    format!(
                        "{rid}: confirmed (op #{} done) but the store says {:?}",
                        c.seq, f.effect
                    ),
                    &[key],
                    &[],
                ));
            }
        }
        if ok_sale.is_none() && confirmed.is_none() {
            // Whatever may have sold without a definite answer.
            let sale_unknown = os
                .iter()
                .filter(|o| o.kind.sells() && o.unknown())
                .map(|o| o.qty)
                .max()
                .unwrap_or(0);
            let confirm_unknown = if os.iter().any(|o| o.kind == Kind::Confirm && o.unknown()) {
                os.iter()
                    .filter(|o| o.kind == Kind::Reserve)
                    .map(|o| o.qty)
                    .max()
                    .unwrap_or(0)
            } else {
                0
            };
            unknown_max += sale_unknown.max(confirm_unknown);
        }
    }
    let a = &facts.audit;
    if a.sold < hist_sold || a.sold > hist_sold + unknown_max {
        out.push(v(
            C2,
            "sold outside the history's bounds",
            format!(
                "sold {} is outside [ok sales + ok confirms {hist_sold}, + unknown ones {}]",
                a.sold,
                hist_sold + unknown_max
            ),
            &[],
            &[],
        ));
    }
}
