//! The strategy ladder against real redis-server processes: the safe rungs conserve stock
//! exactly under concurrency; the unsafe baselines really do oversell (so the demonstration
//! cannot silently turn into a no-op); lock leases, fencing and watchdogs behave.

use crate::common;
use common::*;
use futures::future::join_all;
use shardstock::*;
use std::time::{Duration, Instant};

async fn buyers<S: Store>(e: &Engine<S>, sku: &str, n: usize, tag: &str) -> (u64, u64) {
    let tasks = (0..n).map(|i| {
        let (e, sku, tag) = (e.clone(), sku.to_string(), tag.to_string());
        tokio::spawn(async move {
            let d = Deduct::new(&sku, &format!("{tag}u{i}"), 1, &format!("{tag}r{i}")).unwrap();
            e.deduct(&d).await
        })
    });
    let (mut told, mut errors) = (0, 0);
    for r in join_all(tasks).await {
        match r.unwrap() {
            Ok(d) => told += d.units_applied(),
            Err(e) => {
                // Shown with the failing assertion: which error, not only how many.
                eprintln!("buyer error ({sku}): {e} (kind {:?})", e.kind());
                errors += 1;
            }
        }
    }
    (told, errors)
}

/// Safe strategies: 128 concurrent buyers on 100 units sell exactly 100, audit ok.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_strategy_conserves_stock_for_1_and_16_segments() {
    let srv = RedisServer::start();
    for segments in [1u32, 16] {
        let e = strategy_engine(
            &srv,
            Engine::builder().per_user_limit(0),
            Strategy::Lock,
            lock_opts(2000, 5000),
        )
        .await;
        let name = format!("lock-{segments}");
        let sku = Sku::new(&name).unwrap();
        e.load(&sku, 100, LoadOptions::new(segments)).await.unwrap();
        let (told, errors) = buyers(&e, &name, 128, "a").await;
        // Whatever a call left in transit is credited before the audit.
        e.sweep().await.unwrap();
        let a = e.audit(&sku).await.unwrap();
        assert_eq!(a.in_transit, 0, "{a:?}");
        assert!(a.ok, "{a:?}");
        assert_eq!(
            (a.sold, a.remaining, told, errors),
            (100, 0, 100, 0),
            "{segments} segments"
        );
        let l = e.store().lock_figures().unwrap();
        assert!(l.acquired >= 100 && l.fenced_rejected == 0, "{l:?}");
        assert_eq!(e.store().strategy(), Strategy::Lock);
    }
}

/// `naive` (GET, decide, SET) with 64 concurrent buyers on 100 units sells more than 100 —
/// the bug the articles start from. A 1 ms pause between read and write (their slow
/// downstream call) makes the race certain rather than likely.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn naive_oversells_under_concurrency() {
    let srv = RedisServer::start();
    let e = strategy_engine(
        &srv,
        Engine::builder().per_user_limit(0),
        Strategy::Naive,
        lock_opts(2000, 1000),
    )
    .await;
    e.store()
        .set_critical_section_pause(Duration::from_millis(1));
    let sku = Sku::new("naive").unwrap();
    e.load(&sku, 100, LoadOptions::new(1)).await.unwrap();
    let (told, _) = buyers(&e, "naive", 200, "n").await;
    // Whatever a call left in transit is credited before the audit.
    e.sweep().await.unwrap();
    let a = e.audit(&sku).await.unwrap();
    assert_eq!(a.in_transit, 0, "{a:?}");
    assert!(
        told > 100,
        "naive sold only {told}: the demonstration did not oversell"
    );
    assert!(a.sold > a.loaded, "{a:?}");
    assert!(!a.ok, "the audit must flag the oversell: {a:?}");
}

