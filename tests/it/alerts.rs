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
//
// A real Prometheus running the shipped config against live `serve`s, scenario by scenario:
// `alert_scenarios.rs`.
//
// Prometheus and promtool are required: a missing tool fails the test (never skipped).

use common::RedisServer;
use common::process::require;
use shardstock::{Deduct, LoadOptions, Sku};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

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
    for f in ["src/metrics/names.rs"] {
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
    let unloaded = Sku::new("never-loaded").unwrap();

    // Nothing loaded yet: nothing audited; an explicit SKU that is not loaded is skipped.
    let r = engine.audit_round(std::slice::from_ref(&unloaded)).await;
    assert_eq!(
        (r.audited, r.skipped, r.failing, r.errors, r.store_up),
        (0, 1, 0, 0, true),
        "{r:?}"
    );

    // Loaded through this engine: audited from then on without being named.
    engine.load(&sku, 100, LoadOptions::new(4)).await.unwrap();
    let r = engine.audit_round(&[]).await;
    assert_eq!((r.audited, r.failing), (1, 0), "{r:?}");
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

/// With Redis down, a round of the live audit does not wait out a command timeout per SKU: its
/// first read fails, `store_up` is 0 at once and every SKU counts as an error (six SKUs: well
/// under one command timeout, 5 s, where reading each would take 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_with_the_store_down_does_not_wait_for_every_sku() {
    let mut redis = RedisServer::start();
    let engine = common::redis_engine(&redis, shardstock::Engine::builder()).await;
    for i in 0..6 {
        let sku = Sku::new(format!("s{i}")).unwrap();
        engine.load(&sku, 10, LoadOptions::new(2)).await.unwrap();
    }
    let r = engine.audit_round(&[]).await;
    assert_eq!((r.audited, r.store_up), (6, true), "{r:?}");
    redis.stop();
    let t = std::time::Instant::now();
    let r = tokio::time::timeout(std::time::Duration::from_secs(12), engine.audit_round(&[]))
        .await
        .unwrap_or_else(|_| panic!("the round took over 12 s"));
    eprintln!("a round with Redis down: {:?}, {r:?}", t.elapsed());
    assert_eq!((r.store_up, r.errors, r.audited), (false, 6, 0), "{r:?}");
}

/// A load whose loader died between starting and committing it leaves the SKU not ready for
/// good: buyers get `not_ready` (its own error label, counted in the error rate) and the live
/// audit counts the SKU as not ready (ShardstockLoadStuck's signal), round after round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sku_stuck_mid_load_is_reported() {
    let redis = RedisServer::start();
    let engine = common::redis_engine(&redis, shardstock::Engine::builder()).await;
    let sku = Sku::new("stuck").unwrap();
    engine.load(&sku, 10, LoadOptions::new(2)).await.unwrap();
    // What a loader that died after load_begin leaves behind.
    redis.cli(&["HSET", "t:{stuck}:meta", "state", "loading"]);
    let err = engine
        .deduct(&Deduct::new("stuck", "u1", 1, "r1").unwrap())
        .await
        .unwrap_err();
    assert_eq!(shardstock::metrics::error_label(err.kind()), "not_ready");
    for _ in 0..2 {
        let r = engine.audit_round(&[]).await;
        assert_eq!((r.not_ready, r.failing, r.errors), (1, 0, 0), "{r:?}");
    }
}
