//! The binary's Prometheus recorder: for `sim`, with the exporter's own HTTP listener on
//! `--metrics-addr`; for `serve`, as a handle that its `GET /metrics` renders.
//!
//! The library only records through the `metrics` facade; this module installs the recorder
//! (`metrics-exporter-prometheus`). Histograms get explicit buckets — an
//! exporter histogram *without* buckets is rendered as a summary, and a summary cannot be
//! aggregated across instances by `histogram_quantile`. The bucket matchers use the names
//! exactly as passed to `histogram!()` (the exporter adds no unit suffix by default).

use crate::Failure;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use shardstock::lock::metric_names as lock_names;
use shardstock::metrics as names;
use shardstock::metrics::ERROR_KINDS;
use std::net::SocketAddr;

/// Latency buckets in seconds, 50 µs – 1 s (deduction latency, HTTP latency and lock wait).
pub(crate) const LATENCY_BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

/// Buckets for segment attempts per deduction (1 = served by the home segment).
pub(crate) const ATTEMPT_BUCKETS: [f64; 9] = [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0];

/// Installs the global recorder and serves `/metrics` on `addr` (any path answers).
///
/// Must run inside the Tokio runtime: the listener is a task on it. Counters that are rare by
/// design (errors, lost leases, fenced writes) are registered at zero so that dashboards show a
/// flat 0 instead of "No data" (which would look like a broken scrape).
pub(crate) fn install(addr: SocketAddr, strategy: shardstock::Strategy) -> Result<(), Failure> {
    let fail = |e: metrics_exporter_prometheus::BuildError| {
        Failure::new(format!("cannot serve metrics on {addr}: {e}"))
    };
    with_buckets(PrometheusBuilder::new().with_http_listener(addr))
        .map_err(fail)?
        .install()
        .map_err(fail)?;
    register(strategy);
    Ok(())
}

/// Installs the global recorder without a listener and returns its handle (`serve` renders
/// it on its own `/metrics` route). Needs a periodic [`PrometheusHandle::run_upkeep`].
pub(crate) fn install_handle(strategy: shardstock::Strategy) -> Result<PrometheusHandle, Failure> {
    let fail = |e: metrics_exporter_prometheus::BuildError| {
        Failure::new(format!("cannot install the metrics recorder: {e}"))
    };
    let handle = with_buckets(PrometheusBuilder::new())
        .map_err(fail)?
        .install_recorder()
        .map_err(fail)?;
    register(strategy);
    Ok(handle)
}

fn with_buckets(
    b: PrometheusBuilder,
) -> Result<PrometheusBuilder, metrics_exporter_prometheus::BuildError> {
    b.set_buckets_for_metric(
        Matcher::Full(names::DEDUCT_SECONDS.to_string()),
        &LATENCY_BUCKETS,
    )?
    .set_buckets_for_metric(
        Matcher::Full(lock_names::WAIT_SECONDS.to_string()),
        &LATENCY_BUCKETS,
    )?
    .set_buckets_for_metric(
        Matcher::Full(names::HTTP_SECONDS.to_string()),
        &LATENCY_BUCKETS,
    )?
    .set_buckets_for_metric(
        Matcher::Full(names::SEGMENT_ATTEMPTS.to_string()),
        &ATTEMPT_BUCKETS,
    )
}

/// Descriptions, and the rare counters at zero.
fn register(strategy: shardstock::Strategy) {
    names::describe();

    for kind in ERROR_KINDS {
        metrics::counter!(names::ERRORS, "kind" => kind).increment(0);
    }
    // Zero (not "No data") when coalescing is off or the strategy is not lua.
    metrics::counter!(names::COALESCED_CALLS).increment(0);
    metrics::counter!(names::COALESCED_REQUESTS).increment(0);
    // Zero unless durability mode (store.wait_replicas) fell short.
    metrics::counter!(names::WAIT_SHORTFALLS).increment(0);
    if strategy.uses_locks() {
        for name in [
            lock_names::TIMEOUTS,
            lock_names::RENEWALS,
            lock_names::LEASES_LOST,
            lock_names::FENCED,
        ] {
            metrics::counter!(name).increment(0);
        }
    }
}

/// The order consumer's rare counters at zero (`shardstock orders`; a no-op without a
/// recorder): failures, redeliveries and dead letters are normally 0, and a panel of them
/// should say so rather than "No data".
pub(crate) fn register_orders() {
    for name in [
        names::ORDERS_HANDLED,
        names::ORDERS_FAILED,
        names::ORDERS_REDELIVERIES,
        names::ORDERS_DEAD_LETTERS,
    ] {
        metrics::counter!(name).increment(0);
    }
}
