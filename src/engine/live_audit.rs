//! The live audit (opt-in): [`Engine::audit`] of a set of SKUs every few seconds, exported as
//! gauges, so conservation is a metric an alert can watch (`config/alerts.yml`). An audit
//! writes nothing ([`Store::peek`]), so the live audit goes on while
//! a master refuses writes.
//!
//! Which SKUs: every SKU this engine has seen (loaded, sold, read or audited through it) plus
//! an explicit list. A SKU that is not loaded is skipped, not counted as failing — unless this
//! engine saw its metadata before: then it is gone (Redis restarted empty, or lost its data in
//! a failover), and the SKU is counted as **vanished** (and as failing) until it is loaded
//! again. A SKU whose load is under way is counted as not ready.
//!
//! What it exports (names in [`crate::metrics`]):
//! - `shardstock_audit_failing_skus` — SKUs whose last audit failed or that vanished, over
//!   *every* audited SKU (no label, so its cardinality is one whatever the number of SKUs);
//!   the alert's signal;
//! - `shardstock_audit_vanished_skus` — of those, SKUs this engine saw loaded whose metadata
//!   is gone (their own alert: the store lost data);
//! - `shardstock_audit_not_ready_skus` — SKUs whose load is under way (a moment in a reload;
//!   for good when a loader died between starting and committing the load: its alert waits a
//!   minute);
//! - `shardstock_audit_ok{sku}` — 1 or 0 per SKU (0 for a vanished one too), only for SKUs
//!   with their own label ([`SkuLabels`](crate::metrics::SkuLabels): the configured list plus
//!   the first few seen), to say *which* SKU failed; the others are counted in the gauges
//!   above only;
//! - `shardstock_audit_unaccounted_units` — `|loaded + restocked + moved in − remaining −
//!   reserved − sold − moved out|` per segment, summed (units lost or made up behind the
//!   engine's back; [`SegmentState::balance`](crate::store::SegmentState::balance));
//! - `shardstock_audit_excess_units` — the part of it where more units are counted than came
//!   in: stock that can be sold twice (the oversell signal);
//! - the stock gauges of each SKU read (remaining, per segment, in transit, reserved: set by
//!   [`Engine::audit`] itself);
//! - `shardstock_audit_skus`, `shardstock_audit_errors_total` (audits the store did not
//!   answer) and `shardstock_audit_last_run_timestamp_seconds` (the last round that read every
//!   SKU: a stale value means the audit is not running or cannot reach Redis);
//! - `shardstock_store_up` — 1 when the store answered the look at its servers that starts
//!   each round ([`Engine::readiness`], bounded by 2 s), 0 when it did not (Redis down or
//!   unreachable: its alert's signal); `shardstock_store_servers_refusing_writes` — the
//!   masters that answered but refuse writes (below `min-replicas-to-write`, out of memory,
//!   ...: their alert's signal, with or without buyers). Exported as soon as the look ends; a
//!   round whose store did not answer reads nothing else (every SKU counted as an error), so
//!   the signal never waits on the command timeouts of many reads.
//!
//! A failed audit is checked once more before it counts: an audit that raced a reload (its
//! metadata read before the new generation replaced the segments) passes the second time, or
//! shows another generation and is skipped for this round.

use crate::audit::Audit;
use crate::engine::Engine;
use crate::error::Error;
use crate::ids::Sku;
use crate::store::Store;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a round's look at the store's servers may take ([`Engine::readiness`]).
const STORE_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The running live audit; dropping it stops it.
#[derive(Debug)]
pub struct LiveAudit {
    task: tokio::task::JoinHandle<()>,
}

impl LiveAudit {
    /// Stops the live audit now.
    pub fn stop(self) {}
}

