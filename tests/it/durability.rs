//! Durability mode (`store.wait_replicas`): every mutating script call answers only after the
//! replicas acknowledged its writes (`WAIT` on the same connection).
//!
//! - On one master with one replica: with the replica down, a sale answers the typed,
//!   retryable [`Error::NotDurable`] (alone and coalesced); once the replica is back, the
//!   retry with the same request id answers the sale the master made, exactly once.
//! - On a 3 + 3 cluster: a master is killed with `kill -9` in the middle of a sale and its
//!   replica takes over. With durability mode on, every acknowledged sale is still there
//!   afterwards (its request id replays it) and the audit counts exactly the acknowledged
//!   units. The same sale without it reports (does not assert) what was lost.

use crate::common;

use common::cluster::RedisCluster;
use common::{RedisServer, store_builder};
use shardstock::error::ErrorKind;
use shardstock::{Coalescing, Deduct, Deduction, Engine, Error, LoadOptions, RedisStore, Sku};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Waits until `replica` is in sync with its master (`master_link_status:up`).
fn wait_in_sync(replica: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !replica
        .cli(&["INFO", "replication"])
        .contains("master_link_status:up")
    {
        assert!(Instant::now() < deadline, "replica never synced");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A master with one replica in sync.
fn master_and_replica() -> (RedisServer, RedisServer) {
    let master = RedisServer::start();
    let port = master.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    wait_in_sync(&replica);
    (master, replica)
}

/// A store on `master` in durability mode: one replica, `WAIT` up to `wait`.
async fn durable_store(
    master: &RedisServer,
    prefix: &str,
    coalescing: Option<Coalescing>,
    wait: Duration,
) -> RedisStore {
    store_builder(master, prefix)
        .coalescing(coalescing)
        .wait_replicas(1)
        .wait_timeout(wait)
        .connect()
        .await
        .unwrap()
}

/// A master with one replica, durability mode on (1 replica, 300 ms): a sale works; with the
/// replica killed, a sale answers `NotDurable` (typed, retryable) and so do the eight requests
/// of a coalesced batch; with the replica back, each retry (same request id) replays the sale
/// the master made, and the audit counts each sale once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_replica_did_not_acknowledge_is_a_typed_retryable_error() {
    let (master, mut replica) = master_and_replica();
    let engine = |prefix: &'static str, coalescing: Option<Coalescing>| {
        let store = durable_store(&master, prefix, coalescing, Duration::from_millis(300));
        async move {
            Engine::builder()
                .per_user_limit(0)
                .build(store.await)
                .unwrap()
        }
    };
    let lone = engine("lone", None).await;
    let batched = engine("coal", Some(Coalescing::default().max_batch(8))).await;
    let sku = Sku::new("flash").unwrap();
    for e in [&lone, &batched] {
        e.load(&sku, 100, LoadOptions::new(2)).await.unwrap();
    }
    let sale = |user: &str, rid: &str| Deduct::new("flash", user, 1, rid).unwrap();
    let first = lone.deduct(&sale("u0", "r0")).await.unwrap();
    assert!(matches!(first, Deduction::Applied { .. }), "{first:?}");

    replica.stop();
    let t = Instant::now();
    let err = lone.deduct(&sale("u1", "r1")).await.unwrap_err();
    eprintln!(
        "replica down: the sale answered after {:?}: {err}",
        t.elapsed()
    );
    assert!(
        matches!(
            err,
            Error::NotDurable {
                acked: 0,
                wanted: 1
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), ErrorKind::NotDurable);
    assert!(err.is_retryable());
    // Eight concurrent sales on one segment go out as coalesced calls; each caller gets the
    // typed error of its call's WAIT.
    let batch = (0..8).map(|i| {
        let e = batched.clone();
        let d = sale(&format!("b{i}"), &format!("b{i}"));
        tokio::spawn(async move { e.deduct(&d).await })
    });
    for r in futures::future::join_all(batch).await {
        match r.unwrap() {
            Err(Error::NotDurable { .. }) => {}
            other => panic!("coalesced sale with the replica down: {other:?}"),
        }
    }
    // The master made the sales: the audit (reads only) counts them already.
    assert_eq!(lone.audit(&sku).await.unwrap().sold, 2);
    assert_eq!(batched.audit(&sku).await.unwrap().sold, 8);

    replica.boot();
    wait_in_sync(&replica);
    match lone.deduct(&sale("u1", "r1")).await.unwrap() {
        Deduction::Replayed { units, .. } => assert_eq!(units, 1),
        other => panic!("the retry must replay the sale the master made: {other:?}"),
    }
    for i in 0..8 {
        let d = sale(&format!("b{i}"), &format!("b{i}"));
        match batched.deduct(&d).await.unwrap() {
            Deduction::Replayed { units, .. } => assert_eq!(units, 1),
            other => panic!("b{i}: {other:?}"),
        }
    }
    for (e, sold) in [(&lone, 2), (&batched, 8)] {
        let a = e.audit(&sku).await.unwrap();
        assert!(a.ok && a.sold == sold && a.remaining == 100 - sold, "{a:?}");
    }
}

/// Durability mode with Redis's half of it (`min-replicas-to-write 1`): once the master's only
/// replica is gone, the master refuses every script before it runs, so each call answers the
/// typed, retryable [`Error::NoReplicas`] at once — a new sale, a replay (its answer would rest
/// on a master that cannot replicate), a coalesced batch — and nothing was written (`DEBUG
/// DIGEST` unchanged); the status and the audit, which write nothing, still answer. Without the setting the store warns at connect. With the replica
/// back, the refused request id sells once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_below_min_replicas_refuses_every_call_before_it_runs() {
    let (master, mut replica) = master_and_replica();
    let connect = |prefix: &'static str, coalescing: Option<Coalescing>| {
        durable_store(&master, prefix, coalescing, Duration::from_secs(2))
    };
    // Not set up yet: the store says what is missing.
    let store = connect("nr", None).await;
    let warnings = store.durability_warnings().await;
    assert!(
        warnings.len() == 1 && warnings[0].contains("min-replicas-to-write 0"),
        "{warnings:?}"
    );
    master.cli(&["CONFIG", "SET", "min-replicas-to-write", "1"]);
    master.cli(&["CONFIG", "SET", "min-replicas-max-lag", "0"]);
    let warnings = store.durability_warnings().await;
    assert!(
        warnings.len() == 1 && warnings[0].contains("min-replicas-max-lag 0"),
        "a lag of 0 turns the setting off: {warnings:?}"
    );
    master.cli(&["CONFIG", "SET", "min-replicas-max-lag", "1"]);
    assert_eq!(store.durability_warnings().await, Vec::<String>::new());
    let lone = Engine::builder().per_user_limit(1).build(store).unwrap();
    let batched = Engine::builder()
        .per_user_limit(1)
        .build(connect("nr", Some(Coalescing::default().max_batch(8))).await)
        .unwrap();
    let sku = Sku::new("nr").unwrap();
    lone.load(&sku, 40, LoadOptions::new(4).per_user_limit(1))
        .await
        .unwrap();
    let sale = |user: &str, rid: &str| Deduct::new("nr", user, 1, rid).unwrap();
    let first = lone.deduct(&sale("u0", "r0")).await.unwrap();
    assert!(matches!(first, Deduction::Applied { .. }), "{first:?}");

    replica.stop();
    // The master counts a replica good until it was silent for min-replicas-max-lag (1 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !master
        .cli(&["INFO", "replication"])
        .contains("min_slaves_good_slaves:0")
    {
        assert!(Instant::now() < deadline, "the master never noticed");
        std::thread::sleep(Duration::from_millis(50));
    }
    let digest = master.cli(&["DEBUG", "DIGEST"]);
    let t = Instant::now();
    let err = lone.deduct(&sale("u1", "r1")).await.unwrap_err();
    eprintln!(
        "below min-replicas: a sale answered after {:?}: {err}",
        t.elapsed()
    );
    assert!(matches!(err, Error::NoReplicas(_)), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::NoReplicas);
    assert!(err.is_retryable());
    // A replay writes nothing, yet its answer would come from a master that cannot replicate.
    let err = lone.deduct(&sale("u0", "r0")).await.unwrap_err();
    assert!(matches!(err, Error::NoReplicas(_)), "replay: {err:?}");
    let batch = (0..8).map(|i| {
        let e = batched.clone();
        let d = sale(&format!("b{i}"), &format!("b{i}"));
        tokio::spawn(async move { e.deduct(&d).await })
    });
    for r in futures::future::join_all(batch).await {
        match r.unwrap() {
            Err(Error::NoReplicas(_)) => {}
            other => panic!("coalesced sale below min-replicas: {other:?}"),
        }
    }
    // Looking writes nothing (`no-writes` scripts): the status and the audit answer while
    // writes are refused, with the stock as it is.
    let r = lone.remaining(&sku).await.unwrap();
    assert_eq!((r.total, r.in_transit, r.reserved), (39, 0, 0), "{r:?}");
    let a = lone.audit(&sku).await.unwrap();
    assert!(a.ok && a.sold == 1 && a.remaining == 39, "{a:?}");
    assert_eq!(
        master.cli(&["DEBUG", "DIGEST"]),
        digest,
        "a refused call wrote something"
    );

    replica.boot();
    wait_in_sync(&replica);
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        match lone.deduct(&sale("u1", "r1")).await {
            Err(Error::NoReplicas(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            r => break r.unwrap(),
        }
    };
    assert!(matches!(again, Deduction::Applied { .. }), "{again:?}");
    let a = lone.audit(&sku).await.unwrap();
    assert!(a.ok && a.sold == 2 && a.remaining == 38, "{a:?}");
}

