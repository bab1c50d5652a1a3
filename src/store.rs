//! The backend trait: per-segment atomic operations.
//!
//! Each method is one atomic step on one segment (one Redis hash slot) or on a SKU's
//! metadata; the [`crate::Engine`] composes them into deductions with fallback. Two
//! implementations share one contract, pinned down by the Lua scripts' headers:
//! [`RedisStore`](redis::RedisStore) (the real thing) and [`MemoryStore`](memory::MemoryStore)
//! (embedded; also the oracle of the differential tests).

use crate::error::Result;
use crate::ids::{RequestId, Sku, UserId};
use crate::segments::Part;
use std::future::Future;

pub mod memory;
pub mod redis;

/// Which segment: SKU, load generation, index.
#[derive(Debug, Clone, Copy)]
pub struct SegAddr<'a> {
    /// The SKU.
    pub sku: &'a Sku,
    /// The load generation the caller believes in; a mismatch answers `Stale`.
    pub generation: u64,
    /// Segment index.
    pub index: u32,
}

/// What a request id was used for. A request id names one request of one kind: a sale and a
/// reservation under the same id conflict ([`crate::Error::RequestIdConflict`] with field
/// `kind`); they never replay each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RequestKind {
    /// A sale: the units are sold for good.
    Sale,
    /// A reservation: the units are held until confirmed, cancelled or expired.
    Reservation,
}

impl RequestKind {
    /// The one-letter code the scripts store (`s` / `r`).
    pub fn code(self) -> &'static str {
        match self {
            RequestKind::Sale => "s",
            RequestKind::Reservation => "r",
        }
    }

    /// Parses [`code`](Self::code); `None` for anything else.
    pub fn from_code(s: &str) -> Option<Self> {
        match s {
            "s" | "" => Some(RequestKind::Sale),
            "r" => Some(RequestKind::Reservation),
            _ => None,
        }
    }
}

/// The parameters of one deduction request as the store sees them.
#[derive(Debug, Clone, Copy)]
pub struct ReqArgs<'a> {
    /// Idempotency key.
    pub request_id: &'a RequestId,
    /// The buyer.
    pub user: &'a UserId,
    /// Units wanted in total.
    pub qty: u64,
    /// Lifetime of the outcome record, in ms.
    pub ttl_ms: u64,
    /// Lease of a fallback claim, in ms.
    pub lease_ms: u64,
    /// 0: sell. > 0: reserve the units for this many ms instead (they return by themselves
    /// unless confirmed). Must be > 0 exactly when `kind` is a reservation for the steps that
    /// take units (`deduct_home`, `take`); the others only compare `kind`.
    pub resv_ttl_ms: u64,
    /// Sale or reservation: records carry it, and a record of the other kind is a conflict.
    pub kind: RequestKind,
}

/// Reply of [`Store::deduct_home`] (`deduct.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
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
        /// A fallback claim (epoch 1) was written for the caller.
        claimed: bool,
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

/// Reply of [`Store::take`] (`take.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The caller's claim was superseded.
    Fenced,
    /// Same request id, other parameters.
    Mismatch(&'static str),
    /// Segment missing or of another generation.
    Stale,
}

/// Reply of [`Store::settle`] (`settle.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Reply of [`Store::fence`] (`fence.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceReply {
    /// Nothing was taken here; the segment is now fenced for older epochs.
    Clear,
    /// An older epoch took `part` units here (now re-stamped with the caller's epoch).
    Applied {
        /// Units.
        part: u64,
    },
    /// A newer epoch is already here: the caller was superseded.
    Fenced,
    /// Same request id, other parameters.
    Mismatch(&'static str),
}

/// Reply of [`Store::takeover`] (`takeover.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// How [`Store::settle`] ends a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleAs<'a> {
    /// Applied with these parts.
    Applied(&'a [Part]),
    /// Nothing sold; the request id stays free.
    Release,
    /// Nothing sold; the request id may never apply (a verified-void per-user claim).
    Seal,
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

/// Reply of [`Store::user_claim`] (`user_claim.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// What [`Store::user_finish`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserFinish {
    /// The units are the user's for good.
    Sold,
    /// The units are reserved (they count until confirmed, cancelled or expired).
    Reserved,
    /// Nothing was (or will be) sold: the entry goes.
    Void,
}

/// A reservation's state (`rs` on the record holding its units).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
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

/// Reply of [`Store::reserve_end`] (`reserve_end.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Reply of [`Store::seal`] (`seal.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Reply of [`Store::restock`] (`restock.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Reply of [`Store::load_begin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadBegin {
    /// The SKU exists and `replace` was false.
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
    },
}

/// SKU metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// A fallback claim whose lease ran out, as [`Store::claims_due`] lists it.
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

/// A request's record at its home segment, as [`Store::record`] reads it.
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

