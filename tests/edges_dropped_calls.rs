//! Edge cases of calls that never finish: futures dropped at every suspension point, a pending
//! claim of another request (user_busy, never limit_reached), and multi-segment fallbacks
//! abandoned mid-way (repaired by the sweeper).
//!
//! Each asserts the behaviour promised after the fixes of issue 11, against real stores: the
//! embedded `MemoryStore` and `redis-server` processes (plain and with request coalescing).
//! Crash points are simulated with store-level calls (`engine.store()`) or by dropping futures.
//! Where a case runs on several stores, every store runs to its end and the test then fails
//! with each store's failure, named (`[redis] ...`). Shared helpers: `tests/common/edges.rs`.

mod common;
use common::edges::*;
use common::*;
use futures::FutureExt;
use futures::future::join_all;
use shardstock::segments::home;
use shardstock::store::{HomeReply, OnShort, RecordState, SegmentRole, TakeReply, UserClaim};
use shardstock::*;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// 4. A dropped deduct future does not leave the user busy; a pending claim answers UserBusy,
//    never LimitReached.

/// Another request of the user is pending in the store (claimed, not finished): UserBusy
/// until it expires, then the user buys.
async fn e04_pending<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("busy");
    let generation = e
        .load(&s, 100, LoadOptions::new(4).per_user_limit(1))
        .await
        .unwrap();
    let (p1, walt) = (rid("p1"), uid("walt"));
    let claim = e
        .store()
        .user_claim(&s, generation, args(&e, &p1, &walt, 1, 0), 1, 600)
        .await
        .unwrap();
    assert_eq!(claim, UserClaim::Ok, "[{tag}]");
    let r = e.deduct(&d("busy", "walt", 1, "p2")).await.unwrap();
    assert_eq!(
        r,
        Deduction::UserBusy,
        "[{tag}] walt's other request p1 is pending (claim not expired) and he holds nothing: expected UserBusy, not {r:?}"
    );
    let (r, busy) = until_not_busy(&e, &d("busy", "walt", 1, "p2"), Duration::from_secs(2)).await;
    assert_eq!(
        r.as_ref().map(Deduction::units_applied).ok(),
        Some(1),
        "[{tag}] walt's pending p1 expired after 600 ms: p2 got {r:?} (after {busy} UserBusy)"
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(a.sold, 1, "[{tag}] {a:?}");
}