/// `local-mutex` is safe inside one process and oversells across several (three engines with
/// their own connections and their own in-process mutexes stand for three processes here;
/// tests/it/cli_processes.rs runs real processes).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_mutex_is_safe_in_one_process_only() {
    let srv = RedisServer::start();
    let one = strategy_engine(
        &srv,
        Engine::builder().per_user_limit(0),
        Strategy::LocalMutex,
        lock_opts(2000, 1000),
    )
    .await;
    one.store()
        .set_critical_section_pause(Duration::from_millis(1));
    let sku = Sku::new("lm-one").unwrap();
    one.load(&sku, 100, LoadOptions::new(1)).await.unwrap();
    let (told, _) = buyers(&one, "lm-one", 150, "a").await;
    // Whatever a call left in transit is credited before the audit.
    one.sweep().await.unwrap();
    let a = one.audit(&sku).await.unwrap();
    assert_eq!(a.in_transit, 0, "{a:?}");
    assert!(a.ok && told == 100 && a.sold == 100, "{a:?}");

    // One unit and a 500 ms section make the oversell certain: each engine's first buyer reads
    // the one unit before any of them writes. (100 units relied on the engines overlapping at
    // the last unit; engines in step sell exactly the stock.)
    let sku = Sku::new("lm-three").unwrap();
    one.load(&sku, 1, LoadOptions::new(1)).await.unwrap();
    let mut engines = Vec::new();
    for _ in 0..3 {
        let e = strategy_engine(
            &srv,
            Engine::builder().per_user_limit(0),
            Strategy::LocalMutex,
            lock_opts(2000, 1000),
        )
        .await;
        e.store()
            .set_critical_section_pause(Duration::from_millis(500));
        engines.push(e);
    }
    let tags = ["p0", "p1", "p2"];
    let runs = engines
        .iter()
        .zip(tags)
        .map(|(e, tag)| buyers(e, "lm-three", 4, tag));
    let told: u64 = join_all(runs).await.iter().map(|(t, _)| t).sum();
    // Whatever a call left in transit is credited before the audit.
    one.sweep().await.unwrap();
    let a = one.audit(&sku).await.unwrap();
    assert_eq!(a.in_transit, 0, "{a:?}");
    assert!(
        told > 1 && a.sold > 1,
        "three processes sold {told} of 1: expected an oversell; {a:?}"
    );
}

/// `decr-compensate` never oversells, even with several instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn decr_compensate_never_oversells() {
    let srv = RedisServer::start();
    let e = strategy_engine(
        &srv,
        Engine::builder().per_user_limit(0),
        Strategy::DecrCompensate,
        lock_opts(2000, 1000),
    )
    .await;
    let f = strategy_engine(
        &srv,
        Engine::builder().per_user_limit(0),
        Strategy::DecrCompensate,
        lock_opts(2000, 1000),
    )
    .await;
    let sku = Sku::new("decr").unwrap();
    e.load(&sku, 100, LoadOptions::new(4)).await.unwrap();
    let (a1, b1) = futures::join!(buyers(&e, "decr", 120, "x"), buyers(&f, "decr", 120, "y"));
    // Whatever a call left in transit is credited before the audit.
    e.sweep().await.unwrap();
    let a = e.audit(&sku).await.unwrap();
    assert_eq!(a.in_transit, 0, "{a:?}");
    assert!(a.ok, "{a:?}");
    assert_eq!(a1.0 + b1.0, a.sold);
    assert!(a.sold <= 100);
}

