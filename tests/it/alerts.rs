use crate::common;

// The alarms: the live audit, config/alerts.yml and docs/runbook.md.
//
// - `promtool_checks_and_unit_tests_the_alert_rules`: `promtool check rules` and `promtool test
//   rules config/alerts.test.yml` (each alert fires on a synthetic broken series and stays
//   quiet on a healthy one next to it).
// - `every_alert_has_a_runbook_section_and_known_metrics`: static: each alert links its own
//   section of docs/runbook.md, and every metric a rule reads is one src/ defines.
// - `live_audit_counts_units_changed_behind_the_engines_back`: the library's live audit on a
//   real redis-server: a unit removed from a segment (HINCRBY stock -1) is unaccounted, one
//   added is excess too; a SKU that is not loaded is skipped, not failing.
// - `audit_alert_fires_against_a_live_serve`: Debian's Prometheus loaded with config/alerts.yml
//   (1 s scrape and evaluation) scraping a live `shardstock serve --audit-every-ms 200` on a real
//   redis-server; while the counters add up no alert is pending or firing; a unit removed behind
//   the engine's back makes ShardstockAuditFailed (with the SKU) and ShardstockUnitsUnaccounted
//   fire, as Prometheus's /api/v1/alerts reports them, and ShardstockOversold stays quiet.
//
// Prometheus and promtool are required: a missing tool fails the test (never skipped).

use common::RedisServer;
use common::http_client::{agent, get};
use common::process::require;
use common::prometheus::Prometheus;
use common::serve_process::ServeProcess;
use serde_json::{Value, json};
use shardstock::{Deduct, LoadOptions, Sku};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn alerts_yml() -> String {
    std::fs::read_to_string(root().join("config/alerts.yml")).unwrap()
}

/// Every `- alert: NAME` of config/alerts.yml.
fn alert_names() -> Vec<String> {
    alerts_yml()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|n| n.trim().to_string())
        .collect()
}

#[test]
fn promtool_checks_and_unit_tests_the_alert_rules() {
    require("promtool");
    for args in [
        &["check", "rules", "alerts.yml"][..],
        &["test", "rules", "alerts.test.yml"][..],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(root().join("config"))
            .output()
            .expect("promtool");
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every alert is exercised by the unit tests.
    let tests = std::fs::read_to_string(root().join("config/alerts.test.yml")).unwrap();
    let untested: Vec<String> = alert_names()
        .into_iter()
        .filter(|a| !tests.contains(&format!("alertname: {a}\n")))
        .collect();
    assert!(
        untested.is_empty(),
        "alerts without a unit test: {untested:?}"
    );
}

#[test]
fn every_alert_has_a_runbook_section_and_known_metrics() {
    let yml = alerts_yml();
    let runbook = std::fs::read_to_string(root().join("docs/runbook.md")).unwrap();
    let names = alert_names();
    assert!(names.len() >= 10, "{names:?}");
    for a in &names {
        assert!(
            runbook.contains(&format!("\n## {a}\n")),
            "docs/runbook.md has no `## {a}` section"
        );
        assert!(
            yml.contains(&format!(
                "runbook_url: \"docs/runbook.md#{}\"",
                a.to_lowercase()
            )),
            "{a} does not link its runbook section"
        );
    }
    // Metric names in the rules: the `pub const` names of src/ (a histogram's _bucket too).
    let mut defined = BTreeSet::new();
    for f in ["src/metrics.rs", "src/lock.rs"] {
        let text = std::fs::read_to_string(root().join(f)).unwrap();
        for l in text.lines() {
            if l.trim().starts_with("pub const ")
                && let Some(q) = l.split('"').nth(1)
            {
                defined.insert(q.to_string());
            }
        }
    }
    let mut unknown = Vec::new();
    for token in yml.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if token.starts_with("shardstock_")
            && !defined.contains(token)
            && !token
                .strip_suffix("_bucket")
                .is_some_and(|b| defined.contains(b))
        {
            unknown.push(token.to_string());
        }
    }
    assert!(
        unknown.is_empty(),
        "config/alerts.yml reads metrics src/ does not define: {unknown:?}"
    );
}

