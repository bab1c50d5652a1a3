//! A model checker over the deduction protocol ("move stock, not requests"), built on
//! [stateright](https://docs.rs/stateright).
//!
//! Every interleaving of a small world at script granularity. Segments are the memory store's
//! own [`Segment`]s: every store step is the function the embedded store runs and the Lua
//! scripts mirror, never a second encoding. Requests are driven by the engine's own pure
//! [`Machine`]. The engine's glue around the machine (`src/engine/deduct.rs`: `moved`,
//! `survey_all`, `drain`) and the sweeper's round (`src/engine/sweeper.rs`) are re-stated here
//! step by step, each script call a message in flight.
//!
//! # Worlds
//! Per-user limit 1, one unit loaded, 2 engines (each runs one request at a time, a fresh
//! [`Machine`] per run, transfer ids `(engine + 1) * 10000 + request * 1000 + attempt * 100`
//! upwards) and one sweeper. Requests: `a` = user 0 buys 1, `b` = user 1 reserves 1 (its hold
//! ends within one tick), `c` = user 1 buys 1. User ids are picked so that each user is homed
//! where the world says, whatever the home function. See [`WORLD`] (two buyers racing for the
//! last unit, 2 segments), [`ONE_USER`], [`ONE_USER_FAULTS`], [`ONE_REQUEST`],
//! [`THREE_SEGMENTS`].
//!
//! # Actions (each one transition)
//! - `Start`: a client sends a request to an idle engine; again (a retry: same request id, a
//!   fresh machine) after an unknown outcome, or while its first run still runs (a double
//!   submit), within the retry budget;
//! - `Deliver`: a call runs at its segment (one [`Segment`] step: one script run) and, if its
//!   caller still waits for it, the caller uses the reply in the same transition (what an
//!   engine does with a reply depends on nothing else, so using it later would only add
//!   interleavings that commute with the rest);
//! - `Timeout`: an engine (or the sweeper) stops waiting — a reply lost or late: the request
//!   ends with an error (unknown outcome); its calls stay in flight and may still run;
//! - `Crash`: an engine loses its machine and its hints; its calls stay in flight;
//! - `Resend`: fred re-sends a call after a reconnect: it runs now, its reply is lost, and it
//!   stays in flight to run again (that run answers the caller);
//! - `Tick`: the clock passes every reservation expiry and transfer lease set so far;
//! - `Sweep`: a sweeper round: per donor the due list, then per due transfer the debit re-sent,
//!   a credit-only `sell` at its destination and `transfer_done`, each a separate call;
//! - `EndReservation`: the client confirms or cancels its reservation (`reserve_end`);
//! - `Refuse`: a call reaches a segment whose master cannot reach its replicas
//!   (`min-replicas-to-write`): Redis refuses it before it runs — nothing changes — and its
//!   caller gets `NoReplicas`: a request whose home refused ends with that error, a refusing
//!   donor is passed over, a survey sees the segment [`Look::Down`], a drain skips it;
//! - `Failover`: a segment's replica takes over: the segment goes back to its state before its
//!   last write. With durability on, a caller uses a reply only after a `WAIT`, which covers
//!   every write its master made so far: once a reply is used, nothing written before it at
//!   that segment can be lost. With durability off, the last write can be lost whoever saw it.
//!
//! Everything is bounded (clock, faults, retries, sweeper rounds), so BFS explores the whole
//! space; each check prints the states it explored.
//!
//! # Mutations
//! Each `mutation_*` test breaks one step in the model only (never `src/`) and asserts that the
//! checker finds a counterexample, printing the shortest trace (BFS).

use shardstock::engine::protocol::{Answer, Look, Machine, Seen, Step};
use shardstock::ids::{RequestId, UserId};
use shardstock::segments::home;
use shardstock::store::memory::Segment;
use shardstock::store::{
    Credit, DueTransfer, RecordState, ReservationAction, ResvState, SellArgs, SellReply,
    TransferArgs, TransferReply,
};
use stateright::{Checker, Expectation, HasDiscoveries, Model, Path, Property};
use std::collections::BTreeSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Load generation of every segment (no reloads in the model).
const GENERATION: u64 = 1;
/// Per-user limit.
const LIMIT: u64 = 1;
/// A reservation's hold (ms).
const RESV_MS: u64 = 15;
/// A transfer's lease (ms).
const LEASE_MS: u64 = 15;
/// How long a record is remembered: beyond the model's clock.
const REQUEST_TTL_MS: u64 = 1000;
/// One tick of the clock: longer than any hold or lease.
const TICK_MS: u64 = 20;
/// What `transfers_due` returns at most (the engine's 256).
const DUE_MAX: usize = 256;
/// Passes `survey_all` makes at most (while credits outrun debits).
const SURVEY_PASSES: u8 = 8;

/// Faults and client actions left (the bounds of the state space).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Budget {
    ticks: u8,
    crashes: u8,
    dups: u8,
    timeouts: u8,
    failovers: u8,
    /// Calls refused before they run (their master cannot replicate).
    refusals: u8,
    retries: u8,
    sweeps: u8,
    ends: u8,
    /// Faults in all (crashes, re-sends, timeouts, failovers, refusals, retries).
    faults: u8,
}

impl Budget {
    /// A fault of a kind with `left` left of its own.
    fn may(&self, left: u8) -> bool {
        left > 0 && self.faults > 0
    }
}

/// A broken protocol the model must catch: one step altered, in the model only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mutation {
    None,
    /// `sell` credits a transfer id again (its credited set ignored).
    CreditTwice,
    /// `sell` decides as if the user held nothing (the ledger's bookkeeping goes on).
    SkipLedger,
    /// A `sell` with credits that answers short sends the credits' units back to their donors
    /// (the old design's refund; the units credited were taken by others meanwhile).
    RefundOnShort,
    /// `sell` forgets the ids it credited.
    ForgetCredited,
    /// The engine reads no units in transit in its survey (sold out without draining).
    HideTransit,
    /// The drain credits a due transfer without re-sending its debit first.
    SkipResend,
    /// A request's drain (`Engine::drain` after a survey found units in transit) credits
    /// nothing: the request surveys again at once, as if the machine never asked to drain.
    SkipDrain,
    /// An expired reservation still counts in its user's ledger when `sell` decides.
    ExpiredStillCounts,
    /// The engine takes a segment whose survey was refused as empty.
    DownIsEmpty,
    /// The audit's read (`peek`) looks at a clock that never moves: it counts no hold as
    /// expired, so a survey returns units the look had as reserved and live.
    PeekIgnoresClock,
}

/// A request of the world: user index, request id, reservation or sale (qty 1).
#[derive(Clone, Copy, Debug)]
struct Req {
    user: usize,
    rid: &'static str,
    resv: bool,
}

/// The world the model explores.
#[derive(Clone, Debug)]
struct World {
    /// For reports.
    name: &'static str,
    /// Units loaded per segment.
    loaded: &'static [u64],
    /// Home segment of each user (`Req::user` indexes it).
    homes: &'static [u32],
    requests: &'static [Req],
    engines: usize,
    budget: Budget,
    durable: bool,
    /// A re-sent call may run after its caller used the reply of another run of it (a copy
    /// made below fred, e.g. by a proxy). Off: fred's re-send only (the caller gets the reply
    /// of the last run).
    late_copies: bool,
    mutation: Mutation,
}

/// User 0 buys one.
const A: Req = Req {
    user: 0,
    rid: "a",
    resv: false,
};
/// User 1 reserves one.
const B: Req = Req {
    user: 1,
    rid: "b",
    resv: true,
};
/// User 1 buys one (over the limit while `b` holds).
const C: Req = Req {
    user: 1,
    rid: "c",
    resv: false,
};

const NONE: Budget = Budget {
    ticks: 0,
    crashes: 0,
    dups: 0,
    timeouts: 0,
    failovers: 0,
    refusals: 0,
    retries: 0,
    sweeps: 0,
    ends: 0,
    faults: 0,
};

/// The main world: 2 segments, the last unit at user 1's home (seg1); user 0 (homed at seg0)
/// must move it home: `a` and `b` race for it. One tick, one sweeper round, one fault: a crash,
/// a failover or a refused call (lost replies are in the other worlds: they double this one).
const WORLD: World = World {
    name: "two buyers",
    loaded: &[0, 1],
    homes: &[0, 1],
    requests: &[A, B],
    engines: 2,
    budget: Budget {
        ticks: 1,
        sweeps: 1,
        crashes: 1,
        failovers: 1,
        refusals: 1,
        faults: 1,
        ..NONE
    },
    durable: true,
    late_copies: false,
    mutation: Mutation::None,
};

/// One user, two requests: the last unit at seg0, user 1 (homed at seg1) reserves it (`b`) and
/// buys one (`c`, over the limit while `b` holds). One tick, one sweeper round, the
/// reservation confirmed or cancelled.
const ONE_USER: World = World {
    name: "one user",
    loaded: &[1, 0],
    requests: &[B, C],
    budget: Budget {
        ticks: 1,
        sweeps: 1,
        ends: 1,
        ..NONE
    },
    ..WORLD
};

