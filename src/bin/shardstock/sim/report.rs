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

/// One SKU of a cart sale after the checks, from its audit.
#[derive(Debug, Serialize)]
pub(super) struct CartSku {
    pub(super) sku: String,
    pub(super) generation: u64,
    pub(super) segments: usize,
    pub(super) loaded: u64,
    pub(super) restocked: u64,
    pub(super) sold: u64,
    pub(super) remaining: u64,
    pub(super) reserved: u64,
    pub(super) in_transit: u64,
    pub(super) audit_ok: bool,
    pub(super) audit_problems: Vec<String>,
}

/// Orders refused, by the reason of their first refused item.
#[derive(Debug, Default, Serialize)]
pub(super) struct Refusals {
    pub(super) sold_out: u64,
    pub(super) insufficient: u64,
    pub(super) limit_reached: u64,
    pub(super) over_limit: u64,
    pub(super) user_busy: u64,
}

impl Refusals {
    pub(super) fn total(&self) -> u64 {
        self.sold_out + self.insufficient + self.limit_reached + self.over_limit + self.user_busy
    }
}

/// The run's orders as their records say once the deadlines passed (read, not written).
#[derive(Debug, Default, Serialize)]
pub(super) struct OrderRecords {
    pub(super) confirmed: u64,
    pub(super) cancelled: u64,
    pub(super) expired: u64,
    pub(super) refused: u64,
    /// Still holding or held (a check failure after the deadline).
    pub(super) open: u64,
    /// No record: never opened (not sent, or the sender died first).
    pub(super) none: u64,
}

/// The end checks of a cart sale; each `false` fails the run (exit code 1).
#[derive(Debug, Serialize)]
pub(super) struct CartChecks {
    /// Every order's items in one state: all posted iff the order is confirmed, else all
    /// voided or never held (and no order still open).
    pub(super) items_one_state: bool,
    /// The audit of every SKU passed.
    pub(super) audit_ok: bool,
    /// No units in transit on any SKU.
    pub(super) nothing_in_transit: bool,
    /// No units reserved on any SKU.
    pub(super) nothing_reserved: bool,
    /// Units sold of each SKU = confirmed orders × qty.
    pub(super) sold_is_confirmed: bool,
    /// The orders this run was told were confirmed = the confirmed records (null with
    /// --check-only, or when calls failed and their outcome is unknown).
    pub(super) answers_match_records: Option<bool>,
}

/// What a cart sale (`sim --cart N`) adds to the report.
#[derive(Debug, Serialize)]
pub(super) struct CartReport {
    /// Items per order: one of each SKU.
    pub(super) items: usize,
    pub(super) hold_ms: u64,
    /// `--check-only`: nothing was sent, the figures up to `decision_errors` are 0.
    pub(super) check_only: bool,
    /// What this run's calls answered: orders sent, held, then confirmed, cancelled or left
    /// to expire (`expired` also counts confirms and cancels answered "expired" —
    /// `confirmed_too_late` of them are confirms — and `expired_before_held`: holds answered
    /// "expired", whose deadline passed before every item was held, counted in `ended` too).
    pub(super) orders: u64,
    pub(super) held: u64,
    pub(super) confirmed: u64,
    pub(super) cancelled: u64,
    pub(super) expired: u64,
    pub(super) confirmed_too_late: u64,
    pub(super) expired_before_held: u64,
    pub(super) refused: u64,
    pub(super) refused_by_reason: Refusals,
    /// Holds answered as already decided: in a sale of fresh request ids, orders whose
    /// deadline passed while their items were being held (a --hold-ms shorter than the
    /// hold's latency).
    pub(super) ended: u64,
    /// Holds that failed (outcome unknown: the deadline settles them).
    pub(super) hold_errors: u64,
    /// Confirms and cancels that failed.
    pub(super) decision_errors: u64,
    pub(super) orders_per_s: f64,
    /// Sweeps run after the last deadline until nothing was reserved.
    pub(super) sweeps: u32,
    pub(super) records: OrderRecords,
    /// Items whose record was read (orders × items).
    pub(super) items_checked: u64,
    /// Orders whose items were not all in the order's one state.
    pub(super) orders_split: u64,
    /// The first problems found (at most 10), each naming its order.
    pub(super) problems: Vec<String>,
    pub(super) checks: CartChecks,
    /// Every check passed (and every check could run).
    pub(super) ok: bool,
    pub(super) skus: Vec<CartSku>,
}

