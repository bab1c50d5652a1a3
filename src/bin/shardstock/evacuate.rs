//! `shardstock evacuate`: a cluster master's slots that hold the store's keys moved to masters
//! that can replicate — once (`--from`), or whenever a master keeps refusing writes (`--watch`).
//! The steps and their safety are the library's (`shardstock::store::redis::evacuate`).

use crate::{Failure, print_json};
use clap::Args;
use shardstock::RedisStore;
use shardstock::store::redis::{EvacuateOptions, Evacuation, RefusalWatch};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Args)]
pub(crate) struct EvacuateArgs {
    /// The master to evacuate now (HOST:PORT as the cluster names it, e.g. 10.0.0.5:6379).
    #[arg(
        long,
        value_name = "HOST:PORT",
        required_unless_present = "watch",
        conflicts_with = "watch"
    )]
    from: Option<String>,
    /// Run until SIGTERM or ctrl-c, evacuating every master that has refused writes (fewer
    /// replicas in sync than its min-replicas-to-write) for --grace-ms. Run one watch per
    /// cluster.
    #[arg(long)]
    watch: bool,
    /// How long a master must have refused before --watch evacuates it (0 ..= 3600000). Long
    /// enough for a replica that is coming back to resync.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 3000,
        conflicts_with = "from"
    )]
    grace_ms: u64,
    /// How often --watch looks at the masters (100 ..= 60000).
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 1000,
        conflicts_with = "from"
    )]
    interval_ms: u64,
    /// How long the source's writes stay paused should this process die mid-way
    /// (1000 ..= 300000).
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pause_ms: u64,
    /// Replicas of a target that must hold the copies before it claims a slot (0 ..= 16).
    /// Default: store.wait_replicas, at least 1.
    #[arg(long, value_name = "N")]
    replicas: Option<u32>,
}

fn print(e: &Evacuation, json: bool) -> Result<(), Failure> {
    if json {
        return print_json(e);
    }
    say!(
        "evacuated {} slot(s) from {} in {} ms",
        e.slots.len(),
        e.from,
        e.took_ms
    );
    for s in &e.slots {
        say!("  slot {:>5} -> {} ({} keys)", s.slot, s.to, s.keys);
    }
    Ok(())
}

pub(crate) async fn run_evacuate(
    store: RedisStore,
    a: EvacuateArgs,
    wait_replicas: u32,
    json: bool,
) -> Result<ExitCode, Failure> {
    let mut opts = EvacuateOptions::new(wait_replicas);
    opts.pause = Duration::from_millis(a.pause_ms);
    // The replicas' WAIT must fit well inside the pause (a claim needs it renewed within half).
    opts.wait_timeout = opts.wait_timeout.min(opts.pause / 4);
    if let Some(r) = a.replicas {
        opts.replicas = r;
    }
    opts.check()?;
    if let Some(from) = a.from {
        let e = store.evacuate(&from, &opts).await?;
        print(&e, json)?;
        return Ok(ExitCode::SUCCESS);
    }
    if a.grace_ms > 3_600_000 {
        return Err(Failure::config("--grace-ms must be 0 ..= 3600000"));
    }
    if !(100..=60_000).contains(&a.interval_ms) {
        return Err(Failure::config("--interval-ms must be 100 ..= 60000"));
    }
    let grace = Duration::from_millis(a.grace_ms);
    let mut watch = RefusalWatch::new();
    let stop = crate::serve::shutdown_signal();
    tokio::pin!(stop);
    loop {
        match store.evacuate_refusing(&mut watch, grace, &opts).await {
            Ok(done) => {
                for e in &done {
                    print(e, json)?;
                }
            }
            // A watch keeps watching: the next look may find a target again.
            Err(e) => eprintln!("evacuate: {e}"),
        }
        tokio::select! {
            _ = &mut stop => return Ok(ExitCode::SUCCESS),
            _ = tokio::time::sleep(Duration::from_millis(a.interval_ms)) => {}
        }
    }
}
