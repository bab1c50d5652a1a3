//! Deduction under concurrency, replays, units moved home by transfers and no-undersell — on
//! both stores, with real redis-server processes for the Redis store. Conservation is checked
//! with the units in transit: none once every call has answered.

use crate::common;
use common::*;
use futures::future::join_all;
use shardstock::*;

fn sku(s: &str) -> Sku {
    Sku::new(s).unwrap()
}

/// Asserts the conservation law (every call answered: nothing in transit, also after a
/// sweep) and returns (remaining, sold).
async fn conserved<S: Store>(e: &Engine<S>, s: &Sku, loaded: u64, restocked: u64) -> (u64, u64) {
    let a = e.audit(s).await.unwrap();
    assert!(a.ok, "audit failed: {:?}", a.problems);
    assert_eq!(a.loaded, loaded);
    assert_eq!(a.restocked, restocked);
    assert_eq!(
        a.in_transit, 0,
        "units in transit after every call answered: {a:?}"
    );
    assert_eq!(
        a.loaded + a.restocked,
        a.remaining + a.in_transit + a.reserved + a.sold
    );
    assert!(a.sold <= a.loaded + a.restocked, "oversold: {a:?}");
    e.sweep().await.unwrap();
    assert_eq!(e.audit(s).await.unwrap(), a, "the sweep changed something");
    let r = e.remaining(s).await.unwrap();
    assert_eq!((r.total, r.in_transit), (a.remaining, 0));
    assert_eq!(r.per_segment.iter().sum::<u64>(), a.remaining);
    (a.remaining, a.sold)
}