/// A holder whose lock expires mid critical section (here: the lock key is deleted while it
/// pauses, before its watchdog's next renewal) cannot write: another holder took the lock and
/// bumped the fence, so the late write is refused and the caller gets `LeaseLost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn late_write_after_lease_loss_is_fenced_off() {
    let srv = RedisServer::start();
    // Lease 3 s: the watchdog renews after 1 s, long after the pause below ends.
    let slow = strategy_engine(
        &srv,
        Engine::builder().per_user_limit(0),
        Strategy::Lock,
        lock_opts(3000, 2000),
    )
    .await;
    let fast = strategy_engine(
        &srv,
        Engine::builder().per_user_limit(0),
        Strategy::Lock,
        lock_opts(3000, 2000),
    )
    .await;
    slow.store()
        .set_critical_section_pause(Duration::from_millis(400));
    let sku = Sku::new("fence").unwrap();
    slow.load(&sku, 1, LoadOptions::new(1)).await.unwrap();
    let late = {
        let slow = slow.clone();
        tokio::spawn(async move {
            slow.deduct(&Deduct::new("fence", "slow", 1, "slow-1").unwrap())
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        srv.cli(&["DEL", "t:{fence#0}:lock"]),
        "1",
        "the slow holder should hold the lock"
    );
    let d = fast
        .deduct(&Deduct::new("fence", "fast", 1, "fast-1").unwrap())
        .await
        .unwrap();
    assert_eq!(d.units_applied(), 1);
    let r = late.await.unwrap();
    assert!(matches!(r, Err(Error::LeaseLost(_))), "{r:?}");
    // Whatever a call left in transit is credited before the audit.
    fast.sweep().await.unwrap();
    let a = fast.audit(&sku).await.unwrap();
    assert_eq!(a.in_transit, 0, "{a:?}");
    assert!(a.ok && a.sold == 1 && a.remaining == 0, "{a:?}");
    assert_eq!(slow.store().lock_figures().unwrap().fenced_rejected, 1);
}

/// A credit refused by the fence: a request whose home is short moves a unit home (a
/// transfer's debit at the other segment), then loses the home's lock before its sale with the
/// credit writes — the write is refused whole, credit included. The unit is in transit: the
/// request must not mark the transfer done, so that the sweeper credits it home once the lease
/// has run out; nothing may stay in transit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_credit_refused_by_the_fence_is_left_to_the_sweeper() {
    let srv = RedisServer::start();
    let b = || {
        Engine::builder()
            .per_user_limit(0)
            .transfer_lease(Duration::from_millis(200))
    };
    // Lease 3 s: the watchdog renews after 1 s, long after the pauses below end.
    let slow = strategy_engine(&srv, b(), Strategy::Lock, lock_opts(3000, 2000)).await;
    let fast = strategy_engine(&srv, b(), Strategy::Lock, lock_opts(3000, 2000)).await;
    slow.store()
        .set_critical_section_pause(Duration::from_millis(400));
    let sku = Sku::new("fenced-move").unwrap();
    let g = slow.load(&sku, 2, LoadOptions::new(2)).await.unwrap(); // [1, 1]
    let home = |user: &str, rid: &str| {
        shardstock::segments::home(
            &UserId::new(user).unwrap(),
            &RequestId::new(rid).unwrap(),
            2,
            false,
        )
    };
    let h = home("slow", "s-1");
    let donor = 1 - h;
    let late = {
        let slow = slow.clone();
        tokio::spawn(async move {
            slow.deduct(&Deduct::new("fenced-move", "slow", 2, "s-1").unwrap())
                .await
        })
    };
    // The debit happened (after the first, short, sale at home): the sale with the credit is
    // now in its critical section.
    let tx = format!("t:{{fenced-move#{donor}}}:g{g}:tx");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while srv.cli(&["HLEN", &tx]) != "1" {
        assert!(std::time::Instant::now() < deadline, "no debit");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        srv.cli(&["DEL", &format!("t:{{fenced-move#{h}}}:lock")]),
        "1",
        "the slow holder should hold the home's lock"
    );
    // Another holder takes the home's lock (its fence bumped) and sells the home's unit.
    let rid = (0..)
        .map(|k| format!("f-{k}"))
        .find(|r| home("fast", r) == h)
        .unwrap();
    let d = fast
        .deduct(&Deduct::new("fenced-move", "fast", 1, &rid).unwrap())
        .await
        .unwrap();
    assert_eq!(d.units_applied(), 1, "{d:?}");
    let r = late.await.unwrap();
    assert!(matches!(r, Err(Error::LeaseLost(_))), "{r:?}");
    let a = fast.audit(&sku).await.unwrap();
    assert!(a.ok && a.in_transit == 1 && a.sold == 1, "{a:?}");
    // The lease runs out: the sweeper credits the unit home.
    tokio::time::sleep(Duration::from_millis(300)).await;
    fast.sweep().await.unwrap();
    let a = fast.audit(&sku).await.unwrap();
    assert!(a.ok, "{a:?}");
    assert_eq!(
        (a.in_transit, a.sold, a.remaining),
        (0, 1, 1),
        "the refused credit's unit must come home: {a:?}"
    );
}

