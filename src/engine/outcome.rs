//! What the engine answers: business outcomes are values, not errors.

use crate::segments::Part;

/// The outcome of a deduction. Business outcomes are values, not errors.
///
/// Refusals come in two sorts: *not now* (sold out, insufficient, limit reached, in flight,
/// user busy: asking again later may succeed) and *never* ([`OverLimit`](Self::OverLimit),
/// [`TooLargeToHold`](Self::TooLargeToHold): the request as asked cannot be served until the
/// SKU is restocked or reloaded; ask for fewer units). [`is_final`](Self::is_final) tells them
/// apart.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Deduction {
    /// The units were taken now, from these segments.
    Applied {
        /// Where the units came from.
        parts: Vec<Part>,
    },
    /// This request id was applied before; nothing changed this time.
    Replayed {
        /// Where the units came from, back then.
        parts: Vec<Part>,
    },
    /// No units left at all.
    SoldOut,
    /// Some units are left, fewer than asked for.
    Insufficient {
        /// Units left when the engine looked.
        available: u64,
    },
    /// Another call with the same request id is being processed right now (it did not finish
    /// within `pending_wait`). Retry later with the same id.
    InFlight,
    /// The user already holds the per-user limit of this SKU (units sold, or reserved by live
    /// reservations); attempts still pending never cause it (see [`Deduction::UserBusy`]).
    LimitReached {
        /// The SKU's per-user limit.
        limit: u64,
    },
    /// This user already has an attempt on this SKU running — in this process (a double
    /// click), or elsewhere (a pending per-user claim not yet settled) with the limit counted
    /// against it; nothing was done. The user holds fewer units than the limit: retry shortly.
    UserBusy,
    /// The quantity alone is above the SKU's per-user limit: this request can never apply
    /// (unless the SKU is reloaded with a higher limit). Final.
    OverLimit {
        /// The SKU's per-user limit.
        limit: u64,
    },
    /// A reservation is held in one segment (so that its expiry and its units are decided in
    /// one atomic step), and no segment of this SKU is that large: this reservation can never
    /// be held (unless a restock or reload makes a segment larger). Final: reserve fewer units,
    /// or buy them. Answered when the SKU has the units in total but no segment could ever hold
    /// them; when fewer units are left than asked, the stock answer ([`SoldOut`](Self::SoldOut),
    /// [`Insufficient`](Self::Insufficient)) comes first, as for a sale.
    TooLargeToHold {
        /// The most units one segment can hold (its share of the load and of restocks).
        largest_segment: u64,
    },
}

impl Deduction {
    /// Units this call newly sold (0 for replays and rejections).
    pub fn units_applied(&self) -> u64 {
        match self {
            Deduction::Applied { parts } => parts.iter().map(|p| p.units).sum(),
            _ => 0,
        }
    }

    /// True for the refusals no retry can turn into a sale until the SKU is restocked or
    /// reloaded ([`OverLimit`](Self::OverLimit): only a reload changes the limit;
    /// [`TooLargeToHold`](Self::TooLargeToHold): a restock may make a segment large enough);
    /// false for successes and for "not now" refusals.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Deduction::OverLimit { .. } | Deduction::TooLargeToHold { .. }
        )
    }

    /// A short name (the `outcome` field of its JSON form): `applied`, `replayed`, `sold_out`,
    /// `insufficient`, `in_flight`, `limit_reached`, `user_busy`, `over_limit`,
    /// `too_large_to_hold`.
    pub fn kind(&self) -> &'static str {
        match self {
            Deduction::Applied { .. } => "applied",
            Deduction::Replayed { .. } => "replayed",
            Deduction::SoldOut => "sold_out",
            Deduction::Insufficient { .. } => "insufficient",
            Deduction::InFlight => "in_flight",
            Deduction::LimitReached { .. } => "limit_reached",
            Deduction::UserBusy => "user_busy",
            Deduction::OverLimit { .. } => "over_limit",
            Deduction::TooLargeToHold { .. } => "too_large_to_hold",
        }
    }
}

impl Deduction {
    /// The position of [`kind`](Self::kind) in the list there (for metric keys built once).
    pub(crate) fn kind_index(&self) -> usize {
        match self {
            Deduction::Applied { .. } => 0,
            Deduction::Replayed { .. } => 1,
            Deduction::SoldOut => 2,
            Deduction::Insufficient { .. } => 3,
            Deduction::InFlight => 4,
            Deduction::LimitReached { .. } => 5,
            Deduction::UserBusy => 6,
            Deduction::OverLimit { .. } => 7,
            Deduction::TooLargeToHold { .. } => 8,
        }
    }
}

/// The outcome of a restock.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Restocked {
    /// Units added by this call (0 when the whole request was a replay).
    pub added: u64,
    /// True when every segment had already applied this request id.
    pub replayed: bool,
}

/// Units left, in total and per segment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Remaining {
    /// Sum over segments.
    pub total: u64,
    /// Per segment, by index.
    pub per_segment: Vec<u64>,
    /// Units moving between segments (debited, not yet credited home): not counted in
    /// `total`, sellable once credited.
    pub in_transit: u64,
}
