//! Placement on a Redis Cluster: a SKU's segments spread evenly over the masters (neighbours
//! on different masters), the placement is kept across reloads, `status` reports it, and the
//! keys really live where the report says.

use crate::common;

use common::binary::run_line;
use common::cluster::RedisCluster;
use common::json::u;
use common::redis_server::redis_cli;
use shardstock::placement::SegmentHome;
use shardstock::{Deduct, Engine, LoadOptions, RedisStore, Sku};
use std::collections::BTreeMap;
use std::time::Duration;

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

/// The ids services have — e-mail addresses, UUIDs, `+ / @ ~ % # =`, non-ASCII letters — as
/// users and request ids on a 3-master cluster: each sells once and replays, meets the
/// per-user limit, reserves (the reservation id's text parses back to it) and cancels; no call
/// fails (no id opens a hash tag of its own: CROSSSLOT would), every key with an id in it
/// carries its segment's tag first, and both SKUs audit clean.
#[test]
fn ids_services_have_sell_and_reserve_on_a_cluster() {
    use proptest::test_runner::{Config, TestRunner};
    use shardstock::{Deduction, ReservationId, Reserved};
    use std::time::Duration;

    let cluster = RedisCluster::start(3, 0);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let e = rt.block_on(engine(&cluster, "ids"));
    let (open, one) = (Sku::new("open").unwrap(), Sku::new("one").unwrap());
    rt.block_on(async {
        e.load(&open, 1_000, LoadOptions::new(8).per_user_limit(0))
            .await
            .unwrap();
        e.load(&one, 1_000, LoadOptions::new(8).per_user_limit(1))
            .await
            .unwrap();
    });
    let id = "[a-zA-Z0-9@+/~%#=:._ëé東京-]{1,24}";
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let fixed = [
        "alice@example.com",
        "0b7e9a1c-5d2f-4e8a-9b3c-7f1e2d3c4b5a",
        "01J9Z8K3M4N5P6Q7R8S9T0V1W2",
        "a~b%7E",
        "Zoë",
    ];
    let n = std::sync::atomic::AtomicU32::new(0);
    let check = |user: &str, rid: &str| {
        let n = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        // Distinct per case: a generated pair may repeat an earlier one.
        let (user, r1, r2) = (
            format!("{user}.{n}"),
            format!("{rid}/1"),
            format!("{rid}/2"),
        );
        rt.block_on(async {
            let sale = |sku: &str, r: &str| Deduct::new(sku, &user, 1, r).unwrap();
            let d = e.deduct(&sale("open", &r1)).await.unwrap();
            assert!(
                matches!(d, Deduction::Applied { .. }),
                "{user:?} {r1:?}: {d:?}"
            );
            let d = e.deduct(&sale("open", &r1)).await.unwrap();
            assert!(matches!(d, Deduction::Replayed { .. }), "{d:?}");
            let d = e.deduct(&sale("one", &r1)).await.unwrap();
            assert!(matches!(d, Deduction::Applied { .. }), "{d:?}");
            let d = e.deduct(&sale("one", &r2)).await.unwrap();
            assert!(matches!(d, Deduction::LimitReached { .. }), "{d:?}");
            let d = e.deduct(&sale("one", &r1)).await.unwrap();
            assert!(matches!(d, Deduction::Replayed { .. }), "{d:?}");
            let held = e
                .reserve(&sale("open", &r2), Duration::from_secs(60))
                .await
                .unwrap();
            let Reserved::Held { id, .. } = held else {
                panic!("{held:?}")
            };
            let parsed: ReservationId = id.to_string().parse().unwrap();
            assert_eq!(parsed, id);
            assert!(e.cancel(&parsed).await.unwrap().done);
        });
        Ok::<(), proptest::test_runner::TestCaseError>(())
    };
    for f in fixed {
        check(f, f).unwrap();
    }
    runner
        .run(&(id, id), |(user, rid)| check(&user, &rid))
        .unwrap();

    rt.block_on(async {
        for sku in [&open, &one] {
            let a = e.audit(sku).await.unwrap();
            assert!(a.ok, "{a:?}");
        }
        let a = e.audit(&one).await.unwrap();
        assert_eq!(a.sold, u64::from(n.into_inner()));
    });
    // Every key naming an id takes the tag of a segment (`{open#3}`, `{one#0.1}`): the first
    // `{…}` of its name.
    for port in cluster.master_ports() {
        let keys = redis_cli(port, &["--scan", "--pattern", "ids:*"]);
        for key in keys.lines() {
            if !key.contains('{') {
                // The instance-wide keys (`ids:skus`, the stock channel's), named by no id.
                assert!(!key.contains(['@', '/', '~']), "{key:?}");
                continue;
            }
            let tag = key
                .split_once('{')
                .and_then(|(_, rest)| rest.split_once('}'))
                .map(|(tag, _)| tag)
                .unwrap_or_else(|| panic!("{key:?} has no closed tag"));
            let (sku, seg) = tag.split_once('#').unwrap_or((tag, ""));
            assert!(
                sku == "open" || sku == "one" || seg.is_empty(),
                "{key:?}: tag {tag:?}"
            );
        }
    }
}

