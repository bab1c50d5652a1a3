//! The audit: a conservation check of one SKU ([`Audit`]), worked out from one read of its
//! metadata and segments (pure; [`Engine::audit`](crate::Engine::audit) does the reading).

use crate::ids::Sku;
use crate::store::{Meta, SegmentState, Survey};

/// One segment in an [`Audit`].
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SegmentAudit {
    /// Index.
    pub index: u32,
    /// Counters (zeros when the segment is missing).
    #[serde(flatten)]
    pub state: SegmentState,
    /// Units held by this segment's reservations (must equal `reserved`).
    pub held: u64,
    /// Reservations in this segment (those past their expiry included).
    pub reservations: u64,
    /// Of `reserved`, units of reservations past their expiry: on their way back to stock,
    /// returned by the next step that writes at this segment (an audit writes nothing).
    pub expired: u64,
    /// `loaded + restocked + moved_in = remaining + reserved + sold + moved_out` holds, every
    /// reserved unit belongs to a live reservation, and the segment exists.
    pub ok: bool,
}

/// A conservation check of one SKU: `loaded + restocked = remaining + in_transit + reserved +
/// sold` in total, where units in transit (debited by a transfer, not yet credited home) are
/// `Σ moved_out − Σ moved_in`; `loaded + restocked + moved_in = remaining + reserved + sold +
/// moved_out` per segment; every reserved unit is held by a reservation (per segment, read
/// atomically with the counters); and the segments' loads add up to what the SKU was loaded
/// with.
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
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
    /// Units held by reservations (not sold, not sellable until they end; `expired` of them
    /// have ended and are on their way back).
    pub reserved: u64,
    /// Of `reserved`, units of reservations past their expiry, not returned yet: the next
    /// step that writes at their segment (a sale included) returns them first. An audit
    /// writes nothing, so it reads them here rather than returning them.
    pub expired: u64,
    /// Units moving between segments (debited by a transfer, not yet credited home): not
    /// sellable until credited, which their engine or any sweeper does.
    pub in_transit: u64,
    /// Every check passed.
    pub ok: bool,
    /// What failed, in words.
    pub problems: Vec<String>,
    /// Per segment.
    pub segments: Vec<SegmentAudit>,
}

impl SegmentAudit {
    /// Units a buyer can be sold here now: the stock plus the expired reservations' units
    /// (a sale returns those first). What `status` and the remaining-units gauges show.
    pub fn sellable(&self) -> u64 {
        self.state.stock.saturating_add(self.expired)
    }
}

impl Audit {
    /// Units a buyer can be sold now, per segment ([`SegmentAudit::sellable`]): what `status`
    /// and the remaining-units gauges show.
    pub fn sellable_per_segment(&self) -> Vec<u64> {
        self.segments.iter().map(SegmentAudit::sellable).collect()
    }

    /// Units held by reservations not past their expiry (`reserved` without `expired`).
    pub fn live_reserved(&self) -> u64 {
        self.reserved.saturating_sub(self.expired)
    }

    /// Checks the SKU `sku` described by `meta` from `segs`, what `survey.lua` read of each of
    /// its segments (`None`: missing or of another generation).
    pub(crate) fn check(sku: &Sku, meta: &Meta, segs: &[Option<Survey>]) -> Audit {
        let mut problems = Vec::new();
        let mut segments = Vec::with_capacity(segs.len());
        let (mut loaded, mut restocked, mut remaining, mut sold, mut reserved) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        let (mut moved_in, mut moved_out, mut expired) = (0u64, 0u64, 0u64);
        for (i, h) in segs.iter().enumerate() {
            let state = h.map(|h| h.state).unwrap_or_default();
            let ok = match h {
                None => {
                    problems.push(format!("segment {i} is missing or of another generation"));
                    false
                }
                Some(h) => {
                    let s = &h.state;
                    let mut ok = s.balances();
                    if !ok {
                        problems.push(format!(
                            "segment {i}: loaded {} + restocked {} + moved in {} != remaining {} + reserved {} + sold {} + moved out {}",
                            s.loaded, s.restocked, s.moved_in, s.stock, s.reserved, s.sold, s.moved_out
                        ));
                    }
                    // Every reserved unit must belong to a live reservation (it comes back
                    // when that reservation ends); a unit held by nothing never would.
                    if s.reserved != h.held {
                        ok = false;
                        problems.push(format!(
                            "segment {i}: reserved {} but its {} reservations hold {} ({})",
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
            moved_in += state.moved_in;
            moved_out += state.moved_out;
            expired += h.map_or(0, |h| h.expired);
            segments.push(SegmentAudit {
                index: i as u32,
                state,
                held: h.map_or(0, |h| h.held),
                reservations: h.map_or(0, |h| h.live),
                expired: h.map_or(0, |h| h.expired),
                ok,
            });
        }
        if loaded != meta.loaded {
            problems.push(format!(
                "segments were loaded with {loaded} units but the SKU with {}",
                meta.loaded
            ));
        }
        // Debits happen before credits, so a read taken segment by segment never sees more
        // credited than debited unless it raced a transfer: the engine reads again then.
        let in_transit = moved_out.saturating_sub(moved_in);
        if moved_in > moved_out {
            problems.push(format!(
                "total: {moved_in} units credited by transfers but only {moved_out} debited"
            ));
        }
        if loaded as u128 + restocked as u128
            != remaining as u128 + in_transit as u128 + reserved as u128 + sold as u128
        {
            problems.push(format!(
                "total: loaded {loaded} + restocked {restocked} != remaining {remaining} + in transit {in_transit} + reserved {reserved} + sold {sold}"
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
            expired,
            in_transit,
            ok: problems.is_empty(),
            problems,
            segments,
        }
    }
}
