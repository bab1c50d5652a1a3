//! The library path alone: one-unit deductions from `TASKS` tokio tasks, each with its own
//! request id and user, unlimited stock, the engine's default per-user limit of 1 (a flash
//! sale: every buyer buys once; `--per-user-limit=0` for none, as the criterion `memory` cells),
//! then the deductions per second and the process CPU per deduction (user + system time from
//! `/proc/self/stat`). No harness between the loop and [`Engine::deduct`]: this is what to run
//! under `perf record` or `valgrind --tool=callgrind`.
//!
//! On the memory store by default; given a Redis URL, on Redis with request coalescing (the
//! default strategy), so the client's CPU per deduction compares with
//! `examples/bare_script.rs`, which has no harness either.
//!
//! `cargo run --release --example embedded_rate -- [DEDUCTIONS] [TASKS] [SEGMENTS] [REDIS_URL]
//! [--json] [--per-user-limit=N] [--max-batch=N] [--max-in-flight=N]` (defaults 2000000, 64,
//! 16, none, 1, then [`Coalescing::default`]'s; `--json` prints one object as `shardstock sim
//! --json` names its fields, for `scripts/bench.sh throughput`).

use shardstock::{Coalescing, Deduct, Engine, LoadOptions, MemoryStore, RedisStore, Sku, Store};
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
    let json = std::env::args().any(|a| a == "--json");
    let flag = |name: &str| {
        std::env::args().find_map(|a| {
            a.strip_prefix(name)
                .map(|v| v.parse::<usize>().expect("a number"))
        })
    };
    let limit = flag("--per-user-limit=").map_or(1, |n| n as u64);
    let mut coalescing = Coalescing::default();
    if let Some(n) = flag("--max-batch=") {
        coalescing = coalescing.max_batch(n);
    }
    if let Some(n) = flag("--max-in-flight=") {
        coalescing = coalescing.max_in_flight(n);
    }
    let args: Vec<String> = std::env::args().filter(|a| !a.starts_with("--")).collect();
    let arg = |i: usize, d: u64| args.get(i).map_or(d, |a| a.parse().expect("a number"));
    let (n, tasks, segments) = (arg(1, 2_000_000), arg(2, 64), arg(3, 16) as u32);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let builder = Engine::builder()
        .per_user_limit(limit)
        .request_ttl(Duration::from_secs(600));
    let shape = Shape {
        n,
        tasks,
        segments,
        json,
    };
    match args.get(4) {
        None => run(&rt, builder.build(MemoryStore::new()).unwrap(), shape),
        Some(url) => {
            let store = rt
                .block_on(
                    RedisStore::builder(url)
                        .coalescing(Some(coalescing))
                        .connect(),
                )
                .expect("a Redis store");
            run(&rt, builder.build(store).unwrap(), shape);
        }
    }
}

/// What to run: `n` deductions from `tasks` tasks over `segments` segments.
struct Shape {
    n: u64,
    tasks: u64,
    segments: u32,
    json: bool,
}

fn run<S: Store>(rt: &tokio::runtime::Runtime, engine: Engine<S>, shape: Shape) {
    let Shape {
        n,
        tasks,
        segments,
        json,
    } = shape;
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
    let missed = missed.load(Relaxed);
    let ok = audit.ok && audit.sold == n - missed;
    let store = engine.store();
    if json {
        let co = store.coalescing().map(|c| {
            format!(
                ",\"coalescing\":{{\"calls\":{},\"requests\":{},\"mean_batch\":{:.2}}}",
                c.calls,
                c.requests,
                c.requests as f64 / c.calls.max(1) as f64
            )
        });
        println!(
            "{{\"store\":\"{}\",\"segments\":{segments},\"concurrency\":{tasks},\"requests\":{n},\"sold_units\":{},\"errors\":{missed},\"audit_ok\":{ok},\"elapsed_s\":{wall:.3},\"throughput_per_s\":{:.1}{}}}",
            store.name(),
            n - missed,
            n as f64 / wall,
            co.unwrap_or_default()
        );
    } else {
        println!(
            "{n} deductions, {tasks} tasks, {segments} segments on {}: {:.0}/s, {:.3} µs CPU per deduction, missed {missed}, audit {}",
            store.name(),
            n as f64 / wall,
            cpu * 1e6 / n as f64,
            if ok { "ok" } else { "FAILED" },
        );
    }
}
