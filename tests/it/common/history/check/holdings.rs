//! Who held what when: per user, the units held by each request id as intervals on the client
//! clock — surely (a definite answer and the store's records say so) or possibly (from the
//! first invocation on) — and the units sold at the end. Checks 3 and 6 read them.

use super::*;

/// An interval `(from, to, qty, rid)`: `qty` units held for the user's request `rid` from
/// `from` to `to` (µs).
pub(super) type Held = (u64, u64, u64, String);

pub(super) struct Holdings {
    /// user → intervals surely held.
    pub(super) sure: BTreeMap<String, Vec<Held>>,
    /// user → intervals possibly held.
    pub(super) maybe: BTreeMap<String, Vec<Held>>,
    /// user → units sold at the end and their request ids.
    pub(super) final_units: BTreeMap<String, (u64, Vec<String>)>,
}

impl Holdings {
    pub(super) fn new(cx: &Ctx<'_>) -> Self {
        let mut sure: BTreeMap<String, Vec<(u64, u64, u64, String)>> = BTreeMap::new(); // user → (from, to, qty, rid)
        let mut maybe: BTreeMap<String, Vec<(u64, u64, u64, String)>> = BTreeMap::new();
        let mut final_units: BTreeMap<String, (u64, Vec<String>)> = BTreeMap::new();
        for (&key, os) in &cx.by_key {
            let f = cx.fact(key);
            let rid = key.1;
            let first_inv = os
                .iter()
                .filter(|o| o.kind.takes())
                .map(|o| o.inv)
                .min()
                .unwrap_or(0);
            match &f.effect {
                Effect::Sale { user, qty, .. } => {
                    let e = final_units.entry(user.clone()).or_default();
                    e.0 += qty;
                    e.1.push(rid.to_string());
                    let known = os
                        .iter()
                        .filter(|o| o.kind.sells() && o.holds().is_some() && o.user == *user)
                        .map(|o| o.ret)
                        .min();
                    if let Some(t) = known {
                        sure.entry(user.clone()).or_default().push((
                            t,
                            u64::MAX,
                            *qty,
                            rid.to_string(),
                        ));
                    }
                    maybe.entry(user.clone()).or_default().push((
                        first_inv,
                        u64::MAX,
                        *qty,
                        rid.to_string(),
                    ));
                }
                Effect::Resv {
                    user,
                    qty,
                    state,
                    exp_ms,
                    ..
                } => {
                    let exp = exp_ms * 1000;
                    if *state == 'C' {
                        let e = final_units.entry(user.clone()).or_default();
                        e.0 += qty;
                        e.1.push(rid.to_string());
                    }
                    let held = os
                        .iter()
                        .filter(|o| {
                            o.kind == Kind::Reserve && o.holds().is_some() && o.user == *user
                        })
                        .map(|o| o.ret)
                        .min();
                    let cancels = || os.iter().filter(|o| o.kind == Kind::Cancel);
                    let (sure_to, maybe_to) = match state {
                        'C' | 'R' => (u64::MAX, u64::MAX),
                        'X' => (exp.saturating_sub(SLACK_US), exp + SLACK_US),
                        _ => {
                            let first_cancel = cancels().map(|o| o.inv).min().unwrap_or(exp);
                            let last_cancel = cancels()
                                .map(|o| if o.unknown() { u64::MAX } else { o.ret })
                                .max()
                                .unwrap_or(exp);
                            (
                                first_cancel.min(exp).saturating_sub(SLACK_US),
                                last_cancel.min(exp) + SLACK_US,
                            )
                        }
                    };
                    if let Some(t) = held
                        && t < sure_to
                    {
                        sure.entry(user.clone()).or_default().push((
                            t,
                            sure_to,
                            *qty,
                            rid.to_string(),
                        ));
                    }
                    maybe.entry(user.clone()).or_default().push((
                        first_inv,
                        maybe_to,
                        *qty,
                        rid.to_string(),
                    ));
                }
                Effect::None => {}
            }
        }
        Holdings {
            sure,
            maybe,
            final_units,
        }
    }
}
