//! One order per user (or at most K units): the in-process guard filters, the store decides —
//! across several engine instances, through crashes, and with bounded memory.

mod common;
use common::*;
use futures::future::join_all;
use shardstock::store::{HomeReply, OnShort, ReqArgs, SegAddr, UserClaim};
use shardstock::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

/// Counts live heap bytes, to measure the guard's memory per entry.
struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
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
    let a = engines[1].audit(&sku).await.unwrap();
    assert!(a.ok && a.sold == limit + 60, "{a:?}");
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

/// A process claims the user and dies (before deducting, or after deducting but before
/// settling the user record). Once its claim expires, the user is freed in the first case and
/// counted in the second — never locked out for good, never allowed twice. A paused process
/// waking after its claim was verified void cannot sell (its request id is sealed).
async fn dead_claimer<S: Store>(e: Engine<S>) {
    let sku = Sku::new("dead").unwrap();
    let generation = e
        .load(&sku, 10, LoadOptions::new(2).per_user_limit(1))
        .await
        .unwrap();
    let st = e.store();
    let sku_ref = &sku;
    let claim = |rid: &'static str, user: &'static str| async move {
        let (r, u) = (RequestId::new(rid).unwrap(), UserId::new(user).unwrap());
        let args = ReqArgs {
            attempt: 0,
            request_id: &r,
            user: &u,
            qty: 1,
            ttl_ms: 60_000,
            lease_ms: 5_000,
            resv_ttl_ms: 0,
            kind: shardstock::store::RequestKind::Sale,
        };
        st.user_claim(sku_ref, generation, args, 1, 200)
            .await
            .unwrap()
    };
    // Case 1: claimed, died before deducting.
    assert_eq!(claim("ghost-1", "cid").await, UserClaim::Ok);
    let d = e
        .deduct(&Deduct::new("dead", "cid", 1, "c-1").unwrap())
        .await
        .unwrap();
    assert_eq!(
        d,
        Deduction::UserBusy,
        "the pending claim counts until it expires (busy: the user holds nothing yet)"
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    let d = e
        .deduct(&Deduct::new("dead", "cid", 1, "c-2").unwrap())
        .await
        .unwrap();
    assert_eq!(
        d.units_applied(),
        1,
        "the expired claim freed the user: {d:?}"
    );
    // The ghost wakes up and tries to deduct: sealed, nothing sold.
    let ghost = e
        .deduct(&Deduct::new("dead", "cid", 1, "ghost-1").unwrap())
        .await;
    assert!(
        matches!(
            ghost,
            Err(Error::Sealed(_)) | Ok(Deduction::LimitReached { .. })
        ),
        "{ghost:?}"
    );

    // Case 2: claimed, deducted, died before settling the user record.
    assert_eq!(claim("ghost-2", "dee").await, UserClaim::Ok);
    let (r, u) = (
        RequestId::new("ghost-2").unwrap(),
        UserId::new("dee").unwrap(),
    );
    let args = ReqArgs {
        attempt: 0,
        request_id: &r,
        user: &u,
        qty: 1,
        ttl_ms: 60_000,
        lease_ms: 5_000,
        resv_ttl_ms: 0,
        kind: shardstock::store::RequestKind::Sale,
    };
    let home = shardstock::segments::home(&r, 2);
    // The segment as placed (on a cluster its hash tag carries the load's placement suffix).
    let meta = st.meta(&sku).await.unwrap().expect("loaded");
    let at = SegAddr::new(&sku, generation, home).with_suffix(meta.placement.suffix(home));
    assert!(matches!(
        st.deduct_home(at, args, OnShort::Claim).await.unwrap(),
        HomeReply::Applied { .. }
    ));
    tokio::time::sleep(Duration::from_millis(250)).await;
    let d = e
        .deduct(&Deduct::new("dead", "dee", 1, "d-2").unwrap())
        .await
        .unwrap();
    assert_eq!(
        d,
        Deduction::LimitReached { limit: 1 },
        "dee already bought once"
    );
    let a = e.audit(&sku).await.unwrap();
    assert!(a.ok && a.sold == 2, "{a:?}");
}

#[tokio::test]
async fn dead_claimers_neither_lock_out_nor_double_sell() {
    dead_claimer(memory_engine(Engine::builder())).await;
    let srv = RedisServer::start();
    dead_claimer(redis_engine(&srv, Engine::builder()).await).await;
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
    dead_claimer(prefixed_engine(&c, Engine::builder(), "dead").await).await;
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
    assert!(max <= cap + 4, "guard held {max} entries with cap {cap}");
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
    assert_eq!(e.guard_len(), 100_000);
    let before = LIVE.load(Ordering::Relaxed);
    drop(e);
    let per_entry = (before - LIVE.load(Ordering::Relaxed)) as f64 / 100_000.0;
    eprintln!(
        "in-process guard: {per_entry:.0} bytes per entry (user ids of 11 bytes, one applied request id)"
    );
    assert!(per_entry > 50.0 && per_entry < 1024.0, "{per_entry}");
}
