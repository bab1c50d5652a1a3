//! Sold out from memory: once a fresh read proved a SKU sold out, this process answers
//! `SoldOut` without a round trip and without writing, until a notification says units may
//! be sellable again (see [`crate::store::StockWatch`]) or the flag's TTL
//! (`EngineOptions::sold_out_ttl`, default 1 s) runs out.
//!
//! The flag is set only from a proof, all of it checked on one fresh read of every segment:
//! - every segment of the layout's generation holds 0 units;
//! - no notification arrived, and none can have been lost, between taking the snapshot (before
//!   the read was sent) and using the answer: a restock published while the read was under way
//!   voids it; a later one voids the flag;
//! - **every unit of the generation went to a request that applied through this layout**
//!   (`loaded + restocked` summed over the segments equals the units this process saw
//!   applied), this process saw the generation's load and no unit of it ever went back. So
//!   no other request holds an applied record: the memory answer never hides a replay.
//!   Requests (user and id) this layout ever sent to a script that may write a record are not
//!   answered from memory; they go to the store as before (`Replayed`, a conflict, ...). With
//!   several instances selling, the sum does not match and every instance answers from the
//!   store, as before (exact, not faster). Units in transit between segments are not sold, so
//!   while any is on its way the sum cannot match either.
//!
//! A flag is believed only while its snapshot is current and before its TTL. Staleness bound:
//! a restock, cancel, refund or expiry reclaimed by a script reaches every subscriber as a
//! message (loopback: within a millisecond of the script); a message lost silently is bounded
//! by the TTL; a reservation expiring lazily (no script ran yet) is returned by the sweeper's
//! survey (`survey.lua`, which notifies), so it is hidden at most one sweeper period or one
//! TTL, whichever ends first.

use crate::ids::{RequestId, UserId};
use crate::store::{SegmentState, StockWatch, watch::Seen};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// One layout's sold-out state.
#[derive(Debug)]
pub(crate) struct SoldOut {
    /// `None`: the store has no notifications, or the TTL is 0: no flags.
    watch: Option<StockWatch>,
    ttl: Duration,
    origin: Instant,
    /// When the flag's TTL ends, in µs since `origin` (0: no flag); read without the lock.
    until_us: AtomicU64,
    flag: Mutex<Option<Seen>>,
    /// Hashes of the request ids sent to the store through this layout (a collision only
    /// sends an id to its record), in [`SHARDS`] shards by hash: every request adds to one, so
    /// one lock for all would be shared by every task. A shard appends (a push, no hashing
    /// into a growing table: measured the largest single cost of a coalesced sale in the
    /// client once past ~100k ids) and sorts only when asked, i.e. while a flag stands.
    sent: Box<[Mutex<IdShard>]>,
    /// A shard over its part of [`MAX_IDS`]: the sets are dropped and no more flags are set for
    /// the layout.
    sent_full: AtomicBool,
    /// Units of the answers `Applied` given through this layout.
    applied: AtomicU64,
}

/// Most request ids a layout remembers for the proof (8 B each); once a shard holds more than
/// its [`SHARDS`]th of it, no more flags for the layout (its generation).
const MAX_IDS: usize = 2_000_000;

/// Sets the sent ids are spread over (by the hash's top bits).
const SHARDS: usize = 64;

/// One shard of sent ids: `sorted` (ascending, no duplicates) and the ids added since.
#[derive(Debug, Default)]
struct IdShard {
    sorted: Vec<u64>,
    tail: Vec<u64>,
}

impl IdShard {
    fn push(&mut self, h: u64) {
        self.tail.push(h);
    }

    /// Ids held (a retry's id twice until the next sort).
    fn len(&self) -> usize {
        self.sorted.len() + self.tail.len()
    }

    /// Whether `h` was pushed. Sorts what was added since the last question into the rest
    /// (asked only while a flag stands, when nothing is added but by requests it cannot
    /// answer).
    fn contains(&mut self, h: u64) -> bool {
        if !self.tail.is_empty() {
            self.sorted.append(&mut self.tail);
            self.sorted.sort_unstable();
            self.sorted.dedup();
        }
        self.sorted.binary_search(&h).is_ok()
    }
}

fn shard(h: u64) -> usize {
    // SplitMix64's finaliser spreads FNV's weak bits over the top ones.
    let mut z = h;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) >> 58) as usize % SHARDS
}

/// Taken before a fresh read: what the read's answer is checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket {
    seen: Seen,
    at_us: u64,
}

