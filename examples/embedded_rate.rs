//! The embedded library path alone: one-unit deductions on the memory store from `TASKS`
//! tokio tasks, each with its own request id and user, unlimited stock, no per-user limit (as
//! the criterion `memory` cells), then the deductions per second and the process CPU per
//! deduction (user + system time from `/proc/self/stat`). No harness between the loop and
//! [`Engine::deduct`]: this is what to run under `perf record` or `valgrind --tool=callgrind`.
//!
//! `cargo run --release --example embedded_rate -- [DEDUCTIONS] [TASKS] [SEGMENTS]`
//! (defaults 2000000, 64, 16).

use shardstock::{Deduct, Engine, LoadOptions, MemoryStore, Sku};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// User + system CPU of this process so far, in seconds (clock ticks of 1/100 s).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses): utime is the 12th, stime 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    (f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)) as f64 / 100.0
}

fn main() {
    let arg = |i: usize, d: u64| {
        std::env::args()
            .nth(i)
            .map_or(d, |a| a.parse().expect("a number"))
    };
    let (n, tasks, segments) = (arg(1, 2_000_000), arg(2, 64), arg(3, 16) as u32);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let engine = Engine::builder()
        .per_user_limit(0)
        .request_ttl(Duration::from_secs(600))
        .build(MemoryStore::new())
        .unwrap();
    let sku = Sku::new("embedded").unwrap();
    rt.block_on(engine.load(
        &sku,
        shardstock::ids::MAX_UNITS,
        LoadOptions::new(segments).replace(true),
    ))
    .unwrap();
    let next = Arc::new(AtomicU64::new(0));
    let missed = Arc::new(AtomicU64::new(0));
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    rt.block_on(async {
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (e, next, missed) = (engine.clone(), next.clone(), missed.clone());
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Relaxed);
                        if i >= n {
                            break;
                        }
                        let id = format!("b{i}");
                        let d = Deduct::new("embedded", &id, 1, &id).unwrap();
                        match e.deduct(&d).await {
                            Ok(out) if out.units_applied() == 1 => {}
                            _ => {
                                missed.fetch_add(1, Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
    });
    let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    let audit = rt.block_on(engine.audit(&sku)).unwrap();
    println!(
        "{n} deductions, {tasks} tasks, {segments} segments: {:.0}/s, {:.3} µs CPU per deduction, missed {}, audit {}",
        n as f64 / wall,
        cpu * 1e6 / n as f64,
        missed.load(Relaxed),
        if audit.ok && audit.sold == n - missed.load(Relaxed) {
            "ok"
        } else {
            "FAILED"
        },
    );
}
