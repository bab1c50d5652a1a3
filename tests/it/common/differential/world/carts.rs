//! The cart steps of a differential case, each as a transcript line: order items held (`sell`
//! with `order_item`), settled (`settle`: post or void, also of items never held, of other
//! kinds' ids and with another qty), due to the sweeper (`holds_due`), those addressed to the
//! previous generation, and the case's orders' records (`order`), read after every step.
//!
//! Time: an item held with a short hint is due to the sweeper once it passed (the item itself
//! never expires); an order opened with a short hold expires at its deadline; an ended item's
//! record and a decided order's record are kept `ttl`. Each of these marks its step as having
//! started a short timer (see `differential.rs`); an open order's time left is shown as `open`.

use super::*;
use crate::common::differential::op::{ITEMS, OStep, On, item_home};
use shardstock::cart::{OrderId, OrderReply, OrderStep};
use shardstock::store::{DueHold, SettleReply};

/// Order item `o<rid>#1` of `u<user>` at its home among `n` segments, hint `hint`.
fn item(user: u8, rid: u8, qty: u64, hint: T, n: u32) -> Sent {
    Sent {
        seg: item_home(user, rid, n),
        user: uid(&format!("u{user}")),
        rid: RequestId::new(format!("o{rid}#1")).unwrap(),
        qty,
        resv: Some(hint),
        item: true,
        ttl: T::Long,
    }
}

fn span(t: T) -> &'static str {
    if t.is_short() { "short" } else { "long" }
}

impl<S: Store> World<S> {
    /// Names item `s` of the current generation (once per segment, user and id).
    fn name_item(&mut self, s: &Sent) {
        let cur = self.cur.as_mut().unwrap();
        if !cur
            .items
            .iter()
            .any(|x| (x.seg, &x.user, &x.rid) == (s.seg, &s.user, &s.rid))
        {
            cur.items.push(s.clone());
        }
    }

    /// `settle` of `user`'s item `rid` at `seg` of `g`: the line.
    #[allow(clippy::too_many_arguments)]
    async fn settle_at(
        &mut self,
        g: &Gen,
        seg: u32,
        user: &UserId,
        rid: &RequestId,
        qty: u64,
        post: bool,
        ttl: T,
    ) -> (String, Result<SettleReply>) {
        let r = self
            .store
            .settle(Self::at(&self.sku, g, seg), user, rid, qty, post, ttl.ms())
            .await;
        self.err("settle", &r);
        let line = format!(
            "settle {} {user} {rid} x{qty} @{seg} ttl {}: {r:?}",
            if post { "post" } else { "void" },
            span(ttl)
        );
        (line, r)
    }

    /// Hold, Rehold, Settle, HoldsDue in the current generation `g`: the line, and whether
    /// it started a short timer (`None`: nothing to pick, skipped).
    pub(super) async fn cart_step(&mut self, g: &Gen, op: &Op) -> Option<(String, bool)> {
        let n = g.segments;
        Some(match op {
            Op::Hold {
                user,
                rid,
                qty,
                hint,
            } => {
                let s = item(*user, *rid, *qty, *hint, n);
                let (line, applied) = self.sell(g, &s, &[]).await;
                self.name_item(&s);
                self.cur.as_mut().unwrap().sent.push(s);
                (line, applied && hint.is_short())
            }
            Op::Rehold { nth } => {
                let s = pick(&g.items, *nth)?.clone();
                let (line, applied) = self.sell(g, &s, &[]).await;
                let short = applied && s.resv.is_some_and(T::is_short);
                self.cur.as_mut().unwrap().sent.push(s);
                (format!("rehold {line}"), short)
            }
            Op::Settle {
                on,
                post,
                other_qty,
                ttl,
            } => {
                let s = match on {
                    On::Item(k) => pick(&g.items, *k)?.clone(),
                    On::Sent(k) => pick(&g.sent, *k)?.clone(),
                    On::Fresh { user, rid, qty } => {
                        let s = item(*user, *rid, *qty, T::Long, n);
                        self.name_item(&s);
                        s
                    }
                };
                let qty = if *other_qty { s.qty % 5 + 1 } else { s.qty };
                let (line, r) = self
                    .settle_at(g, s.seg, &s.user, &s.rid, qty, *post, *ttl)
                    .await;
                let short = ttl.is_short() && matches!(r, Ok(SettleReply::Done(_)));
                (format!("{on:?} {line}"), short)
            }
            Op::HoldsDue { seg, max } => {
                let r = self
                    .store
                    .holds_due(Self::at(&self.sku, g, seg % n), *max)
                    .await;
                self.err("holds_due", &r);
                let shown = match r {
                    Ok(v) if v.len() < *max => holds_line(v),
                    // Truncated: which come first depends on hints that may tie on one store
                    // and not on the other; only the count is compared.
                    Ok(v) => format!("{} (truncated)", v.len()),
                    Err(e) => format!("Err({e:?})"),
                };
                (format!("holds due @{} max {max}: {shown}", seg % n), false)
            }
            _ => unreachable!("not a cart step: {op:?}"),
        })
    }

