//! One segment's state and every step on it: the reference semantics of the store.
//!
//! Pure: no locking, no clock reads, no I/O. The caller holds the segment's lock and passes
//! `now`, a logical clock in ms (the memory store passes ms since it started; the model checker
//! passes its own). Ordered maps only, so a state is `Clone + Eq + Hash` and a model checker can
//! explore states made by these very functions. Each step mirrors one script
//! (`src/scripts/*.lua`) and says which; the differential tests hold the two to the same
//! answers.
//!
//! What a segment holds, per generation:
//! - counters ([`SegmentState`]): `loaded + restocked + moved_in = stock + reserved + sold +
//!   moved_out`, after every step;
//! - a ledger per user homed here: the user's request records and, when the SKU has a per-user
//!   limit, the units the user holds (`held`: sold, confirmed, or reserved and live) and of those
//!   the units held for good (`sold`);
//! - the reservation index (expiry, user, request id) of live reservations;
//! - the hold index (hint, user, request id) of order items held (`holds`, a child module:
//!   settled only by their order's decision);
//! - the transfers this segment debited (remembered for the generation; those not yet marked
//!   done are due to the sweeper once their lease runs out) and those it credited (remembered
//!   for the generation: a credit is applied at most once per id).

use crate::ids::{RequestId, UserId};
mod holds;

use crate::store::{
    Credit, DueTransfer, HomeRecord, ItemState, RecordState, RequestKind, ReservationAction,
    ReserveEnd, RestockReply, ResvState, SegmentState, SellArgs, SellReply, Survey, TransferArgs,
    TransferId, TransferReply,
};
use std::collections::{BTreeMap, BTreeSet};

/// A ledger holding this many records — or any larger power of two — forgets those past their
/// `until` before taking another (the scripts: when the user hash has that many record
/// fields). Keeps a user's memory within twice what the user holds plus what ended within the
/// request TTL, at an amortised O(1) per write (a ledger of live records is scanned at 32, 64,
/// 128, ... records, not at every write).
pub const PRUNE_AT: usize = 32;

/// Whether a ledger holding `n` records prunes before taking another.
pub fn prunes_at(n: usize) -> bool {
    n >= PRUNE_AT && n.is_power_of_two()
}

/// `until` = 0: never forgotten within the generation.
fn live(until: u64, now: u64) -> bool {
    until == 0 || now < until
}

/// A request's record in its user's ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record {
    /// The request's quantity.
    pub qty: u64,
    /// Its state (the kind follows: [`RecordState::Sold`] is a sale).
    pub state: RecordState,
    /// A reservation's expiry (ms); 0 for a sale.
    pub exp: u64,
    /// Forgotten at this time (ms); 0: kept for the generation.
    pub until: u64,
}

impl Record {
    fn kind(&self) -> RequestKind {
        match self.state {
            RecordState::Sold => RequestKind::Sale,
            RecordState::Reservation(_) => RequestKind::Reservation,
            RecordState::Item(_) => RequestKind::OrderItem,
        }
    }
}

/// One user's ledger at the user's home segment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Ledger {
    /// Units the user holds here (sold, confirmed, reserved and live); kept only when the
    /// segment has a per-user limit.
    pub held: u64,
    /// Of `held`, units held for good (sold or confirmed).
    pub sold: u64,
    /// Request records by request id.
    pub records: BTreeMap<RequestId, Record>,
    /// The whole ledger is forgotten at this time (ms; 0: never). Without a per-user limit it
    /// follows the latest record's `until` (the scripts' key TTL); with one it is 0.
    pub until: u64,
}

/// A transfer this segment debited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Transfer {
    /// Where its units go.
    pub dest: u32,
    /// Its units.
    pub units: u64,
    /// When any sweeper may credit it home (ms).
    pub lease_until: u64,
    /// Credited home and marked done: no longer due.
    pub done: bool,
}

