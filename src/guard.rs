//! The in-process per-user guard: a fast filter in front of the authoritative guard in Redis.
//!
//! It answers two questions without a round trip: is this user already buying this SKU *in
//! this process right now* (a double click, a client retry racing the original), and has this
//! user, as far as this process saw, already used up the per-user limit. Either way the request
//! is turned away locally; otherwise it goes on to the authoritative check in the store.
//!
//! Its memory is bounded: entries expire after `ttl` and the map holds at most `cap` entries,
//! evicting the oldest. Eviction can only make the filter *forget* — the next request of an
//! evicted user then goes to the store, which still enforces the limit exactly. So the guard
//! can never let a user exceed the limit; at worst it costs a round trip.
//!
//! A retry of a request this process already saw applied is let through (the store replays
//! it), so the filter never turns "you already bought this" into "limit reached".

use crate::ids::{RequestId, Sku, UserId};
use dashmap::DashMap;
use dashmap::mapref::entry::Entry as Slot;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// What the local guard says about an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Local {
    /// Go on to the store; call [`LocalGuard::finish`] with the outcome afterwards.
    Pass,
    /// This user already has an attempt on this SKU in flight in this process.
    InFlight,
    /// As far as this process knows, the user's units plus `qty` exceed the limit.
    LimitReached,
}

#[derive(Debug)]
struct Entry {
    /// Units this process saw the user get (sold or reserved).
    used: u64,
    /// Units the store said the user holds for good (from a "limit reached"): a floor under
    /// `used`, kept apart because it may include units `used` already counts.
    held_for_good: u64,
    /// Request ids of those units (a retry of one of them is a replay, not a new purchase).
    applied: Applied,
    /// An attempt is running in this process.
    busy: bool,
    /// Last touched.
    at: Instant,
    /// The SKU's load generation this knowledge belongs to: a reload starts a fresh ledger.
    generation: u64,
}

/// The request ids of an entry's units: almost always none or one, kept without an allocation
/// (one per buyer, on every sale under a per-user limit).
#[derive(Debug, Default)]
struct Applied {
    first: Option<RequestId>,
    more: Vec<RequestId>,
}

impl Applied {
    fn contains(&self, rid: &RequestId) -> bool {
        self.first.as_ref() == Some(rid) || self.more.contains(rid)
    }

    fn push(&mut self, rid: RequestId) {
        if self.first.is_none() {
            self.first = Some(rid);
        } else {
            self.more.push(rid);
        }
    }

    fn clear(&mut self) {
        self.first = None;
        self.more.clear();
    }
}

/// Counters of the local guard.
#[derive(Debug, Default)]
pub(crate) struct GuardStats {
    /// Attempts turned away locally (in flight or limit).
    pub(crate) hits: AtomicU64,
    /// Attempts passed on to the store.
    pub(crate) misses: AtomicU64,
    /// Entries dropped to honour the cap.
    pub(crate) evictions: AtomicU64,
    /// Entries dropped because they expired.
    pub(crate) expirations: AtomicU64,
}

/// The in-process guard. See the module docs.
#[derive(Debug)]
pub(crate) struct LocalGuard {
    /// Hashed with foldhash: every request with a per-user limit hashes its key.
    map: DashMap<(Sku, UserId), Entry, foldhash::fast::RandomState>,
    /// Entries in `map`, kept beside it: `DashMap::len` locks every shard, once per request.
    size: AtomicUsize,
    /// Held by the one thread making room.
    evicting: Mutex<()>,
    ttl: Duration,
    cap: usize,
    stats: GuardStats,
}

impl LocalGuard {
    /// A guard whose entries live `ttl` and which holds at most `cap` entries.
    pub(crate) fn new(ttl: Duration, cap: usize) -> Self {
        Self {
            map: DashMap::default(),
            size: AtomicUsize::new(0),
            evicting: Mutex::new(()),
            ttl,
            cap: cap.max(1),
            stats: GuardStats::default(),
        }
    }

    /// Entries held now (at most the cap, but for inserts racing on other threads).
    pub(crate) fn len(&self) -> usize {
        self.size.load(Relaxed)
    }

    /// Counters.
    pub(crate) fn stats(&self) -> &GuardStats {
        &self.stats
    }

