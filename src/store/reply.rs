//! What the store answers: one reply type per step, the states it reads, and the kind of
//! request a record names.
//!
//! Reply enums are `#[non_exhaustive]`: a new answer of a script is a new variant.

use crate::ids::{RequestId, UserId};

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
    /// An order's item: the units are held until the order's decision settles them.
    OrderItem,
}

impl RequestKind {
    /// The one-letter code the scripts store (`s` / `r` / `o`).
    pub fn code(self) -> &'static str {
        match self {
            RequestKind::Sale => "s",
            RequestKind::Reservation => "r",
            RequestKind::OrderItem => "o",
        }
    }

    /// Parses [`code`](Self::code); `None` for anything else.
    pub fn from_code(s: &str) -> Option<Self> {
        match s {
            "s" | "" => Some(RequestKind::Sale),
            "r" => Some(RequestKind::Reservation),
            "o" => Some(RequestKind::OrderItem),
            _ => None,
        }
    }
}

/// Reply of [`Store::sell`](super::Store::sell) (`sell.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SellReply {
    /// Taken at home in full (sold, or held as a reservation).
    Applied {
        /// Segment stock after.
        stock_after: u64,
    },
    /// This (user, request id) applied before: nothing changed.
    Replay,
    /// Not enough here (after the credits and the return of expired reservations).
    Short {
        /// Segment stock.
        stock: u64,
    },
    /// The user's ledger at this home would exceed the segment's per-user limit.
    LimitReached {
        /// The limit.
        limit: u64,
        /// Units the user holds now (sold, confirmed, or reserved and live).
        held: u64,
        /// Of those, units the user holds for good (sold or confirmed).
        sold: u64,
    },
    /// Same (user, request id), other `qty` or `kind` (the field).
    Mismatch(&'static str),
    /// Segment missing, of another generation, or loaded with another home function.
    Stale,
    /// Lock strategies: the segment's fence token is no longer the caller's; nothing written.
    LockLost,
}

/// Reply of [`Store::transfer`](super::Store::transfer) (`transfer.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransferReply {
    /// `units` debited (now, or by an earlier send of the same transfer id) and in transit.
    Debited {
        /// Units in transit under this id.
        units: u64,
        /// Donor stock after.
        stock_after: u64,
    },
    /// The donor holds nothing above the floor; nothing recorded.
    Short {
        /// Donor stock.
        stock: u64,
    },
    /// Segment missing or of another generation.
    Stale,
}

/// A reservation's state.
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
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
        placement: crate::cluster::placement::Placement,
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
    pub placement: crate::cluster::placement::Placement,
    /// The most segments any generation of this SKU had with the outbox on (0: never on): an
    /// outbox consumer reads the streams of segments `0..outbox_segments`.
    pub outbox_segments: u32,
    /// The home function the generation was loaded with ([`crate::segments::HOME_FN`]).
    pub home_fn: u32,
}

/// One segment's counters. Invariant: `loaded + restocked + moved_in = stock + reserved + sold
/// + moved_out`; over a SKU, units in transit are `Σ moved_out − Σ moved_in`.
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
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
    /// Units credited here by transfers (only grows within a generation).
    pub moved_in: u64,
    /// Units debited here by transfers (only grows within a generation).
    pub moved_out: u64,
}

impl SegmentState {
    /// The segment's conservation balance: what came in (`loaded + restocked + moved_in`)
    /// against where it is (`stock + reserved + sold + moved_out`). Every reader that shows
    /// whether a segment adds up (the audit, the live audit's gauges, the command line) asks
    /// this one function, so a unit moved by a transfer counts the same everywhere.
    pub fn balance(&self) -> Balance {
        Balance {
            inflow: u128::from(self.loaded)
                + u128::from(self.restocked)
                + u128::from(self.moved_in),
            outflow: u128::from(self.stock)
                + u128::from(self.reserved)
                + u128::from(self.sold)
                + u128::from(self.moved_out),
        }
    }

    /// `loaded + restocked + moved_in == stock + reserved + sold + moved_out`
    /// ([`balance`](Self::balance) is even).
    pub fn balances(&self) -> bool {
        self.balance().is_even()
    }
}

