//! Placement on a Redis Cluster: a SKU's segments spread evenly over the masters (neighbours
//! on different masters), the placement is kept across reloads, `status` reports it, and the
//! keys really live where the report says.

mod common;

use common::binary::run_line;
use common::cluster::RedisCluster;
use common::redis_server::redis_cli;
use shardstock::placement::SegmentHome;
use shardstock::{Deduct, Engine, LoadOptions, RedisStore, Sku};
use std::collections::BTreeMap;

async fn engine(cluster: &RedisCluster, prefix: &str) -> Engine<RedisStore> {
    let store = RedisStore::builder(cluster.url())
        .key_prefix(prefix)
        .connect()
        .await
        .unwrap();
    Engine::builder().build(store).unwrap()
}

fn per_master(homes: &[SegmentHome]) -> BTreeMap<String, u32> {
    let mut m = BTreeMap::new();
    for h in homes {
        *m.entry(h.master.clone().expect("every slot is served"))
            .or_default() += 1;
    }
    m
}

/// 16 segments on 3 masters: 6/5/5, no two neighbours on one master, every segment's hash
/// really on the master reported (checked on that node with EXISTS), and the slot the one
/// Redis computes (CLUSTER KEYSLOT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_segments_spread_evenly_over_three_masters() {
    let cluster = RedisCluster::start(3, 0);
    let e = engine(&cluster, "pl").await;
    let sku = Sku::new("flash-1").unwrap();
    e.load(&sku, 1000, LoadOptions::new(16)).await.unwrap();
    let homes = e
        .placement(&sku)
        .await
        .unwrap()
        .expect("a cluster reports placement");
    assert_eq!(homes.len(), 16);
    let counts: Vec<u32> = per_master(&homes).into_values().collect();
    assert_eq!(counts.len(), 3, "{homes:?}");
    assert!(counts.iter().all(|c| (5..=6).contains(c)), "{counts:?}");
    for w in homes.windows(2) {
        assert_ne!(
            w[0].master, w[1].master,
            "neighbours share a master: {homes:?}"
        );
    }
    for h in &homes {
        let key = format!("pl:{{{}}}:seg", h.tag);
        let port: u16 = h
            .master
            .as_ref()
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            redis_cli(port, &["CLUSTER", "KEYSLOT", &key]),
            h.slot.to_string()
        );
        assert_eq!(
            redis_cli(port, &["EXISTS", &key]),
            "1",
            "{key} not on {port}"
        );
    }
    // The placement sells like any layout.
    for i in 0..100 {
        let d = Deduct::new("flash-1", &format!("u{i}"), 1, &format!("r{i}")).unwrap();
        assert_eq!(e.deduct(&d).await.unwrap().units_applied(), 1);
    }
    // Whatever a call left in transit is credited before the audit.
    e.sweep().await.unwrap();
    let a = e.audit(&sku).await.unwrap();
    assert_eq!(a.in_transit, 0, "{a:?}");
    assert!(a.ok && a.sold == 100, "{a:?}");
}

/// A reload keeps every segment's tag (so it overwrites each segment in place, and an
/// instance that still believes in the old generation finds `Stale`, never a forgotten old
/// segment); new indexes are placed next to the kept ones; fewer segments keep the tags of
/// the ones dropped for a later reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_placement_and_extends_it() {
    let cluster = RedisCluster::start(3, 0);
    let e = engine(&cluster, "re").await;
    let other = engine(&cluster, "re").await;
    let sku = Sku::new("grow").unwrap();
    e.load(&sku, 80, LoadOptions::new(8)).await.unwrap();
    let first = e.placement(&sku).await.unwrap().unwrap();
    // `other` caches the first generation's layout.
    let d = Deduct::new("grow", "u0", 1, "r0").unwrap();
    assert_eq!(other.deduct(&d).await.unwrap().units_applied(), 1);

    e.load(&sku, 120, LoadOptions::new(12).replace(true))
        .await
        .unwrap();
    let grown = e.placement(&sku).await.unwrap().unwrap();
    assert_eq!(&grown[..8], &first[..], "kept tags");
    let counts: Vec<u32> = per_master(&grown).into_values().collect();
    assert!(counts.iter().all(|c| *c == 4), "{counts:?}");

    e.load(&sku, 30, LoadOptions::new(3).replace(true))
        .await
        .unwrap();
    let shrunk = e.placement(&sku).await.unwrap().unwrap();
    assert_eq!(&shrunk[..], &first[..3]);
    e.load(&sku, 120, LoadOptions::new(12).replace(true))
        .await
        .unwrap();
    assert_eq!(e.placement(&sku).await.unwrap().unwrap(), grown);

    // The instance with the stale layout sells from the newest generation only.
    for i in 1..=150 {
        let d = Deduct::new("grow", &format!("u{i}"), 1, &format!("r{i}")).unwrap();
        other.deduct(&d).await.unwrap();
    }
    // Whatever a call left in transit is credited before the audit.
    e.sweep().await.unwrap();
    let a = e.audit(&sku).await.unwrap();
    assert_eq!(a.in_transit, 0, "{a:?}");
    assert!(a.ok && a.sold == 120 && a.remaining == 0, "{a:?}");
}

