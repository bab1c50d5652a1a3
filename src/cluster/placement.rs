//! Placement: which hash tag each segment of a SKU gets, so that on a Redis Cluster the
//! segments of one SKU spread evenly over the masters.
//!
//! A Redis Cluster puts a key in one of 16,384 slots by the CRC16 of its hash tag, and each
//! master owns some slots. Left to the hash of `{<sku>#<i>}`, where a segment lands is luck: for
//! one SKU of 16 segments on 3 masters, 8 landed on one master, which then did 1.45× the mean
//! work of the sale. So each segment's tag gets a short suffix, `{<sku>#<i>.<k>}`, with `k`
//! searched (a few CRC16s) until the slot is owned by the master this segment should go to: the
//! least loaded one that is not the previous segment's.
//!
//! **Placement is a hint, never an assumption.** Slots move (resharding, failover); the keys move
//! with them and every script still touches one slot, so correctness never depends on where a
//! slot lives. What placement buys is throughput: one hot SKU's work spread over every master.
//!
//! **Placement is chosen once per segment index and kept.** The suffixes are stored in the SKU's
//! metadata at the load that first uses the index (append-only: a reload keeps every suffix the
//! SKU ever had and only adds suffixes for new indexes), so every instance agrees, and a reload
//! keeps writing each segment under the same key. That is what makes a reload safe: an instance
//! that still believes in the old generation finds its segment overwritten by the new one
//! (`Stale`), never an old segment left behind under a key the new generation no longer uses.
//!
//! No I/O here: the slot map comes in as a [`SlotMap`], built by the Redis store from fred's
//! cached cluster state. Touches `ids` (the SKU), `segments` (its hash) and fred's CRC16.

use crate::ids::Sku;
use crate::segments::fnv1a;
use std::sync::Arc;

/// Number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// The tag suffixes of a SKU's segments: segment `i` lives under `{<sku>#<i>.<suffix(i)>}`. Empty
/// (unplaced) on a single Redis, and for SKUs loaded before placement existed: their segments
/// keep the plain tag `{<sku>#<i>}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement(Arc<[u16]>);

impl Placement {
    /// No placement: every segment keeps the plain tag.
    pub fn unplaced() -> Self {
        Self::default()
    }

    /// The suffix of segment `index`; `None` when the SKU is unplaced (or, which a stored
    /// placement never allows, the index is beyond it).
    pub fn suffix(&self, index: u32) -> Option<u16> {
        self.0.get(index as usize).copied()
    }

    /// True when the segments carry suffixes.
    pub fn is_placed(&self) -> bool {
        !self.0.is_empty()
    }

    /// How many segment indexes have a suffix.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no segment index has a suffix.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The stored form: suffixes joined by commas (`""` when unplaced).
    pub fn encode(&self) -> String {
        let parts: Vec<String> = self.0.iter().map(u16::to_string).collect();
        parts.join(",")
    }

    /// Parses the stored form; `None` when malformed.
    pub fn decode(s: &str) -> Option<Self> {
        if s.is_empty() {
            return Some(Self::unplaced());
        }
        let v: Option<Vec<u16>> = s.split(',').map(|p| p.parse().ok()).collect();
        v.map(|v| Self(v.into()))
    }

    /// The hash tag (without braces) of segment `index` of `sku` under this placement.
    pub fn tag(&self, sku: &Sku, index: u32) -> String {
        tag(sku, index, self.suffix(index))
    }
}

impl From<Vec<u16>> for Placement {
    fn from(v: Vec<u16>) -> Self {
        Self(v.into())
    }
}

/// The hash tag (without braces) of segment `index` of `sku` with `suffix`: `<sku>#<i>` or
/// `<sku>#<i>.<k>`. Unambiguous: a SKU never contains `#`, and `<i>` is digits only.
pub fn tag(sku: &Sku, index: u32, suffix: Option<u16>) -> String {
    match suffix {
        Some(k) => format!("{sku}#{index}.{k}"),
        None => format!("{sku}#{index}"),
    }
}

/// The slot Redis Cluster gives a key (CRC16 of its hash tag, mod 16,384).
pub fn slot_of_key(key: &str) -> u16 {
    fred::types::cluster::ClusterRouting::hash_key(key.as_bytes())
}

/// The slot of hash tag `tag` (a key `{tag}...`).
pub fn slot_of_tag(tag: &str) -> u16 {
    slot_of_key(&format!("{{{tag}}}"))
}

