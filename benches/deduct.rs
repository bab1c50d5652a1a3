//! Deduction throughput: embedded store vs Redis (real redis-server started here), single key
//! (1 segment) vs sharded (16 segments), 64 concurrent buyers. `cargo bench --bench deduct`.

#[path = "../tests/common/mod.rs"]
mod common;

use common::RedisServer;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use shardstock::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const TASKS: u64 = 64;

/// Runs `n` one-unit deductions with `TASKS` concurrent tasks on a SKU with plenty of stock.
async fn burst<S: Store>(e: &Engine<S>, sku: &str, n: u64, seq: &Arc<AtomicU64>) -> Duration {
    let start = Instant::now();
    let base = seq.fetch_add(n, Ordering::Relaxed);
    let next = Arc::new(AtomicU64::new(0));
    let tasks = (0..TASKS).map(|_| {
        let (e, next, sku) = (e.clone(), next.clone(), sku.to_string());
        tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let id = format!("b{}", base + i);
                let d = Deduct::new(&sku, &id, 1, &id).unwrap();
                let out = e.deduct(&d).await.unwrap();
                assert_eq!(out.units_applied(), 1, "bench stock ran out: {out:?}");
            }
        })
    });
    for t in futures::future::join_all(tasks).await {
        t.unwrap();
    }
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = RedisServer::start();
    let mut group = c.benchmark_group("deduct_64_tasks");
    group.throughput(Throughput::Elements(1));
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    for segments in [1u32, 16] {
        let memory = Engine::builder().build(MemoryStore::new()).unwrap();
        let redis = rt.block_on(async {
            let store = RedisStore::connect(&server.url(), 4, "bench")
                .await
                .unwrap();
            Engine::builder().build(store).unwrap()
        });
        let sku = Sku::new(format!("bench-{segments}")).unwrap();
        let max = shardstock::ids::MAX_UNITS;
        rt.block_on(memory.load(&sku, max, segments, true)).unwrap();
        rt.block_on(redis.load(&sku, max, segments, true)).unwrap();
        let seq = Arc::new(AtomicU64::new(0));
        group.bench_function(format!("memory/{segments}_segments"), |b| {
            b.iter_custom(|n| rt.block_on(burst(&memory, sku.as_str(), n, &seq)))
        });
        group.bench_function(format!("redis_lua/{segments}_segments"), |b| {
            b.iter_custom(|n| rt.block_on(burst(&redis, sku.as_str(), n, &seq)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
