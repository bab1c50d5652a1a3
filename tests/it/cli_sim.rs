//! The `shardstock` binary end to end, single-process sales: `sim` on the embedded store and
//! on Redis, with the naive strategy and with reservations. Real processes
//! (`CARGO_BIN_EXE_shardstock`), their `--json` output and exit codes; one redis-server per
//! test, so the tests run in parallel. Multi-process sales are in `cli_processes.rs`, the
//! other subcommands in `cli_admin.rs`.

use crate::common;

use common::RedisServer;
use common::binary::{run, run_line};
use common::cli::{audit, outcomes_add_up, sim_report_is_complete};
use common::json::{b, f, s, u};

/// (1) The README's first command: a sale on the embedded store with default settings.
#[test]
fn sim_on_the_embedded_store_sells_exactly_the_stock() {
    let r = run(&["sim", "--json"]);
    r.expect_code(0);
    let v = r.json();
    sim_report_is_complete(&v);

    assert_eq!(s(&v, "store"), "memory");
    assert_eq!(s(&v, "sku"), "flash-1");
    assert!(u(&v, "generation") > 0);
    assert_eq!(u(&v, "segments"), 10);
    assert_eq!(u(&v, "requests"), 2000);
    assert_eq!(u(&v, "users"), 1000);
    assert_eq!(u(&v, "qty"), 1);
    assert_eq!(u(&v, "concurrency"), 64);

    assert_eq!(u(&v, "applied"), 100);
    assert_eq!(u(&v, "sold_units"), 100);
    assert_eq!(u(&v, "errors"), 0);
    assert_eq!(u(&v, "replayed"), 0);
    assert!(v["first_error"].is_null(), "{v}");
    outcomes_add_up(&v);
    // One unit per user (the engine's default limit): a buyer's second request answers
    // "limit reached" (or sold out, whichever the script sees first).
    assert_eq!(u(&v, "max_units_per_user"), 1, "{v}");
    assert_eq!(
        u(&v, "sold_out") + u(&v, "insufficient") + u(&v, "limit_reached"),
        1900,
        "{v}"
    );

    assert_eq!(u(&v, "remaining"), 0);
    assert_eq!(
        v["remaining_per_segment"],
        serde_json::json!(vec![0u64; 10])
    );
    assert_eq!(u(&v, "loaded"), 100);
    assert_eq!(u(&v, "restocked"), 0);
    assert_eq!(u(&v, "sold"), 100);
    assert_eq!(u(&v, "sold_units"), u(&v, "sold"));
    assert_eq!(u(&v, "oversold"), 0);
    assert!(b(&v, "audit_ok"), "{v}");
    assert_eq!(v["audit_problems"], serde_json::json!([]));

    let (p50, p99, p999, max) = (
        f(&v, "p50_ms"),
        f(&v, "p99_ms"),
        f(&v, "p999_ms"),
        f(&v, "max_ms"),
    );
    assert!(p50 > 0.0, "{v}");
    assert!(p50 <= p99 && p99 <= p999 && p999 <= max, "{v}");
    assert!(f(&v, "elapsed_s") > 0.0, "{v}");
    assert!(f(&v, "throughput_per_s") > 0.0, "{v}");
}

/// (2) The README's Redis sale (scaled down): 20 000 buyers for 5 000 units over 16 segments.
#[test]
fn sim_on_redis_sells_exactly_the_stock() {
    let srv = RedisServer::start();
    let url = srv.url();
    let r = run_line(&format!(
        "sim --redis {url} --stock 5000 --segments 16 --users 20000 --requests 20000 \
         --concurrency 64 --json"
    ));
    r.expect_code(0);
    let v = r.json();
    sim_report_is_complete(&v);

    assert_eq!(s(&v, "store"), "redis");
    assert_eq!(u(&v, "segments"), 16);
    assert_eq!(u(&v, "requests"), 20000);
    assert_eq!(u(&v, "applied"), 5000);
    assert_eq!(u(&v, "sold_units"), 5000);
    assert_eq!(u(&v, "errors"), 0, "{v}");
    outcomes_add_up(&v);
    assert_eq!(u(&v, "remaining"), 0);
    assert_eq!(
        v["remaining_per_segment"],
        serde_json::json!(vec![0u64; 16])
    );
    assert_eq!(u(&v, "loaded"), 5000);
    assert_eq!(u(&v, "sold"), 5000);
    assert_eq!(u(&v, "oversold"), 0);
    assert!(b(&v, "audit_ok"), "{v}");
    assert!(f(&v, "p50_ms") <= f(&v, "p99_ms"), "{v}");

    // The books in Redis agree with the report, seen by another process.
    let a = audit(&srv, "flash-1", 0);
    assert_eq!(u(&a, "loaded"), 5000);
    assert_eq!(u(&a, "sold"), 5000);
    assert_eq!(u(&a, "remaining"), 0);
    assert!(b(&a, "ok"), "{a}");
}

