//! The `shardstock` binary end to end, several processes selling one SKU at once: the atomic
//! default, the `lock`, `redlock` and `local-mutex` strategies, and the per-user limit held
//! across processes. Real processes (`CARGO_BIN_EXE_shardstock`), their `--json` output and
//! exit codes; one redis-server per test, so the tests run in parallel.

use crate::common;

use common::RedisServer;
use common::binary::{Run, finish, run, run_line, spawn, words};
use common::cli::{audit, load, outcomes_add_up, sim_report_is_complete};
use common::json::{b, s, u};
use serde_json::Value;

/// (3) Three processes sell one loaded SKU at the same time: together exactly its stock.
#[test]
fn three_concurrent_processes_sell_exactly_the_stock() {
    let srv = RedisServer::start();
    let url = srv.url();
    let generation = load(&srv, "multi", 3000, 16);

    let line = format!(
        "sim --redis {url} --sku multi --skip-load --requests 4000 --users 4000 --concurrency 32 \
         --json"
    );
    let children: Vec<_> = (0..3).map(|_| spawn(&words(&line))).collect();
    let runs: Vec<Run> = children.into_iter().map(finish).collect();

    let mut sold_units = 0;
    let mut applied = 0;
    let mut run_ids = Vec::new();
    for r in &runs {
        r.expect_code(0);
        let v = r.json();
        sim_report_is_complete(&v);
        assert_eq!(s(&v, "store"), "redis");
        assert_eq!(s(&v, "sku"), "multi");
        assert_eq!(
            u(&v, "generation"),
            generation,
            "--skip-load must not reload: {v}"
        );
        assert_eq!(u(&v, "segments"), 16);
        assert_eq!(u(&v, "loaded"), 3000);
        assert_eq!(u(&v, "oversold"), 0, "{v}");
        assert_eq!(u(&v, "errors"), 0, "{v}");
        assert!(b(&v, "audit_ok"), "{v}");
        outcomes_add_up(&v);
        sold_units += u(&v, "sold_units");
        applied += u(&v, "applied");
        run_ids.push(s(&v, "run_id").to_string());
    }
    run_ids.sort();
    run_ids.dedup();
    assert_eq!(run_ids.len(), 3, "each process needs its own request ids");
    assert_eq!(sold_units, 3000, "the three processes together: {runs:#?}");
    assert_eq!(applied, 3000);

    let a = audit(&srv, "multi", 0);
    assert_eq!(u(&a, "generation"), generation);
    assert_eq!(u(&a, "loaded"), 3000);
    assert_eq!(u(&a, "restocked"), 0);
    assert_eq!(u(&a, "sold"), 3000);
    assert_eq!(u(&a, "remaining"), 0);
    assert_eq!(u(&a, "reserved"), 0);
    assert!(b(&a, "ok"), "{a}");
    assert_eq!(a["problems"], serde_json::json!([]));
    assert_eq!(a["segments"].as_array().map(Vec::len), Some(16));
}

/// Three processes running `sim --strategy S --skip-load` on one SKU; returns the reports and
/// the audit.
fn three_processes(
    srv: &RedisServer,
    sku: &str,
    extra: &[&str],
    requests: &str,
) -> (Vec<Value>, Value) {
    let url = srv.url();
    let line = format!(
        "sim --redis {url} --sku {sku} --skip-load --requests {requests} --users {requests} \
         --concurrency 32 --json"
    );
    let children: Vec<_> = (0..3)
        .map(|_| {
            let mut args = words(&line);
            args.extend_from_slice(extra);
            spawn(&args)
        })
        .collect();
    let runs: Vec<Run> = children.into_iter().map(finish).collect();
    let reports = runs
        .iter()
        .map(|r| {
            assert!(matches!(r.status.code(), Some(0 | 1)), "{r:?}");
            r.json()
        })
        .collect();
    let a = run(&["audit", "--redis", &url, "--sku", sku, "--json"]).json();
    (reports, a)
}

/// `lock` across three processes, 1 and 16 segments: exactly the stock, no oversell.
#[test]
fn lock_strategy_across_three_processes_sells_exactly_the_stock() {
    let srv = RedisServer::start();
    for segments in [1u32, 16] {
        let sku = format!("lock3-{segments}");
        let url = srv.url();
        run_line(&format!(
            "load --redis {url} --sku {sku} --stock 600 --segments {segments} --per-user-limit 0"
        ))
        .expect_code(0);
        let (reports, a) = three_processes(&srv, &sku, &["--strategy", "lock"], "400");
        let sold: u64 = reports.iter().map(|v| u(v, "sold_units")).sum();
        for v in &reports {
            assert_eq!(s(v, "strategy"), "lock");
            assert_eq!(u(v, "oversold"), 0, "{v}");
            assert!(v["lock"]["acquired"].as_u64().unwrap() > 0, "{v}");
        }
        assert_eq!(sold, 600, "{segments} segments: {reports:#?}");
        assert!(
            b(&a, "ok") && u(&a, "sold") == 600 && u(&a, "remaining") == 0,
            "{a}"
        );
    }
}

