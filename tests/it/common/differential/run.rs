//! A case run in lockstep on three stores — memory (the oracle), Redis, Redis with request
//! coalescing — each step on all three at once (so their timers age alike), then the state of
//! each read back; as a property (generated cases, shrunk on failure) or as a fixed list.
//! Environment: `DIFF_CASES` (cases), `DIFF_SHRINK_SECS` (shrink budget), `DIFF_TAIL` (lines
//! of transcript shown on failure).

use super::op::{Op, case};
use super::world::World;
use super::{ADVANCE, AUTO_ADVANCE_AFTER, MARGIN, SHORT_MS};
use crate::common::{RedisAt, env_knob, store_builder};
use proptest::prelude::*;
use shardstock::{Coalescing, MemoryStore, RedisStore};
use std::time::{Duration, Instant};

pub enum Verdict {
    Pass,
    Fail(String),
    /// A step may have raced a short timer: run the case again.
    Tainted,
}

/// The two Redis stores every case of a property shares (each case has its own SKU name):
/// plain (one script call per step) and coalescing.
pub async fn redis_stores(srv: &impl RedisAt) -> (RedisStore, RedisStore) {
    let plain = store_builder(srv, "d").connect().await.unwrap();
    let coalesced = store_builder(srv, "dc")
        .coalescing(Some(Coalescing::default()))
        .connect()
        .await
        .unwrap();
    (plain, coalesced)
}

fn tail(log: &[String]) -> String {
    let keep = env_knob("DIFF_TAIL").unwrap_or(40);
    log[log.len().saturating_sub(keep)..].join("\n")
}

static CASE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Runs `ops` once on fresh worlds (a fresh memory store, a fresh SKU name on Redis).
pub async fn run_once(r: &RedisStore, c: &RedisStore, ops: &[Op]) -> Verdict {
    let n = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("d{}-{n}", std::process::id());
    let mut m = World::new("memory", MemoryStore::new(), &name);
    let mut wr = World::new("redis", r.clone(), &name);
    let mut wc = World::new("coalesced", c.clone(), &name);
    let mut logs: [Vec<String>; 3] = Default::default();
    let shortest = Duration::from_millis(*SHORT_MS.start());
    let mut short_since: Option<Instant> = None;
    for (i, op) in ops.iter().enumerate() {
        let advance = matches!(op, Op::Advance);
        if !advance && short_since.is_some_and(|t| t.elapsed() >= AUTO_ADVANCE_AFTER) {
            tokio::time::sleep(ADVANCE).await;
            logs.iter_mut()
                .for_each(|l| l.push("(advance: timers)".into()));
            short_since = None;
        }
        let t0 = Instant::now();
        let (a, b, c) = futures::join!(m.step(op), wr.step(op), wc.step(op));
        if a.line.is_empty() && b.line.is_empty() && c.line.is_empty() {
            continue;
        }
        if advance {
            short_since = None;
        } else if a.short || b.short || c.short {
            short_since.get_or_insert(t0);
        }
        let (sa, sb, sc) = futures::join!(
            m.snapshot(!advance),
            wr.snapshot(!advance),
            wc.snapshot(!advance)
        );
        if short_since.is_some_and(|t| t.elapsed() + MARGIN >= shortest) {
            return Verdict::Tainted;
        }
        for (log, (line, state)) in logs
            .iter_mut()
            .zip([(a.line, sa), (b.line, sb), (c.line, sc)])
        {
            log.push(format!("#{i} {line}"));
            log.extend(state);
        }
        for (label, bad, log) in [
            (m.label, &m.bad, &logs[0]),
            (wr.label, &wr.bad, &logs[1]),
            (wc.label, &wc.bad, &logs[2]),
        ] {
            if !bad.is_empty() {
                return Verdict::Fail(format!(
                    "step {i} ({op:?}) on {label}: {}\n--- {label} ---\n{}",
                    bad.join("; "),
                    tail(log)
                ));
            }
        }
        if logs[0] != logs[1] || logs[0] != logs[2] {
            let first = (0..logs[0].len().max(logs[1].len()).max(logs[2].len()))
                .find(|k| {
                    let at = |l: &Vec<String>| l.get(*k).cloned();
                    at(&logs[0]) != at(&logs[1]) || at(&logs[0]) != at(&logs[2])
                })
                .unwrap_or(0);
            return Verdict::Fail(format!(
                "step {i} ({op:?}): the stores differ at line {first}\n--- memory ---\n{}\n--- redis ---\n{}\n--- coalesced ---\n{}",
                tail(&logs[0]),
                tail(&logs[1]),
                tail(&logs[2])
            ));
        }
    }
    Verdict::Pass
}

/// [`run_once`], again (at most 3 times) when a step raced a short timer.
pub async fn run_case(r: &RedisStore, c: &RedisStore, ops: &[Op]) -> Verdict {
    for _ in 0..3 {
        match run_once(r, c, ops).await {
            Verdict::Tainted => continue,
            v => return v,
        }
    }
    Verdict::Tainted
}

pub fn config(default_cases: u32) -> ProptestConfig {
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

/// The property: random cases of up to `len` steps agree on the three stores, the Redis ones
/// on `srv` (a server or a cluster).
pub fn property(srv: &impl RedisAt, default_cases: u32, len: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (r, c) = rt.block_on(redis_stores(srv));
    proptest!(config(default_cases), |(ops in case(len))| {
        match rt.block_on(run_case(&r, &c, &ops)) {
            Verdict::Pass => {}
            Verdict::Fail(why) => prop_assert!(false, "{}", why),
            Verdict::Tainted => prop_assume!(false, "raced a timer three times"),
        }
    });
}

/// Runs a fixed list (a shrunk failure kept as a regression test).
pub fn fixed(srv: &impl RedisAt, ops: Vec<Op>) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (r, c) = redis_stores(srv).await;
        match run_case(&r, &c, &ops).await {
            Verdict::Pass => {}
            Verdict::Fail(why) => panic!("{why}"),
            Verdict::Tainted => panic!("raced a timer three times"),
        }
    });
}
