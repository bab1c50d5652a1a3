//! The layout cache: a loaded SKU's [`Layout`] is read from its metadata once and dropped when
//! a store reply says the SKU was reloaded (`Stale`).

use super::layout::Layout;
use super::state::Engine;
use crate::error::{Error, Result};
use crate::ids::Sku;
use crate::router::Hints;
use crate::store::Store;
use std::sync::Arc;

impl<S: Store> Engine<S> {
    /// The SKU's layout: cached, or read from its metadata.
    pub(crate) async fn layout(&self, sku: &Sku) -> Result<Arc<Layout>> {
        if let Some(l) = self.inner.layouts.get(sku) {
            return Ok(Arc::clone(&l));
        }
        // Boxed: the metadata read's state stays out of every request's future.
        Box::pin(self.read_layout(sku)).await
    }

    /// [`layout`](Self::layout) when none is cached: reads the SKU's metadata.
    async fn read_layout(&self, sku: &Sku) -> Result<Arc<Layout>> {
        let meta = self
            .inner
            .store
            .meta(sku)
            .await?
            .ok_or_else(|| Error::NotLoaded(sku.to_string()))?;
        self.saw(sku, meta.generation);
        if !meta.ready {
            return Err(Error::NotReady(sku.to_string()));
        }
        if meta.home_fn != crate::segments::HOME_FN {
            // Another build placed this generation's requests: selling here could decide one
            // request id at two homes.
            return Err(Error::Protocol(format!(
                "{sku} was loaded with home function {} but this build places requests with {}: \
                 run one build per SKU, or reload it",
                meta.home_fn,
                crate::segments::HOME_FN
            )));
        }
        let layout = Arc::new(Layout {
            sku: sku.clone(),
            generation: meta.generation,
            segments: meta.segments,
            user_limit: meta.user_limit,
            placement: meta.placement,
            hints: Hints::new(meta.segments, self.inner.opts.hint_ttl),
            sold_out: super::sold_out::SoldOut::new(
                self.inner.store.stock_watch(sku),
                self.inner.opts.sold_out_ttl,
            ),
            gather: tokio::sync::Mutex::new(()),
            surveys: crate::shared_read::SharedRead::new(),
        });
        // Concurrent first callers share one layout (its sold-out proof counts what applied
        // through it); a cached layout of another generation is replaced.
        let cached = Arc::clone(
            self.inner
                .layouts
                .entry(sku.clone())
                .or_insert_with(|| Arc::clone(&layout))
                .value(),
        );
        if cached.generation == layout.generation {
            return Ok(cached);
        }
        self.inner.layouts.insert(sku.clone(), Arc::clone(&layout));
        Ok(layout)
    }

    /// The placement suffix of segment `index` of `sku` in `generation`: from the cached layout
    /// when it is that generation's and knows the index, else from the metadata (ready or not:
    /// a reservation ends during a reload too). `None` when unplaced or the SKU is gone.
    pub(crate) async fn suffix_of(
        &self,
        sku: &Sku,
        generation: u64,
        index: u32,
    ) -> Result<Option<u16>> {
        if let Some(l) = self.inner.layouts.get(sku)
            && l.generation == generation
            && (!l.placement.is_placed() || (index as usize) < l.placement.len())
        {
            return Ok(l.placement.suffix(index));
        }
        let meta = self.inner.store.meta(sku).await?;
        Ok(meta.and_then(|m| m.placement.suffix(index)))
    }

    /// True when `l` is still the SKU's layout in the store (one metadata read).
    pub(super) async fn is_current(&self, l: &Layout) -> Result<bool> {
        Ok(self
            .inner
            .store
            .meta(&l.sku)
            .await?
            .is_some_and(|m| m.generation == l.generation))
    }

    /// Drops `l` from the cache (unless a newer layout replaced it already): the next call
    /// reads the SKU's metadata afresh.
    pub(crate) fn forget(&self, l: &Layout) {
        self.inner
            .layouts
            .remove_if(&l.sku, |_, cached| cached.generation == l.generation);
    }
}
