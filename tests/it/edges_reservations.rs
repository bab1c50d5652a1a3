//! Edge cases of reservations: held at the request's home (units moved there first when it is
//! short); expiry returns them exactly once — lazily inside any script of the segment, or by
//! the sweeper — also with a TTL as long as `request_ttl`; confirm after expiry sells nothing;
//! confirm and cancel racing end it once; an expired reservation gives its user's chance back;
//! and the audit names reserved units that no live reservation holds.
//!
//! Each runs against real stores: the embedded `MemoryStore` and `redis-server` processes
//! (plain and with request coalescing). Where a case runs on several stores, every store runs
//! to its end and the test then fails with each store's failure, named (`[redis] ...`).
//! Shared helpers: `tests/it/common/edges.rs`.

use crate::common;
use common::edges::*;
use common::*;
use futures::FutureExt;
use futures::future::join_all;
use shardstock::store::ResvState;
use shardstock::*;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// A reservation whose TTL equals (or is close to) request_ttl still returns its units; so does
// one held at a home that had to move the units in first.

async fn ttl_as_long_as_request_ttl<S: Store>(e: Engine<S>, tag: &'static str) {
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
    // Stock [1, 0] and a request whose home is the empty segment 1: the unit moves home by a
    // transfer, then is held there.
    let f = sku("ttlmv");
    e.load(&f, 1, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap();
    let fid = ids_homed("mv-", "u3", 2, 1, 1).remove(0);
    let (id, segment) = held(
        e.reserve(&d("ttlmv", "u3", 1, &fid), rt).await,
        "moved reservation",
    );
    assert_eq!((id.segment(), segment), (1, 1), "[{tag}] {id}");
    let a = audit_ok(&e, &f, tag).await;
    assert_eq!(
        (a.reserved, a.in_transit, a.segments[1].state.moved_in),
        (1, 0, 1),
        "[{tag}] {a:?}"
    );
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
            && (b.remaining, b.reserved, b.sold, b.segments[1].state.stock) == (1, 0, 0, 1),
        "[{tag}] reservations with ttl = request_ttl (and request_ttl - 10 ms) expired {:?} ago but their units did not come back (swept): {a:?}; moved home: {b:?}",
        start.elapsed().saturating_sub(rt)
    );
    let c = e.confirm(&id).await.unwrap();
    assert_eq!(
        c,
        ReservationEnd {
            state: Some(ResvState::Expired),
            done: false
        },
        "[{tag}] confirm after expiry"
    );
    audit_ok(&e, &s, tag).await;
    let b = audit_ok(&e, &f, tag).await;
    assert_eq!(
        b.sold, 0,
        "[{tag}] a confirm after expiry sold something: {b:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservation_ttl_as_long_as_request_ttl_returns_its_units() {
    let srv = RedisServer::start();
    let b = quick().request_ttl(Duration::from_millis(1000));
    let (m, r, c) = three(&srv, b).await;
    run_all(
        true,
        vec![
            ("memory", ttl_as_long_as_request_ttl(m, "memory").boxed()),
            ("redis", ttl_as_long_as_request_ttl(r, "redis").boxed()),
            (
                "coalesced",
                ttl_as_long_as_request_ttl(c, "coalesced").boxed(),
            ),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Expiry without a sweeper: the next script of the segment returns the units, and a sale
// takes them. Confirm or cancel after expiry changes nothing; confirm twice is harmless; a
// cancelled reservation cannot be confirmed.

async fn lazy_expiry<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("lazy");
    e.load(&s, 3, LoadOptions::new(1).per_user_limit(0))
        .await
        .unwrap();
    let ttl = Duration::from_millis(150);
    let (r1, _) = held(e.reserve(&d("lazy", "a", 2, "l1"), ttl).await, "l1");
    let (r2, _) = held(
        e.reserve(&d("lazy", "b", 1, "l2"), Duration::from_secs(30))
            .await,
        "l2",
    );
    let r = e.deduct(&d("lazy", "c", 1, "l3")).await.unwrap();
    assert_eq!(r, Deduction::SoldOut, "[{tag}] everything is held");
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    // No sweep: the sale's own script returns l1's units.
    let r = e.deduct(&d("lazy", "c", 2, "l4")).await.unwrap();
    assert_eq!(r.units_applied(), 2, "[{tag}] {r:?}");
    for (what, end) in [
        ("confirm", e.confirm(&r1).await),
        ("cancel", e.cancel(&r1).await),
    ] {
        assert_eq!(
            end.unwrap(),
            ReservationEnd {
                state: Some(ResvState::Expired),
                done: false
            },
            "[{tag}] {what} of an expired reservation"
        );
    }
    let first = e.confirm(&r2).await.unwrap();
    let second = e.confirm(&r2).await.unwrap();
    let confirmed = ReservationEnd {
        state: Some(ResvState::Confirmed),
        done: true,
    };
    assert_eq!(
        (first, second),
        (confirmed, confirmed),
        "[{tag}] confirm twice"
    );
    let c = e.cancel(&r2).await.unwrap();
    assert_eq!(
        c,
        ReservationEnd {
            state: Some(ResvState::Confirmed),
            done: false
        },
        "[{tag}] cancel of a confirmed reservation"
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(
        (a.remaining, a.reserved, a.sold),
        (0, 0, 3),
        "[{tag}] {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_returns_units_without_a_sweeper_and_ends_the_reservation() {
    let srv = RedisServer::start();
    let b = quick().sold_out_ttl(Duration::ZERO);
    let (m, r, c) = three(&srv, b).await;
    run_all(
        true,
        vec![
            ("memory", lazy_expiry(m, "memory").boxed()),
            ("redis", lazy_expiry(r, "redis").boxed()),
            ("coalesced", lazy_expiry(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Confirm and cancel of one reservation racing (on two engines): exactly one wins, and the
// units end sold or back, never both.

async fn confirm_cancel_race<S: Store>(a: Engine<S>, b: Engine<S>, tag: &'static str) {
    let s = sku("race");
    a.load(&s, 40, LoadOptions::new(4).per_user_limit(1))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for k in 0..40 {
        let (id, _) = held(
            a.reserve(
                &d("race", &format!("r{k}"), 1, "x"),
                Duration::from_secs(30),
            )
            .await,
            "reserve",
        );
        ids.push(id);
    }
    let races = ids.iter().map(|id| {
        let (a, b) = (a.clone(), b.clone());
        async move {
            let (c, x) = futures::join!(a.confirm(id), b.cancel(id));
            (id.clone(), c.unwrap(), x.unwrap())
        }
    });
    let (mut confirmed, mut cancelled) = (0, 0);
    let mut bad = Vec::new();
    for (id, c, x) in join_all(races).await {
        match (c.done, x.done, c.state, x.state) {
            (true, false, Some(ResvState::Confirmed), Some(ResvState::Confirmed)) => confirmed += 1,
            (false, true, Some(ResvState::Cancelled), Some(ResvState::Cancelled)) => cancelled += 1,
            _ => bad.push(format!("{id}: confirm {c:?}, cancel {x:?}")),
        }
    }
    assert!(bad.is_empty(), "[{tag}] {}", bad.join("\n  "));
    let au = swept(&a, &s, Duration::from_secs(2), tag).await;
    assert_eq!(
        (au.sold, au.remaining, au.reserved),
        (confirmed, cancelled, 0),
        "[{tag}] {au:?}"
    );
    // A user whose reservation was cancelled may buy again (on either engine); a confirmed one
    // is at the limit.
    for (k, id) in ids.iter().enumerate() {
        let e = if k % 2 == 0 { &a } else { &b };
        let state = e.confirm(id).await.unwrap().state;
        let r = e
            .deduct(&d("race", &format!("r{k}"), 1, "y"))
            .await
            .unwrap();
        let ok = match state {
            Some(ResvState::Confirmed) => r == Deduction::LimitReached { limit: 1 },
            Some(ResvState::Cancelled) => r.units_applied() == 1 || r == Deduction::SoldOut,
            _ => false,
        };
        assert!(ok, "[{tag}] r{k} ({state:?}) asks again: {r:?}");
    }
    swept(&a, &s, Duration::from_secs(2), tag).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_and_cancel_racing_end_a_reservation_once() {
    let srv = RedisServer::start();
    let mem = MemoryStore::new();
    let (m1, m2) = (
        quick().build(mem.clone()).unwrap(),
        quick().build(mem).unwrap(),
    );
    let (r1, r2) = (
        redis_engine(&srv, quick()).await,
        redis_engine(&srv, quick()).await,
    );
    let c1 = coalesced_engine(&srv, quick(), Coalescing::default(), "c").await;
    let c2 = coalesced_engine(&srv, quick(), Coalescing::default(), "c").await;
    run_all(
        true,
        vec![
            ("memory", confirm_cancel_race(m1, m2, "memory").boxed()),
            ("redis", confirm_cancel_race(r1, r2, "redis").boxed()),
            (
                "coalesced",
                confirm_cancel_race(c1, c2, "coalesced").boxed(),
            ),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// An expired reservation gives its user's chance back (limit 1), on the engine that made it
// (whose in-process guard saw it) and on another.

async fn expired_frees_the_user<S: Store>(a: Engine<S>, b: Engine<S>, tag: &'static str) {
    let s = sku("free");
    a.load(&s, 10, LoadOptions::new(2).per_user_limit(1))
        .await
        .unwrap();
    let ttl = Duration::from_millis(300);
    for (user, other) in [("ursula", &b), ("vera", &a)] {
        let made = Instant::now();
        held(a.reserve(&d("free", user, 1, "r1"), ttl).await, user);
        for e in [&a, &b] {
            let r = e.deduct(&d("free", user, 1, "r2")).await.unwrap();
            if made.elapsed() < ttl {
                assert_eq!(
                    r,
                    Deduction::LimitReached { limit: 1 },
                    "[{tag}] {user}'s reservation r1 is live"
                );
            }
        }
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        let r = other.deduct(&d("free", user, 1, "r3")).await.unwrap();
        assert_eq!(
            r.units_applied(),
            1,
            "[{tag}] {user} after r1 expired: {r:?}"
        );
    }
    let a_ = audit_ok(&a, &s, tag).await;
    assert_eq!(
        (a_.sold, a_.reserved, a_.remaining),
        (2, 0, 8),
        "[{tag}] {a_:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_reservation_gives_the_user_chance_back() {
    let srv = RedisServer::start();
    let mem = MemoryStore::new();
    let (m1, m2) = (
        quick().build(mem.clone()).unwrap(),
        quick().build(mem).unwrap(),
    );
    let (r1, r2) = (
        redis_engine(&srv, quick()).await,
        redis_engine(&srv, quick()).await,
    );
    let c1 = coalesced_engine(&srv, quick(), Coalescing::default(), "c").await;
    let c2 = coalesced_engine(&srv, quick(), Coalescing::default(), "c").await;
    run_all(
        true,
        vec![
            ("memory", expired_frees_the_user(m1, m2, "memory").boxed()),
            ("redis", expired_frees_the_user(r1, r2, "redis").boxed()),
            (
                "coalesced",
                expired_frees_the_user(c1, c2, "coalesced").boxed(),
            ),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// The audit checks each segment's `reserved` against the live reservations holding it (key
// names: the tables in src/store/redis/lua.rs).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_sees_reserved_units_held_by_nothing() {
    let srv = RedisServer::start();
    let e = redis_engine(&srv, quick().per_user_limit(0)).await;
    let ttl = Duration::from_secs(30);

    // No false alarm: live, confirmed and cancelled reservations, sales, and a reservation
    // held at a home its units were moved to.
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
    let f = sku("leakmv");
    e.load(&f, 1, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap();
    let fid = ids_homed("lmv-", "lf", 2, 1, 1).remove(0);
    held(e.reserve(&d("leakmv", "lf", 1, &fid), ttl).await, "moved");
    let a = audit_ok(&e, &s, "baseline").await;
    assert_eq!((a.reserved, a.sold, a.remaining), (2, 3, 15), "{a:?}");
    let a = audit_ok(&e, &f, "baseline moved").await;
    assert_eq!((a.reserved, a.remaining, a.in_transit), (1, 0, 0), "{a:?}");

    // Three leaks, each on its own SKU: a unit held by nothing.
    let mut missed = Vec::new();
    for leak in ["hincrby", "del-record", "zrem-index"] {
        let name = format!("leak-{leak}");
        let s = sku(&name);
        let g = e
            .load(&s, 10, LoadOptions::new(2).per_user_limit(0))
            .await
            .unwrap();
        let (_, seg) = held(e.reserve(&d(&name, "v", 1, "lv"), ttl).await, leak);
        let seg_key = format!("t:{{{name}#{seg}}}:seg");
        let ledger_key = format!("t:{{{name}#{seg}}}:g{g}:rec");
        let index_key = format!("t:{{{name}#{seg}}}:g{g}:resv");
        audit_ok(&e, &s, leak).await;
        match leak {
            "hincrby" => {
                // One more unit moved from stock to reserved: the counters still add up.
                assert_eq!(srv.cli(&["HINCRBY", &seg_key, "reserved", "1"]), "2");
                srv.cli(&["HINCRBY", &seg_key, "stock", "-1"]);
            }
            "del-record" => assert_eq!(srv.cli(&["HDEL", &ledger_key, "v lv"]), "1"),
            _ => assert_eq!(srv.cli(&["ZREM", &index_key, "v lv"]), "1"),
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