/// [`ONE_USER`] with one fault of every kind but the reservation's end: a crash, a lost
/// reply, a failover, a re-sent call, a client retry.
const ONE_USER_FAULTS: World = World {
    name: "one user, faults",
    budget: Budget {
        ticks: 1,
        sweeps: 1,
        crashes: 1,
        timeouts: 1,
        failovers: 1,
        dups: 1,
        retries: 1,
        faults: 1,
        ..NONE
    },
    ..ONE_USER
};

/// One request (`a`) and two faults of any kind: a crash and a retry, a lost reply and a
/// failover, a re-sent call and a retry running beside the first run, a refused call...
const ONE_REQUEST: World = World {
    name: "one request, faults",
    requests: &[A],
    budget: Budget {
        ticks: 1,
        sweeps: 1,
        crashes: 1,
        timeouts: 1,
        failovers: 1,
        refusals: 1,
        dups: 1,
        retries: 1,
        faults: 2,
        ..NONE
    },
    ..WORLD
};

/// 3 segments: the last unit at seg0, user 1 homed at seg2, seg1 empty; as [`ONE_USER`].
const THREE_SEGMENTS: World = World {
    name: "three segments",
    loaded: &[1, 0, 0],
    homes: &[1, 2],
    ..ONE_USER
};

/// A world by name, budgets and durability overridable from the environment (for `explore`).
fn named(name: &str) -> World {
    let b = |k: &str, d: u8| std::env::var(k).ok().map_or(d, |v| v.parse().unwrap());
    let mut w = match name {
        "main" => WORLD,
        "one-user" => ONE_USER,
        "one-user-faults" => ONE_USER_FAULTS,
        "one-request" => ONE_REQUEST,
        "three" => THREE_SEGMENTS,
        _ => panic!("{name}"),
    };
    w.durable = std::env::var("DURABLE").map_or(w.durable, |v| v != "0");
    let x = w.budget;
    w.budget = Budget {
        ticks: b("TICKS", x.ticks),
        crashes: b("CRASHES", x.crashes),
        dups: b("DUPS", x.dups),
        timeouts: b("TIMEOUTS", x.timeouts),
        failovers: b("FAILOVERS", x.failovers),
        refusals: b("REFUSALS", x.refusals),
        retries: b("RETRIES", x.retries),
        sweeps: b("SWEEPS", x.sweeps),
        ends: b("ENDS", x.ends),
        faults: b("FAULTS", x.faults),
    };
    w
}

/// Who sent a call (and waits for its reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Who {
    Engine(u8),
    Sweeper,
    /// Nobody waits: a client's `reserve_end`, an engine's best-effort `transfer_done`.
    Nobody,
}

/// A script call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Call {
    /// `sell` for request `req` (`None`: the drain's credit-only sell, qty 0).
    Sell {
        req: Option<u8>,
        credits: Vec<Credit>,
    },
    /// `transfer` (debit) at the donor.
    Transfer(TransferArgs),
    /// `transfer_done` at the donor.
    Done(u64),
    /// `transfers_due` at a donor.
    Due,
    /// `survey`.
    Survey,
    /// `reserve_end` of request `req`.
    End { req: u8, confirm: bool },
    /// Mutation [`Mutation::RefundOnShort`]: units back to a donor.
    Refund { id: u64, units: u64 },
}

/// A script's reply.
#[derive(Clone, Debug)]
enum Reply {
    Sell(SellReply),
    Transfer(TransferReply),
    Due(Vec<DueTransfer>),
    Survey(Seen),
    Ack,
}

/// A call in flight from `peer` to segment `seg`. Its reply is used in the step that applies
/// it, if `peer` still waits for it (tag `tag`): what an engine does with a reply depends on
/// nothing else, so using it later would only add interleavings that commute; a reply lost or
/// late is a `Timeout` (the call stays in flight and is applied later, or never).
#[derive(Clone, PartialEq, Eq, Hash)]
struct Msg {
    /// A hash of the rest: the order of the multiset `State::net`.
    key: u64,
    peer: Who,
    tag: u8,
    seg: u8,
    call: Call,
}

impl fmt::Debug for Msg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let peer = match self.peer {
            Who::Engine(e) => format!("engine{e}#{}", self.tag),
            Who::Sweeper => format!("sweeper#{}", self.tag),
            Who::Nobody => "client".to_string(),
        };
        write!(f, "{peer} -> seg{}: {:?}", self.seg, self.call)
    }
}

/// A value shared between states until one changes it (states are cloned at every step, and
/// hashed whole by the checker): an `Arc` and its hash, computed once.
struct Shared<T> {
    v: Arc<T>,
    /// 0: not computed yet.
    h: AtomicU64,
}

impl<T> Shared<T> {
    fn new(v: T) -> Self {
        Shared {
            v: Arc::new(v),
            h: AtomicU64::new(0),
        }
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared {
            v: Arc::clone(&self.v),
            h: AtomicU64::new(self.h.load(Relaxed)),
        }
    }
}

impl<T> std::ops::Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.v
    }
}

impl<T: Clone> std::ops::DerefMut for Shared<T> {
    fn deref_mut(&mut self) -> &mut T {
        *self.h.get_mut() = 0;
        Arc::make_mut(&mut self.v)
    }
}

impl<T: Hash> Hash for Shared<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let mut h = self.h.load(Relaxed);
        if h == 0 {
            let mut x = std::collections::hash_map::DefaultHasher::new();
            self.v.hash(&mut x);
            h = x.finish() | 1;
            self.h.store(h, Relaxed);
        }
        state.write_u64(h);
    }
}

impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.v, &other.v) || *self.v == *other.v
    }
}

impl<T: Eq> Eq for Shared<T> {}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.v.fmt(f)
    }
}

/// One segment and its replica.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Seg {
    s: Shared<Segment>,
    /// The state before the last write while that write may still be lost in a failover.
    replica: Option<Shared<Segment>>,
    /// The request whose record the last write created.
    last_effect: Option<u8>,
}

/// The drain of transfers in transit (`Engine::drain`): one donor after another.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Drain {
    /// Only transfers whose lease ran out (the sweeper); all (a request about to say sold out).
    due_only: bool,
    donor: u32,
    queue: Vec<DueTransfer>,
    stage: Stage,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Stage {
    /// `transfers_due` at the donor sent.
    Due,
    /// The debit re-sent.
    Debit(DueTransfer),
    /// The credit-only sell sent (with the units the debit answered).
    Credit(DueTransfer),
    /// `transfer_done` sent.
    Done,
}

/// What a running request waits for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Wait {
    Sell {
        credits: bool,
    },
    Transfer {
        donor: u32,
        id: u64,
    },
    /// `survey_all`: a pass reads every segment (all at once); another pass while the pass
    /// saw more credited than debited.
    Survey {
        got: Vec<Option<Look>>,
        passes: u8,
    },
    Drain(Drain),
}

/// One request running on an engine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Run {
    req: u8,
    m: Machine,
    /// The tag of the call(s) it waits for.
    tag: u8,
    wait: Wait,
    /// At some state while it ran, no unit was free anywhere (so a sold out is linearizable).
    saw_empty: bool,
    /// No other run (of any request: the model has one SKU; a retry beside its first run
    /// counts) was in progress at any state from this run's start to now: no other run could
    /// take, move or hold a unit meanwhile (calls left in flight by runs that crashed or timed
    /// out still may, and so may the sweeper).
    alone: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Engine {
    run: Option<Run>,
    /// The engine's stock hints (`Hints::observed`: 0 where never observed).
    hints: Vec<u64>,
    /// The next call tag.
    seq: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Sweeper {
    job: Option<Drain>,
    tag: u8,
    seq: u8,
    /// The round started with every engine idle, nothing in flight and every lease run out,
    /// and nothing else happened since: once it ends, nothing may be in transit.
    clean: bool,
    /// Units the round credited.
    credited: u64,
}

/// How a client saw one run of its request end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Outcome {
    Answer(Answer),
    /// Timed out (reply lost): unknown outcome.
    Error,
    /// The engine crashed: unknown outcome.
    Crashed,
}

// Facts recorded along a path (bits of `State::facts`).
const FALSE_LIMIT: u16 = 1 << 0;
const FALSE_SOLD_OUT: u16 = 1 << 1;
const STUCK_IN_TRANSIT: u16 = 1 << 2;
const SOLD_WITH_CREDIT: u16 = 1 << 3;
const DRAIN_CREDITED: u16 = 1 << 4;
const FAILED_OVER: u16 = 1 << 5;
const CLEAN_DRAIN_MOVED: u16 = 1 << 6;
const FALSE_INSUFFICIENT: u16 = 1 << 7;
const RESENT_TWICE: u16 = 1 << 8;
const FALSE_EMPTY_ALONE: u16 = 1 << 9;
const STICKY: u16 =
    FALSE_LIMIT | FALSE_SOLD_OUT | STUCK_IN_TRANSIT | FALSE_INSUFFICIENT | FALSE_EMPTY_ALONE;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    now: u64,
    segs: Vec<Seg>,
    /// Messages in flight (a multiset, kept sorted by hash).
    net: Vec<Msg>,
    engines: Vec<Engine>,
    sweeper: Sweeper,
    /// Runs started per request.
    runs: Vec<u8>,
    /// Outcomes per request, in order.
    history: Vec<Vec<Outcome>>,
    /// Reservation confirmed or cancelled by its client.
    ended: Vec<bool>,
    /// Records a `sell` created per request (minus those lost in a failover).
    effects: Vec<u8>,
    left: Budget,
    facts: u16,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Start {
        req: u8,
        engine: u8,
    },
    Deliver(Msg),
    /// fred re-sends a call after a reconnect: it runs now, its reply is lost, and it runs
    /// again later (that run answers the caller).
    Resend(Msg),
    /// A copy of a call that runs any time later, after its caller used the reply of the
    /// original (not what fred does: [`World::late_copies`]).
    Duplicate(Msg),
    Timeout(Who),
    Crash(u8),
    Tick,
    Sweep,
    EndReservation {
        req: u8,
        confirm: bool,
    },
    Failover(u8),
    /// The call is refused before it runs (its segment's master cannot replicate).
    Refuse(Msg),
}

