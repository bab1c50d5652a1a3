//! Check 6: no user refused with LimitReached who held less; UserBusy only while another
//! attempt of the user runs on the same target (the guard that answers it is in-process); the
//! end-of-run purchase of every user below the limit never refused. A refusal is named by its
//! likely cause ([`lockout`]).

use super::*;
use shardstock::Deduction;

pub(super) fn check(cx: &Ctx<'_>, held: &Holdings, out: &mut Vec<Violation>) {
    let (ops, facts, p) = (cx.ops, cx.facts, cx.p);
    let (by_key, by_user) = (&cx.by_key, &cx.by_user);
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
                // A retry of a request the user was already told it holds: it must replay (same
                // kind) or be refused as a conflict (other kind); never count it against itself.
                let told_before = by_key
                    .get(&o.key())
                    .is_some_and(|os| os.iter().any(|x| x.holds().is_some() && x.ret < o.inv));
                if let Some((_, q, k)) = cx.fact(o.key()).effect.owner()
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
                            &[o.key()],
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
                    let (mut class, mut hint) = lockout(&o.user, facts);
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
                                && match cx.fact(q.key()).effect {
                                    Effect::Resv {
                                        state: 'X', exp_ms, ..
                                    } => exp_ms * 1000 < o.inv,
                                    Effect::Resv { state: 'K', .. } => {
                                        by_key.get(&q.key()).is_some_and(|os| {
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
                        &[o.key()],
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
                            && q.engine == o.engine
                            && q.inv <= o.ret
                            && (q.ret >= o.inv || (q.unknown() && q.ret + p.busy_grace_us >= o.inv))
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
                            "{} (op #{} {} {}, engine {}) answered UserBusy with no other attempt of the user running on that engine{}",
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
                        &[o.key()],
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
        // The final restock left more units than there are final buyers: each must buy.
        let bought = os.iter().find(|o| {
            matches!(
                o.ded(),
                Some(Deduction::Applied { .. } | Deduction::Replayed { .. })
            )
        });
        let mut refusals: BTreeMap<(usize, String), usize> = BTreeMap::new();
        for o in &os {
            if bought.is_some_and(|b| b.seq == o.seq) {
                continue;
            }
            // A lock strategy's "not now, nothing written" (the lock lost or not got in time),
            // or a master that could not replicate refusing the script, is no refusal of a
            // user who then bought.
            if bought.is_some()
                && matches!(&o.out, Out::Fail(e) if e.contains("LeaseLost") || e.contains("NoReplicas") || e.contains("nothing was written"))
            {
                continue;
            }
            let what = match o.ded() {
                // Answered before the final restock reached this target's sold-out memory:
                // check 7 judges those; a user who then bought was not refused.
                Some(Deduction::SoldOut | Deduction::Insufficient { .. }) if bought.is_some() => {
                    continue;
                }
                Some(d) => d.kind().to_string(),
                None => format!("{:?}", o.out),
            };
            *refusals.entry((o.engine, what)).or_default() += 1;
        }
        if refusals.is_empty() {
            continue;
        }
        let busy = refusals.keys().any(|(_, w)| w == "user_busy");
        let sold_out = refusals
            .keys()
            .any(|(_, w)| w == "sold_out" || w == "insufficient");
        let (class, hint) = lockout(user, facts);
        let class = match (bought.map(|b| b.engine), busy) {
            (None, _) if sold_out => {
                "final purchase answered sold out (or insufficient) with units left"
            }
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
                "ledger counts units its records do not hold" => {
                    "final purchase refused even by a new engine: the ledger counts units its records do not hold"
                }
                _ => "final purchase refused even by a new engine, no stale entry in the store",
            },
        };
        let held: u64 = os.first().map(|o| o.qty).map_or(0, |_| {
            cx.rf
                .iter()
                .filter(|((u, r), _)| *u == user && *r != os[0].rid)
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
            continue; // e.g. an unknown call of the user's applied after all
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
            &[os[0].key()],
            &[user],
        );
        x.window = Some((os[0].inv.saturating_sub(3_000_000), os[0].inv));
        out.push(x);
    }
}

/// Why a user may be refused: the user's ledger (at the end) counting more units than its
/// records hold.
fn lockout(user: &str, facts: &Facts) -> (&'static str, String) {
    let mut phantom = Vec::new();
    for ((seg, u), l) in &facts.ledgers {
        if u != user {
            continue;
        }
        let held: u64 = facts
            .records
            .iter()
            .filter(|((ru, _), _)| ru == user)
            .flat_map(|(_, rs)| rs.iter().filter(|r| r.seg == *seg))
            .filter(|r| matches!(r.state, 'A' | 'C' | 'R'))
            .map(|r| r.qty)
            .sum();
        if l.h.unwrap_or(0) > held {
            phantom.push(format!(
                "segment {seg}: h={} but its records hold {held} ({:?})",
                l.h.unwrap_or(0),
                l.fields
            ));
        }
    }
    if phantom.is_empty() {
        (
            "refused below the limit (no stale entry left in the store)",
            String::new(),
        )
    } else {
        (
            "ledger counts units its records do not hold",
            format!("; at the end the user's ledger {}", phantom.join(", ")),
        )
    }
}
