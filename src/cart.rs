//! Carts: an order of several SKUs held all or nothing, then confirmed, cancelled or expired
//! as one.
//!
//! No script sees every item of an order (they live at their SKUs' home segments, in other
//! slots), so one place decides: the order's **record** ([`record`]), in a slot of its own,
//! written once when decided, on whose clock the deadline is kept. The items are holds at
//! their home segments ([`ItemState`]) that have no clock: they end
//! only when the decision is brought to them ([`Store::settle`]).
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

mod id;
pub mod record;

pub use id::{MAX_ITEMS, MAX_ORDER_REQUEST_ID_LEN, ORDER_SHARDS, OrderId};
pub use record::{OrderReply, OrderState, OrderStep};

use crate::engine::{Deduct, Deduction, Engine, Intent};
use crate::error::{Error, Result};
use crate::ids::{RequestId, Sku, UserId};
use crate::store::{ItemState, RecordState, SettleReply, Store};
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

/// What [`Engine::hold_order`] answers.
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

/// What [`Engine::confirm_order`], [`Engine::cancel_order`] and [`Engine::order`] answer.
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

impl<S: Store> Engine<S> {
    /// Holds every item of `cart` until `cart.hold` passes, or none: see the [module
    /// docs](self). Exactly once per (user, request id): a retry replays the order (and
    /// finishes holding what a dead call left half held).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty cart or more than [`MAX_ITEMS`] items, a zero
    /// quantity, a hold of 0 or longer than the request TTL, a request id longer than
    /// [`MAX_ORDER_REQUEST_ID_LEN`]; [`Error::RequestIdConflict`] (field `items`) when the
    /// request id was used for other items; [`Error::Config`] under an unsafe baseline
    /// strategy; store errors (the outcome is then unknown: retry with the same request id).
    pub async fn hold_order(&self, cart: &Cart) -> Result<OrderHold> {
        let strategy = self.store().strategy();
        if !matches!(
            strategy,
            crate::Strategy::Lua | crate::Strategy::Lock | crate::Strategy::Redlock
        ) {
            return Err(Error::Config(format!(
                "orders need the lua, lock or redlock strategy, not {strategy}"
            )));
        }
        if cart.items.is_empty() || cart.items.len() > MAX_ITEMS {
            return Err(Error::invalid(
                "items",
                format!("an order holds 1 to {MAX_ITEMS} items"),
            ));
        }
        for it in &cart.items {
            crate::ids::check_qty("qty", it.qty, self.options().max_qty)?;
        }
        let hold_ms = cart.hold.as_millis() as u64;
        if hold_ms == 0 || cart.hold > self.options().request_ttl {
            return Err(Error::invalid(
                "hold_ms",
                "must be at least 1 ms and at most the request TTL",
            ));
        }
        let id = OrderId::new(cart.user.clone(), cart.request_id.clone())?;
        // Every SKU loaded (and ready) before anything is written: an unknown SKU is an error
        // that leaves no record and holds nothing.
        for it in &cart.items {
            self.layout(&it.sku).await?;
        }
        let items = items_text(&cart.items);
        let ttl = self.ttl_ms();
        let opened = self
            .store()
            .order(
                &id,
                OrderStep::Open {
                    hold_ms,
                    items: &items,
                },
                ttl,
            )
            .await?;
        if opened.conflict {
            return Err(Error::RequestIdConflict {
                request_id: cart.request_id.to_string(),
                field: "items",
            });
        }
        if opened.changed && opened.state == Some(OrderState::Expired) {
            crate::metrics::order_event("expired");
        }
        match opened.state {
            Some(OrderState::Holding | OrderState::Held) => {}
            Some(OrderState::Refused) => {
                // A retry of a refused order: the refusal again (its items were voided, or
                // are being voided by the call that refused it: finish that too).
                self.settle_items(&id, &cart.items, false).await?;
                let (item, reason) = parse_why(&opened.why)
                    .ok_or_else(|| Error::Protocol(format!("order refusal {:?}", opened.why)))?;
                return Ok(OrderHold::Refused {
                    order_id: id,
                    sku: cart.items[item - 1].sku.clone(),
                    item,
                    reason,
                });
            }
            Some(state) => {
                self.settle_items(&id, &cart.items, state.posts() == Some(true))
                    .await?;
                return Ok(OrderHold::Ended {
                    order_id: id,
                    state,
                });
            }
            None => return Err(Error::Protocol("order: open answered no record".into())),
        }
        // Hold every item: items of different SKUs at once, those of one SKU one after the
        // other (the in-process guard turns a user's second attempt on a SKU away).
        let hint_ms = opened.left_ms.max(1);
        let mut by_sku: Vec<(&Sku, Vec<usize>)> = Vec::new();
        for (i, it) in cart.items.iter().enumerate() {
            match by_sku.iter_mut().find(|(s, _)| *s == &it.sku) {
                Some((_, v)) => v.push(i),
                None => by_sku.push((&it.sku, vec![i])),
            }
        }
        let (id_ref, hint) = (&id, hint_ms);
        let runs = by_sku.iter().map(|(_, idx)| async move {
            let mut out = Vec::new();
            for &i in idx {
                let it = &cart.items[i];
                let req = Deduct {
                    sku: it.sku.clone(),
                    user: cart.user.clone(),
                    request_id: id_ref.item_request_id(i + 1),
                    qty: it.qty,
                };
                let r = self.metered(&req, Intent::Hold { hint_ms: hint }).await;
                let stop = !matches!(
                    r,
                    Ok((Deduction::Applied { .. } | Deduction::Replayed { .. }, _))
                );
                out.push((i, r));
                if stop {
                    break;
                }
            }
            out
        });
        let mut results: Vec<(usize, Result<(Deduction, u64)>)> = futures::future::join_all(runs)
            .await
            .into_iter()
            .flatten()
            .collect();
        results.sort_by_key(|(i, _)| *i);
        let mut held = Vec::with_capacity(cart.items.len());
        let mut refusal = None;
        let mut error = None;
        let mut replayed = Vec::new();
        for (i, r) in results {
            if let Ok((Deduction::Replayed { segment, .. }, generation)) = &r {
                replayed.push((i, *generation, *segment));
            }
            match r {
                Ok((
                    Deduction::Applied { segment, units } | Deduction::Replayed { segment, units },
                    _,
                )) => held.push(HeldItem {
                    sku: cart.items[i].sku.clone(),
                    qty: units,
                    segment,
                }),
                Ok((d, _)) => {
                    refusal.get_or_insert((i + 1, d));
                }
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        if let Some((n, reason)) = refusal {
            let why = why_text(n, &reason);
            let r = self
                .store()
                .order(&id, OrderStep::Refuse { why: &why }, ttl)
                .await?;
            let state = r.state.unwrap_or(OrderState::Cancelled);
            if state == OrderState::Held {
                // Another call held every item (this one was turned away: another attempt of
                // the user on a SKU ran in this process). The order is held: nothing to undo.
                return Ok(OrderHold::Held {
                    items: self.held_items(&id, &cart.items).await?,
                    order_id: id,
                    left_ms: r.left_ms,
                });
            }
            let Some(post) = state.posts() else {
                return Err(Error::Protocol(format!(
                    "order {id}: {state} after a refusal"
                )));
            };
            self.settle_items(&id, &cart.items, post).await?;
            if r.changed {
                crate::metrics::order_event("refused");
            }
            return Ok(match state {
                OrderState::Refused if r.why == why => OrderHold::Refused {
                    order_id: id,
                    item: n,
                    sku: cart.items[n - 1].sku.clone(),
                    reason,
                },
                OrderState::Refused => {
                    let (item, reason) = parse_why(&r.why)
                        .ok_or_else(|| Error::Protocol(format!("order refusal {:?}", r.why)))?;
                    OrderHold::Refused {
                        order_id: id,
                        sku: cart.items[item - 1].sku.clone(),
                        item,
                        reason,
                    }
                }
                state => OrderHold::Ended {
                    order_id: id,
                    state,
                },
            });
        }
        if let Some(e) = error {
            if matches!(
                e.kind(),
                crate::ErrorKind::InvalidInput
                    | crate::ErrorKind::RequestIdConflict
                    | crate::ErrorKind::NotLoaded
            ) {
                // No retry can hold this order (an item's request id taken by another request,
                // its SKU gone): cancel it, give back what it held, then say why.
                self.store().order(&id, OrderStep::Cancel, ttl).await?;
                self.release_items(&id, &cart.items).await?;
                return Err(e);
            }
            // Unknown: some items may be held. The order stays holding: a retry finishes it,
            // a cancel or the deadline ends it (and the sweeper gives the units back).
            return Err(e);
        }
        if !self.replays_held(&id, &cart.items, &replayed).await? {
            // An item replayed a record that is not held: it ended with an order decided
            // before — this one (cancelled meanwhile: the record says so), or an earlier order
            // of this request id, forgotten since (the record was made again by this call).
            let r = self.store().order(&id, OrderStep::Cancel, ttl).await?;
            self.release_items(&id, &cart.items).await?;
            return match r.state {
                Some(OrderState::Cancelled) if r.changed => Err(Error::RequestIdConflict {
                    request_id: cart.request_id.to_string(),
                    field: "request_id",
                }),
                Some(state) => Ok(OrderHold::Ended {
                    order_id: id,
                    state,
                }),
                None => Err(Error::Protocol("order: record gone while holding".into())),
            };
        }
        let r = self.store().order(&id, OrderStep::Held, ttl).await?;
        if r.changed && r.state == Some(OrderState::Expired) {
            crate::metrics::order_event("expired");
        }
        match r.state {
            Some(OrderState::Held) => {
                if r.changed {
                    crate::metrics::order_event("held");
                }
                Ok(OrderHold::Held {
                    order_id: id,
                    items: held,
                    left_ms: r.left_ms,
                })
            }
            Some(state) => {
                // Decided while this call held (cancelled, or the deadline passed): the items
                // follow the decision.
                self.settle_items(&id, &cart.items, state.posts() == Some(true))
                    .await?;
                Ok(OrderHold::Ended {
                    order_id: id,
                    state,
                })
            }
            None => Err(Error::Protocol("order: record gone while holding".into())),
        }
    }

    /// Confirms the order: every item is sold, or — past the deadline, or already cancelled —
    /// none is, and the answer says which. Idempotent.
    ///
    /// # Errors
    /// Store errors (retry: the decision, once written, is what a retry finishes).
    pub async fn confirm_order(&self, id: &OrderId) -> Result<Option<OrderEnd>> {
        self.decide_order(id, OrderStep::Confirm, OrderState::Confirmed)
            .await
    }

    /// Cancels the order: every item goes back. An order not yet held (or unknown) is
    /// remembered as cancelled, so its hold, if it comes, holds nothing. A confirmed order
    /// stays confirmed (the answer says so). Idempotent.
    ///
    /// # Errors
    /// As [`confirm_order`](Self::confirm_order).
    pub async fn cancel_order(&self, id: &OrderId) -> Result<Option<OrderEnd>> {
        self.decide_order(id, OrderStep::Cancel, OrderState::Cancelled)
            .await
    }

    /// The order's state, read without writing (an open order past its deadline reads as
    /// expired). `None`: no such order (never held, or forgotten a request TTL after it
    /// ended).
    ///
    /// # Errors
    /// Store errors.
    pub async fn order(&self, id: &OrderId) -> Result<Option<OrderEnd>> {
        let r = self
            .store()
            .order(id, OrderStep::Read, self.ttl_ms())
            .await?;
        Ok(r.state.map(|state| OrderEnd {
            order_id: id.clone(),
            state,
            done: false,
            left_ms: r.left_ms,
            reloaded: Vec::new(),
        }))
    }

    async fn decide_order(
        &self,
        id: &OrderId,
        step: OrderStep<'_>,
        want: OrderState,
    ) -> Result<Option<OrderEnd>> {
        let r = self.store().order(id, step, self.ttl_ms()).await?;
        let Some(state) = r.state else {
            return Ok(None);
        };
        if r.changed && state.posts().is_some() {
            crate::metrics::order_event(state.as_str());
        }
        let mut reloaded = Vec::new();
        if let Some(post) = state.posts() {
            let items = parse_items(&r.items)?;
            reloaded = self.settle_items(id, &items, post).await?;
        }
        Ok(Some(OrderEnd {
            order_id: id.clone(),
            state,
            done: state == want,
            left_ms: r.left_ms,
            reloaded,
        }))
    }

    /// Whether every item whose hold was a replay is held now (a replay of a posted or voided
    /// item is no hold). One record read per replayed item; none in the common case.
    async fn replays_held(
        &self,
        id: &OrderId,
        items: &[CartItem],
        replayed: &[(usize, u64, u32)],
    ) -> Result<bool> {
        for &(i, generation, segment) in replayed {
            let sku = &items[i].sku;
            let suffix = self.suffix_of(sku, generation, segment).await?;
            let at = crate::store::SegAddr::new(sku, generation, segment).with_suffix(suffix);
            let rid = id.item_request_id(i + 1);
            let rec = self.store().record(at, id.user(), &rid).await?;
            if rec.is_none_or(|r| r.state != RecordState::Item(ItemState::Held)) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Voids every item, passing over those that ended otherwise (an earlier order's) or whose
    /// request id another request holds: what a hold no retry can finish leaves behind.
    async fn release_items(&self, id: &OrderId, items: &[CartItem]) -> Result<()> {
        let runs = items.iter().enumerate().map(|(i, it)| async move {
            let rid = id.item_request_id(i + 1);
            self.settle_item(&it.sku, id.user(), &rid, it.qty, false)
                .await
        });
        for r in futures::future::join_all(runs).await {
            r?;
        }
        Ok(())
    }

    /// Where each item is held: its home in the SKU's current layout.
    async fn held_items(&self, id: &OrderId, items: &[CartItem]) -> Result<Vec<HeldItem>> {
        let mut out = Vec::with_capacity(items.len());
        for (i, it) in items.iter().enumerate() {
            let l = self.layout(&it.sku).await?;
            let rid = id.item_request_id(i + 1);
            out.push(HeldItem {
                sku: it.sku.clone(),
                qty: it.qty,
                segment: crate::segments::home(id.user(), &rid, l.segments, l.user_limit > 0),
            });
        }
        Ok(out)
    }

    /// Brings a decision to every item (`post`: sell; else give back, or leave a voided
    /// record where none was held). Answers the items whose SKU was reloaded since.
    async fn settle_items(
        &self,
        id: &OrderId,
        items: &[CartItem],
        post: bool,
    ) -> Result<Vec<usize>> {
        let runs = items.iter().enumerate().map(|(i, it)| async move {
            let rid = id.item_request_id(i + 1);
            self.settle_item(&it.sku, id.user(), &rid, it.qty, post)
                .await
        });
        let mut reloaded = Vec::new();
        for (i, r) in futures::future::join_all(runs)
            .await
            .into_iter()
            .enumerate()
        {
            match r? {
                SettleReply::Done(_) => {}
                SettleReply::Stale | SettleReply::Unknown => reloaded.push(i + 1),
                SettleReply::Ended(s) => {
                    return Err(Error::Protocol(format!(
                        "order {id}: item {} is {s:?}, against its order's decision",
                        i + 1
                    )));
                }
                SettleReply::Mismatch => {
                    return Err(Error::RequestIdConflict {
                        request_id: id.item_request_id(i + 1).to_string(),
                        field: "kind",
                    });
                }
            }
        }
        Ok(reloaded)
    }

    /// One item's settlement at its home segment in the SKU's current generation (a reload
    /// ends the holds of the one it replaces: `Stale`).
    pub(crate) async fn settle_item(
        &self,
        sku: &Sku,
        user: &UserId,
        rid: &RequestId,
        qty: u64,
        post: bool,
    ) -> Result<SettleReply> {
        let mut r = SettleReply::Stale;
        // A stale answer from a cached layout is asked again in the SKU's layout now (another
        // instance may have held the item in a generation this one has not seen yet).
        for _ in 0..2 {
            let l = match self.layout(sku).await {
                Ok(l) => l,
                Err(Error::NotLoaded(_)) => return Ok(SettleReply::Stale),
                Err(e) => return Err(e),
            };
            let home = crate::segments::home(user, rid, l.segments, l.user_limit > 0);
            r = self
                .store()
                .settle(l.seg(home), user, rid, qty, post, self.ttl_ms())
                .await?;
            if r != SettleReply::Stale {
                break;
            }
            self.forget(&l);
        }
        if !post && matches!(r, SettleReply::Done(_)) {
            // The user's chance came back: the in-process guard must not hold it against them.
            self.guard().forget(sku, user);
        }
        Ok(r)
    }

    /// The order's answer for an item the sweeper found held past its hint: the decision
    /// (deciding "expired" if the record's clock says the deadline passed), then the item
    /// settled as it says. `false`: the order is still open.
    pub(crate) async fn sweep_hold(
        &self,
        l: &crate::engine::Layout,
        index: u32,
        hold: &crate::store::DueHold,
    ) -> Result<bool> {
        let Some((id, _)) = OrderId::of_item(&hold.user, &hold.request_id) else {
            // Not an order item's id: void it (nothing can ever decide it).
            let r = self
                .store()
                .settle(
                    l.seg(index),
                    &hold.user,
                    &hold.request_id,
                    hold.qty,
                    false,
                    self.ttl_ms(),
                )
                .await?;
            return Ok(matches!(r, SettleReply::Done(_)));
        };
        let r = self
            .store()
            .order(&id, OrderStep::Expire, self.ttl_ms())
            .await?;
        let Some(post) = r.state.and_then(OrderState::posts) else {
            return Ok(false);
        };
        if r.changed {
            crate::metrics::order_event(r.state.map_or("expired", OrderState::as_str));
        }
        self.store()
            .settle(
                l.seg(index),
                &hold.user,
                &hold.request_id,
                hold.qty,
                post,
                self.ttl_ms(),
            )
            .await?;
        if !post {
            self.guard().forget(&l.sku, &hold.user);
        }
        Ok(true)
    }

    fn ttl_ms(&self) -> u64 {
        self.options().request_ttl.as_millis() as u64
    }
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
