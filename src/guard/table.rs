//! The guard's storage: a fixed table of sets, each holding up to [`WAYS`] entries, laid out
//! by cache line. What an entry holds and where it sits; no decision is made here (the guard
//! decides, in `guard.rs`). It imports nothing of the crate.
//!
//! The table holds no ids: an entry is known by a 128-bit hash of (SKU, user) under a
//! per-process random key (two keys meeting is a 2⁻¹²⁸ event), and a request id by a 64-bit
//! hash (two meeting only sends a request to the store). A request costs one hash, one set lock
//! and a scan of 8-bit tags beside it, then its own entry: three cache lines (the set's two and
//! the entry's), whatever the number of buyers. With a table larger than the cache every one of
//! them is a miss, twice per request (the attempt and its end), so the layout is what the guard
//! costs.

use std::sync::Mutex;

/// Entries per set: a user's entry is one of the eight of its set.
pub(crate) const WAYS: usize = 8;

/// One user's entry. 64 bytes, one cache line: a lookup that matched a set's tag reads only
/// its own entry.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub(super) struct Entry {
    /// The full (SKU, user) key (the set keeps 8 bits of it as a tag).
    pub(super) key: u128,
    /// Units this process saw the user get (sold or reserved).
    pub(super) used: u64,
    /// Units the store said the user holds for good (from a "limit reached"): a floor under
    /// `used`, kept apart because it may include units `used` already counts.
    pub(super) held_for_good: u64,
    /// The SKU's load generation this knowledge belongs to: a reload starts a fresh ledger.
    pub(super) generation: u64,
    /// Hashes of the request ids of those units (a retry of one of them is a replay, not a
    /// new purchase).
    pub(super) applied: Applied,
}

impl Entry {
    /// Forgets what was known (the store still knows).
    pub(super) fn reset(&mut self) {
        self.used = 0;
        self.held_for_good = 0;
        self.applied.clear();
    }
}

/// The request-id hashes of an entry's units: almost always none or one, kept without an
/// allocation (a hash of 0 is kept as 1: 0 is "none").
#[derive(Debug, Default)]
pub(super) struct Applied {
    first: u64,
    /// The rest (rare: one user's several purchases of one SKU), copied on each push; a boxed
    /// slice keeps the entry in one cache line where a `Vec` would not.
    more: Box<[u64]>,
}

impl Applied {
    pub(super) fn contains(&self, rid: u64) -> bool {
        let rid = rid.max(1);
        self.first == rid || self.more.contains(&rid)
    }

    pub(super) fn push(&mut self, rid: u64) {
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
pub(super) struct Set {
    busy: u8,
    pub(super) len: u8,
    /// Eight bits of each entry's key: a lookup compares full keys only where a tag matched.
    pub(super) tags: [u8; WAYS],
    pub(super) entries: Option<Box<[Entry; WAYS]>>,
    /// Last touched: the start of the latest attempt that touched the entry (a sale reads the
    /// clock once), in ns since the guard began; never moved back.
    pub(super) at: [u64; WAYS],
}

impl Set {
    pub(super) fn find(&self, key: u128) -> Option<usize> {
        let entries = self.entries.as_deref()?;
        let tag = tag(key);
        (0..usize::from(self.len)).find(|&i| self.tags[i] == tag && entries[i].key == key)
    }

    pub(super) fn entry(&mut self, i: usize) -> &mut Entry {
        &mut self
            .entries
            .as_deref_mut()
            .expect("a set in use has its entries")[i]
    }

    /// Stamps entry `i` as touched by an attempt that began at `now`, never back: attempts are
    /// stamped with their start, and one that began earlier may come after one that began
    /// later.
    pub(super) fn touch(&mut self, i: usize, now: u64) {
        self.at[i] = self.at[i].max(now);
    }

    pub(super) fn is_busy(&self, i: usize) -> bool {
        self.busy & (1 << i) != 0
    }

    pub(super) fn set_busy(&mut self, i: usize, busy: bool) {
        if busy {
            self.busy |= 1 << i;
        } else {
            self.busy &= !(1 << i);
        }
    }
}

/// A key's tag: bits of the key's second hash (the first picks the set).
pub(super) fn tag(key: u128) -> u8 {
    key as u8
}

/// A set behind its lock, two cache lines: the lock, the busy marks, the tags, the entries'
/// pointer and the first four ages in the first, the other four ages in the second.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub(super) struct Slot(pub(super) Mutex<Set>);

#[cfg(test)]
mod tests {
    use super::*;

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
}
