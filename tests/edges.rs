//! Issue 11: one regression test per case where a promise broke at the edges. Each asserts the
//! behaviour promised after the fixes (see the issue), against real stores: the embedded
//! `MemoryStore` and `redis-server` processes (plain and with request coalescing). Crash
//! points are simulated with store-level calls (`engine.store()`) or by dropping futures.
//!
//! Where a case runs on several stores, every store runs to its end and the test then fails
//! with each store's failure, named (`[redis] ...`).

mod common;
use common::*;
use futures::future::{BoxFuture, join_all};
use futures::{FutureExt, poll};
use shardstock::segments::home;
use shardstock::store::{
    HomeReply, OnShort, RecordState, ReqArgs, RequestKind, SealReply, SegAddr, SegmentRole,
    TakeReply, UserClaim,
};
use shardstock::*;
use std::panic::AssertUnwindSafe;
use std::task::Poll;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Helpers

fn sku(s: &str) -> Sku {
    Sku::new(s).unwrap()
}

fn rid(s: &str) -> RequestId {
    RequestId::new(s).unwrap()
}

fn uid(s: &str) -> UserId {
    UserId::new(s).unwrap()
}

fn d(sku: &str, user: &str, qty: u64, request_id: &str) -> Deduct {
    Deduct::new(sku, user, qty, request_id).unwrap()
}

fn at(sku: &Sku, generation: u64, index: u32) -> SegAddr<'_> {
    SegAddr {
        sku,
        generation,
        index,
    }
}

/// The store-level arguments the engine `e` would send for this request.
fn args<'a, S: Store>(
    e: &Engine<S>,
    request_id: &'a RequestId,
    user: &'a UserId,
    qty: u64,
    resv_ttl_ms: u64,
) -> ReqArgs<'a> {
    ReqArgs {
        request_id,
        user,
        qty,
        ttl_ms: e.options().request_ttl.as_millis() as u64,
        lease_ms: e.options().claim_lease.as_millis() as u64,
        resv_ttl_ms,
        kind: if resv_ttl_ms > 0 {
            RequestKind::Reservation
        } else {
            RequestKind::Sale
        },
    }
}

/// `n` request ids `<prefix><k>` whose home is segment `index` of `segments`.
fn homed(prefix: &str, segments: u32, index: u32, n: usize) -> Vec<String> {
    (0..)
        .map(|k| format!("{prefix}{k}"))
        .filter(|r| home(&rid(r), segments) == index)
        .take(n)
        .collect()
}

async fn audit_ok<S: Store>(e: &Engine<S>, s: &Sku, tag: &str) -> Audit {
    let a = e.audit(s).await.unwrap();
    assert!(a.ok, "[{tag}] audit of {s} failed: {a:?}");
    assert_eq!(
        a.loaded + a.restocked,
        a.remaining + a.reserved + a.sold,
        "[{tag}] {a:?}"
    );
    a
}

fn held(r: Result<Reserved>, what: &str) -> (ReservationId, Vec<Part>) {
    match r {
        Ok(Reserved::Held { id, parts }) => (id, parts),
        other => panic!("{what}: expected a held reservation, got {other:?}"),
    }
}

/// The generation a reservation id `<sku>~<generation>~<segment>~<request id>` names.
fn id_generation(id: &ReservationId) -> u64 {
    id.to_string().split('~').nth(1).unwrap().parse().unwrap()
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        "panic".to_string()
    }
}

/// Runs every named scenario to its end (concurrently, or one after the other); returns their
/// failures, each named.
async fn run<'a>(concurrent: bool, cases: Vec<(&'static str, BoxFuture<'a, ()>)>) -> Vec<String> {
    let run = |(name, f): (&'static str, BoxFuture<'a, ()>)| async move {
        (name, AssertUnwindSafe(f).catch_unwind().await)
    };
    let results = if concurrent {
        join_all(cases.into_iter().map(run)).await
    } else {
        let mut v = Vec::new();
        for c in cases {
            v.push(run(c).await);
        }
        v
    };
    let failures: Vec<String> = results
        .into_iter()
        .filter_map(|(n, r)| {
            r.err().map(|p| {
                let text = panic_text(p);
                if text.contains(&format!("[{n}]")) {
                    text
                } else {
                    format!("[{n}] {text}")
                }
            })
        })
        .collect();
    failures
}

