//! One segment of the memory store: its counters, request records (`records`), reservation and
//! claim indexes, and each script's step on them (each method says which script it mirrors).
//!
//! Pure state: no locking, no clock reads — the caller holds the segment's mutex and passes
//! `now`.

use super::records::{Parts, Record, Records, SWEEP_EVERY, Status};
use super::{HashMap, ms};
use crate::error::Result;
use crate::ids::RequestId;
use crate::segments::Part;
use crate::store::{
    DueClaim, HeldState, HomeRecord, HomeReply, OnShort, RecordState, ReqArgs, ReservationAction,
    ReserveEnd, RestockReply, ResvState, SealReply, SegAddr, SegmentRole, SegmentState, SettleAs,
    SettleReply, ShutOutReply, TakeReply, TakeoverReply,
};
use std::collections::BTreeSet;
use std::time::Instant;

/// One segment: what a segment hash and the keys under its hash tag hold in Redis.
#[derive(Debug, Default)]
pub(super) struct Segment {
    pub(super) generation: u64,
    pub(super) counters: SegmentState,
    records: Records,
    /// Restock records: (generation, request id) → ((qty, total), expiry).
    restocks: HashMap<(u64, RequestId), ((u64, u64), Instant)>,
    inserts: usize,
    /// Reservation index: (expiry, generation, request id) of records holding reserved units.
    reservations: BTreeSet<(Instant, u64, RequestId)>,
    /// Claim index: (lease end, generation, request id) of pending fallback claims.
    claims: BTreeSet<(Instant, u64, RequestId)>,
}

fn left_ms(until: Instant, now: Instant) -> u64 {
    until.saturating_duration_since(now).as_millis() as u64
}

impl Segment {
    /// A freshly loaded segment of `generation` with `units` (load_segment.lua).
    pub(super) fn loaded(generation: u64, units: u64) -> Self {
        Segment {
            generation,
            counters: SegmentState {
                stock: units,
                loaded: units,
                ..SegmentState::default()
            },
            ..Segment::default()
        }
    }

    /// `rid`'s live record of `generation` (an expired one is dropped on the way).
    fn record(&mut self, generation: u64, rid: &RequestId, now: Instant) -> Option<&mut Record> {
        self.records.live((generation, rid.clone()), now)
    }

    /// `rid`'s live record, unless it is a released claim (which the scripts treat as no
    /// record; only deduct.lua reads its epoch).
    fn claim_record(
        &mut self,
        generation: u64,
        rid: &RequestId,
        now: Instant,
    ) -> Option<&mut Record> {
        self.record(generation, rid, now)
            .filter(|r| r.status != Status::Released)
    }

    fn insert_record(&mut self, generation: u64, rid: &RequestId, rec: Record, now: Instant) {
        self.inserts += 1;
        if self.inserts >= SWEEP_EVERY.max(self.restocks.len() / 2) {
            self.inserts = 0;
            self.restocks.retain(|_, (_, e)| *e > now);
        }
        self.records.insert((generation, rid.clone()), rec, now);
    }

    fn sell(&mut self, n: u64) {
        self.counters.stock -= n;
        self.counters.sold += n;
    }

    /// Takes `n` units for a sale, or holds them as a reservation on `rid`'s record (which
    /// then outlives the reservation by the request TTL `ttl_ms`, as `hold` in prelude.lua).
    fn take_stock(
        &mut self,
        generation: u64,
        rid: &RequestId,
        n: u64,
        req: &ReqArgs<'_>,
        now: Instant,
    ) {
        if req.resv_ttl_ms == 0 {
            return self.sell(n);
        }
        self.counters.stock -= n;
        self.counters.reserved += n;
        let exp = now + ms(req.resv_ttl_ms);
        if let Some(rec) = self.records.get_mut(&(generation, rid.clone())) {
            rec.reservation = Some(ResvState::Reserved);
            rec.reserved_units = n;
            rec.expires = rec.expires.max(exp + ms(req.ttl_ms));
        }
        self.reservations.insert((exp, generation, rid.clone()));
    }

    /// Drops `rid` from the claim index.
    fn drop_claim(&mut self, generation: u64, rid: &RequestId) {
        self.claims
            .retain(|(_, g, r)| !(*g == generation && r == rid));
    }

    /// Drops `rid` from the reservation index.
    fn drop_reservation(&mut self, generation: u64, rid: &RequestId) {
        self.reservations
            .retain(|(_, g, r)| !(*g == generation && r == rid));
    }