/// `local-mutex` across three processes oversells, as the classic three-instance
/// experiment found; the audit catches it.
///
/// Each process reads the stock, holds its own mutex for its critical section and then
/// decrements, so a read misses the other processes' decrements still pending. One unit and a
/// 1.5 s section make the oversell certain rather than likely: each process's first request
/// reads the stock as it starts, and any two of those reads within 1.5 s both see the one unit
/// and both sell it. (Hundreds of units and a 20 ms section relied on the processes overlapping
/// at the last unit; they fell into step and sold exactly the stock.)
#[test]
fn local_mutex_across_three_processes_oversells() {
    let srv = RedisServer::start();
    let url = srv.url();
    run_line(&format!(
        "load --redis {url} --sku lm3 --stock 1 --segments 1 --per-user-limit 0"
    ))
    .expect_code(0);
    let (reports, a) = three_processes(
        &srv,
        "lm3",
        &["--strategy", "local-mutex", "--critical-pause-ms", "1500"],
        "20",
    );
    let sold: u64 = reports.iter().map(|v| u(v, "sold_units")).sum();
    assert!(reports.iter().all(|v| !b(v, "strategy_safe")));
    assert!(
        sold > 1,
        "three local-mutex processes sold {sold} of 1: expected an oversell ({reports:?})"
    );
    assert!(!b(&a, "ok") && u(&a, "sold") > 1, "{a}");
}

/// `sim --per-user-limit 1`: one unit per user at most, no oversell, audit ok; and across three
/// processes sharing the users, the limit still holds in total.
#[test]
fn per_user_limit_holds_in_one_and_across_three_processes() {
    let srv = RedisServer::start();
    let url = srv.url();
    let r = run_line(&format!(
        "sim --redis {url} --per-user-limit 1 --stock 5000 --users 1000 --requests 20000 --json"
    ));
    r.expect_code(0);
    let v = r.json();
    assert_eq!(u(&v, "max_units_per_user"), 1, "{v}");
    assert_eq!(
        u(&v, "sold_units"),
        1000,
        "every user bought exactly once: {v}"
    );
    assert_eq!(u(&v, "oversold"), 0);
    assert!(b(&v, "audit_ok"));
    outcomes_add_up(&v);

    run_line(&format!(
        "load --redis {url} --sku lim3 --stock 5000 --segments 8 --per-user-limit 1"
    ))
    .expect_code(0);
    let (reports, a) = three_processes(&srv, "lim3", &[], "600");
    let sold: u64 = reports.iter().map(|v| u(v, "sold_units")).sum();
    assert_eq!(
        sold, 600,
        "600 users, one unit each, whichever process served them: {reports:#?}"
    );
    assert!(b(&a, "ok") && u(&a, "sold") == 600, "{a}");
}

/// `redlock` across three processes over three lock nodes: exactly the stock.
#[test]
fn redlock_strategy_across_three_processes_sells_exactly_the_stock() {
    let srv = RedisServer::start();
    let nodes: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_plain(common::redis_server::LOCK_NODE))
        .collect();
    for n in &nodes {
        n.cli(&["SET", shardstock::lock::redlock::QUARANTINE_KEY, "0"]);
    }
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let lock_nodes = urls.join(",");
    let url = srv.url();
    run_line(&format!(
        "load --redis {url} --sku red3 --stock 300 --segments 16 --per-user-limit 0"
    ))
    .expect_code(0);
    let (reports, a) = three_processes(
        &srv,
        "red3",
        &["--strategy", "redlock", "--lock-nodes", &lock_nodes],
        "200",
    );
    let sold: u64 = reports.iter().map(|v| u(v, "sold_units")).sum();
    for v in &reports {
        assert_eq!(s(v, "strategy"), "redlock");
        assert_eq!(u(v, "oversold"), 0, "{v}");
    }
    assert_eq!(sold, 300, "{reports:#?}");
    assert!(b(&a, "ok") && u(&a, "sold") == 300, "{a}");
}