/// Fails with every failure of [`run`].
fn check(failures: Vec<String>) {
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// [`run`], then [`check`].
async fn run_all<'a>(concurrent: bool, cases: Vec<(&'static str, BoxFuture<'a, ()>)>) {
    check(run(concurrent, cases).await);
}

/// A builder with short timings (claims and leases of a few hundred ms).
fn quick() -> EngineBuilder {
    Engine::builder()
        .request_ttl(Duration::from_secs(30))
        .claim_lease(Duration::from_millis(200))
        .user_claim_ttl(Duration::from_millis(300))
        .pending_wait(Duration::from_millis(300))
}

/// The memory store, Redis, and Redis with request coalescing, all with `b`.
async fn three(
    srv: &RedisServer,
    b: EngineBuilder,
) -> (Engine<MemoryStore>, Engine<RedisStore>, Engine<RedisStore>) {
    (
        memory_engine(b.clone()),
        redis_engine(srv, b.clone()).await,
        coalesced_engine(srv, b, Coalescing::default(), "c").await,
    )
}

/// Drives `fut`, but drops it at its `k`-th suspension (the `k`-th time it answers Pending:
/// a command has been sent and its reply not yet handled — where a crash or a client
/// disconnect leaves it). `None` when it was dropped unfinished.
async fn drop_at<F: std::future::Future>(fut: F, k: usize) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let mut suspended = 0;
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(out) => Poll::Ready(Some(out)),
        Poll::Pending => {
            suspended += 1;
            if suspended >= k {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        }
    })
    .await
}