    /// Returns expired reservations to stock (`reclaim` in prelude.lua); units returned.
    pub(super) fn reclaim(&mut self, now: Instant) -> u64 {
        let mut back = 0;
        while let Some(first) = self.reservations.first().cloned() {
            if first.0 > now {
                break;
            }
            self.reservations.remove(&first);
            let (_, generation, rid) = first;
            if let Some(rec) = self.records.get_mut(&(generation, rid))
                && rec.reservation == Some(ResvState::Reserved)
            {
                rec.reservation = Some(ResvState::Expired);
                self.counters.reserved -= rec.reserved_units;
                self.counters.stock += rec.reserved_units;
                back += rec.reserved_units;
            }
        }
        back
    }

    /// deduct.lua
    pub(super) fn deduct_home(
        &mut self,
        seg: SegAddr<'_>,
        req: &ReqArgs<'_>,
        on_short: OnShort,
        now: Instant,
    ) -> HomeReply {
        self.reclaim(now);
        let mut past = 0;
        if let Some(rec) = self.record(seg.generation, req.request_id, now) {
            if rec.status == Status::Released {
                // The id is free; a new claim continues above the released one's epoch.
                past = rec.epoch;
            } else if let Some(f) = rec.mismatch(req) {
                return HomeReply::Mismatch(f);
            } else {
                return match rec.status {
                    Status::Applied => HomeReply::Replay(rec.parts.to_vec()),
                    Status::Sealed => HomeReply::Sealed,
                    _ => HomeReply::Pending {
                        epoch: rec.epoch,
                        lease_left_ms: left_ms(rec.lease_until, now),
                    },
                };
            }
        }
        let stock = self.counters.stock;
        let base = Record::new(Status::Applied, req, 0, now);
        if stock >= req.qty {
            let parts = Parts::One(Part {
                segment: seg.index,
                units: req.qty,
            });
            let rec = Record { parts, ..base };
            self.insert_record(seg.generation, req.request_id, rec, now);
            self.take_stock(seg.generation, req.request_id, req.qty, req, now);
            return HomeReply::Applied {
                stock_after: stock - req.qty,
            };
        }
        let claimed = (on_short == OnShort::Claim).then_some(past + 1);
        if let Some(epoch) = claimed {
            let lease_until = now + ms(req.lease_ms);
            let rec = Record {
                status: Status::Pending,
                epoch,
                lease_until,
                ..base
            };
            self.insert_record(seg.generation, req.request_id, rec, now);
            self.claims
                .insert((lease_until, seg.generation, req.request_id.clone()));
        }
        HomeReply::Short { stock, claimed }
    }

    /// take.lua
    pub(super) fn take(
        &mut self,
        generation: u64,
        req: &ReqArgs<'_>,
        part: u64,
        epoch: u64,
        role: SegmentRole,
        now: Instant,
    ) -> TakeReply {
        self.reclaim(now);
        let stock = self.counters.stock;
        let is_home = role == SegmentRole::Home;
        let mut rec = self.claim_record(generation, req.request_id, now);
        if let Some(r) = &rec
            && let Some(f) = r.mismatch(req)
        {
            // take.lua: away from home, what an ended request under this id left (refunded
            // part or shut-out marker) is treated as absent; a live part conflicts.
            if is_home || r.status == Status::Applied {
                return TakeReply::Mismatch(f);
            }
            rec = None;
        }
        if is_home {
            let Some(rec) = rec.filter(|r| r.status == Status::Pending && r.epoch == epoch) else {
                return TakeReply::Superseded;
            };
            if rec.home_part > 0 {
                return TakeReply::Taken {
                    stock_after: stock,
                    part: rec.home_part,
                };
            }
            if stock < part {
                return TakeReply::Short { stock };
            }
            rec.home_part = part;
            self.take_stock(generation, req.request_id, part, req, now);
            return TakeReply::Taken {
                stock_after: stock - part,
                part,
            };
        }
        if let Some(rec) = rec {
            if rec.status == Status::Applied {
                return if rec.epoch == epoch {
                    TakeReply::Taken {
                        stock_after: stock,
                        part: rec.part,
                    }
                } else {
                    TakeReply::Superseded
                };
            }
            if rec.epoch > epoch {
                return TakeReply::Superseded;
            }
        }
        if stock < part {
            return TakeReply::Short { stock };
        }
        let rec = Record {
            part,
            ..Record::new(Status::Applied, req, epoch, now)
        };
        self.insert_record(generation, req.request_id, rec, now);
        self.take_stock(generation, req.request_id, part, req, now);
        TakeReply::Taken {
            stock_after: stock - part,
            part,
        }
    }

