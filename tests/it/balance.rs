//! Every reader of a segment's balance agrees with [`Engine::audit`] once units have moved
//! between segments: the live audit's figures and its gauges, [`Engine::remaining`], the
//! stock gauges, `shardstock status` (text and JSON) and `shardstock audit` (its text table
//! and JSON). A reservation past its expiry is part of the picture: no reader returns it (they
//! write nothing), each counts it the same way.

use crate::common;

use common::RedisServer;
use common::binary::run;
use shardstock::{Deduct, Engine, LoadOptions, Sku, UserId};
use std::time::Duration;

const SEGMENTS: u32 = 4;

/// `n` users whose home segment (under a per-user limit) is `segment`.
fn users_at(segment: u32, n: usize) -> Vec<String> {
    let any = shardstock::RequestId::new("any").unwrap();
    (0..)
        .map(|i| format!("b{i}"))
        .filter(|u| {
            shardstock::segments::home(&UserId::new(u).unwrap(), &any, SEGMENTS, true) == segment
        })
        .take(n)
        .collect()
}

/// A gauge's value in a Prometheus text exposition.
fn gauge(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Runs `f` on a current-thread runtime with `recorder` as the local recorder: the test's
/// engine records there, and nothing of the other tests does.
fn on_local_recorder<T>(
    recorder: &metrics_exporter_prometheus::PrometheusRecorder,
    f: impl std::future::Future<Output = T>,
) -> T {
    ::metrics::with_local_recorder(recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    })
}

#[test]
fn every_reader_of_the_balance_agrees_with_the_audit_after_transfers() {
    let srv = RedisServer::start();
    let url = srv.url();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let (audit, exposition, remaining) = on_local_recorder(&recorder, async {
        let engine: Engine<_> = common::prefixed_engine(&srv, Engine::builder(), "ss").await;
        let sku = Sku::new("bal").unwrap();
        engine
            .load(&sku, 40, LoadOptions::new(SEGMENTS).per_user_limit(1))
            .await
            .unwrap();
        // 25 buyers homed on segment 0 (10 units): 15 units move there from the others.
        for u in users_at(0, 25) {
            let d = Deduct::new("bal", &u, 1, "r1").unwrap();
            let r = engine.deduct(&d).await.unwrap();
            assert!(
                matches!(r, shardstock::Deduction::Applied { .. }),
                "{u}: {r:?}"
            );
        }
        // One reservation left to expire, not returned (no sweeper, no sale at its home).
        let holder = &users_at(1, 1)[0];
        let d = Deduct::new("bal", holder, 1, "h1").unwrap();
        engine.reserve(&d, Duration::from_millis(50)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(120)).await;

        let audit = engine.audit(&sku).await.unwrap();
        let moved: u64 = audit.segments.iter().map(|s| s.state.moved_in).sum();
        assert!(moved >= 15, "no transfer: {audit:?}");
        assert!(audit.ok, "{audit:?}");
        assert_eq!((audit.sold, audit.reserved, audit.expired), (25, 1, 1));
        for s in &audit.segments {
            assert!(s.state.balance().is_even(), "{s:?}");
        }

        // The live audit: nothing unaccounted, nothing in excess, nothing failing.
        let r = engine.audit_round(&[]).await;
        assert_eq!(
            (r.audited, r.failing, r.unaccounted, r.excess, r.vanished),
            (1, 0, 0, 0, 0),
            "{r:?}"
        );
        assert_eq!(shardstock::live_audit::unaccounted(&audit), (0, 0));
        let remaining = engine.remaining(&sku).await.unwrap();
        (audit, handle.render(), remaining)
    });

    // Engine::remaining: sellable = stock + expired units, per segment; live holds apart.
    let sellable: Vec<u64> = audit.segments.iter().map(|s| s.sellable()).collect();
    assert_eq!(remaining.per_segment, sellable);
    assert_eq!(remaining.total, audit.remaining + audit.expired);
    assert_eq!(
        (remaining.in_transit, remaining.reserved, remaining.expired),
        (audit.in_transit, 0, 1)
    );
    assert_eq!(remaining.total, 40 - 25, "{remaining:?}");

    // The gauges the engine set, against the same figures.
    let g = |s: &str| gauge(&exposition, s);
    assert_eq!(
        g("shardstock_remaining_units{sku=\"bal\"}"),
        Some(remaining.total as f64),
        "{exposition}"
    );
    for (i, units) in sellable.iter().enumerate() {
        let series = format!("shardstock_segment_remaining_units{{sku=\"bal\",segment=\"{i}\"}}");
        assert_eq!(g(&series), Some(*units as f64), "{series}");
    }
    assert_eq!(g("shardstock_in_transit_units{sku=\"bal\"}"), Some(0.0));
    assert_eq!(g("shardstock_reserved_units{sku=\"bal\"}"), Some(0.0));
    assert_eq!(g("shardstock_audit_unaccounted_units"), Some(0.0));
    assert_eq!(g("shardstock_audit_excess_units"), Some(0.0));
    assert_eq!(g("shardstock_audit_failing_skus"), Some(0.0));
    assert_eq!(g("shardstock_audit_ok{sku=\"bal\"}"), Some(1.0));
    assert_eq!(g("shardstock_store_up"), Some(1.0));

    // `shardstock audit --json`: the same audit.
    let r = run(&["audit", "--redis", &url, "--sku", "bal", "--json"]);
    r.expect_code(0);
    let json = r.json();
    assert_eq!(json, serde_json::to_value(&audit).unwrap());

    // `shardstock audit`: each row of the table is the segment's counters, balanced.
    let r = run(&["audit", "--redis", &url, "--sku", "bal"]);
    r.expect_code(0);
    let rows: Vec<Vec<u64>> = r
        .stdout
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split_whitespace().filter(|c| *c != "|").collect();
            let nums: Option<Vec<u64>> = cells.get(..8)?.iter().map(|c| c.parse().ok()).collect();
            nums
        })
        .collect();
    assert_eq!(rows.len(), SEGMENTS as usize, "{}", r.stdout);
    for (row, s) in rows.iter().zip(&audit.segments) {
        let st = &s.state;
        assert_eq!(
            row[..],
            [
                u64::from(s.index),
                st.loaded,
                st.restocked,
                st.moved_in,
                st.stock,
                st.reserved,
                st.sold,
                st.moved_out
            ],
            "{}",
            r.stdout
        );
        assert_eq!(row[1] + row[2] + row[3], row[4] + row[5] + row[6] + row[7]);
    }
    assert!(
        r.stdout.contains("(expired, on their way back: 1)"),
        "{}",
        r.stdout
    );

    // `shardstock status`: the figures of the same read.
    let r = run(&["status", "--redis", &url, "--sku", "bal", "--json"]);
    r.expect_code(0);
    let v = r.json();
    assert_eq!(v["remaining"], remaining.total);
    assert_eq!(v["remaining_per_segment"], serde_json::json!(sellable));
    assert_eq!(
        (&v["in_transit"], &v["reserved"], &v["expired"], &v["sold"]),
        (
            &serde_json::json!(audit.in_transit),
            &serde_json::json!(0),
            &serde_json::json!(1),
            &serde_json::json!(25)
        ),
        "{v}"
    );
    assert_eq!(v["audit_ok"], true);
    let r = run(&["status", "--redis", &url, "--sku", "bal"]);
    r.expect_code(0);
    assert!(
        r.stdout
            .contains("remaining 15 (1 of them from expired reservations, on their way back)")
            && r.stdout.contains("(audit ok)"),
        "{}",
        r.stdout
    );
    // Nothing above wrote: the expired reservation is still there to return.
    let keys = srv.cli(&["KEYS", "ss:{bal#1}:*:resv"]);
    assert_eq!(keys.lines().count(), 1, "{keys}");
}

