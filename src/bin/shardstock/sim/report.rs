//! What a sale reports: the `--json` document and its human rendering.

use serde::Serialize;

/// Coalescing settings as reported.
#[derive(Debug, Serialize)]
pub(super) struct CoalescingReport {
    pub(super) max_batch: usize,
    pub(super) window_us: u64,
    pub(super) max_in_flight: usize,
    /// Coalesced script calls sent during the run (and deductions they carried).
    pub(super) calls: u64,
    pub(super) requests: u64,
    pub(super) mean_batch: f64,
}

/// The `--json` report.
#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) sku: String,
    pub(super) store: &'static str,
    pub(super) strategy: shardstock::Strategy,
    /// False for the baselines kept to show overselling (naive, local-mutex, decr-compensate).
    pub(super) strategy_safe: bool,
    /// Lock figures for lock/redlock (null otherwise).
    pub(super) lock: Option<shardstock::lock::LockFigures>,
    /// Request coalescing (lua on Redis): null = one script call per request.
    pub(super) coalescing: Option<CoalescingReport>,
    pub(super) run_id: String,
    /// Fields from the audit after the sale are null when it could not run (`unchecked` says
    /// why).
    pub(super) generation: Option<u64>,
    pub(super) segments: usize,
    pub(super) requests: u64,
    pub(super) users: u64,
    pub(super) qty: u64,
    pub(super) concurrency: u64,
    pub(super) applied: u64,
    pub(super) sold_units: u64,
    pub(super) sold_out: u64,
    pub(super) insufficient: u64,
    pub(super) replayed: u64,
    /// Requests refused by the per-user limit.
    pub(super) limit_reached: u64,
    /// Requests refused because the same user had an attempt running (in this process, or a
    /// pending per-user claim elsewhere).
    pub(super) user_busy: u64,
    /// Most units any one user bought in this run (this process).
    pub(super) max_units_per_user: u64,
    /// Reserved units this run confirmed (counted in sold_units too), cancelled, and left to
    /// expire (returned before the audit).
    pub(super) reservations_confirmed_units: u64,
    pub(super) reservations_cancelled_units: u64,
    pub(super) reservations_expired_units: u64,
    /// Units held by live reservations after the run (0 once expiries were swept).
    pub(super) reserved: Option<u64>,
    pub(super) errors: u64,
    pub(super) first_error: Option<String>,
    /// Units a buyer could still be sold (expired reservations' units included).
    pub(super) remaining: Option<u64>,
    /// Units moving between segments when the run ended (0 after a sweep).
    pub(super) in_transit: Option<u64>,
    pub(super) remaining_per_segment: Option<Vec<u64>>,
    pub(super) loaded: Option<u64>,
    pub(super) restocked: Option<u64>,
    pub(super) sold: Option<u64>,
    pub(super) oversold: Option<u64>,
    pub(super) audit_ok: Option<bool>,
    pub(super) audit_problems: Vec<String>,
    /// What the run could not check after the sale, and why (the store failing): the exit
    /// code is then 3, the report printed all the same.
    pub(super) unchecked: Vec<String>,
    pub(super) elapsed_s: f64,
    pub(super) throughput_per_s: f64,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) p999_ms: f64,
    pub(super) max_ms: f64,
}

/// Prints `r` for people (the default without `--json`).
pub(super) fn print_human(r: &Report) -> Result<(), crate::Failure> {
    say!(
        "flash sale of {} ({} store, generation {}, {} segments, run {})",
        r.sku,
        r.store,
        opt(r.generation),
        r.segments,
        r.run_id
    );
    say!(
        "strategy: {}{} — {}",
        r.strategy,
        if r.strategy_safe {
            ""
        } else {
            " (UNSAFE baseline: not exactly-once)"
        },
        r.strategy.summary()
    );
    if let Some(c) = &r.coalescing {
        say!(
            "request coalescing: {} deductions in {} script calls (mean {:.1}); up to {} per call, window {} µs, {} in flight per segment",
            c.requests,
            c.calls,
            c.mean_batch,
            c.max_batch,
            c.window_us,
            c.max_in_flight
        );
    }
    say!(
        "requests: {} from {} users, qty {}, {} concurrent workers",
        r.requests,
        r.users,
        r.qty,
        r.concurrency
    );
    if let Some(l) = &r.lock {
        say!(
            "locks: acquired {}, contended {}, timeouts {}, fallbacks {}, renewals {}, leases lost {}, fenced writes rejected {}",
            l.acquired,
            l.contended,
            l.timeouts,
            l.fallbacks,
            l.renewals,
            l.leases_lost,
            l.fenced_rejected
        );
    }
    // The outcome table: sold, sold out, rejected by reason.
    let rows: [(&str, u64); 8] = [
        ("sold (requests)", r.applied),
        ("sold (units)", r.sold_units),
        ("sold out", r.sold_out),
        ("rejected: insufficient", r.insufficient),
        ("rejected: limit reached", r.limit_reached),
        ("rejected: user busy", r.user_busy),
        ("replayed", r.replayed),
        ("errors", r.errors),
    ];
    say!("  {:<26} {:>12}", "outcome", "count");
    for (name, n) in rows {
        say!("  {name:<26} {n:>12}");
    }
    if r.reservations_confirmed_units
        + r.reservations_cancelled_units
        + r.reservations_expired_units
        > 0
    {
        say!(
            "  reservations (units): confirmed {}, cancelled {}, expired {}, still reserved {}",
            r.reservations_confirmed_units,
            r.reservations_cancelled_units,
            r.reservations_expired_units,
            opt(r.reserved)
        );
    }
    if let Some(e) = &r.first_error {
        say!("first error: {e}");
    }
    say!(
        "stock: loaded {}, restocked {}, sold {}, remaining {}, in transit {}",
        opt(r.loaded),
        opt(r.restocked),
        opt(r.sold),
        opt(r.remaining),
        opt(r.in_transit)
    );
    if let Some(per) = &r.remaining_per_segment {
        let per: Vec<String> = per.iter().map(u64::to_string).collect();
        say!("remaining per segment: [{}]", per.join(", "));
    }
    say!("oversold: {}", opt(r.oversold));
    match r.audit_ok {
        Some(true) => say!("audit: ok"),
        Some(false) => {
            say!("audit: FAILED");
            for p in &r.audit_problems {
                say!("  - {p}");
            }
        }
        None => say!("audit: not run"),
    }
    for u in &r.unchecked {
        say!("not checked: {u}");
    }
    say!(
        "throughput: {:.1} requests/s ({:.3} s)",
        r.throughput_per_s,
        r.elapsed_s
    );
    say!(
        "latency: p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms",
        r.p50_ms,
        r.p99_ms,
        r.p999_ms,
        r.max_ms
    );
    Ok(())
}

/// A figure, or `?` when it could not be read.
fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "?".to_string(), |v| v.to_string())
}
