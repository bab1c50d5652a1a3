//! The outbox and its consumer against real Redis (one node, AOF restarts, a cluster): one
//! event per effect written by the script that has the effect, none for replays; consumption
//! at least once with failures redelivered, poison events dead-lettered with their reason,
//! dead consumers' events claimed, and acknowledged events trimmed.

use crate::common;

use common::cluster::RedisCluster;
use common::{RedisAt, RedisServer, redis_config};
use shardstock::orders::{EventKind, Handler, OrderEvent, Orders, OrdersOptions};
use shardstock::{
    Deduct, Deduction, Engine, EngineBuilder, LoadOptions, Part, RedisStore, Reserved, Sku,
};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A handler that keeps what it was given, and fails on purpose: `fail_first[rid]` times for
/// those request ids, always for `always_fail`.
#[derive(Default, Clone)]
struct Collect {
    seen: Arc<Mutex<Vec<OrderEvent>>>,
    fail_first: Arc<Mutex<HashMap<String, u64>>>,
    always_fail: Arc<HashSet<String>>,
}

impl Handler for Collect {
    async fn handle(&self, events: &[OrderEvent]) -> Vec<Result<(), String>> {
        let mut out = Vec::new();
        for e in events {
            if self.always_fail.contains(&e.request_id) {
                out.push(Err(format!("always fails: {}", e.request_id)));
                continue;
            }
            let mut ff = self.fail_first.lock().unwrap();
            if let Some(n) = ff.get_mut(&e.request_id).filter(|n| **n > 0) {
                *n -= 1;
                out.push(Err("not yet".into()));
                continue;
            }
            drop(ff);
            self.seen.lock().unwrap().push(e.clone());
            out.push(Ok(()));
        }
        out
    }
}

impl Collect {
    /// Events seen, by request id.
    fn by_rid(&self) -> HashMap<String, Vec<OrderEvent>> {
        let mut m: HashMap<String, Vec<OrderEvent>> = HashMap::new();
        for e in self.seen.lock().unwrap().iter() {
            m.entry(e.request_id.clone()).or_default().push(e.clone());
        }
        m
    }
}

async fn store(at: &impl RedisAt, prefix: &str, coalesce: bool) -> RedisStore {
    let mut c = redis_config(at, prefix);
    c.store.coalesce = coalesce;
    c.build_store().await.unwrap()
}

async fn engine(at: &impl RedisAt, prefix: &str, coalesce: bool) -> Engine<RedisStore> {
    let b = EngineBuilder::default()
        .per_user_limit(0)
        .transfer_lease(Duration::from_millis(500));
    b.build(store(at, prefix, coalesce).await).unwrap()
}

fn opts(consumer: &str) -> OrdersOptions {
    OrdersOptions::new("orders", consumer)
        .min_idle(Duration::from_millis(100))
        .trim_every(Duration::from_millis(1))
        .discover_every(Duration::from_millis(50))
        .batch(64)
}

