//! Differential tests: the Lua scripts (`RedisStore`, plain and with request coalescing) against
//! the memory store, whose steps are the pure reference semantics
//! (`shardstock::store::memory::Segment`). The machinery: `tests/it/common/differential/`.
//!
//! 1. `stores_agree_step_by_step`: random sequences of store steps — sales and reservations
//!    (with credits), transfers (fresh and replayed ids, ids past 2^53), transfer_done,
//!    transfers_due, restock, reserve_end (confirm / cancel / inspect), survey, record; carts:
//!    order items held (short or long hints) and held again, settled (post and void: of items
//!    held, never held, already settled, with another qty, of a sale's or a reservation's id),
//!    holds_due, every step of an order's record (open with short or long holds, held, refuse,
//!    confirm, cancel, expire, read); steps addressed to the previous generation after a
//!    reload, and clock advances — run in lockstep on the three stores; the answers and the
//!    state read after every step (each segment peeked and surveyed, transfers and items due,
//!    every record, the case's orders, the metadata) must be identical, and each segment must
//!    balance with `held` (reservations and items) equal to `reserved`.
//! 2. `engines_agree`: the same one level up, through an `Engine` on each store: outcomes and
//!    audits identical, every audit balanced with nothing in transit.
//! 3. `stores_and_engines_agree_on_a_cluster`: 1 and 2 with the Redis stores on a 3-master
//!    cluster (fewer cases).
//! 4. Named scenarios, each asserted on every store: transfers and re-sent credits; the reclaim
//!    of more than 64 expired reservations in one step (a regression: the old scripts capped it
//!    at 64); a reload between a transfer's debit and its credit; the request-TTL boundary of the
//!    per-user ledger (a regression: the limit lapsed with the record TTL). Those of carts:
//!    `tests/it/differential_carts.rs`.
//!
//! Mutation checks of property 1 (done, each shrunk by proptest to a 4- or 5-step case):
//! `transfer.lua` renewing the lease of a replayed transfer already done (it is due again:
//! the transfers-due lines differ); `sell.lua` crediting with `HSET` instead of `HSETNX` (a
//! re-sent credit applies twice: `[transit] 2 units credited by transfers but only 1 debited`);
//! `settle.lua` voiding a held item into stock without taking it from `reserved` (shrunk to
//! load, hold, void: `[balance]`). Those of the scenarios: at each.
//!
//! Timers and how races with them are kept out: see `tests/it/common/differential.rs`.
//! Environment: `DIFF_CASES`, `DIFF_SHRINK_SECS`, `DIFF_TAIL`.

use crate::common;

use common::differential::scenario::{audit_of, load, sell, three_stores};
use common::differential::{engines, run};
use common::edges::{at, run_all, sku};
use common::*;
use futures::FutureExt;
use shardstock::store::{
    Credit, HomeRecord, RecordState, RequestKind, ReservationAction, ReserveEnd, ResvState,
    SellReply, TransferArgs, TransferReply,
};
use shardstock::*;
use std::time::Duration;

#[test]
fn stores_agree_step_by_step() {
    run::property(&RedisServer::start(), 48, 60);
}

#[test]
fn engines_agree() {
    engines::property(&RedisServer::start(), 32, 40);
}

/// Properties 1 and 2 with the Redis stores on a 3-master cluster (the segments' hash tags
/// carry their placement suffix there).
#[test]
fn stores_and_engines_agree_on_a_cluster() {
    let cluster = common::cluster::RedisCluster::start(3, 0);
    run::property(&cluster, 12, 40);
    engines::property(&cluster, 8, 30);
}

// ---------------------------------------------------------------------------------------------
// Named scenarios: each runs on the memory store, Redis and coalesced Redis, and asserts every
// answer; a failure names its store.