    /// Checks an attempt of `qty` units against `limit` (0 = no limit) and, on `Pass`, marks
    /// the user busy until [`finish`](Self::finish).
    #[cfg(test)]
    fn begin(&self, sku: &Sku, user: &UserId, rid: &RequestId, qty: u64, limit: u64) -> Local {
        self.begin_in(0, sku, user, rid, qty, limit)
    }

    /// [`begin`](Self::begin) for load generation `generation` of the SKU: what the guard
    /// knew about an older generation is forgotten (a reload starts a fresh ledger).
    pub(crate) fn begin_in(
        &self,
        generation: u64,
        sku: &Sku,
        user: &UserId,
        rid: &RequestId,
        qty: u64,
        limit: u64,
    ) -> Local {
        let now = Instant::now();
        let key = (sku.clone(), user.clone());
        if self.len() >= self.cap && !self.map.contains_key(&key) {
            // Make room before inserting, so the map stays within its cap (concurrent inserts
            // on other threads can overshoot it by at most one entry each, momentarily).
            self.enforce_cap(self.cap - 1);
        }
        let decision = {
            let mut e = match self.map.entry(key) {
                Slot::Occupied(o) => o.into_ref(),
                Slot::Vacant(v) => {
                    self.size.fetch_add(1, Relaxed);
                    v.insert(Entry {
                        used: 0,
                        held_for_good: 0,
                        applied: Applied::default(),
                        busy: false,
                        at: now,
                        generation,
                    })
                }
            };
            if e.generation != generation {
                e.generation = generation;
                e.used = 0;
                e.held_for_good = 0;
                e.applied.clear();
            }
            if now.duration_since(e.at) >= self.ttl {
                // Expired: forget what we knew (the store still knows).
                self.stats.expirations.fetch_add(1, Relaxed);
                e.used = 0;
                e.held_for_good = 0;
                e.applied.clear();
                e.busy = false;
            }
            if e.busy {
                // Not touched: a stream of double clicks must not keep an entry alive whose
                // attempt is gone — it expires `ttl` after the attempt began.
                Local::InFlight
            } else if limit > 0
                && e.used.max(e.held_for_good) + qty > limit
                && !e.applied.contains(rid)
            {
                e.at = now;
                Local::LimitReached
            } else {
                e.at = now;
                e.busy = true;
                Local::Pass
            }
        };
        match decision {
            Local::Pass => {
                self.stats.misses.fetch_add(1, Relaxed);
            }
            _ => {
                self.stats.hits.fetch_add(1, Relaxed);
            }
        }
        decision
    }

    /// Ends an attempt that passed: `applied_units` > 0 when the store sold or reserved units
    /// for `rid` (now or in an earlier call), 0 otherwise (the chance is not used up).
    pub(crate) fn finish(&self, sku: &Sku, user: &UserId, rid: &RequestId, applied_units: u64) {
        if let Some(mut e) = self.map.get_mut(&(sku.clone(), user.clone())) {
            e.busy = false;
            e.at = Instant::now();
            if applied_units > 0 && !e.applied.contains(rid) {
                e.used += applied_units;
                e.applied.push(rid.clone());
            }
        }
    }

