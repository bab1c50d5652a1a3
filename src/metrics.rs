//! Every metric the library emits: names, help texts and units in one place, so the Grafana
//! dashboard can be checked against this list (and vice versa). The lock metrics are the one
//! exception: their names live with the locks (`lock::metric_names`); [`describe`] describes
//! them too.
//!
//! The library only *records* through the [`metrics`] facade; it never installs a recorder —
//! the binary (or your service) decides where metrics go. Without a recorder every call here
//! is a cheap no-op.
//!
//! Label cardinality is bounded by construction: labels are outcomes, strategies, error kinds,
//! script names and reservation events (small fixed sets), segment indexes and, for per-SKU
//! gauges, only SKUs the service opted in to (see [`SkuLabels`]); never a user or request id.

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge};
use std::time::Duration;

/// Deductions by outcome and strategy (counter).
pub const DEDUCTIONS: &str = "shardstock_deductions_total";
/// Deduction latency in seconds, by strategy (histogram; buckets 50 µs – 1 s set by the
/// binary's exporter).
pub const DEDUCT_SECONDS: &str = "shardstock_deduct_duration_seconds";
/// Segment attempts (store steps that could take stock) per deduction (histogram).
pub const SEGMENT_ATTEMPTS: &str = "shardstock_segment_attempts";
/// Deductions that left their home segment for others (counter).
pub const FALLBACKS: &str = "shardstock_fallbacks_total";
/// Transfers sent: units moved from a donor segment to a request's home (counter).
pub const TRANSFERS: &str = "shardstock_transfers_total";
/// Units in transit credited home by a drain — the sweeper, or a request that would otherwise
/// answer sold out — rather than by the engine that moved them (counter).
pub const TRANSFER_DRAINED_UNITS: &str = "shardstock_transfer_drained_units_total";
/// Sold-out answers given from memory after a proven sell-out: no read, nothing written
/// (counter; `engine/sold_out.rs`).
pub const SOLD_OUT_FROM_MEMORY: &str = "shardstock_sold_out_from_memory_total";
/// Deductions answered from an earlier outcome of the same request id (counter).
pub const REPLAYS: &str = "shardstock_request_replays_total";
/// Units a buyer can be sold now per opted-in SKU (gauge, label `sku`; SKUs not opted in are
/// not reported, see [`SkuLabels`]): what [`Engine::remaining`](crate::Engine::remaining)
/// answers, set by every read of all the SKU's segments (the live audit's rounds, `status`,
/// `audit`).
pub const REMAINING_UNITS: &str = "shardstock_remaining_units";
/// Units a buyer can be sold now per segment of opted-in SKUs (gauge, labels `sku`,
/// `segment`), set with [`REMAINING_UNITS`].
pub const SEGMENT_REMAINING_UNITS: &str = "shardstock_segment_remaining_units";
/// Units moving between segments per opted-in SKU (debited at a donor, not yet credited
/// home; gauge, label `sku`), set with [`REMAINING_UNITS`].
pub const IN_TRANSIT_UNITS: &str = "shardstock_in_transit_units";
/// `SCRIPT LOAD`s after a `NOSCRIPT` reply (Redis restarted, failed over or flushed its script
/// cache), by script (counter).
pub const SCRIPT_RELOADS: &str = "shardstock_script_reloads_total";
/// Coalesced deduction script calls sent (counter; request coalescing).
pub const COALESCED_CALLS: &str = "shardstock_coalesced_calls_total";
/// Deductions carried by coalesced script calls (counter; divided by the calls: mean batch).
pub const COALESCED_REQUESTS: &str = "shardstock_coalesced_requests_total";
/// Per-user attempts turned away by the in-process guard (counter).
pub const GUARD_HITS: &str = "shardstock_user_guard_hits_total";
/// Per-user attempts the in-process guard passed on to the store (counter).
pub const GUARD_MISSES: &str = "shardstock_user_guard_misses_total";
/// In-process guard entries evicted to honour its cap (counter, absolute from the guard).
pub const GUARD_EVICTIONS: &str = "shardstock_user_guard_evictions_total";
/// In-process guard entries held (gauge).
pub const GUARD_ENTRIES: &str = "shardstock_user_guard_entries";
/// Reservation events: created, confirmed, cancelled (counter, label `event`).
pub const RESERVATIONS: &str = "shardstock_reservations_total";
/// Orders (carts) by event: held, confirmed, cancelled, expired, refused (counter, label
/// `event`; each decided once, counted by the instance that decided it).
pub const ORDERS: &str = "shardstock_orders_total";
/// Units returned by expired reservations (counter).
pub const RESERVATION_EXPIRED_UNITS: &str = "shardstock_reservation_expired_units_total";
/// Units held by live reservations per opted-in SKU (gauge, label `sku`; set with
/// [`REMAINING_UNITS`] and by the sweeper).
pub const RESERVED_UNITS: &str = "shardstock_reserved_units";
/// Durability mode: calls answered [`crate::Error::NotDurable`] because their `WAIT` came back
/// with fewer replica acknowledgements than `store.wait_replicas` within
/// `store.wait_timeout_ms` (counter; one grouped `WAIT` that falls short counts once per call
/// it covered).
pub const WAIT_SHORTFALLS: &str = "shardstock_wait_shortfalls_total";
/// Outbox events ever appended to the streams an order consumer reads (gauge, label `group`;
/// `XINFO STREAM` entries-added, refreshed by the consumer).
pub const OUTBOX_APPENDED: &str = "shardstock_outbox_events_appended";
/// Outbox events handled and acknowledged by this process's order consumer (counter).
pub const ORDERS_HANDLED: &str = "shardstock_orders_handled_total";
/// Outbox events whose handler failed (left pending for a later delivery; counter).
pub const ORDERS_FAILED: &str = "shardstock_orders_handler_failures_total";
/// Deliveries after the first: claimed from a dead consumer or after a failure (counter).
pub const ORDERS_REDELIVERIES: &str = "shardstock_orders_redeliveries_total";
/// Outbox events moved to a dead-letter stream (counter).
pub const ORDERS_DEAD_LETTERS: &str = "shardstock_orders_dead_letters_total";
/// Outbox events delivered to the group and not yet acknowledged (gauge, label `group`).
pub const ORDERS_PENDING: &str = "shardstock_orders_pending";
/// Outbox events not yet delivered to the group (gauge, label `group`).
pub const ORDERS_UNDELIVERED: &str = "shardstock_orders_undelivered";
/// Age of the group's oldest pending outbox event, 0 when none (gauge, label `group`).
pub const ORDERS_OLDEST_PENDING: &str = "shardstock_orders_oldest_pending_seconds";
/// Errors returned to callers of a deduction or reservation, by kind (counter, label `kind`:
/// one of [`ERROR_KINDS`], see [`error_label`]).
pub const ERRORS: &str = "shardstock_errors_total";
/// Live audit ([`crate::live_audit`]): 1 when the SKU's last audit passed, 0 when it failed
/// (gauge, label `sku`; opted-in SKUs only, see [`SkuLabels`] — every audited SKU counts in
/// [`AUDIT_FAILING`]).
pub const AUDIT_OK: &str = "shardstock_audit_ok";
/// Live audit: SKUs whose last audit failed, over every audited SKU (gauge, no label).
pub const AUDIT_FAILING: &str = "shardstock_audit_failing_skus";
/// Live audit: SKUs this engine saw loaded and ready whose metadata is gone (Redis restarted
/// empty or lost data in a failover; gauge, no label): counted in [`AUDIT_FAILING`] too,
/// until the SKU is loaded again.
pub const AUDIT_VANISHED: &str = "shardstock_audit_vanished_skus";
/// Live audit: SKUs whose metadata says a load is under way (not ready; gauge, no label).
pub const AUDIT_NOT_READY: &str = "shardstock_audit_not_ready_skus";
/// Live audit: SKUs audited in the last round (gauge).
pub const AUDIT_SKUS: &str = "shardstock_audit_skus";
/// Live audit: units unaccounted for, `|loaded + restocked + moved_in − remaining − reserved −
/// sold − moved_out|` per segment ([`Balance::unaccounted`](crate::store::Balance)), summed
/// over the segments of every audited SKU (gauge).
pub const AUDIT_UNACCOUNTED: &str = "shardstock_audit_unaccounted_units";
/// Live audit: units counted beyond what came in (`remaining + reserved + sold + moved_out −
/// loaded − restocked − moved_in` where positive, [`Balance::excess`](crate::store::Balance)),
/// summed like [`AUDIT_UNACCOUNTED`]: stock that can be (or was) sold twice (gauge).
pub const AUDIT_EXCESS: &str = "shardstock_audit_excess_units";
/// Live audit: Unix time of the last round in which every SKU was read (gauge, seconds).
pub const AUDIT_LAST_RUN: &str = "shardstock_audit_last_run_timestamp_seconds";
/// Live audit: 1 when the store answered the look at its servers that starts each round
/// ([`Engine::readiness`](crate::Engine::readiness)), 0 when it did not (gauge).
pub const STORE_UP: &str = "shardstock_store_up";
/// Live audit: the store's masters that answered but refuse writes (`NOREPLICAS`, `OOM`,
/// `MISCONF`, `READONLY`), as the round's look found them (gauge).
pub const STORE_REFUSING: &str = "shardstock_store_servers_refusing_writes";
/// Live audit: audits that could not read a SKU (store errors; counter).
pub const AUDIT_ERRORS: &str = "shardstock_audit_errors_total";

