//! What the store answers: one reply type per step, and the states it reads.
//!
//! Reply enums are `#[non_exhaustive]`: a new answer of a script is a new variant.

use crate::ids::{RequestId, UserId};
use crate::segments::Part;
use crate::store::RequestKind;

/// Reply of [`Store::deduct_home`](super::Store::deduct_home) (`deduct.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HomeReply {
    /// Taken here in full.
    Applied {
        /// Segment stock after the deduction.
        stock_after: u64,
    },
    /// Not enough here.
    Short {
        /// Segment stock.
        stock: u64,
        /// The epoch of the fallback claim written for the caller: 1, or one above the epoch
        /// of this request id's released claim (its shut-out markers may still refuse lower
        /// epochs at the other segments). `None`: no claim was written.
        claimed: Option<u64>,
    },
    /// The request id was applied before.
    Replay(Vec<Part>),
    /// Another caller holds the fallback claim.
    Pending {
        /// The claim's epoch.
        epoch: u64,
        /// Lease left on the store's clock.
        lease_left_ms: u64,
    },
    /// Same request id, other parameters (`user`, `qty` or `kind`).
    Mismatch(&'static str),
    /// Segment missing or of another generation.
    Stale,
    /// The request id was sealed: its per-user claim expired and was verified void, or its
    /// abandoned fallback claim was recovered by the sweeper.
    Sealed,
}

/// Reply of [`Store::take`](super::Store::take) (`take.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TakeReply {
    /// `part` units are taken (now, or earlier by the same epoch).
    Taken {
        /// Segment stock after.
        stock_after: u64,
        /// Units taken.
        part: u64,
    },
    /// Not enough here.
    Short {
        /// Segment stock.
        stock: u64,
    },
    /// The caller's claim was superseded (a newer epoch holds it, or shut the caller out
    /// of this segment).
    Superseded,
    /// Same request id, other parameters.
    Mismatch(&'static str),
    /// Segment missing or of another generation.
    Stale,
}

/// Reply of [`Store::settle`](super::Store::settle) (`settle.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettleReply {
    /// Settled.
    Ok,
    /// Someone else settled it as applied with these parts.
    Applied(Vec<Part>),
    /// Someone else holds the claim now (or sealed it).
    Superseded,
    /// The record is gone: a newer holder released it (or it expired).
    Gone,
}

/// Reply of [`Store::shut_out`](super::Store::shut_out) (`shut_out.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShutOutReply {
    /// Nothing was taken here; older epochs are now shut out of the segment.
    Clear,
    /// An older epoch took `part` units here (now re-stamped with the caller's epoch).
    Applied {
        /// Units.
        part: u64,
    },
    /// A newer epoch is already here: the caller was superseded.
    Superseded,
    /// Same request id, other parameters.
    Mismatch(&'static str),
}

/// Reply of [`Store::takeover`](super::Store::takeover) (`takeover.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TakeoverReply {
    /// The caller now holds the claim with `epoch`; `home_part` units were already taken at
    /// the home segment by the previous holder.
    Won {
        /// New epoch.
        epoch: u64,
        /// Units the previous holder took at home.
        home_part: u64,
    },
    /// The lease has not run out.
    Pending {
        /// The claim's epoch.
        epoch: u64,
        /// Lease left.
        lease_left_ms: u64,
    },
    /// Applied meanwhile.
    Replay(Vec<Part>),
    /// No record.
    Gone,
    /// The request id was sealed.
    Sealed,
    /// Same request id, other parameters.
    Mismatch(&'static str),
}

/// A per-user entry to verify (see [`UserClaim::Limit`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct StaleEntry {
    /// The request it counts.
    pub request_id: RequestId,
    /// Its units.
    pub qty: u64,
    /// The entry says "reserved" (the request held units; they may have gone back since);
    /// false: it is pending past its expiry (its claimer presumed dead).
    pub reserved: bool,
    /// What the request was.
    pub kind: RequestKind,
}

/// Reply of [`Store::user_claim`](super::Store::user_claim) (`user_claim.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UserClaim {
    /// Counted as pending.
    Ok,
    /// This request id is already counted (`sold`: for good).
    Dup {
        /// The entry is final.
        sold: bool,
    },
    /// Same request id, other quantity or kind (the field).
    Mismatch(&'static str),
    /// The limit would be exceeded.
    Limit {
        /// Units counted now.
        used: u64,
        /// Of those, units sold for good (they never come back).
        final_used: u64,
        /// Of those, units of pending entries not yet past their expiry: attempts in flight,
        /// which may still give their units back. A user over the limit only because of these
        /// is busy, not at the limit.
        fresh_pending: u64,
        /// Entries to verify: pending ones past their expiry, and reservations (they may have
        /// expired or been cancelled).
        stale: Vec<StaleEntry>,
    },
}