/// The same with the watchdog noticing first: the holder learns it lost the lease before it
/// writes and reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watchdog_reports_a_lost_lease() {
    let srv = RedisServer::start();
    let e = strategy_engine(
        &srv,
        Engine::builder().per_user_limit(0),
        Strategy::Lock,
        lock_opts(300, 2000),
    )
    .await;
    e.store()
        .set_critical_section_pause(Duration::from_millis(500));
    let sku = Sku::new("lost").unwrap();
    e.load(&sku, 5, LoadOptions::new(1)).await.unwrap();
    let task = {
        let e = e.clone();
        tokio::spawn(async move { e.deduct(&Deduct::new("lost", "u", 1, "r").unwrap()).await })
    };
    tokio::time::sleep(Duration::from_millis(40)).await;
    srv.cli(&["DEL", "t:{lost#0}:lock"]);
    let r = task.await.unwrap();
    assert!(matches!(r, Err(Error::LeaseLost(_))), "{r:?}");
    assert!(e.store().lock_figures().unwrap().leases_lost >= 1);
    // Whatever a call left in transit is credited before the audit.
    e.sweep().await.unwrap();
    let a = e.audit(&sku).await.unwrap();
    assert_eq!(a.in_transit, 0, "{a:?}");
    assert!(a.ok && a.sold == 0, "{a:?}");
    // A retry with the same request id succeeds.
    e.store().set_critical_section_pause(Duration::ZERO);
    let d = e
        .deduct(&Deduct::new("lost", "u", 1, "r").unwrap())
        .await
        .unwrap();
    assert_eq!(d.units_applied(), 1);
}

/// The watchdog keeps a critical section lasting 3× the lease safe: nobody else gets in, and
/// the write lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watchdog_covers_a_section_three_times_the_lease() {
    let srv = RedisServer::start();
    let slow = strategy_engine(
        &srv,
        Engine::builder().per_user_limit(0),
        Strategy::Lock,
        lock_opts(200, 3000),
    )
    .await;
    let other = strategy_engine(
        &srv,
        Engine::builder().per_user_limit(0),
        Strategy::Lock,
        lock_opts(200, 3000),
    )
    .await;
    slow.store()
        .set_critical_section_pause(Duration::from_millis(600));
    let sku = Sku::new("long").unwrap();
    slow.load(&sku, 2, LoadOptions::new(1)).await.unwrap();
    let start = Instant::now();
    let first = {
        let slow = slow.clone();
        tokio::spawn(async move {
            slow.deduct(&Deduct::new("long", "a", 1, "a").unwrap())
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = other
        .deduct(&Deduct::new("long", "b", 1, "b").unwrap())
        .await
        .unwrap();
    let waited = start.elapsed();
    assert_eq!(first.await.unwrap().unwrap().units_applied(), 1);
    assert_eq!(second.units_applied(), 1);
    assert!(
        waited >= Duration::from_millis(550),
        "the second holder got in after {waited:?}"
    );
    let f = slow.store().lock_figures().unwrap();
    assert!(f.renewals >= 2 && f.leases_lost == 0, "{f:?}");
    assert!(slow.audit(&sku).await.unwrap().ok);
}

/// A holder that crashed (never releases) blocks only until its lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crashed_holders_lock_expires() {
    let srv = RedisServer::start();
    let e = strategy_engine(
        &srv,
        Engine::builder().per_user_limit(0),
        Strategy::Lock,
        lock_opts(2000, 3000),
    )
    .await;
    let sku = Sku::new("crash").unwrap();
    e.load(&sku, 3, LoadOptions::new(1)).await.unwrap();
    assert_eq!(
        srv.cli(&["SET", "t:{crash#0}:lock", "dead-holder", "PX", "300"]),
        "OK"
    );
    let start = Instant::now();
    let d = e
        .deduct(&Deduct::new("crash", "u", 1, "r").unwrap())
        .await
        .unwrap();
    assert_eq!(d.units_applied(), 1);
    assert!(
        start.elapsed() >= Duration::from_millis(250),
        "got in before the lease ran out"
    );
}

/// 400 deductions cancelled at random points leave no lock held and no watchdog running, and
/// the books still balance.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_acquisitions_leave_nothing_behind() {
    let srv = RedisServer::start();
    let e = strategy_engine(
        &srv,
        Engine::builder().per_user_limit(0),
        Strategy::Lock,
        lock_opts(1000, 1000),
    )
    .await;
    e.store()
        .set_critical_section_pause(Duration::from_millis(2));
    let sku = Sku::new("cancel").unwrap();
    e.load(&sku, 1000, LoadOptions::new(4)).await.unwrap();
    let tasks = (0..400).map(|i| {
        let e = e.clone();
        tokio::spawn(async move {
            let d = Deduct::new("cancel", &format!("u{i}"), 1, &format!("c{i}")).unwrap();
            let budget = Duration::from_micros(fastrand::u64(0..6000));
            let _ = tokio::time::timeout(budget, e.deduct(&d)).await;
        })
    });
    join_all(tasks).await;
    // Background releases of dropped guards and cancelled acquisitions.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let held = srv.cli(&["KEYS", "t:*:lock"]);
        let running = e.store().lock_figures().unwrap().watchdogs_running;
        if held.is_empty() && running == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still held: {held:?}, watchdogs running: {running}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Whatever a call left in transit is credited before the audit.
    e.sweep().await.unwrap();
    let a = e.audit(&sku).await.unwrap();
    assert_eq!(a.in_transit, 0, "{a:?}");
    assert!(a.ok && a.sold <= 400, "{a:?}");
}

