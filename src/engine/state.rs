//! The engine's handle: [`Engine`], the state its clones share, the accessors every room of
//! the engine uses, and [`EngineBuilder::build`], which puts that state together. What the
//! engine *does* lives in the rooms that `impl Engine` (deduct, stock, look, layouts,
//! readiness, sweeper, background, reservations, carts): they import this file, never the
//! other way round.

use super::layout::Layout;
use super::options::{EngineBuilder, EngineOptions};
use crate::error::{Error, Result};
use crate::ids::Sku;
use crate::store::Store;
use dashmap::DashMap;
use std::sync::Arc;

/// State shared by every clone of an [`Engine`].
pub(super) struct Inner<S> {
    pub(super) store: S,
    pub(super) opts: EngineOptions,
    /// Cached layouts. A `Stale` reply (another instance reloaded the SKU) evicts the entry.
    /// Hashed with foldhash: every request looks its SKU up (SipHash was ~0.4 % of a sale's
    /// client CPU).
    pub(super) layouts: DashMap<Sku, Arc<Layout>, foldhash::fast::RandomState>,
    /// Every SKU this engine has loaded, sold, read or audited (its metadata seen), with the
    /// last generation seen. Unlike a cached layout (dropped when the metadata is gone) an
    /// entry stays, so the live audit and the readiness can tell a SKU whose data vanished
    /// (Redis back empty) from one never loaded.
    pub(super) seen: DashMap<Sku, u64, foldhash::fast::RandomState>,
    /// Which SKUs get their own metric label.
    pub(super) sku_labels: crate::metrics::SkuLabels,
    /// The in-process per-user filter.
    pub(super) guard: crate::guard::LocalGuard,
    /// The status code of the last readiness look, 0 before the first (`readiness.rs`: its
    /// changes are logged).
    pub(super) last_ready: std::sync::atomic::AtomicU8,
}

/// The inventory engine. Cheap to clone; share one per process.
pub struct Engine<S> {
    pub(super) inner: Arc<Inner<S>>,
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

    /// Where each segment of `sku` lives now (hash tag, slot, master) on a Redis Cluster;
    /// `None` on a store without slots (a single Redis, the memory store).
    ///
    /// # Errors
    /// [`Error::NotLoaded`], store errors.
    pub async fn placement(
        &self,
        sku: &Sku,
    ) -> Result<Option<Vec<crate::cluster::placement::SegmentHome>>> {
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

impl EngineBuilder {
    /// Builds the engine over `store`.
    ///
    /// # Errors
    /// [`Error::Config`] when the options contradict each other.
    pub fn build<S: Store>(self, store: S) -> Result<Engine<S>> {
        self.opts.validate()?;
        Ok(Engine {
            inner: Arc::new(Inner {
                store,
                guard: crate::guard::LocalGuard::new(self.opts.guard_ttl, self.opts.guard_cap),
                sku_labels: crate::metrics::SkuLabels::new(
                    self.opts.metric_skus.clone(),
                    self.opts.metric_sku_cap,
                ),
                opts: self.opts,
                layouts: DashMap::default(),
                seen: DashMap::default(),
                last_ready: Default::default(),
            }),
        })
    }
}