/// Buyers race for `stock` units over `segments` (quantities 1..=3, so some homes run short
/// and units move home from other segments); the request ids that applied, with their
/// quantity.
async fn sale(e: &Engine<RedisStore>, sku: &str, requests: usize) -> HashMap<String, u64> {
    let applied = Arc::new(Mutex::new(HashMap::new()));
    let mut tasks = Vec::new();
    for t in 0..16 {
        let (e, applied, sku) = (e.clone(), applied.clone(), sku.to_string());
        tasks.push(tokio::spawn(async move {
            for i in (t..requests).step_by(16) {
                let qty = 1 + (i as u64 % 3);
                let rid = format!("r{i}");
                let d = Deduct::new(&sku, &format!("u{i}"), qty, &rid).unwrap();
                if let Deduction::Applied { units, .. } = e.deduct(&d).await.unwrap() {
                    assert_eq!(units, qty);
                    applied.lock().unwrap().insert(rid, qty);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    applied.lock().unwrap().clone()
}

/// Every applied request has exactly one `sold` event with its units, all at its home
/// segment, nothing else has one, and the units add up to the audit's sold.
fn check_sold(seen: &HashMap<String, Vec<OrderEvent>>, applied: &HashMap<String, u64>, sold: u64) {
    for (rid, qty) in applied {
        let evs = seen
            .get(rid)
            .unwrap_or_else(|| panic!("no event for applied {rid}"));
        let kinds: HashSet<_> = evs
            .iter()
            .map(|e| (e.kind, e.units, e.entry_id.clone()))
            .collect();
        assert_eq!(
            kinds.len(),
            1,
            "{rid}: one event (maybe delivered twice): {evs:?}"
        );
        assert_eq!(evs[0].kind, EventKind::Sold);
        assert_eq!(evs[0].units, *qty, "{rid}");
        assert_eq!(
            evs[0].parts.iter().map(|p| p.units).sum::<u64>(),
            *qty,
            "{rid}"
        );
        assert_eq!(evs[0].parts.len(), 1, "{rid}: one part, at home: {evs:?}");
    }
    let strays: Vec<_> = seen.keys().filter(|r| !applied.contains_key(*r)).collect();
    assert!(
        strays.is_empty(),
        "events for requests that did not apply: {strays:?}"
    );
    let units: u64 = applied.values().sum();
    assert_eq!(units, sold, "events' units = audit sold");
}

async fn sale_and_consume(at: &impl RedisAt, prefix: &str, coalesce: bool) {
    let e = engine(at, prefix, coalesce).await;
    let sku = Sku::new("flash").unwrap();
    e.load(&sku, 300, LoadOptions::new(6).outbox(true))
        .await
        .unwrap();
    // One sale whose units moved home, whatever the race below does: a buyer empties segment
    // 0 at home, and the next request whose home is 0 gets units moved there from the others.
    // (One user for both: a user named after the request id would hash with it in a way that
    // misses segment 0 for every id — see `home_of`.)
    let mut applied = HashMap::new();
    let at_home_0: Vec<String> = (0..)
        .map(|i| format!("f{i}"))
        .filter(|r| home_of("buyer", r, 6) == 0)
        .take(2)
        .collect();
    for (rid, qty) in at_home_0.iter().zip([50, 2]) {
        let d = Deduct::new("flash", "buyer", qty, rid).unwrap();
        let Deduction::Applied { segment, units } = e.deduct(&d).await.unwrap() else {
            panic!("{rid} did not apply")
        };
        assert_eq!((segment, units), (0, qty), "{rid}");
        applied.insert(rid.clone(), qty);
    }
    let a = e.audit(&sku).await.unwrap();
    assert!(a.segments[0].state.moved_in >= 2, "units moved home: {a:?}");
    applied.extend(sale(&e, "flash", 400).await);
    e.sweep().await.unwrap();
    let audit = e.audit(&sku).await.unwrap();
    assert!(audit.ok, "{:?}", audit.problems);
    assert_eq!((audit.sold, audit.in_transit), (300, 0), "{audit:?}");

    let h = Collect::default();
    let orders = Orders::new(store(at, prefix, false).await, h.clone(), opts("c1")).unwrap();
    orders.drain(Duration::from_secs(30)).await.unwrap();
    check_sold(&h.by_rid(), &applied, audit.sold);
    // Every event names one part, at the request's home: where its units were moved to
    // first when the home was short.
    for ev in h.seen.lock().unwrap().iter() {
        let home = home_of(&ev.user, &ev.request_id, 6);
        assert_eq!(
            ev.parts,
            vec![Part {
                segment: home,
                units: ev.units
            }],
            "{ev:?}"
        );
    }
    let lag = orders.lag().await.unwrap();
    assert_eq!(
        lag.appended,
        applied.len() as u64,
        "one event per applied request"
    );
    assert!(lag.is_idle(), "{lag:?}");

    // Every request sent again: replays append nothing.
    let again = sale(&e, "flash", 400).await;
    assert!(
        again.is_empty(),
        "a re-sent request is a replay, never applied again: {again:?}"
    );
    for (rid, qty) in at_home_0.iter().zip([50, 2]) {
        let d = Deduct::new("flash", "buyer", qty, rid).unwrap();
        let d = e.deduct(&d).await.unwrap();
        assert!(matches!(d, Deduction::Replayed { .. }), "{rid}: {d:?}");
    }
    orders.drain(Duration::from_secs(30)).await.unwrap();
    assert_eq!(orders.lag().await.unwrap().appended, applied.len() as u64);
    check_sold(&h.by_rid(), &applied, audit.sold);
    // Everything acknowledged is trimmed.
    orders.poll().await.unwrap();
    assert_eq!(orders.lag().await.unwrap().length, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sale_leaves_one_event_per_applied_request_and_replays_none() {
    let redis = RedisServer::start();
    sale_and_consume(&redis, "plain", false).await;
    sale_and_consume(&redis, "coal", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_too() {
    let cluster = RedisCluster::start(3, 0);
    sale_and_consume(&cluster, "cl", false).await;
    sale_and_consume(&cluster, "clc", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_outbox_nothing_is_appended() {
    let redis = RedisServer::start();
    let e = engine(&redis, "t", false).await;
    let sku = Sku::new("quiet").unwrap();
    e.load(&sku, 50, LoadOptions::new(2)).await.unwrap();
    sale(&e, "quiet", 60).await;
    let h = Collect::default();
    let orders = Orders::new(store(&redis, "t", false).await, h.clone(), opts("c")).unwrap();
    assert_eq!(orders.discover().await.unwrap(), 0, "no SKU registered");
    // Reloaded with the outbox: from now on.
    e.load(&sku, 10, LoadOptions::new(2).replace(true).outbox(true))
        .await
        .unwrap();
    let applied = sale(&e, "quiet", 20).await;
    orders.drain(Duration::from_secs(10)).await.unwrap();
    assert_eq!(h.by_rid().len(), applied.len());
    assert_eq!(
        applied.len(),
        10 - applied
            .values()
            .filter(|q| **q > 1)
            .map(|q| q - 1)
            .sum::<u64>() as usize
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_are_delivered_again_and_poison_goes_to_the_dead_letters() {
    let redis = RedisServer::start();
    let e = engine(&redis, "t", false).await;
    let sku = Sku::new("poison").unwrap();
    e.load(&sku, 30, LoadOptions::new(3).outbox(true))
        .await
        .unwrap();
    let applied = sale(&e, "poison", 30).await;
    let rids: Vec<String> = {
        let mut r: Vec<_> = applied.keys().cloned().collect();
        r.sort();
        r
    };
    let flaky: Vec<String> = rids[..4].to_vec();
    let poison: Vec<String> = rids[4..6].to_vec();
    let h = Collect {
        fail_first: Arc::new(Mutex::new(flaky.iter().map(|r| (r.clone(), 2)).collect())),
        always_fail: Arc::new(poison.iter().cloned().collect()),
        ..Collect::default()
    };
    let o = opts("c")
        .max_deliveries(3)
        .min_idle(Duration::from_millis(30));
    let orders = Orders::new(store(&redis, "t", false).await, h.clone(), o).unwrap();
    let done = orders.drain(Duration::from_secs(30)).await.unwrap();
    let seen = h.by_rid();
    for r in &flaky {
        let evs = &seen[r];
        assert_eq!(evs.len(), 1, "{r}");
        assert_eq!(
            evs[0].deliveries, 3,
            "{r}: failed twice, arrived on the third delivery"
        );
    }
    for r in &poison {
        assert!(!seen.contains_key(r), "{r} never handled");
    }
    assert_eq!(done.dead, 2);
    assert_eq!(seen.len(), applied.len() - 2);
    assert!(done.redelivered >= 4 * 2 + 2 * 2, "{done:?}");
    // The dead letters carry the event, the reason and the delivery count.
    let dead = dead_letters(&redis);
    assert_eq!(dead.len(), 2, "{dead:?}");
    for d in &dead {
        assert!(poison.contains(&d["rid"]), "{d:?}");
        assert_eq!(d["reason"], format!("always fails: {}", d["rid"]));
        assert_eq!(d["deliveries"], "3");
        assert_eq!(d["kind"], "sold");
    }
    assert!(orders.lag().await.unwrap().is_idle());
}

/// Every dead letter under the server, as field maps (read with redis-cli).
fn dead_letters(redis: &RedisServer) -> Vec<HashMap<String, String>> {
    let cli = |args: &[&str]| redis.cli(args);
    let mut out = Vec::new();
    for key in cli(&["--scan", "--pattern", "*:dead"]).lines() {
        let lines: Vec<String> = cli(&["XRANGE", key, "-", "+"])
            .lines()
            .map(String::from)
            .collect();
        // id, then field/value lines, per entry; entries start with an id (digits-digits).
        let mut cur: Option<HashMap<String, String>> = None;
        let mut i = 0;
        while i < lines.len() {
            let l = &lines[i];
            if l.contains('-')
                && l.split('-')
                    .all(|p| p.chars().all(|c| c.is_ascii_digit()) && !p.is_empty())
            {
                if let Some(c) = cur.take() {
                    out.push(c);
                }
                cur = Some(HashMap::new());
                i += 1;
            } else {
                cur.as_mut()
                    .unwrap()
                    .insert(l.clone(), lines[i + 1].clone());
                i += 2;
            }
        }
        out.extend(cur);
    }
    out
}

/// A handler that never answers: its consumer is as good as dead.
struct Stuck;

impl Handler for Stuck {
    async fn handle(&self, _: &[OrderEvent]) -> Vec<Result<(), String>> {
        std::future::pending().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_consumers_events_are_claimed_by_another() {
    let redis = RedisServer::start();
    let e = engine(&redis, "t", true).await;
    let sku = Sku::new("claimed").unwrap();
    e.load(&sku, 100, LoadOptions::new(4).outbox(true))
        .await
        .unwrap();
    let applied = sale(&e, "claimed", 100).await;
    let dead = Arc::new(Orders::new(store(&redis, "t", false).await, Stuck, opts("dead")).unwrap());
    let d = dead.clone();
    let task = tokio::spawn(async move { d.poll().await });
    // Wait until it holds events, then "kill" it.
    let h = Collect::default();
    let alive = Orders::new(store(&redis, "t", false).await, h.clone(), opts("alive")).unwrap();
    for _ in 0..200 {
        alive.discover().await.unwrap();
        if alive.lag().await.unwrap().pending > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task.abort();
    assert!(
        alive.lag().await.unwrap().pending > 0,
        "the dead consumer took events"
    );
    let done = alive.drain(Duration::from_secs(30)).await.unwrap();
    assert!(done.redelivered > 0, "{done:?}");
    let audit = e.audit(&sku).await.unwrap();
    check_sold(&h.by_rid(), &applied, audit.sold);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reservations_confirm_cancel_and_expire_as_events() {
    let redis = RedisServer::start();
    let e = engine(&redis, "t", false).await;
    let sku = Sku::new("resv").unwrap();
    e.load(&sku, 400, LoadOptions::new(4).outbox(true))
        .await
        .unwrap();
    // 120 reservations expiring after 80 ms; each is confirmed, cancelled or left, at a time
    // racing its expiry.
    let mut tasks = Vec::new();
    for i in 0..120u64 {
        let e = e.clone();
        tasks.push(tokio::spawn(async move {
            let rid = format!("v{i}");
            let d = Deduct::new("resv", &format!("u{i}"), 1 + i % 2, &rid).unwrap();
            let Reserved::Held { id, .. } = e.reserve(&d, Duration::from_millis(80)).await.unwrap()
            else {
                panic!("not held")
            };
            tokio::time::sleep(Duration::from_millis(40 + i % 80)).await;
            let end = match i % 3 {
                0 => Some(("confirmed", e.confirm(&id).await.unwrap())),
                1 => Some(("cancelled", e.cancel(&id).await.unwrap())),
                _ => None,
            };
            (rid, 1 + i % 2, end.map(|(k, r)| (k, r.done)))
        }));
    }
    let mut want = HashMap::new();
    for t in tasks {
        let (rid, q, end) = t.await.unwrap();
        let last = match end {
            Some((k, true)) => k,
            _ => "expired",
        };
        want.insert(rid, (q, last));
    }
    // Let every reservation end, then have the sweeper's reclaim run on every segment.
    tokio::time::sleep(Duration::from_millis(150)).await;
    e.sweep().await.unwrap();
    let audit = e.audit(&sku).await.unwrap();
    assert!(audit.ok && audit.reserved == 0, "{audit:?}");

    let h = Collect::default();
    let orders = Orders::new(store(&redis, "t", false).await, h.clone(), opts("c")).unwrap();
    orders.drain(Duration::from_secs(30)).await.unwrap();
    let seen = h.by_rid();
    let mut confirmed_units = 0;
    for (rid, (q, last)) in &want {
        let kinds: Vec<&str> = seen[rid].iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, vec!["reserved", *last], "{rid}: exactly one end");
        assert!(seen[rid].iter().all(|e| e.units == *q));
        if *last == "confirmed" {
            confirmed_units += q;
        }
    }
    assert_eq!(confirmed_units, audit.sold);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restarted_with_aof_mid_consumption_loses_and_doubles_nothing() {
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let e = engine(&redis, "t", true).await;
    let sku = Sku::new("aof").unwrap();
    e.load(&sku, 200, LoadOptions::new(4).outbox(true))
        .await
        .unwrap();
    let applied = sale(&e, "aof", 220).await;
    let h = Collect::default();
    let orders = Orders::new(
        store(&redis, "t", false).await,
        h.clone(),
        opts("c").batch(8),
    )
    .unwrap();
    orders.poll().await.unwrap();
    let before = h.seen.lock().unwrap().len();
    assert!(
        before > 0 && before < applied.len(),
        "mid-consumption: {before}"
    );
    redis.stop(); // kill -9
    redis.boot(); // replays the AOF
    orders.drain(Duration::from_secs(60)).await.unwrap();
    let audit = e.audit(&sku).await.unwrap();
    assert!(audit.ok, "{:?}", audit.problems);
    check_sold(&h.by_rid(), &applied, audit.sold);
    assert_eq!(orders.lag().await.unwrap().appended, applied.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_options_are_refused() {
    let redis = RedisServer::start();
    let s = store(&redis, "t", false).await;
    for o in [
        OrdersOptions::new("", "c"),
        OrdersOptions::new("g{x}", "c"),
        OrdersOptions::new("g", "c").batch(0),
        OrdersOptions::new("g", "c").max_deliveries(0),
        OrdersOptions::new("g", "c").min_idle(Duration::ZERO),
        OrdersOptions::new("g", "c").idle_sleep(Duration::from_secs(7200)),
    ] {
        let err = Orders::new(s.clone(), Collect::default(), o).unwrap_err();
        assert_eq!(err.kind(), shardstock::ErrorKind::Config, "{err}");
    }
    // The outbox with a baseline strategy, or on the memory store, is refused at load.
    let base = redis_config(&redis, "b")
        .store
        .redis_builder()
        .strategy(shardstock::Strategy::Naive)
        .connect()
        .await
        .unwrap();
    let e = EngineBuilder::default().build(base).unwrap();
    let err = e
        .load(&Sku::new("x").unwrap(), 1, LoadOptions::new(1).outbox(true))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), shardstock::ErrorKind::Config, "{err}");
    let m = common::memory_engine(EngineBuilder::default());
    let err = m
        .load(&Sku::new("x").unwrap(), 1, LoadOptions::new(1).outbox(true))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), shardstock::ErrorKind::Config, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_lock_strategy_too() {
    let redis = RedisServer::start();
    let s = redis_config(&redis, "lk")
        .store
        .redis_builder()
        .strategy(shardstock::Strategy::Lock)
        .lock_options(common::lock_opts(500, 5000))
        .connect()
        .await
        .unwrap();
    let e = EngineBuilder::default().per_user_limit(0).build(s).unwrap();
    let sku = Sku::new("locked").unwrap();
    e.load(&sku, 60, LoadOptions::new(3).outbox(true))
        .await
        .unwrap();
    let applied = sale(&e, "locked", 80).await;
    let h = Collect::default();
    let orders = Orders::new(store(&redis, "lk", false).await, h.clone(), opts("c")).unwrap();
    orders.drain(Duration::from_secs(30)).await.unwrap();
    check_sold(&h.by_rid(), &applied, e.audit(&sku).await.unwrap().sold);
}

/// A reload ends the old generation's live reservations: each gets a `cancelled` event (also
/// on segments the reload drops), and events not yet consumed on dropped segments are still
/// found and delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_cancels_live_reservations_and_keeps_dropped_segments_streams() {
    let redis = RedisServer::start();
    let e = engine(&redis, "t", false).await;
    let sku = Sku::new("reload").unwrap();
    e.load(&sku, 80, LoadOptions::new(8).outbox(true))
        .await
        .unwrap();
    let mut held = HashMap::new();
    for i in 0..12u64 {
        let rid = format!("h{i}");
        let d = Deduct::new("reload", &format!("u{i}"), 1, &rid).unwrap();
        let r = e.reserve(&d, Duration::from_secs(60)).await.unwrap();
        let Reserved::Held { segment, .. } = r else {
            panic!("{r:?}")
        };
        held.insert(rid, segment);
    }
    assert!(
        held.values().any(|s| *s >= 4),
        "some on segments the reload drops"
    );
    // Sales too, on every segment, left unconsumed.
    let applied = sale(&e, "reload", 20).await;
    e.load(&sku, 10, LoadOptions::new(4).replace(true).outbox(true))
        .await
        .unwrap();
    let h = Collect::default();
    let orders = Orders::new(store(&redis, "t", false).await, h.clone(), opts("c")).unwrap();
    orders.drain(Duration::from_secs(30)).await.unwrap();
    let seen = h.by_rid();
    for (rid, seg) in &held {
        let kinds: Vec<&str> = seen[rid].iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            vec!["reserved", "cancelled"],
            "{rid} on segment {seg}"
        );
    }
    for rid in applied.keys() {
        assert_eq!(
            seen[rid].len(),
            1,
            "{rid}: its sale event, on any of the 8 segments"
        );
    }
    assert_eq!(orders.lag().await.unwrap().streams, 8);
}

/// Two consumer groups (two order services): an event is trimmed only once both have
/// acknowledged it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trimming_waits_for_every_group() {
    let redis = RedisServer::start();
    let e = engine(&redis, "t", false).await;
    let sku = Sku::new("two").unwrap();
    e.load(&sku, 20, LoadOptions::new(2).outbox(true))
        .await
        .unwrap();
    let applied = sale(&e, "two", 20).await;
    let (ha, hb) = (Collect::default(), Collect::default());
    let a = Orders::new(store(&redis, "t", false).await, ha.clone(), opts("a")).unwrap();
    let mut ob = opts("b");
    ob.group = "audit".into();
    let b = Orders::new(store(&redis, "t", false).await, hb.clone(), ob).unwrap();
    b.discover().await.unwrap(); // group "audit" exists, has read nothing
    a.drain(Duration::from_secs(10)).await.unwrap();
    a.poll().await.unwrap();
    assert_eq!(
        a.lag().await.unwrap().length,
        applied.len() as u64,
        "kept for the other group"
    );
    b.drain(Duration::from_secs(10)).await.unwrap();
    b.poll().await.unwrap();
    assert_eq!(b.lag().await.unwrap().length, 0);
    assert_eq!(ha.by_rid().len(), applied.len());
    assert_eq!(hb.by_rid().len(), applied.len());
}

/// Reservations whose home segment is short: units move home first, so each is held, and
/// reported (`reserved`, then `confirmed`), from its home segment's stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reservation_whose_home_was_short_reports_from_its_home() {
    let redis = RedisServer::start();
    let e = engine(&redis, "t", false).await;
    let sku = Sku::new("fbres").unwrap();
    e.load(&sku, 12, LoadOptions::new(4).outbox(true))
        .await
        .unwrap();
    // Four requests whose home is segment 0 (3 units): three must get units moved there.
    let rids: Vec<String> = (0..)
        .map(|i| format!("f{i}"))
        .filter(|r| home_of("buyer", r, 4) == 0)
        .take(4)
        .collect();
    let mut ids = Vec::new();
    for rid in &rids {
        let d = Deduct::new("fbres", "buyer", 3, rid).unwrap();
        if let Reserved::Held { id, .. } = e.reserve(&d, Duration::from_secs(60)).await.unwrap() {
            ids.push(id);
        }
    }
    assert_eq!(ids.len(), 4, "every unit moved home and held there");
    for id in &ids {
        assert_eq!(id.segment(), 0, "{id}");
        assert!(e.confirm(id).await.unwrap().done);
    }
    let h = Collect::default();
    let orders = Orders::new(store(&redis, "t", false).await, h.clone(), opts("c")).unwrap();
    orders.drain(Duration::from_secs(10)).await.unwrap();
    let seen = h.by_rid();
    for id in &ids {
        let evs = &seen[id.request_id().as_str()];
        let kinds: Vec<&str> = evs.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds.len(), 2);
        assert!(
            kinds.contains(&"reserved") && kinds.contains(&"confirmed"),
            "{kinds:?}"
        );
        assert_eq!(evs[0].stream, evs[1].stream, "both from the home's stream");
        assert!(evs[0].stream.contains("{fbres#0}"), "{evs:?}");
    }
    e.sweep().await.unwrap();
    let a = e.audit(&sku).await.unwrap();
    assert!(a.ok, "{a:?}");
    assert_eq!((a.sold, a.in_transit), (12, 0), "{a:?}");
    assert_eq!(
        (a.segments[0].state.sold, a.segments[0].state.moved_in),
        (12, 9),
        "{a:?}"
    );
}

/// A reload whose metadata names another previous generation than the segments hold (a load
/// that failed half-way and is retried, a concurrent load, metadata lost): the reservations
/// of the generation each segment really holds still end with `cancelled` events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_ends_the_reservations_of_the_generation_the_segment_holds() {
    let redis = RedisServer::start();
    let e = engine(&redis, "t", false).await;
    let sku = Sku::new("halfway").unwrap();
    let g1 = e
        .load(&sku, 10, LoadOptions::new(1).outbox(true))
        .await
        .unwrap();
    let d = Deduct::new("halfway", "u", 2, "h").unwrap();
    assert!(matches!(
        e.reserve(&d, Duration::from_secs(60)).await.unwrap(),
        Reserved::Held { .. }
    ));
    // The metadata now names a generation no segment holds, as after a load that started
    // (load_begin) and failed before writing its segments.
    redis.cli(&["HSET", "t:{halfway}:meta", "gen", &(g1 + 5).to_string()]);
    e.load(&sku, 10, LoadOptions::new(1).replace(true).outbox(true))
        .await
        .unwrap();
    let h = Collect::default();
    let orders = Orders::new(store(&redis, "t", false).await, h.clone(), opts("c")).unwrap();
    orders.drain(Duration::from_secs(10)).await.unwrap();
    let kinds: Vec<&str> = h.by_rid()["h"].iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, vec!["reserved", "cancelled"]);
}

/// Crash point "after a transfer's debit, before the home credits it": a process moving units
/// home for a request dies there (here: the store calls stop after the debit). Units in
/// transit are no sale: no event. Once the lease passed the sweeper credits them home; the
/// request, retried, sells at its home and appends exactly one `sold`; re-sent, nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_abandoned_mid_way_appends_nothing_and_its_retry_one_sold() {
    use shardstock::store::{SegAddr, Store, TransferArgs, TransferReply};
    let redis = RedisServer::start();
    let e = engine(&redis, "t", false).await;
    let lease = e.options().transfer_lease;
    let s = Sku::new("abandoned").unwrap();
    let g = e
        .load(&s, 6, LoadOptions::new(2).outbox(true))
        .await
        .unwrap(); // [3, 3]
    let h = home_of("u-rs", "rs", 2);
    let t = TransferArgs {
        id: 11,
        dest: h,
        want: 2,
        floor: 0,
        lease_ms: lease.as_millis() as u64,
    };
    let r = e
        .store()
        .transfer(SegAddr::new(&s, g, 1 - h), t)
        .await
        .unwrap();
    assert!(
        matches!(r, TransferReply::Debited { units: 2, .. }),
        "{r:?}"
    );
    // ...and the mover dies. The sweeper credits the units once the lease has passed.
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    e.sweep().await.unwrap();
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok && a.in_transit == 0 && a.remaining == 6, "{a:?}");
    assert_eq!(a.segments[h as usize].state.stock, 5, "{a:?}");
    let d = Deduct::new("abandoned", "u-rs", 5, "rs").unwrap();
    let r = e.deduct(&d).await.unwrap();
    assert_eq!(
        r,
        Deduction::Applied {
            segment: h,
            units: 5
        }
    );
    let r = e.deduct(&d).await.unwrap();
    assert!(matches!(r, Deduction::Replayed { .. }), "{r:?}");
    let h2 = Collect::default();
    let orders = Orders::new(store(&redis, "t", false).await, h2.clone(), opts("c")).unwrap();
    orders.drain(Duration::from_secs(10)).await.unwrap();
    let seen = h2.by_rid();
    assert_eq!(seen.len(), 1, "only the sale has an event: {seen:#?}");
    let evs = &seen["rs"];
    assert_eq!(evs.len(), 1, "one event: {evs:#?}");
    assert_eq!((evs[0].kind, evs[0].units), (EventKind::Sold, 5));
    assert_eq!(
        evs[0].parts,
        vec![Part {
            segment: h,
            units: 5
        }]
    );
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok && a.sold == 5 && a.in_transit == 0, "{a:?}");
}

/// The home of `user`'s request `rid` over `segments` segments, without a per-user limit
/// (the engine of these tests has none): the pair's. (FNV-1a's low bits are weak: for an even
/// segment count the home's parity is the parity of the XOR of every byte of user, space and
/// request id, so a user `u-f7` and request `f7` — the digits twice — never land on an even
/// segment.)
fn home_of(user: &str, rid: &str, segments: u32) -> u32 {
    shardstock::segments::home(
        &shardstock::UserId::new(user).unwrap(),
        &shardstock::RequestId::new(rid).unwrap(),
        segments,
        false,
    )
}