    /// Stale steps 9 (holds_due), 10 (the void of an item) and 11 (an item's hold) on the
    /// previous generation `g` (`None`: nothing to pick).
    pub(super) async fn stale_cart(
        &mut self,
        g: &Gen,
        seg: u32,
        what: u8,
        nth: usize,
    ) -> Option<String> {
        let sku = self.sku.clone();
        Some(match what {
            9 => {
                let r = self
                    .store
                    .holds_due(Self::at(&sku, g, seg % g.segments), 256)
                    .await;
                self.err("holds_due", &r);
                format!("holds due: {:?}", r.map(holds_line))
            }
            10 => {
                let s = pick(&g.items, nth)?.clone();
                self.settle_at(g, s.seg, &s.user, &s.rid, s.qty, false, T::Long)
                    .await
                    .0
            }
            _ => {
                let s = item(0, 0, 1, T::Long, g.segments);
                self.sell(g, &s, &[]).await.0
            }
        })
    }

    fn order_id(&self, oid: u8) -> OrderId {
        OrderId::new(
            self.owner.clone(),
            RequestId::new(format!("k{oid}")).unwrap(),
        )
        .unwrap()
    }

    /// `order` step `step` on the case's order `k<oid>`, decided records kept `ttl`.
    pub(super) async fn order(&mut self, oid: u8, step: OStep, ttl: T) -> Out {
        let id = self.order_id(oid);
        let s = match step {
            OStep::Open { hold, items } => OrderStep::Open {
                hold_ms: hold.ms(),
                items: ITEMS[items],
            },
            OStep::Held => OrderStep::Held,
            OStep::Refuse => OrderStep::Refuse { why: "2 sold_out" },
            OStep::Confirm => OrderStep::Confirm,
            OStep::Cancel => OrderStep::Cancel,
            OStep::Expire => OrderStep::Expire,
            OStep::Read => OrderStep::Read,
        };
        let r = self.store.order(&id, s, ttl.ms()).await;
        self.err("order", &r);
        if !self.orders.contains(&oid) {
            self.orders.push(oid);
            self.orders.sort_unstable();
        }
        // A new open record with a short hold: its deadline; a decision with a short ttl: the
        // record's end.
        let short = match &r {
            Ok(OrderReply {
                changed: true,
                state: Some(st),
                ..
            }) => {
                if st.is_open() {
                    matches!(
                        step,
                        OStep::Open {
                            hold: T::Short(_),
                            ..
                        }
                    )
                } else {
                    ttl.is_short()
                }
            }
            _ => false,
        };
        let line = self.order_line(&r);
        Out {
            line: format!("order k{oid} {step:?} ttl {}: {line}", span(ttl)),
            short,
        }
    }

    /// An order's reply as a line (time left: `open` or `-`); checks that time is left exactly
    /// while the order is open.
    fn order_line(&mut self, r: &Result<OrderReply>) -> String {
        match r {
            Ok(r) => {
                let open = r.state.is_some_and(|s| s.is_open());
                if (r.left_ms > 0) != open {
                    self.bad
                        .push(format!("[order] time left {} ms in {r:?}", r.left_ms));
                }
                format!(
                    "{:?} changed {} left {} conflict {} why {:?} items {:?}",
                    r.state,
                    r.changed,
                    if r.left_ms > 0 { "open" } else { "-" },
                    r.conflict,
                    r.why,
                    r.items
                )
            }
            Err(e) => format!("Err({e:?})"),
        }
    }

    /// Every order of the case stepped so far, read (a read writes nothing), as one line.
    pub(super) async fn read_orders(&mut self) -> Option<String> {
        if self.orders.is_empty() {
            return None;
        }
        let mut shown = Vec::new();
        for oid in self.orders.clone() {
            let id = self.order_id(oid);
            let r = self.store.order(&id, OrderStep::Read, T::Long.ms()).await;
            self.err("order read", &r);
            shown.push(format!("k{oid}={}", self.order_line(&r)));
        }
        Some(format!("  orders {}", shown.join(" | ")))
    }
}

/// Items due, sorted by user and id (hints that tie on one store may not on another), each
/// `user/id xqty`.
pub(super) fn holds_line(mut v: Vec<DueHold>) -> String {
    v.sort();
    let items: Vec<String> = v
        .iter()
        .map(|h| format!("{}/{} x{}", h.user, h.request_id, h.qty))
        .collect();
    format!("[{}]", items.join(", "))
}