impl Drop for LiveAudit {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one round of the live audit found (the figures it exports).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Round {
    /// SKUs audited (vanished ones included).
    pub audited: u64,
    /// SKUs whose audit failed (twice in a row, same generation) or that vanished.
    pub failing: u64,
    /// SKUs this engine saw loaded and ready whose metadata is gone.
    pub vanished: u64,
    /// Units unaccounted for, summed over the segments of every audited SKU.
    pub unaccounted: u64,
    /// Units counted beyond what was loaded and restocked, summed likewise.
    pub excess: u64,
    /// SKUs not loaded, not ready, or reloaded mid-audit: not audited this round.
    pub skipped: u64,
    /// Of those, SKUs whose metadata says a load is under way (not ready): buyers get
    /// `not_ready` meanwhile. A moment in a reload; for good when the loader died between
    /// starting and committing it (its alert waits a minute).
    pub not_ready: u64,
    /// SKUs whose audit the store did not answer.
    pub errors: u64,
    /// The store answered a plain read at the start of the round.
    pub store_up: bool,
}

impl Round {
    /// The round's figures as the metrics record them.
    fn figures(&self) -> crate::metrics::AuditRound {
        crate::metrics::AuditRound {
            audited: self.audited,
            failing: self.failing,
            vanished: self.vanished,
            not_ready: self.not_ready,
            unaccounted: self.unaccounted,
            excess: self.excess,
            errors: self.errors,
        }
    }
}

/// `(unaccounted, excess)` of one audit: per segment, its
/// [`balance`](crate::store::SegmentState::balance) (`loaded + restocked + moved_in` against
/// `remaining + reserved + sold + moved_out`); unaccounted sums each segment's
/// [`unaccounted`](crate::store::Balance::unaccounted), excess its
/// [`excess`](crate::store::Balance::excess). Units a transfer moved are counted at both ends,
/// so a healthy sale with transfers shows 0 and 0, as [`Engine::audit`] says `ok`.
pub fn unaccounted(a: &Audit) -> (u64, u64) {
    a.segments.iter().fold((0, 0), |(u, x), s| {
        let b = s.state.balance();
        (
            u.saturating_add(b.unaccounted()),
            x.saturating_add(b.excess()),
        )
    })
}

/// What the live audit made of one SKU.
enum Looked {
    /// Audited (passed or failed).
    Audited(Audit),
    /// Seen loaded and ready (in this generation) before; its metadata is gone now.
    Vanished(u64),
    /// Its metadata says a load is under way (for a moment in a reload; for good when the
    /// loader died between starting and committing it).
    NotReady,
    /// Nothing to audit this round: not loaded (and never seen loaded), not ready, or reloaded
    /// between the two checks.
    Skipped,
}

impl<S: Store> Engine<S> {
    /// One round of the live audit over the SKUs this engine has seen plus `extra`: audits
    /// each, records the gauges (see [`crate::live_audit`]) and returns the figures.
    pub async fn audit_round(&self, extra: &[Sku]) -> Round {
        let mut skus = self.seen_skus();
        for s in extra {
            if !skus.contains(s) {
                skus.push(s.clone());
            }
        }
        // Does the store answer at all, and does every server take writes? One readiness look
        // (every master asked, bounded), so that a dead Redis or a master refusing writes
        // shows even when there is no SKU to audit and no buyer.
        let ready = self.readiness(STORE_PROBE_TIMEOUT).await;
        let store_up = ready.is_ready();
        if !store_up {
            tracing::error!(reason = ?ready.reason, "live audit: the store does not answer");
        }
        let refusing = ready
            .problems
            .iter()
            .filter(|p| p.problem == crate::engine::ProblemKind::RefusesWrites)
            .count();
        // Exported at once: a round that then waits on reads must not hold the signal back.
        crate::metrics::store_up(store_up, refusing as u64);
        let mut r = Round {
            store_up,
            ..Round::default()
        };
        if !store_up {
            // Every read would wait out the command timeout in turn: count them failed now.
            r.errors = skus.len() as u64;
            crate::metrics::audit_round(&r.figures(), None);
            return r;
        }
        for sku in &skus {
            match self.audit_twice(sku).await {
                Ok(Looked::Audited(a)) => {
                    r.audited += 1;
                    let (u, x) = unaccounted(&a);
                    r.unaccounted = r.unaccounted.saturating_add(u);
                    r.excess = r.excess.saturating_add(x);
                    if !a.ok {
                        r.failing += 1;
                        tracing::error!(sku = %sku, generation = a.generation,
                            problems = ?a.problems, "live audit: conservation check failed");
                    }
                    crate::metrics::audit_sku(self.sku_labels(), sku.as_str(), a.ok);
                }
                Ok(Looked::Vanished(generation)) => {
                    r.audited += 1;
                    r.failing += 1;
                    r.vanished += 1;
                    tracing::error!(sku = %sku, generation,
                        "live audit: the SKU was loaded but its metadata is gone (the store lost its data?)");
                    crate::metrics::audit_sku(self.sku_labels(), sku.as_str(), false);
                    // Nothing of it is left to sell: its stock gauges say so.
                    crate::metrics::stock(self.sku_labels(), sku.as_str(), &[], 0, 0);
                }
                Ok(Looked::NotReady) => {
                    r.skipped += 1;
                    r.not_ready += 1;
                }
                Ok(Looked::Skipped) => r.skipped += 1,
                Err(e) => {
                    r.errors += 1;
                    tracing::warn!(sku = %sku, error = %e, "live audit: cannot read the SKU");
                }
            }
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        crate::metrics::audit_round(&r.figures(), (r.errors == 0).then_some(now));
        r
    }

    /// The audit of `sku`, a failed one checked again.
    async fn audit_twice(&self, sku: &Sku) -> crate::Result<Looked> {
        let skip = |e: Error| match e {
            Error::NotLoaded(_) => match self.seen_generation(sku) {
                Some(g) => Ok(Looked::Vanished(g)),
                None => Ok(Looked::Skipped),
            },
            Error::NotReady(_) => Ok(Looked::NotReady),
            e => Err(e),
        };
        let first = match self.audit(sku).await {
            Ok(a) if a.ok => return Ok(Looked::Audited(a)),
            Ok(a) => a,
            Err(e) => return skip(e),
        };
        match self.audit(sku).await {
            Ok(a) if a.ok || a.generation == first.generation => Ok(Looked::Audited(a)),
            Ok(_) => Ok(Looked::Skipped),
            Err(e) => skip(e),
        }
    }

    /// Starts the live audit: [`audit_round`](Self::audit_round) now and then every `every`.
    /// Like the sweeper it holds no strong reference to the engine (it ends when the engine
    /// is dropped) and stops when the returned handle is dropped.
    pub fn start_live_audit(&self, every: Duration, extra: Vec<Sku>) -> LiveAudit {
        let task = self.periodic(every, true, move |engine| {
            let extra = extra.clone();
            async move {
                engine.audit_round(&extra).await;
            }
        });
        LiveAudit { task }
    }
}