    /// settle.lua
    pub(super) fn settle(
        &mut self,
        generation: u64,
        req: &ReqArgs<'_>,
        epoch: u64,
        how: SettleAs<'_>,
        now: Instant,
    ) -> SettleReply {
        let Some(rec) = self.claim_record(generation, req.request_id, now) else {
            return SettleReply::Gone;
        };
        if rec.status != Status::Pending || rec.epoch != epoch {
            return if rec.status == Status::Applied {
                SettleReply::Applied(rec.parts.to_vec())
            } else {
                SettleReply::Superseded
            };
        }
        match how {
            SettleAs::Applied(p) => {
                rec.status = Status::Applied;
                rec.parts = Parts::from_slice(p);
                rec.home_part = 0;
                rec.expires = rec.expires.max(now + ms(req.ttl_ms));
            }
            SettleAs::Seal => {
                rec.status = Status::Sealed;
                rec.home_part = 0;
                rec.expires = rec.expires.max(now + ms(req.ttl_ms));
            }
            SettleAs::Release => {
                // Only the epoch stays (with u, q, k), as settle.lua's 'F' record.
                rec.status = Status::Released;
                rec.home_part = 0;
                rec.lease_until = now;
                rec.reservation = None;
                rec.reserved_units = 0;
                rec.expires = rec.expires.max(now + ms(req.ttl_ms));
            }
        }
        self.drop_claim(generation, req.request_id);
        SettleReply::Ok
    }

    /// refund.lua
    pub(super) fn refund(
        &mut self,
        generation: u64,
        req: &ReqArgs<'_>,
        epoch: u64,
        role: SegmentRole,
        now: Instant,
    ) -> u64 {
        let Some(rec) = self.claim_record(generation, req.request_id, now) else {
            return 0;
        };
        let units = if role == SegmentRole::Home {
            if rec.status == Status::Pending && rec.epoch == epoch {
                std::mem::take(&mut rec.home_part)
            } else {
                0
            }
        } else if rec.status == Status::Applied && rec.epoch <= epoch {
            rec.status = Status::Refunded;
            rec.epoch = epoch;
            std::mem::take(&mut rec.part)
        } else {
            0
        };
        match rec.reservation {
            Some(ResvState::Reserved) if units > 0 => {
                rec.reservation = Some(ResvState::Cancelled);
                self.counters.reserved -= units;
                self.counters.stock += units;
                self.drop_reservation(generation, req.request_id);
                units
            }
            Some(ResvState::Reserved) => 0,
            Some(ResvState::Expired | ResvState::Cancelled) => 0,
            _ => {
                self.counters.stock += units;
                self.counters.sold -= units;
                units
            }
        }
    }

    /// shut_out.lua
    pub(super) fn shut_out(
        &mut self,
        generation: u64,
        req: &ReqArgs<'_>,
        epoch: u64,
        now: Instant,
    ) -> ShutOutReply {
        if let Some(rec) = self
            .record(generation, req.request_id, now)
            .filter(|r| r.status == Status::Applied || r.mismatch(req).is_none())
        {
            if let Some(f) = rec.mismatch(req) {
                return ShutOutReply::Mismatch(f);
            }
            if rec.epoch > epoch {
                return ShutOutReply::Superseded;
            }
            if rec.status == Status::Applied {
                rec.epoch = epoch;
                return ShutOutReply::Applied { part: rec.part };
            }
        }
        let rec = Record::new(Status::ShutOut, req, epoch, now);
        self.insert_record(generation, req.request_id, rec, now);
        ShutOutReply::Clear
    }

    /// takeover.lua
    pub(super) fn takeover(
        &mut self,
        generation: u64,
        req: &ReqArgs<'_>,
        now: Instant,
    ) -> TakeoverReply {
        let Some(rec) = self.claim_record(generation, req.request_id, now) else {
            return TakeoverReply::Gone;
        };
        if let Some(f) = rec.mismatch(req) {
            return TakeoverReply::Mismatch(f);
        }
        if rec.status == Status::Applied {
            return TakeoverReply::Replay(rec.parts.to_vec());
        }
        if rec.status == Status::Sealed {
            return TakeoverReply::Sealed;
        }
        if rec.lease_until > now {
            return TakeoverReply::Pending {
                epoch: rec.epoch,
                lease_left_ms: left_ms(rec.lease_until, now),
            };
        }
        rec.epoch += 1;
        rec.lease_until = now + ms(req.lease_ms);
        let won = TakeoverReply::Won {
            epoch: rec.epoch,
            home_part: rec.home_part,
        };
        let lease_until = rec.lease_until;
        self.drop_claim(generation, req.request_id);
        self.claims
            .insert((lease_until, generation, req.request_id.clone()));
        won
    }