/// What one sale through a `kill -9` failover ended with (reported through `Debug`).
#[derive(Debug)]
#[allow(dead_code)]
struct FailoverRun {
    /// Units answered as sold (Applied, or Replayed after a retry) to the buyers.
    acked_units: u64,
    /// Retryable errors the buyers saw (and retried), and how many were shortfalls.
    errors: (u64, u64),
    /// Units sold according to the audit after the failover.
    audit_sold: u64,
    /// Whether the audit's counters add up.
    audit_ok: bool,
    /// Whether each segment's own counters add up.
    segments_ok: bool,
    /// Units in transit after the sweep.
    in_transit: u64,
    /// What the audit found wrong.
    problems: Vec<String>,
    /// Acknowledged sales whose request id no longer replays them (their record is gone; the
    /// replay sells again or answers sold out).
    lost_orders: u64,
    /// Buyers answered in all.
    answered: usize,
}

const STOCK: u64 = 2000;
const BUYERS: usize = 2600;
const CONCURRENCY: usize = 64;
/// Buyers answered before the replica is cut off (then 200 ms more of the sale, and the kill).
const KILL_AT: usize = 300;

/// 2,000 units in 16 segments, 2,600 one-unit buyers, 64 at a time (request coalescing on),
/// each retrying a retryable error with the same request id. Once 300 buyers were answered,
/// the replica of the master holding most keys is frozen and cut off (it falls behind); 200 ms
/// later the master is killed (`kill -9`), its replica, thawed, takes over, and the killed
/// node rejoins as a replica; the sale runs to its end. Then the audit, and every acknowledged
/// request id is sent again: it must replay its sale.
async fn failover_sale(
    cluster: &mut RedisCluster,
    prefix: &'static str,
    wait: bool,
) -> FailoverRun {
    let store = RedisStore::builder(cluster.url())
        .key_prefix(prefix)
        .coalescing(Some(Coalescing::default()))
        .command_timeout(Duration::from_secs(2))
        .wait_replicas(u32::from(wait))
        .wait_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let e = Engine::builder()
        .per_user_limit(0)
        .transfer_lease(Duration::from_millis(300))
        .build(store)
        .unwrap();
    let sku = Sku::new("flash").unwrap();
    e.load(&sku, STOCK, LoadOptions::new(16)).await.unwrap();

    // The master to kill: the one holding most keys (decided before the sale, so that the
    // kill itself is immediate).
    let masters = cluster.master_ports();
    let victim = (0..cluster.nodes.len())
        .filter(|&i| masters.contains(&cluster.nodes[i].port))
        .max_by_key(|&i| cluster.nodes[i].dbsize())
        .unwrap();
    let replica = cluster.replica_of(victim);

    let next = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let shortfalls = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(40);
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (e, next, answered) = (e.clone(), next.clone(), answered.clone());
            let (errors, shortfalls) = (errors.clone(), shortfalls.clone());
            tokio::spawn(async move {
                let mut acked: Vec<(usize, u64)> = Vec::new();
                loop {
                    let i = next.fetch_add(1, Relaxed);
                    if i >= BUYERS {
                        return acked;
                    }
                    let d = Deduct::new("flash", &format!("u{i}"), 1, &format!("{prefix}-{i}"))
                        .unwrap();
                    loop {
                        match e.deduct(&d).await {
                            Ok(
                                Deduction::Applied { units, .. }
                                | Deduction::Replayed { units, .. },
                            ) => {
                                acked.push((i, units));
                                break;
                            }
                            Ok(Deduction::SoldOut | Deduction::Insufficient { .. }) => break,
                            Ok(other) => panic!("{prefix}-{i}: {other:?}"),
                            Err(err) => {
                                assert!(err.is_retryable(), "{prefix}-{i}: {err}");
                                errors.fetch_add(1, Relaxed);
                                if matches!(err, Error::NotDurable { .. }) {
                                    shortfalls.fetch_add(1, Relaxed);
                                }
                                assert!(
                                    Instant::now() < until,
                                    "{prefix}-{i} still failing: {err}"
                                );
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    answered.fetch_add(1, Relaxed);
                }
            })
        })
        .collect();

    while answered.load(Relaxed) < KILL_AT {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The victim's replica falls behind: frozen, and its link cut by the master (what was
    // already sent still reaches it from its socket), it receives no more of the sale's
    // writes. For 200 ms the master goes on selling; then it dies with them, acknowledged or
    // not — unless each call waited for the replica's acknowledgement (then the calls on the
    // victim's slots answer NotDurable and are retried after the failover).
    let frozen = cluster.freeze(replica);
    cluster.nodes[victim].cli(&["CLIENT", "KILL", "TYPE", "replica"]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.nodes[victim].stop();
    frozen.thaw();
    let at_kill = answered.load(Relaxed);
    tokio::task::block_in_place(|| {
        cluster.wait_failed_over(replica);
        cluster.rejoin(victim);
    });
    eprintln!(
        "{prefix}: killed node {victim} after {at_kill} answers; node {replica} took over, \
         node {victim} rejoined as its replica"
    );

    let mut acked = Vec::new();
    for w in workers {
        acked.extend(w.await.unwrap());
    }
    let acked_units: u64 = acked.iter().map(|(_, u)| u).sum();
    // Units a failed call left in transit: the sweeper credits them once the lease ran out.
    tokio::time::sleep(Duration::from_millis(400)).await;
    e.sweep().await.unwrap();
    let audit = e.audit(&sku).await.unwrap();
    let mut lost_orders = 0;
    for (i, u) in &acked {
        let d = Deduct::new("flash", &format!("u{i}"), 1, &format!("{prefix}-{i}")).unwrap();
        match e.deduct(&d).await.unwrap() {
            Deduction::Replayed { units, .. } if units == *u => {}
            other => {
                if lost_orders < 3 {
                    eprintln!("{prefix}-{i}: acknowledged {u} unit(s), now answers {other:?}");
                }
                lost_orders += 1;
            }
        }
    }
    FailoverRun {
        acked_units,
        errors: (errors.load(Relaxed), shortfalls.load(Relaxed)),
        audit_sold: audit.sold,
        audit_ok: audit.ok,
        segments_ok: audit.segments.iter().all(|s| s.ok),
        in_transit: audit.in_transit,
        problems: audit.problems.clone(),
        lost_orders,
        answered: answered.load(Relaxed),
    }
}

/// `kill -9` of a master mid-sale on a 3 + 3 cluster. With durability mode on: every
/// acknowledged sale survives (replays), the audit is ok and counts exactly the acknowledged
/// units, the whole stock is sold and nothing beyond it. Without it: the same sale, and what
/// was lost is reported (asynchronous replication: a killed master can take its last
/// acknowledged writes with it; how many depends on timing, often none).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_sales_survive_a_kill_9_failover_in_durability_mode() {
    let mut cluster = RedisCluster::start(3, 1);

    let on = failover_sale(&mut cluster, "on", true).await;
    eprintln!("durability mode on: {on:?}");
    assert_eq!(on.answered, BUYERS, "{on:?}");
    assert_eq!(on.lost_orders, 0, "acknowledged sales lost: {on:?}");
    assert!(on.audit_ok, "{on:?}");
    assert_eq!(on.in_transit, 0, "{on:?}");
    assert_eq!(on.audit_sold, on.acked_units, "{on:?}");
    assert_eq!(on.acked_units, STOCK, "{on:?}");

    let off = failover_sale(&mut cluster, "off", false).await;
    eprintln!(
        "durability mode off: {off:?}; acknowledged units beyond the stock: {}, acknowledged \
         but not in the audit: {}",
        off.acked_units.saturating_sub(STOCK),
        off.acked_units.saturating_sub(off.audit_sold)
    );
    // Each master is a consistent prefix of itself, so every segment's counters add up even
    // when writes were lost. The SKU's total may not: a transfer between two masters whose
    // donor lost its debit while the home kept the credit counts units twice — what
    // asynchronous replication may lose across masters (durability mode prevents it: the
    // debit is replicated before any credit is sent).
    assert!(
        off.segments_ok,
        "every segment's counters add up even when writes were lost: {off:?}"
    );
    assert!(
        off.audit_ok
            || (off.problems.iter().all(|p| p.starts_with("total:"))
                && off
                    .problems
                    .iter()
                    .any(|p| p.contains("credited by transfers"))),
        "only a transfer split over two masters may break the total: {off:?}"
    );
}

/// A retry the engine answers from the request's record instead of a script (its home
/// segment is known sold out, so it reads the record) waits for the replica too: with the
/// replica still down it answers `NotDurable`, never a `Replayed` that looks durable; once the
/// replica is back, the same retry replays the sale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_read_from_the_record_waits_for_the_replica_too() {
    let (master, mut replica) = master_and_replica();
    let store = store_builder(&master, "rec")
        .pool_size(1)
        .wait_replicas(1)
        .wait_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let e = Engine::builder().per_user_limit(0).build(store).unwrap();
    let sku = Sku::new("last").unwrap();
    e.load(&sku, 2, LoadOptions::new(1)).await.unwrap();
    replica.stop();
    for (u, r) in [("u1", "r1"), ("u2", "r2")] {
        let d = Deduct::new("last", u, 1, r).unwrap();
        let err = e.deduct(&d).await.unwrap_err();
        assert!(matches!(err, Error::NotDurable { .. }), "{r}: {err:?}");
    }
    // A read of the segments (no write, no WAIT) tells the engine the segment is empty.
    assert_eq!(e.remaining(&sku).await.unwrap().total, 0);
    let retry = Deduct::new("last", "u1", 1, "r1").unwrap();
    match e.deduct(&retry).await {
        Err(Error::NotDurable { .. }) => {}
        other => panic!("a replay with the replica down must not look durable: {other:?}"),
    }
    replica.boot();
    wait_in_sync(&replica);
    match e.deduct(&retry).await.unwrap() {
        Deduction::Replayed { units, .. } => assert_eq!(units, 1),
        other => panic!("{other:?}"),
    }
}

/// Durability options that cannot work are refused before connecting: a `WAIT` longer than
/// half the command timeout (it blocks its connection, so everything behind it would time
/// out), and the unsafe baselines (their write-backs are not scripts, nothing waits for them).
#[tokio::test]
async fn durability_options_that_cannot_work_are_refused() {
    let nowhere = "redis://127.0.0.1:1";
    let too_long = RedisStore::builder(nowhere)
        .wait_replicas(1)
        .wait_timeout(Duration::from_secs(3))
        .command_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&too_long, Error::Config(m) if m.contains("wait_timeout_ms")),
        "{too_long:?}"
    );
    let baseline = RedisStore::builder(nowhere)
        .wait_replicas(1)
        .strategy(shardstock::Strategy::Naive)
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&baseline, Error::Config(m) if m.contains("durability")),
        "{baseline:?}"
    );
}
