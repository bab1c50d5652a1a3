//! `MemoryStore`: the embedded backend.
//!
//! Same observable semantics as the Lua scripts, step for step: every step is a method of
//! [`Segment`] (pure, over a logical clock and ordered maps), which also serves as the oracle of
//! the differential tests and as the steps of the model checker (`tests/it/model.rs`). One
//! `std::sync::Mutex` per segment makes each step atomic, just as one script is atomic inside
//! Redis; it is never held across an `.await` (every step is synchronous).

use super::*;
use crate::cluster::placement::Placement;
use std::collections::HashMap as StdHashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub mod segment;

pub use segment::Segment;

/// Maps keyed by SKU ids hash with foldhash (seeded per process): SipHash was the single
/// largest cost of an embedded deduction.
type Hasher = foldhash::fast::RandomState;
type HashMap<K, V> = StdHashMap<K, V, Hasher>;
type DashMap<K, V> = dashmap::DashMap<K, V, Hasher>;

struct Inner {
    metas: DashMap<Sku, Meta>,
    /// Segments by SKU, then index: looked up by `&Sku` without cloning the id.
    segments: DashMap<Sku, HashMap<u32, Arc<Mutex<Segment>>>>,
    /// Order records by order id (`order.lua`'s keys).
    orders: DashMap<crate::cart::OrderId, crate::cart::record::OrderRecord>,
    /// The store's clock: [`Segment`] steps take ms since this instant.
    born: Instant,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            metas: DashMap::default(),
            segments: DashMap::default(),
            orders: DashMap::default(),
            born: Instant::now(),
        }
    }
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

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The store's clock in ms.
    fn now(&self) -> u64 {
        self.inner.born.elapsed().as_millis() as u64
    }

    fn slot(&self, seg: SegAddr<'_>) -> Option<Arc<Mutex<Segment>>> {
        self.inner
            .segments
            .get(seg.sku)
            .and_then(|m| m.get(&seg.index).map(Arc::clone))
    }

    /// Runs `f` on the segment when it exists with generation `seg.generation`, else returns
    /// `stale` (the scripts' `{"stale", ...}`).
    fn with_segment<T>(
        &self,
        seg: SegAddr<'_>,
        stale: T,
        f: impl FnOnce(&mut Segment, u64) -> T,
    ) -> T {
        let Some(s) = self.slot(seg) else {
            return stale;
        };
        let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
        if !s.is(seg.generation) {
            return stale;
        }
        f(&mut s, self.now())
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
            home_fn: crate::segments::HOME_FN,
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
        let s = self.slot(seg).unwrap_or_else(|| {
            let mut m = self.inner.segments.entry(seg.sku.clone()).or_default();
            Arc::clone(m.entry(seg.index).or_default())
        });
        let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
        if s.generation > seg.generation {
            return Ok(false);
        }
        // The same load again (a re-sent one) writes nothing: sales since may have moved its
        // counters (load_segment.lua).
        let fresh = Segment::loaded(seg.generation, load.units, load.user_limit);
        let same = s.generation == fresh.generation
            && s.limit == fresh.limit
            && s.home_fn == fresh.home_fn
            && s.counters.loaded == fresh.counters.loaded;
        if !same {
            *s = fresh;
        }
        Ok(true)
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

    async fn skus(&self) -> Result<Vec<Sku>> {
        let mut v: Vec<Sku> = self.inner.metas.iter().map(|e| e.key().clone()).collect();
        v.sort();
        Ok(v)
    }

    async fn sell(&self, home: SegAddr<'_>, req: SellArgs<'_>) -> Result<SellReply> {
        Ok(self.with_segment(home, SellReply::Stale, |s, now| s.sell(&req, now)))
    }

    async fn transfer(&self, donor: SegAddr<'_>, t: TransferArgs) -> Result<TransferReply> {
        Ok(self.with_segment(donor, TransferReply::Stale, |s, now| s.transfer(&t, now)))
    }

    async fn transfer_done(&self, donor: SegAddr<'_>, id: TransferId) -> Result<()> {
        self.with_segment(donor, (), |s, _| s.transfer_done(id));
        Ok(())
    }

    async fn transfers_due(&self, donor: SegAddr<'_>, max: usize) -> Result<Vec<DueTransfer>> {
        Ok(self.with_segment(donor, Vec::new(), |s, now| s.transfers_due(max, now)))
    }

    async fn restock(
        &self,
        seg: SegAddr<'_>,
        request_id: &RequestId,
        qty: u64,
        total: u64,
        ttl_ms: u64,
    ) -> Result<RestockReply> {
        Ok(self.with_segment(seg, RestockReply::Stale, |s, now| {
            s.restock(request_id, qty, total, ttl_ms, now)
        }))
    }

    async fn reserve_end(
        &self,
        home: SegAddr<'_>,
        user: &UserId,
        request_id: &RequestId,
        action: ReservationAction,
    ) -> Result<ReserveEnd> {
        Ok(self.with_segment(home, ReserveEnd::Stale, |s, now| {
            s.reserve_end(user, request_id, action, now)
        }))
    }

    async fn settle(
        &self,
        home: SegAddr<'_>,
        user: &UserId,
        request_id: &RequestId,
        qty: u64,
        post: bool,
        ttl_ms: u64,
    ) -> Result<SettleReply> {
        Ok(self.with_segment(home, SettleReply::Stale, |s, now| {
            s.settle(user, request_id, qty, post, ttl_ms, now)
        }))
    }

    async fn holds_due(&self, seg: SegAddr<'_>, max: usize) -> Result<Vec<DueHold>> {
        Ok(self.with_segment(seg, Vec::new(), |s, now| s.holds_due(max, now)))
    }

    async fn order(
        &self,
        id: &crate::cart::OrderId,
        step: crate::cart::OrderStep<'_>,
        ttl_ms: u64,
    ) -> Result<crate::cart::OrderReply> {
        let now = self.now();
        // The entry's shard lock makes the step atomic, as one script is.
        let mut e = self.inner.orders.entry(id.clone());
        let mut rec = match &mut e {
            dashmap::Entry::Occupied(o) => Some(o.get().clone()),
            dashmap::Entry::Vacant(_) => None,
        };
        let r = crate::cart::record::step(&mut rec, step, now, ttl_ms);
        match (e, rec) {
            (dashmap::Entry::Occupied(mut o), Some(rec)) => {
                o.insert(rec);
            }
            (dashmap::Entry::Occupied(o), None) => {
                o.remove();
            }
            (dashmap::Entry::Vacant(v), Some(rec)) => {
                v.insert(rec);
            }
            (dashmap::Entry::Vacant(_), None) => {}
        }
        Ok(r)
    }

    async fn survey(&self, seg: SegAddr<'_>, detail: bool) -> Result<Option<Survey>> {
        Ok(self.with_segment(seg, None, |s, now| Some(s.survey(now, detail))))
    }

    async fn peek(&self, seg: SegAddr<'_>, detail: bool) -> Result<Option<Survey>> {
        Ok(self.with_segment(seg, None, |s, now| Some(s.peek(now, detail))))
    }

    async fn record(
        &self,
        home: SegAddr<'_>,
        user: &UserId,
        request_id: &RequestId,
    ) -> Result<Option<HomeRecord>> {
        Ok(self.with_segment(home, None, |s, now| s.record(user, request_id, now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Deduct, Engine, LoadOptions};

    /// A load of the generation a segment already holds (a re-sent `load_segment`) writes
    /// nothing: the units sold since stay sold, the ledgers keep their buyers.
    #[tokio::test]
    async fn a_re_sent_load_writes_nothing() {
        let e = Engine::builder()
            .per_user_limit(1)
            .build(MemoryStore::new())
            .unwrap();
        let sku = Sku::new("resent").unwrap();
        let g = e.load(&sku, 10, LoadOptions::new(1)).await.unwrap();
        for u in ["a", "b", "c"] {
            let d = Deduct::new("resent", u, 1, u).unwrap();
            assert_eq!(e.deduct(&d).await.unwrap().units_applied(), 1);
        }
        let load = SegmentLoad {
            units: 10,
            outbox: false,
            replaces: 0,
            user_limit: 1,
        };
        let at = SegAddr::new(&sku, g, 0);
        assert!(e.store().load_segment(at, load).await.unwrap());
        let a = e.audit(&sku).await.unwrap();
        assert!(a.ok && a.sold == 3 && a.remaining == 7, "{a:?}");
        let again = Deduct::new("resent", "a", 1, "a2").unwrap();
        assert_eq!(e.deduct(&again).await.unwrap().units_applied(), 0);
        // Another load that drew the same generation (other units) is written as a new one.
        let other = SegmentLoad { units: 12, ..load };
        assert!(e.store().load_segment(at, other).await.unwrap());
        let a = e.audit(&sku).await.unwrap();
        // (The audit then says the segment's units differ from the SKU's: nothing names them.)
        assert!(
            a.sold == 0 && a.remaining == 12 && a.segments[0].ok,
            "{a:?}"
        );
    }
}