/// Deducts until the answer is not `UserBusy` (or `within` passed); returns the last answer
/// and how many `UserBusy` came before it.
async fn until_not_busy<S: Store>(
    e: &Engine<S>,
    req: &Deduct,
    within: Duration,
) -> (Result<Deduction>, u32) {
    let deadline = Instant::now() + within;
    let mut busy = 0;
    loop {
        let r = e.deduct(req).await;
        if matches!(r, Ok(Deduction::UserBusy)) && Instant::now() < deadline {
            busy += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        return (r, busy);
    }
}

// ---------------------------------------------------------------------------------------------
// 1. A reservation and a sale with the same request id are a conflict ("kind").

async fn e01<S: Store>(e: Engine<S>, tag: &'static str) {
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
    // Ann's entry is untouched: her reservation still counts against the limit.
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
    // Bob's entry is untouched: his sale still counts (also after a verification round).
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

    // Without a per-user limit no user entry stands in front: the records alone must tell
    // the kinds apart (at the home segment, and for a sale served by fallback).
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
        (a.reserved, a.sold, a.remaining),
        (1, 3, 0),
        "[{tag}] no limit: {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e01_reservation_and_sale_with_one_request_id_conflict() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick()).await;
    run_all(
        true,
        vec![
            ("memory", e01(m, "memory").boxed()),
            ("redis", e01(r, "redis").boxed()),
            ("coalesced", e01(c, "coalesced").boxed()),
        ],
    )
    .await;
}

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
// 3. A request id used by another user does not lock that user out (conflicts, seals and
//    mismatches end the pending entry).

async fn e03<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("reuse");
    let generation = e
        .load(&s, 10, LoadOptions::new(2).per_user_limit(1))
        .await
        .unwrap();
    let buy = e.deduct(&d("reuse", "alice", 1, "order-1")).await.unwrap();
    assert_eq!(buy.units_applied(), 1, "[{tag}] {buy:?}");
    let bob = e.deduct(&d("reuse", "bob", 1, "order-1")).await;
    assert!(
        matches!(bob, Err(Error::RequestIdConflict { field: "user", .. })),
        "[{tag}] bob reusing alice's order-1: {bob:?}"
    );
    let bob = e.deduct(&d("reuse", "bob", 1, "order-2")).await.unwrap();
    assert_eq!(
        bob.units_applied(),
        1,
        "[{tag}] bob bought nothing (order-1 was alice's) but his fresh order-2 got {bob:?}"
    );
    let more = e.deduct(&d("reuse", "alice", 1, "order-3")).await.unwrap();
    assert_eq!(more, Deduction::LimitReached { limit: 1 }, "[{tag}]");

    // A sealed request id ends the pending entry too.
    let store = e.store();
    let (r20, erin) = (rid("order-20"), uid("erin"));
    let seal = store
        .seal(
            at(&s, generation, home(&r20, 2)),
            args(&e, &r20, &erin, 1, 0),
        )
        .await
        .unwrap();
    assert_eq!(seal, SealReply::Sealed, "[{tag}]");
    let sealed = e.deduct(&d("reuse", "erin", 1, "order-20")).await;
    assert!(
        matches!(sealed, Err(Error::Sealed(_))),
        "[{tag}] erin's sealed order-20: {sealed:?}"
    );
    let erin_buys = e.deduct(&d("reuse", "erin", 1, "order-21")).await.unwrap();
    assert_eq!(
        erin_buys.units_applied(),
        1,
        "[{tag}] erin's order-20 was sealed (nothing sold) but her fresh order-21 got {erin_buys:?}"
    );

    // The seal path: carl's claim for order-9 stayed pending (his process died before
    // deducting); dora then used order-9. Once carl's claim expires it is verified: the home
    // record belongs to dora, so carl's entry is void, not kept forever.
    let (r9, carl) = (rid("order-9"), uid("carl"));
    let claim = store
        .user_claim(&s, generation, args(&e, &r9, &carl, 1, 0), 1, 200)
        .await
        .unwrap();
    assert_eq!(claim, UserClaim::Ok, "[{tag}]");
    let dora = e.deduct(&d("reuse", "dora", 1, "order-9")).await.unwrap();
    assert_eq!(dora.units_applied(), 1, "[{tag}] {dora:?}");
    let (carl_buys, busy) = until_not_busy(
        &e,
        &d("reuse", "carl", 1, "order-10"),
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(
        carl_buys.as_ref().map(Deduction::units_applied).ok(),
        Some(1),
        "[{tag}] carl's pending claim for order-9 (a request id dora then used) expired after 200 ms; his fresh order-10 got {carl_buys:?} (after {busy} UserBusy)"
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!((a.sold, a.remaining), (5, 5), "[{tag}] {a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e03_request_id_of_another_user_does_not_lock_out() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick()).await;
    run_all(
        true,
        vec![
            ("memory", e03(m, "memory").boxed()),
            ("redis", e03(r, "redis").boxed()),
            ("coalesced", e03(c, "coalesced").boxed()),
        ],
    )
    .await;
}

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
        matches!(r, HomeReply::Short { claimed: true, .. }),
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
        matches!(r, HomeReply::Short { claimed: true, .. }),
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
// 7. A sealed request id answers Err(Sealed) on every store and every path.

async fn e07<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("sealed");
    let generation = e
        .load(&s, 6, LoadOptions::new(2).per_user_limit(1))
        .await
        .unwrap(); // [3, 3]
    let seal = |id: &'static str, user: &'static str| {
        let e = e.clone();
        let s = s.clone();
        async move {
            let (r, u) = (rid(id), uid(user));
            let home_at = at(&s, generation, home(&r, 2));
            let reply = e.store().seal(home_at, args(&e, &r, &u, 1, 0)).await;
            assert_eq!(reply.unwrap(), SealReply::Sealed, "[{tag}] seal {id}");
        }
    };
    let expect_sealed = |r: Result<Deduction>, what: &str| {
        assert!(
            matches!(r, Err(Error::Sealed(_))),
            "[{tag}] sealed request id, {what}: expected Err(Sealed), got {r:?}"
        );
    };
    // (a) Its home segment has stock.
    seal("s-a", "sa").await;
    expect_sealed(
        e.deduct(&d("sealed", "sa", 1, "s-a")).await,
        "home segment has stock",
    );
    // (b) Its home segment is known to be empty (the engine reads the record first).
    let b_id = homed("s-b", 2, 0, 1).remove(0);
    let b_id: &'static str = Box::leak(b_id.into_boxed_str());
    seal(b_id, "sb").await;
    for (k, id) in homed("drain0-", 2, 0, 3).iter().enumerate() {
        let r = e
            .deduct(&d("sealed", &format!("d0{k}"), 1, id))
            .await
            .unwrap();
        assert_eq!(r.units_applied(), 1, "[{tag}] {r:?}");
    }
    expect_sealed(
        e.deduct(&d("sealed", "sb", 1, b_id)).await,
        "home segment empty",
    );
    // (c) Sold out.
    seal("s-c", "sc").await;
    for k in 0..10 {
        let r = e
            .deduct(&d("sealed", &format!("d1{k}"), 1, &format!("drain1-{k}")))
            .await
            .unwrap();
        if r == Deduction::SoldOut {
            break;
        }
    }
    expect_sealed(e.deduct(&d("sealed", "sc", 1, "s-c")).await, "sold out");
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!((a.sold, a.remaining), (6, 0), "[{tag}] {a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e07_sealed_request_id_is_sealed_on_both_stores() {
    let srv = RedisServer::start();
    let b = quick().hint_ttl(Duration::from_secs(10));
    let (m, r, c) = three(&srv, b).await;
    run_all(
        true,
        vec![
            ("memory", e07(m, "memory").boxed()),
            ("redis", e07(r, "redis").boxed()),
            ("coalesced", e07(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// 8. decr-compensate: twins of one request id never both apply; no oversell; audit ok.

/// Found by review: decr-compensate's give-back ran on every run of its script, so a run
/// re-sent after a lost reply (fred re-sends in-flight commands) created units; and a stale
/// answer skipped the give-back, losing the units the decrement took from the new generation.
#[tokio::test]
async fn e08_decr_compensate_gives_back_once_per_decrement() {
    use fred::prelude::{LuaInterface, Value};
    let srv = RedisServer::start();
    let e = strategy_engine(
        &srv,
        Engine::builder().per_user_limit(0),
        Strategy::DecrCompensate,
        lock_opts(2000, 1000),
    )
    .await;
    let s = sku("decr1");
    let g = e
        .load(&s, 10, LoadOptions::new(1))
        .await
        .unwrap()
        .to_string();
    let client = e.store().pool().next().clone();
    let lua = concat!(
        include_str!("../src/scripts/prelude.lua"),
        include_str!("../src/scripts/deduct_core.lua"),
        include_str!("../src/scripts/deduct.lua")
    );
    let keys = |g: &str| {
        vec![
            "t:{decr1#0}:seg".to_string(),
            format!("t:{{decr1#0}}:g{g}:rq:x"),
            format!("t:{{decr1#0}}:g{g}:resv"),
            format!("t:{{decr1#0}}:g{g}:claims"),
            "t:{decr1#0}:seg:dt:77".to_string(),
        ]
    };
    let args = |g: &str| -> Vec<String> {
        [g, "u", "3", "0", "60000", "1000", "1", "decr", "77", "0"]
            .map(String::from)
            .to_vec()
    };
    // One decrement, its script run twice (the second a re-send after a lost reply).
    srv.cli(&["HINCRBY", "t:{decr1#0}:seg", "stock", "-3"]);
    for _ in 0..2 {
        let _: Value = client.eval(lua, keys(&g), args(&g)).await.unwrap();
    }
    let a = e.audit(&s).await.unwrap();
    assert!(
        a.ok && (a.remaining, a.sold) == (7, 3),
        "one decrement, its script run twice: {a:?}"
    );
    // A decrement that lands on a newer generation than its script believes in: given back.
    let g2 = e
        .load(&s, 10, LoadOptions::new(1).replace(true))
        .await
        .unwrap();
    srv.cli(&["HINCRBY", "t:{decr1#0}:seg", "stock", "-3"]);
    let mut k = keys(&g);
    k[4] = "t:{decr1#0}:seg:dt:78".to_string();
    let mut a2 = args(&g);
    a2[8] = "78".to_string();
    let r: Value = client.eval(lua, k, a2).await.unwrap();
    assert!(format!("{r:?}").contains("stale"), "{r:?}");
    let a = e.audit(&s).await.unwrap();
    assert!(
        a.generation == g2 && a.ok && (a.remaining, a.sold) == (10, 0),
        "a stale script still gives its decrement back: {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e08_decr_compensate_twins_apply_once() {
    let srv = RedisServer::start();
    let mk = || {
        strategy_engine(
            &srv,
            Engine::builder().per_user_limit(0),
            Strategy::DecrCompensate,
            lock_opts(2000, 1000),
        )
    };
    let engines = [mk().await, mk().await];
    let mut problems = Vec::new();
    for round in 0..3 {
        let name = format!("twins{round}");
        let s = sku(&name);
        engines[0].load(&s, 30, LoadOptions::new(4)).await.unwrap();
        let mut tasks = Vec::new();
        // 20 request ids sent 8 times each at once (over two engines), 40 distinct ones.
        for k in 0..20 {
            for t in 0..8 {
                let (e, name) = (engines[t % 2].clone(), name.clone());
                tasks.push(tokio::spawn(async move {
                    let id = format!("tw{k}");
                    let r = e.deduct(&d(&name, &format!("tu{k}"), 1, &id)).await;
                    (id, r)
                }));
            }
        }
        for j in 0..40 {
            let (e, name) = (engines[j % 2].clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                let id = format!("dj{j}");
                let r = e.deduct(&d(&name, &format!("du{j}"), 1, &id)).await;
                (id, r)
            }));
        }
        let mut applied: std::collections::BTreeMap<String, u64> = Default::default();
        for t in join_all(tasks).await {
            let (id, r) = t.unwrap();
            match r {
                Ok(Deduction::Applied { .. }) => *applied.entry(id).or_default() += 1,
                Ok(_) => {}
                Err(e) => problems.push(format!("{name}: {id}: {e}")),
            }
        }
        let twice: Vec<String> = applied
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, n)| format!("{id} ×{n}"))
            .collect();
        if !twice.is_empty() {
            problems.push(format!(
                "{name}: request ids applied more than once: {}",
                twice.join(", ")
            ));
        }
        let a = engines[1].audit(&s).await.unwrap();
        if !a.ok || a.sold > 30 || a.sold != applied.len() as u64 {
            problems.push(format!(
                "{name}: {} request ids applied, audit: {a:?}",
                applied.len()
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "decr-compensate twins:\n  {}",
        problems.join("\n  ")
    );
    let summary = Strategy::DecrCompensate.summary().to_lowercase();
    assert!(
        summary.contains("exactly-once") || summary.contains("exactly once"),
        "decr-compensate's summary must say it is not exactly-once: {summary:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 9. Concurrent reloads from two engines leave the SKU sellable and the audit ok.

async fn e09<S: Store>(e1: Engine<S>, e2: Engine<S>, rounds: u64, tag: &'static str) {
    let s = sku("reload");
    e1.load(&s, 100, LoadOptions::new(4)).await.unwrap();
    for round in 0..rounds {
        let (n1, n2) = if round % 2 == 0 { (4, 2) } else { (3, 5) };
        let (t1, t2) = (100 + round, 50 + round);
        let load = |e: &Engine<S>, total: u64, segs: u32| {
            let (e, s) = (e.clone(), s.clone());
            tokio::spawn(async move {
                e.load(&s, total, LoadOptions::new(segs).replace(true))
                    .await
            })
        };
        let (h1, h2) = (load(&e1, t1, n1), load(&e2, t2, n2));
        let (r1, r2) = (h1.await.unwrap(), h2.await.unwrap());
        for r in [&r1, &r2] {
            assert!(
                matches!(r, Ok(_) | Err(Error::NotReady(_))),
                "[{tag}] round {round}: load: {r:?}"
            );
        }
        let won = [(&r1, t1, n1), (&r2, t2, n2)]
            .into_iter()
            .filter_map(|(r, t, n)| r.as_ref().ok().map(|g| (*g, t, n)))
            .max();
        let Some((g, total, segs)) = won else {
            panic!("[{tag}] round {round}: both loads failed: {r1:?} {r2:?}");
        };
        for (k, e) in [&e1, &e2].into_iter().enumerate() {
            let r = e
                .deduct(&d(
                    "reload",
                    &format!("b{round}-{k}"),
                    1,
                    &format!("x{round}-{k}"),
                ))
                .await;
            assert!(
                matches!(&r, Ok(x) if x.units_applied() == 1),
                "[{tag}] round {round}: after concurrent reloads ({n1} and {n2} segments; generation {g} with {segs} won), a deduct via engine {} got {r:?}; audit {:?}",
                k + 1,
                e1.audit(&s).await
            );
        }
        let a = e1.audit(&s).await.unwrap();
        assert!(
            a.ok && a.generation == g
                && a.loaded == total
                && a.segments.len() == segs as usize
                && a.sold == 2,
            "[{tag}] round {round}: generation {g} ({total} units, {segs} segments) won: {a:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e09_concurrent_reloads_leave_the_sku_sellable() {
    let srv = RedisServer::start();
    let b = Engine::builder().per_user_limit(0);
    let mem = MemoryStore::new();
    let (m1, m2) = (
        b.clone().build(mem.clone()).unwrap(),
        b.clone().build(mem).unwrap(),
    );
    let (r1, r2) = (
        redis_engine(&srv, b.clone()).await,
        redis_engine(&srv, b.clone()).await,
    );
    run_all(
        false,
        vec![
            ("memory", e09(m1, m2, 1000, "memory").boxed()),
            ("redis", e09(r1, r2, 60, "redis").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// 10. Generations stay unique across a Redis data loss; cached layouts follow the new one.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e10_generations_unique_across_redis_data_loss() {
    let srv = RedisServer::start();
    let plain = redis_engine(&srv, Engine::builder()).await;
    let coalesced = coalesced_engine(&srv, Engine::builder(), Coalescing::default(), "t").await;
    let loader = redis_engine(&srv, Engine::builder()).await;
    let s = sku("lost");
    let g1 = plain
        .load(&s, 40, LoadOptions::new(4).per_user_limit(1))
        .await
        .unwrap();
    // Both engines cache the layout (generation g1, 4 segments, limit 1).
    for (k, e) in [&plain, &coalesced].into_iter().enumerate() {
        let r = e
            .deduct(&d("lost", &format!("early{k}"), 1, &format!("e{k}")))
            .await;
        assert!(matches!(&r, Ok(x) if x.units_applied() == 1), "{r:?}");
    }
    assert_eq!(srv.cli(&["FLUSHALL"]), "OK");
    let missing = loader.audit(&s).await;
    assert!(
        missing.is_err(),
        "the SKU's data is gone, audit says {missing:?}"
    );
    let g2 = loader
        .load(&s, 30, LoadOptions::new(2).per_user_limit(3))
        .await
        .unwrap();
    assert!(
        g2 > g1,
        "after FLUSHALL, a new load got generation {g2}: not greater than the lost generation {g1}"
    );
    // The engines that cached the old layout follow the new one (2 segments, limit 3).
    for (name, e) in [("plain", &plain), ("coalesced", &coalesced)] {
        let r = e
            .deduct(&d(
                "lost",
                &format!("carl-{name}"),
                3,
                &format!("c3-{name}"),
            ))
            .await;
        assert!(
            matches!(&r, Ok(x) if x.units_applied() == 3),
            "[{name}] an engine that cached generation {g1} (limit 1) after the reload to {g2} (limit 3): 3 units got {r:?}"
        );
        let r = e
            .deduct(&d(
                "lost",
                &format!("carl-{name}"),
                1,
                &format!("c4-{name}"),
            ))
            .await;
        assert!(
            matches!(r, Ok(Deduction::LimitReached { limit: 3 })),
            "[{name}] {r:?}"
        );
    }
    let a = audit_ok(&loader, &s, "redis").await;
    assert!(
        a.generation == g2 && a.loaded == 30 && a.segments.len() == 2 && a.sold == 6,
        "{a:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 11. A reservation id names the generation its units are held in, even when a reload
//     happens right after the deduction.

async fn e11<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("regen");
    let mut caught = 0;
    let mut generation = e
        .load(&s, 100, LoadOptions::new(2).per_user_limit(1))
        .await
        .unwrap();
    for attempt in 0..60 {
        let r = rid(&format!("rv{attempt}"));
        let req = d("regen", &format!("u{attempt}"), 1, r.as_str());
        let home_at = at(&s, generation, home(&r, 2));
        let fut = e.reserve(&req, Duration::from_secs(30));
        tokio::pin!(fut);
        // Drive the reservation until its units are held in the store, but do not let it
        // finish: then reload the SKU (same engine), then let it finish.
        let early = loop {
            if let Poll::Ready(out) = poll!(fut.as_mut()) {
                break Some(out);
            }
            if e.store().record(home_at, &r).await.unwrap().is_some() {
                break None;
            }
        };
        if early.is_some() {
            continue;
        }
        let old = generation;
        generation = e
            .load(&s, 100, LoadOptions::new(2).replace(true).per_user_limit(1))
            .await
            .unwrap();
        let out = fut.await;
        caught += 1;
        match &out {
            Ok(Reserved::Held { id, .. } | Reserved::Replayed { id, .. }) => assert_eq!(
                id_generation(id),
                old,
                "[{tag}] units held in generation {old} (reloaded to {generation} right after), but the reservation id is {id}"
            ),
            other => panic!(
                "[{tag}] units held in generation {old} (reloaded to {generation} right after): {other:?}"
            ),
        }
        if caught >= 5 {
            break;
        }
    }
    assert!(caught > 0, "[{tag}] the window was never hit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e11_reservation_id_names_its_generation_across_a_reload() {
    let srv = RedisServer::start();
    // The memory store's reservation completes in one poll: no window to reload in.
    let (_, r, c) = three(&srv, quick()).await;
    run_all(
        true,
        vec![
            ("redis", e11(r, "redis").boxed()),
            ("coalesced", e11(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// 12. Every option is bounded; the largest accepted values work.

/// The largest value (in ms, up to 10^15 - 1, the scripts' largest integer) `set` may give
/// `base` and still validate; `base` must validate.
fn max_ms(base: &EngineOptions, set: impl Fn(&mut EngineOptions, Duration)) -> Duration {
    let ok = |ms: u64| {
        let mut o = base.clone();
        set(&mut o, Duration::from_millis(ms));
        o.validate().is_ok()
    };
    let (mut lo, mut hi) = (1u64, 999_999_999_999_999u64);
    while !ok(lo) {
        lo *= 2;
        assert!(lo < hi, "no accepted value");
    }
    if ok(hi) {
        return Duration::from_millis(hi);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ok(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Duration::from_millis(lo)
}

fn largest_options() -> EngineOptions {
    let mut o = EngineOptions::default();
    o.request_ttl = max_ms(&o, |o, d| o.request_ttl = d);
    o.user_claim_ttl = max_ms(&o, |o, d| o.user_claim_ttl = d);
    o.claim_lease = max_ms(&o, |o, d| o.claim_lease = d);
    o.pending_wait = max_ms(&o, |o, d| o.pending_wait = d);
    o.hint_ttl = max_ms(&o, |o, d| o.hint_ttl = d);
    o.guard_ttl = max_ms(&o, |o, d| o.guard_ttl = d);
    o.validate().unwrap();
    o
}

async fn e12_largest<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("huge");
    let generation = e
        .load(&s, 10, LoadOptions::new(2).per_user_limit(2))
        .await
        .unwrap();
    let o = e.options().clone();
    let claim_ttl = o.user_claim_ttl.as_millis() as u64;
    // Two pending claims in a row for one user (the second reads the entry the first wrote,
    // with its expiry ~now + user_claim_ttl), then a third that must parse both.
    let store = e.store();
    let (x1, x2, x3, una) = (rid("x1"), rid("x2"), rid("x3"), uid("una"));
    for (x, want) in [(&x1, true), (&x2, true), (&x3, false)] {
        let r = store
            .user_claim(&s, generation, args(&e, x, &una, 1, 0), 2, claim_ttl)
            .await;
        assert!(
            match &r {
                Ok(UserClaim::Ok) => want,
                Ok(UserClaim::Limit { used: 2, .. }) => !want,
                _ => false,
            },
            "[{tag}] with the largest accepted options ({o:?}): claim {x} of una got {r:?}"
        );
    }
    // Through the engine: another attempt of hugo is pending (claimed, not finished).
    let (h0, hugo) = (rid("c0"), uid("hugo"));
    let r = store
        .user_claim(&s, generation, args(&e, &h0, &hugo, 1, 0), 2, claim_ttl)
        .await;
    assert!(matches!(r, Ok(UserClaim::Ok)), "[{tag}] {r:?}");
    let r = e.deduct(&d("huge", "hugo", 1, "c1")).await;
    assert!(
        matches!(&r, Ok(x) if x.units_applied() == 1),
        "[{tag}] with the largest accepted options ({o:?}) and hugo's c0 pending: c1 got {r:?}"
    );
    store
        .user_finish(
            &s,
            generation,
            args(&e, &h0, &hugo, 1, 0),
            shardstock::store::UserFinish::Void,
        )
        .await
        .unwrap();
    let r = e.deduct(&d("huge", "hugo", 1, "c2")).await;
    assert!(
        matches!(&r, Ok(x) if x.units_applied() == 1),
        "[{tag}] c2: {r:?}"
    );
    let r = e.deduct(&d("huge", "hugo", 1, "c3")).await;
    assert!(
        matches!(r, Ok(Deduction::LimitReached { limit: 2 })),
        "[{tag}] c3: {r:?}"
    );
    // A fallback claim (lease = claim_lease) and a reservation as long as request_ttl.
    let f = sku("hugefb");
    e.load(&f, 2, LoadOptions::new(2).per_user_limit(2))
        .await
        .unwrap(); // [1, 1]
    let ids = homed("hf-", 2, 1, 2);
    let r = e.deduct(&d("hugefb", "fred", 2, &ids[0])).await;
    assert!(
        matches!(&r, Ok(x) if x.units_applied() == 2),
        "[{tag}] a deduction over two segments: {r:?}"
    );
    let (id, _) = held(
        e.reserve(&d("huge", "vera", 1, "v1"), o.request_ttl).await,
        tag,
    );
    assert!(e.cancel(&id).await.unwrap().done, "[{tag}]");
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(
        (a.sold, a.reserved, a.remaining),
        (2, 0, 8),
        "[{tag}] {a:?}"
    );
    let a = audit_ok(&e, &f, tag).await;
    assert_eq!((a.sold, a.remaining), (2, 0), "[{tag}] {a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e12_options_are_bounded_and_the_largest_work() {
    let o = largest_options();
    let srv = RedisServer::start();
    let b = EngineBuilder::with_options(o);
    let (m, r, c) = three(&srv, b).await;
    let mut failures = run(
        true,
        vec![
            ("memory", e12_largest(m, "memory").boxed()),
            ("redis", e12_largest(r, "redis").boxed()),
            ("coalesced", e12_largest(c, "coalesced").boxed()),
        ],
    )
    .await;

    // Absurd values are configuration errors.
    let absurd = Duration::from_millis(1_000_000_000_000_000); // 10^15 ms, ~31,700 years
    type Set = fn(&mut EngineOptions, Duration);
    let cases: [(&str, Set); 10] = [
        ("request_ttl", |o, d| o.request_ttl = d),
        ("claim_lease", |o, d| o.claim_lease = d),
        ("user_claim_ttl", |o, d| o.user_claim_ttl = d),
        ("pending_wait", |o, d| o.pending_wait = d),
        ("hint_ttl", |o, d| o.hint_ttl = d),
        ("guard_ttl", |o, d| o.guard_ttl = d),
        ("guard_cap", |o, _| o.guard_cap = usize::MAX),
        ("metric_sku_cap", |o, _| o.metric_sku_cap = usize::MAX),
        ("fallback_rounds", |o, _| o.fallback_rounds = u32::MAX),
        ("max_qty", |o, _| o.max_qty = u64::MAX),
    ];
    let mut accepted = Vec::new();
    for (name, set) in cases {
        let mut o = EngineOptions::default();
        set(&mut o, absurd);
        let built = EngineBuilder::with_options(o.clone()).build(MemoryStore::new());
        if !matches!(o.validate(), Err(Error::Config(_))) || !matches!(built, Err(Error::Config(_)))
        {
            accepted.push(name);
        }
    }
    if !accepted.is_empty() {
        failures.push(format!(
            "absurd values accepted (expected Error::Config): {accepted:?}"
        ));
    }
    check(failures);
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

// ---------------------------------------------------------------------------------------------
// Found by review: twins of one request id share one per-user entry. One twin (sold out)
// removed it while the other, paused, then sold: its "sold" found no entry, so the unit was
// never counted and the user could buy past the limit. "sold" now writes the entry back.

async fn twin_voided_entry<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("twinvoid");
    let generation = e
        .load(&s, 10, LoadOptions::new(1).per_user_limit(1))
        .await
        .unwrap();
    let (x1, bob) = (rid("x1"), uid("bob"));
    let st = e.store();
    let a = args(&e, &x1, &bob, 1, 0);
    assert_eq!(
        st.user_claim(&s, generation, a, 1, 60_000).await.unwrap(),
        UserClaim::Ok,
        "[{tag}]"
    );
    // Twin 1 sold nothing and removed the entry.
    st.user_finish(&s, generation, a, shardstock::store::UserFinish::Void)
        .await
        .unwrap();
    // Twin 2 (paused until now) sells and records it.
    let placed = st
        .deduct_home(at(&s, generation, home(&x1, 1)), a, OnShort::Claim)
        .await
        .unwrap();
    assert!(
        matches!(placed, HomeReply::Applied { .. }),
        "[{tag}] {placed:?}"
    );
    st.user_finish(&s, generation, a, shardstock::store::UserFinish::Sold)
        .await
        .unwrap();
    let r = e.deduct(&d("twinvoid", "bob", 1, "y1")).await.unwrap();
    assert_eq!(
        r,
        Deduction::LimitReached { limit: 1 },
        "[{tag}] bob bought x1 through the second twin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_sold_twin_is_counted_after_its_twin_removed_the_entry() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick()).await;
    run_all(
        true,
        vec![
            ("memory", twin_voided_entry(m, "memory").boxed()),
            ("redis", twin_voided_entry(r, "redis").boxed()),
            ("coalesced", twin_voided_entry(c, "coalesced").boxed()),
        ],
    )
    .await;
}
