//! Pure segment maths: how stock is split, where a request lives, and what keys are called.
//!
//! No I/O here, so all of it is unit-tested without Redis.
//!
//! # Key layout (Redis-Cluster-ready)
//! `<seg>` is segment i's hash tag: `<sku>#<i>` on a single Redis, `<sku>#<i>.<k>` when the SKU
//! was loaded on a cluster (the suffix `k` places the segment on a chosen master; see
//! [`crate::placement`]).
//! ```text
//! <prefix>:{<sku>}:meta                      SKU metadata: generation, segments, units loaded,
//!                                            per-user limit, state, placement
//! <prefix>:{<seg>}:seg                       segment i: generation, stock, sold, reserved,
//!                                            loaded, restocked, moved in / out, per-user
//!                                            limit, home function
//! <prefix>:{<seg>}:g<generation>:led         with a per-user limit, the ledgers of every
//!                                            user homed at segment i: one field per user, its
//!                                            request records and units held
//! <prefix>:{<seg>}:g<generation>:w<w>:<b>    without one, the records of the sales made at
//!                                            segment i in window b of w ms (expires whole)
//! <prefix>:{<seg>}:g<generation>:rec         without one, the records of segment i's
//!                                            reservations and order items
//! <prefix>:{<seg>}:g<generation>:rs:<req id> restock record kept beside segment i
//! <prefix>:{<seg>}:g<generation>:resv        segment i's reservations, by expiry
//! <prefix>:{<seg>}:g<generation>:in          transfers segment i credited
//! <prefix>:{<seg>}:g<generation>:tx / :txq   transfers segment i debited / not yet done
//! <prefix>:{<seg>}:lock                      segment i's lock (lock strategies)
//! <prefix>:skus                              every SKU loaded (the sweeper's list)
//! ```
//! Every key of one segment shares the hash tag `{<seg>}`, so one script touching them is
//! atomic on a Redis Cluster; different segments have different tags and spread over slots;
//! the metadata has a tag of its own. `#` cannot occur in a SKU, so tags never collide. Keys
//! carry the load generation, so a reload starts with clean ledgers.

use crate::ids::{RequestId, Sku, UserId};

/// Splits `total` units into `n` segments whose sizes differ by at most one unit
/// (the first `total % n` segments get the extra unit): 100 over 10 is 10 × 10, 7 over 3 is
/// 3, 2, 2.
pub fn split(total: u64, n: u32) -> Vec<u64> {
    assert!(n > 0, "split into zero segments");
    let n64 = u64::from(n);
    let (base, extra) = (total / n64, total % n64);
    (0..n64).map(|i| base + u64::from(i < extra)).collect()
}

/// FNV-1a, 64 bit: stable across processes, platforms and versions (unlike `DefaultHasher`),
/// which matters because every engine instance must agree on a request's home segment.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_from(0xcbf2_9ce4_8422_2325, bytes)
}

/// FNV-1a continued from state `h` over `bytes`.
fn fnv1a_from(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The version of how requests are placed and remembered — the home function below and the
/// ledgers' layout in Redis — kept in the SKU's metadata and in every segment at load: an
/// instance that places requests or keeps ledgers otherwise refuses to sell (an error naming
/// both versions; the script itself answers stale) instead of selling one request id at two
/// homes, or one user past the limit, during a rolling deploy. 2: a limited segment's ledgers
/// are fields of one hash. 3: a new buyer's one-unit sale is kept as its request id alone (the
/// ledger's short form), which a build of 2 cannot read. 4: without a limit, records are fields
/// of hashes shared by a segment's users (sales windows and the record hash), not a key per
/// user.
pub const HOME_FN: u32 = 4;

/// A request's home segment (home function [`HOME_FN`]): with a per-user limit, the user's
/// (every request of the user lands where the user's ledger is); without one, the (user,
/// request id) pair's, so one busy user is not one hot segment. FNV-1a, then SplitMix64's
/// finaliser: stable across processes, versions and platforms. The finaliser matters: FNV-1a's
/// low bits depend only on the low bits of each byte, so ids that count up in step (`u17`,
/// `order-17`) fell on half of 16 segments without it.
pub fn home(user: &UserId, request_id: &RequestId, segments: u32, by_user: bool) -> u32 {
    let mut h = fnv1a(user.as_str().as_bytes());
    if !by_user {
        // A separator no id contains, then the request id: (u, r) pairs never collide.
        h = fnv1a_from(h, b" ");
        h = fnv1a_from(h, request_id.as_str().as_bytes());
    }
    (mix(h) % u64::from(segments)) as u32
}

/// SplitMix64's finaliser: every output bit depends on every input bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `units` taken at segment `segment`: an outbox event's `parts` (one, at the request's home,
/// for every event written today; the stored form is a list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Part {
    /// Segment index.
    pub segment: u32,
    /// Units taken there.
    pub units: u64,
}

/// Encodes parts as `"3:1,5:2"` (an outbox event's `parts`, and the orders table's column).
pub fn encode_parts(parts: &[Part]) -> String {
    let mut s = String::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&format!("{}:{}", p.segment, p.units));
    }
    s
}

