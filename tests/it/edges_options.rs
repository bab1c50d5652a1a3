//! Edge cases of the engine options: every option is bounded (absurd values are
//! `Error::Config`, naming the option), and the largest accepted values work — request records,
//! reservations and transfer leases at the longest timers, through the scripts' arithmetic on
//! server milliseconds.
//!
//! Runs against real stores: the embedded `MemoryStore` and `redis-server` processes (plain
//! and with request coalescing), each store's failure named. Shared helpers:
//! `tests/it/common/edges.rs`.

use crate::common;
use common::edges::*;
use common::*;
use futures::FutureExt;
use shardstock::engine::MAX_DURATION;
use shardstock::*;
use std::time::Duration;

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
    o.transfer_lease = max_ms(&o, |o, d| o.transfer_lease = d);
    o.hint_ttl = max_ms(&o, |o, d| o.hint_ttl = d);
    o.sold_out_ttl = max_ms(&o, |o, d| o.sold_out_ttl = d);
    o.guard_ttl = max_ms(&o, |o, d| o.guard_ttl = d);
    o.validate().unwrap();
    o
}

async fn largest<S: Store>(e: Engine<S>, tag: &'static str) {
    let o = e.options().clone();
    assert_eq!(o.request_ttl, MAX_DURATION, "[{tag}]");
    // Sales and reservations as long as request_ttl, with and without a per-user limit.
    for limit in [0, 2] {
        let name = format!("huge{limit}");
        let s = sku(&name);
        e.load(&s, 10, LoadOptions::new(2).per_user_limit(limit))
            .await
            .unwrap();
        let r = e.deduct(&d(&name, "hugo", 1, "c1")).await.unwrap();
        assert_eq!(r.units_applied(), 1, "[{tag}] limit {limit}: {r:?}");
        let r = e.deduct(&d(&name, "hugo", 1, "c1")).await.unwrap();
        assert!(matches!(r, Deduction::Replayed { .. }), "[{tag}] {r:?}");
        let (id, _) = held(
            e.reserve(&d(&name, "vera", 1, "v1"), o.request_ttl).await,
            tag,
        );
        let r = e.confirm(&id).await.unwrap();
        assert!(r.done, "[{tag}] limit {limit}: confirm {r:?}");
        let (id, _) = held(
            e.reserve(&d(&name, "vera", 1, "v2"), o.request_ttl).await,
            tag,
        );
        assert!(e.cancel(&id).await.unwrap().done, "[{tag}]");
        let a = audit_ok(&e, &s, tag).await;
        assert_eq!(
            (a.sold, a.reserved, a.remaining),
            (2, 0, 8),
            "[{tag}] limit {limit}: {a:?}"
        );
    }
    // A sale that moves units home, under the longest transfer lease.
    let f = sku("hugemv");
    e.load(&f, 2, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap(); // [1, 1]
    let r = e.deduct(&d("hugemv", "fred", 2, "f1")).await.unwrap();
    assert_eq!(
        r.units_applied(),
        2,
        "[{tag}] a deduction needing a transfer: {r:?}"
    );
    let a = audit_ok(&e, &f, tag).await;
    assert_eq!(
        (a.sold, a.remaining, a.in_transit),
        (2, 0, 0),
        "[{tag}] {a:?}"
    );
    e.sweep().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_are_bounded_and_the_largest_work() {
    let o = largest_options();
    let srv = RedisServer::start();
    let b = EngineBuilder::with_options(o);
    let (m, r, c) = three(&srv, b).await;
    let mut failures = run(
        true,
        vec![
            ("memory", largest(m, "memory").boxed()),
            ("redis", largest(r, "redis").boxed()),
            ("coalesced", largest(c, "coalesced").boxed()),
        ],
    )
    .await;

    // Absurd values are configuration errors, naming the option.
    let absurd = Duration::from_millis(1_000_000_000_000_000); // 10^15 ms, ~31,700 years
    type Set = fn(&mut EngineOptions, Duration);
    let cases: [(&str, Set); 13] = [
        ("request_ttl", |o, d| o.request_ttl = d),
        ("transfer_lease", |o, d| o.transfer_lease = d),
        ("hint_ttl", |o, d| o.hint_ttl = d),
        ("sold_out_ttl", |o, d| o.sold_out_ttl = d),
        ("guard_ttl", |o, d| o.guard_ttl = d),
        ("request_ttl", |o, _| o.request_ttl = Duration::ZERO),
        ("transfer_lease", |o, _| {
            o.transfer_lease = Duration::from_micros(999)
        }),
        ("guard_cap", |o, _| o.guard_cap = usize::MAX),
        ("guard_cap", |o, _| o.guard_cap = 0),
        ("metric_sku_cap", |o, _| o.metric_sku_cap = usize::MAX),
        ("max_qty", |o, _| o.max_qty = u64::MAX),
        ("max_qty", |o, _| o.max_qty = 0),
        ("per_user_limit", |o, _| o.per_user_limit = u64::MAX),
    ];
    let mut accepted = Vec::new();
    for (name, set) in cases {
        let mut o = EngineOptions::default();
        set(&mut o, absurd);
        let built = EngineBuilder::with_options(o.clone()).build(MemoryStore::new());
        let named = matches!(o.validate(), Err(Error::Config(ref m)) if m.contains(name));
        if !named || !matches!(built, Err(Error::Config(_))) {
            accepted.push(format!("{name}: {:?}", o.validate()));
        }
    }
    if !accepted.is_empty() {
        failures.push(format!(
            "absurd values accepted or not named (expected Error::Config naming the option): {accepted:?}"
        ));
    }
    // The defaults validate; the largest accepted durations are MAX_DURATION.
    EngineOptions::default().validate().unwrap();
    let o = largest_options();
    for (name, d) in [
        ("request_ttl", o.request_ttl),
        ("transfer_lease", o.transfer_lease),
        ("guard_ttl", o.guard_ttl),
    ] {
        if d != MAX_DURATION {
            failures.push(format!("{name}: largest accepted {d:?}, not MAX_DURATION"));
        }
    }
    check(failures);
}

/// A reservation TTL must be positive and at most `request_ttl`; a quantity 1..=max_qty.
async fn request_bounds<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("bounds");
    e.load(&s, 10, LoadOptions::new(1).per_user_limit(0))
        .await
        .unwrap();
    let rt = e.options().request_ttl;
    for ttl in [Duration::ZERO, rt + Duration::from_millis(1)] {
        let r = e.reserve(&d("bounds", "u", 1, "r"), ttl).await;
        assert!(
            matches!(r, Err(Error::InvalidInput { field: "ttl", .. })),
            "[{tag}] reservation ttl {ttl:?}: {r:?}"
        );
    }
    for qty in [0, e.options().max_qty + 1] {
        let r = e.deduct(&d("bounds", "u", qty, "q")).await;
        assert!(
            matches!(r, Err(Error::InvalidInput { field: "qty", .. })),
            "[{tag}] qty {qty}: {r:?}"
        );
    }
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!((a.sold, a.reserved), (0, 0), "[{tag}] {a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bounds_are_checked_before_anything_is_written() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick().max_qty(5)).await;
    run_all(
        true,
        vec![
            ("memory", request_bounds(m, "memory").boxed()),
            ("redis", request_bounds(r, "redis").boxed()),
            ("coalesced", request_bounds(c, "coalesced").boxed()),
        ],
    )
    .await;
}
