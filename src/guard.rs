//! The in-process per-user guard: a fast filter in front of the authoritative guard in Redis.
//!
//! It answers two questions without a round trip: is this user already buying this SKU *in
//! this process right now* (a double click, a client retry racing the original), and has this
//! user, as far as this process saw, already used up the per-user limit. Either way the request
//! is turned away locally; otherwise it goes on to the authoritative check in the store.
//!
//! It is a cache, not a ledger: a fixed table of sets of [`WAYS`] entries, each (SKU, user)
//! hashed to one set, sized once from the cap. Entries expire after `ttl`; a new user whose
//! set is full takes the place of the least recently touched idle entry of that set (a busy
//! one is never taken before it expires, and when every entry of the set is busy the attempt
//! goes to the store unguarded). Forgetting can only cost a round trip — the next request of a
//! forgotten user goes to the store, which still enforces the limit exactly — so the guard can
//! never let a user exceed the limit. The table never grows, rehashes or sweeps.
//!
//! A retry of a request this process already saw applied is let through (the store replays
//! it), so the filter never turns "you already bought this" into "limit reached".
//!
//! This file holds the decisions: an attempt's check, its end, expiry and eviction. Beside it,
//! `guard/table.rs` is the storage (entries and sets, laid out by cache line) and
//! `guard/attempt.rs` the attempt as a value that frees its user when dropped. The guard
//! imports only `ids` (the keys it hashes).

mod attempt;
mod table;

use table::{Set, Slot, WAYS, tag};

use crate::ids::{RequestId, Sku, UserId};
use std::hash::BuildHasher;
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

/// Counters of the local guard.
#[derive(Debug, Default)]
pub(crate) struct GuardStats {
    /// Attempts turned away locally (in flight or limit).
    pub(crate) hits: AtomicU64,
    /// Attempts passed on to the store.
    pub(crate) misses: AtomicU64,
    /// Entries dropped to make room for another user.
    pub(crate) evictions: AtomicU64,
    /// Entries dropped because they expired.
    pub(crate) expirations: AtomicU64,
}

/// The in-process guard. See the module docs.
#[derive(Debug)]
pub(crate) struct LocalGuard {
    sets: Box<[Slot]>,
    /// Entries a set holds at most (`WAYS`, or the cap when it is smaller).
    ways: usize,
    /// Two independent keys: a (SKU, user) key is both hashes.
    hashers: [foldhash::fast::RandomState; 2],
    origin: Instant,
    /// Entries held.
    size: AtomicUsize,
    ttl_ns: u64,
    stats: GuardStats,
}

/// Where an attempt's entry is: its set and key, and the load generation it ran in.
#[derive(Debug, Clone, Copy)]
struct Place {
    set: usize,
    key: u128,
    generation: u64,
}

