//! What a service runs next to its engine, started in one call: the sweeper (expired
//! reservations back to stock, units in transit credited home, stale layouts dropped) and the
//! live audit (conservation as a metric). Owned by one handle whose drop stops both.

use super::live_audit::LiveAudit;
use super::{Engine, Sweeper};
use crate::ids::Sku;
use crate::store::Store;
use std::time::Duration;

/// Which background tasks [`Engine::start_background`] runs, and how often. `Default`: the
/// sweeper every second and the live audit every 10 s over the SKUs the engine has used, as
/// `shardstock serve` runs them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackgroundOptions {
    sweep_every: Option<Duration>,
    audit_every: Option<Duration>,
    audit_skus: Vec<Sku>,
}

impl Default for BackgroundOptions {
    fn default() -> Self {
        Self {
            sweep_every: Some(Duration::from_secs(1)),
            audit_every: Some(Duration::from_secs(10)),
            audit_skus: Vec::new(),
        }
    }
}

impl BackgroundOptions {
    /// How often the sweeper runs ([`Engine::sweep`]); `None`: no sweeper in this process
    /// (another instance sweeps: one sweeper per store is enough, more are harmless).
    pub fn sweep_every(mut self, every: Option<Duration>) -> Self {
        self.sweep_every = every;
        self
    }

    /// How often the live audit runs ([`Engine::audit_round`], the `shardstock_audit_*`
    /// gauges an alert watches); `None`: no live audit.
    pub fn audit_every(mut self, every: Option<Duration>) -> Self {
        self.audit_every = every;
        self
    }

    /// SKUs the live audit checks besides those this engine has used (e.g. every SKU of the
    /// sale, from the first round on).
    pub fn audit_skus(mut self, skus: Vec<Sku>) -> Self {
        self.audit_skus = skus;
        self
    }
}

/// The background tasks of an engine ([`Engine::start_background`]); dropping it, or
/// [`Background::stop`], stops them. The tasks also end on their own once every clone of the
/// engine is dropped.
#[derive(Debug)]
#[must_use = "dropping the handle stops the background tasks"]
pub struct Background {
    sweeper: Option<Sweeper>,
    audit: Option<LiveAudit>,
}

impl Background {
    /// Stops the tasks now.
    pub fn stop(self) {}

    /// Whether the sweeper runs.
    pub fn sweeps(&self) -> bool {
        self.sweeper.is_some()
    }

    /// Whether the live audit runs.
    pub fn audits(&self) -> bool {
        self.audit.is_some()
    }
}

impl<S: Store> Engine<S> {
    /// Starts what a service runs next to its engine ([`BackgroundOptions`]): the sweeper
    /// ([`Engine::start_sweeper`]) and the live audit ([`Engine::start_live_audit`]). Must
    /// be called inside a Tokio runtime. Keep the handle as long as the service runs.
    ///
    /// ```no_run
    /// # async fn run(engine: shardstock::Engine<shardstock::MemoryStore>) {
    /// use shardstock::BackgroundOptions;
    /// let _background = engine.start_background(BackgroundOptions::default());
    /// // ... serve requests; dropping `_background` stops the tasks.
    /// # }
    /// ```
    pub fn start_background(&self, opts: BackgroundOptions) -> Background {
        Background {
            sweeper: opts.sweep_every.map(|every| self.start_sweeper(every)),
            audit: opts
                .audit_every
                .map(|every| self.start_live_audit(every, opts.audit_skus)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LoadOptions, MemoryStore};

    /// The generation of `sku`'s layout cached by `engine`.
    fn cached(engine: &Engine<MemoryStore>, sku: &Sku) -> Option<u64> {
        engine.inner.layouts.get(sku).map(|l| l.generation)
    }

    /// The sweeper of `start_background` follows a reload made by another instance (its
    /// cached layout is replaced without a call of its own); once the handle is dropped it
    /// no longer does.
    #[tokio::test]
    async fn background_sweeps_until_stopped() {
        let store = MemoryStore::new();
        let mine = Engine::builder().build(store.clone()).unwrap();
        let other = Engine::builder().build(store).unwrap();
        let sku = Sku::new("bg").unwrap();
        let first = mine.load(&sku, 10, LoadOptions::new(2)).await.unwrap();
        let reload = || other.load(&sku, 10, LoadOptions::new(2).replace(true));
        let opts = BackgroundOptions::default()
            .sweep_every(Some(Duration::from_millis(10)))
            .audit_every(None);
        let background = mine.start_background(opts);
        assert!(background.sweeps() && !background.audits());
        let second = reload().await.unwrap();
        assert!(second > first);
        let mut followed = false;
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if cached(&mine, &sku) == Some(second) {
                followed = true;
                break;
            }
        }
        assert!(followed, "the sweeper did not pick up the reload");
        drop(background);
        reload().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(cached(&mine, &sku), Some(second), "a stopped sweeper ran");
    }

    #[tokio::test]
    async fn both_tasks_by_default() {
        let engine = Engine::builder().build(MemoryStore::new()).unwrap();
        let background = engine.start_background(BackgroundOptions::default());
        assert!(background.sweeps() && background.audits());
        background.stop();
    }
}