/// The model: a world and its ids.
struct Protocol {
    world: World,
    users: Vec<UserId>,
    rids: Vec<RequestId>,
    homes: Vec<u32>,
    sweep_user: UserId,
    sweep_rid: RequestId,
}

/// Puts a call in flight.
fn put(net: &mut Vec<Msg>, peer: Who, tag: u8, seg: u32, call: Call) {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (peer, tag, seg, &call).hash(&mut h);
    let m = Msg {
        key: h.finish(),
        peer,
        tag,
        seg: seg as u8,
        call,
    };
    put_msg(net, m);
}

fn put_msg(net: &mut Vec<Msg>, m: Msg) {
    let at = net.partition_point(|x| x.key <= m.key);
    net.insert(at, m);
}

fn bump(seq: &mut u8) -> u8 {
    let t = *seq;
    *seq = seq.wrapping_add(1);
    t
}

impl Protocol {
    fn new(world: World) -> Self {
        let n = world.loaded.len() as u32;
        // User ids homed where the world wants them (whatever the home function).
        let mut users: Vec<UserId> = Vec::new();
        for &want in world.homes {
            let id = (0..)
                .map(|j| UserId::new(format!("u{j}")).unwrap())
                .find(|u| {
                    !users.contains(u) && home(u, &RequestId::new("any").unwrap(), n, true) == want
                })
                .expect("a user id for every home");
            users.push(id);
        }
        let rids: Vec<RequestId> = world
            .requests
            .iter()
            .map(|r| RequestId::new(r.rid).unwrap())
            .collect();
        let homes = world
            .requests
            .iter()
            .zip(&rids)
            .map(|(r, rid)| home(&users[r.user], rid, n, LIMIT > 0))
            .collect();
        Protocol {
            world,
            users,
            rids,
            homes,
            sweep_user: UserId::new("credit").unwrap(),
            sweep_rid: RequestId::new("credit").unwrap(),
        }
    }

    fn n(&self) -> usize {
        self.world.loaded.len()
    }

    // ---- the store: one script run at one segment ----

    /// Applies `call` at segment `seg` (one atomic step), records the write for failovers, and
    /// returns the reply and whether, with durability on, its caller `WAIT`s before using it
    /// (`Call::waits` of the Redis store: every script that may write; `transfers_due` never;
    /// a survey when it returned expired reservations).
    fn apply(&self, st: &mut State, seg: usize, call: &Call) -> (Reply, bool) {
        let now = st.now;
        let before = st.segs[seg].s.clone();
        let mut effect = None;
        let reply = match call {
            Call::Sell { req, credits } => {
                let r = self.sell(st, seg, *req, credits);
                if let (Some(q), SellReply::Applied { .. }) = (req, &r) {
                    effect = Some(*q);
                    st.effects[*q as usize] += 1;
                }
                if req.is_none() && st.segs[seg].s.counters.moved_in > before.counters.moved_in {
                    st.facts |= DRAIN_CREDITED;
                }
                Reply::Sell(r)
            }
            Call::Transfer(t) => Reply::Transfer(st.segs[seg].s.transfer(t, now)),
            Call::Done(id) => {
                st.segs[seg].s.transfer_done(*id);
                Reply::Ack
            }
            Call::Due => Reply::Due(st.segs[seg].s.transfers_due(DUE_MAX, now)),
            Call::Survey => {
                let v = st.segs[seg].s.survey(now, false);
                Reply::Survey(Seen {
                    stock: v.state.stock,
                    moved_out: v.state.moved_out,
                    moved_in: v.state.moved_in,
                })
            }
            Call::End { req, confirm } => {
                let r = &self.world.requests[*req as usize];
                let action = if *confirm {
                    ReservationAction::Confirm
                } else {
                    ReservationAction::Cancel
                };
                st.segs[seg].s.reserve_end(
                    &self.users[r.user],
                    &self.rids[*req as usize],
                    action,
                    now,
                );
                Reply::Ack
            }
            Call::Refund { units, .. } => {
                let c = &mut st.segs[seg].s.counters;
                c.stock += units;
                c.moved_out = c.moved_out.saturating_sub(*units);
                Reply::Ack
            }
        };
        let changed = st.segs[seg].s != before;
        let s = &*st.segs[seg].s;
        // A debit replayed while not done renews its lease: a write even when the value is
        // the same (transfer.lua writes it), so a durability WAIT after it covers the debit.
        let wrote = changed
            || matches!(call, Call::Transfer(t) if s.transfers.get(&t.id).is_some_and(|x| !x.done));
        if wrote {
            let g = &mut st.segs[seg];
            g.replica = Some(before);
            g.last_effect = effect;
        }
        let waits = match call {
            Call::Due => false,
            Call::Survey => changed,
            _ => true,
        };
        (reply, waits)
    }

    /// `sell` at `seg`, with the mutation under test.
    fn sell(&self, st: &mut State, seg: usize, req: Option<u8>, credits: &[Credit]) -> SellReply {
        let (user, rid, qty, resv) = match req {
            Some(q) => {
                let r = &self.world.requests[q as usize];
                (&self.users[r.user], &self.rids[q as usize], 1, r.resv)
            }
            None => (&self.sweep_user, &self.sweep_rid, 0, false),
        };
        let args = SellArgs {
            request_id: rid,
            user,
            qty,
            resv_ttl_ms: if resv { RESV_MS } else { 0 },
            order_item: false,
            ttl_ms: REQUEST_TTL_MS,
            credits,
            fence: 0,
        };
        if qty > 0 {
            // No "limit reached" for a user who holds nothing (sold, confirmed, or reserved
            // and live) anywhere: decided here, in the step that answers.
            let holds = self.holds(st, user);
            let r = self.sell_mutated(st, seg, &args);
            if matches!(r, SellReply::LimitReached { .. }) && holds == 0 {
                st.facts |= FALSE_LIMIT;
            }
            return r;
        }
        self.sell_mutated(st, seg, &args)
    }

    fn sell_mutated(&self, st: &mut State, seg: usize, args: &SellArgs<'_>) -> SellReply {
        let now = st.now;
        let s = &mut st.segs[seg].s;
        match self.world.mutation {
            Mutation::CreditTwice => {
                let saved = std::mem::take(&mut s.credited);
                let r = s.sell(args, now);
                for (k, v) in saved {
                    s.credited.entry(k).or_insert(v);
                }
                r
            }
            Mutation::SkipLedger => {
                // The check reads nothing the user holds; the bookkeeping goes on. (Expired
                // reservations first: they give back what the user held.)
                s.reclaim(now);
                let held = s
                    .users
                    .get_mut(args.user)
                    .map(|l| std::mem::take(&mut l.held));
                let r = s.sell(args, now);
                if let (Some(h), Some(l)) = (held, s.users.get_mut(args.user)) {
                    l.held += h;
                }
                r
            }
            Mutation::ForgetCredited => {
                let r = s.sell(args, now);
                for c in args.credits {
                    s.credited.remove(&c.id);
                }
                r
            }
            Mutation::RefundOnShort => {
                let r = s.sell(args, now);
                if matches!(r, SellReply::Short { .. }) && args.qty > 0 {
                    for c in args.credits {
                        let refund = Call::Refund {
                            id: c.id,
                            units: c.units,
                        };
                        put(&mut st.net, Who::Nobody, 0, c.donor, refund);
                    }
                }
                r
            }
            Mutation::ExpiredStillCounts if args.qty > 0 => {
                let mut view = s.clone();
                view.reclaim(now);
                let mut extra = 0;
                if let Some(l) = view.users.get_mut(args.user) {
                    extra = l
                        .records
                        .values()
                        .filter(|r| r.state == RecordState::Reservation(ResvState::Expired))
                        .map(|r| r.qty)
                        .sum();
                    l.held += extra;
                }
                let r = view.sell(args, now);
                if matches!(r, SellReply::LimitReached { .. }) {
                    if let Some(l) = view.users.get_mut(args.user) {
                        l.held -= extra;
                    }
                    *s = view;
                    r
                } else {
                    s.sell(args, now)
                }
            }
            _ => s.sell(args, now),
        }
    }

    // ---- facts about a state ----

