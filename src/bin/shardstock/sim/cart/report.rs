//! The report of a cart sale: the workers' tally, the audits after the last deadline and what
//! reading the orders back found, folded into the sim's `Report` (the one `sim/report.rs`
//! prints as JSON or text), with the checks whose verdict decides the exit code. It computes
//! only: nothing here calls the store but for its name, strategy and figures.

use super::Tally;
use super::check::Found;
use crate::sim::report::{CartChecks, CartReport, CartSku, Report};
use crate::sim::{SimArgs, coalescing_report, ms, round};
use shardstock::{Audit, Engine, Store};
use std::time::Duration;

/// Units a buyer can be sold now (what `remaining` says for one SKU).
fn sellable(a: &Audit) -> u64 {
    a.sellable_per_segment().iter().sum()
}

/// The report of a cart sale: the sale's figures, the records, the checks.
#[allow(clippy::too_many_arguments)]
pub(super) fn report<S: Store>(
    engine: &Engine<S>,
    a: &SimArgs,
    n: usize,
    run_id: String,
    workers: u64,
    t: Tally,
    hist: &hdrhistogram::Histogram<u64>,
    elapsed: Duration,
    sweeps: u32,
    audits: Option<Vec<Audit>>,
    found: Option<Found>,
    unchecked: Vec<String>,
    first_error: Option<String>,
) -> Report {
    let qty = a.qty;
    let sum = |f: fn(&Audit) -> u64| audits.as_ref().map(|v| v.iter().map(f).sum::<u64>());
    let per_segment = audits.as_ref().map(|v| {
        let mut out = vec![0u64; v.first().map_or(0, |a| a.segments.len())];
        for a in v {
            for (o, x) in out.iter_mut().zip(a.sellable_per_segment()) {
                *o += x;
            }
        }
        out
    });
    let (reserved, in_transit) = (sum(Audit::live_reserved), sum(|a| a.in_transit));
    let audit_ok = audits.as_ref().map(|v| v.iter().all(|a| a.ok));
    let confirmed_records = found.as_ref().map(|f| f.records.confirmed);
    let checks = CartChecks {
        items_one_state: found.as_ref().is_some_and(|f| f.split == 0),
        audit_ok: audit_ok == Some(true),
        nothing_in_transit: in_transit == Some(0),
        nothing_reserved: reserved == Some(0),
        sold_is_confirmed: match (&audits, confirmed_records) {
            (Some(v), Some(c)) => v.iter().all(|a| a.sold == c * qty),
            _ => false,
        },
        answers_match_records: (!a.check_only && t.hold_errors + t.decision_errors == 0)
            .then(|| confirmed_records == Some(t.confirmed)),
    };
    let ok = checks.items_one_state
        && checks.audit_ok
        && checks.nothing_in_transit
        && checks.nothing_reserved
        && checks.sold_is_confirmed
        && checks.answers_match_records != Some(false)
        && unchecked.is_empty();
    let elapsed_s = elapsed.as_secs_f64();
    let orders_per_s = if a.check_only {
        0.0
    } else {
        round(t.sent as f64 / elapsed_s, 1)
    };
    let found = found.unwrap_or_default();
    let skus = audits
        .as_ref()
        .map(|v| {
            v.iter()
                .map(|a| CartSku {
                    sku: a.sku.clone(),
                    generation: a.generation,
                    segments: a.segments.len(),
                    loaded: a.loaded,
                    restocked: a.restocked,
                    sold: a.sold,
                    remaining: sellable(a),
                    reserved: a.live_reserved(),
                    in_transit: a.in_transit,
                    audit_ok: a.ok,
                    audit_problems: a.problems.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    let cart = CartReport {
        items: n,
        hold_ms: a.hold_ms,
        check_only: a.check_only,
        orders: t.sent,
        held: t.held,
        confirmed: t.confirmed,
        cancelled: t.cancelled,
        expired: t.left_to_expire + t.confirm_late + t.cancel_late + t.expired_holding,
        confirmed_too_late: t.confirm_late,
        expired_before_held: t.expired_holding,
        refused: t.refused.total(),
        ended: t.ended,
        hold_errors: t.hold_errors,
        decision_errors: t.decision_errors,
        orders_per_s,
        sweeps,
        records: found.records,
        items_checked: found.items,
        orders_split: found.split,
        problems: found.problems,
        checks,
        ok,
        skus,
        refused_by_reason: t.refused,
    };
    let r = &cart.refused_by_reason;
    Report {
        sku: audits.as_ref().map_or_else(
            || format!("{}-1..{}-{n}", a.sku, a.sku),
            |v| {
                v.iter()
                    .map(|a| a.sku.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            },
        ),
        store: engine.store().name(),
        strategy: engine.store().strategy(),
        strategy_safe: engine.store().strategy().exactly_once(),
        lock: engine.store().lock_figures(),
        coalescing: coalescing_report(engine),
        run_id,
        generation: audits
            .as_ref()
            .and_then(|v| v.first())
            .map(|a| a.generation),
        segments: audits
            .as_ref()
            .and_then(|v| v.first())
            .map_or(0, |a| a.segments.len()),
        requests: if a.check_only { 0 } else { a.requests },
        users: a.users,
        qty,
        concurrency: workers,
        applied: t.held,
        sold_units: t.confirmed * qty * n as u64,
        sold_out: r.sold_out,
        insufficient: r.insufficient,
        replayed: t.ended,
        limit_reached: r.limit_reached + r.over_limit,
        user_busy: r.user_busy,
        max_units_per_user: t.per_user.values().copied().max().unwrap_or(0),
        reservations_confirmed_units: 0,
        reservations_cancelled_units: 0,
        reservations_expired_units: 0,
        reserved,
        in_transit,
        errors: t.hold_errors,
        first_error,
        remaining: sum(sellable),
        remaining_per_segment: per_segment,
        loaded: sum(|a| a.loaded),
        restocked: sum(|a| a.restocked),
        sold: sum(|a| a.sold),
        oversold: audits.as_ref().map(|v| {
            v.iter()
                .map(|a| a.sold.saturating_sub(a.loaded.saturating_add(a.restocked)))
                .sum()
        }),
        audit_ok,
        audit_problems: audits
            .as_ref()
            .map(|v| {
                v.iter()
                    .flat_map(|a| a.problems.iter().map(move |p| format!("{}: {p}", a.sku)))
                    .collect()
            })
            .unwrap_or_default(),
        unchecked,
        elapsed_s: round(elapsed_s, 6),
        throughput_per_s: orders_per_s,
        p50_ms: ms(hist.value_at_quantile(0.50)),
        p99_ms: ms(hist.value_at_quantile(0.99)),
        p999_ms: ms(hist.value_at_quantile(0.999)),
        max_ms: ms(hist.max()),
        cart: Some(cart),
    }
}