/// The `--json` report. With `--cart`, `sku` lists the cart's SKUs (comma-separated), the
/// request outcomes count orders (`applied`: held; refusals by reason; `replayed`: ended;
/// `errors`: holds that failed), `sold_units` is units of every SKU in confirmed orders, the
/// stock figures are summed over the SKUs (per segment: segment by segment), `generation`
/// is the first SKU's, latencies are those of the holds, and `cart` has the rest.
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
    /// `sim --cart N` only (null otherwise).
    pub(super) cart: Option<CartReport>,
}

/// Prints `r` for people (the default without `--json`).
pub(super) fn print_human(r: &Report) -> Result<(), crate::Failure> {
    match &r.cart {
        None => say!(
            "flash sale of {} ({} store, generation {}, {} segments, run {})",
            r.sku,
            r.store,
            opt(r.generation),
            r.segments,
            r.run_id
        ),
        Some(c) if c.check_only => say!(
            "flash sale of {}-item carts over {} ({} store, {} segments each): reading the orders of run {} back (--check-only)",
            c.items,
            r.sku,
            r.store,
            r.segments,
            r.run_id
        ),
        Some(c) => say!(
            "flash sale of {}-item carts over {} ({} store, {} segments each, hold {} ms, run {})",
            c.items,
            r.sku,
            r.store,
            r.segments,
            c.hold_ms,
            r.run_id
        ),
    }
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
    if let Some(c) = &r.cart {
        return print_cart(r, c);
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

/// The rest of a cart sale's report, after the settings.
fn print_cart(r: &Report, c: &CartReport) -> Result<(), crate::Failure> {
    let f = &c.refused_by_reason;
    if !c.check_only {
        print_answers(r, c, f)?;
    }
    let o = &c.records;
    say!(
        "order records after the deadline ({} sweeps): confirmed {}, cancelled {}, expired {}, refused {}, still open {}, none {}",
        c.sweeps,
        o.confirmed,
        o.cancelled,
        o.expired,
        o.refused,
        o.open,
        o.none
    );
    for s in &c.skus {
        say!(
            "  {}: loaded {}, restocked {}, sold {}, remaining {}, reserved {}, in transit {}, audit {}",
            s.sku,
            s.loaded,
            s.restocked,
            s.sold,
            s.remaining,
            s.reserved,
            s.in_transit,
            if s.audit_ok { "ok" } else { "FAILED" }
        );
        for p in &s.audit_problems {
            say!("    - {p}");
        }
    }
    let k = &c.checks;
    let yes = |b: bool| if b { "ok" } else { "FAILED" };
    say!(
        "check: every order's items in one state ({} items read, {} orders split): {}",
        c.items_checked,
        c.orders_split,
        yes(k.items_one_state)
    );
    say!("check: audit of every SKU: {}", yes(k.audit_ok));
    say!("check: nothing in transit: {}", yes(k.nothing_in_transit));
    say!("check: nothing reserved: {}", yes(k.nothing_reserved));
    say!(
        "check: units sold of each SKU = confirmed orders × {}: {}",
        r.qty,
        yes(k.sold_is_confirmed)
    );
    match k.answers_match_records {
        Some(b) => say!("check: confirmed answers = confirmed records: {}", yes(b)),
        None => say!("check: confirmed answers = confirmed records: not checked"),
    }
    for p in &c.problems {
        say!("  - {p}");
    }
    for u in &r.unchecked {
        say!("not checked: {u}");
    }
    say!(
        "orders: {}",
        if c.ok { "all checks passed" } else { "FAILED" }
    );
    if c.check_only {
        return Ok(());
    }
    say!(
        "throughput: {:.1} orders/s ({:.3} s)",
        c.orders_per_s,
        r.elapsed_s
    );
    say!(
        "hold latency: p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms",
        r.p50_ms,
        r.p99_ms,
        r.p999_ms,
        r.max_ms
    );
    Ok(())
}

/// What a cart sale's calls answered.
fn print_answers(r: &Report, c: &CartReport, f: &Refusals) -> Result<(), crate::Failure> {
    say!(
        "orders: {} sent, {} held: confirmed {}, cancelled {}, expired {} (of them {} confirmed too late, {} before they were held)",
        c.orders,
        c.held,
        c.confirmed,
        c.cancelled,
        c.expired,
        c.confirmed_too_late,
        c.expired_before_held
    );
    say!(
        "orders refused: {} (sold out {}, insufficient {}, limit reached {}, over limit {}, user busy {}); ended before {}; errors: holds {}, confirms/cancels {}",
        c.refused,
        f.sold_out,
        f.insufficient,
        f.limit_reached,
        f.over_limit,
        f.user_busy,
        c.ended,
        c.hold_errors,
        c.decision_errors
    );
    if let Some(e) = &r.first_error {
        say!("first error: {e}");
    }
    Ok(())
}

/// A figure, or `?` when it could not be read.
fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "?".to_string(), |v| v.to_string())
}
