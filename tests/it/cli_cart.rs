//! The `shardstock` binary end to end, cart sales: `sim --cart N` on Redis and on the
//! embedded store, its report and its end checks; and a cart sale killed with SIGKILL mid-storm,
//! finished after its deadlines by a fresh `shardstock sweep` and read back by
//! `sim --check-only`. Real processes, one redis-server per test.

use crate::common;

use common::RedisServer;
use common::binary::{finish, run, run_line, spawn};
use common::cli::{audit, outcomes_add_up, sim_report_is_complete};
use common::json::{b, s, u};
use serde_json::Value;
use std::time::{Duration, Instant};

/// Every end check of a cart report passed, and the figures they rest on agree.
fn cart_checks_pass(v: &Value) {
    let c = &v["cart"];
    for k in [
        "items_one_state",
        "audit_ok",
        "nothing_in_transit",
        "nothing_reserved",
        "sold_is_confirmed",
    ] {
        assert!(b(&c["checks"], k), "check {k} failed: {v}");
    }
    assert!(b(c, "ok"), "{v}");
    assert_eq!(u(c, "orders_split"), 0, "{v}");
    assert_eq!(c["problems"], serde_json::json!([]), "{v}");
    assert_eq!(u(&c["records"], "open"), 0, "{v}");
    assert!(b(v, "audit_ok") && u(v, "oversold") == 0, "{v}");
    assert_eq!((u(v, "reserved"), u(v, "in_transit")), (0, 0), "{v}");
    let confirmed = u(&c["records"], "confirmed");
    for sku in c["skus"].as_array().unwrap() {
        assert_eq!(u(sku, "sold"), confirmed * u(v, "qty"), "{v}");
        assert_eq!((u(sku, "reserved"), u(sku, "in_transit")), (0, 0), "{v}");
        assert!(b(sku, "audit_ok"), "{v}");
        assert_eq!(
            u(sku, "sold") + u(sku, "remaining"),
            u(sku, "loaded"),
            "{v}"
        );
    }
}

