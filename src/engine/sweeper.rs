//! The sweeper: one periodic task per engine that drops stale cached layouts, gives back
//! expired reservations and recovers abandoned fallback claims.

use super::{Engine, Layout};
use crate::error::Result;
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
    /// One round of the sweeper over the SKUs this engine has used (what [`start_sweeper`]
    /// runs periodically):
    /// - a cached layout whose SKU metadata is gone or of another generation (a reload
    ///   elsewhere, or Redis lost its data) is dropped, with a warning, so no call goes on
    ///   using a stale layout, limit or segment count;
    /// - expired reservations go back to their stock;
    /// - fallback claims whose holder let the lease run out (crashed, or the call's future was
    ///   dropped) are taken over: a complete one is settled as applied, an incomplete one is
    ///   refunded and sealed (a retry of its request id gets [`Error::Sealed`](crate::Error::Sealed)); the user's
    ///   per-user entry follows.
    ///
    /// Returns the reservation units given back.
    ///
    /// [`start_sweeper`]: Self::start_sweeper
    ///
    /// # Errors
    /// Store errors.
    pub async fn sweep(&self) -> Result<u64> {
        let layouts: Vec<Arc<Layout>> = self
            .inner
            .layouts
            .iter()
            .map(|e| Arc::clone(e.value()))
            .collect();
        let mut back = 0;
        for l in layouts {
            let meta = match self.inner.store.meta(&l.sku).await {
                // One SKU's unreadable metadata must not stop the sweep of the others.
                Err(e @ crate::error::Error::Protocol(_)) => {
                    tracing::warn!(sku = %l.sku, error = %e, "unreadable SKU metadata; skipped");
                    continue;
                }
                r => r?,
            };
            match meta {
                Some(m) if m.generation == l.generation => {}
                other => {
                    tracing::warn!(sku = %l.sku, cached = l.generation,
                        now = ?other.map(|m| m.generation),
                        "SKU metadata is gone or changed generation; dropping the cached layout");
                    self.forget(&l);
                    continue;
                }
            }
            let mut reserved = 0;
            for index in 0..l.segments {
                let (units, held) = self.reclaim_expired(l.seg(index)).await?;
                back += units;
                reserved += held;
                if let Err(e) = self.recover_claims(&l, index).await {
                    tracing::warn!(sku = %l.sku, segment = index, error = %e,
                        "recovering abandoned claims failed; next sweep retries");
                }
            }
            crate::metrics::reserved(&self.inner.sku_labels, l.sku.as_str(), reserved);
        }
        if back > 0 {
            crate::metrics::reservations_expired(back);
        }
        Ok(back)
    }

    /// The SKUs this engine has used (those with a cached layout): the ones [`sweep`] goes
    /// over, and the live audit too ([`crate::live_audit`]).
    ///
    /// [`sweep`]: Self::sweep
    pub(crate) fn used_skus(&self) -> Vec<crate::ids::Sku> {
        self.inner.layouts.iter().map(|e| e.key().clone()).collect()
    }

    /// Which SKUs get their own metric label.
    pub(crate) fn sku_labels(&self) -> &crate::metrics::SkuLabels {
        &self.inner.sku_labels
    }

    /// Starts the sweeper: [`sweep`](Self::sweep) every `every`. It holds no strong reference
    /// to the engine (it ends when the engine is dropped) and stops when the returned handle is
    /// dropped. Lazy reclaim inside every script returns stock even with no sweeper running.
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