/// One segment: what a segment hash and the keys under its hash tag hold in Redis.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Load generation.
    pub generation: u64,
    /// The home function the generation was loaded with ([`crate::segments::HOME_FN`]).
    pub home_fn: u32,
    /// Units one user may hold (0: no limit).
    pub limit: u64,
    /// Counters.
    pub counters: SegmentState,
    /// Ledgers of the users homed here.
    pub users: BTreeMap<UserId, Ledger>,
    /// Live reservations: (expiry, user, request id).
    pub reservations: BTreeSet<(u64, UserId, RequestId)>,
    /// Order items held: (when the sweeper asks their order, user, request id).
    pub holds: BTreeSet<(u64, UserId, RequestId)>,
    /// Transfers credited here: id → units.
    pub credited: BTreeMap<TransferId, u64>,
    /// Transfers debited here.
    pub transfers: BTreeMap<TransferId, Transfer>,
    /// Restock records: request id → (qty, total, until).
    pub restocks: BTreeMap<RequestId, (u64, u64, u64)>,
}

impl Segment {
    /// A freshly loaded segment (`load_segment.lua`).
    pub fn loaded(generation: u64, units: u64, user_limit: u64) -> Self {
        Segment {
            generation,
            home_fn: crate::segments::HOME_FN,
            limit: user_limit,
            counters: SegmentState {
                stock: units,
                loaded: units,
                ..SegmentState::default()
            },
            ..Segment::default()
        }
    }

    /// Whether a step addressed to `generation` runs here (the scripts' `stale` check).
    pub fn is(&self, generation: u64) -> bool {
        self.generation == generation
    }

    /// `user`'s ledger unless forgotten (a forgotten one is dropped on the way).
    fn ledger(&mut self, user: &UserId, now: u64) -> Option<&mut Ledger> {
        if self.users.get(user).is_some_and(|l| !live(l.until, now)) {
            self.users.remove(user);
        }
        self.users.get_mut(user)
    }

    /// `user`'s live record of `rid`.
    fn live_record(&mut self, user: &UserId, rid: &RequestId, now: u64) -> Option<Record> {
        let l = self.ledger(user, now)?;
        l.records.get(rid).copied().filter(|r| live(r.until, now))
    }

    /// Returns every expired reservation to stock (the prelude's `reclaim`, no cap); units.
    pub fn reclaim(&mut self, now: u64) -> u64 {
        let mut back = 0;
        while let Some(first) = self.reservations.first().cloned() {
            if first.0 > now {
                break;
            }
            self.reservations.remove(&first);
            let (_, user, rid) = first;
            let limited = self.limit > 0;
            let Some(l) = self.users.get_mut(&user) else {
                continue;
            };
            let Some(rec) = l.records.get_mut(&rid) else {
                continue;
            };
            if rec.state != RecordState::Reservation(ResvState::Reserved) {
                continue;
            }
            rec.state = RecordState::Reservation(ResvState::Expired);
            if limited {
                l.held -= rec.qty;
            }
            self.counters.reserved -= rec.qty;
            self.counters.stock += rec.qty;
            back += rec.qty;
        }
        back
    }

    /// Credits transfers once per id (`credit` in sell.lua).
    fn credit(&mut self, credits: &[Credit]) {
        for c in credits {
            if self.credited.contains_key(&c.id) {
                continue;
            }
            self.credited.insert(c.id, c.units);
            self.counters.stock += c.units;
            self.counters.moved_in += c.units;
        }
    }

