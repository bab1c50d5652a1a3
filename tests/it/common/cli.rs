//! The subcommands the CLI tests run over and over (`load`, `audit`), with their reports
//! checked, and what every `sim --json` report must hold.

use serde_json::Value;

use super::RedisServer;
use super::binary::{run, run_line};
use super::json::{b, f, s, u};

/// `audit --json` of `sku`, expecting exit code `code`.
pub fn audit(srv: &RedisServer, sku: &str, code: i32) -> Value {
    let url = srv.url();
    let r = run(&["audit", "--redis", &url, "--sku", sku, "--json"]);
    r.expect_code(code);
    r.json()
}

/// `load --json` of a new SKU; returns the reported generation.
pub fn load(srv: &RedisServer, sku: &str, stock: u64, segments: u32) -> u64 {
    let url = srv.url();
    let r = run_line(&format!(
        "load --redis {url} --sku {sku} --stock {stock} --segments {segments} --json"
    ));
    r.expect_code(0);
    let v = r.json();
    assert_eq!(s(&v, "sku"), sku);
    assert_eq!(u(&v, "stock"), stock);
    assert_eq!(u(&v, "segments"), u64::from(segments));
    assert_eq!(s(&v, "store"), "redis");
    u(&v, "generation")
}

/// The per-outcome counters of a `sim` report add up to its request count.
pub fn outcomes_add_up(v: &Value) {
    let total: u64 = [
        "applied",
        "sold_out",
        "insufficient",
        "replayed",
        "limit_reached",
        "user_busy",
        "errors",
    ]
    .iter()
    .map(|k| u(v, k))
    .sum();
    assert_eq!(total, u(v, "requests"), "outcomes do not add up: {v}");
}

/// Every field README and `sim.rs` promise is in the report, with the right JSON type.
pub fn sim_report_is_complete(v: &Value) {
    for k in [
        "generation",
        "segments",
        "requests",
        "users",
        "qty",
        "concurrency",
        "applied",
        "sold_units",
        "sold_out",
        "insufficient",
        "replayed",
        "errors",
        "remaining",
        "loaded",
        "restocked",
        "sold",
        "oversold",
    ] {
        u(v, k);
    }
    for k in [
        "elapsed_s",
        "throughput_per_s",
        "p50_ms",
        "p99_ms",
        "p999_ms",
        "max_ms",
    ] {
        f(v, k);
    }
    for k in ["sku", "store", "run_id"] {
        s(v, k);
    }
    b(v, "audit_ok");
    assert!(v["remaining_per_segment"].is_array(), "{v}");
    assert!(v["audit_problems"].is_array(), "{v}");
    assert!(
        v.get("first_error")
            .is_some_and(|e| e.is_null() || e.is_string()),
        "first_error missing or mistyped: {v}"
    );
}
