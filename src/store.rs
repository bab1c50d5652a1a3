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

use crate::cluster::placement::Placement;
use crate::error::Result;
use crate::ids::{RequestId, Sku, UserId};
use std::future::Future;

mod health;
pub mod memory;
pub mod redis;
mod reply;
pub(crate) mod watch;

pub use health::{ALL_SLOTS, ServerHealth, ServerState, StoreHealth};
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
        crate::cluster::placement::tag(self.sku, self.index, self.suffix)
    }
}

/// A transfer's id: a random number the engine that starts the transfer draws (never 0). The
/// donor remembers it for the whole generation (a re-sent debit replays), the home remembers
/// every id it credited (a re-sent credit adds nothing).
pub type TransferId = u64;

/// Units a [`Store::sell`] call credits to its home segment before deciding: transfer `id`,
/// debited at segment `donor` by [`Store::transfer`]. Credited at most once per id and
/// generation; never refunded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Credit {
    /// The transfer.
    pub id: TransferId,
    /// The segment that debited it.
    pub donor: u32,
    /// Its units.
    pub units: u64,
}

/// One request as [`Store::sell`] decides it at its home segment.
#[derive(Debug, Clone, Copy)]
pub struct SellArgs<'a> {
    /// Idempotency key, scoped to (SKU, user): the same id under another user is another
    /// request.
    pub request_id: &'a RequestId,
    /// The buyer.
    pub user: &'a UserId,
    /// Units wanted (> 0); 0: no request, only credit `credits` (and return expired
    /// reservations), answered [`SellReply::Applied`] with the stock after.
    pub qty: u64,
    /// 0: sell. > 0: hold the units as a reservation for this many ms (store clock), or, with
    /// `order_item`, for an order whose deadline is about this far (the sweeper's hint: the
    /// item itself never expires).
    pub resv_ttl_ms: u64,
    /// The units are held as an order's item ([`RequestKind::OrderItem`]; needs
    /// `resv_ttl_ms` > 0): they end only by [`Store::settle`].
    pub order_item: bool,
    /// How long the record is remembered when the SKU has no per-user limit (with a limit, a
    /// record lives as long as the generation), and how long an ended reservation's record
    /// outlives its end.
    pub ttl_ms: u64,
    /// Transfers to credit first (their units stay at home whatever the request's answer).
    pub credits: &'a [Credit],
    /// Lock strategies: apply only while the segment's fence token is this one (0: no fence).
    pub fence: u64,
}

impl SellArgs<'_> {
    /// The request's kind.
    pub fn kind(&self) -> RequestKind {
        if self.order_item {
            RequestKind::OrderItem
        } else if self.resv_ttl_ms > 0 {
            RequestKind::Reservation
        } else {
            RequestKind::Sale
        }
    }
}

/// One transfer as [`Store::transfer`] debits it at a donor segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransferArgs {
    /// Its id (a re-send with the same id replays, whatever its other fields).
    pub id: TransferId,
    /// The segment the units go to.
    pub dest: u32,
    /// Units wanted (> 0).
    pub want: u64,
    /// The donor keeps at least this many units.
    pub floor: u64,
    /// After this many ms (store clock) in transit, any sweeper may credit the units home.
    pub lease_ms: u64,
}

