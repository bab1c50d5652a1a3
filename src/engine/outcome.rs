//! What the engine answers: business outcomes are values, not errors.

/// The outcome of a deduction. Business outcomes are values, not errors.
///
/// Refusals come in two sorts: *not now* (sold out, insufficient, limit reached, user busy:
/// asking again later may succeed) and *never* ([`OverLimit`](Self::OverLimit): the request as
/// asked cannot be served until the SKU is reloaded with a higher limit; ask for fewer units).
/// [`is_final`](Self::is_final) tells them apart.
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Deduction {
    /// The units were taken now, at the request's home segment (units left elsewhere are moved
    /// there first, so a sale always takes all its units from one segment).
    Applied {
        /// The segment the units came from: the request's home.
        segment: u32,
        /// Units taken: the request's quantity.
        units: u64,
    },
    /// This request id was applied before; nothing changed this time.
    Replayed {
        /// The segment the units came from, back then.
        segment: u32,
        /// Units taken back then.
        units: u64,
    },
    /// No units left at all.
    SoldOut,
    /// Some units are left, fewer than asked for.
    Insufficient {
        /// Units left when the engine looked.
        available: u64,
    },
    /// The user already holds the per-user limit of this SKU (units sold, or reserved by live
    /// reservations); attempts still pending never cause it (see [`Deduction::UserBusy`]).
    LimitReached {
        /// The SKU's per-user limit.
        limit: u64,
    },
    /// This user already has an attempt on this SKU running in this process (a double click):
    /// the in-process guard turned this one away; nothing was done. Retry shortly.
    UserBusy,
    /// The quantity alone is above the SKU's per-user limit: this request can never apply
    /// (unless the SKU is reloaded with a higher limit). Final. Only for a request id this user
    /// has not used: a used one with another quantity is
    /// [`Error::RequestIdConflict`](crate::Error::RequestIdConflict).
    OverLimit {
        /// The SKU's per-user limit.
        limit: u64,
    },
}

impl Deduction {
    /// Units this call newly sold (0 for replays and rejections).
    pub fn units_applied(&self) -> u64 {
        match self {
            Deduction::Applied { units, .. } => *units,
            _ => 0,
        }
    }

    /// True for the refusals no retry can turn into a sale until the SKU is reloaded
    /// ([`OverLimit`](Self::OverLimit): only a reload changes the limit); false for successes
    /// and for "not now" refusals.
    pub fn is_final(&self) -> bool {
        matches!(self, Deduction::OverLimit { .. })
    }

    /// A short name (the `outcome` field of its JSON form): `applied`, `replayed`, `sold_out`,
    /// `insufficient`, `limit_reached`, `user_busy`, `over_limit`.
    pub fn kind(&self) -> &'static str {
        match self {
            Deduction::Applied { .. } => "applied",
            Deduction::Replayed { .. } => "replayed",
            Deduction::SoldOut => "sold_out",
            Deduction::Insufficient { .. } => "insufficient",
            Deduction::LimitReached { .. } => "limit_reached",
            Deduction::UserBusy => "user_busy",
            Deduction::OverLimit { .. } => "over_limit",
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
            Deduction::LimitReached { .. } => 4,
            Deduction::UserBusy => 5,
            Deduction::OverLimit { .. } => 6,
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

/// Units left, in total and per segment: what a buyer can be sold now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Remaining {
    /// Sum over segments.
    pub total: u64,
    /// Per segment, by index: its stock plus the units of its reservations past their expiry
    /// (the next step that writes there, a sale included, returns them first).
    pub per_segment: Vec<u64>,
    /// Units moving between segments (debited, not yet credited home): not counted in
    /// `total`, sellable once credited.
    pub in_transit: u64,
    /// Units held by live reservations (not past their expiry): not counted in `total`.
    pub reserved: u64,
    /// Of `total`, units of reservations past their expiry, on their way back to stock:
    /// counted in the segments' `reserved` counters until a step that writes returns them.
    pub expired: u64,
}

#[cfg(test)]
mod tests {
    use super::Deduction;

    #[test]
    fn every_kind_is_the_metrics_outcome_at_its_index() {
        for d in [
            Deduction::Applied {
                segment: 0,
                units: 1,
            },
            Deduction::Replayed {
                segment: 0,
                units: 1,
            },
            Deduction::SoldOut,
            Deduction::Insufficient { available: 1 },
            Deduction::LimitReached { limit: 1 },
            Deduction::UserBusy,
            Deduction::OverLimit { limit: 1 },
        ] {
            assert_eq!(crate::metrics::OUTCOMES[d.kind_index()], d.kind(), "{d:?}");
        }
    }
}
