//! Request records of one segment: what a record hash holds (`Record`), and the sharded,
//! lazily expiring map of them (`Records`).

use super::{HashMap, Hasher, ms};
use crate::ids::{RequestId, UserId};
use crate::segments::Part;
use crate::store::{ReqArgs, RequestKind, ResvState};
use std::time::Instant;

/// Fewest record inserts between sweeps of expired records in one segment. A sweep scans
/// every record (of one sub-map), so sweeps are also spaced by half the records held: the scan
/// stays O(1) amortised per insert however many records live (24 h of them by default).
pub(super) const SWEEP_EVERY: usize = 4096;

/// Sub-maps of one segment's request records. A hash map grows by doubling, moving every
/// entry while the segment's mutex is held: one map of 2M records stalled a segment for
/// ~1 s. Split 64 ways, each doubling moves 1/64 of the records; each sub-map is also swept
/// on its own.
const RECORD_SHARDS: usize = 64;

/// A request record's state: the `s` letter of the scripts' records (see the tables in
/// [`crate::store::redis::lua`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    /// `A`: applied (at home with `parts`; elsewhere a `part` taken by claim `epoch`).
    Applied,
    /// `P`: a pending fallback claim (home only).
    Pending,
    /// `V`: a shut-out marker: nothing taken here, older claim epochs refused.
    ShutOut,
    /// `R`: a refunded part.
    Refunded,
    /// `X`: sealed, never applies.
    Sealed,
    /// `F`: a released claim (home only): the request id is free, as if no record were there;
    /// a new claim of it continues above `epoch`.
    Released,
}

/// A request record (the fields of a script's record hash).
#[derive(Debug, Clone)]
pub(super) struct Record {
    pub(super) status: Status,
    pub(super) user: UserId,
    pub(super) qty: u64,
    /// Claim epoch.
    pub(super) epoch: u64,
    /// Units taken here by a fallback part (`p`).
    pub(super) part: u64,
    /// Units a pending claim took at home (`hp`).
    pub(super) home_part: u64,
    /// Lease end of a pending claim (`l`).
    pub(super) lease_until: Instant,
    /// Where an applied request took its units.
    pub(super) parts: Parts,
    pub(super) expires: Instant,
    /// Reservation state of the units this record holds (`rs`; `None`: sold or none).
    pub(super) reservation: Option<ResvState>,
    /// Units the reservation holds (`rq`).
    pub(super) reserved_units: u64,
    /// Sale or reservation (`k`).
    pub(super) kind: RequestKind,
}

impl Record {
    /// A record in `status` for `req` at `epoch`, living the request TTL.
    pub(super) fn new(status: Status, req: &ReqArgs<'_>, epoch: u64, now: Instant) -> Self {
        Self {
            status,
            user: req.user.clone(),
            qty: req.qty,
            epoch,
            part: 0,
            home_part: 0,
            lease_until: now,
            parts: Parts::None,
            expires: now + ms(req.ttl_ms),
            reservation: None,
            reserved_units: 0,
            kind: req.kind,
        }
    }

    /// Which parameter of `req` differs from the record (`conflict` in prelude.lua).
    pub(super) fn mismatch(&self, req: &ReqArgs<'_>) -> Option<&'static str> {
        if &self.user != req.user {
            Some("user")
        } else if self.qty != req.qty {
            Some("qty")
        } else if self.kind != req.kind {
            Some("kind")
        } else {
            None
        }
    }
}

/// Where an applied request took its units, without an allocation for the usual one part.
#[derive(Debug, Clone, Default)]
pub(super) enum Parts {
    /// None recorded (not applied, or not the home record).
    #[default]
    None,
    /// One part (a sale or reservation served by one segment).
    One(Part),
    /// Several parts (served across segments).
    Many(Box<[Part]>),
}

impl Parts {
    /// The parts as a list.
    pub(super) fn to_vec(&self) -> Vec<Part> {
        match self {
            Parts::None => Vec::new(),
            Parts::One(p) => vec![*p],
            Parts::Many(ps) => ps.to_vec(),
        }
    }

    /// `parts` as stored.
    pub(super) fn from_slice(parts: &[Part]) -> Self {
        match parts {
            [] => Parts::None,
            [p] => Parts::One(*p),
            ps => Parts::Many(ps.into()),
        }
    }
}

pub(super) type RecordKey = (u64, RequestId);

/// A segment's request records (generation, request id) → record, with lazy expiry.
#[derive(Debug)]
pub(super) struct Records {
    hasher: Hasher,
    /// Records are boxed: a map grows by moving every entry, and an entry of key and box
    /// (32 bytes) moves ~4× cheaper than one holding the record itself (measured: growth was
    /// the largest cost of an embedded deduction).
    shards: Vec<HashMap<RecordKey, Box<Record>>>,
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
    fn shard(&self, key: &RecordKey) -> usize {
        use std::hash::BuildHasher;
        (self.hasher.hash_one(key) >> 58) as usize % RECORD_SHARDS
    }

    pub(super) fn get_mut(&mut self, key: &RecordKey) -> Option<&mut Record> {
        let i = self.shard(key);
        self.shards[i].get_mut(key).map(|r| &mut **r)
    }

    /// The record at `key` unless it expired by `now` (an expired one is dropped on the way):
    /// one hash and one probe.
    pub(super) fn live(&mut self, key: RecordKey, now: Instant) -> Option<&mut Record> {
        use std::collections::hash_map::Entry;
        let i = self.shard(&key);
        match self.shards[i].entry(key) {
            Entry::Occupied(o) if o.get().expires <= now => {
                o.remove();
                None
            }
            Entry::Occupied(o) => Some(&mut **o.into_mut()),
            Entry::Vacant(_) => None,
        }
    }

    /// Inserts, first sweeping expired records out of the sub-map now and then: sweeps are
    /// spaced by at least SWEEP_EVERY / RECORD_SHARDS inserts and by half the sub-map, so the
    /// scan stays O(1) amortised per insert.
    pub(super) fn insert(&mut self, key: RecordKey, rec: Record, now: Instant) {
        let i = self.shard(&key);
        self.inserts[i] += 1;
        if self.inserts[i] >= (SWEEP_EVERY / RECORD_SHARDS).max(self.shards[i].len() / 2) {
            self.inserts[i] = 0;
            self.shards[i].retain(|_, r| r.expires > now);
        }
        self.shards[i].insert(key, Box::new(rec));
    }
}
