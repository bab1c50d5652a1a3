//! Edge cases of request ids. A request id names one request of one user (ids are scoped per
//! (SKU, user), as idempotency keys are per account): the same id under another user is
//! another request; the same user and id with another quantity or kind is a conflict; a
//! re-send is a replay (on any engine, concurrent twins included) — with a per-user limit for
//! the whole generation, without one for `request_ttl`.
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
use shardstock::*;
use std::collections::BTreeMap;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// A reservation and a sale with the same request id (same user) conflict: field "kind".

async fn kind_conflict<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("kind");
    e.load(&s, 10, LoadOptions::new(2).per_user_limit(1))
        .await
        .unwrap();
    let ttl = Duration::from_secs(30);

    // Reservation first, then a sale with its request id.
    let (ann, _) = held(
        e.reserve(&d("kind", "ann", 1, "k1"), ttl).await,
        "ann reserves k1",
    );
    let sale = e.deduct(&d("kind", "ann", 1, "k1")).await;
    assert!(
        matches!(sale, Err(Error::RequestIdConflict { field: "kind", .. })),
        "[{tag}] a sale reusing reservation k1's request id: expected RequestIdConflict {{ field: \"kind\" }}, got {sale:?}"
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(
        (a.reserved, a.sold, a.remaining),
        (1, 0, 9),
        "[{tag}] the conflict changed something: {a:?}"
    );
    // Ann's ledger is untouched: her reservation still counts against the limit.
    let more = e.deduct(&d("kind", "ann", 1, "k1b")).await.unwrap();
    assert_eq!(
        more,
        Deduction::LimitReached { limit: 1 },
        "[{tag}] ann holds a reservation"
    );
    let c = e.cancel(&ann).await.unwrap();
    assert!(c.done, "[{tag}] cancel of k1: {c:?}");
    let buy = e.deduct(&d("kind", "ann", 1, "k1c")).await.unwrap();
    assert_eq!(buy.units_applied(), 1, "[{tag}] ann after cancel: {buy:?}");

    // Sale first, then a reservation with its request id.
    let buy = e.deduct(&d("kind", "bob", 1, "k2")).await.unwrap();
    assert_eq!(buy.units_applied(), 1, "[{tag}] bob buys k2: {buy:?}");
    let resv = e.reserve(&d("kind", "bob", 1, "k2"), ttl).await;
    assert!(
        matches!(resv, Err(Error::RequestIdConflict { field: "kind", .. })),
        "[{tag}] a reservation reusing sale k2's request id: expected RequestIdConflict {{ field: \"kind\" }}, got {resv:?}"
    );
    for id in ["k3", "k4"] {
        let more = e.deduct(&d("kind", "bob", 1, id)).await.unwrap();
        assert_eq!(
            more,
            Deduction::LimitReached { limit: 1 },
            "[{tag}] bob bought k2 and asks again with {id}"
        );
    }
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(
        (a.reserved, a.sold, a.remaining),
        (0, 2, 8),
        "[{tag}] {a:?}"
    );

    // Without a per-user limit (the home is the (user, id) pair's; units may move there).
    let s = sku("kind0");
    e.load(&s, 4, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap();
    held(
        e.reserve(&d("kind0", "cy", 1, "n1"), ttl).await,
        "cy reserves n1",
    );
    let sale = e.deduct(&d("kind0", "cy", 1, "n1")).await;
    assert!(
        matches!(sale, Err(Error::RequestIdConflict { field: "kind", .. })),
        "[{tag}] no limit: a sale reusing reservation n1's id: {sale:?}"
    );
    let buy = e.deduct(&d("kind0", "cy", 3, "n2")).await.unwrap();
    assert_eq!(buy.units_applied(), 3, "[{tag}] cy buys n2: {buy:?}");
    let resv = e.reserve(&d("kind0", "cy", 3, "n2"), ttl).await;
    assert!(
        matches!(resv, Err(Error::RequestIdConflict { field: "kind", .. })),
        "[{tag}] no limit: a reservation reusing sale n2's id: {resv:?}"
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(
        (a.reserved, a.sold, a.remaining, a.in_transit),
        (1, 3, 0, 0),
        "[{tag}] no limit: {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservation_and_sale_with_one_request_id_conflict() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick()).await;
    run_all(
        true,
        vec![
            ("memory", kind_conflict(m, "memory").boxed()),
            ("redis", kind_conflict(r, "redis").boxed()),
            ("coalesced", kind_conflict(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// A request id reused with a quantity above the per-user limit is a conflict (field "qty"), as
// with any other quantity: the record of a request id is looked at before the limit, as
// `sell.lua` does. "Over limit" is the answer of a new request id only.

async fn qty_over_limit_conflict<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("qlim");
    e.load(&s, 10, LoadOptions::new(2).per_user_limit(2))
        .await
        .unwrap();
    let ttl = Duration::from_secs(30);
    let buy = e.deduct(&d("qlim", "ann", 1, "q1")).await.unwrap();
    assert_eq!(buy.units_applied(), 1, "[{tag}] ann buys q1: {buy:?}");
    for qty in [2, 3] {
        // 2 is within the limit, 3 above it: the same answer.
        let again = e.deduct(&d("qlim", "ann", qty, "q1")).await;
        assert!(
            matches!(again, Err(Error::RequestIdConflict { field: "qty", .. })),
            "[{tag}] q1 again with qty {qty}: expected RequestIdConflict {{ field: \"qty\" }}, got {again:?}"
        );
        let resv = e.reserve(&d("qlim", "ann", qty, "q1"), ttl).await;
        assert!(
            matches!(resv, Err(Error::RequestIdConflict { field: "qty", .. })),
            "[{tag}] a reservation reusing q1 with qty {qty}: got {resv:?}"
        );
    }
    // A reservation's id reused by a sale above the limit: the quantity differs first.
    held(
        e.reserve(&d("qlim", "bob", 1, "q2"), ttl).await,
        "bob reserves q2",
    );
    let sale = e.deduct(&d("qlim", "bob", 3, "q2")).await;
    assert!(
        matches!(sale, Err(Error::RequestIdConflict { field: "qty", .. })),
        "[{tag}] a sale of 3 reusing reservation q2: got {sale:?}"
    );
    // A new request id above the limit: over limit (final), nothing changed.
    let over = e.deduct(&d("qlim", "ann", 3, "q3")).await.unwrap();
    assert_eq!(over, Deduction::OverLimit { limit: 2 }, "[{tag}]");
    let replay = e.deduct(&d("qlim", "ann", 1, "q1")).await.unwrap();
    assert!(
        matches!(replay, Deduction::Replayed { units: 1, .. }),
        "[{tag}] q1 as sent first still replays: {replay:?}"
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(
        (a.reserved, a.sold, a.remaining),
        (1, 1, 8),
        "[{tag}] the refusals changed something: {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_reused_above_the_limit_is_a_conflict_not_over_limit() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick()).await;
    run_all(
        true,
        vec![
            ("memory", qty_over_limit_conflict(m, "memory").boxed()),
            ("redis", qty_over_limit_conflict(r, "redis").boxed()),
            ("coalesced", qty_over_limit_conflict(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Request ids are scoped per (SKU, user): the same id for two users is two sales (on one
// engine or two); each replays for its own user; a conflict needs the same user.

async fn id_scoping<S: Store>(e1: Engine<S>, e2: Engine<S>, tag: &'static str) {
    for limit in [0, 2] {
        let name = format!("scope{limit}");
        let s = sku(&name);
        e1.load(&s, 10, LoadOptions::new(3).per_user_limit(limit))
            .await
            .unwrap();
        let alice = e1.deduct(&d(&name, "alice", 1, "order-1")).await.unwrap();
        let bob = e2.deduct(&d(&name, "bob", 1, "order-1")).await.unwrap();
        let carl = e1.deduct(&d(&name, "carl", 1, "order-1")).await.unwrap();
        for (who, r) in [("alice", &alice), ("bob", &bob), ("carl", &carl)] {
            assert_eq!(
                r.units_applied(),
                1,
                "[{tag}] limit {limit}: {who}'s order-1 is {who}'s own request, got {r:?}"
            );
        }
        // Each replays for its own user, on either engine.
        for (who, e) in [("alice", &e2), ("bob", &e1), ("carl", &e2)] {
            let r = e.deduct(&d(&name, who, 1, "order-1")).await.unwrap();
            assert!(
                matches!(r, Deduction::Replayed { .. }),
                "[{tag}] limit {limit}: {who}'s order-1 again: {r:?}"
            );
        }
        // A conflict is the same user and id with another quantity.
        let r = e2.deduct(&d(&name, "alice", 2, "order-1")).await;
        assert!(
            matches!(r, Err(Error::RequestIdConflict { field: "qty", .. })),
            "[{tag}] limit {limit}: alice's order-1 for 2: {r:?}"
        );
        // Another user's id with another quantity is yet another request.
        let r = e2.deduct(&d(&name, "dora", 2, "order-1")).await.unwrap();
        assert_eq!(r.units_applied(), 2, "[{tag}] limit {limit}: dora {r:?}");
        let a = audit_ok(&e1, &s, tag).await;
        assert_eq!(
            (a.sold, a.remaining, a.in_transit),
            (5, 5, 0),
            "[{tag}] limit {limit}: {a:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_request_id_for_two_users_is_two_sales() {
    let srv = RedisServer::start();
    let mem = MemoryStore::new();
    let b = quick;
    let (m1, m2) = (b().build(mem.clone()).unwrap(), b().build(mem).unwrap());
    let (r1, r2) = (redis_engine(&srv, b()).await, redis_engine(&srv, b()).await);
    let c1 = coalesced_engine(&srv, b(), Coalescing::default(), "c").await;
    let c2 = coalesced_engine(&srv, b(), Coalescing::default(), "c").await;
    run_all(
        true,
        vec![
            ("memory", id_scoping(m1, m2, "memory").boxed()),
            ("redis", id_scoping(r1, r2, "redis").boxed()),
            ("coalesced", id_scoping(c1, c2, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Without a per-user limit a record is remembered for `request_ttl`: a re-send within it
// replays, one after it is another request (documented in `EngineOptions::request_ttl`; with a
// limit records live for the whole generation: tests/it/user_limit.rs).

async fn remembered_request_ttl<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("ttl0");
    e.load(&s, 10, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap();
    let first = e.deduct(&d("ttl0", "ida", 1, "t1")).await.unwrap();
    assert_eq!(first.units_applied(), 1, "[{tag}] {first:?}");
    let again = e.deduct(&d("ttl0", "ida", 1, "t1")).await.unwrap();
    assert!(
        matches!(again, Deduction::Replayed { .. }),
        "[{tag}] {again:?}"
    );
    tokio::time::sleep(e.options().request_ttl + Duration::from_millis(300)).await;
    let late = e.deduct(&d("ttl0", "ida", 1, "t1")).await.unwrap();
    assert_eq!(
        late.units_applied(),
        1,
        "[{tag}] past request_ttl (no limit) the id is forgotten: another request; got {late:?}"
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(a.sold, 2, "[{tag}] {a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_limit_an_id_is_remembered_for_request_ttl() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick().request_ttl(Duration::from_millis(400))).await;
    run_all(
        true,
        vec![
            ("memory", remembered_request_ttl(m, "memory").boxed()),
            ("redis", remembered_request_ttl(r, "redis").boxed()),
            ("coalesced", remembered_request_ttl(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// On Redis a sale's record without a limit sits in the sales window of its time (a hash per
// window of request_ttl, dropped whole: src/scripts/prelude.lua): a re-send anywhere within
// request_ttl replays, whichever window it falls in, and so does one through an instance with
// another request_ttl.

async fn remembered_across_windows<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("win0");
    e.load(&s, 100, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap();
    let ttl = e.options().request_ttl;
    let (mut sold, mut checked) = (0, 0);
    for i in 0..8 {
        let req = d("win0", &format!("w{i}"), 1, &format!("r{i}"));
        let sent = std::time::Instant::now();
        let first = e.deduct(&req).await.unwrap();
        assert_eq!(first.units_applied(), 1, "[{tag}] {first:?}");
        sold += 1;
        loop {
            tokio::time::sleep(Duration::from_millis(15)).await;
            let again = e.deduct(&req).await.unwrap();
            // Only a re-send answered within request_ttl of the first call's start (less the
            // stores' millisecond clocks' rounding) was decided while the record surely lived.
            if sent.elapsed() + Duration::from_millis(5) >= ttl {
                if again.units_applied() == 1 {
                    sold += 1;
                }
                break;
            }
            checked += 1;
            assert!(
                matches!(again, Deduction::Replayed { .. }),
                "[{tag}] {i}: a re-send {:?} after the sale: {again:?}",
                sent.elapsed()
            );
        }
    }
    assert!(checked >= 8 * 5, "[{tag}] only {checked} re-sends checked");
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(a.sold, sold, "[{tag}] {a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_limit_a_record_is_found_across_window_ends() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick().request_ttl(Duration::from_millis(300))).await;
    run_all(
        true,
        vec![
            ("memory", remembered_across_windows(m, "memory").boxed()),
            ("redis", remembered_across_windows(r, "redis").boxed()),
            (
                "coalesced",
                remembered_across_windows(c, "coalesced").boxed(),
            ),
        ],
    )
    .await;

    // Two instances with different request_ttl on one Redis: each finds the other's records.
    let short = redis_engine(&srv, quick().request_ttl(Duration::from_millis(300))).await;
    let long = redis_engine(&srv, quick().request_ttl(Duration::from_secs(5))).await;
    let s = sku("win1");
    short
        .load(&s, 100, LoadOptions::new(1).per_user_limit(0))
        .await
        .unwrap();
    let a = d("win1", "ann", 1, "a1");
    assert_eq!(short.deduct(&a).await.unwrap().units_applied(), 1);
    let again = long.deduct(&a).await.unwrap();
    assert!(matches!(again, Deduction::Replayed { .. }), "{again:?}");
    let b = d("win1", "bob", 1, "b1");
    assert_eq!(long.deduct(&b).await.unwrap().units_applied(), 1);
    // Past the short instance's request_ttl, within the long one's: still remembered.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let again = short.deduct(&b).await.unwrap();
    assert!(matches!(again, Deduction::Replayed { .. }), "{again:?}");
    let au = audit_ok(&short, &s, "two ttls").await;
    assert_eq!(au.sold, 2, "{au:?}");
}

// ---------------------------------------------------------------------------------------------
// Twins: one (user, request id) sent 8 times at once over two engines applies once; the other
// sends replay (or, with a per-user limit, meet the in-process guard: user_busy). Stock is
// spread thin over 4 segments so that many requests find home short and move units first.

async fn twins<S: Store>(engines: [Engine<S>; 2], limit: u64, tag: &'static str) {
    let mut problems = Vec::new();
    for round in 0..3 {
        let name = format!("twins{limit}-{round}");
        let s = sku(&name);
        engines[0]
            .load(&s, 30, LoadOptions::new(4).per_user_limit(limit))
            .await
            .unwrap();
        let mut tasks = Vec::new();
        // 20 request ids sent 8 times each at once (over two engines), 40 distinct ones.
        for k in 0..20 {
            for t in 0..8 {
                let (e, name) = (engines[t % 2].clone(), name.clone());
                tasks.push(tokio::spawn(async move {
                    let id = format!("tw{k}");
                    let r = e.deduct(&d(&name, &format!("tu{k}"), 1, &id)).await;
                    (format!("tu{k}/{id}"), r)
                }));
            }
        }
        for j in 0..40 {
            let (e, name) = (engines[j % 2].clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                let id = format!("dj{j}");
                let r = e.deduct(&d(&name, &format!("du{j}"), 1, &id)).await;
                (format!("du{j}/{id}"), r)
            }));
        }
        let mut seen: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for t in join_all(tasks).await {
            let (id, r) = t.unwrap();
            let e = seen.entry(id.clone()).or_default();
            match r {
                Ok(Deduction::Applied { .. }) => e.0 += 1,
                Ok(Deduction::Replayed { .. }) => e.1 += 1,
                Ok(Deduction::SoldOut | Deduction::Insufficient { .. } | Deduction::UserBusy) => {}
                other => problems.push(format!("{name}: {id}: {other:?}")),
            }
        }
        for (id, (applied, replayed)) in &seen {
            if *applied > 1 || (*replayed > 0 && *applied == 0) {
                problems.push(format!(
                    "{name}: {id} answered applied {applied} times, replayed {replayed} times"
                ));
            }
        }
        let applied = seen.values().filter(|(a, _)| *a == 1).count() as u64;
        let a = swept(&engines[1], &s, Duration::from_secs(2), tag).await;
        if !a.ok || a.sold != applied || a.in_transit != 0 || a.sold > 30 {
            problems.push(format!("{name}: {applied} requests applied, audit: {a:?}"));
        }
    }
    assert!(
        problems.is_empty(),
        "[{tag}] twins (limit {limit}):\n  {}",
        problems.join("\n  ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twins_of_one_request_apply_once() {
    let srv = RedisServer::start();
    let b = quick;
    let mem = MemoryStore::new();
    let m = || {
        [
            b().build(mem.clone()).unwrap(),
            b().build(mem.clone()).unwrap(),
        ]
    };
    let r = [redis_engine(&srv, b()).await, redis_engine(&srv, b()).await];
    let c = [
        coalesced_engine(&srv, b(), Coalescing::default(), "c").await,
        coalesced_engine(&srv, b(), Coalescing::default(), "c").await,
    ];
    let mut cases = Vec::new();
    for limit in [0, 1] {
        cases.push(("memory", twins(m(), limit, "memory").boxed()));
        cases.push(("redis", twins(r.clone(), limit, "redis").boxed()));
        cases.push(("coalesced", twins(c.clone(), limit, "coalesced").boxed()));
    }
    run_all(false, cases).await;
}
