//! Every metric the library emits — names, help texts and units in one place ([`describe`]
//! registers them), so the Grafana dashboard can be checked against this list — and the
//! functions that record them. The lock metrics are named here too (`lock::metric_names`
//! re-exports them under short names).
//!
//! The library only *records* through the [`metrics`] facade; it never installs a recorder —
//! the binary (or your service) decides where metrics go. Without a recorder every call here
//! is a cheap no-op.
//!
//! Label cardinality is bounded by construction: small fixed sets ([`ERROR_KINDS`], ...),
//! segment indexes and, for per-SKU gauges, only SKUs the service opted in to (see
//! [`SkuLabels`]); never a user or request id.
//!
//! This file records plain values (counts, durations, figures the caller computed); the names
//! and their descriptions are in `metrics/names.rs`, the label values in `metrics/labels.rs`.
//! The module imports nothing of the crate but `crate::error`: it sits below what it measures.

mod labels;
mod names;

pub use labels::{ERROR_KINDS, SkuLabels, error_label};
pub(crate) use labels::{OUTCOMES, STRATEGIES};
pub use names::*;

use metrics::{counter, gauge};
use std::time::Duration;

/// The metric keys a deduction records, built once: the `counter!`/`histogram!` macros build
/// a key (a label vector) on every call, which was an allocation or two per deduction even
/// with no recorder installed. The recorder is still asked for each handle per call (a local
/// recorder in tests, the global one, or none), so the keys and labels are exactly the
/// macros'.
struct DeductKeys {
    /// `DEDUCTIONS{outcome, strategy}`, by outcome index × strategy index.
    deductions: Vec<metrics::Key>,
    /// `DEDUCT_SECONDS{strategy}`, by strategy index.
    seconds: Vec<metrics::Key>,
    attempts: metrics::Key,
    replays: metrics::Key,
}

fn deduct_keys() -> &'static DeductKeys {
    use metrics::{Key, Label};
    static KEYS: std::sync::OnceLock<DeductKeys> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let strategies = STRATEGIES;
        DeductKeys {
            deductions: OUTCOMES
                .iter()
                .flat_map(|o| {
                    strategies.iter().map(move |s| {
                        Key::from_parts(
                            DEDUCTIONS,
                            vec![Label::new("outcome", *o), Label::new("strategy", *s)],
                        )
                    })
                })
                .collect(),
            seconds: strategies
                .iter()
                .map(|s| Key::from_parts(DEDUCT_SECONDS, vec![Label::new("strategy", *s)]))
                .collect(),
            attempts: Key::from_static_name(SEGMENT_ATTEMPTS),
            replays: Key::from_static_name(REPLAYS),
        }
    })
}

/// Where the macros' records say they come from.
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// One deduction: its outcome (index in [`OUTCOMES`]; `replayed` when it was a replay), the
/// strategy (index in [`STRATEGIES`]), its latency and the segment calls it made.
pub(crate) fn deduction(o: usize, replayed: bool, s: usize, took: Duration, attempts: u32) {
    let keys = deduct_keys();
    let n = STRATEGIES.len();
    let (o, s) = (o.min(OUTCOMES.len() - 1), s.min(n - 1));
    metrics::with_recorder(|r| {
        r.register_counter(&keys.deductions[o * n + s], &METADATA)
            .increment(1);
        r.register_histogram(&keys.seconds[s], &METADATA)
            .record(took.as_secs_f64());
        r.register_histogram(&keys.attempts, &METADATA)
            .record(f64::from(attempts));
        if replayed {
            r.register_counter(&keys.replays, &METADATA).increment(1);
        }
    });
}

pub(crate) fn error(e: &crate::error::Error) {
    counter!(ERRORS, "kind" => error_label(e.kind())).increment(1);
}

/// One HTTP request answered (`http/meter.rs`); `took` is `None` for requests no route
/// matched.
#[cfg(feature = "http")]
pub(crate) fn http_request(route: String, method: &str, status: u16, took: Option<Duration>) {
    let method = method.to_string();
    if let Some(took) = took {
        metrics::histogram!(HTTP_SECONDS, "route" => route.clone()).record(took.as_secs_f64());
    }
    counter!(HTTP_REQUESTS, "route" => route, "method" => method, "status" => status.to_string())
        .increment(1);
}

pub(crate) fn coalesced_batch(requests: usize) {
    counter!(COALESCED_CALLS).increment(1);
    counter!(COALESCED_REQUESTS).increment(requests as u64);
}

/// One poll of the order consumer: events handled, failed, delivered again, dead-lettered.
pub(crate) fn orders_polled(handled: u64, failed: u64, redelivered: u64, dead: u64) {
    if handled > 0 {
        counter!(ORDERS_HANDLED).increment(handled);
    }
    if failed > 0 {
        counter!(ORDERS_FAILED).increment(failed);
    }
    if redelivered > 0 {
        counter!(ORDERS_REDELIVERIES).increment(redelivered);
    }
    if dead > 0 {
        counter!(ORDERS_DEAD_LETTERS).increment(dead);
    }
}

