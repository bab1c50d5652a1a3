//! The layout cache.

use super::*;

/// What this engine knows locally about a loaded SKU.
#[derive(Debug)]
pub(crate) struct Layout {
    pub(crate) generation: u64,
    pub(crate) segments: u32,
    /// Units one user may hold (0 = no limit).
    pub(crate) user_limit: u64,
    pub(crate) hints: Hints,
    /// Coalesces "read every segment" for this SKU (see [`crate::coalesce`]).
    pub(crate) reads: Arc<ReadGroup<Vec<Option<SegmentState>>>>,
    /// When the remaining-units gauges were last set (ms since `born`).
    pub(crate) gauges_at: std::sync::atomic::AtomicU64,
    pub(crate) born: Instant,
}

impl<S: Store> Engine<S> {
    pub(crate) async fn layout(&self, sku: &Sku) -> Result<Arc<Layout>> {
        if let Some(l) = self.inner.layouts.get(sku) {
            return Ok(Arc::clone(&l));
        }
        let meta = self
            .inner
            .store
            .meta(sku)
            .await?
            .ok_or_else(|| Error::NotLoaded(sku.to_string()))?;
        if !meta.ready {
            return Err(Error::NotReady(sku.to_string()));
        }
        let layout = Arc::new(Layout {
            generation: meta.generation,
            segments: meta.segments,
            user_limit: meta.user_limit,
            hints: Hints::new(meta.segments, self.inner.opts.hint_ttl),
            reads: ReadGroup::new(),
            gauges_at: std::sync::atomic::AtomicU64::new(0),
            born: Instant::now(),
        });
        self.inner.layouts.insert(sku.clone(), Arc::clone(&layout));
        Ok(layout)
    }

    /// Every segment of `sku`, from a read that started after this call (shared with
    /// concurrent callers; see [`crate::coalesce`]). Falls back to a read of its own when the
    /// shared one failed, so errors come back typed.
    pub(crate) async fn read_segments(
        &self,
        l: &Layout,
        sku: &Sku,
    ) -> Result<Vec<Option<SegmentState>>> {
        let (inner, sku_owned) = (Arc::clone(&self.inner), sku.clone());
        let (generation, segments) = (l.generation, l.segments);
        let shared = l
            .reads
            .join(move || {
                let (inner, sku) = (Arc::clone(&inner), sku_owned.clone());
                async move { inner.store.segments(&sku, generation, segments).await.ok() }
            })
            .await;
        match shared {
            Some(v) => Ok(v.as_ref().clone()),
            None => self.inner.store.segments(sku, generation, segments).await,
        }
    }

    /// True when `l` is still the SKU's layout in the store (one metadata read).
    pub(crate) async fn is_current(&self, l: &Layout, sku: &Sku) -> Result<bool> {
        Ok(self
            .inner
            .store
            .meta(sku)
            .await?
            .is_some_and(|m| m.generation == l.generation))
    }

    pub(crate) fn forget(&self, sku: &Sku, generation: u64) {
        self.inner
            .layouts
            .remove_if(sku, |_, l| l.generation == generation);
    }

    /// Sets the remaining-units gauges from the hints, at most every 100 ms per SKU.
    pub(crate) fn maybe_gauges(&self, l: &Layout, sku: &Sku) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = l.born.elapsed().as_millis() as u64 + 100;
        let last = l.gauges_at.load(Relaxed);
        if now < last + 100
            || l.gauges_at
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_err()
        {
            return;
        }
        crate::metrics::remaining(&self.inner.sku_labels, sku.as_str(), &l.hints.observed());
    }
}

/// Feeds a read of every segment into the hints; `None` when a segment is missing (the
/// layout changed).
pub(crate) fn observe(l: &Layout, segs: &[Option<SegmentState>]) -> Option<Vec<(u32, u64)>> {
    let mut out = Vec::with_capacity(segs.len());
    for (i, s) in segs.iter().enumerate() {
        let s = s.as_ref()?;
        l.hints.observe(i as u32, s.stock);
        out.push((i as u32, s.stock));
    }
    Some(out)
}