/// HTTP requests answered by the mounted router ([`crate::http`]), by `route` (the matched
/// path template, `unmatched` for none), `method` and `status` (counter).
pub const HTTP_REQUESTS: &str = "shardstock_http_requests_total";
/// HTTP request latency in seconds, by `route` (histogram; buckets 50 µs – 1 s set by the
/// binary's exporter).
pub const HTTP_SECONDS: &str = "shardstock_http_request_duration_seconds";

/// Lock acquisitions (counter; the lock strategies, `crate::lock`).
pub const LOCK_ACQUIRED: &str = "shardstock_lock_acquired_total";
/// Acquisition attempts that found the lock taken: queued behind a holder in this process, or
/// refused by Redis (counter).
pub const LOCK_CONTENDED: &str = "shardstock_lock_contended_total";
/// Acquisitions that gave up after the wait (counter).
pub const LOCK_TIMEOUTS: &str = "shardstock_lock_timeouts_total";
/// Time spent acquiring, seconds (histogram).
pub const LOCK_WAIT_SECONDS: &str = "shardstock_lock_wait_seconds";
/// Watchdog lease renewals (counter).
pub const LOCK_RENEWALS: &str = "shardstock_lock_renewals_total";
/// Leases found lost (counter).
pub const LOCK_LEASES_LOST: &str = "shardstock_lock_leases_lost_total";
/// Writes refused by the fence token (counter).
pub const LOCK_FENCED: &str = "shardstock_lock_fenced_writes_rejected_total";