/// Decodes [`encode_parts`]' format; `None` on anything malformed.
pub fn decode_parts(s: &str) -> Option<Vec<Part>> {
    s.split(',')
        .map(|p| {
            let (a, b) = p.split_once(':')?;
            Some(Part {
                segment: a.parse().ok()?,
                units: b.parse().ok()?,
            })
        })
        .collect()
}

/// Key names under one prefix (namespace).
#[derive(Debug, Clone)]
pub struct Keyspace {
    prefix: String,
}

impl Keyspace {
    /// A keyspace under `prefix` (validated by the caller).
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// The prefix every key name starts with (then `:`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The SKU metadata hash.
    pub fn meta(&self, sku: &Sku) -> String {
        format!("{}:{{{}}}:meta", self.prefix, sku)
    }

    /// The hash of the segment whose hash tag is `tag` (see [`crate::placement::tag`]:
    /// `<sku>#<i>`, or `<sku>#<i>.<k>` when placed).
    pub fn segment(&self, tag: &str) -> String {
        format!("{}:{{{tag}}}:seg", self.prefix)
    }

    /// The ledgers of segment `tag` in `generation` under a per-user limit: one hash, a field
    /// per user (its request records and the units it holds).
    pub fn limited_ledgers(&self, tag: &str, generation: u64) -> String {
        format!("{}:{{{tag}}}:g{generation}:led", self.prefix)
    }

    /// Segment `tag`'s record hash in `generation` without a per-user limit: the records of its
    /// reservations and order items, field `<user> <request id>` (sales' records are in sales
    /// windows, [`sales_window`](Self::sales_window)).
    pub fn records(&self, tag: &str, generation: u64) -> String {
        format!("{}:{{{tag}}}:g{generation}:rec", self.prefix)
    }

    /// Segment `tag`'s sales window `b` of `w` ms in `generation` without a per-user limit:
    /// the records of the sales made from `b·w` ms up to `(b + 1)·w` (server clock), field
    /// `<user> <request id>`; Redis drops it at `(b + 2)·w`.
    pub fn sales_window(&self, tag: &str, generation: u64, w: u64, b: u64) -> String {
        format!("{}:{{{tag}}}:g{generation}:w{w}:{b}", self.prefix)
    }

    /// Segment `tag`'s hold index (ZSET of `<user> <request id>` of the order items held
    /// there, by hint) in `generation`.
    pub fn holds(&self, tag: &str, generation: u64) -> String {
        format!("{}:{{{tag}}}:g{generation}:hold", self.prefix)
    }

    /// Order `id`'s record (`{o<shard>}`: order records spread over slots of their own).
    pub fn order(&self, shard: u64, id: &str) -> String {
        format!("{}:{{o{shard}}}:order:{id}", self.prefix)
    }

    /// Segment `tag`'s reservation index (ZSET of `<user> <request id>` by expiry) in
    /// `generation`.
    pub fn reservations(&self, tag: &str, generation: u64) -> String {
        format!("{}:{{{tag}}}:g{generation}:resv", self.prefix)
    }

    /// Transfers segment `tag` credited in `generation` (hash: transfer id → units).
    pub fn credits(&self, tag: &str, generation: u64) -> String {
        format!("{}:{{{tag}}}:g{generation}:in", self.prefix)
    }

    /// Transfers segment `tag` debited in `generation` (hash: transfer id →
    /// `<dest>:<units>:<lease end ms>`, lease end 0 once done).
    pub fn transfers(&self, tag: &str, generation: u64) -> String {
        format!("{}:{{{tag}}}:g{generation}:tx", self.prefix)
    }

    /// Segment `tag`'s transfers not yet done (ZSET of transfer ids by lease end) in
    /// `generation`: the sweeper finds them there.
    pub fn transfers_due(&self, tag: &str, generation: u64) -> String {
        format!("{}:{{{tag}}}:g{generation}:txq", self.prefix)
    }

    /// Every key of segment `tag` that belongs to `generation` (a pattern for `SCAN MATCH`;
    /// the tag has no glob characters: its charset is checked).
    pub fn generation_keys(&self, tag: &str, generation: u64) -> String {
        format!("{}:{{{tag}}}:g{generation}:*", self.prefix)
    }

    /// The set of SKUs ever loaded (the sweeper's list).
    pub fn skus(&self) -> String {
        format!("{}:skus", self.prefix)
    }

    /// Segment `tag`'s outbox stream (all generations): the selling scripts append an event
    /// per change of a request's units when the SKU's outbox is on (see [`crate::orders`]).
    pub fn outbox(&self, tag: &str) -> String {
        format!("{}:{{{tag}}}:out", self.prefix)
    }

    /// Segment `tag`'s dead-letter stream: outbox events no handler could take.
    pub fn dead_letters(&self, tag: &str) -> String {
        format!("{}:{{{tag}}}:dead", self.prefix)
    }

    /// Segment `tag`'s handler failure reasons (hash: entry id → last reason), read when an
    /// event moves to the dead letters.
    pub fn failures(&self, tag: &str) -> String {
        format!("{}:{{{tag}}}:why", self.prefix)
    }

