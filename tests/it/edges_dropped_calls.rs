//! Edge cases of calls that never finish, at the crash points of the transfer protocol:
//! deduct futures dropped at every suspension point (one full effect or none; a retry
//! replays; the user is not left busy), a request dropped mid-transfer (its units in transit
//! credited by the sweeper after `transfer_lease`), an engine that dies between a donor's
//! debit and the home credit (the sweeper credits), a credit re-sent (applies once), and the
//! sweeper racing the credit of the engine that moved the units.
//!
//! Each runs against real stores: the embedded `MemoryStore` and `redis-server` processes
//! (plain and with request coalescing); the memory store's calls never suspend, so futures are
//! dropped on Redis only. Every case ends with the audit balanced and nothing in transit.
//! Shared helpers: `tests/it/common/edges.rs`.

use crate::common;
use common::edges::*;
use common::*;
use futures::FutureExt;
use futures::future::join_all;
use shardstock::store::{Credit, RecordState, SellReply, TransferArgs, TransferReply};
use shardstock::*;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Deducts dropped at every suspension point: afterwards each request has had one full effect or
// none, a retry with its id replays (or applies, when the dropped one never did), and the user
// is not left busy.

async fn dropped_deducts(e: Engine<RedisStore>, tag: &'static str) {
    let s = sku("drop");
    let generation = e
        .load(&s, 1000, LoadOptions::new(4).per_user_limit(1))
        .await
        .unwrap();
    e.remaining(&s).await.unwrap(); // cache the layout: drops land inside the deduction
    let mut dropped = Vec::new();
    let mut completed = 0u64;
    for i in 0..18u64 {
        let k = 1 + i as usize % 6;
        let req = d("drop", &format!("u{i}"), 1, &format!("a{i}"));
        match drop_at(e.deduct(&req), k).await {
            None => dropped.push((i, k)),
            Some(r) => completed += r.unwrap().units_applied(),
        }
    }
    assert!(!dropped.is_empty(), "[{tag}] no drop point hit");
    let mut bad = Vec::new();
    let checks = dropped.iter().map(|&(i, k)| {
        let e = e.clone();
        async move {
            // A retry of the dropped request: applied now, or a replay of its effect.
            let again = d("drop", &format!("u{i}"), 1, &format!("a{i}"));
            let (retry, busy) = until_not_busy(&e, &again, Duration::from_millis(1500)).await;
            // A fresh request of the user: the limit (1) is used by exactly that one effect.
            let fresh = d("drop", &format!("u{i}"), 1, &format!("b{i}"));
            let (next, busy2) = until_not_busy(&e, &fresh, Duration::from_millis(1500)).await;
            (i, k, retry, next, busy + busy2)
        }
    });
    for (i, k, retry, next, busy) in join_all(checks).await {
        let (u, r) = (uid(&format!("u{i}")), rid(&format!("a{i}")));
        let h = home_of(u.as_str(), r.as_str(), 4, true);
        let rec = e
            .store()
            .record(at(&s, generation, h), &u, &r)
            .await
            .unwrap();
        let ok = matches!(
            retry,
            Ok(Deduction::Applied { .. } | Deduction::Replayed { .. })
        ) && matches!(next, Ok(Deduction::LimitReached { limit: 1 }))
            && matches!(&rec, Some(r) if r.state == RecordState::Sold);
        if !ok {
            bad.push(format!(
                "u{i} (a{i} dropped at suspension {k}): retry {retry:?}, fresh b{i} {next:?} (after {busy} user_busy), record {rec:?}"
            ));
        }
    }
    assert!(bad.is_empty(), "[{tag}]\n  {}", bad.join("\n  "));
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(
        (a.sold, a.in_transit),
        (completed + dropped.len() as u64, 0),
        "[{tag}] every user got exactly one unit: {a:?}"
    );
}