/// `shardstock evacuate --from` moves every slot of a master that holds the SKU's keys to the
/// other masters: `status` then places no segment there, the books are exact and the sale goes
/// on. Bad input changes nothing and says what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evacuate_moves_a_masters_segments_and_the_books_stay_exact() {
    let cluster = RedisCluster::start(3, 0);
    let url = cluster.url();
    run_line(&format!(
        "load --redis {url} --sku ev --stock 900 --segments 9"
    ))
    .expect_code(0);
    run_line(&format!(
        "sim --redis {url} --sku ev --skip-load --requests 90 --concurrency 8 --json"
    ))
    .expect_code(0);
    let masters_of = || -> Vec<String> {
        let v = run_line(&format!("status --redis {url} --sku ev --json"))
            .expect_code(0)
            .json();
        v["placement"]
            .as_array()
            .expect("placement in status")
            .iter()
            .map(|h| h["master"].as_str().unwrap().to_string())
            .collect()
    };
    let before = masters_of();
    let from = before[0].clone();

    // Bad input: a node that is no master, a pause out of bounds, no cluster.
    let r = run_line(&format!(
        "evacuate --redis {url} --from 127.0.0.1:1 --replicas 0"
    ));
    r.expect_code(5);
    assert!(r.stderr.contains("not a master of the cluster"), "{r:?}");
    let r = run_line(&format!(
        "evacuate --redis {url} --from {from} --pause-ms 5"
    ));
    r.expect_code(5);
    assert!(r.stderr.contains("pause"), "{r:?}");
    run_line(&format!("evacuate --redis {url}")).expect_code(2);
    let single = common::RedisServer::start();
    let r = run_line(&format!("evacuate --redis {} --from {from}", single.url()));
    r.expect_code(4);
    assert!(r.stderr.contains("Redis Cluster"), "{r:?}");
    assert_eq!(masters_of(), before, "a refused evacuation moved nothing");

    let v = run_line(&format!(
        "evacuate --redis {url} --from {from} --replicas 0 --json"
    ))
    .expect_code(0)
    .json();
    let moved = v["slots"].as_array().expect("slots");
    assert!(!moved.is_empty(), "{v}");
    assert!(
        moved
            .iter()
            .all(|s| s["to"].as_str() != Some(from.as_str())),
        "{v}"
    );
    let after = masters_of();
    assert!(
        !after.contains(&from),
        "a segment still on {from}: {after:?}"
    );
    // Nothing of the SKU is left on the source.
    let port: u16 = from.rsplit(':').next().unwrap().parse().unwrap();
    let left: Vec<String> = cluster
        .admin()
        .keys_by_master("*")
        .into_iter()
        .filter(|(p, _)| *p == port)
        .flat_map(|(_, k)| k)
        .collect();
    assert!(left.is_empty(), "keys left on {from}: {left:?}");

    // The sale goes on over the moved segments (the ledgers moved with them: a buyer of the
    // first sale is still at the limit); the books are exact.
    let r = run_line(&format!(
        "sim --redis {url} --sku ev --skip-load --requests 810 --concurrency 8 --json"
    ));
    r.expect_code(0);
    let v = r.json();
    assert_eq!(u(&v, "errors"), 0, "{v}");
    // Requests go to users u0, u1, … in turn: the first sale's 90 buyers ask again and are
    // at the limit (their ledgers moved), the 720 others buy.
    assert_eq!(u(&v, "limit_reached"), 90, "{v}");
    assert_eq!(u(&v, "sold_units"), 720, "{v}");
    let a = run_line(&format!("audit --redis {url} --sku ev --json"))
        .expect_code(0)
        .json();
    assert_eq!(u(&a, "sold"), 90 + u(&v, "sold_units"), "{a}");
    assert_eq!(u(&a, "remaining"), 900 - u(&a, "sold"), "{a}");
}

