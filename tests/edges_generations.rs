//! Edge cases of generations: concurrent reloads, a Redis data loss, and reservation ids that
//! name the generation their units are held in across a reload.
//!
//! Each asserts the behaviour promised after the fixes of issue 11, against real stores: the
//! embedded `MemoryStore` and `redis-server` processes (plain and with request coalescing).
//! Crash points are simulated with store-level calls (`engine.store()`) or by dropping futures.
//! Where a case runs on several stores, every store runs to its end and the test then fails
//! with each store's failure, named (`[redis] ...`). Shared helpers: `tests/common/edges.rs`.

mod common;
use common::edges::*;
use common::*;
use futures::{FutureExt, poll};
use shardstock::segments::home;
use shardstock::*;
use std::task::Poll;
use std::time::Duration;

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
