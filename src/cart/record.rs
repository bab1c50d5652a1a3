//! An order's record: the one source of truth of a cart, written once when decided. Pure (the
//! caller passes the clock), so the memory store, the model checker and `order.lua` share one
//! definition; the script mirrors [`step`] answer for answer.
//!
//! The record lives in a slot of its own (`<prefix>:{o<shard>}:order:<order id>`), apart from
//! every item. Its clock is the only one that decides expiry: an order still open at its
//! deadline is expired by the first step that looks at it (and read as expired before that), so
//! a confirm at 9.99 s on this record's clock wins and one at 10.00 s loses, whatever the items'
//! masters' clocks say — the items have no clock of their own (see
//! [`ItemState`](crate::store::ItemState)).

/// An order's one state, for all its items.
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OrderState {
    /// Its items are being held (the hold call has not answered yet, or died on the way).
    Holding,
    /// Every item is held until the deadline.
    Held,
    /// Confirmed: every item is (or is being) sold.
    Confirmed,
    /// Cancelled: every item goes back (also an order cancelled before it was ever held).
    Cancelled,
    /// Not confirmed by its deadline: every item goes back.
    Expired,
    /// An item could not be held: every item goes back.
    Refused,
}

impl OrderState {
    /// The letter `order.lua` stores.
    pub fn letter(self) -> &'static str {
        match self {
            OrderState::Holding => "O",
            OrderState::Held => "H",
            OrderState::Confirmed => "C",
            OrderState::Cancelled => "K",
            OrderState::Expired => "X",
            OrderState::Refused => "F",
        }
    }

    /// The state of a stored letter.
    pub fn from_letter(s: &str) -> Option<Self> {
        Some(match s {
            "O" => OrderState::Holding,
            "H" => OrderState::Held,
            "C" => OrderState::Confirmed,
            "K" => OrderState::Cancelled,
            "X" => OrderState::Expired,
            "F" => OrderState::Refused,
            _ => return None,
        })
    }

    /// The `snake_case` name (the JSON form).
    pub fn as_str(self) -> &'static str {
        match self {
            OrderState::Holding => "holding",
            OrderState::Held => "held",
            OrderState::Confirmed => "confirmed",
            OrderState::Cancelled => "cancelled",
            OrderState::Expired => "expired",
            OrderState::Refused => "refused",
        }
    }

    /// Still open: the deadline decides unless a confirm, cancel or refusal comes first.
    pub fn is_open(self) -> bool {
        matches!(self, OrderState::Holding | OrderState::Held)
    }

    /// What the decision means for every item: `Some(true)` sell, `Some(false)` give back,
    /// `None` not decided yet.
    pub fn posts(self) -> Option<bool> {
        match self {
            OrderState::Holding | OrderState::Held => None,
            OrderState::Confirmed => Some(true),
            OrderState::Cancelled | OrderState::Expired | OrderState::Refused => Some(false),
        }
    }
}

impl std::fmt::Display for OrderState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the record holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OrderRecord {
    /// The state.
    pub state: OrderState,
    /// The deadline on the record's clock (ms); 0 for a record made by a cancel or an expiry
    /// that found none.
    pub deadline: u64,
    /// The items as the hold asked for them (`<sku>:<qty>` joined by `,`): a retry with other
    /// items is a conflict.
    pub items: String,
    /// Why it was refused (`<item number> <outcome>`), else empty.
    pub why: String,
    /// Forgotten at this time (ms).
    pub until: u64,
}

/// One step on an order's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderStep<'a> {
    /// Creates the record (holding, deadline `hold_ms` from now), or answers the one there.
    Open {
        /// The hold's length.
        hold_ms: u64,
        /// The items (see [`OrderRecord::items`]).
        items: &'a str,
    },
    /// Every item is held: holding → held.
    Held,
    /// An item could not be held: holding → refused.
    Refuse {
        /// `<item number> <outcome>`.
        why: &'a str,
    },
    /// held → confirmed.
    Confirm,
    /// holding or held → cancelled; no record → a cancelled one (a cancel that overtook its
    /// hold: the hold, when it comes, finds the order cancelled).
    Cancel,
    /// The sweeper's question about an item still held: the state, deciding expiry; no record
    /// → an expired one (nothing can confirm it any more).
    Expire,
    /// The state, writing nothing (an open order past its deadline reads as expired).
    Read,
}

/// What a step answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderReply {
    /// The state after the step (`None`: no record, from `Read`, `Held`, `Refuse` or `Confirm`).
    pub state: Option<OrderState>,
    /// This step changed the state (created, held, decided).
    pub changed: bool,
    /// Open: ms left to the deadline; else 0.
    pub left_ms: u64,
    /// `Open` found a record made for other items (nothing changed).
    pub conflict: bool,
    /// The refusal's reason (refused orders).
    pub why: String,
    /// The record's items (see [`OrderRecord::items`]).
    pub items: String,
}