    /// [`begin`](Self::begin), with the busy mark owned by the returned [`Attempt`]: if the
    /// attempt is dropped before [`Attempt::finish`] (a cancelled future: a client
    /// disconnected and the server dropped its handler), the user is no longer busy.
    ///
    /// # Errors
    /// The refusal ([`Local::InFlight`] or [`Local::LimitReached`]) when not [`Local::Pass`].
    pub(crate) fn enter<'a>(
        &'a self,
        generation: u64,
        sku: &Sku,
        user: &UserId,
        rid: &RequestId,
        qty: u64,
        limit: u64,
    ) -> Result<Attempt<'a>, Local> {
        match self.begin_in(generation, sku, user, rid, qty, limit) {
            Local::Pass => Ok(Attempt {
                guard: self,
                key: Some((sku.clone(), user.clone(), rid.clone())),
            }),
            refused => Err(refused),
        }
    }

    /// Tells the guard the store answered "limit reached" with `final_units` sold for good to
    /// this user: later attempts that would pass the limit on top of those units are turned
    /// away locally until the entry expires (an attempt for fewer units still goes on).
    pub(crate) fn saturate(&self, sku: &Sku, user: &UserId, final_units: u64) {
        if let Some(mut e) = self.map.get_mut(&(sku.clone(), user.clone())) {
            e.busy = false;
            e.held_for_good = e.held_for_good.max(final_units);
        }
    }

    /// Forgets a user (e.g. after a cancelled reservation gave units back).
    pub(crate) fn forget(&self, sku: &Sku, user: &UserId) {
        if self.map.remove(&(sku.clone(), user.clone())).is_some() {
            self.size.fetch_sub(1, Relaxed);
        }
    }

    /// Drops expired entries, then the oldest idle ones, until at most `keep` remain — and a
    /// quarter of the cap more, so the two passes over the map are paid once per cap/4 inserts
    /// (amortised O(1) per insert: no sort, no key copied). One thread at a time: another that
    /// needs room meanwhile waits, then finds it made.
    fn enforce_cap(&self, keep: usize) {
        let _one = self.evicting.lock().unwrap_or_else(|p| p.into_inner());
        if self.len() <= keep {
            return;
        }
        let now = Instant::now();
        // Pass 1: the expired go; the ages of the idle ones are noted.
        let (mut expired, mut ages) = (0, Vec::with_capacity(self.len()));
        self.map.retain(|_, e| {
            if e.busy {
                true
            } else if now.duration_since(e.at) >= self.ttl {
                expired += 1;
                false
            } else {
                ages.push(e.at);
                true
            }
        });
        self.size.fetch_sub(expired, Relaxed);
        self.stats.expirations.fetch_add(expired as u64, Relaxed);
        let over = self.len().saturating_sub(keep);
        if over == 0 || ages.is_empty() {
            return;
        }
        // Pass 2: the idle ones at least as old as the `target`-th oldest go.
        let target = (over + self.cap / 4).min(ages.len());
        let (_, &mut cutoff, _) = ages.select_nth_unstable(target - 1);
        let mut evicted = 0;
        self.map.retain(|_, e| {
            let keep = e.busy || e.at > cutoff;
            evicted += usize::from(!keep);
            keep
        });
        self.size.fetch_sub(evicted, Relaxed);
        self.stats.evictions.fetch_add(evicted as u64, Relaxed);
    }
}

/// A running attempt that passed the guard (see [`LocalGuard::enter`]); dropping it unfinished
/// ends it as if nothing was bought.
#[derive(Debug)]
pub(crate) struct Attempt<'a> {
    guard: &'a LocalGuard,
    key: Option<(Sku, UserId, RequestId)>,
}