    /// `sell.lua` for one request: credits, reclaim, then the decision (see
    /// [`Store::sell`](crate::Store::sell)). `fence` is not checked here (the lock strategies
    /// are Redis only); the caller checked the generation.
    pub fn sell(&mut self, req: &SellArgs<'_>, now: u64) -> SellReply {
        self.credit(req.credits);
        self.reclaim(now);
        if req.qty == 0 {
            return SellReply::Applied {
                stock_after: self.counters.stock,
            };
        }
        let (user, rid, qty, kind) = (req.user, req.request_id, req.qty, req.kind());
        if let Some(rec) = self.live_record(user, rid, now) {
            if rec.qty != qty {
                return SellReply::Mismatch("qty");
            }
            if rec.kind() != kind {
                return SellReply::Mismatch("kind");
            }
            return SellReply::Replay;
        }
        let limit = self.limit;
        if limit > 0 {
            let (held, sold) = self.users.get(user).map_or((0, 0), |l| (l.held, l.sold));
            if held + qty > limit {
                return SellReply::LimitReached { limit, held, sold };
            }
        }
        if self.counters.stock < qty {
            return SellReply::Short {
                stock: self.counters.stock,
            };
        }
        self.counters.stock -= qty;
        let rec = if kind == RequestKind::OrderItem {
            // Kept until settled, whatever its age: only the order's decision ends it.
            self.counters.reserved += qty;
            let hint = now + req.resv_ttl_ms;
            self.holds.insert((hint, user.clone(), rid.clone()));
            Record {
                qty,
                state: RecordState::Item(ItemState::Held),
                exp: hint,
                until: 0,
            }
        } else if kind == RequestKind::Sale {
            self.counters.sold += qty;
            Record {
                qty,
                state: RecordState::Sold,
                exp: 0,
                until: if limit > 0 { 0 } else { now + req.ttl_ms },
            }
        } else {
            self.counters.reserved += qty;
            let exp = now + req.resv_ttl_ms;
            self.reservations.insert((exp, user.clone(), rid.clone()));
            Record {
                qty,
                state: RecordState::Reservation(ResvState::Reserved),
                exp,
                until: exp + req.ttl_ms,
            }
        };
        let l = self.users.entry(user.clone()).or_default();
        if prunes_at(l.records.len()) {
            l.records.retain(|_, r| live(r.until, now));
        }
        l.records.insert(rid.clone(), rec);
        if limit > 0 {
            l.held += qty;
            if kind == RequestKind::Sale {
                l.sold += qty;
            }
        } else if rec.until == 0 || (l.until == 0 && l.records.len() > 1) {
            // A held item keeps its ledger for the generation (as the scripts keep such
            // records in the record hash, which has no TTL); the ledger is dropped only once
            // every record in it is forgotten.
            l.until = 0;
        } else {
            l.until = l.until.max(rec.until);
        }
        SellReply::Applied {
            stock_after: self.counters.stock,
        }
    }

    /// `transfer.lua` (debit): see [`Store::transfer`](crate::Store::transfer).
    pub fn transfer(&mut self, t: &TransferArgs, now: u64) -> TransferReply {
        self.reclaim(now);
        if let Some(x) = self.transfers.get_mut(&t.id) {
            if !x.done {
                x.lease_until = now + t.lease_ms;
            }
            return TransferReply::Debited {
                units: x.units,
                stock_after: self.counters.stock,
            };
        }
        let give = t.want.min(self.counters.stock.saturating_sub(t.floor));
        if give == 0 {
            return TransferReply::Short {
                stock: self.counters.stock,
            };
        }
        self.counters.stock -= give;
        self.counters.moved_out += give;
        self.transfers.insert(
            t.id,
            Transfer {
                dest: t.dest,
                units: give,
                lease_until: now + t.lease_ms,
                done: false,
            },
        );
        TransferReply::Debited {
            units: give,
            stock_after: self.counters.stock,
        }
    }

    /// `transfer.lua` (done): the transfer is no longer due; its id stays remembered.
    pub fn transfer_done(&mut self, id: TransferId) {
        if let Some(x) = self.transfers.get_mut(&id) {
            x.done = true;
        }
    }

    /// Transfers not done, by lease end, at most `max`.
    pub fn transfers_due(&self, max: usize, now: u64) -> Vec<DueTransfer> {
        let mut due: Vec<(u64, DueTransfer)> = self
            .transfers
            .iter()
            .filter(|(_, x)| !x.done)
            .map(|(id, x)| {
                (
                    x.lease_until,
                    DueTransfer {
                        id: *id,
                        dest: x.dest,
                        units: x.units,
                        lease_left_ms: x.lease_until.saturating_sub(now),
                    },
                )
            })
            .collect();
        due.sort();
        due.into_iter().take(max).map(|(_, d)| d).collect()
    }

    /// `restock.lua`: adds `qty` once per request id.
    pub fn restock(
        &mut self,
        rid: &RequestId,
        qty: u64,
        total: u64,
        ttl_ms: u64,
        now: u64,
    ) -> RestockReply {
        if let Some(&(q, t, until)) = self.restocks.get(rid)
            && live(until, now)
        {
            return if (q, t) == (qty, total) {
                RestockReply::Replay {
                    stock: self.counters.stock,
                }
            } else {
                RestockReply::Mismatch
            };
        }
        if prunes_at(self.restocks.len()) {
            self.restocks.retain(|_, (_, _, until)| live(*until, now));
        }
        self.restocks
            .insert(rid.clone(), (qty, total, now + ttl_ms));
        self.counters.stock += qty;
        self.counters.restocked += qty;
        RestockReply::Restocked {
            stock_after: self.counters.stock,
        }
    }