/// A segment whose `reserved` counter fell below what its expired holds carry (the corruption
/// an operator runs `status` to look into): the audit fails, naming it, and the status still
/// answers (no overflow, no panic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_answers_when_reserved_is_below_its_expired_holds() {
    let redis = RedisServer::start();
    let engine = common::redis_engine(&redis, Engine::builder()).await;
    let sku = Sku::new("under").unwrap();
    engine
        .load(&sku, 10, LoadOptions::new(1).per_user_limit(0))
        .await
        .unwrap();
    let d = Deduct::new("under", "u1", 2, "h1").unwrap();
    engine.reserve(&d, Duration::from_millis(50)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    redis.cli(&["HSET", "t:{under#0}:seg", "reserved", "1"]);
    let audit = engine.audit(&sku).await.unwrap();
    assert!(!audit.ok && audit.expired == 2, "{audit:?}");
    let r = engine.remaining(&sku).await.unwrap();
    assert_eq!((r.total, r.reserved, r.expired), (10, 0, 2), "{r:?}");
}

/// The stock gauges follow the SKU: reloaded with fewer segments, the segments it no longer
/// has read 0 (not their old figures); vanished (Redis back empty), every stock gauge reads 0.
#[test]
fn stock_gauges_follow_a_shrinking_reload_and_a_vanished_sku() {
    let mut srv = RedisServer::start();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    on_local_recorder(&recorder, async {
        let engine: Engine<_> = common::prefixed_engine(&srv, Engine::builder(), "ss").await;
        let sku = Sku::new("shrink").unwrap();
        let seg = |text: &str, i: u32| {
            gauge(
                text,
                &format!("shardstock_segment_remaining_units{{sku=\"shrink\",segment=\"{i}\"}}"),
            )
        };
        engine.load(&sku, 40, LoadOptions::new(4)).await.unwrap();
        engine.audit_round(&[]).await;
        let text = handle.render();
        assert_eq!((seg(&text, 0), seg(&text, 3)), (Some(10.0), Some(10.0)));

        engine
            .load(&sku, 6, LoadOptions::new(2).replace(true))
            .await
            .unwrap();
        engine.audit_round(&[]).await;
        let text = handle.render();
        let all: Vec<Option<f64>> = (0..4).map(|i| seg(&text, i)).collect();
        assert_eq!(all, [Some(3.0), Some(3.0), Some(0.0), Some(0.0)], "{text}");

        srv.restart_empty();
        // Until the engine's connections are back (the first rounds may find no store).
        let mut r = engine.audit_round(&[]).await;
        for _ in 0..50 {
            if r.store_up {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            r = engine.audit_round(&[]).await;
        }
        assert_eq!((r.store_up, r.vanished), (true, 1), "{r:?}");
        let text = handle.render();
        let all: Vec<Option<f64>> = (0..4).map(|i| seg(&text, i)).collect();
        assert_eq!(all, [Some(0.0); 4], "{text}");
        assert_eq!(
            gauge(&text, "shardstock_remaining_units{sku=\"shrink\"}"),
            Some(0.0)
        );
        assert_eq!(gauge(&text, "shardstock_audit_vanished_skus"), Some(1.0));
    });
}
