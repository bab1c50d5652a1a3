//! Check 3: no user above the limit — units surely held at once (from definite answers and the
//! store's records), and units sold at the end.

use super::*;

pub(super) fn check(cx: &Ctx<'_>, held: &Holdings, out: &mut Vec<Violation>) {
    let p = cx.p;
    let (sure, final_units) = (&held.sure, &held.final_units);
    for (user, (units, rids)) in final_units {
        if *units > p.limit {
            let r: Vec<&str> = rids.iter().map(String::as_str).collect();
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
            let mut x = v(
                C3,
                "held above the limit at once",
                format!(
                    "{user} held {units} units at once (limit {}): {}",
                    p.limit,
                    rids.join(", ")
                ),
                &rids,
                &[user],
            );
            x.window = Some((t.saturating_sub(2_000_000), t));
            out.push(x);
        }
    }
}