/// A transfer debited and not yet marked done ([`Store::transfers_due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DueTransfer {
    /// Its id.
    pub id: TransferId,
    /// Where its units go.
    pub dest: u32,
    /// Its units.
    pub units: u64,
    /// Lease left (store clock, ms): 0 once any sweeper may credit it; crediting earlier is
    /// safe too (a credit applies once per id), which a request that would otherwise answer
    /// sold out does.
    pub lease_left_ms: u64,
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
    /// Units one user may hold (0: no limit). The segment keeps it, so the script that sells
    /// reads the limit of the generation it checks, never a cached one.
    pub user_limit: u64,
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
    fn lock_figures(&self) -> Option<crate::store::redis::lock::stats::LockFigures> {
        None
    }

    /// Request coalescing in force and its counts (Redis `lua` only; None = one call per
    /// request).
    fn coalescing(&self) -> Option<crate::store::redis::coalescing::CoalesceStats> {
        None
    }

    /// Notifications that units of `sku` may be sellable again, from every instance (Redis
    /// `lua`: the `<prefix>:stock` subscriber); `None` = none, and the engine then answers no
    /// sold out from memory.
    fn stock_watch(&self, sku: &Sku) -> Option<StockWatch> {
        let _ = sku;
        None
    }

    /// Asks every server of the store, each within `timeout`, whether it answers and would
    /// take a write now (the engine's readiness, [`crate::Engine::readiness`]). Never an
    /// error: what failed is in the answer. The default, for in-process stores: nothing to
    /// ask, always there ([`StoreHealth::in_process`]).
    fn health(&self, timeout: std::time::Duration) -> impl Future<Output = StoreHealth> + Send {
        let _ = timeout;
        async { StoreHealth::in_process() }
    }

    /// Where each of the first `segments` segments of `sku` lives now (slot and master), on a
    /// cluster; `None` for stores without slots.
    fn segment_homes(
        &self,
        sku: &Sku,
        placement: &Placement,
        segments: u32,
    ) -> impl Future<Output = Result<Option<Vec<crate::cluster::placement::SegmentHome>>>> + Send
    {
        let _ = (sku, placement, segments);
        async { Ok(None) }
    }

    /// Starts a (re)load: bumps the generation unless the SKU exists and `spec` says
    /// [`IfLoaded::Refuse`]. Records the SKU in the store's list of SKUs ([`skus`](Self::skus)).
    fn load_begin(
        &self,
        sku: &Sku,
        spec: LoadSpec,
    ) -> impl Future<Output = Result<LoadBegin>> + Send;
    /// Writes segment `seg` of generation `seg.generation` with `load.units`, replacing an
    /// older generation (whose requests, ledgers and transfers end with it); `false`
    /// (nothing written) when a newer generation is there already. The same load again (this
    /// generation with the same units, limit and home function: a re-sent call) writes
    /// nothing and answers `true`: the sales since keep their units sold.
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
    /// Every SKU ever loaded (the sweeper's list: SKUs no cached layout names included).
    fn skus(&self) -> impl Future<Output = Result<Vec<Sku>>> + Send;

    /// `sell.lua`: at the request's home segment, in one atomic step: credits `req.credits`,
    /// returns expired reservations, then decides the request — its record (replay, conflict),
    /// the user's ledger against the segment's per-user limit, the stock, the record, the
    /// reservation hold and the outbox event.
    fn sell(
        &self,
        home: SegAddr<'_>,
        req: SellArgs<'_>,
    ) -> impl Future<Output = Result<SellReply>> + Send;
    /// `transfer.lua`: debits up to `t.want` units above `t.floor` at `donor` and records the
    /// transfer as in transit to `t.dest`; a transfer id seen before replays its units (and
    /// renews its lease: the replay writes, so a durability `WAIT` after it covers the debit).
    fn transfer(
        &self,
        donor: SegAddr<'_>,
        t: TransferArgs,
    ) -> impl Future<Output = Result<TransferReply>> + Send;
    /// `transfer.lua` (done): the transfer was credited home; the donor stops listing it as
    /// due (and still remembers its id).
    fn transfer_done(
        &self,
        donor: SegAddr<'_>,
        id: TransferId,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Up to `max` transfers debited at `donor` and not marked done, those whose lease ends
    /// first first: the sweeper credits those whose lease ran out.
    fn transfers_due(
        &self,
        donor: SegAddr<'_>,
        max: usize,
    ) -> impl Future<Output = Result<Vec<DueTransfer>>> + Send;
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
    /// `reserve_end.lua`: confirms, cancels or inspects `user`'s reservation `request_id`,
    /// held at its home segment `home`.
    fn reserve_end(
        &self,
        home: SegAddr<'_>,
        user: &UserId,
        request_id: &RequestId,
        action: ReservationAction,
    ) -> impl Future<Output = Result<ReserveEnd>> + Send;
    /// `survey.lua`: returns the segment's expired reservations (all of them), then reads its
    /// counters and, with `detail`, what its live reservations hold (a look at every live
    /// reservation: the audit's; without it `held`, `live` and `orphans` are 0), in one
    /// atomic step (`None` when the segment is missing or of another generation).
    fn survey(
        &self,
        seg: SegAddr<'_>,
        detail: bool,
    ) -> impl Future<Output = Result<Option<Survey>>> + Send;
    /// `peek.lua`: what [`survey`](Self::survey) reads, in one atomic step that writes nothing
    /// (a `no-writes` script, so a master that refuses writes still answers it): reservations
    /// past their expiry are not returned but counted in [`Survey::expired`]; `reclaimed` is 0.
    /// The audit's and the status's read, so both work while writes are refused.
    fn peek(
        &self,
        seg: SegAddr<'_>,
        detail: bool,
    ) -> impl Future<Output = Result<Option<Survey>>> + Send;
    /// Reads `user`'s record of `request_id` at its home segment (`None`: none, or forgotten).
    fn record(
        &self,
        home: SegAddr<'_>,
        user: &UserId,
        request_id: &RequestId,
    ) -> impl Future<Output = Result<Option<HomeRecord>>> + Send;

    /// `settle.lua` at an order item's home: brings the order's decision to the item `request_id`
    /// of `user`, of `qty` units — `post`: sold; else voided (units back to stock, or, when
    /// it was never held, a voided record that makes a late hold take nothing). Idempotent
    /// (see [`memory::Segment::settle`]); `ttl_ms`: how long a record that ended outlives its
    /// end.
    fn settle(
        &self,
        home: SegAddr<'_>,
        user: &UserId,
        request_id: &RequestId,
        qty: u64,
        post: bool,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<SettleReply>> + Send;

    /// `holds_due.lua`: order items held at `seg` past their hint (the deadline on that
    /// master's clock), at most `max`, oldest first: the sweeper asks each one's order.
    fn holds_due(
        &self,
        seg: SegAddr<'_>,
        max: usize,
    ) -> impl Future<Output = Result<Vec<DueHold>>> + Send;

    /// `order.lua`: one step on an order's record (see [`crate::cart::record::step`]);
    /// `ttl_ms` is how long a decided record is remembered.
    fn order(
        &self,
        id: &crate::cart::OrderId,
        step: crate::cart::OrderStep<'_>,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<crate::cart::OrderReply>> + Send;
}
