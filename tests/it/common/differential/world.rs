//! One store of a differential case: what it was told (generations, requests, transfers), one
//! [`Op`] as a transcript line ([`World::step`]), the state read after each step
//! ([`World::snapshot`], in [`snapshot`]) and the invariants checked on it; the cart steps
//! (order items, settles, holds due, orders' records) in [`carts`]. Generations are normalised
//! (`G1`, `G2`, ...: they are clock-based and differ between stores), transfer leases to `due`
//! / `leased`, an open order's time left to `open`; everything else is compared as the store
//! answered it.

mod carts;
mod snapshot;

use super::ADVANCE;
use super::op::{Again, Op, T, TRANSFER_IDS};
use futures::future::join_all;
use shardstock::placement::Placement;
use shardstock::store::{
    Credit, DueTransfer, ReservationAction, SegAddr, SellArgs, SellReply, TransferArgs, TransferId,
    TransferReply,
};
use shardstock::*;

/// One generation of the case's SKU, as loaded.
#[derive(Debug, Clone)]
pub struct Gen {
    pub generation: u64,
    pub segments: u32,
    pub limit: u64,
    pub placement: Placement,
    /// Requests sent in it (refused ones too), in order.
    pub sent: Vec<Sent>,
    /// Transfers it debited (once per donor and id), in order.
    pub moved: Vec<Moved>,
    /// Order items named in it (held, or settled before any hold), once per (segment, user,
    /// id), as first named.
    pub items: Vec<Sent>,
}

/// A request sent with `sell`.
#[derive(Debug, Clone)]
pub struct Sent {
    pub seg: u32,
    pub user: UserId,
    pub rid: RequestId,
    pub qty: u64,
    /// A reservation held this long, or an order item's hint (`item`).
    pub resv: Option<T>,
    /// An order item (`resv` is its hint).
    pub item: bool,
    pub ttl: T,
}

/// A transfer debited.
#[derive(Debug, Clone, Copy)]
pub struct Moved {
    pub donor: u32,
    pub dest: u32,
    pub id: TransferId,
    pub units: u64,
}

/// One store of a case.
pub struct World<S: Store> {
    pub label: &'static str,
    pub store: S,
    /// Loads go through an engine: `Engine::load` is exactly load_begin, load_segment of each
    /// segment, drop_segment of the extra ones, load_commit.
    loader: Engine<S>,
    pub sku: Sku,
    pub cur: Option<Gen>,
    pub old: Option<Gen>,
    gens: Vec<u64>,
    /// The user of the case's orders (named after the case: order records are not per SKU).
    owner: UserId,
    /// The case's orders stepped so far (`k<oid>`), read after every step.
    orders: Vec<u8>,
    /// Violated invariants, each `[tag] text`.
    pub bad: Vec<String>,
}

/// What one step did.
pub struct Out {
    /// Empty: the step did not apply (nothing to pick) and is skipped everywhere.
    pub line: String,
    /// The step started a short timer.
    pub short: bool,
}

impl Out {
    fn skip() -> Self {
        Out {
            line: String::new(),
            short: false,
        }
    }
}

fn pick<X>(v: &[X], nth: usize) -> Option<&X> {
    (!v.is_empty()).then(|| &v[v.len() - 1 - nth % v.len()])
}

fn uid(u: &str) -> UserId {
    UserId::new(u).unwrap()
}

impl<S: Store + Clone> World<S> {
    pub fn new(label: &'static str, store: S, name: &str) -> Self {
        let loader = Engine::builder().build(store.clone()).unwrap();
        Self {
            label,
            store,
            loader,
            sku: Sku::new(name).unwrap(),
            owner: uid(name),
            orders: Vec::new(),
            cur: None,
            old: None,
            gens: Vec::new(),
            bad: Vec::new(),
        }
    }
}

impl<S: Store> World<S> {
    fn gen_name(&mut self, g: u64) -> String {
        if g == 0 {
            return "G0".into();
        }
        match self.gens.iter().position(|x| *x == g) {
            Some(i) => format!("G{}", i + 1),
            None => {
                self.gens.push(g);
                format!("G{}", self.gens.len())
            }
        }
    }

