//! Routing hints: the stock each segment held when this process last saw it, which the
//! request protocol uses to pick transfer donors (fullest first) and their floors.
//!
//! Hints are only ever used to *choose*, never to answer. Before the engine says "sold out" or
//! "insufficient" it surveys every segment in the store, so a restock made by any instance is
//! sellable at once, whatever a hint says. A hint goes stale after `ttl` and then reads as
//! unknown.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Per-SKU hints: last observed stock of each segment.
#[derive(Debug)]
pub(crate) struct Hints {
    stock: Vec<AtomicU64>,
    /// Observation time in ms since `origin`, plus one (0 = never observed).
    at: Vec<AtomicU64>,
    origin: Instant,
    ttl_ms: u64,
}

impl Hints {
    /// Hints for `segments` segments that go stale after `ttl` (zero: every hint is stale).
    pub(crate) fn new(segments: u32, ttl: Duration) -> Self {
        Self {
            stock: (0..segments).map(|_| AtomicU64::new(0)).collect(),
            at: (0..segments).map(|_| AtomicU64::new(0)).collect(),
            origin: Instant::now(),
            ttl_ms: ttl.as_millis() as u64,
        }
    }

    fn now(&self) -> u64 {
        self.ms(Instant::now())
    }

    /// `at` in ms since `origin`, plus one.
    fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_millis() as u64 + 1
    }

    /// Records that segment `i` held `stock` units just now.
    pub(crate) fn observe(&self, i: u32, stock: u64) {
        self.observe_at(Instant::now(), i, stock);
    }

    /// Records that segment `i` held `stock` units at `at`: the start of a call of one or two
    /// round trips, stamped on the reply it just had (its hint ages by that call's length).
    /// The stock is the latest reply's; its time never moves back (a call that began earlier
    /// may answer after one that began later).
    pub(crate) fn observe_at(&self, at: Instant, i: u32, stock: u64) {
        if let (Some(s), Some(a)) = (self.stock.get(i as usize), self.at.get(i as usize)) {
            s.store(stock, Relaxed);
            a.fetch_max(self.ms(at), Relaxed);
        }
    }

    /// The last observed stock of every segment; `u64::MAX` (unknown) where never observed or
    /// observed longer than `ttl` ago.
    pub(crate) fn observed(&self) -> Vec<u64> {
        let now = self.now();
        self.stock
            .iter()
            .zip(&self.at)
            .map(|(s, a)| {
                let at = a.load(Relaxed);
                if at == 0 || now.saturating_sub(at) >= self.ttl_ms {
                    u64::MAX
                } else {
                    s.load(Relaxed)
                }
            })
            .collect()
    }
}