/// Deducts dropped at every suspension point (each user once): afterwards each user can buy
/// with a fresh id within ~1.5 s — unless the dropped attempt sold (then LimitReached).
async fn e04_dropped<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("drop");
    let generation = e
        .load(&s, 1000, LoadOptions::new(4).per_user_limit(1))
        .await
        .unwrap();
    e.remaining(&s).await.unwrap(); // cache the layout: drops land inside the deduction
    let mut dropped = Vec::new();
    let mut completed = 0u64;
    for i in 0..18u64 {
        let k = 1 + i as usize % 6; // every suspension point (a deduction has ~4), three times
        let req = d("drop", &format!("u{i}"), 1, &format!("a{i}"));
        match drop_at(e.deduct(&req), k).await {
            None => dropped.push((i, k)),
            Some(r) => completed += r.unwrap().units_applied(),
        }
    }
    assert!(
        dropped.len() >= 4,
        "[{tag}] only {} drop points hit",
        dropped.len()
    );
    let polls = dropped.iter().map(|&(i, k)| {
        let e = e.clone();
        async move {
            let t = Instant::now();
            let req = d("drop", &format!("u{i}"), 1, &format!("b{i}"));
            let (r, busy) = until_not_busy(&e, &req, Duration::from_millis(1500)).await;
            (i, k, r, busy, t.elapsed())
        }
    });
    let mut bad = Vec::new();
    let mut sold = completed;
    for (i, k, r, busy, took) in join_all(polls).await {
        let a = rid(&format!("a{i}"));
        let rec = e
            .store()
            .record(at(&s, generation, home(&a, 4)), &a)
            .await
            .unwrap();
        let a_sold = matches!(rec, Some(r) if matches!(r.state, RecordState::Applied(_)));
        let ok = match &r {
            Ok(Deduction::Applied { .. }) => !a_sold,
            Ok(Deduction::LimitReached { limit: 1 }) => a_sold,
            _ => false,
        };
        sold += u64::from(a_sold) + r.as_ref().map_or(0, Deduction::units_applied);
        if !ok {
            bad.push(format!(
                "u{i}: a{i} dropped at suspension {k} (it sold: {a_sold}); fresh b{i} got {r:?} after {busy} UserBusy / {took:?}"
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "[{tag}] {} of {} users with a dropped attempt could not buy within 1.5 s:\n  {}",
        bad.len(),
        dropped.len(),
        bad.join("\n  ")
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(a.sold, sold, "[{tag}] {a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e04_dropped_deduct_does_not_leave_the_user_busy() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick()).await;
    let mut failures = run(
        true,
        vec![
            ("memory pending", e04_pending(m, "memory").boxed()),
            ("redis pending", e04_pending(r.clone(), "redis").boxed()),
            (
                "coalesced pending",
                e04_pending(c.clone(), "coalesced").boxed(),
            ),
        ],
    )
    .await;
    // The memory store's deduction never suspends: there is no point to drop it at.
    failures.extend(
        run(
            false,
            vec![
                ("redis dropped", e04_dropped(r, "redis").boxed()),
                ("coalesced dropped", e04_dropped(c, "coalesced").boxed()),
            ],
        )
        .await,
    );
    check(failures);
}

// ---------------------------------------------------------------------------------------------
// 5. A multi-segment fallback abandoned mid-way is repaired by the sweeper once the claim
//    lease passed.

async fn e05_simulated<S: Store>(e: Engine<S>, tag: &'static str) {
    let store = e.store();
    let lease = e.options().claim_lease;

    // (a) Claimed at home (short), 2 of 3 units taken at the other segment, then nothing.
    let s = sku("half");
    let g = e
        .load(&s, 4, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap(); // [2, 2]
    let (x, hx) = (rid("h-x"), uid("hx"));
    let (h, o) = (home(&x, 2), 1 - home(&x, 2));
    let ax = args(&e, &x, &hx, 3, 0);
    let r = store
        .deduct_home(at(&s, g, h), ax, OnShort::Claim)
        .await
        .unwrap();
    assert!(
        matches!(
            r,
            HomeReply::Short {
                claimed: Some(1),
                ..
            }
        ),
        "[{tag}] {r:?}"
    );
    let r = store
        .take(at(&s, g, o), ax, 2, 1, SegmentRole::Fallback)
        .await
        .unwrap();
    assert!(
        matches!(r, TakeReply::Taken { part: 2, .. }),
        "[{tag}] {r:?}"
    );

    // (b) Claimed at home, every part taken (2 at home, 2 at the other), never settled.
    let f = sku("full");
    let gf = e
        .load(&f, 6, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap(); // [3, 3]
    let (y, fy) = (rid("f-y"), uid("fy"));
    let (hy, oy) = (home(&y, 2), 1 - home(&y, 2));
    let ay = args(&e, &y, &fy, 4, 0);
    let r = store
        .deduct_home(at(&f, gf, hy), ay, OnShort::Claim)
        .await
        .unwrap();
    assert!(
        matches!(
            r,
            HomeReply::Short {
                claimed: Some(1),
                ..
            }
        ),
        "[{tag}] {r:?}"
    );
    for (seg, role) in [(hy, SegmentRole::Home), (oy, SegmentRole::Fallback)] {
        let r = store.take(at(&f, gf, seg), ay, 2, 1, role).await.unwrap();
        assert!(
            matches!(r, TakeReply::Taken { part: 2, .. }),
            "[{tag}] {r:?}"
        );
    }

    // The engine knows both SKUs; its sweeper repairs them once the lease passed.
    e.remaining(&s).await.unwrap();
    e.remaining(&f).await.unwrap();
    let start = Instant::now();
    let (a, settled) = loop {
        e.sweep().await.unwrap();
        let a = e.audit(&s).await.unwrap();
        let rec = store.record(at(&f, gf, hy), &y).await.unwrap();
        let settled = matches!(&rec, Some(r) if matches!(r.state, RecordState::Applied(_)));
        let done = a.remaining == 4 && a.sold == 0 && settled;
        if done || start.elapsed() > lease + Duration::from_secs(2) {
            break (a, rec);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let full_settled = matches!(&settled, Some(r) if matches!(r.state, RecordState::Applied(_)));
    assert!(
        (a.remaining, a.sold, a.reserved) == (4, 0, 0) && full_settled,
        "[{tag}] abandoned fallbacks, swept for {:?} (lease {lease:?}): (a) 2 of 3 units taken, expected them back (remaining 4, sold 0): {a:?}; (b) every part taken, expected the claim settled as applied: record {settled:?}",
        start.elapsed()
    );
    let retry = e.deduct(&d("half", "hx", 3, "h-x")).await;
    assert!(
        matches!(retry, Err(Error::Sealed(_))),
        "[{tag}] retry of the repaired (sealed) claim h-x: {retry:?}"
    );
    let retry = e.deduct(&d("full", "fy", 4, "f-y")).await.unwrap();
    assert!(
        matches!(&retry, Deduction::Replayed { parts } if parts.iter().map(|p| p.units).sum::<u64>() == 4),
        "[{tag}] retry of the settled claim f-y: {retry:?}"
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!((a.remaining, a.sold), (4, 0), "[{tag}] {a:?}");
    let a = audit_ok(&e, &f, tag).await;
    assert_eq!((a.remaining, a.sold), (2, 4), "[{tag}] {a:?}");
}

/// The same, with deduct futures dropped at every suspension point of a multi-segment
/// fallback (it has ~6): each of 10 SKUs has 4 × 10 units and one request for 15 (always
/// split), dropped at its k-th suspension. All parts taken: the claim must be settled.
async fn e05_dropped(e: Engine<RedisStore>, tag: &'static str) {
    let lease = e.options().claim_lease;
    let n = 10u64;
    let mut points = Vec::new();
    for i in 0..n {
        let s = sku(&format!("fb{i}"));
        e.load(&s, 40, LoadOptions::new(4).per_user_limit(0))
            .await
            .unwrap();
        e.remaining(&s).await.unwrap();
        let k = 1 + i as usize;
        let req = d(s.as_str(), "z", 15, &format!("z{i}"));
        let r = drop_at(e.deduct(&req), k).await;
        points.push((s, k, r.is_none()));
    }
    let start = Instant::now();
    let bad = loop {
        e.sweep().await.unwrap();
        let mut bad = Vec::new();
        for (i, (s, k, dropped)) in points.iter().enumerate() {
            let a = e.audit(s).await.unwrap();
            let z = rid(&format!("z{i}"));
            let home_at = at(s, a.generation, home(&z, 4));
            let settled = a.sold != 15
                || matches!(e.store().record(home_at, &z).await,
                    Ok(Some(r)) if matches!(r.state, RecordState::Applied(_)));
            let clean = (a.sold == 0 && a.remaining == 40) || (a.sold == 15 && a.remaining == 25);
            if !clean || !settled || a.reserved != 0 {
                bad.push(format!(
                    "{s} (dropped at suspension {k}: {dropped}): sold {} remaining {} reserved {}, claim settled: {settled}",
                    a.sold, a.remaining, a.reserved
                ));
            }
        }
        if bad.is_empty() || start.elapsed() > lease + Duration::from_secs(3) {
            break bad;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        bad.is_empty(),
        "[{tag}] {} of {n} SKUs still hold units of an abandoned fallback {:?} later (lease {lease:?}, swept):\n  {}",
        bad.len(),
        start.elapsed(),
        bad.join("\n  ")
    );
    for (i, (s, k, _)) in points.iter().enumerate() {
        let before = e.audit(s).await.unwrap().sold;
        let retry = e.deduct(&d(s.as_str(), "z", 15, &format!("z{i}"))).await;
        let a = audit_ok(&e, s, tag).await;
        let ok = match &retry {
            Ok(Deduction::Replayed { .. }) => before == 15 && a.sold == 15,
            Ok(Deduction::Applied { .. }) => before == 0 && a.sold == 15,
            Err(Error::Sealed(_)) => before == 0 && a.sold == 0,
            _ => false,
        };
        assert!(
            ok,
            "[{tag}] {s} (dropped at suspension {k}): sold {before} before the retry; retry got {retry:?}; {a:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e05_abandoned_multi_segment_fallback_is_repaired_by_the_sweeper() {
    let srv = RedisServer::start();
    let b = quick().per_user_limit(0);
    let (m, r, c) = three(&srv, b).await;
    let mut failures = run(
        true,
        vec![
            ("memory", e05_simulated(m, "memory").boxed()),
            ("redis", e05_simulated(r.clone(), "redis").boxed()),
            ("coalesced", e05_simulated(c.clone(), "coalesced").boxed()),
        ],
    )
    .await;
    failures.extend(
        run(
            false,
            vec![
                ("redis dropped", e05_dropped(r, "redis").boxed()),
                ("coalesced dropped", e05_dropped(c, "coalesced").boxed()),
            ],
        )
        .await,
    );
    check(failures);
}
