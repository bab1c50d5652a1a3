//! Readiness (`Engine::readiness`, `GET /readyz`) against real servers: what a load balancer
//! and an operator are told is what the store does.
//!
//! - The memory store is always ready.
//! - One redis-server: ready; killed, unavailable within the bound (the reason names it); back
//!   empty, degraded with the SKU this engine served listed as vanished; reloaded, ready.
//! - A 3-master Redis Cluster: a master made to refuse writes (`min-replicas-to-write 1`, no
//!   replica) is reported with exactly the segments whose scripts it refuses (each segment's
//!   survey tried: refused there, run elsewhere), the rest ready; a master hung is reported
//!   unreachable with its segments, then, once the others mark it failed, the store is
//!   unavailable (the cluster down); thawed, ready again.

use crate::common;

use common::RedisServer;
use common::cluster::RedisCluster;
use shardstock::engine::{ProblemKind, ReadyStatus};
use shardstock::store::{SegAddr, Store};
use shardstock::{Engine, Error, LoadOptions, MemoryStore, RedisStore, Sku};
use std::time::{Duration, Instant};

/// Polls `engine`'s readiness (bound `bound`) until `done` says so, at most 30 s.
async fn until<S: Store>(
    engine: &Engine<S>,
    bound: Duration,
    what: &str,
    done: impl Fn(&shardstock::Readiness) -> bool,
) -> shardstock::Readiness {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = engine.readiness(bound).await;
        if done(&r) {
            return r;
        }
        assert!(Instant::now() < deadline, "never {what}: last {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_memory_store_is_always_ready() {
    let engine = Engine::builder().build(MemoryStore::new()).unwrap();
    let sku = Sku::new("m").unwrap();
    engine.load(&sku, 10, LoadOptions::new(2)).await.unwrap();
    let r = engine.readiness(Duration::from_millis(100)).await;
    assert_eq!(
        (r.status, r.store, r.problems.len(), r.vanished_skus.len()),
        (ReadyStatus::Ready, "memory", 0, 0),
        "{r:?}"
    );
    assert!(r.is_ready() && r.reason.is_none(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_is_unavailable_within_the_bound_and_back_empty_degraded() {
    let mut srv = RedisServer::start();
    let engine = common::redis_engine(&srv, Engine::builder()).await;
    let sku = Sku::new("phone").unwrap();
    engine.load(&sku, 10, LoadOptions::new(2)).await.unwrap();
    let sale = shardstock::Deduct::new("phone", "u1", 1, "r1").unwrap();
    assert_eq!(engine.deduct(&sale).await.unwrap().units_applied(), 1);
    let bound = Duration::from_millis(500);
    let r = engine.readiness(bound).await;
    assert_eq!(r.status, ReadyStatus::Ready, "{r:?}");
    assert_eq!((r.store, r.timeout_ms), ("redis", 500), "{r:?}");

    srv.stop();
    let t = Instant::now();
    let r = engine.readiness(bound).await;
    let took = t.elapsed();
    eprintln!("redis killed: readiness answered in {took:?}: {r:?}");
    assert_eq!(r.status, ReadyStatus::Unavailable, "{r:?}");
    assert!(!r.is_ready());
    assert!(
        took < bound + Duration::from_millis(300),
        "readiness took {took:?} with a bound of {bound:?}"
    );
    let reason = r.reason.as_deref().unwrap_or_default();
    let at = format!("127.0.0.1:{}", srv.port);
    assert!(
        reason.starts_with("redis unreachable") && reason.contains(&at),
        "{reason}"
    );
    assert_eq!(r.problems.len(), 1, "{r:?}");
    assert_eq!(
        (&r.problems[0].server, r.problems[0].problem),
        (&at, ProblemKind::Unreachable),
        "{r:?}"
    );
    // Its metadata cannot be read: where its segments live is the cached layout's.
    assert_eq!(
        (
            r.problems[0].skus[0].sku.as_str(),
            &r.problems[0].skus[0].segments
        ),
        ("phone", &vec![0, 1]),
        "a single Redis holds every segment: {r:?}"
    );

    // Back, empty: the store answers (ready for a load balancer), but the SKU is gone.
    srv.boot();
    let r = until(&engine, bound, "answering again", |r| r.is_ready()).await;
    assert_eq!(r.status, ReadyStatus::Degraded, "{r:?}");
    assert_eq!(r.vanished_skus, vec!["phone".to_string()], "{r:?}");
    assert!(r.problems.is_empty(), "{r:?}");
    // A sale in between changes nothing: the SKU stays listed until it is loaded again.
    assert!(matches!(
        engine.deduct(&sale).await,
        Err(Error::NotLoaded(_))
    ));
    let r = engine.readiness(bound).await;
    assert_eq!(r.vanished_skus, vec!["phone".to_string()], "{r:?}");

    engine.load(&sku, 10, LoadOptions::new(2)).await.unwrap();
    let r = engine.readiness(bound).await;
    assert_eq!(r.status, ReadyStatus::Ready, "{r:?}");
    assert!(r.vanished_skus.is_empty() && r.problems.is_empty(), "{r:?}");
}

/// The segments of `sku` whose master is `master` (`host:port`), by the engine's placement view
/// (the slot map fred routes by).
async fn segments_on(engine: &Engine<RedisStore>, sku: &Sku, master: &str) -> Vec<u32> {
    let homes = engine.placement(sku).await.unwrap().expect("a cluster");
    homes
        .iter()
        .filter(|h| h.master.as_deref() == Some(master))
        .map(|h| h.index)
        .collect()
}

#[test]
fn a_cluster_master_refusing_writes_is_reported_with_its_segments() {
    common::cluster::one_sale_at_a_time(async {
        let cluster = RedisCluster::start(3, 0);
        let engine = common::prefixed_engine(&cluster, Engine::builder(), "rd").await;
        let sku = Sku::new("phone").unwrap();
        engine.load(&sku, 120, LoadOptions::new(12)).await.unwrap();
        let other = Sku::new("tv").unwrap();
        engine.load(&other, 30, LoadOptions::new(3)).await.unwrap();
        let bound = Duration::from_millis(800);
        let r = engine.readiness(bound).await;
        assert_eq!(r.status, ReadyStatus::Ready, "{r:?}");

        // Segment 0's master refuses writes: one replica wanted, none there.
        let homes = engine.placement(&sku).await.unwrap().unwrap();
        let master = homes[0].master.clone().unwrap();
        let port: u16 = master.rsplit(':').next().unwrap().parse().unwrap();
        let node = cluster.nodes.iter().position(|n| n.port == port).unwrap();
        assert_eq!(
            cluster.nodes[node].cli(&["CONFIG", "SET", "min-replicas-to-write", "1"]),
            "OK"
        );
        let r = engine.readiness(bound).await;
        eprintln!("a master refusing writes: {r:?}");
        assert_eq!(r.status, ReadyStatus::Degraded, "{r:?}");
        assert!(
            r.is_ready(),
            "buyers of the other masters are served: {r:?}"
        );
        assert_eq!(r.problems.len(), 1, "{r:?}");
        let p = &r.problems[0];
        assert_eq!(
            (&p.server, p.problem),
            (&master, ProblemKind::RefusesWrites)
        );
        assert!(p.detail.starts_with("NOREPLICAS"), "{p:?}");
        let mine = segments_on(&engine, &sku, &master).await;
        assert!(
            !mine.is_empty() && mine.len() < 12,
            "placed evenly: {mine:?}"
        );
        let listed = |name: &str| {
            p.skus
                .iter()
                .find(|s| s.sku == name)
                .map(|s| s.segments.clone())
                .unwrap_or_default()
        };
        assert_eq!(listed("phone"), mine, "{p:?}");
        assert_eq!(
            listed("tv"),
            segments_on(&engine, &other, &master).await,
            "{p:?}"
        );
        // What it lists is what refuses: every segment's survey (a script that may write)
        // tried, refused exactly on the listed ones.
        let meta = engine.store().meta(&sku).await.unwrap().unwrap();
        for index in 0..12 {
            let seg = SegAddr::new(&sku, meta.generation, index)
                .with_suffix(meta.placement.suffix(index));
            let survey = engine.store().survey(seg, false).await;
            // (`Error::Redis` naming NOREPLICAS outside durability mode: a re-sent call's
            // answer could look the same.)
            let refused = matches!(&survey, Err(e) if e.to_string().contains("NOREPLICAS"));
            assert_eq!(
                refused,
                mine.contains(&index),
                "segment {index}: {survey:?}"
            );
        }

        cluster.nodes[node].cli(&["CONFIG", "SET", "min-replicas-to-write", "0"]);
        let r = engine.readiness(bound).await;
        assert_eq!(r.status, ReadyStatus::Ready, "{r:?}");

        // A master hung (SIGSTOP): out of reach at once, with its segments, the others ready;
        // once they mark it failed (cluster-node-timeout 2 s), the cluster is down and so is
        // the store; thawed, ready again.
        let frozen = cluster.freeze(node);
        let t = Instant::now();
        let r = engine.readiness(bound).await;
        let took = t.elapsed();
        eprintln!("a master hung: answered in {took:?}: {r:?}");
        assert!(
            took < bound + Duration::from_millis(300),
            "readiness took {took:?} with a bound of {bound:?}"
        );
        assert_eq!(r.status, ReadyStatus::Degraded, "{r:?}");
        assert_eq!(r.problems.len(), 1, "{r:?}");
        let p = &r.problems[0];
        assert_eq!((&p.server, p.problem), (&master, ProblemKind::Unreachable));
        assert!(p.detail.starts_with("no answer within"), "{p:?}");
        assert_eq!(p.skus[0].sku, "phone");
        assert_eq!(p.skus[0].segments, mine, "{p:?}");
        let r = until(&engine, bound, "unavailable", |r| !r.is_ready()).await;
        eprintln!("the cluster down: {r:?}");
        let reason = r.reason.clone().unwrap_or_default();
        assert!(
            reason.starts_with("redis cluster down") || reason.starts_with("no redis master"),
            "{r:?}"
        );
        assert!(r.problems.iter().any(|p| p.server == master), "{r:?}");
        frozen.thaw();
        let r = until(&engine, bound, "ready again", |r| {
            r.status == ReadyStatus::Ready
        })
        .await;
        assert!(r.problems.is_empty(), "{r:?}");
    });
}
