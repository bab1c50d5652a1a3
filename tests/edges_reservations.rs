//! Edge cases of reservations: a TTL as long as the request TTL, an expired reservation whose
//! per-user entry stayed pending, and the audit of reserved units held by nothing.
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
use shardstock::segments::home;
use shardstock::store::{HomeReply, OnShort, UserClaim};
use shardstock::*;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// 2. A reservation whose TTL equals (or is close to) request_ttl still returns its units.

async fn e02<S: Store>(e: Engine<S>, tag: &'static str) {
    let rt = e.options().request_ttl;
    let s = sku("ttl");
    e.load(&s, 10, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap();
    held(
        e.reserve(&d("ttl", "u1", 1, "rv-1"), rt).await,
        "rv-1 (ttl = request_ttl)",
    );
    held(
        e.reserve(&d("ttl", "u2", 1, "rv-2"), rt - Duration::from_millis(10))
            .await,
        "rv-2 (ttl = request_ttl - 10 ms)",
    );
    // Held by the fallback, on a part record of another segment (take.lua): stock [1, 0]
    // and a request whose home is the empty segment 1.
    let f = sku("ttlfb");
    e.load(&f, 1, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap();
    let fid = homed("fb-", 2, 1, 1).remove(0);
    let (_, parts) = held(
        e.reserve(&d("ttlfb", "u3", 1, &fid), rt).await,
        "fallback reservation",
    );
    assert_eq!(parts[0].segment, 0, "[{tag}] {parts:?}");
    let start = Instant::now();
    tokio::time::sleep(rt + Duration::from_millis(300)).await;
    let deadline = start + rt + Duration::from_secs(2);
    let (a, b) = loop {
        e.sweep().await.unwrap();
        let a = e.audit(&s).await.unwrap();
        let b = e.audit(&f).await.unwrap();
        let back = a.reserved == 0 && a.remaining == 10 && b.reserved == 0 && b.remaining == 1;
        if back || Instant::now() > deadline {
            break (a, b);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        (a.remaining, a.reserved, a.sold) == (10, 0, 0)
            && (b.remaining, b.reserved, b.sold) == (1, 0, 0),
        "[{tag}] reservations with ttl = request_ttl (and request_ttl - 10 ms) expired {:?} ago but their units did not come back (swept): home-held {a:?}; fallback-held {b:?}",
        start.elapsed().saturating_sub(rt)
    );
    audit_ok(&e, &s, tag).await;
    audit_ok(&e, &f, tag).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e02_reservation_ttl_as_long_as_request_ttl_returns_its_units() {
    let srv = RedisServer::start();
    let b = Engine::builder()
        .request_ttl(Duration::from_millis(1000))
        .claim_lease(Duration::from_millis(300))
        .user_claim_ttl(Duration::from_millis(1000));
    let (m, r, c) = three(&srv, b).await;
    run_all(
        true,
        vec![
            ("memory", e02(m, "memory").boxed()),
            ("redis", e02(r, "redis").boxed()),
            ("coalesced", e02(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// 6. A reservation whose user entry stayed pending, then expired, does not keep the user at
//    the limit.

async fn e06<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("pendresv");
    let generation = e
        .load(&s, 10, LoadOptions::new(2).per_user_limit(1))
        .await
        .unwrap();
    let (r1, u) = (rid("r1"), uid("ursula"));
    let claim = e
        .store()
        .user_claim(&s, generation, args(&e, &r1, &u, 1, 0), 1, 200)
        .await
        .unwrap();
    assert_eq!(claim, UserClaim::Ok, "[{tag}]");
    let resv_ms = 700;
    let placed = e
        .store()
        .deduct_home(
            at(&s, generation, home(&r1, 2)),
            args(&e, &r1, &u, 1, resv_ms),
            OnShort::Report,
        )
        .await
        .unwrap();
    assert!(
        matches!(placed, HomeReply::Applied { .. }),
        "[{tag}] {placed:?}"
    );
    let placed_at = Instant::now();
    // The process died before marking the entry reserved. Past the claim's expiry but while
    // the reservation lives, the user gets nothing more.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = e.deduct(&d("pendresv", "ursula", 1, "r2")).await.unwrap();
    if placed_at.elapsed() < Duration::from_millis(resv_ms) {
        assert!(
            matches!(r, Deduction::LimitReached { .. } | Deduction::UserBusy),
            "[{tag}] ursula's reservation r1 is live: {r:?}"
        );
    }
    // Once it expired, she is not at the limit.
    let mut last = r;
    while placed_at.elapsed() < Duration::from_millis(resv_ms + 1500) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if placed_at.elapsed() < Duration::from_millis(resv_ms) {
            continue;
        }
        last = e.deduct(&d("pendresv", "ursula", 1, "r2")).await.unwrap();
        if last.units_applied() == 1 {
            break;
        }
    }
    assert_eq!(
        last.units_applied(),
        1,
        "[{tag}] ursula's only reservation (user entry left pending) expired {:?} ago; she still gets {last:?}",
        placed_at.elapsed() - Duration::from_millis(resv_ms)
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(
        (a.sold, a.reserved, a.remaining),
        (1, 0, 9),
        "[{tag}] {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e06_expired_reservation_with_pending_user_entry_frees_the_user() {
    let srv = RedisServer::start();
    let b = quick()
        .claim_lease(Duration::from_millis(100))
        .user_claim_ttl(Duration::from_millis(200));
    let (m, r, c) = three(&srv, b).await;
    run_all(
        true,
        vec![
            ("memory", e06(m, "memory").boxed()),
            ("redis", e06(r, "redis").boxed()),
            ("coalesced", e06(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// 13. The audit checks each segment's `reserved` against the live reservations holding it.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e13_audit_sees_reserved_units_held_by_nothing() {
    let srv = RedisServer::start();
    let e = redis_engine(&srv, quick().per_user_limit(0)).await;
    let ttl = Duration::from_secs(30);

    // No false alarm: live, confirmed and cancelled reservations, sales, and a reservation
    // held by the fallback on another segment.
    let s = sku("leak");
    e.load(&s, 20, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for k in 0..4 {
        let (id, _) = held(
            e.reserve(&d("leak", &format!("l{k}"), 1, &format!("lr{k}")), ttl)
                .await,
            "baseline",
        );
        ids.push(id);
    }
    assert!(e.confirm(&ids[0]).await.unwrap().done);
    assert!(e.cancel(&ids[1]).await.unwrap().done);
    for k in 0..2 {
        let r = e
            .deduct(&d("leak", &format!("s{k}"), 1, &format!("ls{k}")))
            .await
            .unwrap();
        assert_eq!(r.units_applied(), 1);
    }
    let f = sku("leakfb");
    e.load(&f, 1, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap();
    let fid = homed("lfb-", 2, 1, 1).remove(0);
    held(
        e.reserve(&d("leakfb", "lf", 1, &fid), ttl).await,
        "fallback",
    );
    let a = audit_ok(&e, &s, "baseline").await;
    assert_eq!((a.reserved, a.sold, a.remaining), (2, 3, 15), "{a:?}");
    let a = audit_ok(&e, &f, "baseline fallback").await;
    assert_eq!((a.reserved, a.remaining), (1, 0), "{a:?}");

    // Three leaks, each on its own SKU: a unit held by nothing.
    let mut missed = Vec::new();
    for leak in ["hincrby", "del-record", "zrem-index"] {
        let name = format!("leak-{leak}");
        let s = sku(&name);
        let g = e
            .load(&s, 10, LoadOptions::new(2).per_user_limit(0))
            .await
            .unwrap();
        let (_, parts) = held(e.reserve(&d(&name, "v", 1, "lv"), ttl).await, leak);
        let seg = parts[0].segment;
        let seg_key = format!("t:{{{name}#{seg}}}:seg");
        let rec_key = format!("t:{{{name}#{seg}}}:g{g}:rq:lv");
        let index_key = format!("t:{{{name}#{seg}}}:g{g}:resv");
        audit_ok(&e, &s, leak).await;
        match leak {
            "hincrby" => {
                // One more unit moved from stock to reserved: the counters still add up.
                assert_eq!(srv.cli(&["HINCRBY", &seg_key, "reserved", "1"]), "2");
                srv.cli(&["HINCRBY", &seg_key, "stock", "-1"]);
            }
            "del-record" => assert_eq!(srv.cli(&["DEL", &rec_key]), "1"),
            _ => assert_eq!(srv.cli(&["ZREM", &index_key, &rec_key]), "1"),
        }
        let a = e.audit(&s).await.unwrap();
        let named = a
            .problems
            .iter()
            .any(|p| p.contains(&format!("segment {seg}")));
        if a.ok || !named {
            missed.push(format!(
                "{leak} (segment {seg}): ok {} problems {:?}; {a:?}",
                a.ok, a.problems
            ));
        }
    }
    assert!(
        missed.is_empty(),
        "the audit did not name a segment whose reserved units no live reservation holds:\n  {}",
        missed.join("\n  ")
    );
}
