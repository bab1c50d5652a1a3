//! `shardstock`: command-line front end of the sharded inventory engine.
//!
//! Commands: `load`, `restock`, `status`, `audit`, `sweep` (`admin.rs`), `sim` (a flash-sale load
//! generator, `sim.rs`), `serve` (the HTTP API of [`shardstock::http`], `serve.rs`) and
//! `orders` (the outbox consumer, `orders.rs`); the Prometheus recorder they share is set up in
//! `exporter.rs`, the failures and their exit codes are in `failure.rs`. This file reads the
//! command line and the configuration, builds the store and the engine, and dispatches. The
//! store is Redis when a URL is given (`--redis`, `store.redis_url` in the config file, or
//! `SHARDSTOCK_STORE__REDIS_URL`), else the embedded in-memory store, which lives only as long
//! as the process.

/// `println!` for the commands' output: a failed write is a [`Failure`] returned with `?`, so a
/// closed stdout (`| head`) ends the command quietly (exit code 141) instead of a panic.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::write_line(format_args!($($arg)*))?
    };
}

mod admin;
mod evacuate;
mod exporter;
mod failure;
mod orders;
mod serve;
mod sim;

use clap::{Args, Parser, Subcommand};
pub(crate) use failure::Failure;
use serde::Serialize;
use shardstock::{Config, Engine, EngineBuilder, MemoryStore, Store};
use std::io::IsTerminal;
use std::net::SocketAddr;
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
/// Every setting of the configuration file is also an environment variable
/// SHARDSTOCK_<SECTION>__<KEY> (e.g. SHARDSTOCK_STORE__REDIS_URL, SHARDSTOCK_SERVE__LISTEN,
/// SHARDSTOCK_METRICS__ADDR). Precedence: built-in defaults < --config FILE < environment <
/// flags. Log level: RUST_LOG (default "warn"), logs go to stderr.
#[derive(Debug, Parser)]
#[command(
    name = "shardstock",
    version,
    propagate_version = true,
    after_long_help = failure::EXIT_CODES
)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,

    #[command(subcommand)]
    command: Command,
}

/// The options every command takes (before or after the command's name).
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
struct GlobalArgs {
    /// TOML configuration file (sections [store], [engine], [serve], [metrics]; see
    /// config/shardstock.toml).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Redis URL, e.g. redis://127.0.0.1:6379/0 (rediss:// for TLS, redis-cluster:// for a
    /// cluster; the scheme is required). Overrides store.redis_url from the config file and
    /// SHARDSTOCK_STORE__REDIS_URL. Without any URL the embedded in-memory store is used.
    #[arg(long, global = true, value_name = "URL")]
    redis: Option<String>,

    /// Print machine-readable JSON on stdout instead of text.
    #[arg(long, global = true)]
    json: bool,
}

/// How the Redis store sells: the flags of the commands that deduct (`sim`, `serve`). Each
/// overrides its `[store]` setting.
#[derive(Debug, Args, Default)]
#[command(next_help_heading = "Store tuning")]
pub(crate) struct StoreTuning {
    /// Deduction strategy (Redis only): lua (default), lock, redlock (exactly-once), or the UNSAFE
    /// baselines naive, local-mutex, decr-compensate. Overrides store.strategy.
    #[arg(long, value_name = "NAME")]
    strategy: Option<shardstock::Strategy>,

    /// Independent Redis nodes for --strategy redlock, comma-separated (3 or 5).
    #[arg(long, value_name = "URL,URL,URL", value_delimiter = ',')]
    lock_nodes: Vec<String>,

    /// Lock lease in milliseconds for lock/redlock (renewed every lease/3 while held).
    #[arg(long, value_name = "MS")]
    lease_ms: Option<u64>,

    /// Request coalescing for --strategy lua: concurrent deductions bound for one segment go to
    /// Redis as one script call (on|off). Overrides store.coalesce.
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    coalesce: Option<bool>,

