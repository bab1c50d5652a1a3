//! `shardstock sim`: a flash sale against one SKU, with outcome counts, latency percentiles
//! and an oversell check from the store's own books.

mod cart;
mod report;

use crate::{Failure, print_json, unique_stem};
use clap::Args;
use hdrhistogram::Histogram;
use report::{CoalescingReport, Report, print_human};
use shardstock::{Deduct, Deduction, Engine, RequestId, Sku, Store};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Largest latency the histograms track (one hour, in microseconds); larger values saturate.
const MAX_LATENCY_US: u64 = 3_600_000_000;

#[derive(Debug, Args)]
pub(crate) struct SimArgs {
    /// SKU id to sell.
    #[arg(long, default_value = "flash-1")]
    sku: String,
    /// Units to load before the sale (ignored with --skip-load).
    #[arg(long, value_name = "N", default_value_t = 100)]
    stock: u64,
    /// Segments to split the stock over (ignored with --skip-load, which uses the loaded
    /// layout).
    #[arg(long, value_name = "K", default_value_t = 10)]
    segments: u32,
    /// Distinct buyers; request i is made by user u{i % users}.
    #[arg(long, value_name = "U", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    users: u64,
    /// Buy requests to send in total.
    #[arg(long, value_name = "R", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    requests: u64,
    /// Concurrent workers sending requests.
    #[arg(long, value_name = "C", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    concurrency: u64,
    /// Units per buy request.
    #[arg(long, value_name = "Q", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    qty: u64,
    /// Do not (re)load the SKU: sell what is already in the store. Lets several processes
    /// share one sale in Redis (with the in-memory store there is nothing loaded).
    #[arg(long)]
    skip_load: bool,
    /// Units one user may buy (0 = no limit; applies when this run loads the SKU). Default:
    /// engine.per_user_limit from the configuration (1 = one unit per user), or 0 for the
    /// unsafe baselines (naive, local-mutex, decr-compensate), which keep no ledgers.
    #[arg(long, value_name = "N")]
    per_user_limit: Option<u64>,
    /// Load the SKU with the outbox on (Redis only): every sale, reservation, confirmation,
    /// cancellation and expiry leaves an event for `shardstock orders` to consume. Default:
    /// engine.outbox from the configuration.
    #[arg(long, alias = "orders", value_name = "on|off", num_args = 0..=1, default_missing_value = "on", value_parser = crate::parse_on_off)]
    outbox: Option<bool>,
    /// Share of requests that reserve (pre-deduct with a TTL) instead of buying outright.
    #[arg(long, value_name = "F", default_value_t = 0.0)]
    reserve_ratio: f64,
    /// Share of reservations (with --cart: of orders held) confirmed right away; half of the
    /// rest are cancelled and the other half left to expire (the sim then waits for them and
    /// sweeps).
    #[arg(long, value_name = "F", default_value_t = 0.5)]
    confirm_ratio: f64,
    /// Reservation TTL in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    ttl_ms: u64,
    /// Keep the sale going for this many seconds instead of sending --requests (for watching
    /// it live with --metrics-addr). The stock sells out, sold-out traffic goes on, and
    /// --restock-every adds --stock units again; about 1 request in 100 is a client retry of
    /// an earlier request id (answered as a replay when that one sold).
    #[arg(long, value_name = "SECONDS", conflicts_with = "requests", value_parser = positive_seconds)]
    duration: Option<f64>,
    /// Send at most this many requests per second over all workers (0 = no limit).
    #[arg(long, value_name = "N", default_value_t = 0)]
    rate: u64,
    /// With --duration: restock --stock units every this many seconds (0 = never).
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0, requires = "duration", value_parser = non_negative_seconds)]
    restock_every: f64,
    /// Sell carts of N items (2..=32) instead of one SKU: loads the N SKUs <SKU>-1 .. <SKU>-N
    /// (--sku is their stem; each gets --stock units over --segments segments and the per-user
    /// limit), and each of --requests buyers holds one order of --qty units of every one of
    /// them (all or nothing), then confirms it (--confirm-ratio), cancels it (half of the
    /// rest) or leaves it to expire after --hold-ms. After the last deadline the sim sweeps
    /// and checks: every order's items all posted if it was confirmed, else all voided or
    /// never held; the audit of every SKU; nothing in transit or reserved; units sold of each
    /// SKU = confirmed orders × --qty. Exit code 1 when a check fails. Needs the lua, lock or
    /// redlock strategy.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(2..=32), conflicts_with_all = ["duration", "reserve_ratio", "skip_load"])]
    cart: Option<u8>,
    /// With --cart: how long an order's items are held before it expires unconfirmed, in
    /// milliseconds (at most the engine's request TTL).
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    hold_ms: u64,
    /// This run's request ids are <ID>-<i> for request i (default: a fresh r<pid>-<nanos>), so
    /// that another process can find its orders (--check-only).
    #[arg(long, value_name = "ID")]
    run_id: Option<String>,
    /// With --cart and --run-id: load nothing, sell nothing and sweep nothing; read back the
    /// orders of that earlier run (give the same --sku, --cart, --requests, --users and
    /// --qty) and run the end checks on them: a sale killed mid-storm, finished since by
    /// `shardstock sweep` (or a serve's sweeper) after its deadlines.
    #[arg(long, requires_all = ["cart", "run_id"])]
    check_only: bool,
    #[command(flatten)]
    pub(crate) store: crate::StoreTuning,
    #[command(flatten)]
    pub(crate) metrics: crate::MetricsArgs,
}

