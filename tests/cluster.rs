//! Redis Cluster: the engine over a local 3-master + 3-replica cluster (`redis-cluster://` URL
//! naming every node as a seed; fred routes each script by its keys' hash tag). Every script
//! keeps its keys in one slot, so a sale, fallbacks, per-user claims (their own slots),
//! reservations and restocks all run as on one node; a script that touched two slots would
//! fail here with CROSSSLOT.

mod common;

use common::cluster::RedisCluster;
use futures::future::join_all;
use shardstock::{
    Coalescing, Deduct, Deduction, Engine, LoadOptions, RedisStore, RequestId, Reserved, Sku,
};
use std::time::Duration;

async fn engine(cluster: &RedisCluster, prefix: &str, coalesce: bool) -> Engine<RedisStore> {
    let store = RedisStore::builder(cluster.url())
        .key_prefix(prefix)
        .coalescing(coalesce.then(Coalescing::default))
        .connect()
        .await
        .unwrap();
    Engine::builder().build(store).unwrap()
}

/// 500 units in 16 segments, 1,000 one-unit buyers (one order per user): exactly the stock is
/// sold, with and without request coalescing; then reservations (confirmed, cancelled,
/// expired) and a restock, and the audit is exact on every segment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sale_on_a_cluster_sells_exactly_the_stock() {
    let cluster = RedisCluster::start(3, 1);
    for (prefix, coalesce) in [("plain", false), ("coal", true)] {
        let e = engine(&cluster, prefix, coalesce).await;
        let sku = Sku::new("flash").unwrap();
        e.load(&sku, 500, LoadOptions::new(16)).await.unwrap();
        let buyers = (0..1000).map(|i| {
            let e = e.clone();
            tokio::spawn(async move {
                let d =
                    Deduct::new("flash", &format!("u{i}"), 1, &format!("{prefix}-r{i}")).unwrap();
                e.deduct(&d).await.unwrap()
            })
        });
        let outcomes: Vec<Deduction> = join_all(buyers)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let sold: u64 = outcomes.iter().map(Deduction::units_applied).sum();
        let sold_out = outcomes
            .iter()
            .filter(|d| matches!(d, Deduction::SoldOut))
            .count();
        assert_eq!(sold, 500, "{prefix}: sold");
        assert_eq!(sold_out, 500, "{prefix}: the rest is sold out");
        let a = e.audit(&sku).await.unwrap();
        assert!(a.ok && a.sold == 500 && a.remaining == 0, "{prefix}: {a:?}");

        // Restock 20, then reservations: one confirmed, one cancelled, one left to expire.
        let r = e
            .restock(
                &sku,
                20,
                &RequestId::new(format!("{prefix}-restock")).unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(r.added, 20);
        let reserve = |user: &str, rid: &str, ttl_ms: u64| {
            let e = e.clone();
            let d = Deduct::new("flash", user, 1, rid).unwrap();
            async move { e.reserve(&d, Duration::from_millis(ttl_ms)).await.unwrap() }
        };
        let held = |r: Reserved| match r {
            Reserved::Held { id, .. } => id,
            other => panic!("{prefix}: not held: {other:?}"),
        };
        let confirmed = held(reserve("v1", &format!("{prefix}-h1"), 60_000).await);
        let cancelled = held(reserve("v2", &format!("{prefix}-h2"), 60_000).await);
        let _expiring = held(reserve("v3", &format!("{prefix}-h3"), 200).await);
        assert!(e.confirm(&confirmed).await.unwrap().done);
        assert!(e.cancel(&cancelled).await.unwrap().done);
        tokio::time::sleep(Duration::from_millis(400)).await;
        e.sweep().await.unwrap();
        let a = e.audit(&sku).await.unwrap();
        assert!(
            a.ok && a.sold == 501 && a.reserved == 0 && a.remaining == 19,
            "{prefix}: {a:?}"
        );
    }
    // The SKU's keys live on more than one master: segments are spread by their hash tags
    // (deterministic for this SKU name and the default slot split of `--cluster create`).
    let masters = cluster.master_ports();
    let with_keys = cluster
        .nodes
        .iter()
        .filter(|n| masters.contains(&n.port) && n.dbsize() > 0)
        .count();
    assert!(
        with_keys >= 2,
        "keys on {with_keys} of {} masters",
        masters.len()
    );
}

/// Sells `n` one-unit orders (request ids `<tag>-<i>`), retrying an order whose outcome is an
/// error with the same request id (always safe) until `deadline`; returns the units sold.
async fn sell(e: &Engine<RedisStore>, tag: &str, n: usize, deadline: Duration) -> u64 {
    let until = tokio::time::Instant::now() + deadline;
    let buyers = (0..n).map(|i| {
        let e = e.clone();
        let d = Deduct::new("flash", &format!("{tag}-u{i}"), 1, &format!("{tag}-{i}")).unwrap();
        tokio::spawn(async move {
            loop {
                match e.deduct(&d).await {
                    Ok(out) => return out.units_applied(),
                    Err(err) if tokio::time::Instant::now() < until => {
                        assert!(err.is_retryable(), "{err}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(err) => panic!("still failing after {deadline:?}: {err}"),
                }
            }
        })
    });
    join_all(buyers).await.into_iter().map(Result::unwrap).sum()
}

/// The only seed node of the URL is a master that fails over to its replica and is then
/// killed: the client rediscovers the cluster from the nodes it learned, and the sale
/// finishes exactly (fred's default would ask only the dead seed, and stall for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_seed_node_does_not_stall_the_sale() {
    let mut cluster = RedisCluster::start(3, 1);
    let store = RedisStore::builder(cluster.url_of(0))
        .command_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let e = Engine::builder().per_user_limit(0).build(store).unwrap();
    let sku = Sku::new("flash").unwrap();
    e.load(&sku, 300, LoadOptions::new(16)).await.unwrap();
    assert_eq!(sell(&e, "before", 100, Duration::from_secs(5)).await, 100);

    cluster.fail_over(0);
    cluster.nodes[0].stop();
    cluster.wait_ready(Duration::from_secs(30));

    assert_eq!(sell(&e, "after", 250, Duration::from_secs(30)).await, 200);
    let a = e.audit(&sku).await.unwrap();
    assert!(a.ok && a.sold == 300 && a.remaining == 0, "{a:?}");
}
