//! The live audit (opt-in): [`Engine::audit`] of a set of SKUs every few seconds, exported as
//! gauges, so conservation is a metric an alert can watch (`config/alerts.yml`).
//!
//! Which SKUs: the ones the engine has used (those with a cached layout — the sweeper's set: a
//! SKU loaded, sold or read through this engine) plus an explicit list. A SKU that is not
//! loaded (or not ready) is skipped, not counted as failing.
//!
//! What it exports (names in [`crate::metrics`]):
//! - `shardstock_audit_failing_skus` — SKUs whose last audit failed, over *every* audited SKU
//!   (no label, so its cardinality is one whatever the number of SKUs); the alert's signal;
//! - `shardstock_audit_ok{sku}` — 1 or 0 per SKU, only for SKUs with their own label
//!   ([`SkuLabels`](crate::metrics::SkuLabels): the configured list plus the first few seen),
//!   to say *which* SKU failed; the others are counted in the gauge above only;
//! - `shardstock_audit_unaccounted_units` — `|loaded + restocked − remaining − reserved −
//!   sold|` per segment, summed (units lost or made up behind the engine's back);
//! - `shardstock_audit_excess_units` — the part of it where more units are counted than were
//!   loaded and restocked: stock that can be sold twice (the oversell signal);
//! - `shardstock_audit_skus`, `shardstock_audit_errors_total` (audits the store did not
//!   answer) and `shardstock_audit_last_run_timestamp_seconds` (the last round that read every
//!   SKU: a stale value means the audit is not running or cannot reach Redis).
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
    /// SKUs audited.
    pub audited: u64,
    /// SKUs whose audit failed (twice in a row, same generation).
    pub failing: u64,
    /// Units unaccounted for, summed over the segments of every audited SKU.
    pub unaccounted: u64,
    /// Units counted beyond what was loaded and restocked, summed likewise.
    pub excess: u64,
    /// SKUs not loaded, not ready, or reloaded mid-audit: not audited this round.
    pub skipped: u64,
    /// SKUs whose audit the store did not answer.
    pub errors: u64,
}

/// `(unaccounted, excess)` of one audit: per segment, `in = loaded + restocked` against `out =
/// remaining + reserved + sold`; unaccounted sums `|in − out|`, excess sums `out − in` where
/// positive.
pub fn unaccounted(a: &Audit) -> (u64, u64) {
    a.segments.iter().fold((0, 0), |(u, x), s| {
        let st = &s.state;
        let inn = u128::from(st.loaded) + u128::from(st.restocked);
        let out = u128::from(st.stock) + u128::from(st.reserved) + u128::from(st.sold);
        let diff = u64::try_from(inn.abs_diff(out)).unwrap_or(u64::MAX);
        let more = if out > inn { diff } else { 0 };
        (u.saturating_add(diff), x.saturating_add(more))
    })
}

impl<S: Store> Engine<S> {
    /// One round of the live audit over the SKUs this engine has used plus `extra`: audits
    /// each, records the gauges (see [`crate::live_audit`]) and returns the figures.
    pub async fn audit_round(&self, extra: &[Sku]) -> Round {
        let mut skus = self.used_skus();
        for s in extra {
            if !skus.contains(s) {
                skus.push(s.clone());
            }
        }
        let mut r = Round::default();
        for sku in &skus {
            match self.audit_twice(sku).await {
                Ok(Some(a)) => {
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
                Ok(None) => r.skipped += 1,
                Err(e) => {
                    r.errors += 1;
                    tracing::warn!(sku = %sku, error = %e, "live audit: cannot read the SKU");
                }
            }
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        crate::metrics::audit_round(&r, (r.errors == 0).then_some(now));
        r
    }

    /// The audit of `sku`, a failed one checked again; `None` when there is nothing to audit
    /// this round (not loaded, not ready, or reloaded between the two checks).
    async fn audit_twice(&self, sku: &Sku) -> crate::Result<Option<Audit>> {
        let skip = |e: Error| match e {
            Error::NotLoaded(_) | Error::NotReady(_) => Ok(None),
            e => Err(e),
        };
        let first = match self.audit(sku).await {
            Ok(a) if a.ok => return Ok(Some(a)),
            Ok(a) => a,
            Err(e) => return skip(e),
        };
        match self.audit(sku).await {
            Ok(a) if a.ok || a.generation == first.generation => Ok(Some(a)),
            Ok(_) => Ok(None),
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