/// Three fresh lock nodes, marked new so they vote at once (see the quarantine in
/// `shardstock::lock::redlock`).
fn lock_nodes() -> (Vec<RedisServer>, Vec<String>) {
    let nodes: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_plain(redis_server::LOCK_NODE))
        .collect();
    for n in &nodes {
        assert_eq!(
            n.cli(&["SET", shardstock::lock::redlock::QUARANTINE_KEY, "0"]),
            "OK"
        );
    }
    let urls = nodes.iter().map(RedisServer::url).collect();
    (nodes, urls)
}

/// `redlock`: 128 concurrent buyers on 100 units, over three independent lock nodes, for 1 and
/// 16 segments: exactly 100 sold, audit ok; with one lock node down it still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redlock_strategy_conserves_stock_for_1_and_16_segments() {
    let srv = RedisServer::start();
    let (mut nodes, urls) = lock_nodes();
    for (segments, kill_one) in [(1u32, false), (16, false), (16, true)] {
        if kill_one {
            drop(nodes.pop()); // a minority of lock nodes is down
        }
        let store = store_builder(&srv, "t")
            .strategy(Strategy::Redlock)
            .lock_options(lock_opts(2000, 5000))
            .lock_nodes(&urls)
            .connect()
            .await
            .unwrap();
        let e = Engine::builder().per_user_limit(0).build(store).unwrap();
        let name = format!("red-{segments}-{kill_one}");
        let sku = Sku::new(&name).unwrap();
        e.load(&sku, 100, LoadOptions::new(segments)).await.unwrap();
        let (told, errors) = buyers(&e, &name, 128, "r").await;
        // Whatever a call left in transit is credited before the audit.
        e.sweep().await.unwrap();
        let a = e.audit(&sku).await.unwrap();
        assert_eq!(a.in_transit, 0, "{a:?}");
        assert!(a.ok, "{a:?}");
        assert_eq!(
            (a.sold, a.remaining),
            (100, 0),
            "{segments} segments, one node down: {kill_one}"
        );
        assert_eq!(told, 100);
        assert_eq!(errors, 0);
        assert_eq!(e.store().strategy(), Strategy::Redlock);
        assert!(e.store().lock_figures().unwrap().acquired >= 100);
    }
}