/// `sim --cart 2` on Redis: 800 buyers for 200 units of each of two SKUs, one unit per user.
/// Orders are held, confirmed, cancelled, left to expire and refused; after the deadline
/// every order's items are in its one state, the books agree, and the report's answers
/// match the records; another process's `audit` sees the same.
#[test]
fn sim_cart_settles_every_order_as_one_on_redis() {
    let srv = RedisServer::start();
    let url = srv.url();
    let r = run_line(&format!(
        "sim --redis {url} --cart 2 --stock 200 --segments 4 --users 600 --requests 800 \
         --concurrency 32 --hold-ms 2000 --confirm-ratio 0.5 --json"
    ));
    r.expect_code(0);
    let v = r.json();
    sim_report_is_complete(&v);
    outcomes_add_up(&v);
    assert_eq!(s(&v, "sku"), "flash-1-1,flash-1-2");
    assert_eq!((u(&v, "requests"), u(&v, "segments")), (800, 4));
    assert_eq!(u(&v, "errors"), 0, "{v}");
    assert!(v["first_error"].is_null(), "{v}");
    let c = &v["cart"];
    assert_eq!((u(c, "items"), u(c, "orders")), (2, 800), "{v}");
    let (held, confirmed, cancelled, expired) = (
        u(c, "held"),
        u(c, "confirmed"),
        u(c, "cancelled"),
        u(c, "expired"),
    );
    assert!(
        confirmed > 0 && cancelled > 0 && expired > 0 && u(c, "refused") > 0,
        "{v}"
    );
    // Every order held ended one way; every order sent was held, refused or ended.
    assert_eq!(u(c, "decision_errors") + u(c, "hold_errors"), 0, "{v}");
    assert_eq!(
        held + u(c, "expired_before_held"),
        confirmed + cancelled + expired,
        "{v}"
    );
    assert_eq!(held + u(c, "refused") + u(c, "ended"), 800, "{v}");
    let by_reason: u64 = c["refused_by_reason"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(by_reason, u(c, "refused"), "{v}");
    // One unit of each SKU per user: the 200 buyers past 600 are the limit's.
    assert!(u(&c["refused_by_reason"], "limit_reached") > 0, "{v}");
    assert_eq!(u(&v, "max_units_per_user"), 1, "{v}");
    // The records say what the calls answered.
    let rec = &c["records"];
    assert_eq!(u(rec, "confirmed"), confirmed, "{v}");
    assert_eq!(u(rec, "cancelled"), cancelled, "{v}");
    assert_eq!(u(rec, "expired"), expired, "{v}");
    assert_eq!(u(rec, "refused"), u(c, "refused"), "{v}");
    assert_eq!(u(rec, "none"), 0, "{v}");
    assert_eq!(c["checks"]["answers_match_records"], Value::Bool(true));
    assert_eq!(u(c, "items_checked"), 1600, "{v}");
    cart_checks_pass(&v);
    assert_eq!(u(&v, "sold"), 2 * confirmed, "{v}");
    assert_eq!(u(&v, "sold_units"), u(&v, "sold"), "{v}");
    assert_eq!(u(&v, "loaded"), 400, "{v}");
    assert!(u(c, "sweeps") >= 1, "{v}");
    assert!(c["orders_per_s"].as_f64().unwrap() > 0.0, "{v}");

    for sku in ["flash-1-1", "flash-1-2"] {
        let a = audit(&srv, sku, 0);
        assert!(b(&a, "ok"), "{a}");
        assert_eq!((u(&a, "sold"), u(&a, "reserved")), (confirmed, 0), "{a}");
    }
    // The unsafe baselines keep no records: refused before anything is loaded.
    run_line(&format!(
        "sim --redis {url} --cart 2 --strategy naive --sku other"
    ))
    .expect_code(4);
    assert!(audit_now(&url, "other-1").is_none());
}

/// `sim --cart 3` on the embedded store, in text: the checks are printed and pass. The flags
/// that make no sense with --cart, or without it, are refused as usage errors.
#[test]
fn sim_cart_prints_its_checks_and_refuses_contradictory_flags() {
    let r = run_line("sim --cart 3 --requests 300 --users 200 --hold-ms 200");
    r.expect_code(0);
    for line in [
        "flash sale of 3-item carts over flash-1-1,flash-1-2,flash-1-3",
        "check: every order's items in one state (900 items read, 0 orders split): ok",
        "check: audit of every SKU: ok",
        "check: nothing reserved: ok",
        "check: units sold of each SKU = confirmed orders × 1: ok",
        "orders: all checks passed",
        "orders/s",
    ] {
        assert!(r.stdout.contains(line), "no `{line}` in:\n{}", r.stdout);
    }
    for bad in [
        "sim --cart 1",
        "sim --cart 33",
        "sim --cart 2 --reserve-ratio 0.5",
        "sim --cart 2 --duration 1",
        "sim --cart 2 --skip-load",
        "sim --cart 2 --check-only",
        "sim --check-only --run-id x",
    ] {
        run_line(bad).expect_code(2);
    }
}

/// `audit --json` of `sku` on `url`, whatever its exit code (`None`: no report, e.g. the SKU
/// is not loaded yet).
fn audit_now(url: &str, sku: &str) -> Option<Value> {
    let r = run(&["audit", "--redis", url, "--sku", sku, "--json"]);
    serde_json::from_str(r.stdout.trim()).ok()
}

/// A cart sale killed with SIGKILL mid-storm leaves orders open, decided but unsettled, and
/// items held. After the deadlines a fresh `shardstock sweep` finishes it: nothing reserved,
/// every audit ok; then `sim --check-only` reads every order of the dead run back: each one's
/// items are in its one state, and units sold = confirmed orders.
#[test]
fn sim_cart_killed_mid_sale_is_finished_by_a_fresh_sweep() {
    const HOLD_MS: u64 = 2500;
    let srv = RedisServer::start();
    let url = srv.url();
    let hold = HOLD_MS.to_string();
    let sale = spawn(&[
        "sim",
        "--redis",
        &url,
        "--cart",
        "2",
        "--stock",
        "300",
        "--segments",
        "4",
        "--users",
        "10000",
        "--requests",
        "10000",
        "--concurrency",
        "8",
        "--hold-ms",
        &hold,
        "--run-id",
        "killed",
        "--json",
    ]);
    let (mut child, what) = sale;
    // Mid-storm: orders confirmed (units sold) and others holding units.
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < until, "the sale never got going");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the sale ended before it could be killed"
        );
        if audit_now(&url, "flash-1-2").is_some_and(|a| u(&a, "sold") > 20 && u(&a, "reserved") > 0)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap(); // SIGKILL
    let killed_at = Instant::now();
    let r = finish((child, what));
    assert_eq!(r.code(), None, "killed by a signal: {r:?}");
    assert!(
        r.stdout.is_empty(),
        "no report from a killed sale: {}",
        r.stdout
    );
    // What the dead process left held.
    let left: u64 = ["flash-1-1", "flash-1-2"]
        .iter()
        .map(|sku| u(&audit_now(&url, sku).unwrap(), "reserved"))
        .sum();
    assert!(left > 0, "the killed sale left nothing held");

    // After every deadline (the last order opened before the kill) and every lease of a
    // transfer the dead process debited without crediting (the engine's default, 5 s), a
    // fresh process sweeps.
    let lease_ms = shardstock::EngineOptions::default()
        .transfer_lease
        .as_millis() as u64;
    std::thread::sleep(
        (killed_at + Duration::from_millis(HOLD_MS.max(lease_ms) + 300))
            .duration_since(Instant::now()),
    );
    let r = run(&["sweep", "--redis", &url, "--json"]);
    r.expect_code(0);
    let sw = r.json();
    let skus = sw["skus"].as_array().unwrap();
    assert_eq!(skus.len(), 2, "{sw}");
    for sku in skus {
        assert!(b(sku, "audit_ok"), "{sw}");
        assert_eq!((u(sku, "reserved"), u(sku, "in_transit")), (0, 0), "{sw}");
    }

    // Every order of the dead run, read back (nothing written).
    let r = run_line(&format!(
        "sim --redis {url} --cart 2 --users 10000 --requests 10000 --run-id killed --check-only \
         --json"
    ));
    r.expect_code(0);
    let v = r.json();
    let c = &v["cart"];
    assert!(b(c, "check_only"), "{v}");
    assert_eq!(u(c, "items_checked"), 20000, "{v}");
    assert!(c["checks"]["answers_match_records"].is_null(), "{v}");
    cart_checks_pass(&v);
    let rec = &c["records"];
    // The storm was cut: some orders never sent; those sent ended every way.
    assert!(u(rec, "none") > 0, "{v}");
    assert!(
        u(rec, "confirmed") > 0 && u(rec, "expired") > 0 && u(rec, "cancelled") > 0,
        "{v}"
    );
    assert_eq!(u(&v, "sold"), 2 * u(rec, "confirmed"), "{v}");
    for sku in ["flash-1-1", "flash-1-2"] {
        let a = audit(&srv, sku, 0);
        assert_eq!(u(&a, "reserved"), 0, "{a}");
    }
}
