//! Request coalescing: concurrent deductions for one segment share one `sell.lua` call (a
//! batch of requests at one home). Same answers, same books, fewer script calls — against a
//! real redis-server.

use crate::common;
use common::*;
use futures::future::join_all;
use shardstock::*;
use std::time::Duration;

/// The node(s) whose script calls a test counts: one server, or every master of a cluster.
trait Counted: RedisAt {
    fn ports(&self) -> Vec<u16>;
}

impl Counted for RedisServer {
    fn ports(&self) -> Vec<u16> {
        vec![self.port]
    }
}

impl Counted for cluster::RedisCluster {
    fn ports(&self) -> Vec<u16> {
        self.master_ports()
    }
}

/// `EVALSHA` calls since the last [`reset_stats`], summed over the nodes.
fn evalsha_calls(srv: &impl Counted) -> u64 {
    srv.ports()
        .into_iter()
        .map(|p| {
            let info = redis_server::redis_cli(p, &["INFO", "commandstats"]);
            info.lines()
                .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// `CONFIG RESETSTAT` on every node.
fn reset_stats(srv: &impl Counted) {
    for p in srv.ports() {
        redis_server::redis_cli(p, &["CONFIG", "RESETSTAT"]);
    }
}

fn opts(max_batch: usize, window_us: u64, max_in_flight: usize) -> Coalescing {
    Coalescing::default()
        .max_batch(max_batch)
        .window(Duration::from_micros(window_us))
        .max_in_flight(max_in_flight)
}

/// `tasks` buyers run `n` one-unit (or `qty`-unit) deductions with distinct ids and users.
async fn sale(
    e: &Engine<RedisStore>,
    sku: &str,
    n: u64,
    tasks: u64,
    qty: fn(u64) -> u64,
) -> Vec<Deduction> {
    let per = n / tasks;
    let handles = (0..tasks).map(|t| {
        let (e, sku) = (e.clone(), sku.to_string());
        tokio::spawn(async move {
            let mut out = Vec::new();
            for k in 0..per {
                let i = t * per + k;
                let d = Deduct::new(&sku, &format!("u{i}"), qty(i), &format!("r{i}")).unwrap();
                out.push(e.deduct(&d).await.unwrap());
            }
            out
        })
    });
    join_all(handles)
        .await
        .into_iter()
        .flat_map(Result::unwrap)
        .collect()
}

fn sold(answers: &[Deduction]) -> u64 {
    answers.iter().map(Deduction::units_applied).sum()
}

/// 256 buyers sell a SKU out on 1 and on 16 segments: every unit once, nothing left, the
/// buyers' tally equals the store's; and the calls really were coalesced (far fewer script
/// calls than deductions while stock lasted).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coalesced_sale_is_exact_and_batched() {
    coalesced_sale(&RedisServer::start()).await;
}

async fn coalesced_sale(srv: &impl Counted) {
    let e = coalesced_engine(
        srv,
        Engine::builder().per_user_limit(0),
        Coalescing::default(),
        "t",
    )
    .await;
    for segments in [1u32, 16] {
        let name = format!("co-{segments}");
        let sku = Sku::new(&name).unwrap();
        e.load(&sku, 3000, LoadOptions::new(segments))
            .await
            .unwrap();
        let answers = sale(&e, &name, 5120, 256, |i| 1 + i % 3).await;
        e.sweep().await.unwrap();
        let a = e.audit(&sku).await.unwrap();
        assert!(a.ok, "{a:?}");
        assert_eq!(a.sold, sold(&answers), "buyers and store disagree");
        assert!(a.sold <= 3000);
        assert_eq!(a.in_transit, 0, "{a:?}");
        assert_eq!(
            a.loaded + a.restocked,
            a.remaining + a.in_transit + a.reserved + a.sold
        );
        assert!(a.remaining <= 2, "stock left unsold: {}", a.remaining);
        assert!(answers.iter().all(|d| matches!(
            d,
            Deduction::Applied { .. } | Deduction::SoldOut | Deduction::Insufficient { .. }
        )));
    }

    // Plenty of stock, one segment: every deduction is a home deduction.
    let sku = Sku::new("co-batched").unwrap();
    e.load(&sku, 1_000_000, LoadOptions::new(1)).await.unwrap();
    reset_stats(srv);
    let answers = sale(&e, "co-batched", 8192, 256, |_| 1).await;
    assert_eq!(sold(&answers), 8192);
    let calls = evalsha_calls(srv);
    assert!(
        calls > 0 && calls * 4 < 8192,
        "{calls} script calls for 8192 deductions"
    );
    eprintln!("8192 deductions in {calls} script calls");
    assert!(e.audit(&sku).await.unwrap().ok);
}

/// The same request id many times at once lands in the same batch: exactly one applies, its
/// twins replay it, the one with another quantity is a conflict (or, if it came first, the
/// winner). The batch bound holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twins_in_one_batch_apply_once() {
    twins_in_one_batch(&RedisServer::start()).await;
}

async fn twins_in_one_batch(srv: &impl Counted) {
    // A 3 ms window and one call in flight: the burst below gathers in few calls of ≤ 16.
    let e = coalesced_engine(
        srv,
        Engine::builder().per_user_limit(0),
        opts(16, 3000, 1),
        "t",
    )
    .await;
    let sku = Sku::new("twins").unwrap();
    e.load(&sku, 1000, LoadOptions::new(1)).await.unwrap();
    reset_stats(srv);
    // 100 twins of (alice, 2 units) and one of (alice, 3 units), all with the same id.
    let same = (0..101u64).map(|k| {
        let e = e.clone();
        let qty = if k == 50 { 3 } else { 2 };
        tokio::spawn(async move {
            let d = Deduct::new("twins", "alice", qty, "same-id").unwrap();
            (qty, e.deduct(&d).await)
        })
    });
    let others = (0..60).map(|i| {
        let e = e.clone();
        tokio::spawn(async move {
            let d = Deduct::new("twins", &format!("b{i}"), 1, &format!("o{i}")).unwrap();
            e.deduct(&d).await.unwrap()
        })
    });
    let same: Vec<_> = join_all(same)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let others: Vec<_> = join_all(others)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let winners: Vec<u64> = same
        .iter()
        .filter(|(_, d)| matches!(d, Ok(Deduction::Applied { .. })))
        .map(|(q, _)| *q)
        .collect();
    assert_eq!(winners.len(), 1, "{same:?}");
    let won = winners[0];
    for (q, d) in &same {
        match d {
            Ok(Deduction::Applied { .. }) => {}
            Ok(Deduction::Replayed { units, .. }) => {
                assert_eq!(*q, won);
                assert_eq!(*units, won);
            }
            Err(Error::RequestIdConflict { field: "qty", .. }) => assert_ne!(*q, won),
            other => panic!("{other:?}"),
        }
    }
    assert!(others.iter().all(|d| d.units_applied() == 1));
    let calls = evalsha_calls(srv);
    assert!(calls >= 161 / 16, "{calls} calls: batches bigger than 16?");
    assert!(calls < 161, "{calls} calls: nothing was coalesced");
    // Whichever twin won (the qty-3 one may), the audit counts exactly its units.
    let a = e.audit(&sku).await.unwrap();
    assert!(
        a.ok && a.sold == won + 60 && a.remaining == 1000 - 60 - won && a.in_transit == 0,
        "{a:?}"
    );
}

/// Concurrent reservations through coalesced calls: half confirmed, the rest expire and come
/// back — every unit in exactly one place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coalesced_reservations_conserve_stock() {
    coalesced_reservations(&RedisServer::start()).await;
}