    /// restock.lua
    pub(super) fn restock(
        &mut self,
        generation: u64,
        request_id: &RequestId,
        qty: u64,
        total: u64,
        ttl_ms: u64,
        now: Instant,
    ) -> Result<RestockReply> {
        let key = (generation, request_id.clone());
        if let Some((q, exp)) = self.restocks.get(&key)
            && *exp > now
        {
            return Ok(if *q == (qty, total) {
                RestockReply::Replay {
                    stock: self.counters.stock,
                }
            } else {
                RestockReply::Mismatch
            });
        }
        let limit = 1_000_000_000_000_000;
        if self.counters.stock + qty >= limit || self.counters.restocked + qty >= limit {
            return Err(crate::Error::invalid(
                "qty",
                "segment would exceed 10^15 units",
            ));
        }
        self.counters.stock += qty;
        self.counters.restocked += qty;
        self.restocks.insert(key, ((qty, total), now + ms(ttl_ms)));
        Ok(RestockReply::Restocked {
            stock_after: self.counters.stock,
        })
    }

    /// reserve_end.lua
    pub(super) fn reserve_end(
        &mut self,
        generation: u64,
        request_id: &RequestId,
        action: ReservationAction,
        now: Instant,
    ) -> ReserveEnd {
        self.reclaim(now);
        let Some(rec) = self.record(generation, request_id, now) else {
            return ReserveEnd::Unknown;
        };
        let Some(state) = rec.reservation else {
            return ReserveEnd::Unknown;
        };
        let (user, units) = (rec.user.to_string(), rec.reserved_units);
        let want = match action {
            ReservationAction::Confirm => ResvState::Confirmed,
            ReservationAction::Cancel => ResvState::Cancelled,
            ReservationAction::Inspect => return ReserveEnd::Ended { state, user, units },
        };
        if state == want {
            return ReserveEnd::Done { state, user, units };
        }
        if state != ResvState::Reserved {
            return ReserveEnd::Ended { state, user, units };
        }
        rec.reservation = Some(want);
        self.counters.reserved -= units;
        if want == ResvState::Confirmed {
            self.counters.sold += units;
        } else {
            self.counters.stock += units;
        }
        self.drop_reservation(generation, request_id);
        ReserveEnd::Done {
            state: want,
            user,
            units,
        }
    }

    /// seal.lua
    pub(super) fn seal(&mut self, generation: u64, req: &ReqArgs<'_>, now: Instant) -> SealReply {
        if let Some(rec) = self.claim_record(generation, req.request_id, now) {
            if let Some(f) = rec.mismatch(req) {
                return SealReply::Mismatch(f);
            }
            return match rec.status {
                Status::Applied => SealReply::Applied,
                Status::Sealed => SealReply::Sealed,
                _ => SealReply::Pending {
                    lease_left_ms: left_ms(rec.lease_until, now),
                },
            };
        }
        let rec = Record::new(Status::Sealed, req, 0, now);
        self.insert_record(generation, req.request_id, rec, now);
        SealReply::Sealed
    }

    /// The record as [`crate::store::Store::record`] reads it.
    pub(super) fn home_record(
        &mut self,
        generation: u64,
        request_id: &RequestId,
        now: Instant,
    ) -> Option<HomeRecord> {
        self.claim_record(generation, request_id, now)
            .map(|r| HomeRecord {
                user: r.user.to_string(),
                qty: r.qty,
                kind: r.kind,
                state: match r.status {
                    Status::Applied => RecordState::Applied(r.parts.to_vec()),
                    Status::Sealed => RecordState::Sealed,
                    _ => RecordState::Pending { epoch: r.epoch },
                },
            })
    }

    /// claims_due.lua
    pub(super) fn claims_due(
        &mut self,
        generation: u64,
        max: usize,
        grace_ms: u64,
        now: Instant,
    ) -> Vec<DueClaim> {
        let due: Vec<(Instant, u64, RequestId)> = self
            .claims
            .iter()
            .filter(|(until, g, _)| *until + ms(grace_ms) <= now && *g == generation)
            .take(max.clamp(1, 1000))
            .cloned()
            .collect();
        let mut out = Vec::new();
        for key in due {
            let (_, generation, rid) = &key;
            match self.record(*generation, rid, now) {
                Some(rec) if rec.status == Status::Pending => out.push(DueClaim {
                    request_id: rid.clone(),
                    user: rec.user.clone(),
                    qty: rec.qty,
                    kind: rec.kind,
                }),
                _ => {
                    self.claims.remove(&key);
                }
            }
        }
        out
    }

    /// held.lua
    pub(super) fn held(&mut self) -> HeldState {
        let mut h = HeldState {
            state: self.counters,
            ..HeldState::default()
        };
        let index: Vec<(u64, RequestId)> = self
            .reservations
            .iter()
            .map(|(_, g, r)| (*g, r.clone()))
            .collect();
        for key in index {
            match self.records.get_mut(&key) {
                Some(rec) if rec.reservation == Some(ResvState::Reserved) => {
                    h.held += rec.reserved_units;
                    h.live += 1;
                }
                _ => h.orphans += 1,
            }
        }
        h
    }
}