/// `order.lua`: step `s` on the record `rec` (`None`: no record) at `now`; `ttl_ms` is how
/// long a decided record is remembered (the request TTL: longer than any item may wait for
/// the sweeper).
pub fn step(rec: &mut Option<OrderRecord>, s: OrderStep<'_>, now: u64, ttl_ms: u64) -> OrderReply {
    if rec.as_ref().is_some_and(|r| r.until <= now) {
        *rec = None;
    }
    let expires = |r: &OrderRecord| r.state.is_open() && now >= r.deadline;
    if s == OrderStep::Read {
        return match rec {
            None => reply(None, false, now),
            Some(r) => {
                let mut r = r.clone();
                if expires(&r) {
                    r.state = OrderState::Expired;
                }
                reply(Some(&r), false, now)
            }
        };
    }
    let mut changed = false;
    if let Some(r) = rec.as_mut()
        && expires(r)
    {
        decide(r, OrderState::Expired, now, ttl_ms);
        changed = true;
    }
    let Some(r) = rec.as_mut() else {
        let made = match s {
            OrderStep::Open { hold_ms, items } => OrderRecord {
                state: OrderState::Holding,
                deadline: now + hold_ms,
                items: items.to_owned(),
                why: String::new(),
                until: now + hold_ms + ttl_ms,
            },
            OrderStep::Cancel | OrderStep::Expire => OrderRecord {
                state: if s == OrderStep::Cancel {
                    OrderState::Cancelled
                } else {
                    OrderState::Expired
                },
                deadline: 0,
                items: String::new(),
                why: String::new(),
                until: now + ttl_ms,
            },
            _ => return reply(None, false, now),
        };
        *rec = Some(made);
        return reply(rec.as_ref(), true, now);
    };
    let to = match (s, r.state) {
        (OrderStep::Open { items, .. }, _) if !r.items.is_empty() && items != r.items => {
            let mut out = reply(Some(r), changed, now);
            out.conflict = true;
            return out;
        }
        (OrderStep::Held, OrderState::Holding) => Some(OrderState::Held),
        (OrderStep::Refuse { why }, OrderState::Holding) => {
            r.why = why.to_owned();
            Some(OrderState::Refused)
        }
        (OrderStep::Confirm, OrderState::Held) => Some(OrderState::Confirmed),
        (OrderStep::Cancel, OrderState::Holding | OrderState::Held) => Some(OrderState::Cancelled),
        _ => None,
    };
    if let Some(to) = to {
        if to == OrderState::Held {
            r.state = to;
        } else {
            decide(r, to, now, ttl_ms);
        }
        changed = true;
    }
    reply(Some(r), changed, now)
}

/// Writes decision `to` (once: only an open record gets here) and keeps the record for
/// `ttl_ms` from now at least.
fn decide(r: &mut OrderRecord, to: OrderState, now: u64, ttl_ms: u64) {
    debug_assert!(r.state.is_open());
    r.state = to;
    r.until = r.until.max(now + ttl_ms);
}

fn reply(r: Option<&OrderRecord>, changed: bool, now: u64) -> OrderReply {
    OrderReply {
        state: r.map(|r| r.state),
        changed,
        left_ms: r
            .filter(|r| r.state.is_open())
            .map_or(0, |r| r.deadline.saturating_sub(now)),
        conflict: false,
        why: r.map(|r| r.why.clone()).unwrap_or_default(),
        items: r.map(|r| r.items.clone()).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: u64 = 10_000;

    #[test]
    fn one_decision_and_the_deadline_on_this_clock() {
        let mut r = None;
        let open = OrderStep::Open {
            hold_ms: 100,
            items: "a:1,b:1",
        };
        assert!(step(&mut r, open, 0, TTL).changed);
        assert_eq!(
            step(&mut r, OrderStep::Confirm, 1, TTL).state,
            Some(OrderState::Holding)
        );
        assert_eq!(
            step(&mut r, OrderStep::Held, 2, TTL).state,
            Some(OrderState::Held)
        );
        // A confirm one ms before the deadline wins; the cancel after it loses.
        let c = step(&mut r, OrderStep::Confirm, 99, TTL);
        assert_eq!((c.state, c.changed), (Some(OrderState::Confirmed), true));
        let k = step(&mut r, OrderStep::Cancel, 100, TTL);
        assert_eq!((k.state, k.changed), (Some(OrderState::Confirmed), false));
        // Another open at the deadline: expired, and reads say so before any write.
        let mut r = None;
        step(&mut r, open, 0, TTL);
        step(&mut r, OrderStep::Held, 1, TTL);
        assert_eq!(
            step(&mut r, OrderStep::Read, 100, TTL).state,
            Some(OrderState::Expired)
        );
        assert_eq!(r.as_ref().unwrap().state, OrderState::Held);
        let c = step(&mut r, OrderStep::Confirm, 100, TTL);
        assert_eq!((c.state, c.changed), (Some(OrderState::Expired), true));
    }

    #[test]
    fn a_cancel_before_the_order_is_remembered_and_other_items_conflict() {
        let mut r = None;
        let k = step(&mut r, OrderStep::Cancel, 0, TTL);
        assert_eq!((k.state, k.changed), (Some(OrderState::Cancelled), true));
        let open = OrderStep::Open {
            hold_ms: 100,
            items: "a:1",
        };
        let o = step(&mut r, open, 1, TTL);
        assert_eq!(o.state, Some(OrderState::Cancelled));
        let mut r = None;
        step(&mut r, open, 0, TTL);
        let other = step(
            &mut r,
            OrderStep::Open {
                hold_ms: 100,
                items: "a:2",
            },
            1,
            TTL,
        );
        assert!(other.conflict);
        assert_eq!(
            step(&mut r, OrderStep::Refuse { why: "1 sold_out" }, 2, TTL).why,
            "1 sold_out"
        );
        // Forgotten a TTL after its deadline (the refusal came before it).
        assert!(step(&mut r, OrderStep::Read, 99 + TTL, TTL).state.is_some());
        assert_eq!(step(&mut r, OrderStep::Read, 100 + TTL, TTL).state, None);
    }
}
