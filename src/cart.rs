//! Carts: an order of several SKUs held all or nothing, then confirmed, cancelled or expired
//! as one.
//!
//! No script sees every item of an order (they live at their SKUs' home segments, in other
//! slots), so one place decides: the order's **record** ([`record`]), in a slot of its own,
//! written once when decided, on whose clock the deadline is kept. The items are holds at
//! their home segments ([`ItemState`](crate::store::ItemState)) that have no clock: they end
//! only when the decision is brought to them ([`Store::settle`](crate::Store::settle)).
//!
//! The protocol, each step idempotent:
//! 1. **open** the record (holding, deadline = now + hold) — or find it: a retry replays;
//! 2. **hold** every item at its home segment, as a reservation is held (units moved home
//!    first when it is short), item `n`'s request id being `<request id>#<n>`;
//! 3. all held: **held** (holding → held) and answer; one refused: **refuse** (holding →
//!    refused), then void every item, and answer the refusal once nothing is held;
//! 4. **confirm** (held → confirmed, before the deadline on the record's clock) or **cancel**
//!    writes the decision; then every item is posted (sold) or voided (given back).
//!
//! Whoever dies between two steps leaves the record and the holds as they are: an item still
//! held is listed by its segment's hold index once its hint (the deadline on its own master's
//! clock) has passed, and the sweeper of any instance asks its order — deciding "expired" if
//! it is still open — and settles the item as the record says. A void that finds no hold
//! leaves a voided record, so a hold that arrives after its order was decided (a slow or
//! re-sent call) takes nothing; the order's record, not the item, says whether the order was
//! held.

mod decide;
mod hold;
mod id;
pub mod record;

pub use id::{MAX_ITEMS, MAX_ORDER_REQUEST_ID_LEN, ORDER_SHARDS, OrderId};
pub use record::{OrderReply, OrderState, OrderStep};

use crate::engine::Deduction;
use crate::error::{Error, Result};
use crate::ids::{RequestId, Sku, UserId};
use std::time::Duration;

/// One line of a cart.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CartItem {
    /// The SKU.
    pub sku: Sku,
    /// Units wanted (> 0).
    pub qty: u64,
}

/// An order to hold: every item or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cart {
    /// The buyer.
    pub user: UserId,
    /// The order's request id: a retry with the same id replays (at most
    /// [`MAX_ORDER_REQUEST_ID_LEN`] bytes).
    pub request_id: RequestId,
    /// 1..=[`MAX_ITEMS`] items; a SKU may appear more than once.
    pub items: Vec<CartItem>,
    /// How long the items are held before the order expires unconfirmed.
    pub hold: Duration,
}

/// An item as held.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct HeldItem {
    /// The SKU.
    #[cfg_attr(feature = "http", schema(value_type = String))]
    pub sku: Sku,
    /// Units held.
    pub qty: u64,
    /// The segment holding them (the item's home).
    pub segment: u32,
}

/// What [`Engine::hold_order`](crate::Engine::hold_order) answers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum OrderHold {
    /// Every item is held (now, or by an earlier call with this request id) until the
    /// deadline: confirm or cancel the order with `order_id`.
    Held {
        /// The order.
        order_id: OrderId,
        /// Its items.
        items: Vec<HeldItem>,
        /// Milliseconds left to the deadline (the record's clock).
        left_ms: u64,
    },
    /// Item `item` (1-based) could not be held: the order is refused and nothing is held
    /// anywhere (every item it held was given back before this answer).
    Refused {
        /// The order.
        order_id: OrderId,
        /// The first item refused (1-based).
        item: usize,
        /// Its SKU.
        sku: Sku,
        /// Why: sold out, insufficient, limit reached, over limit, user busy.
        reason: Deduction,
    },
    /// This request id's order was decided before (a retry after it was confirmed, cancelled,
    /// expired or refused; or cancelled before it was ever held), or its deadline passed while
    /// this call held its items: nothing is held for it once answered (unless confirmed).
    Ended {
        /// The order.
        order_id: OrderId,
        /// Its state.
        state: OrderState,
    },
}

/// What [`Engine::confirm_order`](crate::Engine::confirm_order), [`Engine::cancel_order`](crate::Engine::cancel_order) and [`Engine::order`](crate::Engine::order) answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OrderEnd {
    /// The order.
    pub order_id: OrderId,
    /// Its one state, for all its items.
    pub state: OrderState,
    /// This call (or an earlier one of the same intent) brought it there.
    pub done: bool,
    /// Open: milliseconds left to the deadline; else 0.
    pub left_ms: u64,
    /// Items whose segment was reloaded since they were held (a reload ends every hold of the
    /// generation it replaces): numbers, 1-based. Empty in the normal case.
    pub reloaded: Vec<usize>,
}

/// `<sku>:<qty>` joined by `,`: the record's items.
fn items_text(items: &[CartItem]) -> String {
    items
        .iter()
        .map(|i| format!("{}:{}", i.sku, i.qty))
        .collect::<Vec<_>>()
        .join(",")
}

/// [`items_text`] read back.
fn parse_items(s: &str) -> Result<Vec<CartItem>> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|p| {
            let (sku, qty) = p
                .rsplit_once(':')
                .ok_or_else(|| Error::Protocol(format!("order items {s:?}")))?;
            Ok(CartItem {
                sku: Sku::new(sku)?,
                qty: qty
                    .parse()
                    .map_err(|_| Error::Protocol(format!("order items {s:?}")))?,
            })
        })
        .collect()
}

/// `<item number> <outcome>`: a refusal as the record keeps it.
fn why_text(n: usize, d: &Deduction) -> String {
    let extra = match d {
        Deduction::Insufficient { available } => format!(" {available}"),
        Deduction::LimitReached { limit } | Deduction::OverLimit { limit } => format!(" {limit}"),
        _ => String::new(),
    };
    format!("{n} {}{extra}", d.kind())
}

/// [`why_text`] read back.
fn parse_why(s: &str) -> Option<(usize, Deduction)> {
    let mut it = s.split(' ');
    let n = it.next()?.parse().ok()?;
    let kind = it.next()?;
    let x = it.next().and_then(|x| x.parse().ok());
    let d = match kind {
        "sold_out" => Deduction::SoldOut,
        "insufficient" => Deduction::Insufficient { available: x? },
        "limit_reached" => Deduction::LimitReached { limit: x? },
        "over_limit" => Deduction::OverLimit { limit: x? },
        "user_busy" => Deduction::UserBusy,
        _ => return None,
    };
    Some((n, d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_and_refusals_read_back() {
        let items = vec![
            CartItem {
                sku: Sku::new("phone-1").unwrap(),
                qty: 1,
            },
            CartItem {
                sku: Sku::new("case").unwrap(),
                qty: 2,
            },
        ];
        assert_eq!(parse_items(&items_text(&items)).unwrap(), items);
        for d in [
            Deduction::SoldOut,
            Deduction::Insufficient { available: 3 },
            Deduction::LimitReached { limit: 1 },
            Deduction::OverLimit { limit: 2 },
            Deduction::UserBusy,
        ] {
            assert_eq!(parse_why(&why_text(2, &d)), Some((2, d)));
        }
    }
}
