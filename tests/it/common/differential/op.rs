//! The store steps of a differential case ([`Op`]) and their generators.
//!
//! Segment indexes (`seg`, `donor`, `dest`) are taken modulo the SKU's segment count; `nth`
//! picks an earlier request, reservation or transfer counting back from the latest (0), modulo
//! their number, so shrinking keeps the target. Small pools of users and request ids make ids
//! repeat (replays, conflicts, the same id under another user).
//!
//! Carts: order items (`o<k>#1`, a pool of its own) are held at a home that follows the user
//! and id ([`item_home`]), so a settle of an id never held meets its late hold there; the
//! case's orders (`k0`..`k3` of a user named after the case: the Redis stores are shared by
//! every case) take each step of an order's record.

use super::{LONG_MS, SHORT_MS};
use proptest::prelude::*;
use proptest::strategy::Strategy;
use shardstock::store::TransferId;

/// A timer: short (within a case) or long (never reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum T {
    Short(u64),
    Long,
}

impl T {
    pub fn ms(self) -> u64 {
        match self {
            T::Short(ms) => ms,
            T::Long => LONG_MS,
        }
    }

    pub fn is_short(self) -> bool {
        matches!(self, T::Short(_))
    }
}

/// Transfer ids a case draws from: small ones, both sides of 2^53 (where a Lua double stops
/// being exact), 10^15 (the scripts' integer bound, which ids must not be held to) and the top
/// of the u64 range. A pool, so ids repeat: at one donor a repeat replays; at two donors
/// crediting one home, the second credit of the id is not applied (the engine draws ids at
/// random from the whole range, so it never repeats one).
pub const TRANSFER_IDS: [TransferId; 12] = [
    1,
    2,
    7,
    (1 << 53) - 1,
    1 << 53,
    (1 << 53) + 1,
    1_000_000_000_000_000,
    1_000_000_000_000_001,
    12_345_678_901_234_567_890,
    u64::MAX / 2,
    u64::MAX - 1,
    u64::MAX,
];

/// How an earlier request is sent again ([`Op::Resend`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Again {
    /// Same user, id, qty and kind: a replay (or, once its record is forgotten, a new request).
    Same,
    /// Same user and id, another qty: `mismatch qty`.
    OtherQty,
    /// Same user and id, the other kind: `mismatch kind`.
    OtherKind,
    /// Same id and qty, another user: another request.
    OtherUser(u8),
}

/// Which item a [`Op::Settle`] settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    /// The nth order item named so far (held, or settled before any hold).
    Item(usize),
    /// The nth request sent, whatever its kind (a sale's or a reservation's id: mismatch).
    Sent(usize),
    /// Item `o<rid>#1` of `u<user>` at its home, of `qty` units, held or not (never held:
    /// a void writes a voided record, a post is unknown).
    Fresh { user: u8, rid: u8, qty: u64 },
}

/// One step on an order's record ([`shardstock::cart::OrderStep`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OStep {
    /// Open with a hold of `hold` for items `ITEMS[items]` (another list: a conflict).
    Open {
        hold: T,
        items: usize,
    },
    Held,
    Refuse,
    Confirm,
    Cancel,
    Expire,
    Read,
}

/// The item lists an order opens with.
pub const ITEMS: [&str; 2] = ["a:1,b:2", "a:2"];

/// The home segment of order item `o<rid>#1` of `u<user>` among `n` segments.
pub fn item_home(user: u8, rid: u8, n: u32) -> u32 {
    (u32::from(user) * 3 + u32::from(rid)) % n
}

