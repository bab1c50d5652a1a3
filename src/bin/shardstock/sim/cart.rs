//! `sim --cart N`: a flash sale of N-item carts over N SKUs. Every buyer holds one order of
//! every SKU (all or nothing), then confirms, cancels or leaves it to expire; after the last
//! deadline the sim sweeps, reads every order and its items back, and checks that each order
//! ended as one (see [`check_orders`](check::check_orders)) and that the books of every SKU
//! agree.
//!
//! `--check-only` runs the reading and the checks alone, over the orders of an earlier run
//! (`--run-id`): a sale killed mid-storm and finished since by another process's sweep.
//!
//! This file is the sale: its workers, their tally and the steps after the last deadline.
//! Reading the orders back is `cart/check.rs`, the report `cart/report.rs`.

mod check;
mod report;

use crate::Failure;
use crate::sim::report::{Refusals, print_human};
use crate::sim::{SimArgs, new_histogram, progress, run_id};
use check::{Homes, check_orders};
use report::report;
use shardstock::cart::MAX_ORDER_REQUEST_ID_LEN;
use shardstock::{
    Cart, CartItem, Deduction, Engine, OrderHold, OrderId, OrderState, RequestId, Sku, Store,
    UserId,
};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Sweeps after the last deadline, at most, until nothing is reserved.
const MAX_SWEEPS: u32 = 20;

/// Outcome counters of one worker (then of the whole run).
#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    held: u64,
    confirmed: u64,
    cancelled: u64,
    left_to_expire: u64,
    /// Confirms and cancels answered "expired" (the deadline came first).
    confirm_late: u64,
    cancel_late: u64,
    /// Holds answered "expired": the deadline passed before every item was held.
    expired_holding: u64,
    refused: Refusals,
    ended: u64,
    hold_errors: u64,
    decision_errors: u64,
    /// Units of one SKU each user index had confirmed (this process).
    per_user: std::collections::HashMap<u64, u64, foldhash::fast::RandomState>,
    /// The latest an order of this worker may still hold items until (local clock).
    last_deadline: Option<Instant>,
}

impl Tally {
    fn merge(&mut self, o: Tally) {
        self.sent += o.sent;
        self.held += o.held;
        self.confirmed += o.confirmed;
        self.cancelled += o.cancelled;
        self.left_to_expire += o.left_to_expire;
        self.confirm_late += o.confirm_late;
        self.cancel_late += o.cancel_late;
        self.expired_holding += o.expired_holding;
        self.refused.sold_out += o.refused.sold_out;
        self.refused.insufficient += o.refused.insufficient;
        self.refused.limit_reached += o.refused.limit_reached;
        self.refused.over_limit += o.refused.over_limit;
        self.refused.user_busy += o.refused.user_busy;
        self.ended += o.ended;
        self.hold_errors += o.hold_errors;
        self.decision_errors += o.decision_errors;
        for (u, n) in o.per_user {
            *self.per_user.entry(u).or_default() += n;
        }
        self.last_deadline = self.last_deadline.max(o.last_deadline);
    }

    fn refusal(&mut self, d: &Deduction) -> Result<(), String> {
        let r = &mut self.refused;
        match d {
            Deduction::SoldOut => r.sold_out += 1,
            Deduction::Insufficient { .. } => r.insufficient += 1,
            Deduction::LimitReached { .. } => r.limit_reached += 1,
            Deduction::OverLimit { .. } => r.over_limit += 1,
            Deduction::UserBusy => r.user_busy += 1,
            other => return Err(format!("an order refused as {:?}", other.kind())),
        }
        Ok(())
    }

    fn later(&mut self, t: Instant) {
        self.last_deadline = self.last_deadline.max(Some(t));
    }
}

fn note(first_error: &OnceLock<String>, msg: String) {
    tracing::debug!(error = %msg, "order call failed");
    if first_error.set(msg.clone()).is_ok() {
        tracing::warn!(error = %msg, "first order error (the run goes on)");
    }
}

/// The order of request `i`: user `u<i % users>`, request id `<run id>-<i>`.
fn order_id(run_id: &str, i: u64, users: u64) -> Result<OrderId, shardstock::Error> {
    OrderId::new(
        UserId::new(format!("u{}", i % users))?,
        RequestId::new(format!("{run_id}-{i}"))?,
    )
}

