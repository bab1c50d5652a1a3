//! Holding an order ([`Engine::hold_order`](crate::Engine::hold_order)): open its record, hold every item at its home
//! segment, then mark it held — or refuse it and give back whatever was held. A retry replays
//! the order and finishes what a dead call left half done. The protocol is in the [room's
//! docs](super).

use super::{
    Cart, CartItem, HeldItem, MAX_ITEMS, OrderHold, OrderId, OrderState, OrderStep, items_text,
    parse_why, why_text,
};
use crate::engine::{Deduct, Deduction, Engine, Intent};
use crate::error::{Error, Result};
use crate::ids::Sku;
use crate::store::{ItemState, RecordState, Store};

impl<S: Store> Engine<S> {
    /// Holds every item of `cart` until `cart.hold` passes, or none: see the [module
    /// docs](crate::cart). Exactly once per (user, request id): a retry replays the order (and
    /// finishes holding what a dead call left half held).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty cart or more than [`MAX_ITEMS`](super::MAX_ITEMS) items, a zero
    /// quantity, a hold of 0 or longer than the request TTL, a request id longer than
    /// [`MAX_ORDER_REQUEST_ID_LEN`](super::MAX_ORDER_REQUEST_ID_LEN); [`Error::RequestIdConflict`] (field `items`) when the
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
}