/// One step of a differential case.
#[derive(Debug, Clone)]
pub enum Op {
    /// A (re)load with `load --replace` semantics: load_begin, load_segment of each segment,
    /// drop_segment of the old generation's extra segments, load_commit.
    Load {
        total: u64,
        segments: u32,
        limit: u64,
    },
    /// `sell` at segment `seg`: a sale (`resv: None`) or a reservation held `resv`.
    Sell {
        seg: u32,
        user: u8,
        rid: u8,
        qty: u64,
        resv: Option<T>,
        ttl: T,
    },
    /// `sell` at the destination of the nth transfer, crediting every transfer debited to that
    /// destination so far in this generation (credited ones again: re-sent credits); `qty` 0:
    /// credits only; `resv`: the request is a reservation (held long).
    Credit {
        nth: usize,
        user: u8,
        rid: u8,
        qty: u64,
        resv: bool,
    },
    /// `transfer` (a debit at `donor` to `dest`) with id `TRANSFER_IDS[id]`.
    Transfer {
        donor: u32,
        dest: u32,
        want: u64,
        floor: u64,
        lease: T,
        id: usize,
    },
    /// The nth transfer's id sent again at its donor with other fields (it replays, renewing
    /// its lease unless done).
    TransferAgain { nth: usize, want: u64, lease: T },
    /// `transfer_done` of the nth transfer (at its donor).
    TransferDone { nth: usize },
    /// `transfers_due` at `donor`, at most `max`.
    Due { donor: u32, max: usize },
    /// `restock` of `qty` (of a request for `qty + extra`) at `seg` under request id `rid`.
    Restock {
        seg: u32,
        rid: u8,
        qty: u64,
        extra: u64,
        ttl: T,
    },
    /// `reserve_end` of the nth reservation sent: 0 confirm, 1 cancel, 2 inspect.
    End { nth: usize, action: u8 },
    /// The nth request sent, sent again.
    Resend { nth: usize, how: Again },
    /// `survey` of `seg`, with or without the detail of live reservations (the state check
    /// surveys every segment with detail after each step anyway).
    Survey { seg: u32, detail: bool },
    /// `peek` of `seg` (the survey's read, written nothing), with or without the detail.
    Peek { seg: u32, detail: bool },
    /// `record` of the nth request sent.
    Record { nth: usize },
    /// `sell` of order item `o<rid>#1` of `u<user>` (`order_item`) at its home, the hint
    /// `hint` (short: due to the sweeper within the case; the item itself never expires).
    Hold {
        user: u8,
        rid: u8,
        qty: u64,
        hint: T,
    },
    /// The nth order item named so far held again as first named (same qty): a replay, or the
    /// late hold after a void (it takes nothing).
    Rehold { nth: usize },
    /// `settle` of an item: `post` or void, `other_qty` (qty off: mismatch), records of ended
    /// items kept `ttl`.
    Settle {
        on: On,
        post: bool,
        other_qty: bool,
        ttl: T,
    },
    /// `holds_due` at `seg`, at most `max`.
    HoldsDue { seg: u32, max: usize },
    /// `order` step `step` on the case's order `k<oid>`, decided records kept `ttl`.
    Order { oid: u8, step: OStep, ttl: T },
    /// A step addressed to the previous generation (after a reload): 0 a sale, 1 a credit of
    /// one of its transfers at the transfer's destination, 2 a transfer, 3 a restock, 4 the end
    /// of one of its reservations, 5 a survey, 6 transfers_due, 7 transfer_done, 8 a record,
    /// 9 holds_due, 10 the void of one of its order items, 11 an order item's hold.
    Stale { seg: u32, what: u8, nth: usize },
    /// Sleep past every short timer. The state read after it does not survey (a survey
    /// returns expired reservations): the next step finds them expired but not yet returned.
    Advance,
}

fn timer() -> impl Strategy<Value = T> {
    prop_oneof![
        3 => Just(T::Long),
        1 => SHORT_MS.prop_map(T::Short),
    ]
}

fn on() -> impl Strategy<Value = On> {
    prop_oneof![
        4 => (0usize..32).prop_map(On::Item),
        1 => (0usize..32).prop_map(On::Sent),
        2 => (0u8..3, 0u8..4, 1u64..4).prop_map(|(user, rid, qty)| On::Fresh { user, rid, qty }),
    ]
}

fn ostep() -> impl Strategy<Value = OStep> {
    prop_oneof![
        3 => (prop_oneof![Just(T::Long), SHORT_MS.prop_map(T::Short)], 0..ITEMS.len())
            .prop_map(|(hold, items)| OStep::Open { hold, items }),
        2 => Just(OStep::Held),
        1 => Just(OStep::Refuse),
        2 => Just(OStep::Confirm),
        1 => Just(OStep::Cancel),
        1 => Just(OStep::Expire),
        1 => Just(OStep::Read),
    ]
}

