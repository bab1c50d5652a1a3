//! `MemoryStore`: the embedded backend.
//!
//! Same observable semantics as the Lua scripts, step for step (each method mirrors one script
//! and says which), so it serves both as a legitimate single-instance store and as the oracle
//! that the differential tests compare Redis against. One `std::sync::Mutex` per segment makes
//! each step atomic, just as one script is atomic inside Redis; it is never held across an
//! `.await` (every method body is synchronous).

use super::*;
use crate::segments::Part;
use std::collections::HashMap as StdHashMap;

/// Maps keyed by request, user and SKU ids hash with foldhash (seeded per process): SipHash
/// was the single largest cost of an embedded deduction.
type Hasher = foldhash::fast::RandomState;
type HashMap<K, V> = StdHashMap<K, V, Hasher>;
type DashMap<K, V> = dashmap::DashMap<K, V, Hasher>;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Fewest record inserts between sweeps of expired records in one segment. A sweep scans
/// every record (of one sub-map), so sweeps are also spaced by half the records held: the scan
/// stays O(1) amortised per insert however many records live (24 h of them by default).
const SWEEP_EVERY: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Applied,
    Pending,
    Fence,
    Refunded,
    Sealed,
}

#[derive(Debug, Clone)]
struct Rec {
    s: St,
    user: UserId,
    qty: u64,
    epoch: u64,
    part: u64,
    home_part: u64,
    lease_until: Instant,
    parts: Vec<Part>,
    expires: Instant,
    /// Reservation state of the units this record holds (`None`: sold or none).
    rs: Option<ResvState>,
    /// Units the reservation holds.
    rq: u64,
    /// Sale or reservation.
    kind: RequestKind,
}

impl Rec {
    /// A record of state `s` for `req` at `epoch`, living the request TTL.
    fn new(s: St, req: &ReqArgs<'_>, epoch: u64, now: Instant) -> Self {
        Self {
            s,
            user: req.user.clone(),
            qty: req.qty,
            epoch,
            part: 0,
            home_part: 0,
            lease_until: now,
            parts: Vec::new(),
            expires: now + ms(req.ttl_ms),
            rs: None,
            rq: 0,
            kind: req.kind,
        }
    }
}

/// Sub-maps of one segment's request records. A hash map grows by doubling, moving every
/// entry while the segment's mutex is held: one map of 2M records stalled a segment for
/// ~1 s. Split 64 ways, each doubling moves 1/64 of the records; each sub-map is also swept
/// on its own.
const RECORD_SHARDS: usize = 64;

type RecKey = (u64, RequestId);

/// A segment's request records (generation, request id) → record, with lazy expiry.
#[derive(Debug)]
struct Records {
    hasher: Hasher,
    shards: Vec<HashMap<RecKey, Rec>>,
    inserts: Vec<usize>,
}

impl Default for Records {
    fn default() -> Self {
        Self {
            hasher: Hasher::default(),
            shards: (0..RECORD_SHARDS).map(|_| HashMap::default()).collect(),
            inserts: vec![0; RECORD_SHARDS],
        }
    }
}

impl Records {
    fn shard(&self, key: &RecKey) -> usize {
        use std::hash::BuildHasher;
        (self.hasher.hash_one(key) >> 58) as usize % RECORD_SHARDS
    }

    fn get_mut(&mut self, key: &RecKey) -> Option<&mut Rec> {
        let i = self.shard(key);
        self.shards[i].get_mut(key)
    }

    fn remove(&mut self, key: &RecKey) -> Option<Rec> {
        let i = self.shard(key);
        self.shards[i].remove(key)
    }

    /// Inserts, first sweeping expired records out of the sub-map now and then: sweeps are
    /// spaced by at least SWEEP_EVERY / RECORD_SHARDS inserts and by half the sub-map, so the
    /// scan stays O(1) amortised per insert.
    fn insert(&mut self, key: RecKey, rec: Rec, now: Instant) {
        let i = self.shard(&key);
        self.inserts[i] += 1;
        if self.inserts[i] >= (SWEEP_EVERY / RECORD_SHARDS).max(self.shards[i].len() / 2) {
            self.inserts[i] = 0;
            self.shards[i].retain(|_, r| r.expires > now);
        }
        self.shards[i].insert(key, rec);
    }
}