    /// Units `user` holds anywhere: sold, confirmed, or reserved and live.
    fn holds(&self, st: &State, user: &UserId) -> u64 {
        st.segs
            .iter()
            .filter_map(|g| g.s.users.get(user))
            .flat_map(|l| l.records.values())
            .filter(|r| match r.state {
                RecordState::Sold | RecordState::Reservation(ResvState::Confirmed) => true,
                RecordState::Reservation(ResvState::Reserved) => r.exp > st.now,
                _ => false,
            })
            .map(|r| r.qty)
            .sum()
    }

    /// Units in transit (Σ moved_out − Σ moved_in; negative when units were created).
    fn in_transit(st: &State) -> i128 {
        st.segs
            .iter()
            .map(|g| g.s.counters.moved_out as i128 - g.s.counters.moved_in as i128)
            .sum()
    }

    /// Units anyone could still get: stock, in transit, and reservations past their expiry.
    fn free(st: &State) -> i128 {
        let stock: i128 = st.segs.iter().map(|g| g.s.counters.stock as i128).sum();
        let expired: i128 = st
            .segs
            .iter()
            .flat_map(|g| {
                g.s.reservations
                    .iter()
                    .filter(|r| r.0 <= st.now)
                    .map(move |r| (g, r))
            })
            .filter_map(|(g, (_, u, rid))| g.s.users.get(u)?.records.get(rid))
            .map(|r| r.qty as i128)
            .sum();
        stock + Self::in_transit(st).max(0) + expired
    }

    fn loaded(&self) -> u64 {
        self.world.loaded.iter().sum()
    }

    fn records_of(&self, st: &State, q: usize) -> usize {
        let r = &self.world.requests[q];
        st.segs
            .iter()
            .filter_map(|g| g.s.users.get(&self.users[r.user]))
            .filter(|l| l.records.contains_key(&self.rids[q]))
            .count()
    }

    // ---- the engine: the glue `Engine::moved` runs around the machine ----

    /// Sends a call from `who` (tagged `tag`) to segment `seg`.
    fn send(st: &mut State, who: Who, tag: u8, seg: u32, call: Call) {
        put(&mut st.net, who, tag, seg, call);
    }

    /// Does what the machine's `step` says, on engine `e`.
    fn drive(&self, st: &mut State, e: usize, step: Step) {
        let who = Who::Engine(e as u8);
        let run = st.engines[e].run.as_ref().expect("a run");
        let (req, home) = (run.req, run.m.home());
        match step {
            Step::Sell { credits } => {
                let tag = bump(&mut st.engines[e].seq);
                let with = !credits.is_empty();
                Self::send(
                    st,
                    who,
                    tag,
                    home,
                    Call::Sell {
                        req: Some(req),
                        credits,
                    },
                );
                self.wait(st, e, tag, Wait::Sell { credits: with });
            }
            Step::Transfer { donor, args } => {
                let tag = bump(&mut st.engines[e].seq);
                Self::send(st, who, tag, donor, Call::Transfer(args));
                self.wait(st, e, tag, Wait::Transfer { donor, id: args.id });
            }
            Step::Survey => self.survey_pass(st, e, 0),
            Step::Drain if self.world.mutation == Mutation::SkipDrain => {
                let step = st.engines[e].run.as_mut().expect("a run").m.on_drained();
                self.drive(st, e, step);
            }
            Step::Drain => {
                let tag = bump(&mut st.engines[e].seq);
                Self::send(st, who, tag, 0, Call::Due);
                let d = Drain {
                    due_only: false,
                    donor: 0,
                    queue: Vec::new(),
                    stage: Stage::Due,
                };
                self.wait(st, e, tag, Wait::Drain(d));
            }
            Step::Finish { done, answer } => {
                // Best-effort marks: nobody waits for them.
                for (donor, id) in done {
                    Self::send(st, Who::Nobody, 0, donor, Call::Done(id));
                }
                let run = st.engines[e].run.take().expect("a run");
                let empty_claim = matches!(answer, Answer::SoldOut | Answer::Insufficient { .. });
                if empty_claim && !run.saw_empty {
                    st.facts |= if answer == Answer::SoldOut {
                        FALSE_SOLD_OUT
                    } else {
                        FALSE_INSUFFICIENT
                    };
                    if run.alone {
                        st.facts |= FALSE_EMPTY_ALONE;
                    }
                }
                st.history[run.req as usize].push(Outcome::Answer(answer));
            }
        }
    }

    fn wait(&self, st: &mut State, e: usize, tag: u8, wait: Wait) {
        let run = st.engines[e].run.as_mut().expect("a run");
        run.tag = tag;
        run.wait = wait;
    }

    /// One pass of `survey_all`: every segment read, all calls sent at once.
    fn survey_pass(&self, st: &mut State, e: usize, passes: u8) {
        let tag = bump(&mut st.engines[e].seq);
        for i in 0..self.n() {
            Self::send(st, Who::Engine(e as u8), tag, i as u32, Call::Survey);
        }
        let got = vec![None; self.n()];
        self.wait(st, e, tag, Wait::Survey { got, passes });
    }

    /// Engine `e` uses `reply` from segment `seg`.
    fn engine_reply(&self, st: &mut State, e: usize, seg: usize, reply: Reply) {
        let mut run = st.engines[e].run.take().expect("a run");
        let home = run.m.home() as usize;
        let wait = std::mem::replace(&mut run.wait, Wait::Sell { credits: false });
        let step = match (wait, reply) {
            (Wait::Sell { credits }, Reply::Sell(r)) => {
                if let SellReply::Applied { stock_after }
                | SellReply::Short { stock: stock_after } = r
                {
                    st.engines[e].hints[home] = stock_after;
                }
                if credits && matches!(r, SellReply::Applied { .. }) {
                    st.facts |= SOLD_WITH_CREDIT;
                }
                run.m.on_sell(&r)
            }
            (Wait::Transfer { donor, id }, Reply::Transfer(r)) => {
                match r {
                    TransferReply::Debited { stock_after, .. } => {
                        st.engines[e].hints[donor as usize] = stock_after
                    }
                    TransferReply::Short { stock } => st.engines[e].hints[donor as usize] = stock,
                    _ => {}
                }
                run.m.on_transfer(donor, id, &r)
            }
            (Wait::Survey { mut got, passes }, Reply::Survey(seen)) => {
                got[seg] = Some(Look::Seen(seen));
                return self.survey_got(st, e, run, got, passes);
            }
            (Wait::Drain(mut d), r) => {
                let tag = bump(&mut st.engines[e].seq);
                if self.drain_reply(st, Who::Engine(e as u8), tag, &mut d, r) {
                    run.m.on_drained()
                } else {
                    run.tag = tag;
                    run.wait = Wait::Drain(d);
                    st.engines[e].run = Some(run);
                    return;
                }
            }
            (w, r) => panic!("engine waiting {w:?} got {r:?}"),
        };
        st.engines[e].run = Some(run);
        self.drive(st, e, step);
    }

    /// Engine `e`'s call to segment `seg` was refused before it ran (`NoReplicas`), as
    /// `src/engine/deduct.rs` takes it.
    fn engine_refused(&self, st: &mut State, e: usize, seg: usize) {
        let mut run = st.engines[e].run.take().expect("a run");
        let wait = std::mem::replace(&mut run.wait, Wait::Sell { credits: false });
        let step = match wait {
            // Home refused: the request ends with the error (nothing ran).
            Wait::Sell { .. } => {
                st.history[run.req as usize].push(Outcome::Error);
                return;
            }
            Wait::Transfer { donor, .. } => run.m.on_refused(donor),
            Wait::Survey { mut got, passes } => {
                got[seg] = Some(Look::Down);
                return self.survey_got(st, e, run, got, passes);
            }
            Wait::Drain(mut d) => {
                let tag = bump(&mut st.engines[e].seq);
                if self.drain_refused(st, Who::Engine(e as u8), tag, &mut d) {
                    run.m.on_drained()
                } else {
                    run.tag = tag;
                    run.wait = Wait::Drain(d);
                    st.engines[e].run = Some(run);
                    return;
                }
            }
        };
        st.engines[e].run = Some(run);
        self.drive(st, e, step);
    }

    /// A survey pass got segment answers `got` (`None`: not yet): once all are in, the pass
    /// ends as `survey_all` ends it.
    fn survey_got(
        &self,
        st: &mut State,
        e: usize,
        mut run: Run,
        got: Vec<Option<Look>>,
        passes: u8,
    ) {
        if got.iter().any(Option::is_none) {
            run.wait = Wait::Survey { got, passes };
            st.engines[e].run = Some(run);
            return;
        }
        let looks: Vec<Look> = got.iter().map(|s| s.expect("all read")).collect();
        let read = looks.iter().filter_map(|l| match l {
            Look::Seen(s) => Some(*s),
            _ => None,
        });
        let (out, inn) = read.fold((0, 0), |(o, i), s| (o + s.moved_out, i + s.moved_in));
        // `survey_all`: a pass that saw more credited than debited counted a moving unit
        // twice: another pass (at most 8 in all); the last one counts.
        if inn > out && passes + 1 < SURVEY_PASSES {
            st.engines[e].run = Some(run);
            self.survey_pass(st, e, passes + 1);
            return;
        }
        for (i, l) in looks.iter().enumerate() {
            if let Look::Seen(s) = l {
                st.engines[e].hints[i] = s.stock;
            }
        }
        let seen: Vec<Look> = looks
            .iter()
            .map(|l| match *l {
                Look::Seen(mut s) => {
                    if self.world.mutation == Mutation::HideTransit {
                        s.moved_in = s.moved_out;
                    }
                    Look::Seen(s)
                }
                Look::Down if self.world.mutation == Mutation::DownIsEmpty => Look::Seen(Seen {
                    stock: 0,
                    moved_out: 0,
                    moved_in: 0,
                }),
                other => other,
            })
            .collect();
        let step = run.m.on_survey(&seen);
        st.engines[e].run = Some(run);
        self.drive(st, e, step);
    }