/// A segment's conservation balance ([`SegmentState::balance`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Balance {
    /// Units that came in: `loaded + restocked + moved_in`.
    pub inflow: u128,
    /// Units accounted for: `stock + reserved + sold + moved_out`.
    pub outflow: u128,
}

impl Balance {
    /// Every unit that came in is accounted for, once.
    pub fn is_even(&self) -> bool {
        self.inflow == self.outflow
    }

    /// `|inflow − outflow|`: units lost or made up behind the engine's back (saturating).
    pub fn unaccounted(&self) -> u64 {
        u64::try_from(self.inflow.abs_diff(self.outflow)).unwrap_or(u64::MAX)
    }

    /// `outflow − inflow` where positive: units counted beyond what came in, i.e. stock that
    /// can be (or was) sold twice (saturating).
    pub fn excess(&self) -> u64 {
        u64::try_from(self.outflow.saturating_sub(self.inflow)).unwrap_or(u64::MAX)
    }
}

/// A request's state, as its record at home keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecordState {
    /// A sale, applied.
    Sold,
    /// A reservation in this state.
    Reservation(ResvState),
    /// An order's item in this state.
    Item(ItemState),
}

/// An order item's state at its home segment. The item is held for its order and ends only as
/// the order's decision says ([`Store::settle`](super::Store::settle)): it has no clock of its
/// own, so it never expires on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ItemState {
    /// Held for its order: counted in `reserved` and against the per-user limit.
    Held,
    /// The order was confirmed: the units are sold.
    Posted,
    /// The order ended otherwise (cancelled, expired, refused): the units went back, or, when
    /// the hold never ran, none were taken and a late hold is refused (the record stays).
    Voided,
}

impl ItemState {
    /// The record's letter (`O`, `P`, `V`).
    pub fn letter(self) -> char {
        match self {
            ItemState::Held => 'O',
            ItemState::Posted => 'P',
            ItemState::Voided => 'V',
        }
    }

    /// The state of a record letter.
    pub fn from_letter(c: &str) -> Option<Self> {
        Some(match c {
            "O" => ItemState::Held,
            "P" => ItemState::Posted,
            "V" => ItemState::Voided,
            _ => return None,
        })
    }
}

/// Reply of [`Store::settle`](super::Store::settle) (`settle.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettleReply {
    /// The item is now (or was already) in the asked state.
    Done(ItemState),
    /// The item had ended the other way: the order's decision was not what this call says.
    Ended(ItemState),
    /// Posting an item that was never held (nothing sold).
    Unknown,
    /// A record of this request id that is no order item, or of another quantity.
    Mismatch,
    /// Segment missing or of another generation.
    Stale,
}

/// An order item held past its hint (`holds_due.lua`): the sweeper asks its order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DueHold {
    /// The item's user.
    pub user: UserId,
    /// The item's request id (`<order request id>#<item>`).
    pub request_id: RequestId,
    /// Its units.
    pub qty: u64,
}

/// One segment as [`Store::survey`](super::Store::survey) reads it: counters and what live
/// reservations hold, in one atomic step (after returning expired reservations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Survey {
    /// The segment's counters.
    pub state: SegmentState,
    /// Units held by live reservations (the sum over the reservation index).
    pub held: u64,
    /// Live reservations.
    pub live: u64,
    /// Index entries whose record is gone or no longer reserved.
    pub orphans: u64,
    /// Units expired reservations returned to stock by this read ([`Store::survey`]; 0 for
    /// [`Store::peek`], which writes nothing).
    ///
    /// [`Store::survey`]: super::Store::survey
    /// [`Store::peek`]: super::Store::peek
    pub reclaimed: u64,
    /// Units of reservations past their expiry still counted in `reserved` (and, with detail,
    /// in `held`): on their way back to stock, returned by the next step that writes at the
    /// segment ([`Store::peek`](super::Store::peek); 0 after [`Store::survey`](super::Store::survey),
    /// which returns them).
    pub expired: u64,
}

/// A request's record at its home segment, as [`Store::record`](super::Store::record) reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeRecord {
    /// Quantity it was made for.
    pub qty: u64,
    /// Kind it was made for.
    pub kind: RequestKind,
    /// State.
    pub state: RecordState,
}
