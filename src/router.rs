//! Routing: which segment to try next, and the local "known short" hints that let the hot
//! path skip segments without a round trip.
//!
//! Hints are only ever used to *order and skip* attempts, never to answer. Before the engine
//! says "sold out" or "insufficient" it reads every segment from the store (one pipelined round
//! trip), so a restock made by any instance is sellable at once, whatever a hint says.
//! A hint is the stock last seen in a segment and when; it goes stale after `ttl`.

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
    /// Hints for `segments` segments that expire after `ttl` (zero disables skipping).
    pub(crate) fn new(segments: u32, ttl: Duration) -> Self {
        Self {
            stock: (0..segments).map(|_| AtomicU64::new(0)).collect(),
            at: (0..segments).map(|_| AtomicU64::new(0)).collect(),
            origin: Instant::now(),
            ttl_ms: ttl.as_millis() as u64,
        }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64 + 1
    }

    /// Records that segment `i` held `stock` units just now.
    pub(crate) fn observe(&self, i: u32, stock: u64) {
        if let (Some(s), Some(a)) = (self.stock.get(i as usize), self.at.get(i as usize)) {
            s.store(stock, Relaxed);
            a.store(self.now(), Relaxed);
        }
    }

    /// Forgets what was seen of segment `i` (e.g. stock just came back to it).
    pub(crate) fn forget(&self, i: u32) {
        if let Some(a) = self.at.get(i as usize) {
            a.store(0, Relaxed);
        }
    }

    /// True when segment `i` was recently seen with fewer than `qty` units: worth skipping.
    pub(crate) fn likely_short(&self, i: u32, qty: u64) -> bool {
        let (Some(s), Some(a)) = (self.stock.get(i as usize), self.at.get(i as usize)) else {
            return false;
        };
        // The stock first: a segment seen with enough needs no clock read.
        let at = a.load(Relaxed);
        s.load(Relaxed) < qty && at != 0 && self.now().saturating_sub(at) < self.ttl_ms
    }

    /// The last observed stock of every segment (0 where never observed).
    pub(crate) fn observed(&self) -> Vec<u64> {
        self.stock
            .iter()
            .zip(&self.at)
            .map(|(s, a)| {
                if a.load(Relaxed) == 0 {
                    0
                } else {
                    s.load(Relaxed)
                }
            })
            .collect()
    }
}

/// The other segments in the order a request with home `home` tries them: a rotation starting
/// after `home`. Since homes are spread by hashing request ids, so are fallbacks.
pub(crate) fn others(home: u32, segments: u32) -> impl Iterator<Item = u32> {
    (1..segments).map(move |k| (home + k) % segments)
}

/// Plans an all-or-nothing multi-segment take of `need` units from `stocks` (units per
/// segment, by index): the fullest segments first, so as few segments as possible are
/// touched. `None` when the stock in total is short.
pub(crate) fn plan_split(stocks: &[u64], need: u64) -> Option<Vec<(u32, u64)>> {
    let mut by_stock: Vec<(u32, u64)> = (0u32..)
        .zip(stocks.iter().copied())
        .filter(|(_, s)| *s > 0)
        .collect();
    by_stock.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut left = need;
    let mut plan = Vec::new();
    for (i, s) in by_stock {
        if left == 0 {
            break;
        }
        let take = s.min(left);
        plan.push((i, take));
        left -= take;
    }
    (left == 0).then_some(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_visits_every_other_segment_once() {
        let v: Vec<u32> = others(2, 5).collect();
        assert_eq!(v, vec![3, 4, 0, 1]);
        assert_eq!(others(0, 1).count(), 0);
    }

    #[test]
    fn hints_skip_only_fresh_short_segments() {
        let h = Hints::new(3, Duration::from_secs(60));
        assert!(!h.likely_short(0, 1), "unknown is not short");
        h.observe(0, 0);
        h.observe(1, 5);
        assert!(h.likely_short(0, 1));
        assert!(!h.likely_short(1, 5));
        assert!(h.likely_short(1, 6));
        let off = Hints::new(3, Duration::ZERO);
        off.observe(0, 0);
        assert!(!off.likely_short(0, 1), "ttl 0 disables skipping");
    }

    #[test]
    fn split_plan_is_all_or_nothing() {
        let stocks = [1, 0, 1, 1];
        assert_eq!(plan_split(&stocks, 3), Some(vec![(0, 1), (2, 1), (3, 1)]));
        assert_eq!(plan_split(&stocks, 4), None);
        assert_eq!(plan_split(&[5, 9], 10), Some(vec![(1, 9), (0, 1)]));
    }
}