    /// The drain's next call after its call was refused before it ran, as `Engine::drain`
    /// goes on: a donor whose due list or re-sent debit is refused is skipped (its transfers
    /// stay due), a refused credit leaves that transfer due, a refused mark is best effort.
    fn drain_refused(&self, st: &mut State, who: Who, tag: u8, d: &mut Drain) -> bool {
        let next = match d.stage {
            Stage::Due => Reply::Due(Vec::new()),
            Stage::Debit(_) => {
                d.queue.clear();
                Reply::Ack
            }
            Stage::Credit(_) | Stage::Done => Reply::Ack,
        };
        self.drain_reply(st, who, tag, d, next)
    }

    fn sweeper_refused(&self, st: &mut State) {
        let mut d = st.sweeper.job.take().expect("a round");
        let tag = bump(&mut st.sweeper.seq);
        if self.drain_refused(st, Who::Sweeper, tag, &mut d) {
            st.sweeper.clean = false;
            st.sweeper.credited = 0;
        } else {
            st.sweeper.tag = tag;
            st.sweeper.job = Some(d);
        }
    }

    // ---- the drain (`Engine::drain`), shared by the sweeper and a request ----

    /// The drain's next call after `reply`, tagged `tag`; `true` once it is over.
    fn drain_reply(&self, st: &mut State, who: Who, tag: u8, d: &mut Drain, reply: Reply) -> bool {
        match (&d.stage, reply) {
            (Stage::Due, Reply::Due(due)) => {
                d.queue = due
                    .into_iter()
                    .filter(|t| !(d.due_only && t.lease_left_ms > 0))
                    .filter(|t| (t.dest as usize) < self.n())
                    .collect();
            }
            (Stage::Debit(t), Reply::Transfer(TransferReply::Debited { units, .. })) => {
                let t = DueTransfer { units, ..*t };
                self.send_credit(st, who, tag, d, t);
                return false;
            }
            (Stage::Credit(t), Reply::Sell(SellReply::Applied { stock_after })) => {
                if let Who::Engine(e) = who {
                    st.engines[e as usize].hints[t.dest as usize] = stock_after;
                } else {
                    st.sweeper.credited += t.units;
                }
                let id = t.id;
                Self::send(st, who, tag, d.donor, Call::Done(id));
                d.stage = Stage::Done;
                return false;
            }
            (Stage::Debit(_) | Stage::Credit(_) | Stage::Done, _) => {}
            (s, r) => panic!("drain at {s:?} got {r:?}"),
        }
        // Next transfer of this donor, or the next donor.
        if !d.queue.is_empty() {
            let t = d.queue.remove(0);
            if self.world.mutation == Mutation::SkipResend {
                self.send_credit(st, who, tag, d, t);
            } else {
                let again = TransferArgs {
                    id: t.id,
                    dest: t.dest,
                    want: t.units,
                    floor: 0,
                    lease_ms: LEASE_MS,
                };
                Self::send(st, who, tag, d.donor, Call::Transfer(again));
                d.stage = Stage::Debit(t);
            }
            return false;
        }
        d.donor += 1;
        if (d.donor as usize) < self.n() {
            Self::send(st, who, tag, d.donor, Call::Due);
            d.stage = Stage::Due;
            return false;
        }
        true
    }

    fn send_credit(&self, st: &mut State, who: Who, tag: u8, d: &mut Drain, t: DueTransfer) {
        let credit = Credit {
            id: t.id,
            donor: d.donor,
            units: t.units,
        };
        Self::send(
            st,
            who,
            tag,
            t.dest,
            Call::Sell {
                req: None,
                credits: vec![credit],
            },
        );
        d.stage = Stage::Credit(t);
    }

    fn sweeper_reply(&self, st: &mut State, reply: Reply) {
        let mut d = st.sweeper.job.take().expect("a round");
        let tag = bump(&mut st.sweeper.seq);
        if self.drain_reply(st, Who::Sweeper, tag, &mut d, reply) {
            if st.sweeper.clean {
                if Self::in_transit(st) != 0 {
                    st.facts |= STUCK_IN_TRANSIT;
                }
                if st.sweeper.credited > 0 {
                    st.facts |= CLEAN_DRAIN_MOVED;
                }
            }
            st.sweeper.clean = false;
            st.sweeper.credited = 0;
        } else {
            st.sweeper.tag = tag;
            st.sweeper.job = Some(d);
        }
    }

    /// Whether `who` waits for a reply tagged `tag`.
    fn awaits(st: &State, who: Who, tag: u8) -> bool {
        match who {
            Who::Engine(e) => st.engines[e as usize]
                .run
                .as_ref()
                .is_some_and(|r| r.tag == tag),
            Who::Sweeper => st.sweeper.job.is_some() && st.sweeper.tag == tag,
            Who::Nobody => false,
        }
    }

    /// Canonical form (fewer states, same behaviours): an idle actor with nothing in flight
    /// starts its tags at 0 again; replicas are dropped once no failover can come, idle
    /// engines' hints once no request can start. Also notes, for every running request, a
    /// state with no unit free anywhere.
    fn normalize(&self, st: &mut State) {
        for e in 0..st.engines.len() {
            let who = Who::Engine(e as u8);
            if st.engines[e].run.is_none() && !st.net.iter().any(|m| m.peer == who) {
                st.engines[e].seq = 0;
            }
        }
        if st.sweeper.job.is_none() && !st.net.iter().any(|m| m.peer == Who::Sweeper) {
            st.sweeper.seq = 0;
            st.sweeper.tag = 0;
        }
        if !st.left.may(st.left.failovers) {
            // No failover can happen any more: replicas are irrelevant.
            for g in &mut st.segs {
                g.replica = None;
                g.last_effect = None;
            }
        }
        let more =
            (0..self.world.requests.len()).any(|q| st.runs[q] == 0) || st.left.may(st.left.retries);
        if !more {
            // No request starts any more: idle engines' hints are irrelevant.
            for g in &mut st.engines {
                if g.run.is_none() {
                    g.hints.iter_mut().for_each(|h| *h = 0);
                }
            }
        }
        if Self::free(st) == 0 {
            for r in st.engines.iter_mut().filter_map(|e| e.run.as_mut()) {
                r.saw_empty = true;
            }
        }
    }

    fn first_id(e: usize, req: usize, attempt: u8) -> u64 {
        (e as u64 + 1) * 10_000 + req as u64 * 1000 + attempt as u64 * 100
    }

    fn unknown(o: Option<&Outcome>) -> bool {
        matches!(o, Some(Outcome::Error | Outcome::Crashed))
    }

    fn running(st: &State, q: usize) -> bool {
        st.engines
            .iter()
            .any(|e| e.run.as_ref().is_some_and(|r| r.req as usize == q))
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let n = self.n();
        let q = self.world.requests.len();
        vec![State {
            now: 0,
            segs: self
                .world
                .loaded
                .iter()
                .map(|&u| Seg {
                    s: Shared::new(Segment::loaded(GENERATION, u, LIMIT)),
                    replica: None,
                    last_effect: None,
                })
                .collect(),
            net: Vec::new(),
            engines: vec![
                Engine {
                    run: None,
                    hints: if std::env::var("HINTS").is_ok() {
                        self.world.loaded.to_vec()
                    } else {
                        vec![0; n]
                    },
                    seq: 0,
                };
                self.world.engines
            ],
            sweeper: Sweeper {
                job: None,
                tag: 0,
                seq: 0,
                clean: false,
                credited: 0,
            },
            runs: vec![0; q],
            history: vec![Vec::new(); q],
            ended: vec![false; q],
            effects: vec![0; q],
            left: self.world.budget,
            facts: 0,
        }]
    }