/// `naive` in one process oversells and `sim` says so (exit 1, oversold > 0).
#[test]
fn naive_sim_reports_its_oversell() {
    let srv = RedisServer::start();
    let url = srv.url();
    let r = run_line(&format!(
        "sim --redis {url} --strategy naive --critical-pause-ms 1 --stock 100 --segments 1 \
         --requests 400 --users 400 --json"
    ));
    r.expect_code(1);
    let v = r.json();
    assert_eq!(s(&v, "strategy"), "naive");
    assert!(u(&v, "oversold") > 0 && !b(&v, "audit_ok"), "{v}");
    // The embedded store refuses non-atomic strategies instead of pretending (a configuration
    // error).
    let r = run(&["sim", "--strategy", "lock"]);
    r.expect_code(4);
    assert!(r.stderr.contains("--redis"), "{}", r.stderr);
}

/// Reservations in a sale: some confirmed, some cancelled, some left to expire. The run ends
/// with nothing reserved and every unconfirmed unit back in `remaining`.
#[test]
fn sim_with_reservations_returns_every_unconfirmed_unit() {
    let srv = RedisServer::start();
    let url = srv.url();
    let r = run_line(&format!(
        "sim --redis {url} --stock 3000 --segments 8 --users 4000 --requests 4000 --reserve-ratio \
         0.7 --confirm-ratio 0.4 --ttl-ms 400 --json"
    ));
    r.expect_code(0);
    let v = r.json();
    assert!(
        u(&v, "reservations_expired_units") > 0 && u(&v, "reservations_cancelled_units") > 0,
        "{v}"
    );
    assert_eq!(u(&v, "reserved"), 0, "{v}");
    assert_eq!(u(&v, "remaining") + u(&v, "sold"), 3000, "{v}");
    assert_eq!(u(&v, "sold"), u(&v, "sold_units"), "{v}");
    assert!(b(&v, "audit_ok") && u(&v, "oversold") == 0, "{v}");
}

/// `sim` loads with the engine's default per-user limit (1) unless told otherwise: 10 buyers
/// of 100 units buy 10; with `--per-user-limit 0` they buy all 100.
#[test]
fn sim_sells_one_unit_per_user_by_default() {
    let r = run_line("sim --users 10 --requests 300 --json");
    r.expect_code(0);
    let v = r.json();
    assert_eq!(u(&v, "sold_units"), 10, "{v}");
    assert_eq!(u(&v, "max_units_per_user"), 1, "{v}");
    assert!(u(&v, "limit_reached") > 0, "{v}");
    outcomes_add_up(&v);
    let r = run_line("sim --users 10 --requests 300 --per-user-limit 0 --json");
    r.expect_code(0);
    let v = r.json();
    assert_eq!(u(&v, "sold_units"), 100, "{v}");
    assert!(u(&v, "max_units_per_user") > 1, "{v}");
}

/// Redis killed in the middle of a timed sale: the requests that fail are counted as errors,
/// the audit after the sale cannot run, and the report is printed all the same (figures the
/// audit would have given are null, `unchecked` says why), with exit code 3 (the store
/// failing), in text and in JSON.
#[test]
fn sim_prints_its_report_when_the_store_fails_mid_sale() {
    for json in [true, false] {
        let mut srv = RedisServer::start();
        let url = srv.url();
        let mut args = vec![
            "sim",
            "--redis",
            &url,
            "--stock",
            "100000",
            "--users",
            "100000",
            "--duration",
            "2",
            "--concurrency",
            "8",
            "--per-user-limit",
            "0",
        ];
        if json {
            args.push("--json");
        }
        let child = common::binary::spawn(&args);
        std::thread::sleep(std::time::Duration::from_millis(1200));
        srv.stop();
        let r = common::binary::finish(child);
        r.expect_code(3);
        if json {
            let v = r.json();
            assert!(u(&v, "applied") > 0 && u(&v, "errors") > 0, "{v}");
            assert!(v["audit_ok"].is_null() && v["oversold"].is_null(), "{v}");
            let unchecked = v["unchecked"].as_array().unwrap();
            assert!(
                unchecked.len() == 1 && unchecked[0].as_str().unwrap().contains("audit"),
                "{v}"
            );
        } else {
            for line in [
                "errors",
                "audit: not run",
                "not checked: the audit",
                "oversold: ?",
            ] {
                assert!(r.stdout.contains(line), "no `{line}` in:\n{}", r.stdout);
            }
        }
    }
}
