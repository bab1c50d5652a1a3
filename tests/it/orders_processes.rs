//! The done-when of the outbox, with real processes: a sale of 10,000 units over 16 segments
//! while three `shardstock orders --postgres` processes consume; one is killed with SIGKILL
//! mid-stream and another restarted. PostgreSQL ends with exactly the applied sales, one row
//! each, matching the audit's `sold`; nothing is left pending. Real redis-server, real
//! PostgreSQL (`tests/it/common/postgres.rs`), the real binary.

use crate::common;

use common::binary::shardstock;
use common::postgres::PostgresServer;
use common::process::Proc;
use common::{RedisServer, redis_config};
use shardstock::orders::postgres::PostgresOrders;
use shardstock::orders::{Orders, OrdersOptions};
use shardstock::{Deduct, Deduction, EngineBuilder, LoadOptions, Sku};
use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn consumer(redis: &RedisServer, pg: &PostgresServer, name: &str, dir: &std::path::Path) -> Proc {
    let mut cmd = shardstock(&[
        "--redis",
        &redis.url(),
        "orders",
        "--postgres",
        &pg.url(),
        "--consumer",
        name,
        "--batch",
        "64",
        "--min-idle-ms",
        "500",
    ]);
    cmd.stdout(Stdio::null());
    Proc::spawn(name, &mut cmd, dir.join(format!("{name}.log")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_consumers_one_killed_one_restarted_write_exactly_the_applied_sales() {
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    let logs = tempfile::tempdir().unwrap();
    let store = redis_config(&redis, "ss").build_store().await.unwrap();
    let engine = EngineBuilder::default()
        .per_user_limit(0)
        .build(store.clone())
        .unwrap();
    let sku = Sku::new("flash").unwrap();
    engine
        .load(&sku, 10_000, LoadOptions::new(16).outbox(true))
        .await
        .unwrap();

    // The schema first, so the test can count rows from the start (each consumer also
    // creates it when missing).
    PostgresOrders::connect(&pg.url())
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
    // c1 starts alone, so while the sale runs every event goes through it and it is caught
    // holding some; c2 and c3 join before it is killed.
    let mut c1 = consumer(&redis, &pg, "c1", logs.path());

    // The sale: 12,000 requests of 1 or 2 units from 32 tasks.
    let applied = Arc::new(Mutex::new(HashMap::new()));
    let sold_requests = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..32u64 {
        let (e, applied, n) = (engine.clone(), applied.clone(), sold_requests.clone());
        tasks.push(tokio::spawn(async move {
            for i in (t..12_000).step_by(32) {
                let qty = 1 + i % 2;
                let rid = format!("r{i}");
                let d = Deduct::new("flash", &format!("u{i}"), qty, &rid).unwrap();
                if let Deduction::Applied { .. } = e.deduct(&d).await.unwrap() {
                    applied.lock().unwrap().insert(rid, qty);
                    n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }));
    }
    // Mid-stream: once orders are arriving, kill c1 (SIGKILL) and restart c2.
    let start = Instant::now();
    while pg_rows(&pg) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no orders arriving"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Freeze c1 (SIGSTOP) until it is caught holding events it has not acknowledged, then
    // kill it (SIGKILL): those events are what the others must claim.
    let pid = c1.child.id().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    let probe = common::admin_client(&redis).await;
    let streams: Vec<String> = redis
        .cli(&["--scan", "--pattern", "*:out"])
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(streams.len(), 16);
    let held = loop {
        signal("-STOP");
        let held = pending_of(&probe, &streams, "c1").await;
        if held > 0 {
            break held;
        }
        signal("-CONT");
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "c1 never held an event"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let mut c2 = consumer(&redis, &pg, "c2", logs.path());
    let _c3 = consumer(&redis, &pg, "c3", logs.path());
    c1.child.kill().unwrap();
    c1.child.wait().unwrap();
    // c2 restarted once it is at work.
    let rows = pg_rows(&pg);
    while pg_rows(&pg) < rows + 200 && start.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = c2.child.kill();
    c2.child.wait().unwrap();
    let _c2 = consumer(&redis, &pg, "c2", logs.path());
    for t in tasks {
        t.await.unwrap();
    }
    let applied = applied.lock().unwrap().clone();
    let audit = engine.audit(&sku).await.unwrap();
    assert!(audit.ok, "{:?}", audit.problems);
    assert_eq!(audit.sold, 10_000);

    // The survivors take over what c1 held (after --min-idle-ms) and finish.
    let start = Instant::now();
    while pg_rows(&pg) < applied.len() as u64 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "PostgreSQL has {} of {} orders",
            pg_rows(&pg),
            applied.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Exactly the applied sales: one row each, their units, nothing else.
    let rows = pg.psql("SELECT request_id || ' ' || units || ' ' || status FROM shardstock_orders");
    let mut seen = HashMap::new();
    for line in rows.lines() {
        let mut w = line.split(' ');
        let (rid, units, status) = (w.next().unwrap(), w.next().unwrap(), w.next().unwrap());
        assert_eq!(status, "sold", "{line}");
        assert!(
            seen.insert(rid.to_string(), units.parse::<u64>().unwrap())
                .is_none()
        );
    }
    assert_eq!(seen, applied, "PostgreSQL rows = the applied sales");
    assert_eq!(seen.values().sum::<u64>(), audit.sold);
    let pgsum = PostgresOrders::connect(&pg.url())
        .await
        .unwrap()
        .summary(None)
        .await
        .unwrap();
    assert_eq!(
        (pgsum.rows, pgsum.sold_units),
        (applied.len() as u64, audit.sold)
    );

    // Nothing pending or undelivered once the survivors are done.
    let watch = Orders::new(
        store,
        PostgresOrders::connect(&pg.url()).await.unwrap(),
        OrdersOptions::new("orders", "watch"),
    )
    .unwrap();
    let start = Instant::now();
    loop {
        watch.discover().await.unwrap();
        let lag = watch.lag().await.unwrap();
        if lag.is_idle() {
            assert_eq!(
                lag.appended,
                applied.len() as u64,
                "one event per applied sale"
            );
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{lag:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "orders: {} rows; c1 killed holding {held} unacknowledged events (claimed by the \
         others), c2 restarted",
        seen.len()
    );
}

fn pg_rows(pg: &PostgresServer) -> u64 {
    pg.psql("SELECT count(*) FROM shardstock_orders")
        .parse()
        .unwrap()
}

/// Events `consumer` holds unacknowledged over every outbox stream (`XPENDING` summaries,
/// one call per stream on one connection: fast enough to catch a consumer mid-batch).
async fn pending_of(client: &fred::prelude::Client, streams: &[String], consumer: &str) -> u64 {
    use fred::interfaces::StreamsInterface;
    use fred::types::Value;
    let mut held = 0;
    for key in streams {
        let v: Value = client.xpending(key.as_str(), "orders", ()).await.unwrap();
        let per_consumer = v.into_array().into_iter().nth(3).map(Value::into_array);
        for pair in per_consumer.unwrap_or_default() {
            let pair = pair.into_array();
            if pair.first().and_then(Value::as_string).as_deref() == Some(consumer) {
                held += pair.get(1).and_then(Value::as_u64).unwrap_or(0);
            }
        }
    }
    held
}

/// `load --outbox`, a `sim` over it, then `orders --jsonl --until-idle`: one JSON line per
/// applied sale on stdout, units adding up to the audit's sold; a second run prints nothing.
#[test]
fn orders_jsonl_prints_one_line_per_sale() {
    use common::binary::run_line;
    let redis = RedisServer::start();
    let url = redis.url();
    run_line(&format!(
        "--redis {url} load --sku jl --stock 300 --segments 4 --per-user-limit 0 --outbox"
    ))
    .expect_code(0);
    let sim = run_line(&format!(
        "--redis {url} sim --sku jl --skip-load --requests 400 --users 400 --concurrency 8 --json"
    ));
    sim.expect_code(0);
    let applied = common::json::u(&sim.json(), "applied");
    let out = run_line(&format!("--redis {url} orders --jsonl --until-idle"));
    out.expect_code(0);
    let lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len() as u64, applied, "{}", out.stderr);
    let mut rids: Vec<&str> = lines
        .iter()
        .map(|v| v["request_id"].as_str().unwrap())
        .collect();
    rids.sort();
    rids.dedup();
    assert_eq!(rids.len() as u64, applied);
    assert!(
        lines
            .iter()
            .all(|v| v["kind"] == "sold" && v["sku"] == "jl")
    );
    assert_eq!(
        lines
            .iter()
            .map(|v| v["units"].as_u64().unwrap())
            .sum::<u64>(),
        300
    );
    let again = run_line(&format!("--redis {url} orders --jsonl --until-idle"));
    again.expect_code(0);
    assert_eq!(
        again.stdout.trim(),
        "",
        "acknowledged events are not printed again"
    );
    // Without Redis there is no outbox: a configuration error.
    run_line("orders --jsonl --until-idle").expect_code(4);
}