/// Consumer group `group`'s lag: events appended, pending, undelivered, the oldest pending's
/// age.
pub(crate) fn orders_lag(
    group: &str,
    appended: u64,
    pending: u64,
    undelivered: u64,
    oldest_pending: Option<Duration>,
) {
    let group = group.to_string();
    gauge!(OUTBOX_APPENDED, "group" => group.clone()).set(appended as f64);
    gauge!(ORDERS_PENDING, "group" => group.clone()).set(pending as f64);
    gauge!(ORDERS_UNDELIVERED, "group" => group.clone()).set(undelivered as f64);
    gauge!(ORDERS_OLDEST_PENDING, "group" => group)
        .set(oldest_pending.map_or(0.0, |d| d.as_secs_f64()));
}

pub(crate) fn wait_shortfall() {
    counter!(WAIT_SHORTFALLS).increment(1);
}

pub(crate) fn script_reload(script: &'static str) {
    counter!(SCRIPT_RELOADS, "script" => script).increment(1);
}

/// One pass through the in-process guard: turned away (`hit`) or not, the guard's evictions so
/// far and its entries now.
pub(crate) fn guard(hit: bool, evictions: u64, entries: usize) {
    if hit {
        counter!(GUARD_HITS).increment(1);
    } else {
        counter!(GUARD_MISSES).increment(1);
    }
    counter!(GUARD_EVICTIONS).absolute(evictions);
    gauge!(GUARD_ENTRIES).set(entries as f64);
}

pub(crate) fn reservation(event: &'static str) {
    counter!(RESERVATIONS, "event" => event).increment(1);
}

pub(crate) fn order_event(event: &'static str) {
    counter!(ORDERS, "event" => event).increment(1);
}

pub(crate) fn reserved(labels: &SkuLabels, sku: &str, units: u64) {
    let label = labels.label(sku);
    if label != "other" {
        gauge!(RESERVED_UNITS, "sku" => label).set(units as f64);
    }
}

pub(crate) fn reservations_expired(units: u64) {
    counter!(RESERVATION_EXPIRED_UNITS).increment(units);
}

pub(crate) fn fallback() {
    counter!(FALLBACKS).increment(1);
}

pub(crate) fn transfer() {
    counter!(TRANSFERS).increment(1);
}

pub(crate) fn transfers_credited(units: u64) {
    counter!(TRANSFER_DRAINED_UNITS).increment(units);
}

/// A sold-out answer given from memory (`engine/sold_out.rs`): no read, nothing written.
pub(crate) fn sold_out_from_memory() {
    counter!(SOLD_OUT_FROM_MEMORY).increment(1);
}

/// The stock gauges of `sku` from a read of every segment (`engine/look.rs`): units a buyer
/// can be sold per segment and in total, in transit, held by live reservations.
pub(crate) fn stock(
    labels: &SkuLabels,
    sku: &str,
    per_segment: &[u64],
    in_transit: u64,
    reserved: u64,
) {
    let label = labels.label(sku);
    if label == "other" {
        return; // not opted in: a sum over unrelated SKUs would mean nothing
    }
    let total = per_segment.iter().fold(0u64, |t, u| t.saturating_add(*u));
    gauge!(REMAINING_UNITS, "sku" => label.clone()).set(total as f64);
    gauge!(IN_TRANSIT_UNITS, "sku" => label.clone()).set(in_transit as f64);
    gauge!(RESERVED_UNITS, "sku" => label.clone()).set(reserved as f64);
    for (i, units) in per_segment.iter().enumerate() {
        gauge!(SEGMENT_REMAINING_UNITS, "sku" => label.clone(), "segment" => i.to_string())
            .set(*units as f64);
    }
    // Segments the SKU no longer has (a reload with fewer, or its data vanished) hold nothing.
    let before = labels.swap_segments(label.clone(), per_segment.len());
    for i in per_segment.len()..before {
        gauge!(SEGMENT_REMAINING_UNITS, "sku" => label.clone(), "segment" => i.to_string())
            .set(0.0);
    }
}

pub(crate) fn store_up(up: bool, refusing_writes: u64) {
    gauge!(STORE_UP).set(if up { 1.0 } else { 0.0 });
    gauge!(STORE_REFUSING).set(refusing_writes as f64);
}

pub(crate) fn audit_sku(labels: &SkuLabels, sku: &str, ok: bool) {
    let label = labels.label(sku);
    if label != "other" {
        gauge!(AUDIT_OK, "sku" => label).set(if ok { 1.0 } else { 0.0 });
    }
}

/// One round of the live audit, as its figures (`crate::live_audit` fills them).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AuditRound {
    pub audited: u64,
    pub failing: u64,
    pub vanished: u64,
    pub not_ready: u64,
    pub unaccounted: u64,
    pub excess: u64,
    pub errors: u64,
}

pub(crate) fn audit_round(r: &AuditRound, unix_seconds: Option<f64>) {
    gauge!(AUDIT_SKUS).set(r.audited as f64);
    gauge!(AUDIT_FAILING).set(r.failing as f64);
    gauge!(AUDIT_VANISHED).set(r.vanished as f64);
    gauge!(AUDIT_NOT_READY).set(r.not_ready as f64);
    gauge!(AUDIT_UNACCOUNTED).set(r.unaccounted as f64);
    gauge!(AUDIT_EXCESS).set(r.excess as f64);
    counter!(AUDIT_ERRORS).increment(r.errors); // registered at zero: a series to alert on
    if let Some(t) = unix_seconds {
        gauge!(AUDIT_LAST_RUN).set(t);
    }
}
