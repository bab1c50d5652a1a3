//! `shardstock orders`: the outbox consumer as a process. Events go into PostgreSQL
//! (`--postgres URL`, one row per request id) or to stdout as JSON lines (`--jsonl`), until
//! SIGTERM / ctrl-c, or until nothing is left (`--until-idle`).

use crate::{Failure, print_json};
use clap::Args;
use serde::Serialize;
use shardstock::orders::{Handler, OrderEvent, Orders, OrdersOptions, Polled};
use shardstock::{RedisStore, Sku};
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Debug, Args)]
pub(crate) struct OrdersArgs {
    /// Write orders into this PostgreSQL database (the table is created when missing), e.g.
    /// postgres://user@127.0.0.1:5432/shop.
    #[arg(
        long,
        value_name = "URL",
        required_unless_present = "jsonl",
        conflicts_with = "jsonl"
    )]
    postgres: Option<String>,
    /// Print each event as one JSON line on stdout instead (for piping).
    #[arg(long)]
    jsonl: bool,
    /// Consumer group: every process of one order service shares it.
    #[arg(long, value_name = "NAME", default_value = "orders")]
    group: String,
    /// This consumer's name in the group (unique per process). Default: <host>-<pid>.
    #[arg(long, value_name = "NAME")]
    consumer: Option<String>,
    /// Serve only these SKUs (repeatable). Default: every SKU loaded with the outbox.
    #[arg(long = "sku", value_name = "SKU")]
    skus: Vec<String>,
    /// Events read per stream per call.
    #[arg(long, value_name = "N", default_value_t = 256)]
    batch: usize,
    /// Claim events pending this long (their consumer died, or their handler failed).
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    min_idle_ms: u64,
    /// Deliveries after which a failing event goes to the dead-letter stream.
    #[arg(long, value_name = "N", default_value_t = 5)]
    max_deliveries: u64,
    /// Exit once nothing is pending or undelivered (and print a summary).
    #[arg(long)]
    until_idle: bool,
    /// With --until-idle: give up (exit 5) after this many seconds.
    #[arg(long, value_name = "S", default_value_t = 600)]
    timeout_s: u64,
    #[command(flatten)]
    pub(crate) metrics: crate::MetricsArgs,
}

/// Events as JSON lines on stdout. A closed stdout (the reader went away) stops the consumer:
/// events it could not write stay pending, for this group's other consumers or the next run,
/// instead of failing delivery after delivery into the dead letters.
#[derive(Default)]
struct JsonLines {
    /// Set once a write found stdout closed.
    closed: AtomicBool,
    /// Woken when `closed` is set.
    closing: Notify,
}

impl JsonLines {
    /// Completes once stdout is found closed.
    async fn closed(&self) {
        if !self.closed.load(Ordering::Acquire) {
            self.closing.notified().await;
        }
    }
}

#[derive(Serialize)]
struct Line<'a> {
    kind: &'a str,
    request_id: &'a str,
    sku: &'a str,
    user: &'a str,
    units: u64,
    parts: String,
    generation: u64,
    at_ms: u64,
    stream: &'a str,
    entry_id: &'a str,
    deliveries: u64,
}

impl Handler for JsonLines {
    async fn handle(&self, events: &[OrderEvent]) -> Vec<Result<(), String>> {
        let mut out = std::io::stdout().lock();
        events
            .iter()
            .map(|e| {
                let line = Line {
                    kind: e.kind.as_str(),
                    request_id: &e.request_id,
                    sku: &e.sku,
                    user: &e.user,
                    units: e.units,
                    parts: shardstock::segments::encode_parts(&e.parts),
                    generation: e.generation,
                    at_ms: e.at_ms,
                    stream: &e.stream,
                    entry_id: &e.entry_id,
                    deliveries: e.deliveries,
                };
                let s = serde_json::to_string(&line).map_err(|e| e.to_string())?;
                if self.closed.load(Ordering::Acquire) {
                    return Err("stdout is closed".to_string());
                }
                // A failed write is a failure: the event stays pending for another consumer.
                writeln!(out, "{s}").and_then(|_| out.flush()).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::BrokenPipe {
                        self.closed.store(true, Ordering::Release);
                        self.closing.notify_one();
                    }
                    e.to_string()
                })
            })
            .collect()
    }
}

pub(crate) async fn run_orders(
    store: RedisStore,
    a: OrdersArgs,
    json: bool,
) -> Result<ExitCode, Failure> {
    crate::exporter::register_orders();
    let mut opts = OrdersOptions::new(
        a.group.clone(),
        a.consumer
            .clone()
            .unwrap_or_else(|| OrdersOptions::default().consumer),
    )
    .batch(a.batch)
    .min_idle(Duration::from_millis(a.min_idle_ms))
    .max_deliveries(a.max_deliveries);
    if !a.skus.is_empty() {
        opts = opts.skus(a.skus.iter().map(Sku::new).collect::<Result<_, _>>()?);
    }
    if let Some(url) = &a.postgres {
        let pg = shardstock::orders::postgres::PostgresOrders::connect(url).await?;
        pg.migrate().await?;
        let orders = Orders::new(store, pg, opts)?;
        let code = consume(&orders, &a, json).await?;
        if a.until_idle {
            let summary = orders.handler().summary(None).await?;
            if json {
                print_json(&serde_json::json!({
                    "polled": polled_json(&orders.totals()),
                    "postgres": summary,
                }))?;
            } else {
                let t = orders.totals();
                say!(
                    "handled {} events ({} delivered again, {} dead letters); orders in PostgreSQL: {} rows, {} units sold or confirmed, {} reserved",
                    t.handled,
                    t.redelivered,
                    t.dead,
                    summary.rows,
                    summary.sold_units,
                    summary.reserved_units
                );
            }
        }
        Ok(code)
    } else {
        let orders = Orders::new(store, JsonLines::default(), opts)?;
        let lines = orders.handler();
        let code = tokio::select! {
            code = consume(&orders, &a, false) => code?,
            () = lines.closed() => return Err(Failure::stdout_closed()),
        };
        if a.until_idle {
            let t = orders.totals();
            eprintln!(
                "handled {} events ({} delivered again, {} dead letters)",
                t.handled, t.redelivered, t.dead
            );
        }
        Ok(code)
    }
}

fn polled_json(p: &Polled) -> serde_json::Value {
    serde_json::json!({
        "handled": p.handled,
        "failed": p.failed,
        "redelivered": p.redelivered,
        "dead": p.dead,
    })
}

async fn consume<H: Handler>(
    orders: &Orders<H>,
    a: &OrdersArgs,
    _json: bool,
) -> Result<ExitCode, Failure> {
    if a.until_idle {
        orders.drain(Duration::from_secs(a.timeout_s)).await?;
        return Ok(ExitCode::SUCCESS);
    }
    orders.run(crate::serve::shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}
