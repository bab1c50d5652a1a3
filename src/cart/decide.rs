//! Deciding an order and settling its items: [`Engine::confirm_order`](crate::Engine::confirm_order),
//! [`Engine::cancel_order`](crate::Engine::cancel_order), [`Engine::order`](crate::Engine::order) (which decides "expired" once the deadline
//! passed), each item posted or voided at its home segment as the record says, and the
//! sweeper's [`sweep_hold`](Engine::sweep_hold) for an item whose order nobody came back for.

use super::{CartItem, OrderEnd, OrderId, OrderState, OrderStep, parse_items};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::ids::{RequestId, Sku, UserId};
use crate::store::{SettleReply, Store};

impl<S: Store> Engine<S> {
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

    /// Brings a decision to every item (`post`: sell; else give back, or leave a voided
    /// record where none was held). Answers the items whose SKU was reloaded since.
    pub(super) async fn settle_items(
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

    pub(super) fn ttl_ms(&self) -> u64 {
        self.options().request_ttl.as_millis() as u64
    }
}