/// Registers help texts and units with the installed recorder. Call once after installing it.
pub fn describe() {
    describe_counter!(
        DEDUCTIONS,
        Unit::Count,
        "Deductions by outcome (applied, replayed, sold_out, insufficient, limit_reached, over_limit, user_busy: Deduction::kind) and strategy."
    );
    describe_histogram!(
        DEDUCT_SECONDS,
        Unit::Seconds,
        "Latency of one deduction call, end to end, by strategy."
    );
    describe_histogram!(
        SEGMENT_ATTEMPTS,
        Unit::Count,
        "Segment attempts (store steps that could take stock) per deduction."
    );
    describe_counter!(
        FALLBACKS,
        Unit::Count,
        "Deductions that moved on from their home segment to others."
    );
    describe_counter!(
        TRANSFERS,
        Unit::Count,
        "Transfers sent: units moved from a donor segment to a request's home segment."
    );
    describe_counter!(
        TRANSFER_DRAINED_UNITS,
        Unit::Count,
        "Units in transit credited home by a drain (sweeper, or a request about to answer sold out) instead of by the engine that moved them."
    );
    describe_counter!(
        SOLD_OUT_FROM_MEMORY,
        Unit::Count,
        "Sold-out answers given from memory after a proven sell-out (no round trip, no write)."
    );
    describe_counter!(
        REPLAYS,
        Unit::Count,
        "Deductions answered from the stored outcome of the same request id."
    );
    describe_gauge!(
        REMAINING_UNITS,
        Unit::Count,
        "Units a buyer can be sold now per SKU, as the last read of every segment saw them (opted-in SKUs only)."
    );
    describe_gauge!(
        SEGMENT_REMAINING_UNITS,
        Unit::Count,
        "Units left per segment of opted-in SKUs."
    );
    describe_gauge!(
        IN_TRANSIT_UNITS,
        Unit::Count,
        "Units moving between segments (debited at a donor, not yet credited home), per SKU (opted-in SKUs)."
    );
    describe_counter!(
        SCRIPT_RELOADS,
        Unit::Count,
        "Lua scripts reloaded after a NOSCRIPT reply, by script."
    );
    describe_counter!(
        COALESCED_CALLS,
        Unit::Count,
        "Coalesced deduction script calls sent (request coalescing)."
    );
    describe_counter!(
        COALESCED_REQUESTS,
        Unit::Count,
        "Deductions carried by coalesced script calls (divide by the calls for the mean batch)."
    );
    describe_counter!(ERRORS, Unit::Count, "Errors returned to callers, by kind.");
    describe_counter!(
        WAIT_SHORTFALLS,
        Unit::Count,
        "Durability mode: WAIT calls answered by fewer replicas than store.wait_replicas in time."
    );
    describe_gauge!(
        RESERVED_UNITS,
        Unit::Count,
        "Units held by live reservations, per SKU (opted-in SKUs)."
    );
    describe_counter!(
        RESERVATIONS,
        Unit::Count,
        "Reservations by event: created, confirmed, cancelled."
    );
    describe_counter!(
        ORDERS,
        Unit::Count,
        "Orders (carts) by event: held, confirmed, cancelled, expired, refused."
    );
    describe_counter!(
        RESERVATION_EXPIRED_UNITS,
        Unit::Count,
        "Units returned to stock by expired reservations, as the sweeper's surveys found them (every script returns expired reservations of its segment first; those are not counted)."
    );
    describe_counter!(
        GUARD_HITS,
        Unit::Count,
        "Per-user attempts turned away by the in-process guard (double clicks, known limit)."
    );
    describe_counter!(
        GUARD_MISSES,
        Unit::Count,
        "Per-user attempts passed on to the authoritative guard in the store."
    );
    describe_counter!(
        GUARD_EVICTIONS,
        Unit::Count,
        "In-process guard entries evicted to honour its cap."
    );
    describe_gauge!(
        GUARD_ENTRIES,
        Unit::Count,
        "Entries held by the in-process per-user guard."
    );
    describe_gauge!(
        OUTBOX_APPENDED,
        Unit::Count,
        "Outbox events ever appended to the streams the order consumer reads (XINFO STREAM entries-added)."
    );
    describe_counter!(
        ORDERS_HANDLED,
        Unit::Count,
        "Outbox events handled and acknowledged by this consumer."
    );
    describe_counter!(
        ORDERS_FAILED,
        Unit::Count,
        "Outbox events whose handler failed; they stay pending and are delivered again."
    );
    describe_counter!(
        ORDERS_REDELIVERIES,
        Unit::Count,
        "Outbox deliveries after the first (claimed from a dead consumer, or after a failure)."
    );
    describe_counter!(
        ORDERS_DEAD_LETTERS,
        Unit::Count,
        "Outbox events moved to a dead-letter stream after the last allowed delivery failed."
    );
    describe_gauge!(
        ORDERS_PENDING,
        Unit::Count,
        "Outbox events delivered to the consumer group and not yet acknowledged."
    );
    describe_gauge!(
        ORDERS_UNDELIVERED,
        Unit::Count,
        "Outbox events not yet delivered to the consumer group."
    );
    describe_gauge!(
        ORDERS_OLDEST_PENDING,
        Unit::Seconds,
        "Age of the consumer group's oldest pending outbox event (0 when none)."
    );
    describe_gauge!(
        AUDIT_OK,
        Unit::Count,
        "Live audit: 1 when the SKU's last conservation audit passed, 0 when it failed (opted-in SKUs)."
    );
    describe_gauge!(
        AUDIT_FAILING,
        Unit::Count,
        "Live audit: SKUs whose last conservation audit failed or whose data vanished (all audited SKUs)."
    );
    describe_gauge!(
        AUDIT_VANISHED,
        Unit::Count,
        "Live audit: SKUs this engine saw loaded whose metadata is gone (the store lost data), until loaded again."
    );
    describe_gauge!(
        AUDIT_NOT_READY,
        Unit::Count,
        "Live audit: SKUs whose load is under way (not ready): a moment in a reload, for good when a loader died mid-load."
    );
    describe_gauge!(
        AUDIT_SKUS,
        Unit::Count,
        "Live audit: SKUs audited in the last round."
    );
    describe_gauge!(
        AUDIT_UNACCOUNTED,
        Unit::Count,
        "Live audit: units unaccounted for, |loaded + restocked + moved_in - remaining - reserved - sold - moved_out| summed per segment."
    );
    describe_gauge!(
        AUDIT_EXCESS,
        Unit::Count,
        "Live audit: units counted beyond loaded + restocked + moved_in (stock that can be sold twice), summed per segment."
    );
    describe_gauge!(
        AUDIT_LAST_RUN,
        Unit::Seconds,
        "Live audit: Unix time of the last round that read every SKU."
    );
    describe_gauge!(
        STORE_UP,
        Unit::Count,
        "Live audit: 1 when the store answered the look at its servers that starts each round, 0 when it did not."
    );
    describe_gauge!(
        STORE_REFUSING,
        Unit::Count,
        "Live audit: the store's masters that answer but refuse writes (NOREPLICAS, OOM, MISCONF, READONLY)."
    );
    describe_counter!(
        AUDIT_ERRORS,
        Unit::Count,
        "Live audit: SKU audits that failed to read the store."
    );
    describe_counter!(
        HTTP_REQUESTS,
        Unit::Count,
        "HTTP requests answered by the mounted router, by route (the matched path template), method and status."
    );
    describe_histogram!(
        HTTP_SECONDS,
        Unit::Seconds,
        "HTTP request latency by route, from the request to its response."
    );
    describe_counter!(
        LOCK_ACQUIRED,
        Unit::Count,
        "Distributed lock acquisitions (lock/redlock strategies)."
    );
    describe_counter!(
        LOCK_CONTENDED,
        Unit::Count,
        "Lock attempts that found the lock taken."
    );
    describe_counter!(
        LOCK_TIMEOUTS,
        Unit::Count,
        "Lock acquisitions that gave up after the wait and fell back."
    );
    describe_histogram!(
        LOCK_WAIT_SECONDS,
        Unit::Seconds,
        "Time spent acquiring a lock (successful or not)."
    );
    describe_counter!(LOCK_RENEWALS, Unit::Count, "Watchdog lease renewals.");
    describe_counter!(
        LOCK_LEASES_LOST,
        Unit::Count,
        "Leases found lost by a watchdog or at write time."
    );
    describe_counter!(
        LOCK_FENCED,
        Unit::Count,
        "Writes refused because a newer lock holder bumped the fence token."
    );
    // Counters that may stay at zero for a whole sale (every script returns expired
    // reservations lazily, so the sweeper often finds none; a home is rarely short): exported
    // from the start, so their panels have a series and `rate()` sees the first increment.
    for name in [
        RESERVATION_EXPIRED_UNITS,
        TRANSFERS,
        TRANSFER_DRAINED_UNITS,
        FALLBACKS,
    ] {
        counter!(name).increment(0);
    }
}