async fn coalesced_reservations(srv: &impl RedisAt) {
    let e = coalesced_engine(
        srv,
        Engine::builder().per_user_limit(0),
        Coalescing::default(),
        "t",
    )
    .await;
    let sku = Sku::new("co-resv").unwrap();
    e.load(&sku, 500, LoadOptions::new(4)).await.unwrap();
    let held = (0..600).map(|i| {
        let e = e.clone();
        tokio::spawn(async move {
            let d = Deduct::new("co-resv", &format!("u{i}"), 1, &format!("r{i}")).unwrap();
            match e.reserve(&d, Duration::from_millis(1500)).await.unwrap() {
                Reserved::Held { id, .. } => {
                    if i % 2 == 0 {
                        e.confirm(&id).await.unwrap();
                        2
                    } else {
                        1
                    }
                }
                _ => 0,
            }
        })
    });
    let outcomes: Vec<u32> = join_all(held)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let confirmed = outcomes.iter().filter(|&&o| o == 2).count() as u64;
    let left = outcomes.iter().filter(|&&o| o == 1).count() as u64;
    assert_eq!(confirmed + left, 500, "every unit reserved once");
    tokio::time::sleep(Duration::from_millis(1700)).await;
    e.sweep().await.unwrap();
    let a = e.audit(&sku).await.unwrap();
    assert!(a.ok, "{a:?}");
    assert_eq!(
        (a.sold, a.reserved, a.remaining, a.in_transit),
        (confirmed, 0, 500 - confirmed, 0)
    );
}