/// A reservation's state (`rs` on the record holding its units).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ResvState {
    /// Held, not yet confirmed.
    Reserved,
    /// Confirmed: the units are sold.
    Confirmed,
    /// Cancelled: the units went back.
    Cancelled,
    /// Expired unconfirmed: the units went back.
    Expired,
}

/// Reply of [`Store::reserve_end`](super::Store::reserve_end) (`reserve_end.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReserveEnd {
    /// Now (or already) in the asked state.
    Done {
        /// The state reached.
        state: ResvState,
        /// Its user.
        user: String,
        /// Its units.
        units: u64,
    },
    /// It had ended otherwise (or, for a peek, this is its state).
    Ended {
        /// The state it is in.
        state: ResvState,
        /// Its user.
        user: String,
        /// Its units.
        units: u64,
    },
    /// No such reservation.
    Unknown,
    /// Segment missing or of another generation.
    Stale,
}

/// Reply of [`Store::seal`](super::Store::seal) (`seal.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SealReply {
    /// It never applied and now cannot.
    Sealed,
    /// It applied.
    Applied,
    /// A fallback claim of it is in progress.
    Pending {
        /// Claim lease left.
        lease_left_ms: u64,
    },
    /// Same request id, other parameters.
    Mismatch(&'static str),
}

/// Reply of [`Store::restock`](super::Store::restock) (`restock.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RestockReply {
    /// Added.
    Restocked {
        /// Segment stock after.
        stock_after: u64,
    },
    /// This request id restocked this segment before; nothing changed.
    Replay {
        /// Segment stock now.
        stock: u64,
    },
    /// Same request id, other quantity.
    Mismatch,
    /// Segment missing or of another generation.
    Stale,
}

/// Reply of [`Store::load_begin`](super::Store::load_begin).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadBegin {
    /// The SKU exists and the load asked [`IfLoaded::Refuse`](super::IfLoaded::Refuse).
    Exists {
        /// Its generation.
        generation: u64,
    },
    /// A new generation was started.
    Started {
        /// The new generation.
        generation: u64,
        /// How many segments the previous generation had (0 when new).
        old_segments: u32,
        /// The previous generation (0 when new): its live reservations end with the reload.
        old_generation: u64,
        /// Where the SKU's segments live (kept from earlier loads, extended for new indexes).
        placement: crate::placement::Placement,
    },
}

/// SKU metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// Load generation.
    pub generation: u64,
    /// Number of segments.
    pub segments: u32,
    /// Units loaded in this generation.
    pub loaded: u64,
    /// All segments are written.
    pub ready: bool,
    /// Units one user may buy of this SKU (0 = no limit).
    pub user_limit: u64,
    /// Where the segments live (their hash tag suffixes); unplaced on a single Redis.
    pub placement: crate::placement::Placement,
    /// The most segments any generation of this SKU had with the outbox on (0: never on): an
    /// outbox consumer reads the streams of segments `0..outbox_segments`.
    pub outbox_segments: u32,
}

/// One segment's counters. Invariant: `loaded + restocked = stock + reserved + sold`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct SegmentState {
    /// Units left.
    pub stock: u64,
    /// Units sold.
    pub sold: u64,
    /// Units loaded.
    pub loaded: u64,
    /// Units restocked.
    pub restocked: u64,
    /// Units held by live reservations.
    pub reserved: u64,
}

/// The state of a request's record at its home segment.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// Applied with these parts.
    Applied(Vec<Part>),
    /// A fallback claim is held.
    Pending {
        /// Epoch.
        epoch: u64,
    },
    /// Sealed: the request never applied and never can.
    Sealed,
}

/// A fallback claim whose lease ran out, as [`Store::claims_due`](super::Store::claims_due) lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueClaim {
    /// The claimed request.
    pub request_id: RequestId,
    /// Its user.
    pub user: UserId,
    /// Its quantity.
    pub qty: u64,
    /// Its kind.
    pub kind: RequestKind,
}

/// One segment as the audit reads it (`held.lua`): counters and what live reservations hold,
/// in one atomic read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeldState {
    /// The segment's counters.
    pub state: SegmentState,
    /// Units held by live reservations (the sum over the reservation index).
    pub held: u64,
    /// Live reservations.
    pub live: u64,
    /// Index entries whose record is gone or no longer reserved.
    pub orphans: u64,
}

/// A request's record at its home segment, as [`Store::record`](super::Store::record) reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeRecord {
    /// User it was made for.
    pub user: String,
    /// Quantity it was made for.
    pub qty: u64,
    /// Kind it was made for.
    pub kind: RequestKind,
    /// State.
    pub state: RecordState,
}