fn seconds(s: &str) -> Result<f64, String> {
    let x: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !x.is_finite() || x > 1e9 {
        return Err(format!("{s} seconds is out of range"));
    }
    Ok(x)
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    let x = seconds(s)?;
    if x <= 0.0 {
        return Err("must be more than 0 seconds".into());
    }
    Ok(x)
}

fn non_negative_seconds(s: &str) -> Result<f64, String> {
    let x = seconds(s)?;
    if x < 0.0 {
        return Err("must be 0 seconds or more".into());
    }
    Ok(x)
}

/// In a timed sale, request i with `i % RETRY_EVERY == RETRY_EVERY - 1` re-sends request
/// `i - RETRY_LAG` (same id, user and qty), as a client would after a timeout.
const RETRY_EVERY: u64 = 100;
const RETRY_LAG: u64 = 50;

/// When the sale stops.
#[derive(Debug, Clone, Copy)]
enum Until {
    /// After this many requests.
    Requests(u64),
    /// At this instant.
    Deadline(Instant),
}

/// Outcome counters of one worker (then of the whole run).
#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    applied: u64,
    sold_units: u64,
    sold_out: u64,
    insufficient: u64,
    replayed: u64,
    limit_reached: u64,
    user_busy: u64,
    errors: u64,
    /// Reserved units confirmed, cancelled, left to expire.
    confirmed: u64,
    cancelled: u64,
    left_to_expire: u64,
    /// Units sold per user index (this process only).
    per_user: std::collections::HashMap<u64, u64, foldhash::fast::RandomState>,
}

impl Tally {
    fn count(
        &mut self,
        user: u64,
        outcome: shardstock::Result<Deduction>,
        first_error: &OnceLock<String>,
    ) {
        self.sent += 1;
        match outcome {
            Ok(d @ Deduction::Applied { .. }) => {
                self.applied += 1;
                self.sold_units += d.units_applied();
                *self.per_user.entry(user).or_default() += d.units_applied();
            }
            Ok(Deduction::LimitReached { .. } | Deduction::OverLimit { .. }) => {
                self.limit_reached += 1
            }
            Ok(Deduction::UserBusy) => self.user_busy += 1,
            Ok(Deduction::Replayed { .. }) => self.replayed += 1,
            Ok(Deduction::SoldOut) => self.sold_out += 1,
            Ok(Deduction::Insufficient { .. }) => self.insufficient += 1,
            Ok(other) => self.error(format!("unknown outcome {:?}", other.kind()), first_error),
            Err(e) => self.error(e.to_string(), first_error),
        }
    }

