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
//!    can serve the request is used; otherwise, when the SKU has enough in total, a sale is
//!    served across segments **all or nothing** (parts taken one by one, refunded on failure);
//!    a reservation is held in one segment only. The claim is settled at home as applied (with
//!    the parts) or released.
//! 3. **Sold out / insufficient** (and, for a reservation, too large to hold) are answered
//!    only from that fresh read, never from hints.
//!    They change nothing and are not recorded: retrying the same request id later (say after
//!    a restock) is a fresh attempt.
//! 4. **Crash recovery.** A claim has a lease on the store's clock and an *epoch* (1 for the
//!    claim the home script writes, or one above a released claim of the same request id,
//!    whose markers may still refuse older epochs). If its holder dies, a retry of the request
//!    takes the claim over with a higher epoch, shuts every other segment to older epochs
//!    (after which the old holder can no longer take or refund there), counts what the old
//!    holder took, and either settles it (replay) or refunds it and starts afresh.
//!
//! With a per-user limit, two layers come first: the in-process guard (double clicks, users
//! this process saw at the limit) and the user's record in the store, claimed before the
//! deduction and settled after it.
//!
//! # Where each part lives
//! The engine's rooms (`engine/*.rs`, [`crate::reservation`], [`crate::audit`]) are listed,
//! one line each, in the crate's one Layout (the README's `## Layout`, which these docs
//! render), with a deduction's path through them.

use crate::error::{Error, Result};
use crate::ids::Sku;
use crate::store::{SegAddr, Store};
use dashmap::DashMap;
use std::sync::Arc;

mod claim;
mod deduct;
mod fallback;
mod layout;
mod options;
mod outcome;
mod request;
mod sold_out;
mod stock;
mod sweeper;
mod user_limit;

pub(crate) use layout::Layout;
pub use options::{EngineBuilder, EngineOptions, LoadOptions, MAX_DURATION, MAX_GUARD_CAP};
pub use outcome::{Deduction, Remaining, Restocked};
pub use request::Deduct;
pub(crate) use request::{Attempt, Intent};
pub use sweeper::Sweeper;

/// State shared by every clone of an [`Engine`].
struct Inner<S> {
    store: S,
    opts: EngineOptions,
    /// Cached layouts. A `Stale` reply (another instance reloaded the SKU) evicts the entry.
    layouts: DashMap<Sku, Arc<Layout>>,
    /// Which SKUs get their own metric label.
    sku_labels: crate::metrics::SkuLabels,
    /// The in-process per-user filter.
    guard: crate::guard::LocalGuard,
}

/// The inventory engine. Cheap to clone; share one per process.
pub struct Engine<S> {
    inner: Arc<Inner<S>>,
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

    /// The in-process per-user guard.
    pub(crate) fn guard(&self) -> &crate::guard::LocalGuard {
        &self.inner.guard
    }

    /// Deducts `req.qty` units: see the [module docs](self) for the route a request takes.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (quantity), [`Error::NotLoaded`], [`Error::NotReady`],
    /// [`Error::RequestIdConflict`] (same id, other user, quantity or kind — e.g. the id of a
    /// reservation), [`Error::Sealed`], and store errors — after which the outcome is unknown
    /// and the request may be retried with the same id.
    pub async fn deduct(&self, req: &Deduct) -> Result<Deduction> {
        self.metered(req, Intent::Sale).await.map(|(d, _)| d)
    }

    /// Units left, in total and per segment (one pipelined read).
    ///
    /// # Errors
    /// [`Error::NotLoaded`], [`Error::NotReady`], store errors.
    pub async fn remaining(&self, sku: &Sku) -> Result<Remaining> {
        for _ in 0..deduct::STALE_RETRIES {
            let l = self.layout(sku).await?;
            let segs = self.read_segments(&l).await?;
            if let Some(per_segment) = l.observe(&segs) {
                crate::metrics::remaining(&self.inner.sku_labels, sku.as_str(), &per_segment);
                return Ok(Remaining {
                    total: per_segment.iter().sum(),
                    per_segment,
                });
            }
            self.forget(&l);
        }
        Err(Error::NotReady(sku.to_string()))
    }

    /// Where each segment of `sku` lives now (hash tag, slot, master) on a Redis Cluster;
    /// `None` on a store without slots (a single Redis, the memory store).
    ///
    /// # Errors
    /// [`Error::NotLoaded`], store errors.
    pub async fn placement(&self, sku: &Sku) -> Result<Option<Vec<crate::placement::SegmentHome>>> {
        let store = &self.inner.store;
        let meta = store
            .meta(sku)
            .await?
            .ok_or_else(|| Error::NotLoaded(sku.to_string()))?;
        store
            .segment_homes(sku, &meta.placement, meta.segments)
            .await
    }

    /// Checks conservation for `sku`; see [`Audit`](crate::Audit). A failed check is a report,
    /// not an error.
    ///
    /// # Errors
    /// [`Error::NotLoaded`], [`Error::NotReady`], store errors.
    pub async fn audit(&self, sku: &Sku) -> Result<crate::Audit> {
        let store = &self.inner.store;
        let meta = store
            .meta(sku)
            .await?
            .ok_or_else(|| Error::NotLoaded(sku.to_string()))?;
        if !meta.ready {
            return Err(Error::NotReady(sku.to_string()));
        }
        let at = |index| seg_at(sku, meta.generation, index, &meta.placement);
        let reads = (0..meta.segments).map(|index| store.held(at(index)));
        let segs = futures::future::try_join_all(reads).await?;
        Ok(crate::Audit::check(sku, &meta, &segs))
    }
}

/// Segment `index` of `sku` in load generation `generation`, placed as `placement` says: the
/// one place a [`SegAddr`] is put together.
pub(crate) fn seg_at<'a>(
    sku: &'a Sku,
    generation: u64,
    index: u32,
    placement: &crate::placement::Placement,
) -> SegAddr<'a> {
    SegAddr::new(sku, generation, index).with_suffix(placement.suffix(index))
}