/// A request's key: its user and request id (ids are scoped per user).
pub(crate) type Key<'a> = (&'a UserId, &'a RequestId);

fn id_hash((user, id): Key<'_>) -> u64 {
    crate::segments::fnv1a(user.as_str().as_bytes())
        ^ crate::store::watch::id_hash(id.as_str()).rotate_left(17)
}

impl SoldOut {
    pub(crate) fn new(watch: Option<StockWatch>, ttl: Duration) -> Self {
        Self {
            watch: watch.filter(|_| !ttl.is_zero()),
            ttl,
            origin: Instant::now(),
            until_us: AtomicU64::new(0),
            flag: Mutex::new(None),
            sent: (0..SHARDS).map(|_| Mutex::default()).collect(),
            sent_full: AtomicBool::new(false),
            applied: AtomicU64::new(0),
        }
    }

    fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64 + 1
    }

    /// True while a flag stands (proof current, TTL not over).
    pub(crate) fn is_set(&self) -> bool {
        let until = self.until_us.load(Relaxed);
        if until == 0 {
            return false;
        }
        let Some(w) = &self.watch else { return false };
        let flag = *self.flag.lock().unwrap_or_else(|e| e.into_inner());
        if self.now_us() < until && flag.is_some() && w.seen() == flag {
            return true;
        }
        // Void: drop it (unless a newer one replaced it meanwhile).
        let _ = self.until_us.compare_exchange(until, 0, Relaxed, Relaxed);
        false
    }

    /// Before sending a fresh read of every segment (`None`: no flag can come of it).
    pub(crate) fn before_read(&self) -> Option<Ticket> {
        let seen = self.watch.as_ref()?.seen()?;
        Some(Ticket {
            seen,
            at_us: self.now_us(),
        })
    }

    /// After the read `segs` (every segment of `generation`) sent after `ticket`: sets the
    /// flag when it proves the SKU sold out (see the module docs).
    pub(crate) fn after_read(
        &self,
        ticket: Option<Ticket>,
        generation: u64,
        segs: &[Option<SegmentState>],
    ) {
        let (Some(t), Some(w)) = (ticket, &self.watch) else {
            return;
        };
        // Units in transit are not sold: Σ moved_out > Σ moved_in leaves `added` above what
        // applied, so no flag while any unit is on its way.
        let mut added = 0;
        for s in segs {
            match s {
                Some(s) if s.stock == 0 => added += s.loaded + s.restocked,
                _ => return,
            }
        }
        if self.applied.load(Relaxed) != added
            || w.seen() != Some(t.seen)
            || !w.clean_since_load(generation, t.seen)
        {
            return;
        }
        *self.flag.lock().unwrap_or_else(|e| e.into_inner()) = Some(t.seen);
        self.until_us
            .store(t.at_us + self.ttl.as_micros() as u64, Relaxed);
    }

    /// True when `id` may be answered `SoldOut` from memory: a flag stands and `id` was never
    /// sent to the store through this layout. Otherwise `id` is remembered as about to be sent
    /// to a script that may write its record (an id found sent is not added twice, so a storm
    /// of retries while a flag stands adds nothing to sort).
    pub(crate) fn answers_or_sends(&self, id: Key<'_>) -> bool {
        if self.watch.is_none() || self.sent_full.load(Relaxed) {
            return false;
        }
        let h = id_hash(id);
        let flag = self.is_set();
        let mut ids = self.sent[shard(h)]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Read again under the lock: a shard being dropped answers nothing.
        if self.sent_full.load(Relaxed) {
            return false;
        }
        if flag {
            if !ids.contains(h) {
                return true;
            }
            return false;
        }
        ids.push(h);
        // A retry sent while no flag stands counts again: the bound is on ids sent. Counted
        // per shard, under the lock held anyway (a count shared by every request was one more
        // cache line bouncing between the threads): the ids spread evenly over the shards.
        let over = ids.len() > MAX_IDS / SHARDS;
        drop(ids);
        if over {
            // No more flags for this layout; the memory goes.
            self.sent_full.store(true, Relaxed);
            for ids in &self.sent {
                *ids.lock().unwrap_or_else(|e| e.into_inner()) = IdShard::default();
            }
        }
        false
    }

    /// Counts an answer given through this layout (the units of an `Applied`; its id was
    /// [`sent`](Self::sent) before).
    pub(crate) fn applied(&self, d: &super::Deduction) {
        if let (Some(_), super::Deduction::Applied { units, .. }) = (&self.watch, d) {
            self.applied.fetch_add(*units, Relaxed);
        }
    }
}