impl Attempt<'_> {
    /// Ends the attempt: `sold_units` > 0 when the store sold units for good for this request
    /// (now or earlier). Reserved units are not remembered here — a reservation may go back.
    pub(crate) fn finish(mut self, sold_units: u64) {
        if let Some((sku, user, rid)) = self.key.take() {
            self.guard.finish(&sku, &user, &rid, sold_units);
        }
    }

    /// Ends the attempt after the store answered "limit reached" with `final_units` sold for
    /// good to this user.
    pub(crate) fn saturate(mut self, final_units: u64) {
        if let Some((sku, user, _)) = self.key.take() {
            self.guard.saturate(&sku, &user, final_units);
        }
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if let Some((sku, user, rid)) = self.key.take() {
            self.guard.finish(&sku, &user, &rid, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(u: &str, r: &str) -> (Sku, UserId, RequestId) {
        (
            Sku::new("s").unwrap(),
            UserId::new(u).unwrap(),
            RequestId::new(r).unwrap(),
        )
    }

    #[test]
    fn concurrent_attempt_is_in_flight_and_limit_is_remembered() {
        let g = LocalGuard::new(Duration::from_secs(60), 100);
        let (s, u, r1) = ids("u", "r1");
        let r2 = RequestId::new("r2").unwrap();
        assert_eq!(g.begin(&s, &u, &r1, 1, 1), Local::Pass);
        assert_eq!(g.begin(&s, &u, &r2, 1, 1), Local::InFlight);
        g.finish(&s, &u, &r1, 1);
        assert_eq!(g.begin(&s, &u, &r2, 1, 1), Local::LimitReached);
        // A retry of the applied request passes (the store replays it).
        assert_eq!(g.begin(&s, &u, &r1, 1, 1), Local::Pass);
        g.finish(&s, &u, &r1, 1);
        // A failed attempt does not use up the chance.
        let (s2, u2, r3) = ids("v", "r3");
        assert_eq!(g.begin(&s2, &u2, &r3, 1, 1), Local::Pass);
        g.finish(&s2, &u2, &r3, 0);
        assert_eq!(g.begin(&s2, &u2, &r3, 1, 1), Local::Pass);
        // No limit: only the in-flight check.
        g.finish(&s2, &u2, &r3, 1);
        assert_eq!(g.begin(&s2, &u2, &r2, 5, 0), Local::Pass);
    }

    #[test]
    fn held_units_from_the_store_and_seen_sales_are_not_added_up() {
        // Found by the history checker: the store said "1 unit held for good" (a qty-2
        // refusal), then this process saw the retry of that very sale replay; the user holds
        // 1 of 2 and a 1-unit purchase must pass.
        let g = LocalGuard::new(Duration::from_secs(60), 100);
        let (s, u, r1) = ids("u", "r1");
        let (r2, r3) = (RequestId::new("r2").unwrap(), RequestId::new("r3").unwrap());
        assert_eq!(g.begin(&s, &u, &r2, 2, 2), Local::Pass);
        g.saturate(&s, &u, 1);
        assert_eq!(g.begin(&s, &u, &r1, 1, 2), Local::Pass);
        g.finish(&s, &u, &r1, 1);
        assert_eq!(g.begin(&s, &u, &r3, 1, 2), Local::Pass);
        g.finish(&s, &u, &r3, 1);
        assert_eq!(g.begin(&s, &u, &r2, 1, 2), Local::LimitReached);
    }

    #[test]
    fn a_dropped_attempt_frees_the_user_and_busy_answers_do_not_extend_the_entry() {
        use std::time::Instant;
        let ttl = Duration::from_millis(100);
        let g = LocalGuard::new(ttl, 100);
        let (s, u, r1) = ids("u", "r1");
        let a = g.enter(7, &s, &u, &r1, 1, 1).unwrap();
        drop(a);
        // The entry begins between these two instants; the checks below hold whatever the
        // scheduler does (no timed assertion: each one is made only when its premise held).
        let before = Instant::now();
        let a = g
            .enter(7, &s, &u, &r1, 1, 1)
            .expect("free again after a drop");
        let after = Instant::now();
        // A stuck attempt (never finished, never dropped) expires `ttl` after it began, however
        // many double clicks ask meanwhile.
        std::mem::forget(a);
        let mut asked = 0;
        while before.elapsed() < ttl {
            let r = g.begin_in(7, &s, &u, &r1, 1, 1);
            if before.elapsed() < ttl {
                assert_eq!(r, Local::InFlight, "younger than its ttl");
                asked += 1;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(
            (after + ttl + Duration::from_millis(20)).saturating_duration_since(Instant::now()),
        );
        assert_eq!(
            g.begin_in(7, &s, &u, &r1, 1, 1),
            Local::Pass,
            "expired after {asked} double clicks"
        );
    }

    #[test]
    fn cap_is_never_exceeded_and_busy_entries_survive() {
        let g = LocalGuard::new(Duration::from_secs(60), 1000);
        let s = Sku::new("s").unwrap();
        let busy_user = UserId::new("busy").unwrap();
        let r = RequestId::new("r").unwrap();
        assert_eq!(g.begin(&s, &busy_user, &r, 1, 1), Local::Pass);
        for i in 0..20_000 {
            let u = UserId::new(format!("u{i}")).unwrap();
            g.begin(&s, &u, &r, 1, 1);
            g.finish(&s, &u, &r, 1);
            assert!(g.len() <= 1000, "len {}", g.len());
        }
        assert!(g.stats().evictions.load(Relaxed) >= 19_000);
        assert_eq!(
            g.begin(&s, &busy_user, &r, 1, 1),
            Local::InFlight,
            "a busy entry was evicted"
        );
    }

    #[test]
    fn entries_expire() {
        let g = LocalGuard::new(Duration::from_millis(30), 10);
        let (s, u, r) = ids("u", "r");
        g.begin(&s, &u, &r, 1, 1);
        g.finish(&s, &u, &r, 1);
        let r2 = RequestId::new("r2").unwrap();
        assert_eq!(g.begin(&s, &u, &r2, 1, 1), Local::LimitReached);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(
            g.begin(&s, &u, &r2, 1, 1),
            Local::Pass,
            "expired knowledge goes to the store"
        );
    }
}
