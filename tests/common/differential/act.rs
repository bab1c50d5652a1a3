//! The ops of the edge tests ([`Act`]) and their generators; `DIFF_SKIP` leaves families out.

use proptest::prelude::*;
use proptest::strategy::Strategy;

/// One op of the edge tests. `e` picks engine 0 or 1 (both over the same store); `rid` and
/// `user` are small so ids and users repeat; `nth` picks an earlier request or reservation
/// counting back from the latest (0), modulo their number.
#[derive(Debug, Clone)]
pub enum Act {
    /// Reload (replace) with a per-user limit (0 = none).
    Load {
        e: u8,
        total: u64,
        segments: u32,
        limit: u64,
    },
    Deduct {
        e: u8,
        user: u8,
        qty: u64,
        rid: u8,
    },
    Reserve {
        e: u8,
        user: u8,
        qty: u64,
        rid: u8,
        ttl_ms: u64,
    },
    /// Confirm the nth reservation id answered so far.
    Confirm {
        e: u8,
        nth: usize,
    },
    /// Cancel the nth reservation id answered so far.
    Cancel {
        e: u8,
        nth: usize,
    },
    /// Re-send the nth earlier request (same kind, user, qty and id).
    Replay {
        e: u8,
        nth: usize,
    },
    /// The nth earlier request's id with another quantity.
    Conflict {
        e: u8,
        nth: usize,
    },
    /// The nth earlier request's id and quantity for another user.
    OtherUser {
        e: u8,
        nth: usize,
        user: u8,
    },
    /// The nth earlier request (id, user, qty) as the other kind: sale <-> reservation.
    OtherKind {
        e: u8,
        nth: usize,
        ttl_ms: u64,
    },
    Restock {
        e: u8,
        qty: u64,
        rid: u8,
    },
    /// Crash after `user_claim`: a pending per-user entry (limited SKUs only).
    CrashClaim {
        e: u8,
        user: u8,
        qty: u64,
        rid: u8,
    },
    /// Crash after `user_claim` + `deduct_home` applied: sold, per-user entry still pending.
    CrashSold {
        e: u8,
        user: u8,
        qty: u64,
        rid: u8,
    },
    /// Crash after `user_claim` + `deduct_home` reserving (TTL 80 ms): entry still pending.
    CrashResv {
        e: u8,
        user: u8,
        qty: u64,
        rid: u8,
    },
    /// Crash in a fallback: `deduct_home(claim)` answered short, `take` of `part` units at the
    /// next segment, then nothing (an abandoned claim).
    CrashFallback {
        e: u8,
        user: u8,
        qty: u64,
        rid: u8,
        part: u64,
    },
    /// Sleep past every lease and TTL.
    Wait,
    /// Sleep past every lease and TTL, then `sweep` on both engines.
    Expire,
    /// (Cancellation test.) A deduct or reservation dropped after `us` µs. Its request id is
    /// new (`d<n>`); `Replay` & co. reuse it later.
    Drop {
        e: u8,
        user: u8,
        qty: u64,
        us: u64,
        resv: bool,
    },
}

fn skipped(family: &str) -> bool {
    std::env::var("DIFF_SKIP")
        .map(|s| s.split(',').any(|f| f.trim() == family))
        .unwrap_or(false)
}

