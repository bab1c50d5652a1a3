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
//! never let a user exceed the limit. The table never grows, rehashes or sweeps, and holds no
//! ids: an entry is known by a 128-bit hash of (SKU, user) under a per-process random key (two
//! keys meeting is a 2⁻¹²⁸ event), and a request id by a 64-bit hash (two meeting only sends a
//! request to the store). A request costs one hash, one set lock and a scan of 8-bit tags
//! beside it, then its own entry: three cache lines (the set's two and the entry's), whatever
//! the number of buyers. With a table larger than the cache every one of them is a miss, twice
//! per request (the attempt and its end), so the layout is what the guard costs.
//!
//! A retry of a request this process already saw applied is let through (the store replays
//! it), so the filter never turns "you already bought this" into "limit reached".

use crate::ids::{RequestId, Sku, UserId};
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Entries per set: a user's entry is one of the eight of its set.
pub(crate) const WAYS: usize = 8;

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

/// One user's entry. 64 bytes, one cache line: a lookup that matched a set's tag reads only
/// its own entry.
#[derive(Debug, Default)]
#[repr(C, align(64))]
struct Entry {
    /// The full (SKU, user) key (the set keeps 8 bits of it as a tag).
    key: u128,
    /// Units this process saw the user get (sold or reserved).
    used: u64,
    /// Units the store said the user holds for good (from a "limit reached"): a floor under
    /// `used`, kept apart because it may include units `used` already counts.
    held_for_good: u64,
    /// The SKU's load generation this knowledge belongs to: a reload starts a fresh ledger.
    generation: u64,
    /// Hashes of the request ids of those units (a retry of one of them is a replay, not a
    /// new purchase).
    applied: Applied,
}

impl Entry {
    /// Forgets what was known (the store still knows).
    fn reset(&mut self) {
        self.used = 0;
        self.held_for_good = 0;
        self.applied.clear();
    }
}

/// The request-id hashes of an entry's units: almost always none or one, kept without an
/// allocation (a hash of 0 is kept as 1: 0 is "none").
#[derive(Debug, Default)]
struct Applied {
    first: u64,
    /// The rest (rare: one user's several purchases of one SKU), copied on each push; a boxed
    /// slice keeps the entry in one cache line where a `Vec` would not.
    more: Box<[u64]>,
}

impl Applied {
    fn contains(&self, rid: u64) -> bool {
        let rid = rid.max(1);
        self.first == rid || self.more.contains(&rid)
    }

    fn push(&mut self, rid: u64) {
        let rid = rid.max(1);
        if self.first == 0 {
            self.first = rid;
        } else {
            let mut more = std::mem::take(&mut self.more).into_vec();
            more.push(rid);
            self.more = more.into_boxed_slice();
        }
    }

    fn clear(&mut self) {
        self.first = 0;
        self.more = Box::default();
    }
}

/// One set: up to [`WAYS`] entries, the first `len` in use. What a lookup reads (the lock,
/// busy marks, an 8-bit tag per entry) is one cache line, the ages a victim is chosen by end
/// in the next (see [`Slot`]); the entries, read once a tag matched, are allocated when the
/// set is first used.
#[derive(Debug, Default)]
#[repr(C)]
struct Set {
    busy: u8,
    len: u8,
    /// Eight bits of each entry's key: a lookup compares full keys only where a tag matched.
    tags: [u8; WAYS],
    entries: Option<Box<[Entry; WAYS]>>,
    /// Last touched: the start of the latest attempt that touched the entry (a sale reads the
    /// clock once), in ns since the guard began; never moved back.
    at: [u64; WAYS],
}

impl Set {
    fn find(&self, key: u128) -> Option<usize> {
        let entries = self.entries.as_deref()?;
        let tag = tag(key);
        (0..usize::from(self.len)).find(|&i| self.tags[i] == tag && entries[i].key == key)
    }

    fn entry(&mut self, i: usize) -> &mut Entry {
        &mut self
            .entries
            .as_deref_mut()
            .expect("a set in use has its entries")[i]
    }

    /// Stamps entry `i` as touched by an attempt that began at `now`, never back: attempts are
    /// stamped with their start, and one that began earlier may come after one that began
    /// later.
    fn touch(&mut self, i: usize, now: u64) {
        self.at[i] = self.at[i].max(now);
    }

    fn is_busy(&self, i: usize) -> bool {
        self.busy & (1 << i) != 0
    }

    fn set_busy(&mut self, i: usize, busy: bool) {
        if busy {
            self.busy |= 1 << i;
        } else {
            self.busy &= !(1 << i);
        }
    }
}

