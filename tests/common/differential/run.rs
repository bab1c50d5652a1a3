//! A case run in lockstep on the three worlds: as a property (generated cases, shrunk on
//! failure) or as a fixed op list (a shrunk failure kept as a regression test).

use super::act::{Act, case};
use super::worlds::Worlds;
use super::{AUTO_WAIT_AFTER, SHORTEST_TIMER, TIMER_MARGIN, WAIT};
use crate::common::{RedisAt, RedisServer, env_knob};
use proptest::prelude::*;
use std::time::Instant;

pub enum Verdict {
    Pass,
    Fail(String),
    /// An op may have raced a timer: run the case again.
    Tainted,
}

/// Runs `acts` in lockstep on the three worlds (each op on all three at once, so timers age
/// alike); `compare`: transcripts must be identical.
pub async fn run_edges(ws: &mut Worlds, acts: &[Act], compare: bool) -> Verdict {
    let mut timers_since: Option<Instant> = None;
    let all = acts.iter().chain([&Act::Expire]);
    for (i, act) in all.enumerate() {
        let sleeps = matches!(act, Act::Wait | Act::Expire);
        if !sleeps && timers_since.is_some_and(|t| t.elapsed() >= AUTO_WAIT_AFTER) {
            tokio::time::sleep(WAIT).await;
            ws.after_wait();
            ws.push(["(wait: timers)"; 3]);
            timers_since = None;
        }
        let t0 = Instant::now();
        let (a, b, c) = futures::join!(ws.m.step(act), ws.r.step(act), ws.c.step(act));
        if a.line.is_empty() && b.line.is_empty() && c.line.is_empty() {
            continue;
        }
        if sleeps {
            timers_since = None;
        } else if a.timers || b.timers || c.timers {
            timers_since.get_or_insert(t0);
        }
        if timers_since.is_some_and(|t| t.elapsed() >= SHORTEST_TIMER - TIMER_MARGIN) {
            if compare {
                return Verdict::Tainted;
            }
            // Invariants only: let every timer pass before looking.
            tokio::time::sleep(WAIT).await;
            ws.after_wait();
            timers_since = None;
        }
        ws.push([&a.line, &b.line, &c.line]);
        let strict = matches!(act, Act::Expire);
        let (sa, sb, sc) =
            futures::join!(ws.m.check(strict), ws.r.check(strict), ws.c.check(strict));
        ws.push([&sa, &sb, &sc]);
        if let Some(v) = ws.verdict(i, &format!("{act:?}"), compare) {
            return Verdict::Fail(v);
        }
    }
    // Each world checks right after its own finish: one that waited past its timers there must
    // not make another look late at reservations its finish left live.
    let (wm, wr, wc) = (&mut ws.m, &mut ws.r, &mut ws.c);
    let ((a, sa), (b, sb), (c, sc)) = futures::join!(
        async { (wm.finish().await, wm.check(false).await) },
        async { (wr.finish().await, wr.check(false).await) },
        async { (wc.finish().await, wc.check(false).await) },
    );
    ws.push([&a, &b, &c]);
    ws.push([&sa, &sb, &sc]);
    match ws.verdict(
        acts.len() + 1,
        "finish: resolve dropped calls, probe users",
        compare,
    ) {
        Some(v) => Verdict::Fail(v),
        None => Verdict::Pass,
    }
}

static CASE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// One case on fresh worlds (fresh SKU name), run again (up to 3 times) when it raced a timer.
pub async fn edge_case(
    srv: &impl RedisAt,
    acts: &[Act],
    cancellation: bool,
    ignore: &'static [&'static str],
) -> Verdict {
    for _ in 0..3 {
        let n = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("edge-{}-{n}", std::process::id());
        let mut ws = Worlds::new(srv, &name, cancellation).await;
        ws.ignore = ignore;
        let v = run_edges(&mut ws, acts, !cancellation).await;
        ws.close().await;
        if !matches!(v, Verdict::Tainted) {
            return v;
        }
    }
    Verdict::Tainted
}

pub fn edge_config(default_cases: u32) -> ProptestConfig {
    let cases = env_knob("DIFF_CASES").unwrap_or(default_cases);
    let shrink_secs: u32 = env_knob("DIFF_SHRINK_SECS").unwrap_or(60);
    ProptestConfig {
        cases,
        failure_persistence: None,
        max_shrink_time: shrink_secs * 1000,
        max_shrink_iters: 100_000,
        ..ProptestConfig::default()
    }
}

pub fn edge_property(cancellation: bool, default_cases: u32, len: usize) {
    edge_property_on(&RedisServer::start(), cancellation, default_cases, len);
}

/// [`edge_property`] with the Redis worlds on `srv` (a server or a cluster).
pub fn edge_property_on(srv: &impl RedisAt, cancellation: bool, default_cases: u32, len: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    proptest!(edge_config(default_cases), |(acts in case(cancellation, len))| {
        match rt.block_on(edge_case(srv, &acts, cancellation, &[])) {
            Verdict::Pass => {}
            Verdict::Fail(why) => prop_assert!(false, "{}", why),
            Verdict::Tainted => prop_assume!(false, "raced a timer three times"),
        }
    });
}

/// Runs a fixed op list (a shrunk failure kept as a regression test).
pub fn regression(acts: Vec<Act>, cancellation: bool) {
    regression_past(acts, cancellation, &[]);
}

/// [`regression`], looking past violations tagged `ignore` (to reach a later finding).
pub fn regression_past(acts: Vec<Act>, cancellation: bool, ignore: &'static [&'static str]) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let srv = RedisServer::start();
    match rt.block_on(edge_case(&srv, &acts, cancellation, ignore)) {
        Verdict::Pass => {}
        Verdict::Fail(why) => panic!("{why}"),
        Verdict::Tainted => panic!("raced a timer three times"),
    }
}