    fn error(&mut self, msg: String, first_error: &OnceLock<String>) {
        self.errors += 1;
        tracing::debug!(error = %msg, "deduct failed");
        if first_error.set(msg.clone()).is_ok() {
            tracing::warn!(error = %msg, "first deduct error (the run goes on)");
        }
    }

    fn merge(&mut self, o: &Tally) {
        self.sent += o.sent;
        self.applied += o.applied;
        self.sold_units += o.sold_units;
        self.sold_out += o.sold_out;
        self.insufficient += o.insufficient;
        self.replayed += o.replayed;
        self.limit_reached += o.limit_reached;
        self.user_busy += o.user_busy;
        self.errors += o.errors;
        self.confirmed += o.confirmed;
        self.cancelled += o.cancelled;
        self.left_to_expire += o.left_to_expire;
        for (u, n) in &o.per_user {
            *self.per_user.entry(*u).or_default() += n;
        }
    }
}

/// The run's id: `--run-id`, or a fresh `r<pid>-<nanos>`. Request `i` is `<run id>-<i>`.
fn run_id(given: Option<&str>) -> Result<String, Failure> {
    match given {
        Some(id) => {
            // The longest request id this run makes must be valid (and, with --cart, leave
            // room for the items' `#<n>`).
            RequestId::new(format!("{id}-{}", u64::MAX))
                .map_err(|e| Failure::new(format!("--run-id {id:?}: {e}")))?;
            Ok(id.to_owned())
        }
        None => Ok(format!("r{}", unique_stem())),
    }
}