/// Many quiet lanes (16 segments, 64 buyers, a limit of one per user: ~4 requests per lane at
/// a time): a lane waits for calls out to come back rather than send a call of one or two, so
/// calls carry more than they did when every idle lane sent at once (~2.5 requests per call).
/// One buyer at a time never waits: each request is its own call, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quiet_lanes_wait_for_fuller_calls() {
    let srv = RedisServer::start();
    let e = coalesced_engine(
        &srv,
        Engine::builder().per_user_limit(1),
        Coalescing::default(),
        "q",
    )
    .await;
    let sku = Sku::new("quiet").unwrap();
    e.load(&sku, 1_000_000, LoadOptions::new(16)).await.unwrap();
    let before = e.store().coalescing().unwrap();
    let answers = sale(&e, "quiet", 12_800, 64, |_| 1).await;
    assert_eq!(sold(&answers), 12_800);
    let after = e.store().coalescing().unwrap();
    let (calls, requests) = (after.calls - before.calls, after.requests - before.requests);
    assert_eq!(requests, 12_800);
    let per_call = requests as f64 / calls as f64;
    eprintln!("16 lanes, 64 buyers: {per_call:.2} requests per call");
    assert!(per_call >= 3.0, "{per_call:.2} requests per call");
    assert!(e.audit(&sku).await.unwrap().ok);

    // One buyer: nothing is ever out when it asks, so it never waits.
    let sku = Sku::new("quiet-lone").unwrap();
    e.load(&sku, 1_000, LoadOptions::new(16)).await.unwrap();
    let lone = e.store().coalescing().unwrap();
    let t0 = std::time::Instant::now();
    let answers = sale(&e, "quiet-lone", 400, 1, |_| 1).await;
    assert_eq!(sold(&answers), 400);
    let after = e.store().coalescing().unwrap();
    assert_eq!(
        after.calls - lone.calls,
        400,
        "a lone buyer's request is its own call"
    );
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
}