/// 300 buyers race for 100 units: exactly 100 sold, none left, every buyer answered.
async fn flash_sale<S: Store>(e: Engine<S>, segments: u32) {
    let s = sku(&format!("flash-{segments}"));
    e.load(&s, 100, LoadOptions::new(segments)).await.unwrap();
    let buyers = (0..300).map(|i| {
        let e = e.clone();
        tokio::spawn(async move {
            let d = Deduct::new(
                &format!("flash-{segments}"),
                &format!("u{i}"),
                1,
                &format!("r{i}"),
            )
            .unwrap();
            e.deduct(&d).await.unwrap()
        })
    });
    let outcomes: Vec<Deduction> = join_all(buyers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let applied = outcomes
        .iter()
        .filter(|d| matches!(d, Deduction::Applied { .. }))
        .count();
    let sold_out = outcomes
        .iter()
        .filter(|d| **d == Deduction::SoldOut)
        .count();
    assert_eq!(applied, 100, "{outcomes:?}");
    assert_eq!(sold_out, 200);
    let sold_units: u64 = outcomes.iter().map(Deduction::units_applied).sum();
    assert_eq!(sold_units, 100);
    assert_eq!(conserved(&e, &s, 100, 0).await, (0, 100));
}

/// Buyers asking 1..=4 units race for 97 units: never more sold than loaded, conservation
/// holds, and what the buyers were told adds up to what the store says.
async fn mixed_quantities<S: Store>(e: Engine<S>, segments: u32) {
    let name = format!("mixed-{segments}");
    let s = sku(&name);
    e.load(&s, 97, LoadOptions::new(segments)).await.unwrap();
    let buyers = (0..256u64).map(|i| {
        let (e, name) = (e.clone(), name.clone());
        tokio::spawn(async move {
            let d = Deduct::new(&name, &format!("u{i}"), 1 + i % 4, &format!("m{i}")).unwrap();
            e.deduct(&d).await.unwrap()
        })
    });
    let told: u64 = join_all(buyers)
        .await
        .into_iter()
        .map(|r| r.unwrap().units_applied())
        .sum();
    let (remaining, sold) = conserved(&e, &s, 97, 0).await;
    assert_eq!(told, sold);
    // 256 requests ask for ~640 units: stock can only be left if it is below the smallest ask
    // that came after it ran short, and 1-unit asks are a quarter of all.
    assert!(remaining <= 3, "left {remaining}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flash_sale_memory_1_and_10_segments() {
    flash_sale(memory_engine(Engine::builder().per_user_limit(0)), 1).await;
    flash_sale(memory_engine(Engine::builder().per_user_limit(0)), 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flash_sale_redis_1_and_10_segments() {
    let srv = RedisServer::start();
    flash_sale(
        redis_engine(&srv, Engine::builder().per_user_limit(0)).await,
        1,
    )
    .await;
    flash_sale(
        redis_engine(&srv, Engine::builder().per_user_limit(0)).await,
        10,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mixed_quantities_both_stores() {
    mixed_quantities(memory_engine(Engine::builder().per_user_limit(0)), 1).await;
    mixed_quantities(memory_engine(Engine::builder().per_user_limit(0)), 10).await;
    let srv = RedisServer::start();
    mixed_quantities(
        redis_engine(&srv, Engine::builder().per_user_limit(0)).await,
        1,
    )
    .await;
    mixed_quantities(
        redis_engine(&srv, Engine::builder().per_user_limit(0)).await,
        10,
    )
    .await;
}

/// One request sent 50 times at once has exactly one effect; every copy reports the same
/// segment (its home) and units. `qty` 3 over 10 one-unit segments forces units to move home.
async fn concurrent_replays<S: Store>(e: Engine<S>, stock: u64, qty: u64) {
    let name = format!("replay-{stock}-{qty}");
    let s = sku(&name);
    e.load(&s, stock, LoadOptions::new(10)).await.unwrap();
    let copies = (0..50).map(|_| {
        let (e, name) = (e.clone(), name.clone());
        tokio::spawn(async move {
            e.deduct(&Deduct::new(&name, "alice", qty, "same-id").unwrap())
                .await
                .unwrap()
        })
    });
    let outcomes: Vec<Deduction> = join_all(copies)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let applied: Vec<_> = outcomes
        .iter()
        .filter(|d| matches!(d, Deduction::Applied { .. }))
        .collect();
    assert_eq!(applied.len(), 1, "{outcomes:?}");
    let &Deduction::Applied { segment, units } = applied[0] else {
        unreachable!()
    };
    let home = shardstock::segments::home(
        &UserId::new("alice").unwrap(),
        &RequestId::new("same-id").unwrap(),
        10,
        false,
    );
    assert_eq!((segment, units), (home, qty));
    for d in &outcomes {
        match *d {
            Deduction::Applied {
                segment: s,
                units: u,
            }
            | Deduction::Replayed {
                segment: s,
                units: u,
            } => assert_eq!((s, u), (segment, units)),
            ref other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(conserved(&e, &s, stock, 0).await, (stock - qty, qty));
    // And once more, later: still a replay.
    let again = e
        .deduct(&Deduct::new(&name, "alice", qty, "same-id").unwrap())
        .await
        .unwrap();
    assert_eq!(again, Deduction::Replayed { segment, units });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replayed_request_id_has_one_effect() {
    concurrent_replays(memory_engine(Engine::builder().per_user_limit(0)), 100, 1).await;
    concurrent_replays(memory_engine(Engine::builder().per_user_limit(0)), 10, 3).await;
    let srv = RedisServer::start();
    concurrent_replays(
        redis_engine(&srv, Engine::builder().per_user_limit(0)).await,
        100,
        1,
    )
    .await;
    concurrent_replays(
        redis_engine(&srv, Engine::builder().per_user_limit(0)).await,
        10,
        3,
    )
    .await;
}

/// Same request (user and request id) with other parameters is an error and changes
/// nothing; the same request id under another user is another request.
async fn request_id_conflicts<S: Store>(e: Engine<S>) {
    let s = sku("conflict");
    e.load(&s, 10, LoadOptions::new(2)).await.unwrap();
    e.deduct(&Deduct::new("conflict", "u1", 2, "r1").unwrap())
        .await
        .unwrap();
    let err = e
        .deduct(&Deduct::new("conflict", "u1", 3, "r1").unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::RequestIdConflict { field: "qty", .. }),
        "{err:?}"
    );
    let err = e
        .reserve(
            &Deduct::new("conflict", "u1", 2, "r1").unwrap(),
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::RequestIdConflict { field: "kind", .. }),
        "{err:?}"
    );
    assert_eq!(conserved(&e, &s, 10, 0).await, (8, 2));
    let other = e
        .deduct(&Deduct::new("conflict", "u2", 2, "r1").unwrap())
        .await
        .unwrap();
    assert_eq!(
        other.units_applied(),
        2,
        "another user's request: {other:?}"
    );
    assert_eq!(conserved(&e, &s, 10, 0).await, (6, 4));
}

#[tokio::test]
async fn request_id_conflicts_both_stores() {
    request_id_conflicts(memory_engine(Engine::builder().per_user_limit(0))).await;
    let srv = RedisServer::start();
    request_id_conflicts(redis_engine(&srv, Engine::builder().per_user_limit(0)).await).await;
}

/// Stock scattered one unit per segment; a request for 3 must still succeed (no undersell):
/// the units move to its home and it sells there, all or nothing; a request for more than is
/// left changes nothing.
async fn fallback_no_undersell<S: Store>(e: Engine<S>) {
    let s = sku("scatter");
    e.load(&s, 10, LoadOptions::new(10)).await.unwrap();
    // Sell 1 unit from 7 segments one by one, leaving 3 segments with 1 unit each.
    let mut i = 0;
    while e.remaining(&s).await.unwrap().total > 3 {
        e.deduct(&Deduct::new("scatter", &format!("a{i}"), 1, &format!("a{i}")).unwrap())
            .await
            .unwrap();
        i += 1;
    }
    let scattered = e.remaining(&s).await.unwrap();
    assert_eq!(scattered.per_segment.iter().filter(|u| **u == 1).count(), 3);
    // 4 is more than is left: nothing is sold (units it moved to its home stay there,
    // sellable: never refunded).
    let d = e
        .deduct(&Deduct::new("scatter", "bob", 4, "b4").unwrap())
        .await
        .unwrap();
    assert_eq!(d, Deduction::Insufficient { available: 3 });
    let before = e.remaining(&s).await.unwrap();
    assert_eq!((before.total, before.in_transit), (3, 0), "{before:?}");
    assert_eq!(conserved(&e, &s, 10, 0).await, (3, 7));
    // 3 from where they are, moved to the request's home and sold there.
    let a0 = e.audit(&s).await.unwrap();
    let d = e
        .deduct(&Deduct::new("scatter", "bob", 3, "b3").unwrap())
        .await
        .unwrap();
    let home = shardstock::segments::home(
        &UserId::new("bob").unwrap(),
        &RequestId::new("b3").unwrap(),
        10,
        false,
    );
    assert_eq!(
        d,
        Deduction::Applied {
            segment: home,
            units: 3
        }
    );
    // Every unit not yet at its home was moved there, once.
    let a = e.audit(&s).await.unwrap();
    let at_home = before.per_segment[home as usize];
    let moved = |a: &Audit| a.segments[home as usize].state.moved_in;
    assert_eq!(moved(&a) - moved(&a0), 3 - at_home, "{a:?}");
    assert_eq!(conserved(&e, &s, 10, 0).await, (0, 10));
    // The insufficient request's id stayed free: after a restock it is a fresh attempt.
    e.restock(&s, 4, &RequestId::new("re1").unwrap())
        .await
        .unwrap();
    let d = e
        .deduct(&Deduct::new("scatter", "bob", 4, "b4").unwrap())
        .await
        .unwrap();
    assert_eq!(d.units_applied(), 4, "{d:?}");
    assert_eq!(conserved(&e, &s, 10, 4).await, (0, 14));
}

#[tokio::test]
async fn fallback_no_undersell_both_stores() {
    fallback_no_undersell(memory_engine(Engine::builder().per_user_limit(0))).await;
    let srv = RedisServer::start();
    fallback_no_undersell(redis_engine(&srv, Engine::builder().per_user_limit(0)).await).await;
}

/// Sold out is never answered from a stale hint: a restock made through *another* engine
/// instance (whose hints this one never saw) is sellable at once.
#[tokio::test]
async fn restock_by_another_instance_sells_at_once() {
    restock_by_another_instance(&RedisServer::start()).await;
}

async fn restock_by_another_instance(srv: &impl RedisAt) {
    let long_hints = || {
        Engine::builder()
            .per_user_limit(0)
            .hint_ttl(std::time::Duration::from_secs(3600))
    };
    let a = redis_engine(srv, long_hints()).await;
    let b = redis_engine(srv, long_hints()).await;
    let s = sku("restock");
    a.load(&s, 4, LoadOptions::new(4)).await.unwrap();
    for i in 0..4 {
        let d = a
            .deduct(&Deduct::new("restock", &format!("u{i}"), 1, &format!("x{i}")).unwrap())
            .await
            .unwrap();
        assert_eq!(d.units_applied(), 1);
    }
    // Every segment is now hinted empty in `a`.
    assert_eq!(
        a.deduct(&Deduct::new("restock", "late", 1, "late-1").unwrap())
            .await
            .unwrap(),
        Deduction::SoldOut
    );
    let r = b
        .restock(&s, 1, &RequestId::new("rs-1").unwrap())
        .await
        .unwrap();
    assert_eq!(
        r,
        Restocked {
            added: 1,
            replayed: false
        }
    );
    // A retry of the same restock adds nothing.
    let r = b
        .restock(&s, 1, &RequestId::new("rs-1").unwrap())
        .await
        .unwrap();
    assert_eq!(
        r,
        Restocked {
            added: 0,
            replayed: true
        }
    );
    let d = a
        .deduct(&Deduct::new("restock", "late", 1, "late-2").unwrap())
        .await
        .unwrap();
    assert_eq!(d.units_applied(), 1, "{d:?}");
    assert_eq!(conserved(&a, &s, 4, 1).await, (0, 5));
    // Same restock id with another quantity is a conflict.
    assert!(matches!(
        b.restock(&s, 2, &RequestId::new("rs-1").unwrap()).await,
        Err(Error::RequestIdConflict { field: "qty", .. })
    ));
}

/// Restock spreads units evenly and is idempotent per request id on both stores.
async fn restock_spreads<S: Store>(e: Engine<S>) {
    let s = sku("spread");
    e.load(&s, 0, LoadOptions::new(4)).await.unwrap();
    e.restock(&s, 10, &RequestId::new("r").unwrap())
        .await
        .unwrap();
    let mut per = e.remaining(&s).await.unwrap().per_segment;
    per.sort();
    assert_eq!(per, vec![2, 2, 3, 3]);
    e.restock(&s, 10, &RequestId::new("r").unwrap())
        .await
        .unwrap();
    assert_eq!(conserved(&e, &s, 0, 10).await, (10, 0));
    // The same id with another quantity is refused before anything changes, including on
    // segments the first restock never touched.
    e.restock(&s, 1, &RequestId::new("one").unwrap())
        .await
        .unwrap();
    for qty in [2, 3, 9] {
        assert!(matches!(
            e.restock(&s, qty, &RequestId::new("one").unwrap()).await,
            Err(Error::RequestIdConflict { field: "qty", .. })
        ));
    }
    assert_eq!(conserved(&e, &s, 0, 11).await, (11, 0));
}

#[tokio::test]
async fn restock_spreads_both_stores() {
    restock_spreads(memory_engine(Engine::builder().per_user_limit(0))).await;
    let srv = RedisServer::start();
    restock_spreads(redis_engine(&srv, Engine::builder().per_user_limit(0)).await).await;
}

/// The suites above on a 3-master cluster (one cluster for all of them, one key prefix each):
/// segments on several masters, units moved between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn core_suites_on_a_cluster() {
    let c = cluster::RedisCluster::start(3, 0);
    let e = |prefix: &'static str| prefixed_engine(&c, Engine::builder().per_user_limit(0), prefix);
    flash_sale(e("f1").await, 1).await;
    flash_sale(e("f10").await, 10).await;
    mixed_quantities(e("m1").await, 1).await;
    mixed_quantities(e("m10").await, 10).await;
    concurrent_replays(e("r1").await, 100, 1).await;
    concurrent_replays(e("r3").await, 10, 3).await;
    request_id_conflicts(e("c").await).await;
    fallback_no_undersell(e("n").await).await;
    restock_spreads(e("s").await).await;
    restock_by_another_instance(&c).await;
}

/// One request that needs more donors than one `sell` takes credits (250 units from
/// one-unit segments): sold in full, conserved, on both stores.
async fn many_small_donors<S: Store>(e: Engine<S>) {
    let s = sku("crumbs");
    e.load(&s, 400, LoadOptions::new(1024).per_user_limit(0))
        .await
        .unwrap();
    let d = e
        .deduct(&Deduct::new("crumbs", "u1", 250, "r1").unwrap())
        .await;
    assert_eq!(
        d.as_ref().ok().map(Deduction::units_applied),
        Some(250),
        "{d:?}"
    );
    let (remaining, sold) = conserved(&e, &s, 400, 0).await;
    assert_eq!((remaining, sold), (150, 250));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_from_many_small_donors_both_stores() {
    many_small_donors(memory_engine(Engine::builder().per_user_limit(0))).await;
    let srv = RedisServer::start();
    many_small_donors(redis_engine(&srv, Engine::builder().per_user_limit(0)).await).await;
}