    fn actions(&self, st: &State, actions: &mut Vec<Action>) {
        let left = &st.left;
        for (q, _) in self.world.requests.iter().enumerate() {
            let fresh = st.runs[q] == 0;
            let retry = !fresh
                && left.may(left.retries)
                && (Self::unknown(st.history[q].last()) || Self::running(st, q));
            if fresh || retry {
                for (e, eng) in st.engines.iter().enumerate() {
                    // Engines alike (idle, same hints, nothing in flight) are interchangeable:
                    // start on the first of them only.
                    let quiet = |i: usize| !st.net.iter().any(|m| m.peer == Who::Engine(i as u8));
                    let twin = (0..e).any(|i| {
                        st.engines[i].run.is_none()
                            && st.engines[i].hints == eng.hints
                            && quiet(i)
                            && quiet(e)
                    });
                    if eng.run.is_none() && !twin {
                        actions.push(Action::Start {
                            req: q as u8,
                            engine: e as u8,
                        });
                    }
                }
            }
        }
        let mut last: Option<&Msg> = None;
        for m in &st.net {
            if last == Some(m) {
                continue;
            }
            last = Some(m);
            actions.push(Action::Deliver(m.clone()));
            if left.may(left.refusals) {
                actions.push(Action::Refuse(m.clone()));
            }
            // Reads and marks re-sent change nothing: not worth the states.
            if left.may(left.dups) && !matches!(m.call, Call::Due | Call::Survey | Call::Done(_)) {
                actions.push(if self.world.late_copies {
                    Action::Duplicate(m.clone())
                } else {
                    Action::Resend(m.clone())
                });
            }
        }
        if left.may(left.timeouts) {
            for (e, eng) in st.engines.iter().enumerate() {
                if eng.run.is_some() {
                    actions.push(Action::Timeout(Who::Engine(e as u8)));
                }
            }
            if st.sweeper.job.is_some() {
                actions.push(Action::Timeout(Who::Sweeper));
            }
        }
        if left.may(left.crashes) {
            for (e, eng) in st.engines.iter().enumerate() {
                if eng.run.is_some() {
                    actions.push(Action::Crash(e as u8));
                }
            }
        }
        // The clock moves only while something waits for it (a live reservation, a transfer
        // not done): otherwise a tick changes nothing but the clock's reading.
        let waiting = st.segs.iter().any(|g| {
            g.s.reservations.iter().any(|r| r.0 > st.now)
                || g.s
                    .transfers
                    .values()
                    .any(|x| !x.done && x.lease_until > st.now)
        });
        if left.ticks > 0 && waiting {
            actions.push(Action::Tick);
        }
        // A round only when some lease ran out: a round with nothing due reads and does nothing.
        let due = st.segs.iter().any(|g| {
            g.s.transfers
                .values()
                .any(|x| !x.done && x.lease_until <= st.now)
        });
        if left.sweeps > 0 && st.sweeper.job.is_none() && due {
            actions.push(Action::Sweep);
        }
        if left.ends > 0 {
            for (q, r) in self.world.requests.iter().enumerate() {
                let applied = st.history[q]
                    .iter()
                    .any(|o| matches!(o, Outcome::Answer(Answer::Applied | Answer::Replay)));
                if r.resv && applied && !st.ended[q] {
                    for confirm in [true, false] {
                        actions.push(Action::EndReservation {
                            req: q as u8,
                            confirm,
                        });
                    }
                }
            }
        }
        if left.may(left.failovers) {
            for (i, g) in st.segs.iter().enumerate() {
                if g.replica.is_some() {
                    actions.push(Action::Failover(i as u8));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut st = last.clone();
        // Witnesses of `sometimes` properties hold only in the state right after their event
        // (sticky bits would split otherwise equal states); violations stay.
        st.facts &= STICKY;
        match action {
            Action::Start { req, engine } => {
                let (q, e) = (req as usize, engine as usize);
                let attempt = st.runs[q];
                if attempt > 0 {
                    st.left.retries -= 1;
                    st.left.faults -= 1;
                }
                st.runs[q] += 1;
                // Whoever runs now is no longer alone, nor is the run starting.
                let mut alone = true;
                for r in st.engines.iter_mut().filter_map(|g| g.run.as_mut()) {
                    r.alone = false;
                    alone = false;
                }
                let m = Machine::new(
                    self.homes[q],
                    1,
                    st.engines[e].hints.clone(),
                    LEASE_MS,
                    Self::first_id(e, q, attempt),
                );
                let step = m.start();
                st.engines[e].run = Some(Run {
                    req,
                    m,
                    tag: 0,
                    wait: Wait::Sell { credits: false },
                    saw_empty: false,
                    alone,
                });
                st.sweeper.clean = false;
                self.drive(&mut st, e, step);
            }
            Action::Deliver(m) => {
                let at = st.net.iter().position(|x| *x == m)?;
                st.net.remove(at);
                let seg = m.seg as usize;
                let (reply, waits) = self.apply(&mut st, seg, &m.call);
                if Self::awaits(&st, m.peer, m.tag) {
                    // Durability on: the caller uses the reply only after a `WAIT`, which covers
                    // every write the segment's master made so far (Redis 7.0 moves a
                    // connection's replication mark at every command; see `RecordRead::waits`).
                    if self.world.durable && waits {
                        let g = &mut st.segs[seg];
                        g.replica = None;
                        g.last_effect = None;
                    }
                    match m.peer {
                        Who::Engine(e) => self.engine_reply(&mut st, e as usize, seg, reply),
                        Who::Sweeper => self.sweeper_reply(&mut st, reply),
                        Who::Nobody => {}
                    }
                }
            }
            Action::Resend(m) => {
                st.left.dups -= 1;
                st.left.faults -= 1;
                let before = st.segs[m.seg as usize].s.clone();
                self.apply(&mut st, m.seg as usize, &m.call);
                if st.segs[m.seg as usize].s != before {
                    st.facts |= RESENT_TWICE; // its second run replays
                }
            }
            Action::Duplicate(m) => {
                st.left.dups -= 1;
                st.left.faults -= 1;
                put_msg(&mut st.net, m);
            }
            Action::Timeout(who) => {
                st.left.timeouts -= 1;
                st.left.faults -= 1;
                match who {
                    Who::Engine(e) => {
                        let run = st.engines[e as usize].run.take()?;
                        st.history[run.req as usize].push(Outcome::Error);
                    }
                    Who::Sweeper => {
                        st.sweeper.job = None;
                        st.sweeper.clean = false;
                    }
                    Who::Nobody => return None,
                }
            }
            Action::Crash(e) => {
                st.left.crashes -= 1;
                st.left.faults -= 1;
                let eng = &mut st.engines[e as usize];
                let run = eng.run.take()?;
                eng.hints = vec![0; self.n()];
                st.history[run.req as usize].push(Outcome::Crashed);
            }
            Action::Tick => {
                st.left.ticks -= 1;
                st.now += TICK_MS;
            }
            Action::Sweep => {
                st.left.sweeps -= 1;
                let now = st.now;
                st.sweeper.clean = st.engines.iter().all(|e| e.run.is_none())
                    && st.net.is_empty()
                    && st.segs.iter().all(|g| {
                        g.s.transfers
                            .values()
                            .all(|x| x.done || x.lease_until <= now)
                    });
                st.sweeper.credited = 0;
                let tag = bump(&mut st.sweeper.seq);
                st.sweeper.tag = tag;
                Self::send(&mut st, Who::Sweeper, tag, 0, Call::Due);
                st.sweeper.job = Some(Drain {
                    due_only: true,
                    donor: 0,
                    queue: Vec::new(),
                    stage: Stage::Due,
                });
            }
            Action::EndReservation { req, confirm } => {
                st.left.ends -= 1;
                st.ended[req as usize] = true;
                let home = self.homes[req as usize];
                Self::send(&mut st, Who::Nobody, 0, home, Call::End { req, confirm });
            }
            Action::Refuse(m) => {
                st.left.refusals -= 1;
                st.left.faults -= 1;
                let at = st.net.iter().position(|x| *x == m)?;
                st.net.remove(at);
                if Self::awaits(&st, m.peer, m.tag) {
                    match m.peer {
                        Who::Engine(e) => self.engine_refused(&mut st, e as usize, m.seg as usize),
                        Who::Sweeper => self.sweeper_refused(&mut st),
                        Who::Nobody => {}
                    }
                }
            }
            Action::Failover(i) => {
                st.left.failovers -= 1;
                st.left.faults -= 1;
                st.facts |= FAILED_OVER;
                st.sweeper.clean = false;
                let g = &mut st.segs[i as usize];
                g.s = g.replica.take()?;
                if let Some(q) = g.last_effect.take() {
                    st.effects[q as usize] -= 1;
                }
            }
        }
        self.normalize(&mut st);
        Some(st)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("never oversell", |m: &Protocol, s: &State| {
                let taken: u64 = s
                    .segs
                    .iter()
                    .map(|g| g.s.counters.sold + g.s.counters.reserved)
                    .sum();
                taken <= m.loaded()
            }),
            Property::always("units are conserved", |m: &Protocol, s: &State| {
                let held: i128 = s
                    .segs
                    .iter()
                    .map(|g| {
                        let c = &g.s.counters;
                        c.stock as i128 + c.reserved as i128 + c.sold as i128
                    })
                    .sum();
                // The equation follows from every segment balancing; what it cannot see is units
                // made by a credit without its debit (in transit below 0).
                s.segs.iter().all(|g| g.s.counters.balances())
                    && m.loaded() as i128 == held + Protocol::in_transit(s)
                    && Protocol::in_transit(s) >= 0
            }),
            // The audit's and the status's read (`peek`, which writes nothing, so it answers on
            // a master that refuses writes) sees what the sweeper's survey leaves behind: the
            // survey returns the expired holds `peek` counts, and nothing else differs.
            Property::always(
                "a look that writes nothing sees what a survey returns",
                |m: &Protocol, s: &State| {
                    let now = match m.world.mutation {
                        Mutation::PeekIgnoresClock => 0,
                        _ => s.now,
                    };
                    s.segs.iter().all(|g| {
                        let look = g.s.peek(now, true);
                        let mut after = (*g.s).clone();
                        let surveyed = after.survey(s.now, true);
                        let (l, v) = (look.state, surveyed.state);
                        look.state == g.s.counters
                            && l.balances()
                            && look.held == l.reserved
                            && look.expired == surveyed.reclaimed
                            && l.stock + look.expired == v.stock
                            && l.reserved - look.expired == v.reserved
                            && look.held - look.expired == surveyed.held
                            && (l.sold, l.moved_in, l.moved_out)
                                == (v.sold, v.moved_in, v.moved_out)
                    })
                },
            ),
            Property::always("every credit was debited", |_: &Protocol, s: &State| {
                s.segs.iter().all(|g| {
                    g.s.credited.iter().all(|(id, units)| {
                        s.segs
                            .iter()
                            .any(|d| d.s.transfers.get(id).is_some_and(|x| x.units == *units))
                    })
                })
            }),
            Property::always("one effect per request id", |m: &Protocol, s: &State| {
                (0..m.world.requests.len()).all(|q| s.effects[q] <= 1 && m.records_of(s, q) <= 1)
            }),
            Property::always(
                "every request is fully in or out",
                |_: &Protocol, s: &State| {
                    s.segs.iter().all(|g| {
                        let (mut sold, mut reserved) = (0, 0);
                        let mut index = BTreeSet::new();
                        let ledgers = g.s.users.iter().all(|(u, l)| {
                            let (mut held, mut good) = (0, 0);
                            for (rid, r) in &l.records {
                                match r.state {
                                    RecordState::Sold
                                    | RecordState::Reservation(ResvState::Confirmed) => {
                                        held += r.qty;
                                        good += r.qty;
                                        sold += r.qty;
                                    }
                                    RecordState::Reservation(ResvState::Reserved) => {
                                        held += r.qty;
                                        reserved += r.qty;
                                        index.insert((r.exp, u.clone(), rid.clone()));
                                    }
                                    _ => {}
                                }
                            }
                            g.s.limit == 0 || (l.held == held && l.sold == good)
                        });
                        ledgers
                            && g.s.counters.sold == sold
                            && g.s.counters.reserved == reserved
                            && g.s.reservations == index
                    })
                },
            ),
            Property::always(
                "an answered sale is remembered",
                |m: &Protocol, s: &State| {
                    (0..m.world.requests.len()).all(|q| {
                        !s.history[q]
                            .iter()
                            .any(|o| matches!(o, Outcome::Answer(Answer::Applied | Answer::Replay)))
                            || m.records_of(s, q) == 1
                    })
                },
            ),
            Property::always(
                "a user stays within the limit",
                |m: &Protocol, s: &State| m.users.iter().all(|u| m.holds(s, u) <= LIMIT),
            ),
            Property::always(
                "no limit reached for a user holding nothing",
                |_: &Protocol, s: &State| s.facts & FALSE_LIMIT == 0,
            ),
            Property::always(
                "no sold out while a unit is free",
                |_: &Protocol, s: &State| s.facts & FALSE_SOLD_OUT == 0,
            ),
            Property::always(
                "no insufficient while a unit is free",
                |_: &Protocol, s: &State| s.facts & FALSE_INSUFFICIENT == 0,
            ),
            // The part of the one above that holds with contention out of the way: a run
            // during which no other run was in progress answers `sold out` or `insufficient`
            // only if, at some state from its start to its answer, nothing was free
            // (`Protocol::free`: stock, units in transit, holds past their expiry). A run
            // alone may still meet calls in flight of runs that crashed or timed out, the
            // sweeper, ticks, failovers and refusals: none of these may make it give up.
            Property::always(ALONE, |_: &Protocol, s: &State| {
                s.facts & FALSE_EMPTY_ALONE == 0
            }),
            Property::always(
                "a clean sweep leaves nothing in transit",
                |_: &Protocol, s: &State| s.facts & STUCK_IN_TRANSIT == 0,
            ),
            Property::always(
                "buyers are refused only when nothing is left",
                |_: &Protocol, s: &State| {
                    let refused = s.engines.iter().all(|e| e.run.is_none())
                        && s.history.iter().all(|h| {
                            !h.is_empty()
                                && h.iter().all(|o| {
                                    matches!(
                                        o,
                                        Outcome::Answer(
                                            Answer::SoldOut | Answer::Insufficient { .. }
                                        )
                                    )
                                })
                        });
                    !refused || Protocol::free(s) == 0
                },
            ),
            Property::always(
                "a refused request has no effect",
                |m: &Protocol, s: &State| {
                    (0..m.world.requests.len()).all(|q| {
                        let refused = !Protocol::running(s, q)
                            && !s.history[q].is_empty()
                            && s.history[q].iter().all(|o| {
                                matches!(
                                    o,
                                    Outcome::Answer(
                                        Answer::SoldOut
                                            | Answer::Insufficient { .. }
                                            | Answer::LimitReached { .. }
                                    )
                                )
                            });
                        !refused || m.records_of(s, q) == 0
                    })
                },
            ),
            Property::sometimes("a transfer is credited", |_: &Protocol, s: &State| {
                s.segs.iter().any(|g| g.s.counters.moved_in > 0)
            }),
            Property::sometimes(
                "a sale uses a transfer's units",
                |_: &Protocol, s: &State| s.facts & SOLD_WITH_CREDIT != 0,
            ),
            Property::sometimes("sold out is answered", |_: &Protocol, s: &State| {
                s.history
                    .iter()
                    .flatten()
                    .any(|o| *o == Outcome::Answer(Answer::SoldOut))
            }),
            Property::sometimes("limit reached is answered", |_: &Protocol, s: &State| {
                s.history
                    .iter()
                    .flatten()
                    .any(|o| matches!(o, Outcome::Answer(Answer::LimitReached { .. })))
            }),
            Property::sometimes("a retry replays", |_: &Protocol, s: &State| {
                s.history
                    .iter()
                    .flatten()
                    .any(|o| *o == Outcome::Answer(Answer::Replay))
            }),
            Property::sometimes("a reservation expires", |_: &Protocol, s: &State| {
                s.segs.iter().flat_map(|g| g.s.users.values()).any(|l| {
                    l.records
                        .values()
                        .any(|r| r.state == RecordState::Reservation(ResvState::Expired))
                })
            }),
            Property::sometimes(
                "a look counts an expired hold",
                |_: &Protocol, s: &State| s.segs.iter().any(|g| g.s.peek(s.now, false).expired > 0),
            ),
            Property::sometimes("a reservation is confirmed", |_: &Protocol, s: &State| {
                s.segs.iter().flat_map(|g| g.s.users.values()).any(|l| {
                    l.records
                        .values()
                        .any(|r| r.state == RecordState::Reservation(ResvState::Confirmed))
                })
            }),
            Property::sometimes("a reservation is cancelled", |_: &Protocol, s: &State| {
                s.segs.iter().flat_map(|g| g.s.users.values()).any(|l| {
                    l.records
                        .values()
                        .any(|r| r.state == RecordState::Reservation(ResvState::Cancelled))
                })
            }),
            Property::sometimes("a sale after an expiry", |_: &Protocol, s: &State| {
                s.segs.iter().flat_map(|g| g.s.users.values()).any(|l| {
                    let expired = l
                        .records
                        .values()
                        .any(|r| r.state == RecordState::Reservation(ResvState::Expired));
                    expired && l.records.values().any(|r| r.state == RecordState::Sold)
                })
            }),
            Property::sometimes("a re-sent call applies twice", |_: &Protocol, s: &State| {
                s.facts & RESENT_TWICE != 0
            }),
            Property::sometimes("a drain credits a transfer", |_: &Protocol, s: &State| {
                s.facts & DRAIN_CREDITED != 0
            }),
            Property::sometimes(
                "a clean sweep credits what a request left",
                |_: &Protocol, s: &State| s.facts & CLEAN_DRAIN_MOVED != 0,
            ),
            Property::sometimes("a failover loses a write", |_: &Protocol, s: &State| {
                s.facts & FAILED_OVER != 0
            }),
        ]
    }
}

/// Prints a trace: each action, then the state it led to in short.
fn print_trace(name: &str, path: &Path<State, Action>) {
    let steps = path.clone().into_vec();
    println!("--- {name}: {} actions ---", steps.len() - 1);
    for (i, (_, action)) in steps.iter().enumerate() {
        if let Some(a) = action {
            let after = &steps[i + 1].0;
            println!("{:>3}. {a:?}", i + 1);
            println!("       {}", summary(after));
        }
    }
}

fn summary(s: &State) -> String {
    let segs: Vec<String> = s
        .segs
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let c = &g.s.counters;
            format!(
                "seg{i}[stock {} sold {} resv {} out {} in {}{}]",
                c.stock,
                c.sold,
                c.reserved,
                c.moved_out,
                c.moved_in,
                if g.replica.is_some() {
                    " unreplicated"
                } else {
                    ""
                }
            )
        })
        .collect();
    format!(
        "now {} {} answers {:?} in flight {}",
        s.now,
        segs.join(" "),
        s.history,
        s.net.len()
    )
}