pub fn act(cancellation: bool) -> impl Strategy<Value = Act> {
    let e = if skipped("two-engines") {
        0u8..1
    } else {
        0u8..2
    };
    let limit = if skipped("limits") { 0u64..1 } else { 0u64..4 };
    let (user, qty, rid) = (0u8..3, 1u64..4, 0u8..16);
    let ttl = 60u64..=100;
    let all: Vec<(&str, u32, BoxedStrategy<Act>)> = vec![
        (
            "load",
            1,
            (e.clone(), 0u64..16, 1u32..5, limit)
                .prop_map(|(e, total, segments, limit)| Act::Load {
                    e,
                    total,
                    segments,
                    limit,
                })
                .boxed(),
        ),
        (
            "deduct",
            8,
            (e.clone(), user.clone(), qty.clone(), rid.clone())
                .prop_map(|(e, user, qty, rid)| Act::Deduct { e, user, qty, rid })
                .boxed(),
        ),
        (
            "reserve",
            4,
            (
                e.clone(),
                user.clone(),
                qty.clone(),
                rid.clone(),
                ttl.clone(),
            )
                .prop_map(|(e, user, qty, rid, ttl_ms)| Act::Reserve {
                    e,
                    user,
                    qty,
                    rid,
                    ttl_ms,
                })
                .boxed(),
        ),
        (
            "confirm",
            2,
            (e.clone(), 0usize..64)
                .prop_map(|(e, nth)| Act::Confirm { e, nth })
                .boxed(),
        ),
        (
            "cancel",
            2,
            (e.clone(), 0usize..64)
                .prop_map(|(e, nth)| Act::Cancel { e, nth })
                .boxed(),
        ),
        (
            "replay",
            2,
            (e.clone(), 0usize..64)
                .prop_map(|(e, nth)| Act::Replay { e, nth })
                .boxed(),
        ),
        (
            "conflict",
            1,
            (e.clone(), 0usize..64)
                .prop_map(|(e, nth)| Act::Conflict { e, nth })
                .boxed(),
        ),
        (
            "other-user",
            2,
            (e.clone(), 0usize..64, user.clone())
                .prop_map(|(e, nth, user)| Act::OtherUser { e, nth, user })
                .boxed(),
        ),
        (
            "other-kind",
            2,
            (e.clone(), 0usize..64, ttl)
                .prop_map(|(e, nth, ttl_ms)| Act::OtherKind { e, nth, ttl_ms })
                .boxed(),
        ),
        (
            "restock",
            1,
            (e.clone(), 1u64..6, 0u8..8)
                .prop_map(|(e, qty, rid)| Act::Restock { e, qty, rid })
                .boxed(),
        ),
        (
            "crash-claim",
            1,
            (e.clone(), user.clone(), qty.clone(), rid.clone())
                .prop_map(|(e, user, qty, rid)| Act::CrashClaim { e, user, qty, rid })
                .boxed(),
        ),
        (
            "crash-sold",
            1,
            (e.clone(), user.clone(), qty.clone(), rid.clone())
                .prop_map(|(e, user, qty, rid)| Act::CrashSold { e, user, qty, rid })
                .boxed(),
        ),
        (
            "crash-resv",
            1,
            (e.clone(), user.clone(), qty.clone(), rid.clone())
                .prop_map(|(e, user, qty, rid)| Act::CrashResv { e, user, qty, rid })
                .boxed(),
        ),
        (
            "crash-fallback",
            2,
            (e.clone(), user.clone(), qty.clone(), rid.clone(), 1u64..4)
                .prop_map(|(e, user, qty, rid, part)| Act::CrashFallback {
                    e,
                    user,
                    qty,
                    rid,
                    part,
                })
                .boxed(),
        ),
        ("wait", 1, Just(Act::Wait).boxed()),
        ("expire", 1, Just(Act::Expire).boxed()),
        (
            "drop",
            if cancellation { 6 } else { 0 },
            (e, user, qty, 0u64..3000, proptest::bool::weighted(0.3))
                .prop_map(|(e, user, qty, us, resv)| Act::Drop {
                    e,
                    user,
                    qty,
                    us,
                    resv,
                })
                .boxed(),
        ),
    ];
    let kept: Vec<(u32, BoxedStrategy<Act>)> = all
        .into_iter()
        .filter(|(family, weight, _)| *weight > 0 && !skipped(family))
        .map(|(_, weight, s)| (weight, s))
        .collect();
    proptest::strategy::Union::new_weighted(kept)
}

/// A case: a first load, then up to `len` ops.
pub fn case(cancellation: bool, len: usize) -> impl Strategy<Value = Vec<Act>> {
    let limit = if skipped("limits") { 0u64..1 } else { 0u64..4 };
    (
        (1u64..16, 1u32..5, limit),
        proptest::collection::vec(act(cancellation), 1..len),
    )
        .prop_map(|((total, segments, limit), ops)| {
            let mut all = vec![Act::Load {
                e: 0,
                total,
                segments,
                limit,
            }];
            all.extend(ops);
            all
        })
}
