//! Deduction throughput matrix against a real redis-server started here:
//! strategies {lua, lua with request coalescing, lock} × segments {1, 4, 16, 64} × concurrency
//! {1, 16, 64, 256}, plus the embedded store (same segments × concurrency). Single key = 1
//! segment.
//!
//! `cargo bench --bench deduct` runs everything (a few minutes); filter with criterion's
//! argument, e.g. `cargo bench --bench deduct -- 'lua/16_segments'` or `-- memory`.
//!
//! Every iteration is one one-unit deduction with its own request id and user; stock is
//! `MAX_UNITS` and `per_user_limit(0)`, so runs never sell out and never hit a limit. Throughput
//! is reported in deductions per second (`Throughput::Elements(1)` per iteration). A deduction
//! that does not apply (e.g. a lock wait timeout) is counted and reported on stderr.

#[path = "../tests/it/common/mod.rs"]
mod common;

use common::RedisServer;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use shardstock::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SEGMENTS: [u32; 4] = [1, 4, 16, 64];
const CONCURRENCY: [u64; 4] = [1, 16, 64, 256];

/// Request ids and users, unique over the whole bench process.
static SEQ: AtomicU64 = AtomicU64::new(0);
/// Deductions that did not apply one unit.
static MISSED: AtomicU64 = AtomicU64::new(0);

/// Runs `n` one-unit deductions from `tasks` concurrent tasks; returns the wall time.
async fn burst<S: Store>(e: &Engine<S>, sku: &str, n: u64, tasks: u64) -> Duration {
    let base = SEQ.fetch_add(n, Ordering::Relaxed);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles = (0..tasks.min(n.max(1))).map(|_| {
        let (e, next, sku) = (e.clone(), next.clone(), sku.to_string());
        tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let id = format!("b{}", base + i);
                let d = Deduct::new(&sku, &id, 1, &id).unwrap();
                match e.deduct(&d).await {
                    Ok(out) if out.units_applied() == 1 => {}
                    _ => {
                        MISSED.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    });
    for t in futures::future::join_all(handles).await {
        t.unwrap();
    }
    start.elapsed()
}

fn builder() -> EngineBuilder {
    Engine::builder()
        .per_user_limit(0)
        .request_ttl(Duration::from_secs(600))
}

/// The store settings of one bench group: 4 clients, keys under `bench`. Lock options: a hot
/// single segment at 256 tasks queues for long, so the wait is generous (no timeouts) and the
/// lease comfortably above a critical section.
fn config(server: &RedisServer, strategy: Strategy, coalesce: bool) -> Config {
    let mut c = Config::default();
    c.store.redis_url = server.url();
    c.store.pool_size = 4;
    c.store.key_prefix = "bench".into();
    c.store.strategy = strategy;
    c.store.lock_lease_ms = 5_000;
    c.store.lock_wait_ms = 120_000;
    c.store.coalesce = coalesce;
    c
}

fn report_missed(what: &str) {
    let m = MISSED.swap(0, Ordering::Relaxed);
    if m > 0 {
        eprintln!("warning: {what}: {m} deductions did not apply (lock timeouts?)");
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = RedisServer::start();
    let max = shardstock::ids::MAX_UNITS;

    // Embedded store.
    {
        let mut group = c.benchmark_group("memory");
        group
            .throughput(Throughput::Elements(1))
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        for segments in SEGMENTS {
            let engine = builder().build(MemoryStore::new()).unwrap();
            let sku = Sku::new(format!("mem-{segments}")).unwrap();
            rt.block_on(engine.load(&sku, max, LoadOptions::new(segments).replace(true)))
                .unwrap();
            for tasks in CONCURRENCY {
                group.bench_with_input(
                    BenchmarkId::new(format!("{segments}_segments"), tasks),
                    &tasks,
                    |b, &tasks| {
                        b.iter_custom(|n| rt.block_on(burst(&engine, sku.as_str(), n, tasks)))
                    },
                );
            }
        }
        group.finish();
        report_missed("memory");
    }

    // Redis, one group per strategy; `lua_coalesced` is lua with request coalescing on (its
    // default options).
    for (name, strategy, coalesce) in [
        ("lua", Strategy::Lua, false),
        ("lua_coalesced", Strategy::Lua, true),
        ("lock", Strategy::Lock, false),
    ] {
        let mut group = c.benchmark_group(name);
        group
            .throughput(Throughput::Elements(1))
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        let engine = rt.block_on(async {
            let store = config(&server, strategy, coalesce)
                .build_store()
                .await
                .unwrap();
            builder().build(store).unwrap()
        });
        for segments in SEGMENTS {
            let sku = Sku::new(format!("{name}-{segments}")).unwrap();
            rt.block_on(engine.load(&sku, max, LoadOptions::new(segments).replace(true)))
                .unwrap();
            for tasks in CONCURRENCY {
                group.bench_with_input(
                    BenchmarkId::new(format!("{segments}_segments"), tasks),
                    &tasks,
                    |b, &tasks| {
                        b.iter_custom(|n| rt.block_on(burst(&engine, sku.as_str(), n, tasks)))
                    },
                );
            }
        }
        group.finish();
        report_missed(name);
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