    /// `reserve_end.lua`: confirms, cancels or inspects `user`'s reservation `rid`.
    pub fn reserve_end(
        &mut self,
        user: &UserId,
        rid: &RequestId,
        action: ReservationAction,
        now: u64,
    ) -> ReserveEnd {
        self.reclaim(now);
        let limited = self.limit > 0;
        let Some(rec) = self.live_record(user, rid, now) else {
            return ReserveEnd::Unknown;
        };
        let RecordState::Reservation(state) = rec.state else {
            return ReserveEnd::Unknown;
        };
        let (u, units) = (user.to_string(), rec.qty);
        let to = match (state, action) {
            (ResvState::Reserved, ReservationAction::Confirm) => ResvState::Confirmed,
            (ResvState::Reserved, ReservationAction::Cancel) => ResvState::Cancelled,
            (s, ReservationAction::Confirm) if s == ResvState::Confirmed => {
                return ReserveEnd::Done {
                    state: s,
                    user: u,
                    units,
                };
            }
            (s, ReservationAction::Cancel) if s == ResvState::Cancelled => {
                return ReserveEnd::Done {
                    state: s,
                    user: u,
                    units,
                };
            }
            (s, _) => {
                return ReserveEnd::Ended {
                    state: s,
                    user: u,
                    units,
                };
            }
        };
        self.reservations
            .remove(&(rec.exp, user.clone(), rid.clone()));
        self.counters.reserved -= units;
        let l = self
            .users
            .get_mut(user)
            .expect("a live record has its ledger");
        let r = l.records.get_mut(rid).expect("live record");
        r.state = RecordState::Reservation(to);
        if to == ResvState::Confirmed {
            self.counters.sold += units;
            if limited {
                r.until = 0;
                l.sold += units;
            }
        } else {
            self.counters.stock += units;
            if limited {
                l.held -= units;
            }
        }
        ReserveEnd::Done {
            state: to,
            user: u,
            units,
        }
    }

    /// `survey.lua`: reclaim, then the counters and, with `detail`, what the live
    /// reservations hold.
    pub fn survey(&mut self, now: u64, detail: bool) -> Survey {
        let reclaimed = self.reclaim(now);
        let (mut held, mut live, mut orphans) = (0, 0, 0);
        let index = if detail {
            &self.reservations
        } else {
            &BTreeSet::new()
        };
        for (_, user, rid) in index {
            match self
                .users
                .get(user)
                .and_then(|l| l.records.get(rid))
                .filter(|r| r.state == RecordState::Reservation(ResvState::Reserved))
            {
                Some(r) => {
                    held += r.qty;
                    live += 1;
                }
                None => orphans += 1,
            }
        }
        if detail {
            let (h, l, o) = self.holds_detail();
            (held, live, orphans) = (held + h, live + l, orphans + o);
        }
        Survey {
            state: self.counters,
            held,
            live,
            orphans,
            reclaimed,
            expired: 0,
        }
    }

    /// `peek.lua`: [`survey`](Self::survey) without writing anything. Reservations past their
    /// expiry are not returned: their units stay in `reserved` (and, with `detail`, in `held`
    /// and `live`), and `expired` says how many of them are on their way back (the next step
    /// that writes at this segment returns them).
    pub fn peek(&self, now: u64, detail: bool) -> Survey {
        let (mut held, mut live, mut orphans, mut expired) = (0, 0, 0, 0);
        for (exp, user, rid) in &self.reservations {
            let due = *exp <= now;
            if !detail && !due {
                break; // ordered by expiry: only the due ones are needed
            }
            match self
                .users
                .get(user)
                .and_then(|l| l.records.get(rid))
                .filter(|r| r.state == RecordState::Reservation(ResvState::Reserved))
            {
                Some(r) => {
                    if due {
                        expired += r.qty;
                    }
                    if detail {
                        held += r.qty;
                        live += 1;
                    }
                }
                None if detail => orphans += 1,
                None => {}
            }
        }
        if detail {
            let (h, l, o) = self.holds_detail();
            (held, live, orphans) = (held + h, live + l, orphans + o);
        }
        Survey {
            state: self.counters,
            held,
            live,
            orphans,
            reclaimed: 0,
            expired,
        }
    }

