//! The engine: the public face. Loads SKUs, deducts with routing and fallback, restocks, audits.
//!
//! # How a deduction runs
//! Every request is decided by **one script at its home segment** (`sell.lua`): the request's
//! record (replay, or a conflict for another quantity or kind), the user's ledger against the
//! per-user limit, the stock, the record, the reservation hold and the outbox event, in one
//! atomic step and, in the common case, one round trip. The home is the user's segment (with
//! a per-user limit every request of the user lands where the user's ledger is) or, without a
//! limit, the (user, request id) pair's. Request ids are scoped per (SKU, user).
//!
//! When home is short, **units move, not requests**: a transfer debits units at a donor
//! (`transfer.lua`, idempotent by transfer id, recorded at the donor) and home credits them
//! exactly once in the same call that decides the request. Units moved home stay there,
//! sellable; a process that dies between debit and credit leaves them in transit until any
//! sweeper credits them. `sold out` and `insufficient` come only from a survey of every
//! segment, after expired reservations went back and units in transit were credited. The
//! steps are the pure state machine of `protocol.rs`, which the model checker explores.
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

mod background;
mod deduct;
mod layout;
mod look;
mod options;
mod outcome;
pub mod protocol;
mod readiness;
mod request;
mod sold_out;
mod stock;
mod sweeper;

pub use background::{Background, BackgroundOptions};
pub(crate) use layout::Layout;
pub use options::{EngineBuilder, EngineOptions, LoadOptions, MAX_DURATION, MAX_GUARD_CAP};
pub use outcome::{Deduction, Remaining, Restocked};
pub use readiness::{
    DEFAULT_READY_TIMEOUT, ProblemKind, Readiness, ReadyStatus, ServerProblem, SkuSegments,
};
pub use request::Deduct;
pub(crate) use request::{Attempt, Intent};
pub use sweeper::Sweeper;

/// State shared by every clone of an [`Engine`].
struct Inner<S> {
    store: S,
    opts: EngineOptions,
    /// Cached layouts. A `Stale` reply (another instance reloaded the SKU) evicts the entry.
    /// Hashed with foldhash: every request looks its SKU up (SipHash was ~0.4 % of a sale's
    /// client CPU).
    layouts: DashMap<Sku, Arc<Layout>, foldhash::fast::RandomState>,
    /// Every SKU this engine has loaded, sold, read or audited (its metadata seen), with the
    /// last generation seen. Unlike a cached layout (dropped when the metadata is gone) an
    /// entry stays, so the live audit and the readiness can tell a SKU whose data vanished
    /// (Redis back empty) from one never loaded.
    seen: DashMap<Sku, u64, foldhash::fast::RandomState>,
    /// Which SKUs get their own metric label.
    sku_labels: crate::metrics::SkuLabels,
    /// The in-process per-user filter.
    guard: crate::guard::LocalGuard,
    /// The state of the last readiness look (its changes are logged).
    last_ready: readiness::LastReadiness,
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
    /// [`Error::RequestIdConflict`] (this user's request id used with another quantity or kind
    /// — e.g. the id of a reservation —, also when the new quantity is above the per-user
    /// limit; request ids are scoped per user), and store errors — after which the outcome is unknown
    /// and the request may be retried with the same id.
    pub async fn deduct(&self, req: &Deduct) -> Result<Deduction> {
        self.metered(req, Intent::Sale).await.map(|(d, _)| d)
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
