//! `shardstock`: command-line front end of the sharded inventory engine.
//!
//! Commands: `load`, `restock`, `status`, `audit` (`admin.rs`), `sim` (a flash-sale load
//! generator, `sim.rs`) and `serve` (the HTTP API of [`shardstock::http`], `serve.rs`); the
//! Prometheus recorder they share is set up in `exporter.rs`. This file reads the command line
//! and the configuration, builds the store and the engine, and dispatches. The store is Redis
//! when a URL is given (`--redis`, `store.redis_url` in the config file, or
//! `SHARDSTOCK_STORE__REDIS_URL`), else the embedded in-memory store, which lives only as long
//! as the process.
//!
//! Exit codes: 0 success; 1 error (message on stderr); 2 `audit` found a conservation problem
//! (also clap's code for a usage error); 3 `sim` saw overselling or a failed audit.

mod admin;
mod exporter;
mod orders;
mod serve;
mod sim;

use clap::{Parser, Subcommand};
use serde::Serialize;
use shardstock::{Config, Engine, EngineBuilder, ErrorKind, MemoryStore, Store};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Sharded flash-sale inventory: load stock, restock, audit, simulate a sale, serve an HTTP API.
///
/// Stock lives in Redis when a URL is configured (--redis, store.redis_url in the config file,
/// or the SHARDSTOCK_STORE__REDIS_URL environment variable); otherwise in an embedded
/// in-memory store that is discarded when the process exits.
///
/// Configuration precedence: built-in defaults < --config FILE < SHARDSTOCK_<SECTION>__<KEY>
/// environment variables < --redis. Log level: RUST_LOG (default "warn"), logs go to stderr.
///
/// Exit codes: 0 ok; 1 error; 2 audit found a problem (or invalid command line); 3 the
/// simulation oversold or its audit failed.
#[derive(Debug, Parser)]
#[command(name = "shardstock", version, propagate_version = true)]
struct Cli {
    /// TOML configuration file (sections [store] and [engine]; see config/shardstock.toml).
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        help_heading = "Global options"
    )]
    config: Option<PathBuf>,

    /// Redis URL, e.g. redis://127.0.0.1:6379/0. Overrides store.redis_url from the config
    /// file and SHARDSTOCK_STORE__REDIS_URL. Without any URL the embedded in-memory store is
    /// used.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        help_heading = "Global options"
    )]
    redis: Option<String>,

    /// Deduction strategy (Redis only): lua (default), lock, redlock (exactly-once), or the UNSAFE
    /// baselines naive, local-mutex, decr-compensate. Overrides store.strategy.
    #[arg(long, global = true, value_name = "NAME")]
    strategy: Option<shardstock::Strategy>,

    /// Independent Redis nodes for --strategy redlock, comma-separated (3 or 5).
    #[arg(long, global = true, value_name = "URL,URL,URL", value_delimiter = ',')]
    lock_nodes: Vec<String>,

    /// Lock lease in milliseconds for lock/redlock (renewed every lease/3 while held).
    #[arg(long, global = true, value_name = "MS")]
    lease_ms: Option<u64>,

    /// Request coalescing for --strategy lua: concurrent deductions bound for one segment go to
    /// Redis as one script call (on|off). Overrides store.coalesce.
    #[arg(long, global = true, value_name = "on|off", value_parser = parse_on_off)]
    coalesce: Option<bool>,

    /// Most requests in one coalesced script call. Overrides store.coalesce_max_batch.
    #[arg(long, global = true, value_name = "N")]
    coalesce_max_batch: Option<usize>,

    /// Microseconds a segment's queue may wait for more requests before sending (0 = send at
    /// once). Overrides store.coalesce_window_us.
    #[arg(long, global = true, value_name = "US")]
    coalesce_window_us: Option<u64>,

    /// Coalesced calls one segment may have in flight. Overrides store.coalesce_max_in_flight.
    #[arg(long, global = true, value_name = "N")]
    coalesce_in_flight: Option<usize>,

    /// Pause this many milliseconds inside every critical section (lock strategies: between
    /// the read and the fenced write; naive baselines: between read and write-back), like the
    /// slow downstream call in the seed articles. A demonstration knob; default 0.
    #[arg(long, global = true, value_name = "MS", default_value_t = 0)]
    critical_pause_ms: u64,

    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9898; any path answers,
    /// conventionally /metrics) while `sim`, `serve` or `orders` runs. Pair with `sim --duration` to
    /// watch a sale; `serve` also answers GET /metrics on its own address.
    #[arg(
        long,
        global = true,
        value_name = "ADDR",
        env = "SHARDSTOCK_METRICS_ADDR",
        help_heading = "Global options"
    )]
    metrics_addr: Option<std::net::SocketAddr>,

    /// Print machine-readable JSON on stdout instead of text.
    #[arg(long, global = true, help_heading = "Global options")]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load a SKU with stock split evenly over segments.
    ///
    /// Refuses a SKU that is already loaded unless --replace is given.
    Load(admin::LoadArgs),
    /// Add units to a loaded SKU, spread evenly over its segments.
    ///
    /// Idempotent per request id: re-running with the same --request-id adds nothing.
    Restock(admin::RestockArgs),
    /// Check a SKU's books: loaded + restocked = remaining + reserved + sold.
    ///
    /// Prints totals and one row per segment. Exits with code 2 when a check fails.
    Audit(admin::AuditArgs),
    /// Show a SKU's stock: remaining in total and per segment, reserved and sold.
    Status(admin::AuditArgs),
    /// Simulate a flash sale: many concurrent buyers against one SKU.
    ///
    /// Loads the SKU afresh (unless --skip-load), fires --requests buy requests (or sells for
    /// --duration seconds, restocking as it goes) from --concurrency workers, then reports outcomes, latency percentiles, remaining stock and
    /// an audit. Several processes may run with --skip-load against the same Redis SKU; each
    /// uses its own request ids. Exits with code 3 when units were oversold or the audit
    /// failed.
    Sim(sim::SimArgs),
    /// Serve the engine over HTTP/JSON until SIGTERM or ctrl-c.
    ///
    /// Routes: PUT /skus/{sku} (load), POST /skus/{sku}/restock, POST /skus/{sku}/deduct,
    /// GET /skus/{sku} (status), GET /skus/{sku}/audit, POST /skus/{sku}/reservations,
    /// POST /reservations/{id}/confirm, POST /reservations/{id}/cancel, GET /healthz and
    /// GET /metrics (also on --metrics-addr when given). Requests may carry their request id
    /// in an Idempotency-Key header. In-flight requests finish before the process exits.
    Serve(serve::ServeArgs),
    /// Consume the outbox: hand every sale, reservation, confirmation, cancellation and
    /// expiry of SKUs loaded with --outbox to PostgreSQL (--postgres URL) or stdout (--jsonl).
    ///
    /// Runs until SIGTERM or ctrl-c (or, with --until-idle, until nothing is pending). Many
    /// processes may run with one --group: each event goes to one of them; events of a
    /// process that died are claimed by the others after --min-idle-ms. Redis only.
    Orders(orders::OrdersArgs),
}

