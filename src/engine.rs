//! The engine: the public face. Loads SKUs, deducts with routing and fallback, restocks, audits.
//!
//! # How a deduction runs
//! 1. **Home attempt** (one script, the common case). The request id hashes to a *home*
//!    segment; `deduct.lua` there checks the request's record (replay / conflict), then takes
//!    the whole quantity if the segment has it. When it is short, the same script writes a
//!    *claim* for the request, so concurrent duplicates of this request id wait instead of
//!    falling back on their own (which could sell twice).
//! 2. **Fallback** (claim holder only). Try the other segments, skipping those the local hints
//!    say are short; then read every segment (one pipelined round trip). A single segment that
//!    can serve the request is used; otherwise, when the SKU has enough in total, the request is
//!    served across segments **all or nothing** (parts taken one by one, refunded on failure).
//!    The claim is settled at home as applied (with the parts) or released.
//! 3. **Sold out / insufficient** are answered only from that fresh read, never from hints.
//!    They change nothing and are not recorded: retrying the same request id later (say after
//!    a restock) is a fresh attempt.
//! 4. **Crash recovery.** A claim has a lease on the store's clock. If its holder dies, a retry
//!    of the request takes the claim over with a higher epoch, *fences* every other segment
//!    (after which the old holder can no longer take or refund there), counts what the old
//!    holder took, and either settles it (replay) or refunds it and starts afresh.

use crate::coalesce::ReadGroup;
use crate::error::{Error, Result};
use crate::ids::{MAX_SEGMENTS, MAX_UNITS, RequestId, Sku, UserId, check_qty};
use crate::router::{Hints, others, plan_split};
use crate::segments::{Part, home, split};
use crate::store::*;
use dashmap::DashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod claim;
mod deduct;
mod fallback;
mod layout;
mod options;
mod outcome;
mod stock;
mod sweeper;
mod user_limit;

pub use crate::audit::*;
pub use crate::reservation::*;
pub(crate) use deduct::*;
pub(crate) use layout::*;
pub use options::*;
pub use outcome::*;
pub use sweeper::*;

pub(crate) struct Inner<S> {
    pub(crate) store: S,
    pub(crate) opts: EngineOptions,
    /// Cached layouts. A `Stale` reply (another instance reloaded the SKU) evicts the entry.
    pub(crate) layouts: DashMap<Sku, Arc<Layout>>,
    /// Which SKUs get their own metric label.
    pub(crate) sku_labels: crate::metrics::SkuLabels,
    /// The in-process per-user filter.
    pub(crate) guard: crate::guard::LocalGuard,
}

/// The inventory engine. Cheap to clone; share one per process.
pub struct Engine<S> {
    pub(crate) inner: Arc<Inner<S>>,
}

impl<S> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S> std::fmt::Debug for Engine<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("opts", &self.inner.opts)
            .finish()
    }
}

impl Engine<()> {
    /// A builder with default options.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }
}

impl<S: Store> Engine<S> {
    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// Entries held by the in-process per-user guard.
    pub fn guard_len(&self) -> usize {
        self.inner.guard.len()
    }

    /// The options in force.
    pub fn options(&self) -> &EngineOptions {
        &self.inner.opts
    }

    pub(crate) fn ttl_ms(&self) -> u64 {
        self.inner.opts.request_ttl.as_millis() as u64
    }

    /// Deducts `req.qty` units: see the [module docs](self) for the route a request takes.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (quantity), [`Error::NotLoaded`], [`Error::NotReady`],
    /// [`Error::RequestIdConflict`] (same id, other user, quantity or kind — e.g. the id of a
    /// reservation), [`Error::Sealed`], and store errors — after which the outcome is unknown
    /// and the request may be retried with the same id.
    pub async fn deduct(&self, req: &Deduct) -> Result<Deduction> {
        self.measured(req, 0).await.map(|(d, _)| d)
    }

    /// Units left, in total and per segment (one pipelined read).
    ///
    /// # Errors
    /// [`Error::NotLoaded`], [`Error::NotReady`], store errors.
    pub async fn remaining(&self, sku: &Sku) -> Result<Remaining> {
        for _ in 0..STALE_RETRIES {
            let l = self.layout(sku).await?;
            let segs = self.read_segments(&l, sku).await?;
            if let Some(stocks) = observe(&l, &segs) {
                let per_segment: Vec<u64> = stocks.iter().map(|(_, s)| *s).collect();
                crate::metrics::remaining(&self.inner.sku_labels, sku.as_str(), &per_segment);
                return Ok(Remaining {
                    total: per_segment.iter().sum(),
                    per_segment,
                });
            }
            self.forget(sku, l.generation);
        }
        Err(Error::NotReady(sku.to_string()))
    }

    /// The store's view of `req` for a call of `tr`'s kind.
    pub(crate) fn args<'a>(&self, req: &'a Deduct, tr: &Trace) -> ReqArgs<'a> {
        ReqArgs {
            request_id: &req.request_id,
            user: &req.user,
            qty: req.qty,
            // A reservation's records (its claim and home record too, not only the part that
            // holds the units) outlive the reservation by the request TTL.
            ttl_ms: self.ttl_ms() + tr.resv,
            lease_ms: self.inner.opts.claim_lease.as_millis() as u64,
            resv_ttl_ms: tr.resv,
            kind: tr.kind,
        }
    }

    /// Segment `index` of `l`'s generation.
    pub(crate) fn seg<'a>(&self, l: &Layout, sku: &'a Sku, index: u32) -> SegAddr<'a> {
        SegAddr {
            sku,
            generation: l.generation,
            index,
        }
    }

    /// `req`'s home segment.
    pub(crate) fn home_of<'a>(&self, l: &Layout, req: &'a Deduct) -> SegAddr<'a> {
        self.seg(l, &req.sku, home(&req.request_id, l.segments))
    }

    pub(crate) fn conflict(req: &Deduct, field: &'static str) -> Error {
        Error::RequestIdConflict {
            request_id: req.request_id.to_string(),
            field,
        }
    }
}