impl LocalGuard {
    /// A guard whose entries live `ttl` and which holds at most `cap` entries (in sets of
    /// [`WAYS`]: 16 bytes per entry of the cap at once, 64 more per entry when its set is
    /// first used).
    pub(crate) fn new(ttl: Duration, cap: usize) -> Self {
        let cap = cap.max(1);
        let ways = cap.min(WAYS);
        Self {
            sets: (0..cap / ways).map(|_| Slot::default()).collect(),
            ways,
            hashers: Default::default(),
            origin: Instant::now(),
            size: AtomicUsize::new(0),
            ttl_ns: u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX),
            stats: GuardStats::default(),
        }
    }

    /// Entries held now (at most the cap).
    pub(crate) fn len(&self) -> usize {
        self.size.load(Relaxed)
    }

    /// Counters.
    pub(crate) fn stats(&self) -> &GuardStats {
        &self.stats
    }

    /// `at` in ns since the guard began.
    fn ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    fn place(&self, sku: &Sku, user: &UserId) -> Place {
        let ids = (sku.as_str().as_bytes(), user.as_str().as_bytes());
        let (a, b) = (self.hashers[0].hash_one(ids), self.hashers[1].hash_one(ids));
        Place {
            // Lemire's multiply-shift: the high bits pick the set, with no division.
            set: ((u128::from(a) * self.sets.len() as u128) >> 64) as usize,
            key: (u128::from(a) << 64) | u128::from(b),
            generation: 0,
        }
    }

    fn rid(&self, rid: &RequestId) -> u64 {
        self.hashers[0].hash_one(rid.as_str().as_bytes())
    }

    /// Runs `f` on `p`'s set.
    fn with_set<R>(&self, p: Place, f: impl FnOnce(&mut Set) -> R) -> R {
        let mut set = self.sets[p.set].0.lock().unwrap_or_else(|e| e.into_inner());
        if set.entries.is_none() {
            set.entries = Some(Box::default());
        }
        f(&mut set)
    }

    /// Checks an attempt of `qty` units against `limit` (0 = no limit) and, on `Pass`, marks
    /// the user busy until [`finish`](Self::finish).
    #[cfg(test)]
    fn begin(&self, sku: &Sku, user: &UserId, rid: &RequestId, qty: u64, limit: u64) -> Local {
        self.begin_in(Instant::now(), 0, sku, user, rid, qty, limit)
            .0
    }

    /// [`begin`](Self::begin) for load generation `generation` of the SKU: what the guard
    /// knew about an older generation is forgotten (a reload starts a fresh ledger). With
    /// `Pass`, where the attempt's entry is (`None`: its set was all busy; the store alone
    /// decides).
    #[allow(clippy::too_many_arguments)]
    fn begin_in(
        &self,
        at: Instant,
        generation: u64,
        sku: &Sku,
        user: &UserId,
        rid: &RequestId,
        qty: u64,
        limit: u64,
    ) -> (Local, Option<Place>) {
        let now = self.ns(at);
        let p = Place {
            generation,
            ..self.place(sku, user)
        };
        let rid = self.rid(rid);
        let decision = self.with_set(p, |set| {
            let i = match set.find(p.key) {
                Some(i) => i,
                None => {
                    let i = self.make_room(set, now)?;
                    set.tags[i] = tag(p.key);
                    set.at[i] = now;
                    set.set_busy(i, false);
                    let e = set.entry(i);
                    e.key = p.key;
                    e.reset();
                    e.generation = generation;
                    i
                }
            };
            let expired = now.saturating_sub(set.at[i]) >= self.ttl_ns;
            let e = set.entry(i);
            if e.generation != generation {
                e.generation = generation;
                e.reset();
            }
            if expired {
                // Expired: forget what we knew (the store still knows).
                self.stats.expirations.fetch_add(1, Relaxed);
                e.reset();
                set.set_busy(i, false);
            }
            let busy = set.is_busy(i);
            let e = set.entry(i);
            Some(if busy {
                // Not touched: a stream of double clicks must not keep an entry alive whose
                // attempt is gone — it expires `ttl` after the attempt began.
                Local::InFlight
            } else if limit > 0
                && e.used.max(e.held_for_good) + qty > limit
                && !e.applied.contains(rid)
            {
                set.touch(i, now);
                Local::LimitReached
            } else {
                set.touch(i, now);
                set.set_busy(i, true);
                Local::Pass
            })
        });
        match decision {
            None => {
                self.stats.misses.fetch_add(1, Relaxed);
                (Local::Pass, None)
            }
            Some(Local::Pass) => {
                self.stats.misses.fetch_add(1, Relaxed);
                (Local::Pass, Some(p))
            }
            Some(refused) => {
                self.stats.hits.fetch_add(1, Relaxed);
                (refused, Some(p))
            }
        }
    }

    /// A way of `set` for a new entry: a free one, else the least recently touched entry
    /// that is idle or expired (dropped); `None` when every entry is busy and young.
    fn make_room(&self, set: &mut Set, now: u64) -> Option<usize> {
        let len = usize::from(set.len);
        if len < self.ways {
            set.len += 1;
            self.size.fetch_add(1, Relaxed);
            return Some(len);
        }
        let expired = |i: usize| now.saturating_sub(set.at[i]) >= self.ttl_ns;
        let victim = (0..len)
            .filter(|&i| !set.is_busy(i) || expired(i))
            .min_by_key(|&i| set.at[i])?;
        let counter = if expired(victim) {
            &self.stats.expirations
        } else {
            &self.stats.evictions
        };
        counter.fetch_add(1, Relaxed);
        Some(victim)
    }

    /// Ends an attempt that passed: `applied_units` > 0 when the store sold or reserved units
    /// for `rid` (now or in an earlier call), 0 otherwise (the chance is not used up).
    #[cfg(test)]
    fn finish(&self, sku: &Sku, user: &UserId, rid: &RequestId, applied_units: u64) {
        self.finish_at(Instant::now(), self.place(sku, user), rid, applied_units);
    }

    /// Ends the attempt at `p` that began at `at`. Its entry is stamped with the attempt's
    /// start, not its end: the entry expires `ttl` after the attempt began.
    fn finish_at(&self, at: Instant, p: Place, rid: &RequestId, units: u64) {
        let now = self.ns(at);
        let rid = (units > 0).then(|| self.rid(rid));
        self.with_set(p, |set| {
            if let Some(i) = set.find(p.key) {
                set.set_busy(i, false);
                set.touch(i, now);
                let e = set.entry(i);
                // An attempt of an earlier load's generation only stops being busy: its units
                // are not the new generation's (a reload starts a fresh ledger).
                if let Some(rid) = rid
                    && e.generation == p.generation
                    && !e.applied.contains(rid)
                {
                    e.used += units;
                    e.applied.push(rid);
                }
            }
        });
    }

    /// Tells the guard the store answered "limit reached" with `final_units` sold for good to
    /// this user: later attempts that would pass the limit on top of those units are turned
    /// away locally until the entry expires (an attempt for fewer units still goes on).
    fn saturate_at(&self, p: Place, final_units: u64) {
        self.with_set(p, |set| {
            if let Some(i) = set.find(p.key) {
                set.set_busy(i, false);
                let e = set.entry(i);
                if e.generation == p.generation {
                    e.held_for_good = e.held_for_good.max(final_units);
                }
            }
        });
    }

    #[cfg(test)]
    fn saturate(&self, sku: &Sku, user: &UserId, final_units: u64) {
        self.saturate_at(self.place(sku, user), final_units);
    }

    /// Forgets a user (e.g. after a cancelled reservation gave units back).
    pub(crate) fn forget(&self, sku: &Sku, user: &UserId) {
        let p = self.place(sku, user);
        let removed = self.with_set(p, |set| {
            let i = set.find(p.key)?;
            let last = usize::from(set.len) - 1;
            set.tags.swap(i, last);
            set.at.swap(i, last);
            set.entries
                .as_deref_mut()
                .expect("a set in use has its entries")
                .swap(i, last);
            let last_busy = set.is_busy(last);
            set.set_busy(i, last_busy);
            set.set_busy(last, false);
            set.entry(last).reset();
            set.len -= 1;
            Some(())
        });
        if removed.is_some() {
            self.size.fetch_sub(1, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SKU `s`, user `u` and request id `r` (`attempt.rs`'s tests use it too).
    pub(super) fn ids(u: &str, r: &str) -> (Sku, UserId, RequestId) {
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
    fn a_full_set_of_busy_entries_lets_an_attempt_through_untracked() {
        let g = LocalGuard::new(Duration::from_secs(60), WAYS);
        let s = Sku::new("s").unwrap();
        let r = RequestId::new("r").unwrap();
        let users: Vec<_> = (0..=WAYS)
            .map(|i| UserId::new(format!("u{i}")).unwrap())
            .collect();
        let held: Vec<_> = users[..WAYS]
            .iter()
            .map(|u| g.enter(Instant::now(), 1, &s, u, &r, 1, 1).unwrap())
            .collect();
        assert_eq!(g.len(), WAYS);
        // No room: the store alone decides, and the busy entries stay.
        let extra = g
            .enter(Instant::now(), 1, &s, &users[WAYS], &r, 1, 1)
            .unwrap();
        assert_eq!(g.begin(&s, &users[WAYS], &r, 1, 1), Local::Pass);
        extra.finish(1);
        for u in &users[..WAYS] {
            assert_eq!(g.begin(&s, u, &r, 1, 1), Local::InFlight);
        }
        drop(held);
        // Idle now: the least recently touched makes room.
        assert_eq!(g.begin(&s, &users[WAYS], &r, 1, 1), Local::Pass);
        assert_eq!(g.len(), WAYS);
        assert_eq!(g.stats().evictions.load(Relaxed), 1);
    }

    #[test]
    fn an_attempt_of_an_earlier_generation_does_not_count_in_the_next() {
        let g = LocalGuard::new(Duration::from_secs(60), 100);
        let (s, u, r1) = ids("u", "r1");
        let r2 = RequestId::new("r2").unwrap();
        // Sold in generation 1, finished after a reload began generation 2 for this user.
        let a = g.enter(Instant::now(), 1, &s, &u, &r1, 1, 1).unwrap();
        assert_eq!(
            g.begin_in(Instant::now(), 2, &s, &u, &r2, 1, 1).0,
            Local::InFlight
        );
        a.finish(1);
        assert_eq!(
            g.begin_in(Instant::now(), 2, &s, &u, &r2, 1, 1).0,
            Local::Pass,
            "generation 2's ledger is fresh"
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

    /// An attempt's entry is stamped with the attempt's start, at its end too: what it learnt
    /// expires `ttl` after the attempt began.
    #[test]
    fn an_attempt_stamps_its_start() {
        let g = LocalGuard::new(Duration::from_millis(100), 10);
        // Stamps count from the guard's birth: let it be older than the start below.
        std::thread::sleep(Duration::from_millis(100));
        let (s, u, r) = ids("u", "r");
        let began = Instant::now() - Duration::from_millis(80);
        g.enter(began, 1, &s, &u, &r, 1, 1).unwrap().finish(1);
        let r2 = RequestId::new("r2").unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(
            g.begin_in(Instant::now(), 1, &s, &u, &r2, 1, 1).0,
            Local::Pass,
            "110 ms after the attempt began, its knowledge has expired"
        );
    }

    /// A stamp never moves back: an attempt that began before the entry's latest stamp (calls
    /// are stamped with their start) leaves the newer one, at its start and at its end.
    #[test]
    fn an_older_start_never_moves_a_stamp_back() {
        let g = LocalGuard::new(Duration::from_millis(100), 10);
        let (s, u, r) = ids("u", "r");
        let r2 = RequestId::new("r2").unwrap();
        let r3 = RequestId::new("r3").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        // Limit 2: the first unit leaves room for an attempt that began 90 ms ago.
        g.enter(Instant::now(), 1, &s, &u, &r, 1, 2)
            .unwrap()
            .finish(1);
        let older = Instant::now() - Duration::from_millis(90);
        g.enter(older, 1, &s, &u, &r2, 1, 2).unwrap().finish(1);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(
            g.begin_in(Instant::now(), 1, &s, &u, &r3, 1, 2).0,
            Local::LimitReached,
            "the newer stamp stands: the entry is 30 ms old, not 120"
        );
    }
}