/// A master that stopped answering holds its own segments' calls, and no other master's
/// sales: lanes of the other masters, less full than the stuck calls and waiting in line for
/// calls to come back, go after a bounded wait. Frozen for 1.2 s (under the cluster's 2 s node
/// timeout, so the cluster stays up). A sale stuck behind the frozen master would wait out the
/// command timeout (5 s): the bound of 1 s leaves room for a loaded machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_master_holds_no_other_masters_sales() {
    use shardstock::segments;
    use std::sync::Arc;
    use std::time::Instant;
    let cluster = cluster::RedisCluster::start(3, 0);
    let e = coalesced_engine(
        &cluster,
        Engine::builder().per_user_limit(1),
        Coalescing::default(),
        "st",
    )
    .await;
    let sku = Sku::new("stuck").unwrap();
    e.load(&sku, 1_000_000, LoadOptions::new(16)).await.unwrap();
    let homes = e.placement(&sku).await.unwrap().unwrap();
    // A master other than the SKU metadata's (a sale reads the metadata once, on first use).
    let meta = cluster
        .admin()
        .owner_of(cluster::key_slot("st:{stuck}:meta"));
    let stopped = *cluster.master_ports().iter().find(|&&p| p != meta).unwrap();
    let at_stopped: Vec<bool> = homes
        .iter()
        .map(|h| {
            h.master
                .as_deref()
                .unwrap()
                .ends_with(&format!(":{stopped}"))
        })
        .collect();
    assert!(at_stopped.iter().any(|&x| x) && at_stopped.iter().any(|&x| !x));
    // Users homed at the stopped master (`true`) or at another one.
    let users = |stopped: bool, from: usize| {
        let at = at_stopped.clone();
        (from..).map(|i| format!("u{i}")).filter(move |u| {
            let user = UserId::new(u.as_str()).unwrap();
            let rid = RequestId::new("r").unwrap();
            at[segments::home(&user, &rid, 16, true) as usize] == stopped
        })
    };
    // Warm: the layout is cached before the master stops.
    let warm = e
        .deduct(&Deduct::new("stuck", "warm", 1, "r").unwrap())
        .await
        .unwrap();
    assert_eq!(warm.units_applied(), 1);
    let node = cluster
        .nodes
        .iter()
        .position(|n| n.port == stopped)
        .unwrap();
    let frozen = cluster.freeze(node);
    let t0 = Instant::now();
    // 300 sales homed at the stopped master at once: its lanes' calls, up to three each, carry
    // them all and hang.
    let stuck: Vec<_> = users(true, 0)
        .take(300)
        .map(|u| {
            let e = e.clone();
            tokio::spawn(async move { e.deduct(&Deduct::new("stuck", &u, 1, "r").unwrap()).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // 16 buyers at the other masters, one sale after another, for 700 ms.
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let buyers: Vec<_> = (0..16)
        .map(|b| {
            let (e, done) = (e.clone(), done.clone());
            let mut mine = users(false, 1_000_000 + b * 100_000);
            tokio::spawn(async move {
                let mut slowest = Duration::ZERO;
                while t0.elapsed() < Duration::from_millis(750) {
                    let u = mine.next().unwrap();
                    let t = Instant::now();
                    let d = e.deduct(&Deduct::new("stuck", &u, 1, "r").unwrap()).await;
                    assert_eq!(d.unwrap().units_applied(), 1);
                    slowest = slowest.max(t.elapsed());
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                slowest
            })
        })
        .collect();
    let slowest = join_all(buyers)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .max()
        .unwrap();
    let sold_elsewhere = done.load(std::sync::atomic::Ordering::Relaxed);
    let frozen_for = t0.elapsed();
    frozen.thaw();
    assert!(
        frozen_for < Duration::from_millis(1_500),
        "the other masters' sales took {frozen_for:?}"
    );
    assert!(
        slowest < Duration::from_secs(1),
        "a sale at another master waited {slowest:?} behind the stopped one ({sold_elsewhere} sold)"
    );
    assert!(
        sold_elsewhere >= 100,
        "{sold_elsewhere} sold at the other masters"
    );
    // The stopped master's sales finish once it answers again.
    for r in join_all(stuck).await {
        assert_eq!(r.unwrap().unwrap().units_applied(), 1);
    }
    let a = e.audit(&sku).await.unwrap();
    assert!(a.ok && a.sold == 301 + sold_elsewhere, "{a:?}");
}

/// The coalescing suites on a 3-master cluster (one cluster for all; each suite its own SKU
/// names): script calls counted over every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coalescing_on_a_cluster() {
    let c = cluster::RedisCluster::start(3, 0);
    coalesced_sale(&c).await;
    twins_in_one_batch(&c).await;
    coalesced_reservations(&c).await;
}

/// Bad options are refused with a typed error.
#[tokio::test]
async fn coalescing_options_are_checked() {
    let srv = RedisServer::start();
    for bad in [
        opts(0, 0, 1),
        opts(1001, 0, 1),
        opts(8, 0, 0),
        opts(8, 200_000, 1),
    ] {
        let store = store_builder(&srv, "t")
            .pool_size(1)
            .coalescing(Some(bad))
            .connect()
            .await;
        assert!(matches!(store, Err(Error::Config(_))));
    }
}
