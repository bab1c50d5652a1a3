//! The audit: a conservation check of one SKU ([`Audit`]), worked out from one read of its
//! metadata and segments (pure; [`Engine::audit`](crate::Engine::audit) does the reading).

use crate::ids::Sku;
use crate::store::{HeldState, Meta, SegmentState};

/// One segment in an [`Audit`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SegmentAudit {
    /// Index.
    pub index: u32,
    /// Counters (zeros when the segment is missing).
    #[serde(flatten)]
    pub state: SegmentState,
    /// Units held by this segment's live reservations (must equal `reserved`).
    pub held: u64,
    /// Live reservations in this segment.
    pub reservations: u64,
    /// `loaded + restocked = remaining + reserved + sold` holds, every reserved unit belongs
    /// to a live reservation, and the segment exists.
    pub ok: bool,
}

/// A conservation check of one SKU: `loaded + restocked = remaining + reserved + sold`, per
/// segment and in total; every reserved unit is held by a live reservation (per segment, read
/// atomically with the counters); and the segments' loads add up to what the SKU was loaded
/// with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Audit {
    /// The SKU.
    pub sku: String,
    /// Load generation.
    pub generation: u64,
    /// Units loaded (from the SKU metadata).
    pub loaded: u64,
    /// Units restocked since.
    pub restocked: u64,
    /// Units left.
    pub remaining: u64,
    /// Units sold.
    pub sold: u64,
    /// Units held by live reservations (not sold, not sellable until they end).
    pub reserved: u64,
    /// Every check passed.
    pub ok: bool,
    /// What failed, in words.
    pub problems: Vec<String>,
    /// Per segment.
    pub segments: Vec<SegmentAudit>,
}

impl Audit {
    /// Checks the SKU `sku` described by `meta` from `segs`, what `held.lua` read of each of
    /// its segments (`None`: missing or of another generation).
    pub(crate) fn check(sku: &Sku, meta: &Meta, segs: &[Option<HeldState>]) -> Audit {
        let mut problems = Vec::new();
        let mut segments = Vec::with_capacity(segs.len());
        let (mut loaded, mut restocked, mut remaining, mut sold, mut reserved) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        for (i, h) in segs.iter().enumerate() {
            let state = h.map(|h| h.state).unwrap_or_default();
            let ok = match h {
                None => {
                    problems.push(format!("segment {i} is missing or of another generation"));
                    false
                }
                Some(h) => {
                    let s = &h.state;
                    let mut ok = s.loaded.checked_add(s.restocked)
                        == s.stock
                            .checked_add(s.sold)
                            .and_then(|x| x.checked_add(s.reserved));
                    if !ok {
                        problems.push(format!(
                            "segment {i}: loaded {} + restocked {} != remaining {} + reserved {} + sold {}",
                            s.loaded, s.restocked, s.stock, s.reserved, s.sold
                        ));
                    }
                    // Every reserved unit must belong to a live reservation (it comes back
                    // when that reservation ends); a unit held by nothing never would.
                    if s.reserved != h.held {
                        ok = false;
                        problems.push(format!(
                            "segment {i}: reserved {} but its {} live reservations hold {} ({})",
                            s.reserved,
                            h.live,
                            h.held,
                            if s.reserved > h.held {
                                format!("{} reserved units held by nothing", s.reserved - h.held)
                            } else {
                                format!(
                                    "{} held units not counted as reserved",
                                    h.held - s.reserved
                                )
                            }
                        ));
                    }
                    if h.orphans > 0 {
                        ok = false;
                        problems.push(format!(
                            "segment {i}: {} reservation index entries without a live reservation",
                            h.orphans
                        ));
                    }
                    ok
                }
            };
            loaded += state.loaded;
            restocked += state.restocked;
            remaining += state.stock;
            sold += state.sold;
            reserved += state.reserved;
            segments.push(SegmentAudit {
                index: i as u32,
                state,
                held: h.map_or(0, |h| h.held),
                reservations: h.map_or(0, |h| h.live),
                ok,
            });
        }
        if loaded != meta.loaded {
            problems.push(format!(
                "segments were loaded with {loaded} units but the SKU with {}",
                meta.loaded
            ));
        }
        if loaded + restocked != remaining + reserved + sold {
            problems.push(format!(
                "total: loaded {loaded} + restocked {restocked} != remaining {remaining} + reserved {reserved} + sold {sold}"
            ));
        }
        Audit {
            sku: sku.to_string(),
            generation: meta.generation,
            loaded: meta.loaded,
            restocked,
            remaining,
            sold,
            reserved,
            ok: problems.is_empty(),
            problems,
            segments,
        }
    }
}