    /// The set of SKUs ever loaded with the outbox on (consumers discover them here).
    pub fn outbox_skus(&self) -> String {
        format!("{}:outbox", self.prefix)
    }

    /// The lock of segment `tag` (lock strategies; same tag as the segment).
    pub fn lock(&self, tag: &str) -> String {
        format!("{}:{{{tag}}}:lock", self.prefix)
    }

    /// The restock record of `rid` kept beside segment `tag` in generation `generation`.
    pub fn restock(&self, tag: &str, generation: u64, rid: &RequestId) -> String {
        format!("{}:{{{tag}}}:g{generation}:rs:{rid}", self.prefix)
    }
}

/// The hash tag of a key (what Redis Cluster hashes), as Redis defines it.
pub fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn splits_evenly() {
        assert_eq!(split(100, 10), vec![10; 10]);
        assert_eq!(split(7, 3), vec![3, 2, 2]);
        assert_eq!(split(2, 4), vec![1, 1, 0, 0]);
        assert_eq!(split(0, 2), vec![0, 0]);
    }

    proptest! {
        #[test]
        fn split_conserves_and_balances(total in 0u64..10_000_000, n in 1u32..1024) {
            let s = split(total, n);
            prop_assert_eq!(s.len(), n as usize);
            prop_assert_eq!(s.iter().sum::<u64>(), total);
            let (mn, mx) = (s.iter().min().unwrap(), s.iter().max().unwrap());
            prop_assert!(mx - mn <= 1);
        }

        #[test]
        fn parts_round_trip(parts in proptest::collection::vec((0u32..1024, 1u64..1_000_000), 1..20)) {
            let parts: Vec<Part> = parts.into_iter().map(|(segment, units)| Part { segment, units }).collect();
            prop_assert_eq!(decode_parts(&encode_parts(&parts)), Some(parts));
        }
    }

    #[test]
    fn keys_of_one_segment_share_a_tag_and_segments_differ() {
        use crate::placement::tag;
        let ks = Keyspace::new("ss");
        let sku = Sku::new("phone-1").unwrap();
        let rid = RequestId::new("r:1").unwrap();
        for suffix in [None, Some(17)] {
            let t3 = tag(&sku, 3, suffix);
            let seg = ks.segment(&t3);
            assert_eq!(hash_tag(&seg), hash_tag(&ks.records(&t3, 7)));
            assert_eq!(hash_tag(&seg), hash_tag(&ks.sales_window(&t3, 7, 1000, 42)));
            assert_eq!(hash_tag(&seg), hash_tag(&ks.restock(&t3, 7, &rid)));
            assert_eq!(hash_tag(&seg), hash_tag(&ks.reservations(&t3, 7)));
            assert_eq!(hash_tag(&seg), hash_tag(&ks.credits(&t3, 7)));
            assert_eq!(hash_tag(&seg), hash_tag(&ks.transfers(&t3, 7)));
            assert_eq!(hash_tag(&seg), hash_tag(&ks.transfers_due(&t3, 7)));
            assert_eq!(hash_tag(&seg), hash_tag(&ks.lock(&t3)));
            assert_ne!(hash_tag(&seg), hash_tag(&ks.segment(&tag(&sku, 4, suffix))));
            assert_ne!(hash_tag(&seg), hash_tag(&ks.meta(&sku)));
        }
        assert_eq!(ks.segment(&tag(&sku, 3, None)), "ss:{phone-1#3}:seg");
        assert_eq!(ks.segment(&tag(&sku, 3, Some(17))), "ss:{phone-1#3.17}:seg");
        assert_eq!(hash_tag(&ks.meta(&sku)), "phone-1");
    }

    #[test]
    fn home_is_stable_and_spreads() {
        let n = 16;
        let mut by_pair = vec![0u32; n as usize];
        let mut by_user = vec![0u32; n as usize];
        let one = UserId::new("busy").unwrap();
        let mut by_pair_in_step = vec![0u32; n as usize];
        for i in 0..16_000 {
            let rid = RequestId::new(format!("req-{i}")).unwrap();
            let user = UserId::new(format!("user-{i}")).unwrap();
            // Ids counting up in step: plain FNV-1a put them on 8 of the 16 segments.
            by_pair_in_step
                [home(&UserId::new(format!("u{i}")).unwrap(), &rid, n, false) as usize] += 1;
            let h = home(&user, &rid, n, true);
            assert_eq!(h, home(&user, &RequestId::new("other").unwrap(), n, true));
            by_user[h as usize] += 1;
            let p = home(&one, &rid, n, false);
            assert_eq!(p, home(&one, &rid, n, false));
            by_pair[p as usize] += 1;
        }
        // 1000 expected per segment; FNV over sequential ids stays well within ±20 %: one
        // busy user without a limit spreads over every segment.
        for counts in [&by_user, &by_pair, &by_pair_in_step] {
            assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
        }
        // Published FNV-1a test vectors: all instances, versions and platforms must agree.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