/// A storage backend: atomic per-segment steps. See the module docs.
///
/// Futures are `Send` so engines can run on a multi-threaded runtime; implementations must be
/// cheap to share (`Arc` inside).
pub trait Store: Send + Sync + 'static {
    /// Short name for reports (`"memory"`, `"redis"`).
    fn name(&self) -> &'static str;

    /// The deduction strategy this store runs (only Redis offers others than `lua`).
    fn strategy(&self) -> crate::strategy::Strategy {
        crate::strategy::Strategy::Lua
    }

    /// Lock counters, when the strategy uses locks.
    fn lock_figures(&self) -> Option<crate::lock::LockFigures> {
        None
    }

    /// Request coalescing in force and its counts (Redis `lua` only; None = one call per
    /// request).
    fn coalescing(&self) -> Option<crate::CoalesceStats> {
        None
    }

    /// Starts a (re)load: bumps the generation unless the SKU exists and `replace` is false.
    fn load_begin(
        &self,
        sku: &Sku,
        segments: u32,
        total: u64,
        replace: bool,
        user_limit: u64,
    ) -> impl Future<Output = Result<LoadBegin>> + Send;
    /// Writes segment `seg` of generation `seg.generation` with `units`, replacing an older
    /// generation; `false` (nothing written) when a newer generation is there already.
    fn load_segment(
        &self,
        seg: SegAddr<'_>,
        units: u64,
    ) -> impl Future<Output = Result<bool>> + Send;
    /// Deletes segment `seg.index` when it is of an older generation than `seg.generation`
    /// (left over from a previous generation with more segments).
    fn drop_segment(&self, seg: SegAddr<'_>) -> impl Future<Output = Result<()>> + Send;
    /// Marks generation `generation` ready; `false` when another load superseded it.
    fn load_commit(&self, sku: &Sku, generation: u64) -> impl Future<Output = Result<bool>> + Send;
    /// Reads the SKU metadata.
    fn meta(&self, sku: &Sku) -> impl Future<Output = Result<Option<Meta>>> + Send;

    /// `deduct.lua`: the whole request at its home segment; optionally claims it when short.
    fn deduct_home(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        claim: bool,
    ) -> impl Future<Output = Result<HomeReply>> + Send;
    /// `take.lua`: a part of a claimed request at one segment.
    fn take(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        part: u64,
        epoch: u64,
        is_home: bool,
    ) -> impl Future<Output = Result<TakeReply>> + Send;
    /// `settle.lua`: ends a claim as applied, released or sealed.
    fn settle(
        &self,
        home: SegAddr<'_>,
        req: ReqArgs<'_>,
        epoch: u64,
        how: SettleAs<'_>,
    ) -> impl Future<Output = Result<SettleReply>> + Send;
    /// `refund.lua`: gives back a part taken by `epoch` or older; returns the units refunded.
    fn refund(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        epoch: u64,
        is_home: bool,
    ) -> impl Future<Output = Result<u64>> + Send;
    /// `fence.lua`: shuts epochs older than `epoch` out of a (non-home) segment.
    fn fence(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        epoch: u64,
    ) -> impl Future<Output = Result<FenceReply>> + Send;
    /// `takeover.lua`: takes over a claim whose lease ran out.
    fn takeover(
        &self,
        home: SegAddr<'_>,
        req: ReqArgs<'_>,
    ) -> impl Future<Output = Result<TakeoverReply>> + Send;
    /// `restock.lua`: adds `qty` units (of a request for `total`) to a segment once per
    /// request id.
    fn restock(
        &self,
        seg: SegAddr<'_>,
        request_id: &RequestId,
        qty: u64,
        total: u64,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<RestockReply>> + Send;
    /// Reads all `segments` of generation `generation` (concurrently; `None` for a segment
    /// that is missing or of another generation). Each segment is read atomically; the
    /// segments are not read at one single instant.
    fn segments(
        &self,
        sku: &Sku,
        generation: u64,
        segments: u32,
    ) -> impl Future<Output = Result<Vec<Option<SegmentState>>>> + Send;
    /// `user_claim.lua`: counts `req.qty` units against `limit` for `req.user`.
    fn user_claim(
        &self,
        sku: &Sku,
        generation: u64,
        req: ReqArgs<'_>,
        limit: u64,
        claim_ttl_ms: u64,
    ) -> impl Future<Output = Result<UserClaim>> + Send;
    /// `user_finish.lua`: marks `req`'s entry in `req.user`'s record sold or reserved (adding
    /// it when it is missing: a twin of the request may have removed it after selling nothing,
    /// and units sold must always be counted), or removes it.
    fn user_finish(
        &self,
        sku: &Sku,
        generation: u64,
        req: ReqArgs<'_>,
        how: UserFinish,
    ) -> impl Future<Output = Result<()>> + Send;
    /// `reserve_end.lua`: confirms (`Some(true)`), cancels (`Some(false)`) or reads (`None`)
    /// the reservation held on `request_id`'s record at `seg`.
    fn reserve_end(
        &self,
        seg: SegAddr<'_>,
        request_id: &RequestId,
        confirm: Option<bool>,
    ) -> impl Future<Output = Result<ReserveEnd>> + Send;
    /// `reclaim.lua`: returns `seg`'s expired reservations; (units returned, units still
    /// reserved in the segment).
    fn reclaim(&self, seg: SegAddr<'_>) -> impl Future<Output = Result<(u64, u64)>> + Send;
    /// `seal.lua`: at a request's home segment, tells whether it applied, else seals it.
    fn seal(
        &self,
        home: SegAddr<'_>,
        req: ReqArgs<'_>,
    ) -> impl Future<Output = Result<SealReply>> + Send;
    /// `claims_due.lua`: up to `max` fallback claims at `seg` (their home) whose lease ran out
    /// more than `grace_ms` ago.
    fn claims_due(
        &self,
        seg: SegAddr<'_>,
        max: usize,
        grace_ms: u64,
    ) -> impl Future<Output = Result<Vec<DueClaim>>> + Send;
    /// `held.lua`: the segment's counters and what its live reservations hold (`None` when the
    /// segment is missing or of another generation).
    fn held(&self, seg: SegAddr<'_>) -> impl Future<Output = Result<Option<HeldState>>> + Send;
    /// Reads a request's record at its home segment.
    fn record(
        &self,
        home: SegAddr<'_>,
        request_id: &RequestId,
    ) -> impl Future<Output = Result<Option<HomeRecord>>> + Send;
}