/// Acquires `key`, holds it until the watchdog renewed the lease once, releases it.
async fn hold_until_renewed(locker: &shardstock::lock::Locker, key: &str) {
    let guard = locker.acquire(key).await.unwrap().expect("a free lock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while locker.stats().figures().renewals == 0 {
        assert!(Instant::now() < deadline, "the watchdog never renewed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    guard.release().await.unwrap();
}

/// Lock scripts run through the store's one Lua layer: after `SCRIPT FLUSH` (what a restart or
/// a failover does to the script cache) their `NOSCRIPT` reloads are counted in
/// `shardstock_script_reloads_total{script=...}` like every other script's — on the store's
/// own Redis (`lock`: watchdog renewal, release) and on each RedLock node (acquire, renewal,
/// release).
#[test]
fn lock_script_reloads_are_counted() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let reloads = |script: &str| -> u64 {
        let line = format!("shardstock_script_reloads_total{{script=\"{script}\"}} ");
        handle
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(&line).map(|n| n.trim().parse().unwrap()))
            .unwrap_or(0)
    };
    // A local recorder on a current-thread runtime: every task of this test (watchdogs too)
    // records here, and nothing of the other tests does.
    ::metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // One Redis: the store loaded every script at connect, lock scripts included.
            let srv = RedisServer::start();
            let store = redis_config(&srv, "t").build_store().await.unwrap();
            assert_eq!(reloads("lock_renew") + reloads("lock_release"), 0);
            assert_eq!(srv.cli(&["SCRIPT", "FLUSH"]), "OK");
            let single =
                shardstock::lock::Locker::single(store.pool().clone(), lock_opts(90, 1000));
            hold_until_renewed(&single, "t:{reload#0}:lock").await;
            assert_eq!((reloads("lock_renew"), reloads("lock_release")), (1, 1));

            // RedLock: each node reloads on its own.
            let (nodes, urls) = lock_nodes();
            let red = shardstock::lock::Locker::redlock(&urls, lock_opts(90, 1000))
                .await
                .unwrap();
            for n in &nodes {
                assert_eq!(n.cli(&["SCRIPT", "FLUSH"]), "OK");
            }
            hold_until_renewed(&red, "t:{reload#0}:lock").await;
            assert_eq!(reloads("redlock_acquire"), 3);
            assert_eq!((reloads("lock_renew"), reloads("lock_release")), (4, 4));
        });
    });
}

/// Waiters of one locker queue in process (no failed `SET NX` in Redis: every acquisition
/// gets in on its first attempt), while two lockers (two processes) still exclude each other
/// through Redis; nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_waiters_queue_in_process_and_lockers_exclude_each_other() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    let srv = RedisServer::start();
    let store = redis_config(&srv, "t").build_store().await.unwrap();
    let locker = || shardstock::lock::Locker::single(store.pool().clone(), lock_opts(2000, 10_000));
    let key = "t:{queue#0}:lock";
    let inside = Arc::new(AtomicU32::new(0));
    let section = |l: shardstock::lock::Locker, inside: Arc<AtomicU32>| async move {
        let g = l
            .acquire(key)
            .await
            .unwrap()
            .expect("acquired within the wait");
        assert_eq!(inside.fetch_add(1, SeqCst), 0, "two holders at once");
        tokio::time::sleep(Duration::from_micros(300)).await;
        inside.fetch_sub(1, SeqCst);
        g.release().await.unwrap();
    };
    let one = locker();
    for t in join_all((0..32).map(|_| tokio::spawn(section(one.clone(), inside.clone())))).await {
        t.unwrap();
    }
    let f = one.stats().figures();
    assert_eq!((f.acquired, f.contended, f.timeouts), (32, 0, 0), "{f:?}");

    let two = locker();
    let tasks = (0..64).map(|i| {
        let l = if i % 2 == 0 { one.clone() } else { two.clone() };
        tokio::spawn(section(l, inside.clone()))
    });
    for t in join_all(tasks).await {
        t.unwrap();
    }
    assert_eq!(
        one.stats().figures().acquired + two.stats().figures().acquired,
        96
    );
    assert_eq!(srv.cli(&["EXISTS", key]), "0");
}
