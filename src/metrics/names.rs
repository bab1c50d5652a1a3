//! The catalogue: every metric's name, help text and unit, so the Grafana dashboard can be
//! checked against this list (and vice versa: `tests/it/metrics.rs` reads the `pub const`
//! names of every file of `src/` that describes metrics, and wants a panel for each). The lock
//! metrics are named here too; `lock::metric_names` re-exports them under short names.
//!
//! Names and descriptions stay in one file: the dashboard check and `tests/it/alerts.rs` read
//! the names from here. It imports nothing of the crate; the recording functions (`metrics.rs`)
//! and the label sets (`metrics/labels.rs`) use these names.

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram};

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
/// not reported, see [`SkuLabels`](super::SkuLabels)): what
/// [`Engine::remaining`](crate::Engine::remaining) answers, set by every read of all the SKU's
/// segments (the live audit's rounds, `status`, `audit`).
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
/// one of [`ERROR_KINDS`](super::ERROR_KINDS), see [`error_label`](super::error_label)).
pub const ERRORS: &str = "shardstock_errors_total";
/// Live audit ([`crate::live_audit`]): 1 when the SKU's last audit passed, 0 when it failed
/// (gauge, label `sku`; opted-in SKUs only, see [`SkuLabels`](super::SkuLabels) — every
/// audited SKU counts in [`AUDIT_FAILING`]).
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