#[derive(Debug, Default)]
struct Seg {
    generation: u64,
    st: SegmentState,
    requests: Records,
    restocks: HashMap<(u64, RequestId), ((u64, u64), Instant)>,
    inserts: usize,
    /// Reservation index: (expiry, generation, request id) of records holding reserved units.
    resv: std::collections::BTreeSet<(Instant, u64, RequestId)>,
    /// Claim index: (lease end, generation, request id) of pending fallback claims.
    claims: std::collections::BTreeSet<(Instant, u64, RequestId)>,
}

impl Seg {
    fn rec(&mut self, generation: u64, rid: &RequestId, now: Instant) -> Option<&mut Rec> {
        let key = (generation, rid.clone());
        if self
            .requests
            .get_mut(&key)
            .is_some_and(|r| r.expires <= now)
        {
            self.requests.remove(&key);
        }
        self.requests.get_mut(&key)
    }

    fn put(&mut self, generation: u64, rid: &RequestId, rec: Rec, now: Instant) {
        self.inserts += 1;
        if self.inserts >= SWEEP_EVERY.max(self.restocks.len() / 2) {
            self.inserts = 0;
            self.restocks.retain(|_, (_, e)| *e > now);
        }
        self.requests.insert((generation, rid.clone()), rec, now);
    }

    fn take_units(&mut self, n: u64) {
        self.st.stock -= n;
        self.st.sold += n;
    }

    /// Takes `n` units for a sale, or holds them as a reservation on `rid`'s record (which
    /// then outlives the reservation by the request TTL `ttl_ms`, as `hold` in prelude.lua).
    fn apply(&mut self, generation: u64, rid: &RequestId, n: u64, req: &ReqArgs<'_>, now: Instant) {
        if req.resv_ttl_ms == 0 {
            return self.take_units(n);
        }
        self.st.stock -= n;
        self.st.reserved += n;
        let exp = now + ms(req.resv_ttl_ms);
        if let Some(rec) = self.requests.get_mut(&(generation, rid.clone())) {
            rec.rs = Some(ResvState::Reserved);
            rec.rq = n;
            rec.expires = rec.expires.max(exp + ms(req.ttl_ms));
        }
        self.resv.insert((exp, generation, rid.clone()));
    }

    /// Drops `rid` from the claim index.
    fn unclaim(&mut self, generation: u64, rid: &RequestId) {
        self.claims
            .retain(|(_, g, r)| !(*g == generation && r == rid));
    }

    /// Returns expired reservations to stock (reclaim in the Lua prelude); units returned.
    fn reclaim(&mut self, now: Instant) -> u64 {
        let mut back = 0;
        while let Some(first) = self.resv.first().cloned() {
            if first.0 > now {
                break;
            }
            self.resv.remove(&first);
            let (_, generation, rid) = first;
            if let Some(rec) = self.requests.get_mut(&(generation, rid))
                && rec.rs == Some(ResvState::Reserved)
            {
                rec.rs = Some(ResvState::Expired);
                self.st.reserved -= rec.rq;
                self.st.stock += rec.rq;
                back += rec.rq;
            }
        }
        back
    }
}

#[derive(Debug, Clone, Copy)]
struct MetaMem {
    meta: Meta,
}

/// One counted request of a user (an entry of user_claim.lua's user record).
#[derive(Debug, Clone, Copy)]
struct UserEntry {
    qty: u64,
    state: UserKind,
    /// Pending: when it may be verified.
    until: Instant,
    kind: RequestKind,
}

/// A user's counted requests by request id.
type UserRec = HashMap<RequestId, UserEntry>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UserKind {
    Pending,
    Reserved,
    Sold,
}

#[derive(Default)]
struct Inner {
    metas: DashMap<Sku, MetaMem>,
    segments: DashMap<(Sku, u32), Arc<Mutex<Seg>>>,
    users: DashMap<(Sku, u64, UserId), UserRec>,
}

