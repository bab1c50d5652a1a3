//! Check 6: no user refused with LimitReached who held less; UserBusy only while another
//! attempt of the user runs; the end-of-run purchase of every user below the limit never
//! refused. A refusal is named by its likely cause ([`lockout`]).

use super::*;
use shardstock::Deduction;

pub(super) fn check(cx: &Ctx<'_>, held: &Holdings, out: &mut Vec<Violation>) {
    let (ops, facts, p) = (cx.ops, cx.facts, cx.p);
    let (rf, by_rid, by_user) = (&cx.rf, &cx.by_rid, &cx.by_user);
    let maybe = &held.maybe;
    for o in ops
        .iter()
        .filter(|o| o.kind.takes() && o.kind != Kind::Final)
    {
        match o.ded() {
            Some(Deduction::LimitReached { limit }) => {
                if o.qty > *limit {
                    continue;
                }
                // A retry of a request id this user was already told it holds: it must replay
                // (same kind) or be refused as a conflict (other kind); never count it against
                // itself.
                let told_before = by_rid.get(o.rid.as_str()).is_some_and(|os| {
                    os.iter()
                        .any(|x| x.user == o.user && x.holds().is_some() && x.ret < o.inv)
                });
                if let Some((u, q, k)) = cx.fact(&o.rid).effect.owner()
                    && u == o.user
                    && told_before
                {
                    let same = (k == Kind::Deduct) == o.kind.sells() && q == o.qty;
                    if same {
                        let mut x = v(
                            C1,
                            "retry answered LimitReached instead of a replay",
                            format!(
                                "{}: op #{} ({} by {} qty {}, engine {}) is a retry of an applied request but answered LimitReached instead of replaying it",
                                o.rid,
                                o.seq,
                                o.kind.name(),
                                o.user,
                                o.qty,
                                o.engine
                            ),
                            &[&o.rid],
                            &[&o.user],
                        );
                        x.window = Some((o.inv.saturating_sub(1_000_000), o.ret));
                        out.push(x);
                    }
                    continue;
                }
                let iv = maybe.get(&o.user).map(Vec::as_slice).unwrap_or(&[]);
                let mut ts = vec![o.inv];
                ts.extend(iv.iter().map(|x| x.0).filter(|t| *t > o.inv && *t <= o.ret));
                let most = ts
                    .iter()
                    .map(|t| {
                        iv.iter()
                            .filter(|(a, b, _, r)| a <= t && t < b && *r != o.rid)
                            .map(|x| x.2)
                            .sum::<u64>()
                    })
                    .max()
                    .unwrap_or(0);
                if most + o.qty <= *limit {
                    let holding: Vec<&str> = iv
                        .iter()
                        .filter(|(a, b, _, r)| *a <= o.ret && o.inv < *b && *r != o.rid)
                        .map(|x| x.3.as_str())
                        .collect();
                    let (mut class, mut hint) = lockout(&o.user, facts, rf);
                    if hint.is_empty() {
                        // Engine-local causes, from what this engine answered the user before.
                        let prior: Vec<&&Op> = by_user
                            .get(o.user.as_str())
                            .map(|os| {
                                os.iter()
                                    .filter(|q| q.engine == o.engine && q.ret < o.inv)
                                    .collect()
                            })
                            .unwrap_or_default();
                        if let Some(q) = prior.iter().rev().find(|q| {
                            matches!(q.ded(), Some(Deduction::LimitReached { .. })) && q.qty > o.qty
                        }) {
                            class = "engine remembers the refusal of a larger quantity";
                            hint = format!(
                                "; this engine refused qty {} to the user before (op #{})",
                                q.qty, q.seq
                            );
                        } else if let Some(q) = prior.iter().rev().find(|q| {
                            q.kind == Kind::Reserve
                                && q.holds().is_some()
                                && match cx.fact(&q.rid).effect {
                                    Effect::Resv {
                                        state: 'X', exp_ms, ..
                                    } => exp_ms * 1000 < o.inv,
                                    Effect::Resv { state: 'K', .. } => {
                                        by_rid.get(q.rid.as_str()).is_some_and(|os| {
                                            os.iter().any(|c| {
                                                c.kind == Kind::Cancel
                                                    && c.end_done()
                                                    && c.ret < o.inv
                                            })
                                        })
                                    }
                                    _ => false,
                                }
                        }) {
                            class = "engine still counts an ended reservation";
                            hint = format!(
                                "; this engine held reservation {} for the user (op #{}), which ended before",
                                q.rid, q.seq
                            );
                        }
                    }
                    let mut x = v(
                        C6,
                        class,
                        format!(
                            "{} (op #{} {} {} qty {}, engine {}) refused LimitReached while holding at most {most} units (limit {limit}); units possibly held then: {holding:?}{hint}",
                            o.user,
                            o.seq,
                            o.kind.name(),
                            o.rid,
                            o.qty,
                            o.engine
                        ),
                        &[&o.rid],
                        &[&o.user],
                    );
                    x.window = Some((o.inv.saturating_sub(3_000_000), o.ret));
                    out.push(x);
                }
            }
            Some(Deduction::UserBusy) => {
                let busy = by_user.get(o.user.as_str()).is_some_and(|os| {
                    os.iter().any(|q| {
                        q.seq != o.seq
                            && q.inv <= o.ret
                            && (q.ret >= o.inv
                                || (q.unknown() && q.ret + p.user_claim_ttl_us >= o.inv))
                    })
                });
                if !busy {
                    let dropped = by_user.get(o.user.as_str()).and_then(|os| {
                        os.iter()
                            .filter(|q| q.engine == o.engine && q.unknown() && q.ret <= o.inv)
                            .max_by_key(|q| q.ret)
                    });
                    let mut x = v(
                        C6,
                        "UserBusy with no attempt of the user running",
                        format!(
                            "{} (op #{} {} {}, engine {}) answered UserBusy with no other attempt of the user running{}",
                            o.user,
                            o.seq,
                            o.kind.name(),
                            o.rid,
                            o.engine,
                            match dropped {
                                Some(q) => format!(
                                    "; the user's last dropped attempt on that engine: op #{} ({}) ended {:.0} ms before",
                                    q.seq,
                                    q.rid,
                                    (o.inv - q.ret) as f64 / 1000.0
                                ),
                                None => "; no dropped attempt of the user on that engine".into(),
                            }
                        ),
                        &[&o.rid],
                        &[&o.user],
                    );
                    x.window = Some((o.inv.saturating_sub(3_000_000), o.ret));
                    out.push(x);
                }
            }
            _ => {}
        }
    }
    // The end-of-run purchase of every user below the limit: never refused.
    let mut finals: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for o in ops.iter().filter(|o| o.kind == Kind::Final) {
        finals.entry(o.user.as_str()).or_default().push(o);
    }
    for (user, os) in finals {
        let bought = os.iter().find(|o| {
            matches!(
                o.ded(),
                Some(
                    Deduction::Applied { .. }
                        | Deduction::Replayed { .. }
                        | Deduction::SoldOut
                        | Deduction::Insufficient { .. }
                )
            )
        });
        let mut refusals: BTreeMap<(usize, String), usize> = BTreeMap::new();
        for o in &os {
            if bought.is_some_and(|b| b.seq == o.seq) {
                continue;
            }
            let what = match o.ded() {
                Some(d) => d.kind().to_string(),
                None => format!("{:?}", o.out),
            };
            *refusals.entry((o.engine, what)).or_default() += 1;
        }
        if refusals.is_empty() {
            continue;
        }
        let busy = refusals.keys().any(|(_, w)| w == "user_busy");
        let (class, hint) = lockout(user, facts, rf);
        let class = match (bought.map(|b| b.engine), busy) {
            (Some(e), true) if e < p.engines => {
                "final purchase: UserBusy on an engine with nothing running; another engine sold"
            }
            (Some(e), false) if e < p.engines => {
                "final purchase: LimitReached from an engine's in-process state; another engine sold"
            }
            (Some(_), true) => {
                "final purchase refused by every engine (UserBusy among them); a new engine sold"
            }
            (Some(_), false) => {
                "final purchase: LimitReached from every engine's in-process state; a new engine sold"
            }
            (None, _) => match class {
                "locked out by an entry of another user's request id" => {
                    "final purchase refused even by a new engine: entry of another user's request id"
                }
                "locked out by a pending entry of a request that holds nothing" => {
                    "final purchase refused even by a new engine: pending entry of a request that holds nothing"
                }
                "locked out by an entry of a request that holds nothing" => {
                    "final purchase refused even by a new engine: entry of a request that holds nothing"
                }
                _ => "final purchase refused even by a new engine, no stale entry in the store",
            },
        };
        let held: u64 = os.first().map(|o| o.qty).map_or(0, |_| {
            rf.iter()
                .filter(|(r, _)| **r != os[0].rid)
                .filter_map(|(_, f)| match &f.effect {
                    Effect::Sale { user: u, qty, .. }
                    | Effect::Resv {
                        user: u,
                        qty,
                        state: 'C',
                        ..
                    } if u == user => Some(*qty),
                    _ => None,
                })
                .sum()
        });
        if held + os[0].qty > p.limit {
            continue; // e.g. an abandoned claim of the user's was completed meanwhile
        }
        let mut x = v(
            C6,
            class,
            format!(
                "{user} holds {held} unit(s) (limit {}) after everything settled; one more unit (request {}) was refused: {}{}{hint}",
                p.limit,
                os[0].rid,
                refusals
                    .iter()
                    .map(|((e, w), n)| format!("engine {e}: {w} x{n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                match bought {
                    Some(b) => format!(
                        "; then {} answered {}",
                        if b.engine < p.engines {
                            format!("engine {}", b.engine)
                        } else {
                            "a new engine".to_string()
                        },
                        b.ded().map_or("?", |d| d.kind())
                    ),
                    None => "; never bought, not even from a new engine".into(),
                }
            ),
            &[&os[0].rid],
            &[user],
        );
        x.window = Some((os[0].inv.saturating_sub(3_000_000), os[0].inv));
        out.push(x);
    }
}

fn effect_user(e: &Effect) -> Option<&str> {
    match e {
        Effect::Sale { user, .. }
        | Effect::Resv { user, .. }
        | Effect::Claim { user, .. }
        | Effect::Sealed { user, .. } => Some(user),
        Effect::None => None,
    }
}

/// Why a user may be refused: entries of the user's record (at the end) that hold nothing.
fn lockout(user: &str, facts: &Facts, rf: &BTreeMap<&str, RidFacts>) -> (&'static str, String) {
    let Some(entries) = facts.users.get(user) else {
        return (
            "refused below the limit (no stale entry left in the store)",
            String::new(),
        );
    };
    let (mut other, mut pending) = (false, false);
    let mut phantom = Vec::new();
    let mut keys: Vec<_> = entries.iter().collect();
    keys.sort();
    for (k, val) in keys {
        let rid = k.strip_prefix("r:").unwrap_or(k);
        let e = rf.get(rid).map(|f| &f.effect);
        let live = matches!(
            e,
            Some(Effect::Sale { user: u, .. } | Effect::Resv { user: u, state: 'C' | 'R', .. })
                if u == user
        );
        if live {
            continue;
        }
        let owner = e.and_then(effect_user);
        if owner.is_some_and(|u| u != user) {
            other = true;
        }
        if val.contains(":P:") {
            pending = true;
        }
        phantom.push(format!(
            "{rid}={val} ({})",
            match (e, owner) {
                (None, _) | (Some(Effect::None), _) => "no record".to_string(),
                (Some(e), Some(u)) if u != user => format!("request id of {u}: {e:?}"),
                (Some(e), _) => format!("{e:?}"),
            }
        ));
    }
    let class = if other {
        "locked out by an entry of another user's request id"
    } else if pending {
        "locked out by a pending entry of a request that holds nothing"
    } else if !phantom.is_empty() {
        "locked out by an entry of a request that holds nothing"
    } else {
        "refused below the limit (no stale entry left in the store)"
    };
    let hint = if phantom.is_empty() {
        String::new()
    } else {
        format!(
            "; at the end the user record still counts {}",
            phantom.join(", ")
        )
    };
    (class, hint)
}