/// Which SKUs get their own label value: an explicit list, or the first `cap` seen.
#[derive(Debug, Default)]
pub struct SkuLabels {
    allow: Vec<String>,
    cap: usize,
    seen: dashmap::DashSet<String>,
    /// Per labelled SKU, how many per-segment gauges were last set: a SKU reloaded with fewer
    /// segments (or vanished) zeroes the others rather than leave their old figures.
    segments: dashmap::DashMap<String, usize>,
}

impl SkuLabels {
    /// Label these SKUs, plus up to `cap` more on first sight; the rest get `"other"`, for which
    /// the per-SKU gauges report nothing (a figure summed over unrelated SKUs would mean
    /// nothing).
    pub fn new(allow: Vec<String>, cap: usize) -> Self {
        Self {
            allow,
            cap,
            seen: dashmap::DashSet::new(),
            segments: dashmap::DashMap::new(),
        }
    }

    /// The label value for `sku`: the SKU itself, or `"other"` when it is not opted in.
    pub fn label(&self, sku: &str) -> String {
        if self.allow.iter().any(|a| a == sku) || self.seen.contains(sku) {
            return sku.to_string();
        }
        if self.seen.len() < self.cap {
            self.seen.insert(sku.to_string());
            return sku.to_string();
        }
        "other".to_string()
    }
}

