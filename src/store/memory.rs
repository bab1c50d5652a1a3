//! `MemoryStore`: the embedded backend.
//!
//! Same observable semantics as the Lua scripts, step for step (each step mirrors one script
//! and says which), so it serves both as a legitimate single-instance store and as the oracle
//! that the differential tests compare Redis against. One `std::sync::Mutex` per segment makes
//! each step atomic, just as one script is atomic inside Redis; it is never held across an
//! `.await` (every step is synchronous).
//!
//! This file holds the maps and the locking; `segment` holds a segment's state and the steps
//! on it, `records` its request records, `users` the per-user limit.

use super::*;
use crate::placement::Placement;
use std::collections::HashMap as StdHashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod records;
mod segment;
mod users;

use segment::Segment;
use users::UserRecord;

/// Maps keyed by request, user and SKU ids hash with foldhash (seeded per process): SipHash
/// was the single largest cost of an embedded deduction.
type Hasher = foldhash::fast::RandomState;
type HashMap<K, V> = StdHashMap<K, V, Hasher>;
type DashMap<K, V> = dashmap::DashMap<K, V, Hasher>;

#[derive(Default)]
struct Inner {
    metas: DashMap<Sku, Meta>,
    /// Segments by SKU, then index: looked up by `&Sku` without cloning the id.
    segments: DashMap<Sku, HashMap<u32, Arc<Mutex<Segment>>>>,
    users: DashMap<(Sku, u64, UserId), UserRecord>,
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

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` on the segment when it exists with generation `seg.generation`, else returns
    /// `stale` (the scripts' `{"stale", ...}`).
    fn with_segment<T>(
        &self,
        seg: SegAddr<'_>,
        stale: T,
        f: impl FnOnce(&mut Segment, Instant) -> T,
    ) -> T {
        let Some(s) = self
            .inner
            .segments
            .get(seg.sku)
            .and_then(|m| m.get(&seg.index).map(Arc::clone))
        else {
            return stale;
        };
        let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
        if s.generation != seg.generation {
            return stale;
        }
        f(&mut s, Instant::now())
    }

    /// Runs `f` on the segment's mutex whatever generation its counters hold (creating an
    /// empty slot when missing): for the scripts that touch only request records or indexes,
    /// which carry their own generation.
    fn with_records<T>(&self, seg: SegAddr<'_>, f: impl FnOnce(&mut Segment, Instant) -> T) -> T {
        let found = self
            .inner
            .segments
            .get(seg.sku)
            .and_then(|m| m.get(&seg.index).map(Arc::clone));
        let s = found.unwrap_or_else(|| {
            let mut m = self.inner.segments.entry(seg.sku.clone()).or_default();
            Arc::clone(m.entry(seg.index).or_default())
        });
        let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut s, Instant::now())
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

    // load_begin.lua
    async fn load_begin(&self, sku: &Sku, spec: LoadSpec) -> Result<LoadBegin> {
        if spec.outbox {
            return Err(crate::error::Error::Config(
                "the outbox needs a Redis store: its events are Redis streams".into(),
            ));
        }
        let mut e = self.inner.metas.entry(sku.clone());
        use dashmap::Entry;
        let prev = match &mut e {
            Entry::Occupied(o) => Some(o.get().clone()),
            Entry::Vacant(_) => None,
        };
        if let Some(p) = &prev
            && spec.if_loaded == IfLoaded::Refuse
        {
            return Ok(LoadBegin::Exists {
                generation: p.generation,
            });
        }
        let generation = next_generation(prev.as_ref().map_or(0, |p| p.generation));
        e.insert_entry(Meta {
            generation,
            segments: spec.segments,
            loaded: spec.total,
            ready: false,
            user_limit: spec.user_limit,
            // One process, no slots: nothing to place.
            placement: Placement::unplaced(),
            outbox_segments: 0,
        });
        Ok(LoadBegin::Started {
            generation,
            old_segments: prev.as_ref().map_or(0, |p| p.segments),
            old_generation: prev.as_ref().map_or(0, |p| p.generation),
            placement: Placement::unplaced(),
        })
    }

    // load_segment.lua
    async fn load_segment(&self, seg: SegAddr<'_>, load: SegmentLoad) -> Result<bool> {
        let units = load.units;
        Ok(self.with_records(seg, |s, _| {
            if s.generation > seg.generation {
                return false;
            }
            *s = Segment::loaded(seg.generation, units);
            true
        }))
    }

    // drop_segment.lua
    async fn drop_segment(&self, seg: SegAddr<'_>, _replaces: u64) -> Result<()> {
        if let Some(mut m) = self.inner.segments.get_mut(seg.sku)
            && m.get(&seg.index).is_some_and(|s| {
                s.lock().unwrap_or_else(|p| p.into_inner()).generation < seg.generation
            })
        {
            m.remove(&seg.index);
        }
        Ok(())
    }

    // load_commit.lua
    async fn load_commit(&self, sku: &Sku, generation: u64) -> Result<bool> {
        Ok(match self.inner.metas.get_mut(sku) {
            Some(mut m) if m.generation == generation => {
                m.ready = true;
                true
            }
            _ => false,
        })
    }

    async fn meta(&self, sku: &Sku) -> Result<Option<Meta>> {
        Ok(self.inner.metas.get(sku).map(|m| m.clone()))
    }

    async fn deduct_home(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        on_short: OnShort,
    ) -> Result<HomeReply> {
        Ok(self.with_segment(seg, HomeReply::Stale, |s, now| {
            s.deduct_home(seg, &req, on_short, now)
        }))
    }

    async fn take(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        part: u64,
        epoch: u64,
        role: SegmentRole,
    ) -> Result<TakeReply> {
        Ok(self.with_segment(seg, TakeReply::Stale, |s, now| {
            s.take(seg.generation, &req, part, epoch, role, now)
        }))
    }

    async fn settle(
        &self,
        home: SegAddr<'_>,
        req: ReqArgs<'_>,
        epoch: u64,
        how: SettleAs<'_>,
    ) -> Result<SettleReply> {
        Ok(self.with_records(home, |s, now| {
            s.settle(home.generation, &req, epoch, how, now)
        }))
    }

    async fn refund(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        epoch: u64,
        role: SegmentRole,
    ) -> Result<u64> {
        Ok(self.with_segment(seg, 0, |s, now| {
            s.refund(seg.generation, &req, epoch, role, now)
        }))
    }

    async fn shut_out(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        epoch: u64,
    ) -> Result<ShutOutReply> {
        Ok(self.with_records(seg, |s, now| s.shut_out(seg.generation, &req, epoch, now)))
    }

    async fn takeover(&self, home: SegAddr<'_>, req: ReqArgs<'_>) -> Result<TakeoverReply> {
        Ok(self.with_records(home, |s, now| s.takeover(home.generation, &req, now)))
    }

    async fn restock(
        &self,
        seg: SegAddr<'_>,
        request_id: &RequestId,
        qty: u64,
        total: u64,
        ttl_ms: u64,
    ) -> Result<RestockReply> {
        self.with_segment(seg, Ok(RestockReply::Stale), |s, now| {
            s.restock(seg.generation, request_id, qty, total, ttl_ms, now)
        })
    }

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
        Ok(rec.claim(&req, limit, claim_ttl_ms, now))
    }

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
        if how == UserFinish::Release {
            if let Some(mut rec) = self.inner.users.get_mut(&key) {
                rec.release(req.request_id, req.attempt);
            }
            return Ok(());
        }
        let mut rec = self.inner.users.entry(key).or_default();
        rec.finish(&req, how, Instant::now());
        Ok(())
    }

    async fn reserve_end(
        &self,
        seg: SegAddr<'_>,
        request_id: &RequestId,
        action: ReservationAction,
    ) -> Result<ReserveEnd> {
        Ok(self.with_segment(seg, ReserveEnd::Stale, |s, now| {
            s.reserve_end(seg.generation, request_id, action, now)
        }))
    }

    // reclaim.lua
    async fn reclaim(&self, seg: SegAddr<'_>) -> Result<(u64, u64)> {
        Ok(self.with_segment(seg, (0, 0), |s, now| {
            let back = s.reclaim(now);
            (back, s.counters.reserved)
        }))
    }

    async fn seal(&self, home: SegAddr<'_>, req: ReqArgs<'_>) -> Result<SealReply> {
        Ok(self.with_records(home, |s, now| s.seal(home.generation, &req, now)))
    }

    async fn segments(
        &self,
        sku: &Sku,
        generation: u64,
        _placement: &Placement,
        segments: u32,
    ) -> Result<Vec<Option<SegmentState>>> {
        Ok((0..segments)
            .map(|index| {
                let seg = SegAddr::new(sku, generation, index);
                self.with_segment(seg, None, |s, _| Some(s.counters))
            })
            .collect())
    }

    async fn record(
        &self,
        home: SegAddr<'_>,
        request_id: &RequestId,
    ) -> Result<Option<HomeRecord>> {
        Ok(self.with_segment(home, None, |s, now| {
            s.home_record(home.generation, request_id, now)
        }))
    }

    async fn claims_due(
        &self,
        seg: SegAddr<'_>,
        max: usize,
        grace_ms: u64,
    ) -> Result<Vec<DueClaim>> {
        Ok(self.with_records(seg, |s, now| {
            s.claims_due(seg.generation, max, grace_ms, now)
        }))
    }

    async fn held(&self, seg: SegAddr<'_>) -> Result<Option<HeldState>> {
        Ok(self.with_segment(seg, None, |s, _| Some(s.held())))
    }
}