/// Over 200 SKU names: 16 segments never put more than 6 on one master (max ÷ mean ≤ 1.125),
/// and 3 segments always use all three masters (hash luck used only two for half of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sku_name_spreads() {
    let cluster = RedisCluster::start(3, 0);
    let e = engine(&cluster, "many").await;
    for (segments, most) in [(16u32, 6u32), (3, 1)] {
        for i in 0..200 {
            let sku = Sku::new(format!("sku-{segments}-{i}")).unwrap();
            e.load(&sku, u64::from(segments), LoadOptions::new(segments))
                .await
                .unwrap();
            let homes = e.placement(&sku).await.unwrap().unwrap();
            let counts = per_master(&homes);
            assert_eq!(counts.len(), 3, "{sku}: {counts:?}");
            assert!(counts.values().all(|c| *c <= most), "{sku}: {counts:?}");
        }
    }
}

/// `shardstock status` shows each segment's slot and master, in text and JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_the_placement() {
    let cluster = RedisCluster::start(3, 0);
    let url = cluster.url();
    run_line(&format!(
        "load --redis {url} --sku shown --stock 90 --segments 9"
    ))
    .expect_code(0);
    let v = run_line(&format!("status --redis {url} --sku shown --json"))
        .expect_code(0)
        .json();
    let homes = v["placement"].as_array().expect("placement in status");
    assert_eq!(homes.len(), 9);
    let masters: std::collections::BTreeSet<&str> = homes
        .iter()
        .map(|h| h["master"].as_str().unwrap())
        .collect();
    assert_eq!(masters.len(), 3, "{v}");
    let text = run_line(&format!("status --redis {url} --sku shown"));
    text.expect_code(0);
    assert!(
        text.stdout.contains("segments per master:"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains(" slot "), "{}", text.stdout);
}

/// A SKU whose metadata has no placement (loaded before placement existed, or on a single
/// Redis whose data moved to a cluster) keeps its plain tags across reloads: its keys never
/// change under running instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unplaced_sku_stays_unplaced() {
    let cluster = RedisCluster::start(3, 0);
    let e = engine(&cluster, "old").await;
    let sku = Sku::new("legacy").unwrap();
    e.load(&sku, 40, LoadOptions::new(4)).await.unwrap();
    // Make it what an older version wrote: no placement, segments under plain tags.
    let store = e.store();
    let pool = store.pool();
    use fred::interfaces::{HashesInterface, KeysInterface};
    let placed = e.placement(&sku).await.unwrap().unwrap();
    for h in &placed {
        let _: () = pool.del(store.keyspace().segment(&h.tag)).await.unwrap();
    }
    let _: () = pool
        .hdel(store.keyspace().meta(&sku), "place")
        .await
        .unwrap();
    e.load(&sku, 60, LoadOptions::new(6).replace(true))
        .await
        .unwrap();
    let homes = e.placement(&sku).await.unwrap().unwrap();
    for h in &homes {
        assert_eq!(h.tag, format!("legacy#{}", h.index), "{homes:?}");
    }
    for i in 0..70 {
        let d = Deduct::new("legacy", &format!("u{i}"), 1, &format!("r{i}")).unwrap();
        e.deduct(&d).await.unwrap();
    }
    // Whatever a call left in transit is credited before the audit.
    e.sweep().await.unwrap();
    let a = e.audit(&sku).await.unwrap();
    assert_eq!(a.in_transit, 0, "{a:?}");
    assert!(a.ok && a.sold == 60 && a.remaining == 0, "{a:?}");
}
