//! The backend trait: per-segment atomic operations.
//!
//! Each method is one atomic step on one segment (one Redis hash slot) or on a SKU's
//! metadata; the [`crate::Engine`] composes them into deductions with fallback. Two
//! implementations share one contract, pinned down by the Lua scripts' headers:
//! [`RedisStore`](redis::RedisStore) (the real thing) and [`MemoryStore`](memory::MemoryStore)
//! (embedded; also the oracle of the differential tests). What the scripts store, letter by
//! letter, is tabled in [`redis::lua`].
//!
//! This module holds the trait and the arguments of its steps; the replies are in `reply`
//! (re-exported here).

use crate::error::Result;
use crate::ids::{RequestId, Sku, UserId};
use crate::placement::Placement;
use crate::segments::Part;
use std::future::Future;

pub mod memory;
pub mod redis;
mod reply;
pub(crate) mod watch;

pub use watch::StockWatch;

pub use reply::*;

/// Which segment: SKU, load generation, index, and where it was placed.
#[derive(Debug, Clone, Copy)]
pub struct SegAddr<'a> {
    /// The SKU.
    pub sku: &'a Sku,
    /// The load generation the caller believes in; a mismatch answers `Stale`.
    pub generation: u64,
    /// Segment index.
    pub index: u32,
    /// The segment's placement suffix (its hash tag is `<sku>#<index>.<suffix>`), from the
    /// SKU's [`Placement`]; `None` for the plain tag
    /// `<sku>#<index>` (a single Redis, the memory store, SKUs loaded before placement).
    pub suffix: Option<u16>,
}

impl<'a> SegAddr<'a> {
    /// Segment `index` of `sku` in `generation`, with the plain tag.
    pub fn new(sku: &'a Sku, generation: u64, index: u32) -> Self {
        Self {
            sku,
            generation,
            index,
            suffix: None,
        }
    }

    /// The same segment placed with `suffix`.
    pub fn with_suffix(self, suffix: Option<u16>) -> Self {
        Self { suffix, ..self }
    }

    /// The segment's hash tag (without braces).
    pub fn tag(&self) -> String {
        crate::placement::tag(self.sku, self.index, self.suffix)
    }
}

/// What a request id was used for. A request id names one request of one kind: a sale and a
/// reservation under the same id conflict ([`crate::Error::RequestIdConflict`] with field
/// `kind`); they never replay each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
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
    /// This attempt of the request: a random token per engine call, shared by the background
    /// task that finishes a dropped call (0: none). The per-user entry remembers the attempts
    /// in flight, so one that sold nothing never uncounts a twin's units
    /// ([`UserFinish::Release`]).
    pub attempt: u64,
}

/// What [`Store::deduct_home`] does when the home segment is short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnShort {
    /// Claim the request (a pending record, epoch 1) for a fallback across segments.
    Claim,
    /// Only report the shortage.
    Report,
}

/// Where a step runs, seen from the request: its home segment or a fallback segment. At home
/// a claimed request's part lives in the claim itself; elsewhere in a part record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SegmentRole {
    /// The request's home segment.
    Home,
    /// Any other segment.
    Fallback,
}

impl SegmentRole {
    /// The role of segment `index` for a request whose home is `home`.
    pub fn of(index: u32, home: u32) -> Self {
        if index == home {
            SegmentRole::Home
        } else {
            SegmentRole::Fallback
        }
    }
}

/// What [`Store::reserve_end`] does with a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReservationAction {
    /// Confirm it: the units become sold.
    Confirm,
    /// Cancel it: the units go back to stock.
    Cancel,
    /// Only read its state (after returning what has expired).
    Inspect,
}

/// What [`Store::load_begin`] does when the SKU is loaded already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IfLoaded {
    /// Leave it, answer [`LoadBegin::Exists`].
    Refuse,
    /// Start a new generation over it.
    Replace,
}

/// A (re)load as [`Store::load_begin`] records it in the SKU metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSpec {
    /// Number of segments.
    pub segments: u32,
    /// Units loaded.
    pub total: u64,
    /// When the SKU exists.
    pub if_loaded: IfLoaded,
    /// Units one user may buy (0 = no limit).
    pub user_limit: u64,
    /// The selling scripts append outbox events (see [`crate::orders`]).
    pub outbox: bool,
}

