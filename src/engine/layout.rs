//! A loaded SKU's layout as this process knows it (generation, segment count, per-user limit,
//! placement, hints, what the last survey found) and the one place a segment's address is put
//! together ([`seg_at`]). Plain state: the cache that reads and drops layouts is `layouts.rs`.

use crate::ids::Sku;
use crate::router::Hints;
use crate::store::{SegAddr, SegmentState};
use std::sync::Arc;

/// What this engine knows locally about a loaded SKU.
#[derive(Debug)]
pub(crate) struct Layout {
    pub(crate) sku: Sku,
    pub(crate) generation: u64,
    pub(crate) segments: u32,
    /// Units one user may hold (0 = no limit).
    pub(crate) user_limit: u64,
    /// Where the segments live (hash tag suffixes; unplaced on a single Redis).
    pub(crate) placement: crate::cluster::placement::Placement,
    pub(crate) hints: Hints,
    /// Sold out from memory (see `sold_out.rs`).
    pub(crate) sold_out: super::sold_out::SoldOut,
    /// Shares "survey every segment" between concurrent callers (see [`crate::shared_read`]):
    /// a sold-out storm costs one survey per round trip, not one per request.
    pub(super) surveys: Arc<crate::shared_read::SharedRead<Surveyed>>,
    /// One gather at a time in this process: a request still short after its first rounds of
    /// transfers (others took what it moved home) goes on holding this, so requests of one
    /// process do not pull the last units back and forth between their homes.
    pub(crate) gather: tokio::sync::Mutex<()>,
}

impl Layout {
    /// Segment `index` of this generation.
    pub(crate) fn seg(&self, index: u32) -> SegAddr<'_> {
        seg_at(&self.sku, self.generation, index, &self.placement)
    }
}

/// A survey pass over every segment of a SKU.
#[derive(Debug, Clone, Default)]
pub(crate) struct Surveyed {
    /// Each segment's counters; `None` when missing, of another generation, or refused.
    pub(crate) segs: Vec<Option<SegmentState>>,
    /// Segments whose master refused the survey before it ran ([`Error::NoReplicas`]: it
    /// cannot reach its replicas); their counters are unknown.
    pub(crate) down: Vec<bool>,
}

/// Segment `index` of `sku` in load generation `generation`, placed as `placement` says: the
/// one place a [`SegAddr`] is put together.
pub(crate) fn seg_at<'a>(
    sku: &'a Sku,
    generation: u64,
    index: u32,
    placement: &crate::cluster::placement::Placement,
) -> SegAddr<'a> {
    SegAddr::new(sku, generation, index).with_suffix(placement.suffix(index))
}
