//! The sweeper: one periodic task per engine that drops stale cached layouts, gives back
//! expired reservations and credits home the units left in transit by a process that died
//! between a transfer's debit and its credit.

use super::{Engine, Layout};
use crate::error::{Error, Result};
use crate::store::Store;
use std::sync::Arc;
use std::time::Duration;

/// The running sweeper; dropping it stops it.
#[derive(Debug)]
pub struct Sweeper {
    task: tokio::task::JoinHandle<()>,
}

impl Sweeper {
    /// Stops the sweeper now.
    pub fn stop(self) {}
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<S: Store> Engine<S> {
    /// One round of the sweeper over every SKU the store knows (what [`start_sweeper`] runs
    /// periodically; SKUs this engine never used included, so units in transit are credited
    /// whichever instance moved them):
    /// - a cached layout whose SKU metadata is gone or of another generation (a reload
    ///   elsewhere, or Redis lost its data) is dropped, with a warning, so no call goes on
    ///   using a stale layout, limit or segment count;
    /// - expired reservations go back to their stock (every segment is surveyed);
    /// - transfers whose lease ran out are credited to their destination (the debit re-sent
    ///   first, so that with the durability mode it is replicated before the credit).
    ///
    /// Returns the reservation units given back.
    ///
    /// [`start_sweeper`]: Self::start_sweeper
    ///
    /// # Errors
    /// The first store error met: a SKU or a segment that fails (a master unreachable, or
    /// refusing writes outside durability mode) is passed over, the others swept.
    pub async fn sweep(&self) -> Result<u64> {
        let mut skus = self.inner.store.skus().await?;
        for sku in self.used_skus() {
            if !skus.contains(&sku) {
                skus.push(sku);
            }
        }
        let (mut back, mut first_error) = (0, None);
        for sku in skus {
            let cached = self.inner.layouts.get(&sku).map(|l| Arc::clone(l.value()));
            let meta = match self.inner.store.meta(&sku).await {
                // One SKU's unreadable metadata (or its node's failure) must not stop the sweep
                // of the others.
                Err(e) => {
                    tracing::warn!(sku = %sku, error = %e, "cannot read the SKU metadata; skipped");
                    first_error.get_or_insert(e);
                    continue;
                }
                Ok(m) => m,
            };
            if let Some(l) = &cached
                && meta.as_ref().is_none_or(|m| m.generation != l.generation)
            {
                tracing::warn!(sku = %l.sku, cached = l.generation,
                    now = ?meta.as_ref().map(|m| m.generation),
                    "SKU metadata is gone or changed generation; dropping the cached layout");
                self.forget(l);
            }
            let Some(meta) = meta.filter(|m| m.ready) else {
                continue;
            };
            let l = match self.layout(&sku).await {
                Ok(l) if l.generation == meta.generation => l,
                _ => continue,
            };
            // One SKU whose segment fails (a master that cannot be reached, or refuses writes
            // outside durability mode) does not stop the sweep of the others.
            match self.sweep_layout(&l).await {
                Ok((units, reserved)) => {
                    back += units;
                    if let Some(reserved) = reserved {
                        crate::metrics::reserved(&self.inner.sku_labels, l.sku.as_str(), reserved);
                    }
                }
                Err(e) => {
                    tracing::warn!(sku = %l.sku, error = %e, "sweeping the SKU failed; next sweep retries");
                    first_error.get_or_insert(e);
                }
            }
        }
        if back > 0 {
            crate::metrics::reservations_expired(back);
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(back),
        }
    }

    /// One SKU's sweep: (units reclaimed, units still reserved when every segment answered).
    /// A segment that fails is passed over (the others are swept, then the first error is
    /// returned).
    async fn sweep_layout(&self, l: &Layout) -> Result<(u64, Option<u64>)> {
        let (mut back, mut reserved, mut failed, mut partial) = (0, 0, None, false);
        for index in 0..l.segments {
            let survey = match self.inner.store.survey(l.seg(index), false).await {
                // Its master cannot replicate: nothing ran; the next sweep tries again.
                Err(Error::NoReplicas(_)) => {
                    partial = true;
                    continue;
                }
                Err(e) => {
                    failed.get_or_insert(e);
                    continue;
                }
                Ok(s) => s,
            };
            if let Some(s) = survey {
                back += s.reclaimed;
                reserved += s.state.reserved;
                if s.state.reserved > 0
                    && let Err(e) = self.sweep_holds(l, index).await
                {
                    tracing::warn!(sku = %l.sku, segment = index, error = %e,
                        "settling order items past their deadline failed; next sweep retries");
                }
            }
        }
        if let Err(e) = self.drain(l, true).await {
            tracing::warn!(sku = %l.sku, error = %e,
                "crediting units in transit failed; next sweep retries");
        }
        if let Some(e) = failed {
            if back > 0 {
                crate::metrics::reservations_expired(back);
            }
            return Err(e);
        }
        // A sum that misses segments is no figure for the gauge (the audit's reads, which
        // answer while a master refuses writes, set it then).
        Ok((back, (!partial).then_some(reserved)))
    }

    /// Order items held at segment `index` past their hint: each one's order is asked
    /// (deciding "expired" when its deadline passed on the record's clock) and the item
    /// settled as it says; an order still open is left for a later sweep.
    ///
    /// Items are asked 16 at a time, and the segment is listed again while a full batch made
    /// progress: a storm of dead holders leaves no item for a later sweep but those whose
    /// order's master does not answer.
    async fn sweep_holds(&self, l: &Layout, index: u32) -> Result<()> {
        const BATCH: usize = 256;
        let mut first = None;
        for _ in 0..64 {
            let due = self.inner.store.holds_due(l.seg(index), BATCH).await?;
            let n = due.len();
            let mut settled = Vec::with_capacity(n);
            for chunk in due.chunks(16) {
                let runs = chunk.iter().map(|hold| self.sweep_hold(l, index, hold));
                settled.extend(futures::future::join_all(runs).await);
            }
            let mut progress = false;
            for r in settled {
                match r {
                    Ok(done) => progress |= done,
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
            if n < BATCH || !progress {
                break;
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The SKUs this engine has used (those with a cached layout).
    pub(crate) fn used_skus(&self) -> Vec<crate::ids::Sku> {
        self.inner.layouts.iter().map(|e| e.key().clone()).collect()
    }

    /// Every SKU this engine has seen (loaded, sold, read or audited through it), those whose
    /// data has vanished since included: the live audit goes over them
    /// ([`crate::live_audit`]).
    pub(crate) fn seen_skus(&self) -> Vec<crate::ids::Sku> {
        self.inner.seen.iter().map(|e| e.key().clone()).collect()
    }

    /// The generation of `sku` this engine last saw, if it ever saw the SKU.
    pub(crate) fn seen_generation(&self, sku: &crate::ids::Sku) -> Option<u64> {
        self.inner.seen.get(sku).map(|g| *g)
    }

    /// Which SKUs get their own metric label.
    pub(crate) fn sku_labels(&self) -> &crate::metrics::SkuLabels {
        &self.inner.sku_labels
    }

    /// Starts the sweeper: [`sweep`](Self::sweep) every `every`. It holds no strong reference
    /// to the engine (it ends when the engine is dropped) and stops when the returned handle is
    /// dropped. Every script returns expired reservations of its segment lazily, and a
    /// request that would answer sold out credits units in transit itself, so the sweeper
    /// bounds how long units stay idle, not whether they come back.
    pub fn start_sweeper(&self, every: Duration) -> Sweeper {
        let task = self.periodic(every, false, |engine| async move {
            if let Err(e) = engine.sweep().await {
                tracing::warn!(error = %e, "sweep failed; retrying next round");
            }
        });
        Sweeper { task }
    }

    /// A task running `round` every `every` (the first one at once when `now`), holding no
    /// strong reference to the engine: it ends when the engine is dropped. The sweeper's and
    /// the live audit's loop.
    pub(crate) fn periodic<F, Fut>(
        &self,
        every: Duration,
        now: bool,
        round: F,
    ) -> tokio::task::JoinHandle<()>
    where
        F: Fn(Engine<S>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            if !now {
                tokio::time::sleep(every).await;
            }
            loop {
                let Some(inner) = weak.upgrade() else { return };
                round(Engine { inner }).await;
                tokio::time::sleep(every).await;
            }
        })
    }
}