/// What [`Store::load_segment`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SegmentLoad {
    /// The segment's units.
    pub units: u64,
    /// The selling scripts append outbox events for this segment.
    pub outbox: bool,
    /// The generation this load replaces (0: none): when the segment still holds it with the
    /// outbox on, each of its live reservations gets a `cancelled` event.
    pub replaces: u64,
}

/// How [`Store::settle`] ends a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettleAs<'a> {
    /// Applied with these parts.
    Applied(&'a [Part]),
    /// Nothing sold; the request id stays free.
    Release,
    /// Nothing sold; the request id may never apply (a verified-void per-user claim).
    Seal,
}

/// What [`Store::user_finish`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UserFinish {
    /// The units are the user's for good.
    Sold,
    /// The units are reserved (they count until confirmed, cancelled or expired).
    Reserved,
    /// Nothing was (or will be) sold: the entry goes.
    Void,
    /// This attempt ([`ReqArgs::attempt`]) sold nothing, but a twin of the request (the same
    /// id, running at the same time) may still sell: a pending entry goes only when no attempt
    /// that joined it is left; a sold or reserved entry stays.
    Release,
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

    /// Notifications that units of `sku` may be sellable again, from every instance (Redis
    /// `lua`: the `<prefix>:stock` subscriber); `None` = none, and the engine then answers no
    /// sold out from memory.
    fn stock_watch(&self, sku: &Sku) -> Option<StockWatch> {
        let _ = sku;
        None
    }

    /// Where each of the first `segments` segments of `sku` lives now (slot and master), on a
    /// cluster; `None` for stores without slots.
    fn segment_homes(
        &self,
        sku: &Sku,
        placement: &Placement,
        segments: u32,
    ) -> impl Future<Output = Result<Option<Vec<crate::placement::SegmentHome>>>> + Send {
        let _ = (sku, placement, segments);
        async { Ok(None) }
    }

    /// Starts a (re)load: bumps the generation unless the SKU exists and `spec` says
    /// [`IfLoaded::Refuse`].
    fn load_begin(
        &self,
        sku: &Sku,
        spec: LoadSpec,
    ) -> impl Future<Output = Result<LoadBegin>> + Send;
    /// Writes segment `seg` of generation `seg.generation` with `load.units`, replacing an
    /// older generation; `false` (nothing written) when a newer generation is there already.
    fn load_segment(
        &self,
        seg: SegAddr<'_>,
        load: SegmentLoad,
    ) -> impl Future<Output = Result<bool>> + Send;
    /// Deletes segment `seg.index` when it is of an older generation than `seg.generation`
    /// (left over from a previous generation with more segments).
    /// `replaces`: the generation the load replaces (its live reservations there end, as in
    /// [`SegmentLoad::replaces`]).
    fn drop_segment(
        &self,
        seg: SegAddr<'_>,
        replaces: u64,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Marks generation `generation` ready; `false` when another load superseded it.
    fn load_commit(&self, sku: &Sku, generation: u64) -> impl Future<Output = Result<bool>> + Send;
    /// Reads the SKU metadata.
    fn meta(&self, sku: &Sku) -> impl Future<Output = Result<Option<Meta>>> + Send;

    /// `deduct.lua`: the whole request at its home segment; claims it when short if
    /// `on_short` says so.
    fn deduct_home(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        on_short: OnShort,
    ) -> impl Future<Output = Result<HomeReply>> + Send;
    /// `take.lua`: a part of a claimed request (claim epoch `epoch`) at one segment.
    fn take(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        part: u64,
        epoch: u64,
        role: SegmentRole,
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
        role: SegmentRole,
    ) -> impl Future<Output = Result<u64>> + Send;
    /// `shut_out.lua`: shuts claim epochs older than `epoch` out of a fallback segment.
    fn shut_out(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        epoch: u64,
    ) -> impl Future<Output = Result<ShutOutReply>> + Send;
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
        placement: &Placement,
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
    /// `reserve_end.lua`: confirms, cancels or inspects the reservation held on
    /// `request_id`'s record at `seg`.
    fn reserve_end(
        &self,
        seg: SegAddr<'_>,
        request_id: &RequestId,
        action: ReservationAction,
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
    /// Reads a request's record at its home segment (`None`: none, or a released claim —
    /// the request id is free).
    fn record(
        &self,
        home: SegAddr<'_>,
        request_id: &RequestId,
    ) -> impl Future<Output = Result<Option<HomeRecord>>> + Send;
}