/// The embedded store. Cheap to clone (shared state).
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("skus", &self.inner.metas.len())
            .finish()
    }
}

fn ms(d: u64) -> Duration {
    Duration::from_millis(d)
}

fn left_ms(until: Instant, now: Instant) -> u64 {
    until.saturating_duration_since(now).as_millis() as u64
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn seg(&self, sku: &Sku, index: u32) -> Option<Arc<Mutex<Seg>>> {
        self.inner
            .segments
            .get(&(sku.clone(), index))
            .map(|s| Arc::clone(&s))
    }

    /// Runs `f` on the segment when it exists with generation `generation`, else returns `stale`.
    fn with_seg<T>(&self, seg: SegAddr<'_>, stale: T, f: impl FnOnce(&mut Seg, Instant) -> T) -> T {
        let Some(s) = self.seg(seg.sku, seg.index) else {
            return stale;
        };
        let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
        if s.generation != seg.generation {
            return stale;
        }
        f(&mut s, Instant::now())
    }

    /// Runs `f` on the segment's mutex without a generation check (records only).
    fn with_any<T>(&self, seg: SegAddr<'_>, f: impl FnOnce(&mut Seg, Instant) -> T) -> T {
        let s = self
            .inner
            .segments
            .entry((seg.sku.clone(), seg.index))
            .or_default()
            .clone();
        let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut s, Instant::now())
    }
}

fn mismatch(rec: &Rec, req: &ReqArgs<'_>) -> Option<&'static str> {
    if &rec.user != req.user {
        Some("user")
    } else if rec.qty != req.qty {
        Some("qty")
    } else if rec.kind != req.kind {
        Some("kind")
    } else {
        None
    }
}

/// A fresh generation: the previous one + 1, but at least the clock in ms (load_begin.lua).
fn next_generation(prev: u64) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    (prev + 1).max(now)
}

impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn load_begin(
        &self,
        sku: &Sku,
        segments: u32,
        total: u64,
        replace: bool,
        user_limit: u64,
    ) -> Result<LoadBegin> {
        let mut e = self.inner.metas.entry(sku.clone());
        use dashmap::Entry;
        let prev = match &mut e {
            Entry::Occupied(o) => Some(o.get().meta),
            Entry::Vacant(_) => None,
        };
        if let Some(p) = prev
            && !replace
        {
            return Ok(LoadBegin::Exists {
                generation: p.generation,
            });
        }
        let generation = next_generation(prev.map_or(0, |p| p.generation));
        let meta = Meta {
            generation,
            segments,
            loaded: total,
            ready: false,
            user_limit,
        };
        e.insert_entry(MetaMem { meta });
        Ok(LoadBegin::Started {
            generation,
            old_segments: prev.map_or(0, |p| p.segments),
        })
    }

    // load_segment.lua
    async fn load_segment(&self, seg: SegAddr<'_>, units: u64) -> Result<bool> {
        Ok(self.with_any(seg, |s, _| {
            if s.generation > seg.generation {
                return false;
            }
            *s = Seg {
                generation: seg.generation,
                st: SegmentState {
                    stock: units,
                    loaded: units,
                    ..SegmentState::default()
                },
                ..Seg::default()
            };
            true
        }))
    }

    // drop_segment.lua
    async fn drop_segment(&self, seg: SegAddr<'_>) -> Result<()> {
        self.inner
            .segments
            .remove_if(&(seg.sku.clone(), seg.index), |_, s| {
                s.lock().unwrap_or_else(|p| p.into_inner()).generation < seg.generation
            });
        Ok(())
    }

    async fn load_commit(&self, sku: &Sku, generation: u64) -> Result<bool> {
        Ok(match self.inner.metas.get_mut(sku) {
            Some(mut m) if m.meta.generation == generation => {
                m.meta.ready = true;
                true
            }
            _ => false,
        })
    }

    async fn meta(&self, sku: &Sku) -> Result<Option<Meta>> {
        Ok(self.inner.metas.get(sku).map(|m| m.meta))
    }

    // deduct.lua
    async fn deduct_home(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        claim: bool,
    ) -> Result<HomeReply> {
        Ok(self.with_seg(seg, HomeReply::Stale, |s, now| {
            s.reclaim(now);
            if let Some(rec) = s.rec(seg.generation, req.request_id, now) {
                if let Some(f) = mismatch(rec, &req) {
                    return HomeReply::Mismatch(f);
                }
                return match rec.s {
                    St::Applied => HomeReply::Replay(rec.parts.clone()),
                    St::Sealed => HomeReply::Sealed,
                    _ => HomeReply::Pending {
                        epoch: rec.epoch,
                        lease_left_ms: left_ms(rec.lease_until, now),
                    },
                };
            }
            let stock = s.st.stock;
            let base = Rec::new(St::Applied, &req, 0, now);
            if stock >= req.qty {
                let parts = vec![Part {
                    segment: seg.index,
                    units: req.qty,
                }];
                s.put(seg.generation, req.request_id, Rec { parts, ..base }, now);
                s.apply(seg.generation, req.request_id, req.qty, &req, now);
                return HomeReply::Applied {
                    stock_after: stock - req.qty,
                };
            }
            if claim {
                let lease_until = now + ms(req.lease_ms);
                let rec = Rec {
                    s: St::Pending,
                    epoch: 1,
                    lease_until,
                    ..base
                };
                s.put(seg.generation, req.request_id, rec, now);
                s.claims
                    .insert((lease_until, seg.generation, req.request_id.clone()));
            }
            HomeReply::Short {
                stock,
                claimed: claim,
            }
        }))
    }

    // take.lua
    async fn take(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        part: u64,
        epoch: u64,
        is_home: bool,
    ) -> Result<TakeReply> {
        Ok(self.with_seg(seg, TakeReply::Stale, |s, now| {
            s.reclaim(now);
            let stock = s.st.stock;
            let mut rec = s.rec(seg.generation, req.request_id, now);
            if let Some(r) = &rec
                && let Some(f) = mismatch(r, &req)
            {
                // take.lua: away from home, what an ended request under this id left (refunded
                // or fence record) is treated as absent; a live part conflicts.
                if is_home || r.s == St::Applied {
                    return TakeReply::Mismatch(f);
                }
                rec = None;
            }
            if is_home {
                let Some(rec) = rec.filter(|r| r.s == St::Pending && r.epoch == epoch) else {
                    return TakeReply::Fenced;
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
                s.apply(seg.generation, req.request_id, part, &req, now);
                return TakeReply::Taken {
                    stock_after: stock - part,
                    part,
                };
            }
            if let Some(rec) = rec {
                if rec.s == St::Applied {
                    return if rec.epoch == epoch {
                        TakeReply::Taken {
                            stock_after: stock,
                            part: rec.part,
                        }
                    } else {
                        TakeReply::Fenced
                    };
                }
                if rec.epoch > epoch {
                    return TakeReply::Fenced;
                }
            }
            if stock < part {
                return TakeReply::Short { stock };
            }
            let rec = Rec {
                part,
                ..Rec::new(St::Applied, &req, epoch, now)
            };
            s.put(seg.generation, req.request_id, rec, now);
            s.apply(seg.generation, req.request_id, part, &req, now);
            TakeReply::Taken {
                stock_after: stock - part,
                part,
            }
        }))
    }

    // settle.lua
    async fn settle(
        &self,
        home: SegAddr<'_>,
        req: ReqArgs<'_>,
        epoch: u64,
        how: SettleAs<'_>,
    ) -> Result<SettleReply> {
        Ok(self.with_any(home, |s, now| {
            let Some(rec) = s.rec(home.generation, req.request_id, now) else {
                return SettleReply::Gone;
            };
            if rec.s != St::Pending || rec.epoch != epoch {
                return if rec.s == St::Applied {
                    SettleReply::Applied(rec.parts.clone())
                } else {
                    SettleReply::Superseded
                };
            }
            match how {
                SettleAs::Applied(p) => {
                    rec.s = St::Applied;
                    rec.parts = p.to_vec();
                    rec.home_part = 0;
                    rec.expires = rec.expires.max(now + ms(req.ttl_ms));
                }
                SettleAs::Seal => {
                    rec.s = St::Sealed;
                    rec.home_part = 0;
                    rec.expires = rec.expires.max(now + ms(req.ttl_ms));
                }
                SettleAs::Release => {
                    s.requests
                        .remove(&(home.generation, req.request_id.clone()));
                }
            }
            s.unclaim(home.generation, req.request_id);
            SettleReply::Ok
        }))
    }

    // refund.lua
    async fn refund(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        epoch: u64,
        is_home: bool,
    ) -> Result<u64> {
        Ok(self.with_seg(seg, 0, |s, now| {
            let Some(rec) = s.rec(seg.generation, req.request_id, now) else {
                return 0;
            };
            let units = if is_home {
                if rec.s == St::Pending && rec.epoch == epoch {
                    std::mem::take(&mut rec.home_part)
                } else {
                    0
                }
            } else if rec.s == St::Applied && rec.epoch <= epoch {
                rec.s = St::Refunded;
                rec.epoch = epoch;
                std::mem::take(&mut rec.part)
            } else {
                0
            };
            match rec.rs {
                Some(ResvState::Reserved) if units > 0 => {
                    rec.rs = Some(ResvState::Cancelled);
                    s.st.reserved -= units;
                    s.st.stock += units;
                    s.resv
                        .retain(|(_, g, r)| !(*g == seg.generation && r == req.request_id));
                    units
                }
                Some(ResvState::Reserved) => 0,
                Some(ResvState::Expired | ResvState::Cancelled) => 0,
                _ => {
                    s.st.stock += units;
                    s.st.sold -= units;
                    units
                }
            }
        }))
    }

    // fence.lua
    async fn fence(&self, seg: SegAddr<'_>, req: ReqArgs<'_>, epoch: u64) -> Result<FenceReply> {
        Ok(self.with_any(seg, |s, now| {
            if let Some(rec) = s
                .rec(seg.generation, req.request_id, now)
                .filter(|r| r.s == St::Applied || mismatch(r, &req).is_none())
            {
                if let Some(f) = mismatch(rec, &req) {
                    return FenceReply::Mismatch(f);
                }
                if rec.epoch > epoch {
                    return FenceReply::Fenced;
                }
                if rec.s == St::Applied {
                    rec.epoch = epoch;
                    return FenceReply::Applied { part: rec.part };
                }
            }
            let rec = Rec::new(St::Fence, &req, epoch, now);
            s.put(seg.generation, req.request_id, rec, now);
            FenceReply::Clear
        }))
    }

    // takeover.lua
    async fn takeover(&self, home: SegAddr<'_>, req: ReqArgs<'_>) -> Result<TakeoverReply> {
        Ok(self.with_any(home, |s, now| {
            let Some(rec) = s.rec(home.generation, req.request_id, now) else {
                return TakeoverReply::Gone;
            };
            if let Some(f) = mismatch(rec, &req) {
                return TakeoverReply::Mismatch(f);
            }
            if rec.s == St::Applied {
                return TakeoverReply::Replay(rec.parts.clone());
            }
            if rec.s == St::Sealed {
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
            s.unclaim(home.generation, req.request_id);
            s.claims
                .insert((lease_until, home.generation, req.request_id.clone()));
            won
        }))
    }

    // restock.lua
    async fn restock(
        &self,
        seg: SegAddr<'_>,
        request_id: &RequestId,
        qty: u64,
        total: u64,
        ttl_ms: u64,
    ) -> Result<RestockReply> {
        self.with_seg(seg, Ok(RestockReply::Stale), |s, now| {
            let key = (seg.generation, request_id.clone());
            if let Some((q, exp)) = s.restocks.get(&key)
                && *exp > now
            {
                return Ok(if *q == (qty, total) {
                    RestockReply::Replay { stock: s.st.stock }
                } else {
                    RestockReply::Mismatch
                });
            }
            let limit = 1_000_000_000_000_000;
            if s.st.stock + qty >= limit || s.st.restocked + qty >= limit {
                return Err(crate::Error::invalid(
                    "qty",
                    "segment would exceed 10^15 units",
                ));
            }
            s.st.stock += qty;
            s.st.restocked += qty;
            s.restocks.insert(key, ((qty, total), now + ms(ttl_ms)));
            Ok(RestockReply::Restocked {
                stock_after: s.st.stock,
            })
        })
    }

    // user_claim.lua
    async fn user_claim(
        &self,
        sku: &Sku,
        generation: u64,
        req: ReqArgs<'_>,
        limit: u64,
        claim_ttl_ms: u64,
    ) -> Result<UserClaim> {
        let now = Instant::now();
        let mut rec = self
            .inner
            .users
            .entry((sku.clone(), generation, req.user.clone()))
            .or_default();
        if let Some(e) = rec.get(req.request_id) {
            return Ok(if e.qty != req.qty {
                UserClaim::Mismatch("qty")
            } else if e.kind != req.kind {
                UserClaim::Mismatch("kind")
            } else {
                UserClaim::Dup {
                    sold: e.state == UserKind::Sold,
                }
            });
        }
        let used: u64 = rec.values().map(|e| e.qty).sum();
        if used + req.qty > limit {
            let mut stale: Vec<StaleEntry> = rec
                .iter()
                .filter(|(_, e)| {
                    (e.state == UserKind::Pending && e.until < now) || e.state == UserKind::Reserved
                })
                .map(|(r, e)| StaleEntry {
                    request_id: r.clone(),
                    qty: e.qty,
                    reserved: e.state == UserKind::Reserved,
                    kind: e.kind,
                })
                .collect();
            stale.sort();
            let sum = |f: &dyn Fn(&UserEntry) -> bool| -> u64 {
                rec.values().filter(|e| f(e)).map(|e| e.qty).sum()
            };
            return Ok(UserClaim::Limit {
                used,
                final_used: sum(&|e| e.state == UserKind::Sold),
                fresh_pending: sum(&|e| e.state == UserKind::Pending && e.until >= now),
                stale,
            });
        }
        rec.insert(
            req.request_id.clone(),
            UserEntry {
                qty: req.qty,
                state: UserKind::Pending,
                until: now + ms(claim_ttl_ms),
                kind: req.kind,
            },
        );
        Ok(UserClaim::Ok)
    }

    // user_finish.lua
    async fn user_finish(
        &self,
        sku: &Sku,
        generation: u64,
        req: ReqArgs<'_>,
        how: UserFinish,
    ) -> Result<()> {
        let key = (sku.clone(), generation, req.user.clone());
        if how == UserFinish::Void {
            if let Some(mut rec) = self.inner.users.get_mut(&key) {
                rec.remove(req.request_id);
            }
            return Ok(());
        }
        let state = if how == UserFinish::Sold {
            UserKind::Sold
        } else {
            UserKind::Reserved
        };
        // Written even when missing (see user_finish.lua).
        self.inner.users.entry(key).or_default().insert(
            req.request_id.clone(),
            UserEntry {
                qty: req.qty,
                state,
                until: Instant::now(),
                kind: req.kind,
            },
        );
        Ok(())
    }

    // reserve_end.lua
    async fn reserve_end(
        &self,
        seg: SegAddr<'_>,
        request_id: &RequestId,
        confirm: Option<bool>,
    ) -> Result<ReserveEnd> {
        Ok(self.with_seg(seg, ReserveEnd::Stale, |s, now| {
            s.reclaim(now);
            let Some(rec) = s.rec(seg.generation, request_id, now) else {
                return ReserveEnd::Unknown;
            };
            let Some(state) = rec.rs else {
                return ReserveEnd::Unknown;
            };
            let (user, units) = (rec.user.to_string(), rec.rq);
            let Some(confirm) = confirm else {
                return ReserveEnd::Ended { state, user, units };
            };
            let want = if confirm {
                ResvState::Confirmed
            } else {
                ResvState::Cancelled
            };
            if state == want {
                return ReserveEnd::Done { state, user, units };
            }
            if state != ResvState::Reserved {
                return ReserveEnd::Ended { state, user, units };
            }
            rec.rs = Some(want);
            s.st.reserved -= units;
            if confirm {
                s.st.sold += units;
            } else {
                s.st.stock += units;
            }
            s.resv
                .retain(|(_, g, r)| !(*g == seg.generation && r == request_id));
            ReserveEnd::Done {
                state: want,
                user,
                units,
            }
        }))
    }

    // reclaim.lua
    async fn reclaim(&self, seg: SegAddr<'_>) -> Result<(u64, u64)> {
        Ok(self.with_seg(seg, (0, 0), |s, now| {
            let back = s.reclaim(now);
            (back, s.st.reserved)
        }))
    }

    // seal.lua
    async fn seal(&self, home: SegAddr<'_>, req: ReqArgs<'_>) -> Result<SealReply> {
        Ok(self.with_any(home, |s, now| {
            if let Some(rec) = s.rec(home.generation, req.request_id, now) {
                if let Some(f) = mismatch(rec, &req) {
                    return SealReply::Mismatch(f);
                }
                return match rec.s {
                    St::Applied => SealReply::Applied,
                    St::Sealed => SealReply::Sealed,
                    _ => SealReply::Pending {
                        lease_left_ms: left_ms(rec.lease_until, now),
                    },
                };
            }
            let rec = Rec::new(St::Sealed, &req, 0, now);
            s.put(home.generation, req.request_id, rec, now);
            SealReply::Sealed
        }))
    }

    async fn segments(
        &self,
        sku: &Sku,
        generation: u64,
        segments: u32,
    ) -> Result<Vec<Option<SegmentState>>> {
        Ok((0..segments)
            .map(|index| {
                let seg = SegAddr {
                    sku,
                    generation,
                    index,
                };
                self.with_seg(seg, None, |s, _| Some(s.st))
            })
            .collect())
    }

    async fn record(
        &self,
        home: SegAddr<'_>,
        request_id: &RequestId,
    ) -> Result<Option<HomeRecord>> {
        Ok(self.with_seg(home, None, |s, now| {
            s.rec(home.generation, request_id, now).map(|r| HomeRecord {
                user: r.user.to_string(),
                qty: r.qty,
                kind: r.kind,
                state: match r.s {
                    St::Applied => RecordState::Applied(r.parts.clone()),
                    St::Sealed => RecordState::Sealed,
                    _ => RecordState::Pending { epoch: r.epoch },
                },
            })
        }))
    }

    // claims_due.lua
    async fn claims_due(
        &self,
        seg: SegAddr<'_>,
        max: usize,
        grace_ms: u64,
    ) -> Result<Vec<DueClaim>> {
        Ok(self.with_any(seg, |s, now| {
            let due: Vec<(Instant, u64, RequestId)> = s
                .claims
                .iter()
                .filter(|(until, g, _)| *until + ms(grace_ms) <= now && *g == seg.generation)
                .take(max.clamp(1, 1000))
                .cloned()
                .collect();
            let mut out = Vec::new();
            for key in due {
                let (_, generation, rid) = &key;
                match s.rec(*generation, rid, now) {
                    Some(rec) if rec.s == St::Pending => out.push(DueClaim {
                        request_id: rid.clone(),
                        user: rec.user.clone(),
                        qty: rec.qty,
                        kind: rec.kind,
                    }),
                    _ => {
                        s.claims.remove(&key);
                    }
                }
            }
            out
        }))
    }

    // held.lua
    async fn held(&self, seg: SegAddr<'_>) -> Result<Option<HeldState>> {
        Ok(self.with_seg(seg, None, |s, _| {
            let mut h = HeldState {
                state: s.st,
                ..HeldState::default()
            };
            let index: Vec<(u64, RequestId)> =
                s.resv.iter().map(|(_, g, r)| (*g, r.clone())).collect();
            for key in index {
                match s.requests.get_mut(&key) {
                    Some(rec) if rec.rs == Some(ResvState::Reserved) => {
                        h.held += rec.rq;
                        h.live += 1;
                    }
                    _ => h.orphans += 1,
                }
            }
            Some(h)
        }))
    }
}