/// Runs the cart sale; see [`SimArgs::cart`].
pub(super) async fn run_cart<S: Store>(
    engine: Engine<S>,
    a: SimArgs,
    n: usize,
    json: bool,
) -> Result<ExitCode, Failure> {
    let strategy = engine.store().strategy();
    if !strategy.exactly_once() {
        return Err(Failure::config(format!(
            "--cart needs the lua, lock or redlock strategy, not {strategy}"
        )));
    }
    let skus = (1..=n)
        .map(|k| Sku::new(format!("{}-{k}", a.sku)))
        .collect::<Result<Vec<_>, _>>()?;
    let opts = engine.options();
    if a.qty > opts.max_qty {
        return Err(Failure::new(format!(
            "--qty {} is above the engine's max_qty {} (engine.max_qty in the config)",
            a.qty, opts.max_qty
        )));
    }
    if Duration::from_millis(a.hold_ms) > opts.request_ttl {
        return Err(Failure::new(format!(
            "--hold-ms {} is longer than the engine's request TTL ({} ms)",
            a.hold_ms,
            opts.request_ttl.as_millis()
        )));
    }
    if !(0.0..=1.0).contains(&a.confirm_ratio) {
        return Err(Failure::new("--confirm-ratio must be between 0 and 1"));
    }
    let run_id = run_id(a.run_id.as_deref())?;
    if format!("{run_id}-{}", a.requests - 1).len() > MAX_ORDER_REQUEST_ID_LEN {
        return Err(Failure::new(format!(
            "--run-id: an order's request id has at most {MAX_ORDER_REQUEST_ID_LEN} bytes"
        )));
    }
    let check_only = a.check_only;
    if !check_only {
        let limit = a.per_user_limit.unwrap_or(engine.options().per_user_limit);
        for sku in &skus {
            engine
                .load(
                    sku,
                    a.stock,
                    shardstock::LoadOptions::new(a.segments)
                        .replace(true)
                        .per_user_limit(limit)
                        .outbox(a.outbox.unwrap_or(engine.options().outbox)),
                )
                .await?;
        }
    }

    // The sale: every buyer one cart; the orders left to expire are the sweeper's (and,
    // after the last deadline, this run's own sweeps).
    let sweeper = (!check_only).then(|| engine.start_sweeper(Duration::from_millis(100)));
    let _audit = engine.start_live_audit(Duration::from_secs(1), skus.clone());
    let next = Arc::new(AtomicU64::new(0));
    let bar = if check_only {
        None
    } else {
        progress(json, Some(a.requests), "orders", &next)
    };
    let first_error = Arc::new(OnceLock::<String>::new());
    let workers = if check_only {
        0
    } else {
        a.concurrency.min(a.requests)
    };
    let started = Instant::now();
    let mut handles = Vec::with_capacity(workers as usize);
    for _ in 0..workers {
        let engine = engine.clone();
        let next = Arc::clone(&next);
        let first_error = Arc::clone(&first_error);
        let (run_id, skus) = (run_id.clone(), skus.clone());
        let (users, qty, requests, rate) = (a.users, a.qty, a.requests, a.rate);
        let (hold, confirm_ratio) = (Duration::from_millis(a.hold_ms), a.confirm_ratio);
        handles.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut hist = new_histogram();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    break;
                }
                if rate > 0 {
                    let due = started + Duration::from_secs_f64(i as f64 / rate as f64);
                    tokio::time::sleep_until(due.into()).await;
                }
                tally.sent += 1;
                let id = match order_id(&run_id, i, users) {
                    Ok(id) => id,
                    Err(e) => {
                        tally.hold_errors += 1;
                        note(&first_error, e.to_string());
                        continue;
                    }
                };
                let cart = Cart {
                    user: id.user().clone(),
                    request_id: id.request_id().clone(),
                    items: skus
                        .iter()
                        .map(|sku| CartItem {
                            sku: sku.clone(),
                            qty,
                        })
                        .collect(),
                    hold,
                };
                let t0 = Instant::now();
                let r = engine.hold_order(&cart).await;
                let now = Instant::now();
                let us = u64::try_from(now.duration_since(t0).as_micros()).unwrap_or(u64::MAX);
                hist.saturating_record(us.max(1));
                match r {
                    Ok(OrderHold::Held { left_ms, .. }) => {
                        tally.held += 1;
                        tally.later(now + Duration::from_millis(left_ms));
                    }
                    Ok(OrderHold::Refused { reason, .. }) => {
                        if let Err(e) = tally.refusal(&reason) {
                            tally.hold_errors += 1;
                            note(&first_error, e);
                        }
                        continue;
                    }
                    Ok(OrderHold::Ended { state, .. }) => {
                        // Decided before the hold finished: the deadline passed while the
                        // items were being held (a fresh request id is no retry).
                        tally.ended += 1;
                        if state == OrderState::Expired {
                            tally.expired_holding += 1;
                        }
                        continue;
                    }
                    Ok(other) => {
                        tally.hold_errors += 1;
                        note(&first_error, format!("unknown order outcome {other:?}"));
                        continue;
                    }
                    Err(e) => {
                        // Unknown: items may be held until the deadline settles them.
                        tally.hold_errors += 1;
                        tally.later(now + hold);
                        note(&first_error, e.to_string());
                        continue;
                    }
                }
                // The order's fate: a second draw, from its id.
                let fate = (shardstock::segments::fnv1a(id.to_string().as_bytes()) % 10_000) as f64
                    / 10_000.0;
                let (confirm, cancel) = (
                    fate < confirm_ratio,
                    fate < confirm_ratio + (1.0 - confirm_ratio) / 2.0,
                );
                if !cancel {
                    tally.left_to_expire += 1;
                    continue;
                }
                let r = if confirm {
                    engine.confirm_order(&id).await
                } else {
                    engine.cancel_order(&id).await
                };
                match r.map(|e| e.map(|e| e.state)) {
                    Ok(Some(OrderState::Confirmed)) if confirm => {
                        tally.confirmed += 1;
                        *tally.per_user.entry(i % users).or_default() += qty;
                    }
                    Ok(Some(OrderState::Cancelled)) if !confirm => tally.cancelled += 1,
                    Ok(Some(OrderState::Expired)) if confirm => tally.confirm_late += 1,
                    Ok(Some(OrderState::Expired)) => tally.cancel_late += 1,
                    Ok(other) => {
                        tally.decision_errors += 1;
                        note(
                            &first_error,
                            format!(
                                "order {id}: {} answered {other:?}",
                                if confirm { "confirm" } else { "cancel" }
                            ),
                        );
                    }
                    Err(e) => {
                        tally.decision_errors += 1;
                        note(&first_error, e.to_string());
                    }
                }
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
        tally.merge(t);
        hist.add(&wh)
            .map_err(|e| Failure::new(format!("cannot merge latency histograms: {e:?}")))?;
    }
    let elapsed = started.elapsed().max(Duration::from_nanos(1));
    if let Some((bar, task)) = bar {
        task.abort();
        bar.finish_and_clear();
    }

    // After the last deadline: sweep until nothing is reserved, then read everything back.
    let mut unchecked = Vec::new();
    let mut sweeps = 0;
    if let Some(deadline) = tally.last_deadline {
        tokio::time::sleep_until((deadline + Duration::from_millis(50)).into()).await;
    }
    drop(sweeper);
    let audits = loop {
        if !check_only {
            sweeps += 1;
            if let Err(e) = engine.sweep().await {
                tracing::warn!(error = %e, "sweep after the deadline failed");
            }
        }
        let mut audits = Vec::with_capacity(skus.len());
        for sku in &skus {
            match engine.audit(sku).await {
                Ok(a) => audits.push(a),
                Err(e) => {
                    unchecked.push(format!("the audit of {sku}: {e}"));
                    break;
                }
            }
        }
        if audits.len() < skus.len() {
            break None;
        }
        let busy = audits.iter().any(|a| a.live_reserved() + a.in_transit > 0);
        if check_only || !busy || sweeps >= MAX_SWEEPS {
            break Some(audits);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut homes = Vec::with_capacity(skus.len());
    for sku in &skus {
        match Homes::read(&engine, sku).await {
            Ok(h) => homes.push(h),
            Err(e) => {
                unchecked.push(format!("the layout of {sku}: {e}"));
                break;
            }
        }
    }
    let found = if homes.len() == skus.len() {
        match check_orders(&engine, &homes, &run_id, a.requests, a.users, a.qty).await {
            Ok(f) => Some(f),
            Err(e) => {
                unchecked.push(format!("reading the orders back: {e}"));
                None
            }
        }
    } else {
        None
    };

    let report = report(
        &engine,
        &a,
        n,
        run_id,
        workers,
        tally,
        &hist,
        elapsed,
        sweeps,
        audits,
        found,
        unchecked,
        first_error.get().cloned(),
    );
    if json {
        crate::print_json(&report)?;
    } else {
        print_human(&report)?;
    }
    let cart_ok = report.cart.as_ref().is_some_and(|c| c.ok);
    Ok(
        if report.oversold.is_some_and(|o| o > 0)
            || report.audit_ok == Some(false)
            || (!cart_ok && report.unchecked.is_empty())
        {
            ExitCode::from(crate::failure::CHECK_FAILED)
        } else if !report.unchecked.is_empty() {
            ExitCode::from(crate::failure::STORE) // the report says what could not be checked
        } else {
            ExitCode::SUCCESS
        },
    )
}