/// A failure to report: the message goes to stderr, the process exits with code 1.
#[derive(Debug)]
pub(crate) struct Failure(String);

impl Failure {
    pub(crate) fn new(msg: impl Into<String>) -> Self {
        Self(msg.into())
    }
}

impl From<shardstock::Error> for Failure {
    fn from(e: shardstock::Error) -> Self {
        let hint = match e.kind() {
            ErrorKind::AlreadyLoaded => {
                " (the old stock, counters and request records then stop counting)"
            }
            ErrorKind::NotLoaded => {
                "; load it first with `shardstock load --sku ... --stock ... --segments ...`"
            }
            _ => "",
        };
        Self(format!("{e}{hint}"))
    }
}

/// The process's own identity for ids: process id and the current time in nanoseconds.
pub(crate) fn unique_stem() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{}-{}", std::process::id(), nanos)
}

/// Shows a Redis URL without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s + 3 => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

fn init_logging() {
    let default = Targets::new().with_default(LevelFilter::WARN);
    let filter = match std::env::var("RUST_LOG") {
        Ok(s) if !s.trim().is_empty() => s.parse::<Targets>().unwrap_or_else(|e| {
            eprintln!("warning: ignoring RUST_LOG={s:?}: {e}");
            default
        }),
        _ => default,
    };
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .with(filter)
        .init();
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match run(cli).await {
        Ok(code) => code,
        Err(Failure(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
    }
}

async fn run(mut cli: Cli) -> Result<ExitCode, Failure> {
    let mut config = Config::load(cli.config.as_deref())?;
    if let Command::Serve(a) = &mut cli.command {
        a.config = config.serve.clone();
    }
    if let Some(url) = cli.redis {
        config.store.redis_url = url;
    }
    if let Some(s) = cli.strategy {
        config.store.strategy = s;
    }
    if !cli.lock_nodes.is_empty() {
        config.store.lock_nodes = cli.lock_nodes.clone();
    }
    if let Some(ms) = cli.lease_ms {
        config.store.lock_lease_ms = ms;
    }
    if let Some(on) = cli.coalesce {
        config.store.coalesce = on;
    }
    if let Some(n) = cli.coalesce_max_batch {
        config.store.coalesce_max_batch = n;
    }
    if let Some(us) = cli.coalesce_window_us {
        config.store.coalesce_window_us = us;
    }
    if let Some(n) = cli.coalesce_in_flight {
        config.store.coalesce_max_in_flight = n;
    }
    config.validate()?;
    // Only commands that run for a while serve metrics (`sim` here; `serve` below).
    if let (Some(addr), Command::Sim(_) | Command::Orders(_)) = (cli.metrics_addr, &cli.command) {
        exporter::install(addr, config.store.strategy)?;
    }
    if let Command::Serve(_) = &cli.command {
        serve::install_metrics(cli.metrics_addr, config.store.strategy).await?;
    }
    let builder = EngineBuilder::with_options(config.engine.options());
    let url = config.store.redis_url.trim();
    if url.is_empty() {
        if !matches!(cli.command, Command::Sim(_)) {
            eprintln!(
                "note: no Redis URL configured (--redis or store.redis_url); using the embedded \
                 in-memory store, which is discarded when this process exits"
            );
        }
        if let Command::Orders(_) = cli.command {
            return Err(Failure::new(
                "orders needs Redis (--redis URL): the outbox is Redis streams",
            ));
        }
        if config.store.strategy != shardstock::Strategy::Lua {
            return Err(Failure::new(format!(
                "--strategy {} needs Redis (--redis URL); the embedded store is atomic by construction",
                config.store.strategy
            )));
        }
        let engine = builder.build(MemoryStore::new())?;
        dispatch(engine, cli.command, cli.json).await
    } else {
        let store = config.build_store().await.map_err(|e| match e {
            e @ shardstock::Error::Redis(_) => {
                Failure::new(format!("cannot use Redis at {}: {e}", redact(url)))
            }
            e => Failure::from(e),
        })?;
        store.set_critical_section_pause(std::time::Duration::from_millis(cli.critical_pause_ms));
        if !config.store.strategy.exactly_once() && !cli.json {
            eprintln!(
                "warning: strategy {} is an UNSAFE baseline: {}",
                config.store.strategy,
                config.store.strategy.summary()
            );
        }
        let result = match cli.command {
            Command::Orders(a) => orders::run_orders(store.clone(), a, cli.json).await,
            command => {
                let engine = builder.build(store.clone())?;
                dispatch(engine, command, cli.json).await
            }
        };
        store.quit().await;
        result
    }
}

async fn dispatch<S: Store>(
    engine: Engine<S>,
    command: Command,
    json: bool,
) -> Result<ExitCode, Failure> {
    match command {
        Command::Load(a) => admin::run_load(engine, a, json).await,
        Command::Restock(a) => admin::run_restock(engine, a, json).await,
        Command::Audit(a) => admin::run_audit(engine, a, json).await,
        Command::Status(a) => admin::run_status(engine, a, json).await,
        Command::Sim(a) => sim::run_sim(engine, a, json).await,
        Command::Serve(a) => serve::run_serve(engine, a).await,
        Command::Orders(_) => Err(Failure::new("orders needs Redis (--redis URL)")),
    }
}

/// Prints `value` as one line of JSON on stdout.
pub(crate) fn print_json<T: Serialize>(value: &T) -> Result<(), Failure> {
    let s = serde_json::to_string(value)
        .map_err(|e| Failure::new(format!("cannot encode JSON: {e}")))?;
    println!("{s}");
    Ok(())
}