/// Runs the checker over `world` (BFS, 2 threads) to the end, or, with `stop`, until that
/// property has a discovery, exploring paths of at most `max_actions` actions.
fn check(
    world: World,
    stop: Option<&'static str>,
    max_actions: Option<usize>,
) -> impl Checker<Protocol> {
    let label = format!(
        "{} (durability {}, late copies {}, mutation {:?})",
        world.name,
        if world.durable { "on" } else { "off" },
        if world.late_copies { "on" } else { "off" },
        world.mutation
    );
    let model = Protocol::new(world);
    let t = Instant::now();
    let mut b = model.checker().threads(2);
    if let Some(name) = stop {
        b = b.finish_when(HasDiscoveries::AnyOf(BTreeSet::from([name])));
    }
    if let Some(n) = max_actions {
        // The initial state is at depth 1, and states at the target depth are not checked.
        b = b.target_max_depth(n + 2);
    }
    let c = b.spawn_bfs().join();
    if max_actions.is_some() {
        return c; // a search for a shorter trace
    }
    println!(
        "{label}: {} unique states ({} generated), depth {}, {:.1?}",
        c.unique_state_count(),
        c.state_count(),
        c.max_depth(),
        t.elapsed()
    );
    c
}

/// Properties the protocol is known to break (see the `known_gap_*` tests): left out of the
/// `model_holds_*` checks. [`ALONE`], the part of [`INSUFFICIENT`] that holds without
/// contention, is checked in all of them.
const KNOWN_GAPS: &[&str] = &[INSUFFICIENT];
const INSUFFICIENT: &str = "no insufficient while a unit is free";
const ALONE: &str = "a request alone is refused only when nothing is free";