    /// Most requests in one coalesced script call. Overrides store.coalesce_max_batch.
    #[arg(long, value_name = "N")]
    coalesce_max_batch: Option<usize>,

    /// Microseconds a segment's queue may wait for more requests before sending (0 = send at
    /// once). Overrides store.coalesce_window_us.
    #[arg(long, value_name = "US")]
    coalesce_window_us: Option<u64>,

    /// Coalesced calls one segment may have in flight. Overrides store.coalesce_max_in_flight.
    #[arg(long, value_name = "N")]
    coalesce_in_flight: Option<usize>,

    /// Pause this many milliseconds inside every critical section (lock strategies: between
    /// the read and the fenced write; naive baselines: between read and write-back), like the
    /// slow downstream call of the read-then-write designs. A demonstration knob.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    critical_pause_ms: u64,
}

impl StoreTuning {
    /// Writes the flags given over their settings.
    fn apply(&self, store: &mut shardstock::config::StoreConfig) {
        if let Some(s) = self.strategy {
            store.strategy = s;
        }
        if !self.lock_nodes.is_empty() {
            store.lock_nodes = self.lock_nodes.clone();
        }
        if let Some(ms) = self.lease_ms {
            store.lock_lease_ms = ms;
        }
        if let Some(on) = self.coalesce {
            store.coalesce = on;
        }
        if let Some(n) = self.coalesce_max_batch {
            store.coalesce_max_batch = n;
        }
        if let Some(us) = self.coalesce_window_us {
            store.coalesce_window_us = us;
        }
        if let Some(n) = self.coalesce_in_flight {
            store.coalesce_max_in_flight = n;
        }
    }
}

/// Where the commands that run for a while (`sim`, `serve`, `orders`) serve metrics.
#[derive(Debug, Args)]
#[command(next_help_heading = "Metrics")]
pub(crate) struct MetricsArgs {
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9898; any path answers,
    /// conventionally /metrics). Overrides metrics.addr (SHARDSTOCK_METRICS__ADDR). Pair with
    /// `sim --duration` to watch a sale; `serve` also answers GET /metrics on its own address.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
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
    /// Prints totals and one row per segment. Exits with code 1 when a check fails.
    Audit(admin::SkuArgs),
    /// Show a SKU's stock: remaining in total and per segment, reserved and sold.
    Status(admin::SkuArgs),
    /// Do a sweeper's work now, over every SKU in the store: give back expired reservations,
    /// settle order items held past their deadline as their order's record says (an order
    /// still open then is expired), credit home units left in transit.
    ///
    /// What `serve` runs every --sweep-ms, for when no serve runs (e.g. after a `sim --cart`
    /// process died mid-sale). Prints what each SKU still has reserved or in transit, and
    /// exits with code 1 when a SKU's audit fails.
    Sweep(admin::SweepArgs),
    /// Simulate a flash sale: many concurrent buyers against one SKU (or, with --cart N,
    /// N-item carts over N SKUs).
    ///
    /// Loads the SKU afresh (unless --skip-load), fires --requests buy requests (or sells for
    /// --duration seconds, restocking as it goes) from --concurrency workers, then reports
    /// outcomes, latency percentiles, remaining stock and an audit. Several processes may run
    /// with --skip-load against the same Redis SKU; each uses its own request ids. With
    /// --cart N each request is an order of one item of each of the SKUs <SKU>-1 .. <SKU>-N,
    /// confirmed, cancelled or left to expire, and every order is read back and checked after
    /// the last deadline. Exits with code 1 when units were oversold, an audit failed or a
    /// cart check failed.
    Sim(sim::SimArgs),
    /// Serve the engine over HTTP/JSON until SIGTERM or ctrl-c.
    ///
    /// Routes: PUT /skus/{sku} (load), POST /skus/{sku}/restock, POST /skus/{sku}/deduct,
    /// GET /skus/{sku} (status), GET /skus/{sku}/audit, POST /skus/{sku}/reservations,
    /// POST /reservations/{id}/confirm, POST /reservations/{id}/cancel, POST /orders,
    /// GET /orders/{order_id}, POST /orders/{order_id}/confirm, POST /orders/{order_id}/cancel,
    /// GET /healthz and GET /metrics (also on --metrics-addr when given). Requests may carry their request id
    /// in an Idempotency-Key header. In-flight requests finish before the process exits.
    Serve(serve::ServeArgs),
    /// Consume the outbox: hand every sale, reservation, confirmation, cancellation and
    /// expiry of SKUs loaded with --outbox to PostgreSQL (--postgres URL) or stdout (--jsonl).
    ///
    /// Runs until SIGTERM or ctrl-c (or, with --until-idle, until nothing is pending). Many
    /// processes may run with one --group: each event goes to one of them; events of a
    /// process that died are claimed by the others after --min-idle-ms. Redis only.
    Orders(orders::OrdersArgs),
    /// Move a Redis Cluster master's slots that hold shardstock keys, keys and all, to masters
    /// that can replicate, so its SKUs' segments sell again.
    ///
    /// For a master that refuses writes (durability mode with min-replicas-to-write, after its
    /// replica was promoted and has none of its own) or one to drain. The source's writes are
    /// paused until it has given each slot up, so no sale is lost. --from evacuates one master
    /// now; --watch evacuates every master that keeps refusing. Needs a user allowed CLUSTER,
    /// CLIENT PAUSE/UNPAUSE, SCAN, PEXPIRETIME, DUMP, RESTORE, DEL, ASKING, INFO, CONFIG GET and
    /// WAIT. Run one evacuation per cluster at a time. Redis Cluster only.
    Evacuate(evacuate::EvacuateArgs),
}