/// The segment hashes in `redis` (`<prefix>:{<tag>}:seg`), sorted.
fn segment_keys(redis: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = redis
        .cli(&["KEYS", "*:seg"])
        .lines()
        .map(str::to_string)
        .filter(|k| !k.is_empty())
        .collect();
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_audit_counts_units_changed_behind_the_engines_back() {
    let redis = RedisServer::start();
    let engine = common::redis_engine(&redis, shardstock::Engine::builder()).await;
    let sku = Sku::new("watch").unwrap();
    engine.load(&sku, 100, LoadOptions::new(4)).await.unwrap();
    let unloaded = Sku::new("never-loaded").unwrap();

    // Nothing used yet: nothing audited; an explicit SKU that is not loaded is skipped.
    let r = engine.audit_round(std::slice::from_ref(&unloaded)).await;
    assert_eq!(
        (r.audited, r.skipped, r.failing, r.errors),
        (0, 1, 0, 0),
        "{r:?}"
    );

    // One sale: the SKU is used, so audited without being named.
    let d = Deduct::new("watch", "u1", 1, "r1").unwrap();
    engine.deduct(&d).await.unwrap();
    let r = engine.audit_round(&[]).await;
    assert_eq!(
        (r.audited, r.failing, r.unaccounted, r.excess, r.errors),
        (1, 0, 0, 0, 0),
        "{r:?}"
    );

    let keys = segment_keys(&redis);
    assert_eq!(keys.len(), 4, "{keys:?}");
    redis.cli(&["HINCRBY", &keys[0], "stock", "-1"]);
    let r = engine.audit_round(&[]).await;
    assert_eq!(
        (r.audited, r.failing, r.unaccounted, r.excess),
        (1, 1, 1, 0),
        "{r:?}"
    );

    // Two units made up in another segment: 3 unaccounted (per segment, no netting), 2 excess.
    redis.cli(&["HINCRBY", &keys[1], "stock", "2"]);
    let r = engine.audit_round(std::slice::from_ref(&sku)).await;
    assert_eq!(
        (r.audited, r.failing, r.unaccounted, r.excess),
        (1, 1, 3, 2),
        "{r:?}"
    );
    let audit = engine.audit(&sku).await.unwrap();
    assert_eq!(shardstock::live_audit::unaccounted(&audit), (3, 2));
    assert!(!audit.ok);
}

/// `METHOD url` with a JSON body: the status and the JSON reply.
fn send(a: &ureq::Agent, method: &str, url: &str, body: Value) -> (u16, Value) {
    let req = match method {
        "PUT" => a.put(url),
        _ => a.post(url),
    };
    let mut r = req
        .header("content-type", "application/json")
        .send(body.to_string())
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let text = r.body_mut().read_to_string().unwrap();
    (
        r.status().as_u16(),
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// Prometheus's alerts (`/api/v1/alerts`): `(alertname, state, labels)`.
fn alerts(prom: &Prometheus, a: &ureq::Agent) -> Vec<(String, String, Value)> {
    let (status, body) = get(a, &format!("{}/api/v1/alerts", prom.base), &[]).unwrap();
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["data"]["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|x| {
            (
                x["labels"]["alertname"].as_str().unwrap_or("").to_string(),
                x["state"].as_str().unwrap_or("").to_string(),
                x["labels"].clone(),
            )
        })
        .collect()
}

/// Polls `what` every 250 ms until it returns `Some`, for at most `limit`.
fn wait_for<T>(limit: Duration, mut what: impl FnMut() -> Option<T>) -> Option<T> {
    let until = Instant::now() + limit;
    loop {
        if let Some(t) = what() {
            return Some(t);
        }
        if Instant::now() > until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn audit_alert_fires_against_a_live_serve() {
    require("prometheus");
    let t0 = Instant::now();
    let redis = RedisServer::start();
    let serve = ServeProcess::start(
        &redis.url(),
        &["--audit-every-ms", "200"],
        &[("RUST_LOG", "shardstock=info")],
    );
    let a = agent();
    let base = serve.base.clone();

    let (s, b) = send(
        &a,
        "PUT",
        &format!("{base}/skus/phone"),
        json!({"stock": 50, "segments": 2}),
    );
    assert_eq!(s, 201, "{b}");
    let (s, b) = send(
        &a,
        "POST",
        &format!("{base}/skus/phone/deduct"),
        json!({"user": "u1", "qty": 1, "request_id": "r1"}),
    );
    assert_eq!(s, 200, "{b}");

    let rules = root().join("config/alerts.yml");
    let prom = Prometheus::start(&format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - \"{}\"\n\
         scrape_configs:\n  - job_name: shardstock\n    static_configs:\n      - targets: [\"{}\"]\n",
        rules.display(),
        serve.addr()
    ));

    // Healthy: the audit of the SKU is scraped as passing, and no alert is pending or firing.
    let healthy = wait_for(Duration::from_secs(15), || {
        let r = prom
            .query(&a, "shardstock_audit_ok{sku=\"phone\"} == 1")
            .ok()?;
        let failing = prom.query(&a, "shardstock_audit_failing_skus == 0").ok()?;
        (!r.is_empty() && !failing.is_empty()).then_some(())
    });
    assert!(
        healthy.is_some(),
        "Prometheus never saw a passing audit of `phone` from {}",
        serve.addr()
    );
    // Two more evaluations on healthy data.
    std::thread::sleep(Duration::from_secs(2));
    let quiet = alerts(&prom, &a);
    assert!(quiet.is_empty(), "alerts on a healthy run: {quiet:?}");
    let healthy_at = t0.elapsed();

    // A unit removed behind the engine's back.
    let keys = segment_keys(&redis);
    assert_eq!(keys.len(), 2, "{keys:?}");
    redis.cli(&["HINCRBY", &keys[0], "stock", "-1"]);
    let broken = Instant::now();

    let firing = wait_for(Duration::from_secs(30), || {
        let all = alerts(&prom, &a);
        let fired = |name: &str, sku: bool| {
            all.iter()
                .any(|(n, s, l)| n == name && s == "firing" && (!sku || l["sku"] == "phone"))
        };
        (fired("ShardstockAuditFailed", true) && fired("ShardstockUnitsUnaccounted", false))
            .then_some(all)
    });
    let Some(all) = firing else {
        panic!(
            "ShardstockAuditFailed / ShardstockUnitsUnaccounted not firing 30 s after a unit \
             was removed; alerts: {:?}",
            alerts(&prom, &a)
        );
    };
    let names: BTreeSet<&str> = all.iter().map(|(n, _, _)| n.as_str()).collect();
    assert!(
        !names.contains("ShardstockOversold"),
        "a missing unit is no oversell: {all:?}"
    );
    eprintln!(
        "healthy and quiet after {:.1}s; firing {:.1}s after the unit was removed; alerts: {names:?}",
        healthy_at.as_secs_f64(),
        broken.elapsed().as_secs_f64()
    );
}
