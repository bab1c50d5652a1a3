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
use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
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
    /// sends an id to its record); `None` once over [`MAX_IDS`]: no more flags.
    sent: Mutex<Option<HashSet<u64>>>,
    /// Units of the answers `Applied` given through this layout.
    applied: AtomicU64,
}

/// Most request ids a layout remembers for the proof (~16 B each); past it, no more flags for
/// the layout (its generation).
const MAX_IDS: usize = 2_000_000;

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
            sent: Mutex::new(Some(HashSet::new())),
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

    /// True when `id` may be answered `SoldOut` from memory: a flag stands and `id` was never
    /// sent to the store through this layout.
    pub(crate) fn answers(&self, id: Key<'_>) -> bool {
        if !self.is_set() {
            return false;
        }
        let h = id_hash(id);
        let sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        sent.as_ref().is_some_and(|ids| !ids.contains(&h))
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

    /// Remembers that `id` is about to be sent to a script that may write its record.
    pub(crate) fn sent(&self, id: Key<'_>) {
        if self.watch.is_none() {
            return;
        }
        let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ids) = sent.as_mut() {
            ids.insert(id_hash(id));
            if ids.len() > MAX_IDS {
                *sent = None;
            }
        }
    }

    /// Counts an answer given through this layout (the units of an `Applied`; its id was
    /// [`sent`](Self::sent) before).
    pub(crate) fn applied(&self, d: &super::Deduction) {
        if let (Some(_), super::Deduction::Applied { parts }) = (&self.watch, d) {
            let units: u64 = parts.iter().map(|p| p.units).sum();
            self.applied.fetch_add(units, Relaxed);
        }
    }
}
