//! One order per user (or at most K units): the in-process guard filters, the store decides at
//! the user's home segment (one script, the ledger included) — across several engine instances,
//! past `request_ttl` (with a limit, records live as long as the generation), at a home that
//! must move units in, in one round trip per sale, and with bounded memory.

use crate::common;
use common::edges::command_calls;
use common::*;
use futures::future::join_all;
use shardstock::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::time::Duration;

/// Counts live heap bytes, to measure the guard's memory per entry. The global allocator of the
/// whole test binary (every suite's).
struct Counting;
thread_local! {
    /// Bytes freed on this thread (the engine is dropped on the measuring thread: other
    /// tests of this binary allocating meanwhile on theirs do not count).
    static FREED: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
}
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        let _ = FREED.try_with(|f| f.set(f.get() + l.size() as isize));
        unsafe { System.dealloc(p, l) }
    }
}
#[global_allocator]
static A: Counting = Counting;

/// 1000 concurrent attempts by one user spread over 3 engine instances with their own
/// connections: exactly `limit` units sold to that user; 60 other users unaffected.
async fn one_user_many_instances(limit: u64, coalesce: bool) {
    one_user_many_instances_at(&RedisServer::start(), limit, coalesce, "t").await;
}

/// [`one_user_many_instances`] on `srv` (a server or a cluster), keys under `prefix`.
async fn one_user_many_instances_at(srv: &impl RedisAt, limit: u64, coalesce: bool, prefix: &str) {
    let mut engines = Vec::new();
    for _ in 0..3 {
        engines.push(if coalesce {
            coalesced_engine(srv, Engine::builder(), Coalescing::default(), prefix).await
        } else {
            prefixed_engine(srv, Engine::builder(), prefix).await
        });
    }
    let name = format!("one-user-{limit}");
    let sku = Sku::new(&name).unwrap();
    engines[0]
        .load(&sku, 500, LoadOptions::new(8).per_user_limit(limit))
        .await
        .unwrap();
    let attempts = (0..1000).map(|i| {
        let (e, name) = (engines[i % 3].clone(), name.clone());
        tokio::spawn(async move {
            let d = Deduct::new(&name, "greedy", 1, &format!("g{i}")).unwrap();
            e.deduct(&d).await.unwrap()
        })
    });
    let others = (0..60).map(|i| {
        let (e, name) = (engines[i % 3].clone(), name.clone());
        tokio::spawn(async move {
            let d = Deduct::new(&name, &format!("other{i}"), 1, &format!("o{i}")).unwrap();
            e.deduct(&d).await.unwrap()
        })
    });
    let mine: Vec<Deduction> = join_all(attempts)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let theirs: Vec<Deduction> = join_all(others)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let got: u64 = mine.iter().map(Deduction::units_applied).sum();
    assert_eq!(got, limit, "the user got {got} units with limit {limit}");
    assert!(
        mine.iter().all(|d| matches!(
            d,
            Deduction::Applied { .. } | Deduction::LimitReached { .. } | Deduction::UserBusy
        )),
        "{mine:?}"
    );
    assert!(theirs.iter().all(|d| d.units_applied() == 1), "{theirs:?}");
    let a = common::edges::swept(&engines[1], &sku, Duration::from_secs(2), "redis").await;
    assert!(a.ok && a.sold == limit + 60 && a.in_transit == 0, "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_user_gets_exactly_the_limit_across_instances() {
    one_user_many_instances(1, false).await;
    one_user_many_instances(3, false).await;
    // With request coalescing (each instance batches its own deductions).
    one_user_many_instances(1, true).await;
    one_user_many_instances(3, true).await;
}

/// A sold-out or insufficient attempt leaves the user free to buy later.
async fn failed_attempt_keeps_the_chance<S: Store>(e: Engine<S>) {
    let sku = Sku::new("later").unwrap();
    e.load(&sku, 0, LoadOptions::new(2).per_user_limit(1))
        .await
        .unwrap();
    let d = e
        .deduct(&Deduct::new("later", "amy", 1, "t1").unwrap())
        .await
        .unwrap();
    assert_eq!(d, Deduction::SoldOut);
    e.restock(&sku, 2, &RequestId::new("rs").unwrap())
        .await
        .unwrap();
    let d = e
        .deduct(&Deduct::new("later", "amy", 1, "t2").unwrap())
        .await
        .unwrap();
    assert_eq!(d.units_applied(), 1, "{d:?}");
    let d = e
        .deduct(&Deduct::new("later", "amy", 1, "t3").unwrap())
        .await
        .unwrap();
    assert_eq!(d, Deduction::LimitReached { limit: 1 });
    // A retry of the purchase that succeeded is a replay, not "limit reached".
    let d = e
        .deduct(&Deduct::new("later", "amy", 1, "t2").unwrap())
        .await
        .unwrap();
    assert!(matches!(d, Deduction::Replayed { .. }), "{d:?}");
    // Asking for more than the limit at once can never succeed.
    let d = e
        .deduct(&Deduct::new("later", "bob", 2, "b1").unwrap())
        .await
        .unwrap();
    assert_eq!(d, Deduction::OverLimit { limit: 1 });
    assert!(d.is_final(), "{d:?}");
    let a = e.audit(&sku).await.unwrap();
    assert!(a.ok && a.sold == 1 && a.remaining == 1, "{a:?}");
}

#[tokio::test]
async fn failed_attempts_leave_the_user_free_both_stores() {
    failed_attempt_keeps_the_chance(memory_engine(Engine::builder())).await;
    let srv = RedisServer::start();
    failed_attempt_keeps_the_chance(redis_engine(&srv, Engine::builder()).await).await;
}

/// Finding 1: the per-user limit must not lapse after `request_ttl`. With a limit, a sale's
/// record and the user's ledger live as long as the generation, whatever `request_ttl` says:
/// through two engines on one store (`request_ttl` 1500 ms), a purchase on engine A, 2.5 s of
/// waiting, then another request of the user on engine B (whose in-process guard never saw
/// the user) meets the limit; the first request still replays.
///
/// Mutation checks (done): giving the ledger a lifetime under a limit as without one —
/// `sell.lua` writing the ledger's `PEXPIREAT` (now + the record TTL) also when the segment has
/// a limit; `Segment::sell` setting the record's and the ledger's `until` to `now + ttl_ms`
/// whatever the limit — makes B's request apply (`Applied`, a second unit for a user with
/// limit 1), on `[redis]` and on `[memory]` respectively.
async fn limit_outlives_request_ttl<S: Store>(a: Engine<S>, b: Engine<S>, tag: &str) {
    assert_eq!(a.options().request_ttl, Duration::from_millis(1500));
    let sku = Sku::new("lasting").unwrap();
    a.load(&sku, 10, LoadOptions::new(4).per_user_limit(1))
        .await
        .unwrap();
    let d = |rid: &str| Deduct::new("lasting", "lena", 1, rid).unwrap();
    let r = a.deduct(&d("first")).await.unwrap();
    assert_eq!(r.units_applied(), 1, "[{tag}] {r:?}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let r = b.deduct(&d("second")).await.unwrap();
    assert_eq!(
        r,
        Deduction::LimitReached { limit: 1 },
        "[{tag}] lena bought on engine A 2.5 s ago (request_ttl 1.5 s); another request on engine B"
    );
    let r = a.deduct(&d("third")).await.unwrap();
    assert_eq!(r, Deduction::LimitReached { limit: 1 }, "[{tag}] engine A");
    for (name, e) in [("A", &a), ("B", &b)] {
        let r = e.deduct(&d("first")).await.unwrap();
        assert!(
            matches!(r, Deduction::Replayed { .. }),
            "[{tag}] lena's first request again, on engine {name}: {r:?}"
        );
    }
    let au = a.audit(&sku).await.unwrap();
    assert!(au.ok && au.sold == 1, "[{tag}] {au:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_user_limit_outlives_request_ttl_across_engines() {
    let b = || Engine::builder().request_ttl(Duration::from_millis(1500));
    let mem = MemoryStore::new();
    let memory = limit_outlives_request_ttl(
        b().build(mem.clone()).unwrap(),
        b().build(mem).unwrap(),
        "memory",
    );
    let srv = RedisServer::start();
    let redis = limit_outlives_request_ttl(
        redis_engine(&srv, b()).await,
        redis_engine(&srv, b()).await,
        "redis",
    );
    futures::join!(memory, redis);
}

/// A user whose home segment is empty still buys up to the limit (units move home first) and
/// no further; nothing is left in transit.
async fn limit_at_a_short_home<S: Store>(e: Engine<S>, tag: &str) {
    let sku = Sku::new("shorthome").unwrap();
    e.load(&sku, 3, LoadOptions::new(4).per_user_limit(2))
        .await
        .unwrap(); // [1, 1, 1, 0]
    let user = (0..)
        .map(|k| format!("s{k}"))
        .find(|u| {
            shardstock::segments::home(
                &UserId::new(u.as_str()).unwrap(),
                &RequestId::new("x").unwrap(),
                4,
                true,
            ) == 3
        })
        .unwrap();
    let r = e
        .deduct(&Deduct::new("shorthome", &user, 2, "a").unwrap())
        .await
        .unwrap();
    assert_eq!(r.units_applied(), 2, "[{tag}] {r:?}");
    let r = e
        .deduct(&Deduct::new("shorthome", &user, 1, "b").unwrap())
        .await
        .unwrap();
    assert_eq!(r, Deduction::LimitReached { limit: 2 }, "[{tag}]");
    let a = e.audit(&sku).await.unwrap();
    assert!(
        a.ok && (a.sold, a.remaining, a.in_transit) == (2, 1, 0) && a.segments[3].state.sold == 2,
        "[{tag}] {a:?}"
    );
}

#[tokio::test]
async fn the_limit_holds_at_a_home_that_moves_units_in() {
    limit_at_a_short_home(memory_engine(Engine::builder()), "memory").await;
    let srv = RedisServer::start();
    limit_at_a_short_home(redis_engine(&srv, Engine::builder()).await, "redis").await;
}

/// With a per-user limit, a sale whose home has the units is one store call: one `EVALSHA`
/// (`sell.lua`, the ledger check included), counted in `INFO commandstats` of a dedicated
/// redis-server, the store built without request coalescing. (Commands a script runs are
/// counted too, under their own names, so only script calls are compared: no `EVAL`, and one
/// `EVALSHA` per sale.) The same without a limit.
#[tokio::test]
async fn one_round_trip_per_sale_with_a_limit() {
    let srv = RedisServer::start();
    let e = redis_engine(&srv, Engine::builder()).await;
    assert!(
        e.store().coalescing().is_none(),
        "the store must not coalesce"
    );
    for (name, limit) in [("onetrip", 1), ("onetrip0", 0)] {
        let sku = Sku::new(name).unwrap();
        e.load(&sku, 1000, LoadOptions::new(4).per_user_limit(limit))
            .await
            .unwrap();
        // Warm up: the layout read (and the stock notifications' subscription).
        let r = e
            .deduct(&Deduct::new(name, "warm", 1, "w").unwrap())
            .await
            .unwrap();
        assert_eq!(r.units_applied(), 1);
        let calls = || {
            (
                command_calls(&srv, "evalsha"),
                command_calls(&srv, "eval") + command_calls(&srv, "eval_ro"),
            )
        };
        let before = calls();
        for i in 0..50 {
            let r = e
                .deduct(&Deduct::new(name, &format!("buyer{i}"), 1, &format!("p{i}")).unwrap())
                .await
                .unwrap();
            assert_eq!(r.units_applied(), 1, "{r:?}");
        }
        let after = calls();
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (50, 0),
            "limit {limit}: 50 sales took {} EVALSHA and {} EVAL",
            after.0 - before.0,
            after.1 - before.1
        );
        let a = e.audit(&sku).await.unwrap();
        assert!(a.ok && a.sold == 51, "{a:?}");
    }
}

/// The per-user suites on a 3-master cluster (one cluster for all, one key prefix each): the
/// user's record and the segments live in different slots, on different masters.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_user_limit_on_a_cluster() {
    let c = cluster::RedisCluster::start(3, 0);
    for (limit, coalesce, prefix) in [(1, false, "l1"), (3, false, "l3"), (1, true, "c1")] {
        one_user_many_instances_at(&c, limit, coalesce, prefix).await;
    }
    failed_attempt_keeps_the_chance(prefixed_engine(&c, Engine::builder(), "failed").await).await;
    limit_at_a_short_home(
        prefixed_engine(&c, Engine::builder(), "short").await,
        "cluster",
    )
    .await;
}

/// 100,000 distinct users through one engine: the in-process guard stays within its cap.
/// Also measures the guard's bytes per entry (printed; see README).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_memory_is_bounded() {
    let cap = 20_000;
    let e = memory_engine(Engine::builder().guard(Duration::from_secs(600), cap));
    let sku = Sku::new("crowd").unwrap();
    e.load(&sku, 200_000, LoadOptions::new(16).per_user_limit(1))
        .await
        .unwrap();
    let tasks = (0..4u64).map(|t| {
        let e = e.clone();
        tokio::spawn(async move {
            let mut max = 0;
            for i in (t..100_000).step_by(4) {
                let d = Deduct::new("crowd", &format!("user-{i:06}"), 1, &format!("q{i}")).unwrap();
                assert_eq!(e.deduct(&d).await.unwrap().units_applied(), 1);
                max = max.max(e.guard_len());
            }
            max
        })
    });
    let max = join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .max()
        .unwrap();
    assert!(max <= cap, "guard held {max} entries with cap {cap}");
    assert_eq!(e.audit(&sku).await.unwrap().sold, 100_000);

    // Bytes per entry: what dropping an engine whose guard holds 100,000 entries frees (its
    // store, shared with a clone kept here, stays), so no store memory is counted.
    let store = MemoryStore::new();
    let e = Engine::builder()
        .guard(Duration::from_secs(600), 200_000)
        .build(store.clone())
        .unwrap();
    let s = Sku::new("crowd2").unwrap();
    e.load(&s, 100_000, LoadOptions::new(1).per_user_limit(1))
        .await
        .unwrap();
    for i in 0..100_000 {
        let d = Deduct::new("crowd2", &format!("user-{i:06}"), 1, &format!("q{i}")).unwrap();
        assert_eq!(e.deduct(&d).await.unwrap().units_applied(), 1);
    }
    // A cache of sets of 8: at half its cap, a set that drew more than 8 of the users drops
    // its least recent idle ones (~1 %).
    let held = e.guard_len();
    assert!((98_000..=100_000).contains(&held), "{held} entries held");
    let before = FREED.with(|f| f.get());
    drop(e);
    let per_entry = (FREED.with(|f| f.get()) - before) as f64 / held as f64;
    eprintln!(
        "in-process guard: {per_entry:.0} bytes per entry (user ids of 11 bytes, one applied request id)"
    );
    assert!(per_entry > 50.0 && per_entry < 1024.0, "{per_entry}");
}