/// Transfers debit once per id (a re-send replays its units, whatever its other fields, also
/// after it was marked done); a credit applies once per id, however often it is re-sent; ids
/// are kept as text (past 2^53, up to u64::MAX).
async fn transfers_and_resent_credits<S: Store + Clone>(store: S, tag: &'static str) {
    let name = "transfers";
    let g = load(&store, name, 10, 2, 0).await; // [5, 5]
    let s = sku(name);
    let (big, odd) = (u64::MAX, (1u64 << 53) + 1);
    let t = |id, want, floor| TransferArgs {
        id,
        dest: 1,
        want,
        floor,
        lease_ms: 60_000,
    };
    let r = store.transfer(at(&s, g, 0), t(big, 3, 0)).await.unwrap();
    assert_eq!(
        r,
        TransferReply::Debited {
            units: 3,
            stock_after: 2
        },
        "[{tag}]"
    );
    let r = store.transfer(at(&s, g, 0), t(big, 9, 0)).await.unwrap();
    assert_eq!(
        r,
        TransferReply::Debited {
            units: 3,
            stock_after: 2
        },
        "[{tag}] a re-sent debit replays its units"
    );
    let r = store.transfer(at(&s, g, 0), t(odd, 9, 1)).await.unwrap();
    assert_eq!(
        r,
        TransferReply::Debited {
            units: 1,
            stock_after: 1
        },
        "[{tag}] the donor keeps its floor"
    );
    let r = store.transfer(at(&s, g, 0), t(5, 1, 1)).await.unwrap();
    assert_eq!(r, TransferReply::Short { stock: 1 }, "[{tag}]");
    let mut due = store.transfers_due(at(&s, g, 0), 10).await.unwrap();
    due.sort_by_key(|d| d.id);
    let ids: Vec<(u64, u32, u64)> = due.iter().map(|d| (d.id, d.dest, d.units)).collect();
    assert_eq!(ids, vec![(odd, 1, 1), (big, 1, 3)], "[{tag}] {due:?}");
    assert!(
        due.iter().all(|d| d.lease_left_ms > 50_000),
        "[{tag}] {due:?}"
    );

    let credits = [
        Credit {
            id: big,
            donor: 0,
            units: 3,
        },
        Credit {
            id: odd,
            donor: 0,
            units: 1,
        },
    ];
    let r = sell(&store, at(&s, g, 1), "ann", "a1", 9, 0, 60_000, &credits).await;
    assert_eq!(
        r,
        SellReply::Applied { stock_after: 0 },
        "[{tag}] 5 + 4 credited"
    );
    // The same credits, re-sent: by a credit-only call, and by another request.
    let r = sell(&store, at(&s, g, 1), "x", "x", 0, 0, 60_000, &credits).await;
    assert_eq!(
        r,
        SellReply::Applied { stock_after: 0 },
        "[{tag}] credits re-sent"
    );
    let r = sell(&store, at(&s, g, 1), "bob", "b1", 1, 0, 60_000, &credits).await;
    assert_eq!(r, SellReply::Short { stock: 0 }, "[{tag}] credits re-sent");
    let home = store
        .survey(at(&s, g, 1), true)
        .await
        .unwrap()
        .unwrap()
        .state;
    let donor = store
        .survey(at(&s, g, 0), true)
        .await
        .unwrap()
        .unwrap()
        .state;
    assert_eq!(
        (
            home.moved_in,
            home.sold,
            home.stock,
            donor.moved_out,
            donor.stock
        ),
        (4, 9, 0, 4, 1),
        "[{tag}] home {home:?} donor {donor:?}"
    );
    // Done: no longer due, still remembered (a late re-send replays, debits nothing).
    for id in [big, odd] {
        store.transfer_done(at(&s, g, 0), id).await.unwrap();
    }
    assert_eq!(
        store.transfers_due(at(&s, g, 0), 10).await.unwrap(),
        vec![],
        "[{tag}]"
    );
    let r = store.transfer(at(&s, g, 0), t(big, 1, 0)).await.unwrap();
    assert_eq!(
        r,
        TransferReply::Debited {
            units: 3,
            stock_after: 1
        },
        "[{tag}]"
    );
    assert_eq!(
        store.transfers_due(at(&s, g, 0), 10).await.unwrap(),
        vec![],
        "[{tag}] a replay of a done transfer is not due again"
    );
    let a = audit_of(&store, name).await;
    assert!(
        a.ok && (a.remaining, a.sold, a.in_transit) == (1, 9, 0),
        "[{tag}] {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_and_resent_credits_agree() {
    let srv = RedisServer::start();
    let (m, r, c) = three_stores(&srv).await;
    run_all(
        true,
        vec![
            ("memory", transfers_and_resent_credits(m, "memory").boxed()),
            ("redis", transfers_and_resent_credits(r, "redis").boxed()),
            (
                "coalesced",
                transfers_and_resent_credits(c, "coalesced").boxed(),
            ),
        ],
    )
    .await;
}

/// Finding 2: 100 one-unit reservations (TTL 50 ms) expire; a sale of 80 in the same segment
/// must return all 100 in its own step and apply. The old scripts returned at most 64 expired
/// reservations per call, so Redis answered short where the memory store sold. With a per-user
/// limit too (each expiry gives its user's ledger units back).
///
/// Mutation check (done): capping the prelude's `reclaim` at 64 entries per call, as the old
/// scripts did (`ZRANGEBYSCORE … LIMIT 0 64`, then `ZREM` of those only) makes `[redis]` and
/// `[coalesced]` answer `Short { stock: 64 }` here; capping `Segment::reclaim` at 64 likewise
/// fails `[memory]`. (The engine-level test below passes under either mutation: a short home
/// makes the engine survey, and the survey returns every expired reservation.)
async fn reclaim_past_64<S: Store + Clone>(store: S, tag: &'static str) {
    for (base, limit) in [("reclaim", 0), ("reclaim-limit", 100)] {
        // The 100 reservations are sent at once (pipelined; coalesced: batched) so that none
        // expires before the last is held: then the last one left the stock at 0. Should one
        // expire first (a slow machine), the setup is tried again on a fresh SKU.
        let mut setup = None;
        for attempt in 0..5 {
            let name = format!("{base}-{attempt}");
            let g = load(&store, &name, 100, 1, limit).await;
            let s = sku(&name);
            let holds = (0..100).map(|i| {
                let (store, s) = (&store, &s);
                async move {
                    sell(
                        store,
                        at(s, g, 0),
                        &format!("u{i}"),
                        "r",
                        1,
                        50,
                        60_000,
                        &[],
                    )
                    .await
                }
            });
            let replies = futures::future::join_all(holds).await;
            let mut left = Vec::new();
            for (i, r) in replies.iter().enumerate() {
                match r {
                    SellReply::Applied { stock_after } => left.push(*stock_after),
                    other => panic!("[{tag}] {name} u{i}: {other:?}"),
                }
            }
            if left.iter().min() == Some(&0) {
                setup = Some((name, g));
                break;
            }
        }
        let Some((name, g)) = setup else {
            panic!("[{tag}] {base}: 100 reservations of 50 ms could never all be held at once");
        };
        let s = sku(&name);
        tokio::time::sleep(Duration::from_millis(150)).await;
        let r = sell(&store, at(&s, g, 0), "big", "b", 80, 0, 60_000, &[]).await;
        assert_eq!(
            r,
            SellReply::Applied { stock_after: 20 },
            "[{tag}] {name}: 100 expired reservations, then a sale of 80"
        );
        let sv = store.survey(at(&s, g, 0), true).await.unwrap().unwrap();
        assert_eq!(
            (
                sv.state.stock,
                sv.state.reserved,
                sv.state.sold,
                sv.live,
                sv.reclaimed
            ),
            (20, 0, 80, 0, 0),
            "[{tag}] {name}: {sv:?}"
        );
        let (u, r) = (UserId::new("u7").unwrap(), RequestId::new("r").unwrap());
        let rec = store.record(at(&s, g, 0), &u, &r).await.unwrap();
        assert_eq!(
            rec.map(|r| r.state),
            Some(RecordState::Reservation(ResvState::Expired)),
            "[{tag}] {name}"
        );
        if limit > 0 {
            // u7's ledger was given its unit back: it may hold another.
            let r = sell(&store, at(&s, g, 0), "u7", "again", 1, 0, 60_000, &[]).await;
            assert_eq!(r, SellReply::Applied { stock_after: 19 }, "[{tag}] {name}");
        }
        assert!(audit_of(&store, &name).await.ok, "[{tag}] {name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_of_more_than_64_expired_reservations_in_one_step() {
    let srv = RedisServer::start();
    let (m, r, c) = three_stores(&srv).await;
    run_all(
        true,
        vec![
            ("memory", reclaim_past_64(m, "memory").boxed()),
            ("redis", reclaim_past_64(r, "redis").boxed()),
            ("coalesced", reclaim_past_64(c, "coalesced").boxed()),
        ],
    )
    .await;
}

/// Finding 2 through the engine: 100 one-unit reservations expire, then a deduction of 80
/// applies, on Redis and on the memory store.
async fn engine_reclaim<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("ereclaim");
    e.load(&s, 100, LoadOptions::new(1).per_user_limit(0))
        .await
        .unwrap();
    for i in 0..100 {
        let d = Deduct::new("ereclaim", &format!("u{i}"), 1, "r").unwrap();
        let r = e.reserve(&d, Duration::from_millis(50)).await.unwrap();
        assert!(matches!(r, Reserved::Held { .. }), "[{tag}] {r:?}");
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let r = e
        .deduct(&Deduct::new("ereclaim", "big", 80, "b").unwrap())
        .await
        .unwrap();
    assert_eq!(r.units_applied(), 80, "[{tag}] {r:?}");
    let a = e.audit(&s).await.unwrap();
    assert!(
        a.ok && (a.remaining, a.sold, a.reserved, a.in_transit) == (20, 80, 0, 0),
        "[{tag}] {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_sells_80_after_100_reservations_expired() {
    let srv = RedisServer::start();
    let b = || Engine::builder().max_qty(100).sold_out_ttl(Duration::ZERO);
    let (m, r, c) = three_stores(&srv).await;
    run_all(
        true,
        vec![
            (
                "memory",
                engine_reclaim(b().build(m).unwrap(), "memory").boxed(),
            ),
            (
                "redis",
                engine_reclaim(b().build(r).unwrap(), "redis").boxed(),
            ),
            (
                "coalesced",
                engine_reclaim(b().build(c).unwrap(), "coalesced").boxed(),
            ),
        ],
    )
    .await;
}

/// A transfer debited in generation g, then `load --replace` to g+1: the credit of g's transfer
/// at its home answers stale and creates nothing; g's transfers are neither due nor swept into
/// g+1.
async fn reload_mid_transfer<S: Store + Clone>(store: S, tag: &'static str) {
    let name = "midtransfer";
    let s = sku(name);
    let g1 = load(&store, name, 10, 2, 0).await; // [5, 5]
    let t = TransferArgs {
        id: 42,
        dest: 1,
        want: 3,
        floor: 0,
        lease_ms: 1,
    };
    let r = store.transfer(at(&s, g1, 0), t).await.unwrap();
    assert_eq!(
        r,
        TransferReply::Debited {
            units: 3,
            stock_after: 2
        },
        "[{tag}]"
    );
    let g2 = load(&store, name, 10, 2, 0).await;
    assert!(g2 > g1, "[{tag}]");
    let credit = [Credit {
        id: 42,
        donor: 0,
        units: 3,
    }];
    for qty in [0, 1, 7] {
        let r = sell(&store, at(&s, g1, 1), "late", "l1", qty, 0, 60_000, &credit).await;
        assert_eq!(
            r,
            SellReply::Stale,
            "[{tag}] the credit of g1's transfer (qty {qty})"
        );
    }
    assert_eq!(
        store.transfers_due(at(&s, g1, 0), 10).await.unwrap(),
        vec![],
        "[{tag}]"
    );
    assert_eq!(
        store.transfers_due(at(&s, g2, 0), 10).await.unwrap(),
        vec![],
        "[{tag}]"
    );
    store.transfer_done(at(&s, g1, 0), 42).await.unwrap();
    assert_eq!(
        store.survey(at(&s, g1, 0), true).await.unwrap(),
        None,
        "[{tag}]"
    );
    // The sweeper finds nothing to credit in g2.
    let e = Engine::builder().build(store.clone()).unwrap();
    e.sweep().await.unwrap();
    for i in 0..2 {
        let st = store
            .survey(at(&s, g2, i), true)
            .await
            .unwrap()
            .unwrap()
            .state;
        assert_eq!(
            (st.stock, st.moved_in, st.moved_out, st.sold),
            (5, 0, 0, 0),
            "[{tag}] segment {i} of g2: {st:?}"
        );
    }
    let a = e.audit(&s).await.unwrap();
    assert!(
        a.ok && a.generation == g2 && (a.remaining, a.in_transit) == (10, 0),
        "[{tag}] {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_between_debit_and_credit_credits_nothing() {
    let srv = RedisServer::start();
    let (m, r, c) = three_stores(&srv).await;
    run_all(
        true,
        vec![
            ("memory", reload_mid_transfer(m, "memory").boxed()),
            ("redis", reload_mid_transfer(r, "redis").boxed()),
            ("coalesced", reload_mid_transfer(c, "coalesced").boxed()),
        ],
    )
    .await;
}

/// The request-TTL boundary of the ledger. With a per-user limit (1), a sale's record and the
/// user's ledger live as long as the generation: past the record TTL given (`ttl_ms` 100), a
/// second request of the user is `LimitReached` and the first id still replays — also for a
/// confirmed reservation. Without a limit, a record is forgotten after its TTL: the same id is
/// then another request.
///
/// Mutation checks (done): the ledger given a lifetime under a limit as without one — in
/// `sell.lua`, a `PEXPIREAT` of the user's ledger (now + the record TTL) also when the segment
/// has a limit; in `Segment::sell`, the record's and the ledger's `until` set to `now + ttl_ms`
/// whatever the limit — makes una's second request apply (`Applied { stock_after: 7 }`) on
/// `[redis]` and `[coalesced]`, respectively on `[memory]`.
async fn ledger_outlives_request_ttl<S: Store + Clone>(store: S, tag: &'static str) {
    let name = "ledger";
    let s = sku(name);
    let g = load(&store, name, 10, 1, 1).await;
    let h = || at(&s, g, 0);
    assert!(matches!(
        sell(&store, h(), "una", "a", 1, 0, 100, &[]).await,
        SellReply::Applied { .. }
    ));
    // Vic reserves (held 100 ms, record TTL 100 ms) and confirms at once.
    assert!(matches!(
        sell(&store, h(), "vic", "c", 1, 100, 100, &[]).await,
        SellReply::Applied { .. }
    ));
    let (vic, c) = (UserId::new("vic").unwrap(), RequestId::new("c").unwrap());
    let r = store
        .reserve_end(h(), &vic, &c, ReservationAction::Confirm)
        .await
        .unwrap();
    assert!(
        matches!(
            r,
            ReserveEnd::Done {
                state: ResvState::Confirmed,
                ..
            }
        ),
        "[{tag}] {r:?}"
    );
    tokio::time::sleep(Duration::from_millis(350)).await;
    for (user, first, next) in [("una", "a", "b"), ("vic", "c", "d")] {
        let r = sell(&store, h(), user, next, 1, 0, 100, &[]).await;
        assert_eq!(
            r,
            SellReply::LimitReached {
                limit: 1,
                held: 1,
                sold: 1
            },
            "[{tag}] {user} bought {first} more than the record TTL ago; {next} must still meet the limit"
        );
        let (u, r) = (UserId::new(user).unwrap(), RequestId::new(first).unwrap());
        let rec = store.record(h(), &u, &r).await.unwrap();
        let state = if user == "una" {
            RecordState::Sold
        } else {
            RecordState::Reservation(ResvState::Confirmed)
        };
        assert_eq!(
            rec.map(|r| r.state),
            Some(state),
            "[{tag}] {user}'s {first}"
        );
    }
    let r = sell(&store, h(), "una", "a", 1, 0, 100, &[]).await;
    assert_eq!(
        r,
        SellReply::Replay,
        "[{tag}] una's first id, past the record TTL"
    );

    // Without a limit: forgotten after the record TTL.
    let name0 = "ledger0";
    let s0 = sku(name0);
    let g0 = load(&store, name0, 10, 1, 0).await;
    assert!(matches!(
        sell(&store, at(&s0, g0, 0), "una", "a", 1, 0, 100, &[]).await,
        SellReply::Applied { .. }
    ));
    assert_eq!(
        sell(&store, at(&s0, g0, 0), "una", "a", 1, 0, 100, &[]).await,
        SellReply::Replay,
        "[{tag}]"
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    let (u, r) = (UserId::new("una").unwrap(), RequestId::new("a").unwrap());
    assert_eq!(
        store.record(at(&s0, g0, 0), &u, &r).await.unwrap(),
        None,
        "[{tag}]"
    );
    assert_eq!(
        sell(&store, at(&s0, g0, 0), "una", "a", 1, 0, 100, &[]).await,
        SellReply::Applied { stock_after: 8 },
        "[{tag}] no limit: the id is another request once its record is forgotten"
    );
    let rec = store.record(at(&s0, g0, 0), &u, &r).await.unwrap();
    assert_eq!(
        rec,
        Some(HomeRecord {
            qty: 1,
            kind: RequestKind::Sale,
            state: RecordState::Sold
        }),
        "[{tag}]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_ledger_outlives_the_request_ttl() {
    let srv = RedisServer::start();
    let (m, r, c) = three_stores(&srv).await;
    run_all(
        true,
        vec![
            ("memory", ledger_outlives_request_ttl(m, "memory").boxed()),
            ("redis", ledger_outlives_request_ttl(r, "redis").boxed()),
            (
                "coalesced",
                ledger_outlives_request_ttl(c, "coalesced").boxed(),
            ),
        ],
    )
    .await;
}

/// transfers_due: at most `max`, those whose lease ends first first; a replay renews a lease
/// (unless done).
async fn due_order<S: Store + Clone>(store: S, tag: &'static str) {
    let name = "dueorder";
    let s = sku(name);
    let g = load(&store, name, 20, 2, 0).await; // [10, 10]
    let t = |id, lease_ms| TransferArgs {
        id,
        dest: 1,
        want: 1,
        floor: 0,
        lease_ms,
    };
    for (id, lease) in [(1, 300_000), (2, 100_000), (3, 200_000)] {
        let r = store.transfer(at(&s, g, 0), t(id, lease)).await.unwrap();
        assert!(
            matches!(r, TransferReply::Debited { units: 1, .. }),
            "[{tag}] {r:?}"
        );
    }
    let ids = |v: Vec<shardstock::store::DueTransfer>| v.iter().map(|d| d.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.transfers_due(at(&s, g, 0), 2).await.unwrap()),
        vec![2, 3],
        "[{tag}]"
    );
    // A replay of 2 with a longer lease moves it last.
    store.transfer(at(&s, g, 0), t(2, 400_000)).await.unwrap();
    assert_eq!(
        ids(store.transfers_due(at(&s, g, 0), 10).await.unwrap()),
        vec![3, 1, 2],
        "[{tag}]"
    );
    // A short lease runs out: lease left 0.
    store.transfer(at(&s, g, 0), t(4, 30)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let due = store.transfers_due(at(&s, g, 0), 1).await.unwrap();
    assert_eq!(
        due.iter()
            .map(|d| (d.id, d.lease_left_ms))
            .collect::<Vec<_>>(),
        vec![(4, 0)],
        "[{tag}]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_due_by_lease_end() {
    let srv = RedisServer::start();
    let (m, r, c) = three_stores(&srv).await;
    run_all(
        true,
        vec![
            ("memory", due_order(m, "memory").boxed()),
            ("redis", due_order(r, "redis").boxed()),
            ("coalesced", due_order(c, "coalesced").boxed()),
        ],
    )
    .await;
}