/// A key's tag: bits of the key's second hash (the first picks the set).
fn tag(key: u128) -> u8 {
    key as u8
}

/// A set behind its lock, two cache lines: the lock, the busy marks, the tags, the entries'
/// pointer and the first four ages in the first, the other four ages in the second.
#[derive(Debug, Default)]
#[repr(C, align(64))]
struct Slot(Mutex<Set>);

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

    /// [`begin`](Self::begin), with the busy mark owned by the returned [`Attempt`]: if the
    /// attempt is dropped before [`Attempt::finish`] (a cancelled future: a client
    /// disconnected and the server dropped its handler), the user is no longer busy.
    ///
    /// # Errors
    /// The refusal ([`Local::InFlight`] or [`Local::LimitReached`]) when not [`Local::Pass`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enter<'a>(
        &'a self,
        at: Instant,
        generation: u64,
        sku: &Sku,
        user: &UserId,
        rid: &'a RequestId,
        qty: u64,
        limit: u64,
    ) -> Result<Attempt<'a>, Local> {
        match self.begin_in(at, generation, sku, user, rid, qty, limit) {
            (Local::Pass, place) => Ok(Attempt {
                guard: self,
                at,
                key: place.map(|p| (p, rid)),
            }),
            (refused, _) => Err(refused),
        }
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

/// A running attempt that passed the guard (see [`LocalGuard::enter`]); dropping it unfinished
/// ends it as if nothing was bought.
#[derive(Debug)]
pub(crate) struct Attempt<'a> {
    guard: &'a LocalGuard,
    /// When the attempt began (what its end stamps the entry with).
    at: Instant,
    /// `None`: finished, or never had an entry.
    key: Option<(Place, &'a RequestId)>,
}

impl Attempt<'_> {
    /// Ends the attempt: `sold_units` > 0 when the store sold units for good for this request
    /// (now or earlier). Reserved units are not remembered here — a reservation may go back.
    pub(crate) fn finish(mut self, sold_units: u64) {
        if let Some((p, rid)) = self.key.take() {
            self.guard.finish_at(self.at, p, rid, sold_units);
        }
    }

    /// Ends the attempt after the store answered "limit reached" with `final_units` sold for
    /// good to this user.
    pub(crate) fn saturate(mut self, final_units: u64) {
        if let Some((p, _)) = self.key.take() {
            self.guard.saturate_at(p, final_units);
        }
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if let Some((p, rid)) = self.key.take() {
            self.guard.finish_at(self.at, p, rid, 0);
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
        let a = g.enter(Instant::now(), 7, &s, &u, &r1, 1, 1).unwrap();
        drop(a);
        // The entry begins between these two instants; the checks below hold whatever the
        // scheduler does (no timed assertion: each one is made only when its premise held).
        let before = Instant::now();
        let a = g
            .enter(Instant::now(), 7, &s, &u, &r1, 1, 1)
            .expect("free again after a drop");
        let after = Instant::now();
        // A stuck attempt (never finished, never dropped) expires `ttl` after it began, however
        // many double clicks ask meanwhile.
        std::mem::forget(a);
        let mut asked = 0;
        while before.elapsed() < ttl {
            let r = g.begin_in(Instant::now(), 7, &s, &u, &r1, 1, 1).0;
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
            g.begin_in(Instant::now(), 7, &s, &u, &r1, 1, 1).0,
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
    fn a_set_and_an_entry_are_the_cache_lines_the_layout_says() {
        assert_eq!(std::mem::size_of::<Slot>(), 128);
        assert_eq!(std::mem::align_of::<Slot>(), 64);
        assert_eq!(std::mem::size_of::<Entry>(), 64);
        assert_eq!(std::mem::size_of::<[Entry; WAYS]>(), 64 * WAYS);
    }

    #[test]
    fn keys_sharing_a_tag_are_told_apart_by_their_full_key() {
        let mut set = Set {
            entries: Some(Box::default()),
            ..Set::default()
        };
        let keys = [0x0101_u128, 0x0201, 0x0301 << 64 | 0x01, 0x02];
        for (i, &k) in keys.iter().enumerate() {
            set.tags[i] = tag(k);
            set.entry(i).key = k;
            set.len += 1;
        }
        assert_eq!(tag(keys[0]), tag(keys[1]));
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(set.find(k), Some(i), "{k:#x}");
        }
        assert_eq!(set.find(0x0401), None, "same tag, no such key");
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
