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
//!   no other request id holds an applied record: the memory answer never hides a replay.
//!   Request ids that did apply here are not answered from memory; they read their record as
//!   before (`Replayed`). With several instances selling, the sum does not match and every
//!   instance answers from a fresh read, as before (exact, not faster).
//!
//! A flag is believed only while its snapshot is current and before its TTL. Staleness bound:
//! a restock, cancel, refund or expiry reclaimed by a script reaches every subscriber as a
//! message (loopback: within a millisecond of the script); a message lost silently is bounded
//! by the TTL; a reservation expiring lazily (no script ran yet) is returned by the sweeper's
//! `reclaim.lua` (which notifies), so it is hidden at most one sweeper period or one TTL,
//! whichever ends first.

use crate::ids::RequestId;
use crate::store::{SegmentState, StockWatch, watch::Seen};
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
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
    local: Mutex<Local>,
}

/// What applied through this layout.
#[derive(Debug, Default)]
struct Local {
    /// Hashes of the request ids (a collision only sends an id to its record).
    ids: HashSet<u64>,
    units: u64,
}

/// Taken before a fresh read: what the read's answer is checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket {
    seen: Seen,
    at_us: u64,
}

fn id_hash(id: &RequestId) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

impl SoldOut {
    pub(crate) fn new(watch: Option<StockWatch>, ttl: Duration) -> Self {
        Self {
            watch: watch.filter(|_| !ttl.is_zero()),
            ttl,
            origin: Instant::now(),
            until_us: AtomicU64::new(0),
            flag: Mutex::new(None),
            local: Mutex::new(Local::default()),
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

    /// True when `id` may be answered `SoldOut` from memory: a flag stands and `id` did not
    /// apply through this layout.
    pub(crate) fn answers(&self, id: &RequestId) -> bool {
        self.is_set()
            && !self
                .local
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .ids
                .contains(&id_hash(id))
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
        let mut added = 0;
        for s in segs {
            match s {
                Some(s) if s.stock == 0 => added += s.loaded + s.restocked,
                _ => return,
            }
        }
        let local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        if local.units != added
            || w.seen() != Some(t.seen)
            || !w.clean_since_load(generation, t.seen)
        {
            return;
        }
        drop(local);
        *self.flag.lock().unwrap_or_else(|e| e.into_inner()) = Some(t.seen);
        self.until_us
            .store(t.at_us + self.ttl.as_micros() as u64, Relaxed);
    }

    /// Counts an answer given through this layout: an applied request's id and units.
    pub(crate) fn applied(&self, id: &RequestId, d: &super::Deduction) {
        if self.watch.is_none() {
            return;
        }
        if let super::Deduction::Applied { parts } = d {
            let units: u64 = parts.iter().map(|p| p.units).sum();
            let mut l = self.local.lock().unwrap_or_else(|e| e.into_inner());
            l.ids.insert(id_hash(id));
            l.units += units;
        }
    }
}