/// A live progress bar for people over `next` (of `len`, or a spinner); none for --json and
/// when stderr is not a terminal. Abort the task and clear the bar when done.
fn progress(
    json: bool,
    len: Option<u64>,
    what: &str,
    next: &Arc<AtomicU64>,
) -> Option<(indicatif::ProgressBar, tokio::task::JoinHandle<()>)> {
    (!json && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(|| {
        let bar = match len {
            None => indicatif::ProgressBar::new_spinner(),
            Some(n) => indicatif::ProgressBar::new(n),
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(&format!(
                "{{spinner}} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {what} ({{rate}})"
            ))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .with_key("rate", rate),
        );
        let (b, n) = (bar.clone(), Arc::clone(next));
        let task = tokio::spawn(async move {
            loop {
                b.set_position(n.load(Ordering::Relaxed));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        (bar, task)
    })
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("static histogram bounds are valid")
}

/// The progress bar's rate as a whole number of requests per second: `241,980/s`.
fn rate(state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write) {
    let _ = write!(w, "{}/s", indicatif::HumanCount(state.per_sec() as u64));
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Runs the sale; see [`SimArgs`].
pub(crate) async fn run_sim<S: Store>(
    engine: Engine<S>,
    a: SimArgs,
    json: bool,
) -> Result<ExitCode, Failure> {
    if let Some(n) = a.cart {
        return cart::run_cart(engine, a, usize::from(n), json).await;
    }
    let sku = Sku::new(&a.sku)?;
    let max_qty = engine.options().max_qty;
    if a.qty > max_qty {
        return Err(Failure::new(format!(
            "--qty {} is above the engine's max_qty {max_qty} (engine.max_qty in the config)",
            a.qty
        )));
    }
    if a.skip_load {
        // Fail early and clearly rather than counting R identical errors.
        engine.remaining(&sku).await.map_err(|e| {
            let mut f = Failure::from(e);
            if engine.store().name() == "memory" {
                f.msg.push_str(
                    "; --skip-load sells stock already in the store, but the embedded in-memory \
                     store starts empty in every process: pass --redis URL or drop --skip-load",
                );
            }
            f
        })?;
    } else {
        let per_user_limit = a.per_user_limit.unwrap_or_else(|| {
            if engine.store().strategy().exactly_once() {
                engine.options().per_user_limit
            } else {
                0
            }
        });
        engine
            .load(
                &sku,
                a.stock,
                shardstock::LoadOptions::new(a.segments)
                    .replace(true)
                    .per_user_limit(per_user_limit)
                    .outbox(a.outbox.unwrap_or(engine.options().outbox)),
            )
            .await?;
    }

    let run_id = run_id(a.run_id.as_deref())?;
    let (reserve_ratio, confirm_ratio, ttl_ms) = (a.reserve_ratio, a.confirm_ratio, a.ttl_ms);
    if !(0.0..=1.0).contains(&reserve_ratio) || !(0.0..=1.0).contains(&confirm_ratio) {
        return Err(Failure::new(
            "--reserve-ratio and --confirm-ratio must be between 0 and 1",
        ));
    }
    // Reservations left to expire come back through the engine's sweeper (and lazily).
    let _sweeper = (reserve_ratio > 0.0).then(|| engine.start_sweeper(Duration::from_millis(100)));
    // Conservation as a live metric while the sale runs (shardstock_audit_*; see live_audit).
    let _audit = engine.start_live_audit(Duration::from_secs(1), vec![sku.clone()]);
    let next = Arc::new(AtomicU64::new(0));
    let progress = progress(
        json,
        a.duration.is_none().then_some(a.requests),
        "requests",
        &next,
    );
    let first_error = Arc::new(OnceLock::<String>::new());
    let workers = match a.duration {
        Some(_) => a.concurrency,
        None => a.concurrency.min(a.requests),
    };
    let started = Instant::now();
    let until = match a.duration {
        Some(secs) => Until::Deadline(started + Duration::from_secs_f64(secs)),
        None => Until::Requests(a.requests),
    };
    let restocker = match until {
        Until::Deadline(deadline) if a.restock_every > 0.0 && a.stock > 0 => {
            Some(tokio::spawn(restock_loop(
                engine.clone(),
                sku.clone(),
                a.stock,
                Duration::from_secs_f64(a.restock_every),
                deadline,
                run_id.clone(),
            )))
        }
        _ => None,
    };
    let mut handles = Vec::with_capacity(workers as usize);
    for _ in 0..workers {
        let engine = engine.clone();
        let next = Arc::clone(&next);
        let first_error = Arc::clone(&first_error);
        let run_id = run_id.clone();
        let sku = sku.clone();
        let (users, qty, rate) = (a.users, a.qty, a.rate);
        handles.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut hist = new_histogram();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let due =
                    (rate > 0).then(|| started + Duration::from_secs_f64(i as f64 / rate as f64));
                let timed = match until {
                    Until::Requests(n) if i >= n => break,
                    Until::Requests(_) => false,
                    Until::Deadline(d) if Instant::now() >= d || due.is_some_and(|t| t >= d) => {
                        break;
                    }
                    Until::Deadline(_) => true,
                };
                if let Some(t) = due {
                    tokio::time::sleep_until(t.into()).await;
                }
                // A timed sale re-sends an earlier request now and then, like a client retry.
                let i = if timed && i % RETRY_EVERY == RETRY_EVERY - 1 && i >= RETRY_LAG {
                    i - RETRY_LAG
                } else {
                    i
                };
                let user = format!("u{}", i % users);
                let request_id = format!("{run_id}-{i}");
                // Deterministic per request index, so a retried request repeats its choice.
                let pick =
                    (shardstock::segments::fnv1a(request_id.as_bytes()) % 10_000) as f64 / 10_000.0;
                let reserve = pick < reserve_ratio;
                let outcome = match Deduct::new(sku.as_str(), &user, qty, &request_id) {
                    Ok(req) if reserve => {
                        let t0 = Instant::now();
                        let r = engine.reserve(&req, Duration::from_millis(ttl_ms)).await;
                        let us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
                        hist.saturating_record(us.max(1));
                        match r {
                            Ok(shardstock::Reserved::Held { id, segment, units }) => {
                                // Second draw decides the reservation's fate.
                                let fate = (shardstock::segments::fnv1a(id.to_string().as_bytes())
                                    % 10_000) as f64
                                    / 10_000.0;
                                if fate < confirm_ratio {
                                    match engine.confirm(&id).await {
                                        Ok(e) if e.done => {
                                            tally.confirmed += units;
                                            Ok(Deduction::Applied { segment, units })
                                        }
                                        Ok(_) => Ok(Deduction::SoldOut),
                                        Err(e) => Err(e),
                                    }
                                } else if fate < confirm_ratio + (1.0 - confirm_ratio) / 2.0 {
                                    match engine.cancel(&id).await {
                                        Ok(_) => {
                                            tally.cancelled += units;
                                            Ok(Deduction::Replayed { segment, units })
                                        }
                                        Err(e) => Err(e),
                                    }
                                } else {
                                    tally.left_to_expire += units;
                                    Ok(Deduction::Replayed { segment, units })
                                }
                            }
                            Ok(shardstock::Reserved::Replayed { segment, units, .. }) => {
                                Ok(Deduction::Replayed { segment, units })
                            }
                            Ok(shardstock::Reserved::NotHeld(d)) => Ok(d),
                            Ok(other) => Err(shardstock::Error::Protocol(format!(
                                "unknown reservation outcome {other:?}"
                            ))),
                            Err(e) => Err(e),
                        }
                    }
                    Ok(req) => {
                        let t0 = Instant::now();
                        let r = engine.deduct(&req).await;
                        let us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
                        hist.saturating_record(us.max(1));
                        r
                    }
                    Err(e) => Err(e),
                };
                tally.count(i % users, outcome, &first_error);
            }
            (tally, hist)
        }));
    }
    let mut tally = Tally::default();
    let mut hist = new_histogram();
    for h in handles {
        let (t, wh) = h
            .await
            .map_err(|e| Failure::new(format!("a sale worker failed: {e}")))?;
        tally.merge(&t);
        hist.add(&wh)
            .map_err(|e| Failure::new(format!("cannot merge latency histograms: {e:?}")))?;
    }
    let elapsed = started.elapsed().max(Duration::from_nanos(1));
    if let Some((bar, task)) = progress {
        task.abort();
        bar.finish_and_clear();
    }
    if let Some(r) = restocker {
        r.await
            .map_err(|e| Failure::new(format!("the restock task failed: {e}")))?;
    }
    // A fixed-size sale reports what it was asked to send; a timed one what it sent.
    let requests = match until {
        Until::Requests(n) => n,
        Until::Deadline(_) => tally.sent,
    };

    // After the sale: what could not be checked is said, never a reason to lose the report.
    let mut unchecked = Vec::new();
    if tally.left_to_expire > 0 {
        // Let the unconfirmed reservations run out, then return them (the sweeper's job).
        tokio::time::sleep(Duration::from_millis(a.ttl_ms + 50)).await;
        if let Err(e) = engine.sweep().await {
            unchecked.push(format!("returning the expired reservations: {e}"));
        }
    }
    // One read of every segment that writes nothing: it answers while a master refuses writes.
    let audit = match engine.audit(&sku).await {
        Ok(a) => Some(a),
        Err(e) => {
            unchecked.push(format!(
                "the audit (conservation, oversell, remaining stock): {e}"
            ));
            None
        }
    };
    let oversold = audit
        .as_ref()
        .map(|a| a.sold.saturating_sub(a.loaded.saturating_add(a.restocked)));
    let elapsed_s = elapsed.as_secs_f64();

    let report = Report {
        sku: sku.to_string(),
        store: engine.store().name(),
        strategy: engine.store().strategy(),
        strategy_safe: engine.store().strategy().exactly_once(),
        lock: engine.store().lock_figures(),
        coalescing: coalescing_report(&engine),
        run_id,
        generation: audit.as_ref().map(|a| a.generation),
        segments: audit.as_ref().map_or(0, |a| a.segments.len()),
        requests,
        users: a.users,
        qty: a.qty,
        concurrency: workers,
        applied: tally.applied,
        sold_units: tally.sold_units,
        sold_out: tally.sold_out,
        insufficient: tally.insufficient,
        replayed: tally.replayed,
        limit_reached: tally.limit_reached,
        user_busy: tally.user_busy,
        max_units_per_user: tally.per_user.values().copied().max().unwrap_or(0),
        reservations_confirmed_units: tally.confirmed,
        reservations_cancelled_units: tally.cancelled,
        reservations_expired_units: tally.left_to_expire,
        // Live holds: the expired ones are counted in `remaining` (sellable).
        reserved: audit.as_ref().map(|a| a.live_reserved()),
        in_transit: audit.as_ref().map(|a| a.in_transit),
        errors: tally.errors,
        first_error: first_error.get().cloned(),
        remaining: audit
            .as_ref()
            .map(|a| a.sellable_per_segment().iter().sum()),
        remaining_per_segment: audit.as_ref().map(|a| a.sellable_per_segment()),
        loaded: audit.as_ref().map(|a| a.loaded),
        restocked: audit.as_ref().map(|a| a.restocked),
        sold: audit.as_ref().map(|a| a.sold),
        oversold,
        audit_ok: audit.as_ref().map(|a| a.ok),
        audit_problems: audit.map(|a| a.problems).unwrap_or_default(),
        unchecked,
        elapsed_s: round(elapsed_s, 6),
        throughput_per_s: round(requests as f64 / elapsed_s, 1),
        p50_ms: ms(hist.value_at_quantile(0.50)),
        p99_ms: ms(hist.value_at_quantile(0.99)),
        p999_ms: ms(hist.value_at_quantile(0.999)),
        max_ms: ms(hist.max()),
        cart: None,
    };

    if json {
        print_json(&report)?;
    } else {
        print_human(&report)?;
    }
    Ok(
        if report.oversold.is_some_and(|o| o > 0) || report.audit_ok == Some(false) {
            ExitCode::from(crate::failure::CHECK_FAILED)
        } else if !report.unchecked.is_empty() {
            ExitCode::from(crate::failure::STORE) // the report says what could not be checked
        } else {
            ExitCode::SUCCESS
        },
    )
}

/// The store's request coalescing as reported (`None`: one script call per request).
fn coalescing_report<S: Store>(engine: &Engine<S>) -> Option<CoalescingReport> {
    engine.store().coalescing().map(|c| CoalescingReport {
        max_batch: c.options.max_batch,
        window_us: c.options.window.as_micros() as u64,
        max_in_flight: c.options.max_in_flight,
        calls: c.calls,
        requests: c.requests,
        mean_batch: if c.calls == 0 {
            0.0
        } else {
            c.requests as f64 / c.calls as f64
        },
    })
}

/// Restocks `units` every `every` until `deadline` (a timed sale), one fresh request id each.
/// Waits for a restock in progress rather than cancelling it half-way.
async fn restock_loop<S: Store>(
    engine: Engine<S>,
    sku: Sku,
    units: u64,
    every: Duration,
    deadline: Instant,
    run_id: String,
) {
    for n in 1u64.. {
        let now = Instant::now();
        if now + every >= deadline {
            return;
        }
        tokio::time::sleep(every).await;
        let outcome = match RequestId::new(format!("{run_id}-restock-{n}")) {
            Ok(id) => engine.restock(&sku, units, &id).await.map(|_| ()),
            Err(e) => Err(e),
        };
        if let Err(e) = outcome {
            tracing::warn!(error = %e, "restock failed (the sale goes on)");
        }
    }
}