/// Who owns which slot: each master as the slot ranges it serves. Masters are numbered by their
/// lowest slot, so every instance reading the same cluster numbers them alike.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotMap {
    /// (first slot, last slot, master number), sorted by first slot.
    ranges: Vec<(u16, u16, usize)>,
    /// Master names, by number.
    masters: Vec<String>,
}

impl SlotMap {
    /// A map from `(first slot, last slot, master name)` ranges (inclusive, as `CLUSTER SLOTS`
    /// reports them).
    pub fn new(ranges: impl IntoIterator<Item = (u16, u16, String)>) -> Self {
        let mut ranges: Vec<(u16, u16, String)> = ranges.into_iter().collect();
        ranges.sort();
        let mut masters: Vec<String> = Vec::new();
        let ranges = ranges
            .into_iter()
            .map(|(a, b, name)| {
                let n = match masters.iter().position(|m| *m == name) {
                    Some(n) => n,
                    None => {
                        masters.push(name);
                        masters.len() - 1
                    }
                };
                (a, b, n)
            })
            .collect();
        Self { ranges, masters }
    }

    /// Number of masters.
    pub fn masters(&self) -> usize {
        self.masters.len()
    }

    /// The name of master `n`.
    pub fn master_name(&self, n: usize) -> Option<&str> {
        self.masters.get(n).map(String::as_str)
    }

    /// The master serving `slot`, if the map covers it.
    pub fn master_of(&self, slot: u16) -> Option<usize> {
        let i = self.ranges.partition_point(|r| r.0 <= slot);
        let r = self.ranges.get(i.checked_sub(1)?)?;
        (slot <= r.1).then_some(r.2)
    }
}

/// Where one segment lives now: for `status` and tools.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SegmentHome {
    /// Segment index.
    pub index: u32,
    /// Its hash tag (without braces).
    pub tag: String,
    /// The slot of that tag.
    pub slot: u16,
    /// The master serving the slot now, as the client's slot map says (`host:port`).
    pub master: Option<String>,
}

/// Tries per segment before a master is given up on (a master serving one slot in 16,384 needs
/// ~16k tries on average; the search is a few µs per thousand).
const MAX_TRIES: u32 = 1 << 16;