fn again() -> impl Strategy<Value = Again> {
    prop_oneof![
        3 => Just(Again::Same),
        1 => Just(Again::OtherQty),
        1 => Just(Again::OtherKind),
        2 => (0u8..4).prop_map(Again::OtherUser),
    ]
}

/// One step, weighted toward sales and transfers.
pub fn op() -> impl Strategy<Value = Op> {
    let seg = 0u32..8;
    prop_oneof![
        1 => (0u64..40, 1u32..6, prop_oneof![2 => Just(0u64), 1 => 1u64..4])
            .prop_map(|(total, segments, limit)| Op::Load { total, segments, limit }),
        10 => (seg.clone(), 0u8..4, 0u8..10, 1u64..6,
               prop_oneof![3 => Just(None), 2 => timer().prop_map(Some)], timer())
            .prop_map(|(seg, user, rid, qty, resv, ttl)| Op::Sell { seg, user, rid, qty, resv, ttl }),
        4 => (0usize..32, 0u8..4, 10u8..20, 0u64..4, proptest::bool::weighted(0.3))
            .prop_map(|(nth, user, rid, qty, resv)| Op::Credit { nth, user, rid, qty, resv }),
        6 => (seg.clone(), seg.clone(), 1u64..12, 0u64..4, timer(), 0..TRANSFER_IDS.len())
            .prop_map(|(donor, dest, want, floor, lease, id)| Op::Transfer { donor, dest, want, floor, lease, id }),
        1 => (0usize..32, 1u64..12, timer())
            .prop_map(|(nth, want, lease)| Op::TransferAgain { nth, want, lease }),
        2 => (0usize..32).prop_map(|nth| Op::TransferDone { nth }),
        2 => (seg.clone(), prop_oneof![3 => Just(256usize), 1 => 1usize..3])
            .prop_map(|(donor, max)| Op::Due { donor, max }),
        2 => (seg.clone(), 0u8..4, 1u64..8, 0u64..3, timer())
            .prop_map(|(seg, rid, qty, extra, ttl)| Op::Restock { seg, rid, qty, extra, ttl }),
        4 => (0usize..32, 0u8..3).prop_map(|(nth, action)| Op::End { nth, action }),
        4 => (0usize..32, again()).prop_map(|(nth, how)| Op::Resend { nth, how }),
        1 => (seg.clone(), any::<bool>()).prop_map(|(seg, detail)| Op::Survey { seg, detail }),
        1 => (seg.clone(), any::<bool>()).prop_map(|(seg, detail)| Op::Peek { seg, detail }),
        2 => (0usize..32).prop_map(|nth| Op::Record { nth }),
        5 => (0u8..3, 0u8..4, 1u64..4, timer())
            .prop_map(|(user, rid, qty, hint)| Op::Hold { user, rid, qty, hint }),
        2 => (0usize..32).prop_map(|nth| Op::Rehold { nth }),
        5 => (on(), any::<bool>(), proptest::bool::weighted(0.15), timer())
            .prop_map(|(on, post, other_qty, ttl)| Op::Settle { on, post, other_qty, ttl }),
        2 => (seg.clone(), prop_oneof![3 => Just(256usize), 1 => 0usize..3])
            .prop_map(|(seg, max)| Op::HoldsDue { seg, max }),
        6 => (0u8..3, ostep(), timer()).prop_map(|(oid, step, ttl)| Op::Order { oid, step, ttl }),
        1 => (seg, 0u8..12, 0usize..32).prop_map(|(seg, what, nth)| Op::Stale { seg, what, nth }),
        1 => Just(Op::Advance),
    ]
}

/// A case: a first load, then up to `len` steps.
pub fn case(len: usize) -> impl Strategy<Value = Vec<Op>> {
    (
        (
            0u64..40,
            1u32..6,
            prop_oneof![2 => Just(0u64), 1 => 1u64..4],
        ),
        proptest::collection::vec(op(), 1..len),
    )
        .prop_map(|((total, segments, limit), ops)| {
            let mut all = vec![Op::Load {
                total,
                segments,
                limit,
            }];
            all.extend(ops);
            all
        })
}