/// An evacuation claims a slot only if the source's write pause held from the first key read
/// to the claim: here the source is stopped (`SIGSTOP`) mid-copy for longer than the pause, so
/// a write could have run there after its key was read. The evacuation fails naming the pause,
/// the slot stays the source's, and the next evacuation replaces the leftovers the first
/// copied and moves the slot whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evacuation_whose_pause_may_have_lapsed_claims_nothing() {
    use fred::interfaces::KeysInterface;
    use shardstock::store::redis::EvacuateOptions;
    const KEYS: usize = 10_000;
    let cluster = RedisCluster::start(3, 0);
    let e = engine(&cluster, "gp").await;
    let store = e.store().clone();
    let pool = store.pool();
    for from in (0..KEYS).step_by(1000) {
        let kv: Vec<(String, String)> = (from..from + 1000)
            .map(|i| (format!("gp:{{gap}}:k{i}"), "v".to_string()))
            .collect();
        let _: () = pool.mset(kv).await.unwrap();
    }
    let admin = cluster.admin();
    let slot = common::cluster::key_slot("gp:{gap}:k0");
    let src_port = admin.owner_of(slot);
    let src = cluster
        .nodes
        .iter()
        .position(|n| n.port == src_port)
        .unwrap();
    let from = format!("127.0.0.1:{src_port}");
    let mut opts = EvacuateOptions::new(0);
    opts.replicas = 0;
    opts.batch = 1;
    opts.pause = Duration::from_secs(1);
    opts.wait_timeout = Duration::from_millis(100);

    // The source stopped once the copy has begun (a target holds some of the keys, not all;
    // one key per round trip: seconds), for 1.5 s.
    let others: Vec<u16> = admin
        .masters()
        .into_iter()
        .filter(|&p| p != src_port)
        .collect();
    let stopper = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !others.iter().any(|&p| {
            let n = cluster.admin().keys_in_slot(p, slot);
            n > 0 && n < KEYS as u64
        }) {
            assert!(std::time::Instant::now() < deadline, "the copy never began");
            std::thread::sleep(Duration::from_millis(2));
        }
        let frozen = cluster.freeze(src);
        std::thread::sleep(Duration::from_millis(1500));
        frozen.thaw();
        cluster
    });
    let first = store.evacuate(&from, &opts).await;
    let cluster = stopper.await.unwrap();
    let err = first.expect_err("a copy that outlasted the pause was claimed");
    assert!(
        err.to_string().contains("outlasted the write pause"),
        "{err}"
    );
    assert_eq!(admin.owner_of(slot), src_port, "the slot moved anyway");
    assert_eq!(admin.keys_in_slot(src_port, slot), KEYS as u64);
    // Writes go on at the source at once (the pause was lifted).
    let t = std::time::Instant::now();
    let _: () = pool
        .set("gp:{gap}:k0", "w", None, None, false)
        .await
        .unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "a write waited {:?}",
        t.elapsed()
    );
    // The failed evacuation undid the target's copies.
    for p in admin.masters().into_iter().filter(|&p| p != src_port) {
        assert_eq!(admin.keys_in_slot(p, slot), 0, "copies left on {p}");
    }

    opts.batch = 256;
    let m = store.evacuate(&from, &opts).await.unwrap();
    let moved = m
        .slots
        .iter()
        .find(|s| s.slot == slot)
        .expect("the slot moved");
    assert_eq!(moved.keys, KEYS);
    let to: u16 = moved.to.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(admin.owner_of(slot), to);
    assert_eq!(admin.keys_in_slot(to, slot), KEYS as u64);
    assert_eq!(admin.keys_in_slot(src_port, slot), 0);
    assert_eq!(
        redis_cli(to, &["GET", "gp:{gap}:k0"]).trim(),
        "w",
        "the write made between the two evacuations moved too"
    );
    drop(cluster);
}