    /// Segment `i` of generation `g`, as placed.
    fn at<'a>(sku: &'a Sku, g: &Gen, i: u32) -> SegAddr<'a> {
        SegAddr::new(sku, g.generation, i).with_suffix(g.placement.suffix(i))
    }

    fn err<T: std::fmt::Debug>(&mut self, what: &str, r: &Result<T>) {
        if let Err(e) = r {
            self.bad.push(format!("[error] {what}: {e:?}"));
        }
    }

    /// Runs one step; returns its transcript line.
    pub async fn step(&mut self, op: &Op) -> Out {
        if let Op::Load {
            total,
            segments,
            limit,
        } = op
        {
            return self.load(*total, *segments, *limit).await;
        }
        if let Op::Advance = op {
            tokio::time::sleep(ADVANCE).await;
            return Out {
                line: "advance".into(),
                short: false,
            };
        }
        if let Op::Stale { seg, what, nth } = op {
            return self.stale(*seg, *what, *nth).await;
        }
        if let Op::Order { oid, step, ttl } = op {
            return self.order(*oid, *step, *ttl).await;
        }
        let Some(g) = self.cur.clone() else {
            return Out::skip();
        };
        let sku = self.sku.clone();
        let n = g.segments;
        let at = |i: u32| Self::at(&sku, &g, i % n);
        let mut short = false;
        let line = match op {
            Op::Sell {
                seg,
                user,
                rid,
                qty,
                resv,
                ttl,
            } => {
                let s = Sent {
                    seg: seg % n,
                    user: uid(&format!("u{user}")),
                    rid: RequestId::new(format!("r{rid}")).unwrap(),
                    qty: *qty,
                    resv: *resv,
                    item: false,
                    ttl: *ttl,
                };
                let (line, applied) = self.sell(&g, &s, &[]).await;
                short = applied && (resv.is_some_and(T::is_short) || ttl.is_short());
                self.cur.as_mut().unwrap().sent.push(s);
                line
            }
            Op::Credit {
                nth,
                user,
                rid,
                qty,
                resv,
            } => {
                let Some(t) = pick(&g.moved, *nth).copied() else {
                    return Out::skip();
                };
                let credits: Vec<Credit> = g
                    .moved
                    .iter()
                    .filter(|m| m.dest == t.dest)
                    .take(64)
                    .map(|m| Credit {
                        id: m.id,
                        donor: m.donor,
                        units: m.units,
                    })
                    .collect();
                let s = Sent {
                    seg: t.dest,
                    user: uid(&format!("u{user}")),
                    rid: RequestId::new(format!("r{rid}")).unwrap(),
                    qty: *qty,
                    resv: resv.then_some(T::Long),
                    item: false,
                    ttl: T::Long,
                };
                let (line, _) = self.sell(&g, &s, &credits).await;
                if *qty > 0 {
                    self.cur.as_mut().unwrap().sent.push(s);
                }
                let ids: Vec<String> = credits.iter().map(|c| c.id.to_string()).collect();
                format!("{line} credits [{}]", ids.join(" "))
            }
            Op::Transfer {
                donor,
                dest,
                want,
                floor,
                lease,
                id,
            } => {
                let args = TransferArgs {
                    id: TRANSFER_IDS[*id],
                    dest: dest % n,
                    want: *want,
                    floor: *floor,
                    lease_ms: lease.ms(),
                };
                let (line, debited) = self.transfer(&g, donor % n, args).await;
                short = debited && lease.is_short();
                line
            }
            Op::TransferAgain { nth, want, lease } => {
                let Some(t) = pick(&g.moved, *nth).copied() else {
                    return Out::skip();
                };
                let args = TransferArgs {
                    id: t.id,
                    dest: t.dest,
                    want: *want,
                    floor: 0,
                    lease_ms: lease.ms(),
                };
                let (line, debited) = self.transfer(&g, t.donor, args).await;
                short = debited && lease.is_short();
                format!("again {line}")
            }
            Op::TransferDone { nth } => {
                let Some(t) = pick(&g.moved, *nth).copied() else {
                    return Out::skip();
                };
                let r = self.store.transfer_done(at(t.donor), t.id).await;
                self.err("transfer_done", &r);
                format!("done {} @{}: {r:?}", t.id, t.donor)
            }
            Op::Due { donor, max } => {
                let r = self.store.transfers_due(at(*donor), *max).await;
                self.err("transfers_due", &r);
                match r {
                    Ok(v) => {
                        self.check_due_order(&v);
                        let shown = if v.len() < *max {
                            due_line(v)
                        } else {
                            // Truncated: which ones come first depends on lease ends that may
                            // tie on one store and not on the other; only the count is compared.
                            format!("{} (truncated)", v.len())
                        };
                        format!("due @{} max {max}: {shown}", donor % n)
                    }
                    Err(e) => format!("due Err({e:?})"),
                }
            }
            Op::Restock {
                seg,
                rid,
                qty,
                extra,
                ttl,
            } => {
                let id = RequestId::new(format!("s{rid}")).unwrap();
                let r = self
                    .store
                    .restock(at(*seg), &id, *qty, qty + extra, ttl.ms())
                    .await;
                self.err("restock", &r);
                short = ttl.is_short()
                    && matches!(r, Ok(shardstock::store::RestockReply::Restocked { .. }));
                format!("restock @{} {id} {qty}/{}: {r:?}", seg % n, qty + extra)
            }
            Op::End { nth, action } => {
                // Order items too: reserve_end knows none of them (unknown).
                let resvs: Vec<&Sent> = g.sent.iter().filter(|s| s.resv.is_some()).collect();
                let Some(s) = pick(&resvs, *nth).map(|s| (*s).clone()) else {
                    return Out::skip();
                };
                let action = match action {
                    0 => ReservationAction::Confirm,
                    1 => ReservationAction::Cancel,
                    _ => ReservationAction::Inspect,
                };
                let r = self
                    .store
                    .reserve_end(at(s.seg), &s.user, &s.rid, action)
                    .await;
                self.err("reserve_end", &r);
                format!("end {action:?} {} {} @{}: {r:?}", s.user, s.rid, s.seg)
            }
            Op::Resend { nth, how } => {
                let Some(mut s) = pick(&g.sent, *nth).cloned() else {
                    return Out::skip();
                };
                match how {
                    Again::Same => {}
                    Again::OtherQty => s.qty = s.qty % 5 + 1,
                    // A sale becomes a reservation, a reservation a sale, an item a reservation.
                    Again::OtherKind if s.item => s.item = false,
                    Again::OtherKind => {
                        s.resv = match s.resv {
                            Some(_) => None,
                            None => Some(T::Long),
                        }
                    }
                    Again::OtherUser(u) => {
                        let mut other = format!("u{u}");
                        if other == s.user.as_str() {
                            other = format!("u{}", (u + 1) % 4);
                        }
                        s.user = uid(&other);
                    }
                }
                let (line, applied) = self.sell(&g, &s, &[]).await;
                short = applied && (s.resv.is_some_and(T::is_short) || s.ttl.is_short());
                self.cur.as_mut().unwrap().sent.push(s);
                format!("resend {how:?} {line}")
            }
            Op::Survey { seg, detail } => {
                let r = self.store.survey(at(*seg), *detail).await;
                self.err("survey", &r);
                format!("survey @{} detail {detail}: {r:?}", seg % n)
            }
            Op::Peek { seg, detail } => {
                let r = self.store.peek(at(*seg), *detail).await;
                self.err("peek", &r);
                format!("peek @{} detail {detail}: {r:?}", seg % n)
            }
            Op::Record { nth } => {
                let Some(s) = pick(&g.sent, *nth).cloned() else {
                    return Out::skip();
                };
                let r = self.store.record(at(s.seg), &s.user, &s.rid).await;
                self.err("record", &r);
                format!("record {} {} @{}: {r:?}", s.user, s.rid, s.seg)
            }
            Op::Hold { .. } | Op::Rehold { .. } | Op::Settle { .. } | Op::HoldsDue { .. } => {
                let Some((line, started)) = self.cart_step(&g, op).await else {
                    return Out::skip();
                };
                short = started;
                line
            }
            Op::Load { .. } | Op::Advance | Op::Stale { .. } | Op::Order { .. } => unreachable!(),
        };
        Out { line, short }
    }

    async fn load(&mut self, total: u64, segments: u32, limit: u64) -> Out {
        let r = self
            .loader
            .load(
                &self.sku,
                total,
                LoadOptions::new(segments)
                    .replace(true)
                    .per_user_limit(limit),
            )
            .await;
        self.err("load", &r);
        let Ok(generation) = r else {
            return Out {
                line: format!("load {r:?}"),
                short: false,
            };
        };
        let meta = self.store.meta(&self.sku).await;
        self.err("meta", &meta);
        let placement = meta.ok().flatten().map(|m| m.placement).unwrap_or_default();
        let g = Gen {
            generation,
            segments,
            limit,
            placement,
            sent: Vec::new(),
            moved: Vec::new(),
            items: Vec::new(),
        };
        self.old = self.cur.replace(g);
        let name = self.gen_name(generation);
        Out {
            line: format!("load {name}: {total} units over {segments}, limit {limit}"),
            short: false,
        }
    }

    /// `sell` of `s` in `g` crediting `credits`: the line, and whether it applied a request.
    async fn sell(&mut self, g: &Gen, s: &Sent, credits: &[Credit]) -> (String, bool) {
        let args = SellArgs {
            request_id: &s.rid,
            user: &s.user,
            qty: s.qty,
            resv_ttl_ms: s.resv.map_or(0, T::ms),
            order_item: s.item,
            ttl_ms: s.ttl.ms(),
            credits,
            fence: 0,
        };
        let r = self.store.sell(Self::at(&self.sku, g, s.seg), args).await;
        self.err("sell", &r);
        if let Ok(SellReply::LimitReached { limit, held, sold }) = &r
            && (held + s.qty <= *limit || sold > held || *limit != g.limit)
        {
            self.bad.push(format!(
                "[limit] {} {} x{}: limit reached (limit {limit}, held {held}, sold {sold}) on a SKU loaded with limit {}",
                s.user, s.rid, s.qty, g.limit
            ));
        }
        let applied = s.qty > 0 && matches!(r, Ok(SellReply::Applied { .. }));
        let kind = match s.resv {
            None => "sale".to_string(),
            Some(t) => format!(
                "{} {}",
                if s.item { "item" } else { "resv" },
                if t.is_short() { "short" } else { "long" }
            ),
        };
        (
            format!(
                "sell @{} {} {} x{} {kind} ttl {}: {r:?}",
                s.seg,
                s.user,
                s.rid,
                s.qty,
                if s.ttl.is_short() { "short" } else { "long" }
            ),
            applied,
        )
    }

    /// `transfer` at `donor` in `g`: the line, and whether it debited (now or before).
    async fn transfer(&mut self, g: &Gen, donor: u32, args: TransferArgs) -> (String, bool) {
        let r = self
            .store
            .transfer(Self::at(&self.sku, g, donor), args)
            .await;
        self.err("transfer", &r);
        let mut debited = false;
        if let Ok(TransferReply::Debited { units, .. }) = &r {
            debited = true;
            let cur = self.cur.as_mut().unwrap();
            if !cur
                .moved
                .iter()
                .any(|m| m.donor == donor && m.id == args.id)
            {
                cur.moved.push(Moved {
                    donor,
                    dest: args.dest,
                    id: args.id,
                    units: *units,
                });
            }
        }
        (
            format!(
                "transfer {} @{donor} -> {} want {} floor {}: {r:?}",
                args.id, args.dest, args.want, args.floor
            ),
            debited,
        )
    }

    /// A step addressed to the previous generation: every one must answer stale (or nothing)
    /// and change nothing (the state read after it shows).
    async fn stale(&mut self, seg: u32, what: u8, nth: usize) -> Out {
        let Some(g) = self.old.clone() else {
            return Out::skip();
        };
        let sku = self.sku.clone();
        let at = |i: u32| Self::at(&sku, &g, i % g.segments);
        let u = uid("u0");
        let r = RequestId::new("r0").unwrap();
        let line = match what {
            0 => {
                let s = Sent {
                    seg: seg % g.segments,
                    user: u,
                    rid: r,
                    qty: 1,
                    resv: None,
                    item: false,
                    ttl: T::Long,
                };
                self.sell(&g, &s, &[]).await.0
            }
            1 => {
                let Some(t) = pick(&g.moved, nth).copied() else {
                    return Out::skip();
                };
                let c = [Credit {
                    id: t.id,
                    donor: t.donor,
                    units: t.units,
                }];
                let s = Sent {
                    seg: t.dest,
                    user: u,
                    rid: r,
                    qty: 0,
                    resv: None,
                    item: false,
                    ttl: T::Long,
                };
                format!("credit of {}: {}", t.id, self.sell(&g, &s, &c).await.0)
            }
            2 => {
                let args = TransferArgs {
                    id: 99,
                    dest: 0,
                    want: 1,
                    floor: 0,
                    lease_ms: T::Long.ms(),
                };
                let r = self.store.transfer(at(seg), args).await;
                self.err("transfer", &r);
                format!("transfer: {r:?}")
            }
            3 => {
                let r = self.store.restock(at(seg), &r, 5, 5, T::Long.ms()).await;
                self.err("restock", &r);
                format!("restock: {r:?}")
            }
            4 => {
                let resvs: Vec<&Sent> = g.sent.iter().filter(|s| s.resv.is_some()).collect();
                let Some(s) = pick(&resvs, nth).map(|s| (*s).clone()) else {
                    return Out::skip();
                };
                let r = self
                    .store
                    .reserve_end(at(s.seg), &s.user, &s.rid, ReservationAction::Confirm)
                    .await;
                self.err("reserve_end", &r);
                format!("confirm {} {}: {r:?}", s.user, s.rid)
            }
            5 => {
                let r = self.store.survey(at(seg), true).await;
                self.err("survey", &r);
                format!("survey: {r:?}")
            }
            6 => {
                let r = self.store.transfers_due(at(seg), 256).await;
                self.err("transfers_due", &r);
                format!("due: {:?}", r.map(due_line))
            }
            7 => {
                let Some(t) = pick(&g.moved, nth).copied() else {
                    return Out::skip();
                };
                let r = self.store.transfer_done(at(t.donor), t.id).await;
                self.err("transfer_done", &r);
                format!("done {}: {r:?}", t.id)
            }
            8 => {
                let Some(s) = pick(&g.sent, nth).cloned() else {
                    return Out::skip();
                };
                let r = self.store.record(at(s.seg), &s.user, &s.rid).await;
                self.err("record", &r);
                format!("record {} {}: {r:?}", s.user, s.rid)
            }
            _ => {
                let Some(line) = self.stale_cart(&g, seg, what, nth).await else {
                    return Out::skip();
                };
                line
            }
        };
        let name = self.gen_name(g.generation);
        Out {
            line: format!("stale ({name} @{}) {line}", seg % g.segments),
            short: false,
        }
    }

    fn check_due_order(&mut self, v: &[DueTransfer]) {
        if v.windows(2)
            .any(|w| w[0].lease_left_ms > w[1].lease_left_ms)
        {
            self.bad
                .push(format!("[due-order] transfers_due not by lease end: {v:?}"));
        }
    }
}

/// Transfers due, sorted by id (lease ends that tie on one store may not on another), each
/// `id->dest xunits due|leased`.
fn due_line(mut v: Vec<DueTransfer>) -> String {
    v.sort_by_key(|d| d.id);
    let items: Vec<String> = v
        .iter()
        .map(|d| {
            format!(
                "{}->{} x{} {}",
                d.id,
                d.dest,
                d.units,
                if d.lease_left_ms == 0 {
                    "due"
                } else {
                    "leased"
                }
            )
        })
        .collect();
    format!("[{}]", items.join(", "))
}