    /// `user`'s record of `rid` (read only: a reservation past its expiry reads as expired).
    pub fn record(&self, user: &UserId, rid: &RequestId, now: u64) -> Option<HomeRecord> {
        let l = self.users.get(user).filter(|l| live(l.until, now))?;
        let r = l.records.get(rid).filter(|r| live(r.until, now))?;
        let state = match r.state {
            RecordState::Reservation(ResvState::Reserved) if r.exp <= now => {
                RecordState::Reservation(ResvState::Expired)
            }
            s => s,
        };
        Some(HomeRecord {
            qty: r.qty,
            kind: r.kind(),
            state,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(u: &str, r: &str) -> (UserId, RequestId) {
        (UserId::new(u).unwrap(), RequestId::new(r).unwrap())
    }

    fn req<'a>(u: &'a UserId, r: &'a RequestId, qty: u64, resv: u64) -> SellArgs<'a> {
        SellArgs {
            request_id: r,
            user: u,
            qty,
            resv_ttl_ms: resv,
            order_item: false,
            ttl_ms: 1000,
            credits: &[],
            fence: 0,
        }
    }

    #[test]
    fn sells_once_and_counts_the_ledger() {
        let mut s = Segment::loaded(1, 5, 1);
        let (u, r) = ids("u", "r");
        assert_eq!(
            s.sell(&req(&u, &r, 1, 0), 0),
            SellReply::Applied { stock_after: 4 }
        );
        assert_eq!(s.sell(&req(&u, &r, 1, 0), 5000), SellReply::Replay);
        let r2 = RequestId::new("r2").unwrap();
        assert!(matches!(
            s.sell(&req(&u, &r2, 1, 0), 1),
            SellReply::LimitReached { held: 1, .. }
        ));
        assert!(s.counters.balances());
    }

    #[test]
    fn every_expired_reservation_returns_before_short() {
        let mut s = Segment::loaded(1, 100, 0);
        for i in 0..100 {
            let (u, r) = ids(&format!("u{i}"), "r");
            let a = s.sell(&req(&u, &r, 1, 50), 0);
            assert!(matches!(a, SellReply::Applied { .. }));
        }
        assert_eq!(s.counters.stock, 0);
        let (u, r) = ids("big", "r");
        assert_eq!(
            s.sell(&req(&u, &r, 80, 0), 60),
            SellReply::Applied { stock_after: 20 }
        );
        assert!(s.counters.balances());
    }

    #[test]
    fn a_credit_applies_once() {
        let mut d = Segment::loaded(1, 10, 0);
        let mut h = Segment::loaded(1, 0, 0);
        let t = TransferArgs {
            id: 7,
            dest: 1,
            want: 3,
            floor: 0,
            lease_ms: 100,
        };
        assert!(matches!(
            d.transfer(&t, 0),
            TransferReply::Debited { units: 3, .. }
        ));
        assert!(matches!(
            d.transfer(&t, 1),
            TransferReply::Debited { units: 3, .. }
        ));
        assert_eq!(d.counters.moved_out, 3);
        let c = [Credit {
            id: 7,
            donor: 0,
            units: 3,
        }];
        let (u, r) = ids("u", "r");
        let mut a = req(&u, &r, 5, 0);
        a.credits = &c;
        assert_eq!(h.sell(&a, 2), SellReply::Short { stock: 3 });
        assert_eq!(h.sell(&a, 3), SellReply::Short { stock: 3 });
        assert_eq!(h.counters.moved_in, 3);
        assert!(h.counters.balances() && d.counters.balances());
        assert_eq!(d.transfers_due(10, 101)[0].lease_left_ms, 0);
        assert_eq!(d.transfers_due(10, 51)[0].lease_left_ms, 50);
        d.transfer_done(7);
        assert!(d.transfers_due(10, 100).is_empty());
    }
}