/// Every [`Deduction::kind`](crate::Deduction::kind), in the order of
/// [`Deduction::kind_index`](crate::Deduction) (the `outcome` label of [`DEDUCTIONS`]; a test
/// beside `Deduction` keeps the two in step).
pub(crate) const OUTCOMES: [&str; 7] = [
    "applied",
    "replayed",
    "sold_out",
    "insufficient",
    "limit_reached",
    "user_busy",
    "over_limit",
];

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

/// Every strategy's name, in the order of `Strategy::ALL` (the `strategy` label; a test beside
/// `Strategy` keeps the two in step).
pub(crate) const STRATEGIES: [&str; 6] = [
    "lua",
    "lock",
    "redlock",
    "decr-compensate",
    "local-mutex",
    "naive",
];

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

/// Every value of the `kind` label of [`ERRORS`] (exporters may pre-register them at zero).
pub const ERROR_KINDS: [&str; 9] = [
    "redis",
    "not_durable",
    "no_replicas",
    "lease_lost",
    "conflict",
    "invalid",
    "not_loaded",
    "not_ready",
    "other",
];

/// The `kind` label of [`ERRORS`] for an error of kind `kind`: one of [`ERROR_KINDS`]. The
/// label set is coarser than [`ErrorKind`](crate::error::ErrorKind) (the rare kinds share
/// `other`) and its names predate it; both are kept so existing dashboards and alerts go on
/// matching.
pub fn error_label(kind: crate::error::ErrorKind) -> &'static str {
    use crate::error::ErrorKind as K;
    match kind {
        K::Redis => "redis",
        K::NotDurable => "not_durable",
        K::NoReplicas => "no_replicas",
        K::LeaseLost => "lease_lost",
        K::RequestIdConflict => "conflict",
        K::InvalidInput => "invalid",
        // The SKU is not loaded: buyers early for a sale, not a failure of the service (the
        // error-rate alert leaves it out, like invalid input).
        K::NotLoaded => "not_loaded",
        // Its load is under way: a moment in a reload, for good when a loader died mid-load
        // (the live audit's not-ready gauge and its alert tell those apart).
        K::NotReady => "not_ready",
        K::AlreadyLoaded | K::Config | K::Protocol | K::Postgres | K::Permission => "other",
    }
}

pub(crate) fn error(e: &crate::Error) {
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
    let before = labels
        .segments
        .insert(label.clone(), per_segment.len())
        .unwrap_or(0);
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

#[cfg(test)]
mod tests {
    #[test]
    fn every_error_kind_has_a_listed_label() {
        for kind in crate::error::ErrorKind::ALL {
            assert!(
                super::ERROR_KINDS.contains(&super::error_label(kind)),
                "{kind}"
            );
        }
        for label in super::ERROR_KINDS {
            assert!(
                crate::error::ErrorKind::ALL
                    .iter()
                    .any(|k| super::error_label(*k) == label),
                "{label} is never used"
            );
        }
    }
}