impl Command {
    /// The store tuning flags, for the commands that take them.
    fn store_tuning(&self) -> Option<&StoreTuning> {
        match self {
            Command::Sim(a) => Some(&a.store),
            Command::Serve(a) => Some(&a.store),
            _ => None,
        }
    }

    /// `--metrics-addr`, for the commands that take it.
    fn metrics_addr(&self) -> Option<SocketAddr> {
        match self {
            Command::Sim(a) => a.metrics.metrics_addr,
            Command::Serve(a) => a.metrics.metrics_addr,
            Command::Orders(a) => a.metrics.metrics_addr,
            _ => None,
        }
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

fn init_logging() {
    // fred's `interfaces` warns when a command meets a client already stopped — QUIT at the
    // end of a command while a pool client is still shutting down: noise to a command-line
    // user (its errors still show).
    let default = Targets::new()
        .with_default(LevelFilter::WARN)
        .with_target("fred::interfaces", LevelFilter::ERROR);
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
        Err(f) => {
            if f.is_told() {
                eprintln!("error: {}", f.msg);
            }
            f.exit_code()
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

/// Environment variables of earlier releases, outside the `SHARDSTOCK_<SECTION>__<KEY>`
/// pattern: still read (with a warning) when the setting's own variable is not set.
const DEPRECATED_ENV: [(&str, &str); 2] = [
    ("SHARDSTOCK_METRICS_ADDR", "SHARDSTOCK_METRICS__ADDR"),
    ("SHARDSTOCK_LISTEN", "SHARDSTOCK_SERVE__LISTEN"),
];

/// Applies the deprecated variables that are set (see [`DEPRECATED_ENV`]).
fn deprecated_env(config: &mut Config) -> Result<(), Failure> {
    for (old, new) in DEPRECATED_ENV {
        let Ok(value) = std::env::var(old) else {
            continue;
        };
        if std::env::var_os(new).is_some() {
            eprintln!("warning: {old} is deprecated and ignored: {new} is set");
            continue;
        }
        eprintln!("warning: {old} is deprecated: set {new} instead");
        let addr: SocketAddr = value
            .trim()
            .parse()
            .map_err(|e| Failure::config(format!("{old}={value:?}: {e}")))?;
        match old {
            "SHARDSTOCK_LISTEN" => config.serve.listen = addr,
            _ => config.metrics.addr = Some(addr),
        }
    }
    Ok(())
}

async fn run(mut cli: Cli) -> Result<ExitCode, Failure> {
    let mut config = Config::load(cli.global.config.as_deref())?;
    deprecated_env(&mut config)?;
    if let Some(url) = cli.global.redis.take() {
        config.store.redis_url = url;
    }
    if let Some(t) = cli.command.store_tuning() {
        t.apply(&mut config.store);
    }
    if let Some(addr) = cli.command.metrics_addr() {
        config.metrics.addr = Some(addr);
    }
    if let Command::Serve(a) = &mut cli.command {
        a.apply(&mut config.serve);
    }
    config.validate()?;
    // Only commands that run for a while serve metrics (`sim`, `orders` here; `serve` below).
    if let (Some(addr), Command::Sim(_) | Command::Orders(_)) = (config.metrics.addr, &cli.command)
    {
        exporter::install(addr, config.store.strategy)?;
    }
    if let Command::Serve(_) = &cli.command {
        serve::install_metrics(config.metrics.addr, config.store.strategy).await?;
    }
    let json = cli.global.json;
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
            return Err(Failure::config(
                "orders needs Redis (--redis URL): the outbox is Redis streams",
            ));
        }
        if let Command::Evacuate(_) = cli.command {
            return Err(Failure::config(
                "evacuate needs a Redis Cluster (--redis redis-cluster://HOST:PORT)",
            ));
        }
        if config.store.strategy != shardstock::Strategy::Lua {
            return Err(Failure::config(format!(
                "--strategy {} needs Redis (--redis URL); the embedded store is atomic by construction",
                config.store.strategy
            )));
        }
        let engine = builder.build(MemoryStore::new())?;
        dispatch(engine, cli.command, json).await
    } else {
        let store = config
            .build_store()
            .await
            .map_err(|e| Failure::connect(url, e))?;
        let pause = cli
            .command
            .store_tuning()
            .map_or(0, |t| t.critical_pause_ms);
        store.set_critical_section_pause(std::time::Duration::from_millis(pause));
        if !config.store.strategy.exactly_once() && !json {
            eprintln!(
                "warning: strategy {} is an UNSAFE baseline: {}",
                config.store.strategy,
                config.store.strategy.summary()
            );
        }
        let result = match cli.command {
            Command::Orders(a) => orders::run_orders(store.clone(), a, json).await,
            Command::Evacuate(a) => {
                evacuate::run_evacuate(store.clone(), a, config.store.wait_replicas, json).await
            }
            command => {
                let engine = builder.build(store.clone())?;
                dispatch(engine, command, json).await
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
        Command::Sweep(a) => admin::run_sweep(engine, a, json).await,
        Command::Sim(a) => sim::run_sim(engine, a, json).await,
        Command::Serve(a) => serve::run_serve(engine, a).await,
        Command::Orders(_) => Err(Failure::config("orders needs Redis (--redis URL)")),
        Command::Evacuate(_) => Err(Failure::config("evacuate needs a Redis Cluster")),
    }
}

/// Prints `value` as one line of JSON on stdout.
pub(crate) fn print_json<T: Serialize>(value: &T) -> Result<(), Failure> {
    let s = serde_json::to_string(value)
        .map_err(|e| Failure::new(format!("cannot encode JSON: {e}")))?;
    say!("{s}");
    Ok(())
}

/// Writes `args` and a newline on stdout (what [`say!`] does); a failed write is
/// [`Failure::stdout`].
pub(crate) fn write_line(args: std::fmt::Arguments<'_>) -> Result<(), Failure> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .map_err(Failure::stdout)
}
