//! The peer shardstock is weighed against: the usual bare check-and-DECRBY Lua
//! script on ONE key, called through fred with EVALSHA — no request ids, no fallback, no
//! audit — with the client set up as `shardstock sim --redis` sets up its `RedisStore`
//! (a pool of 4 clients, 5 s command timeout, 3 command attempts, the same reconnect policy).
//!
//! `--tasks` tokio tasks take request numbers from one shared counter until `--requests`
//! calls were made, each calling the script for one unit; the key holds far more stock than
//! that, so every call sells. Prints the throughput (JSON with `--json`).
//! `scripts/bench.sh throughput` runs it next to the engine's rows on the same redis-server.
//!
//! ```text
//! cargo run --release --example bare_script -- --url redis://127.0.0.1:6379 --tasks 64 --requests 300000 --json
//! ```

use fred::prelude::{Builder, ClientLike, Config, KeysInterface, ReconnectPolicy};
use fred::types::scripts::Script;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The script of the seckill articles: check, then DECRBY; -1 when short.
const BARE: &str = "local n = tonumber(redis.call('GET', KEYS[1])); \
if n >= tonumber(ARGV[1]) then return redis.call('DECRBY', KEYS[1], ARGV[1]) end return -1";

struct Args {
    url: String,
    tasks: u64,
    requests: u64,
    key: String,
    json: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        url: "redis://127.0.0.1:6379".into(),
        tasks: 64,
        requests: 300_000,
        key: "bare:{stock}".into(),
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => a.url = value()?,
            "--tasks" => a.tasks = value()?.parse().map_err(|e| format!("--tasks: {e}"))?,
            "--requests" => {
                a.requests = value()?.parse().map_err(|e| format!("--requests: {e}"))?;
            }
            "--key" => a.key = value()?,
            "--json" => a.json = true,
            other => {
                return Err(format!(
                    "unknown argument {other}; use --url URL --tasks N --requests N [--key K] [--json]"
                ));
            }
        }
    }
    if a.tasks == 0 || a.requests == 0 {
        return Err("--tasks and --requests must be at least 1".into());
    }
    Ok(a)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args()?;
    // The RedisStoreBuilder's settings (src/store/redis/builder.rs) with the default pool.
    let pool = Builder::from_config(Config::from_url(&a.url)?)
        .with_connection_config(|c| {
            c.connection_timeout = Duration::from_secs(5);
            c.max_command_attempts = 3;
        })
        .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(5))
        .set_policy(ReconnectPolicy::new_exponential(0, 10, 1000, 2))
        .build_pool(4)?;
    pool.init().await?;
    let script = Script::from_lua(BARE);
    script.load(pool.next()).await?;
    // Stock far beyond the calls: the run never sells out.
    let stock = a.requests.saturating_mul(1000);
    pool.next()
        .set::<(), _, _>(&a.key, stock, None, None, false)
        .await?;

    let next = Arc::new(AtomicU64::new(0));
    let pool = Arc::new(pool);
    let script = Arc::new(script);
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..a.tasks {
        let (next, pool, script, key, requests) = (
            next.clone(),
            pool.clone(),
            script.clone(),
            a.key.clone(),
            a.requests,
        );
        handles.push(tokio::spawn(async move {
            let (mut sold, mut short) = (0u64, 0u64);
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                let left: i64 = script.evalsha(pool.next(), &key, 1).await?;
                if left >= 0 { sold += 1 } else { short += 1 }
            }
            Ok::<_, fred::error::Error>((sold, short))
        }));
    }
    let (mut sold, mut short) = (0u64, 0u64);
    for h in handles {
        let (s, n) = h.await??;
        sold += s;
        short += n;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let left: i64 = pool.next().get(&a.key).await?;
    let consistent = left >= 0 && stock - left as u64 == sold;
    let throughput = a.requests as f64 / elapsed;
    if a.json {
        println!(
            "{{\"tasks\":{},\"requests\":{},\"sold_units\":{sold},\"short\":{short},\"consistent\":{consistent},\"elapsed_s\":{elapsed:.3},\"throughput_per_s\":{throughput:.1}}}",
            a.tasks, a.requests
        );
    } else {
        println!(
            "bare check-and-DECRBY via fred EVALSHA: {} tasks, {} calls, {sold} sold, {short} short, \
             {throughput:.0}/s ({elapsed:.2} s); stock consistent: {consistent}",
            a.tasks, a.requests
        );
    }
    pool.quit().await?;
    Ok(())
}