/// Checks `world` to the end: no counterexample to any `always` property (but the known
/// gaps), and an example of each of `reached`.
fn holds(world: World, reached: &[&'static str]) {
    let c = check(world, None, None);
    let props = c.model().properties();
    let mut broken = Vec::new();
    for (name, path) in c.discoveries() {
        let p = props.iter().find(|p| p.name == name).expect("a property");
        if p.expectation == Expectation::Always && !KNOWN_GAPS.contains(&name) {
            print_trace(name, &path);
            broken.push(name);
        }
    }
    assert!(broken.is_empty(), "counterexamples: {broken:?}");
    for name in reached {
        assert!(
            props.iter().any(|p| p.name == *name),
            "no property {name:?}"
        );
        assert!(c.discovery(name).is_some(), "never reached: {name:?}");
    }
}

#[test]
fn model_holds_with_durability() {
    holds(
        WORLD,
        &[
            "a transfer is credited",
            "a sale uses a transfer's units",
            "sold out is answered",
            "a drain credits a transfer",
            "a clean sweep credits what a request left",
            "a failover loses a write",
            "a reservation expires",
        ],
    );
}

#[test]
fn model_holds_with_durability_for_one_user() {
    holds(
        ONE_USER,
        &[
            "a transfer is credited",
            "a sale uses a transfer's units",
            "limit reached is answered",
            "a reservation expires",
            "a look counts an expired hold",
            "a reservation is confirmed",
            "a reservation is cancelled",
            "a sale after an expiry",
        ],
    );
}

#[test]
fn model_holds_with_durability_under_every_fault() {
    holds(
        ONE_USER_FAULTS,
        &[
            "a retry replays",
            "a failover loses a write",
            "a clean sweep credits what a request left",
            "limit reached is answered",
        ],
    );
    holds(
        ONE_REQUEST,
        &[
            "a retry replays",
            "a failover loses a write",
            "a clean sweep credits what a request left",
            "a re-sent call applies twice",
        ],
    );
}

#[test]
fn model_holds_with_durability_on_three_segments() {
    holds(
        THREE_SEGMENTS,
        &[
            "a transfer is credited",
            "limit reached is answered",
            "a reservation expires",
        ],
    );
}

/// Checks `world` until `property` has a counterexample, prints a shortest one and returns
/// its length. (The checker keeps the last counterexample it recorded before it stopped, not
/// the first: the shortest is searched for by bounding the length.)
fn caught(world: World, property: &'static str) -> usize {
    let found = |max: Option<usize>| check(world.clone(), Some(property), max).discovery(property);
    let mut best = found(None)
        .unwrap_or_else(|| panic!("{:?}: no counterexample to {property:?}", world.mutation));
    let (mut lo, mut hi) = (0, best.clone().into_actions().len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        match found(Some(mid)) {
            Some(p) => {
                hi = p.clone().into_actions().len().min(mid);
                best = p;
            }
            None => lo = mid + 1,
        }
    }
    print_trace(property, &best);
    hi
}

fn mutant(world: World, mutation: Mutation) -> World {
    World { mutation, ..world }
}

/// Durability off: a failover loses a debit whose units were credited home already.
#[test]
fn model_without_durability_can_create_units() {
    let world = World {
        durable: false,
        ..ONE_REQUEST
    };
    let n = caught(world, "units are conserved");
    println!("units created after {n} actions");
}

/// Known gap: two buyers homed apart pull the last unit back and forth (each drain credits
/// the other's transfer, then debits it again) until one gives up after `MAX_ROUNDS` and
/// answers `Insufficient { available: 1 }` for 1 unit while the unit is on its way to the
/// other. When the protocol answers otherwise, this test fails: move the property out of
/// `KNOWN_GAPS`. A request that runs with no other request in progress is held to it
/// ([`ALONE`], checked everywhere).
#[test]
fn known_gap_contention_answers_insufficient_with_a_unit_in_transit() {
    let world = World {
        budget: NONE,
        ..WORLD
    };
    caught(world, INSUFFICIENT);
}

/// The protocol relies on fred's re-send semantics: a call runs again only while its caller
/// waits, and the caller gets the last run's reply. A copy that runs after the caller used
/// another run's reply (a proxy re-sending below fred) applies a request whose engine then
/// answers it sold out.
#[test]
fn late_copies_of_a_call_break_answers() {
    let world = World {
        late_copies: true,
        budget: Budget {
            dups: 1,
            faults: 1,
            ..NONE
        },
        ..ONE_USER
    };
    caught(world, "a refused request has no effect");
}

#[test]
fn mutation_credit_twice_is_caught() {
    caught(
        mutant(ONE_REQUEST, Mutation::CreditTwice),
        "units are conserved",
    );
}

#[test]
fn mutation_skip_ledger_is_caught() {
    // Two units, so that the user could take both.
    let world = World {
        loaded: &[2, 0],
        ..ONE_USER
    };
    caught(
        mutant(world, Mutation::SkipLedger),
        "a user stays within the limit",
    );
}

#[test]
fn mutation_refund_on_short_is_caught() {
    let world = World {
        budget: NONE,
        ..WORLD
    };
    caught(
        mutant(world, Mutation::RefundOnShort),
        "units are conserved",
    );
}

#[test]
fn mutation_forget_credited_is_caught() {
    caught(
        mutant(ONE_REQUEST, Mutation::ForgetCredited),
        "units are conserved",
    );
}

#[test]
fn mutation_hide_transit_is_caught() {
    caught(
        mutant(ONE_USER, Mutation::HideTransit),
        "no sold out while a unit is free",
    );
}

#[test]
fn mutation_down_is_empty_is_caught() {
    // The last unit sits at a segment whose survey is refused: taken as empty, it is "sold out".
    let world = World {
        budget: Budget {
            refusals: 1,
            faults: 1,
            ..ONE_USER.budget
        },
        ..ONE_USER
    };
    caught(
        mutant(world, Mutation::DownIsEmpty),
        "no sold out while a unit is free",
    );
}

#[test]
fn mutation_skip_resend_is_caught() {
    caught(
        mutant(ONE_REQUEST, Mutation::SkipResend),
        "units are conserved",
    );
}

/// Without its drain a request alone gives up over a unit a crashed run left in transit.
#[test]
fn mutation_skip_drain_is_caught() {
    caught(mutant(ONE_REQUEST, Mutation::SkipDrain), ALONE);
}

#[test]
fn mutation_expired_still_counts_is_caught() {
    caught(
        mutant(ONE_USER, Mutation::ExpiredStillCounts),
        "no limit reached for a user holding nothing",
    );
}

#[test]
fn mutation_peek_ignores_clock_is_caught() {
    caught(
        mutant(ONE_USER, Mutation::PeekIgnoresClock),
        "a look that writes nothing sees what a survey returns",
    );
}

/// Not a check: explores a world and prints what it found, for work on the model.
/// `WORLD=main|one-user|one-user-faults|one-request|three` (budgets overridable:
/// `TICKS=`, `FAULTS=`, ...), `PROP=<property>` to stop at its first discovery and print it.
#[test]
#[ignore]
fn explore() {
    let world = named(&std::env::var("WORLD").unwrap_or("main".into()));
    let prop = std::env::var("PROP").ok();
    let stop: Option<&'static str> = prop.map(|p| &*Box::leak(p.into_boxed_str()));
    let c = check(world, stop, None);
    let mut found: Vec<_> = c.discoveries().into_iter().collect();
    found.sort_by_key(|(name, _)| *name);
    for (name, path) in found {
        println!("{name}: {} actions", path.clone().into_actions().len());
        if Some(name) == stop {
            print_trace(name, &path);
        }
    }
}