// One thread: fred's tasks move only when the test yields, so every command is a suspension
// point (on a multi-threaded runtime a loaded CPU can preempt a poll until the reply is there,
// and the whole deduction finishes in one poll: no drop point is hit).
#[tokio::test(flavor = "current_thread")]
async fn dropped_deducts_have_one_effect_and_replay() {
    let srv = RedisServer::start();
    let (_, r, c) = three(&srv, quick()).await;
    run_all(
        false,
        vec![
            ("redis", dropped_deducts(r, "redis").boxed()),
            ("coalesced", dropped_deducts(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// A deduction that must move units home (15 units, 10 per segment), dropped at each of its
// suspension points: the units it left in transit are credited by the sweeper once the
// transfer lease ran out; the request sold all 15 units or none, and its retry says which.

async fn dropped_mid_transfer(e: Engine<RedisStore>, tag: &'static str) {
    let lease = e.options().transfer_lease;
    let mut points = Vec::new();
    for i in 0..10u64 {
        let s = sku(&format!("mid{i}"));
        e.load(&s, 40, LoadOptions::new(4).per_user_limit(0))
            .await
            .unwrap();
        e.remaining(&s).await.unwrap();
        let k = 1 + i as usize;
        let req = d(s.as_str(), "z", 15, &format!("z{i}"));
        let r = drop_at(e.deduct(&req), k).await;
        points.push((s, k, r.is_none()));
    }
    let mut left_in_transit = 0;
    for (s, _, _) in &points {
        left_in_transit += e.audit(s).await.unwrap().in_transit;
    }
    for (i, (s, k, dropped)) in points.iter().enumerate() {
        let a = swept(&e, s, lease + Duration::from_secs(3), tag).await;
        assert!(
            (a.sold, a.remaining) == (0, 40) || (a.sold, a.remaining) == (15, 25),
            "[{tag}] {s} (dropped at suspension {k}: {dropped}): {a:?}"
        );
        let before = a.sold;
        let retry = e.deduct(&d(s.as_str(), "z", 15, &format!("z{i}"))).await;
        let a = audit_ok(&e, s, tag).await;
        let ok = match &retry {
            Ok(Deduction::Replayed { .. }) => before == 15,
            Ok(Deduction::Applied { .. }) => before == 0,
            _ => false,
        };
        assert!(
            ok && a.sold == 15 && a.in_transit == 0,
            "[{tag}] {s} (dropped at suspension {k}): sold {before} before the retry; retry got {retry:?}; {a:?}"
        );
    }
    eprintln!(
        "[{tag}] dropped mid-transfer: {left_in_transit} units were in transit before the sweeps"
    );
    assert!(
        left_in_transit > 0,
        "[{tag}] no drop point left units in transit: the crash point between debit and credit was never hit"
    );
}

// One thread: fred's tasks move only when the test yields, so every command is a suspension
// point (on a multi-threaded runtime a loaded CPU can preempt a poll until the reply is there,
// and the whole deduction finishes in one poll: no drop point is hit).
#[tokio::test(flavor = "current_thread")]
async fn dropped_mid_transfer_units_are_swept_home() {
    let srv = RedisServer::start();
    let (_, r, c) = three(&srv, quick()).await;
    run_all(
        false,
        vec![
            ("redis", dropped_mid_transfer(r, "redis").boxed()),
            ("coalesced", dropped_mid_transfer(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// The engine dies after the donor's debit and before the home credit (played with a store-level
// transfer, then nothing): the units are in transit (the audit balances with them), no sweep
// credits them before the lease runs out, the sweeper does after; the dead engine's late
// credit, re-sent, applies nothing more.

async fn died_after_debit<S: Store>(e: Engine<S>, tag: &'static str) {
    let lease = e.options().transfer_lease;
    let s = sku("died");
    let g = e
        .load(&s, 10, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap(); // [5, 5]
    let t = TransferArgs {
        id: 0xdead_beef_dead_beef,
        dest: 1,
        want: 3,
        floor: 0,
        lease_ms: lease.as_millis() as u64,
    };
    let debited = Instant::now();
    let r = e.store().transfer(at(&s, g, 0), t).await.unwrap();
    assert_eq!(
        r,
        TransferReply::Debited {
            units: 3,
            stock_after: 2
        },
        "[{tag}]"
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!((a.remaining, a.in_transit), (7, 3), "[{tag}] {a:?}");
    e.sweep().await.unwrap();
    if debited.elapsed() < lease {
        let a = audit_ok(&e, &s, tag).await;
        assert_eq!(
            a.in_transit, 3,
            "[{tag}] swept before the lease ran out: {a:?}"
        );
    }
    tokio::time::sleep(lease).await;
    let a = swept(&e, &s, Duration::from_secs(3), tag).await;
    assert_eq!(
        (
            a.remaining,
            a.segments[1].state.stock,
            a.segments[1].state.moved_in
        ),
        (10, 8, 3),
        "[{tag}] {a:?}"
    );
    // The dead engine wakes up and sends its sale with the credit, twice (a re-send).
    let credit = [Credit {
        id: t.id,
        donor: 0,
        units: 3,
    }];
    let (u, r) = (uid("late"), rid("late-1"));
    for _ in 0..2 {
        let reply = e
            .store()
            .sell(at(&s, g, 1), sell_args(&e, &r, &u, 8, 0, &credit))
            .await
            .unwrap();
        assert!(
            matches!(
                reply,
                SellReply::Applied { stock_after: 0 } | SellReply::Replay
            ),
            "[{tag}] {reply:?}"
        );
    }
    assert_eq!(
        credit_only(&e, at(&s, g, 1), &credit).await,
        SellReply::Applied { stock_after: 0 }
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(
        (
            a.remaining,
            a.sold,
            a.in_transit,
            a.segments[1].state.moved_in
        ),
        (2, 8, 0, 3),
        "[{tag}] the credit applied once: {a:?}"
    );
    // The last units still sell, moved from the donor.
    let r = e.deduct(&d("died", "last", 2, "last-1")).await.unwrap();
    assert_eq!(r.units_applied(), 2, "[{tag}] {r:?}");
    let r = e.deduct(&d("died", "more", 1, "more-1")).await.unwrap();
    assert_eq!(r, Deduction::SoldOut, "[{tag}]");
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(
        (a.remaining, a.sold, a.in_transit),
        (0, 10, 0),
        "[{tag}] {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_dying_between_debit_and_credit_is_swept() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick()).await;
    run_all(
        true,
        vec![
            ("memory", died_after_debit(m, "memory").boxed()),
            ("redis", died_after_debit(r, "redis").boxed()),
            ("coalesced", died_after_debit(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// The sweeper racing the credit of the engine that moved the units (its lease ran out at once):
// whichever comes first, the units are credited once and the transfer ends done.

async fn sweeper_races_credit<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("race");
    let g = e
        .load(&s, 200, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap(); // [100, 100]
    e.remaining(&s).await.unwrap(); // the sweeper knows the SKU
    let mut sold = 0;
    for round in 0..40u64 {
        let t = TransferArgs {
            id: 1000 + round,
            dest: 1,
            want: 2,
            floor: 0,
            lease_ms: 1,
        };
        let r = e.store().transfer(at(&s, g, 0), t).await.unwrap();
        assert!(
            matches!(r, TransferReply::Debited { units: 2, .. }),
            "[{tag}] {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
        let credit = [Credit {
            id: t.id,
            donor: 0,
            units: 2,
        }];
        let (u, r) = (uid(&format!("o{round}")), rid(&format!("or{round}")));
        let owner = async {
            e.store()
                .sell(at(&s, g, 1), sell_args(&e, &r, &u, 1, 0, &credit))
                .await
                .unwrap()
        };
        let (reply, swept) = futures::join!(owner, e.sweep());
        swept.unwrap();
        assert!(
            matches!(reply, SellReply::Applied { .. }),
            "[{tag}] round {round}: {reply:?}"
        );
        sold += 1;
        // The owner marks its transfer done (best effort, as the engine does).
        e.store().transfer_done(at(&s, g, 0), t.id).await.unwrap();
        let a = audit_ok(&e, &s, tag).await;
        assert_eq!(
            (
                a.in_transit,
                a.sold,
                a.segments[0].state.moved_out,
                a.segments[1].state.moved_in
            ),
            (0, sold, 2 * (round + 1), 2 * (round + 1)),
            "[{tag}] round {round}: {a:?}"
        );
    }
    let due = e.store().transfers_due(at(&s, g, 0), 100).await.unwrap();
    assert_eq!(due, vec![], "[{tag}]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_racing_a_credit_credits_once() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick()).await;
    run_all(
        true,
        vec![
            ("memory", sweeper_races_credit(m, "memory").boxed()),
            ("redis", sweeper_races_credit(r, "redis").boxed()),
            ("coalesced", sweeper_races_credit(c, "coalesced").boxed()),
        ],
    )
    .await;
}