/// `existing` extended to `segments` indexes: each new segment `i` gets the suffix that puts it
/// on the least loaded master (counting the segments already placed, as the map places them
/// now) other than segment `i − 1`'s, ties broken in an order that starts at a SKU-dependent
/// master (so SKUs of few segments do not all start on master 0). Deterministic: the same
/// SKU, existing placement and map give the same answer on every instance.
///
/// An unplaced `existing` of a SKU that already has segments is not extended (its keys must not
/// change); the caller passes [`Placement::unplaced`] and `existing_segments = 0` for a new SKU.
/// An empty map (a single Redis) places nothing.
pub fn extend(sku: &Sku, existing: &Placement, segments: u32, map: &SlotMap) -> Placement {
    let m = map.masters();
    if m == 0 || existing.len() >= segments as usize {
        return existing.clone();
    }
    let mut load = vec![0u32; m];
    let mut prev = None;
    for i in 0..existing.len() as u32 {
        prev = map.master_of(slot_of_tag(&existing.tag(sku, i)));
        if let Some(p) = prev {
            load[p] += 1;
        }
    }
    let start = (fnv1a(sku.as_str().as_bytes()) % m as u64) as usize;
    let mut out: Vec<u16> = existing.0.to_vec();
    // Masters no suffix reached once (a master serving a handful of slots): not searched again.
    let mut unreachable = vec![false; m];
    for i in existing.len() as u32..segments {
        let mut order: Vec<usize> = (0..m).map(|r| (start + i as usize + r) % m).collect();
        // Least loaded first; among equals, not the previous segment's master. (While every
        // master is within one segment of the others, the previous master is never the only
        // least loaded one, so neighbours always differ.)
        order.sort_by_key(|&n| (load[n], Some(n) == prev));
        let mut placed = None;
        let candidates: Vec<usize> = order.iter().copied().filter(|&n| !unreachable[n]).collect();
        for want in candidates {
            if let Some(k) = (0..MAX_TRIES)
                .find(|&k| map.master_of(slot_of_tag(&tag(sku, i, Some(k as u16)))) == Some(want))
            {
                placed = Some((k as u16, want));
                break;
            }
            unreachable[want] = true;
        }
        // A map that covers no slot a search can hit: keep suffix 0 (placement is a hint).
        let (k, master) = placed.unwrap_or((0, order[0]));
        load[master] += 1;
        prev = Some(master);
        out.push(k);
    }
    Placement(out.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `n` masters with equal contiguous ranges, as `redis-cli --cluster create` makes them.
    fn even(n: u16) -> SlotMap {
        let w = SLOTS / n;
        SlotMap::new((0..n).map(|i| {
            let end = if i == n - 1 {
                SLOTS - 1
            } else {
                (i + 1) * w - 1
            };
            (i * w, end, format!("m{i}"))
        }))
    }

    fn masters_of(sku: &Sku, p: &Placement, map: &SlotMap) -> Vec<usize> {
        (0..p.len() as u32)
            .map(|i| map.master_of(slot_of_tag(&p.tag(sku, i))).unwrap())
            .collect()
    }

    #[test]
    fn slots_match_redis() {
        // Values from `redis-cli CLUSTER KEYSLOT` on Redis 7.0.
        assert_eq!(slot_of_key("foo"), 12182);
        assert_eq!(slot_of_key("{user1000}.following"), 3443);
        assert_eq!(slot_of_tag("user1000"), 3443);
    }

    #[test]
    fn sixteen_segments_on_three_masters_spread_six_five_five() {
        let map = even(3);
        let sku = Sku::new("flash-1").unwrap();
        let p = extend(&sku, &Placement::unplaced(), 16, &map);
        let ms = masters_of(&sku, &p, &map);
        let mut count = [0; 3];
        for m in &ms {
            count[*m] += 1;
        }
        count.sort();
        assert_eq!(count, [5, 5, 6], "{ms:?}");
        assert!(ms.windows(2).all(|w| w[0] != w[1]), "{ms:?}");
    }

    #[test]
    fn a_reload_keeps_every_suffix_and_places_only_new_indexes() {
        let map = even(3);
        let sku = Sku::new("grow").unwrap();
        let p4 = extend(&sku, &Placement::unplaced(), 4, &map);
        let p9 = extend(&sku, &p4, 9, &map);
        assert_eq!(&p9.0[..4], &p4.0[..]);
        assert_eq!(
            extend(&sku, &p9, 2, &map),
            p9,
            "fewer segments keep all suffixes"
        );
        let ms = masters_of(&sku, &p9, &map);
        assert!(ms.windows(2).all(|w| w[0] != w[1]), "{ms:?}");
    }

    #[test]
    fn a_single_redis_places_nothing() {
        let sku = Sku::new("one").unwrap();
        let p = extend(&sku, &Placement::unplaced(), 8, &SlotMap::default());
        assert!(!p.is_placed());
        assert_eq!(p.tag(&sku, 3), "one#3");
    }

    #[test]
    fn stored_form_round_trips_and_rejects_junk() {
        let p = Placement::from(vec![3, 0, 65535]);
        assert_eq!(p.encode(), "3,0,65535");
        assert_eq!(Placement::decode(&p.encode()), Some(p));
        assert_eq!(Placement::decode(""), Some(Placement::unplaced()));
        assert_eq!(Placement::decode("1,,2"), None);
        assert_eq!(Placement::decode("70000"), None);
    }

    #[test]
    fn a_fragmented_map_is_still_spread() {
        // After resharding: master 0 owns scattered small ranges.
        let map = SlotMap::new(vec![
            (0, 99, "a".to_string()),
            (100, 8000, "b".to_string()),
            (8001, 8100, "a".to_string()),
            (8101, 16383, "c".to_string()),
        ]);
        let sku = Sku::new("frag").unwrap();
        let p = extend(&sku, &Placement::unplaced(), 9, &map);
        let ms = masters_of(&sku, &p, &map);
        for m in 0..3 {
            assert_eq!(ms.iter().filter(|x| **x == m).count(), 3, "{ms:?}");
        }
    }

    proptest! {
        /// Any SKU, 1..=64 segments on 1..=12 masters: the busiest master holds at most one
        /// segment more than the least busy, and no two consecutive segments share a master.
        #[test]
        fn spread_is_even_and_neighbours_differ(
            name in "[a-z0-9_.-]{1,24}", segments in 1u32..=64, masters in 1u16..=12,
        ) {
            let map = even(masters);
            let sku = Sku::new(name).unwrap();
            let p = extend(&sku, &Placement::unplaced(), segments, &map);
            prop_assert_eq!(p.len(), segments as usize);
            let ms = masters_of(&sku, &p, &map);
            let mut count = vec![0u32; masters as usize];
            for m in &ms { count[*m] += 1; }
            let (lo, hi) = (count.iter().min().unwrap(), count.iter().max().unwrap());
            prop_assert!(hi - lo <= 1, "{:?}", count);
            if masters > 1 {
                prop_assert!(ms.windows(2).all(|w| w[0] != w[1]), "{:?}", ms);
            }
        }
    }
}
