//! Edge cases of the engine options: every option is bounded, and the largest accepted values
//! work (claims, fallbacks and reservations at the longest timers).
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
use shardstock::store::UserClaim;
use shardstock::*;
use std::time::Duration;

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
