//! A model checker over the cart protocol (`src/cart.rs`), built on stateright: every
//! interleaving of one two-item order's hold, its confirm and cancel racing each other and the
//! deadline, the sweeper, a single sale racing the order for the last unit, with a crash, a
//! re-sent call and a retry.
//!
//! The steps are the stores' own: the order's record is [`record::step`] (what `order.lua`
//! mirrors), each item's segment a memory-store [`Segment`] (`sell` with `order_item`,
//! `settle`, `holds_due`: what `sell.lua`, `settle.lua` and `holds_due.lua` mirror). The
//! engine's glue (`Engine::hold_order`, `decide_order`, `sweep_hold`) is re-stated here, each
//! script call a message in flight.
//!
//! # World
//! Order `o` of user 0: item 1 is one unit of SKU X (segment 0: 1 unit, per-user limit 1),
//! item 2 one unit of SKU Y (segment 1: 1 unit, no limit). A buyer (user 1) may buy Y's unit
//! (one `sell`). The record's deadline is [`HOLD_MS`]; one tick moves the clock past it.
//!
//! # Actors and actions
//! - `Hold(run)`: a hold of the order starts (the first, or a retry with the same request id);
//!   it opens the record, sends both items' holds at once, then marks the record held — or,
//!   an item refused, refuses the record and voids both items;
//! - `Decide(confirm)`: a client confirms (or cancels): the record step, then both items
//!   settled as the record says;
//! - `Sweep(seg)`: the sweeper takes the first item its segment lists past its hint, asks the
//!   record (`expire`) and settles the item as it says;
//! - `Deliver(i)`: a call runs at its place (one step) and its caller, if still waiting, uses
//!   the reply at once;
//! - `Crash(actor)`: an actor forgets what it was doing (its calls stay in flight: a late
//!   reply is dropped, the call may still run);
//! - `Resend(i)`: a call runs now and stays in flight to run again (fred after a reconnect);
//! - `Tick`: the clock passes the deadline and every hint.
//!
//! # Mutations
//! Each `mutation_*` test breaks one step of the glue or of the items in the model only and
//! asserts the checker finds a counterexample, printing the shortest trace.

use shardstock::cart::record::{self, OrderRecord, OrderState, OrderStep};
use shardstock::ids::{RequestId, UserId};
use shardstock::store::memory::Segment;
use shardstock::store::{ItemState, RecordState, SellArgs, SellReply, SettleReply};
use stateright::{Checker, Expectation, HasDiscoveries, Model, Path, Property};
use std::collections::BTreeSet;
use std::time::Instant;

/// The order's hold (ms): the deadline on the record's clock, and the items' hint.
const HOLD_MS: u64 = 10;
/// One tick: past every deadline and hint.
const TICK_MS: u64 = 20;
/// How long ended records are remembered: beyond the model's clock.
const TTL_MS: u64 = 1000;
/// The order's items as the record keeps them.
const ITEMS: &str = "X:1,Y:1";

/// A broken step the model must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Mutation {
    None,
    /// A confirm posts the items without waiting for the record's decision.
    ConfirmWithoutDecision,
    /// A void that finds no hold leaves nothing: a hold that arrives later is taken.
    NoVoidRecord,
    /// The sweeper gives an item back without asking its order.
    ExpiryIgnoresTheRecord,
    /// Items expire on their own clock, as reservations do.
    ItemsExpireOnTheirOwn,
}

/// Who waits for a reply: a hold run, a decider (confirm or cancel), the sweeper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Who {
    Hold(u8),
    Decider(bool),
    Sweeper,
    Buyer,
}

/// A call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Call {
    Open,
    Held,
    Refuse,
    Confirm,
    Cancel,
    Expire,
    /// Item `0`/`1`'s hold at its segment.
    Hold(usize),
    /// Item's settlement: post or void.
    Settle(usize, bool),
    /// The buyer's sale of Y's unit.
    Sale,
}

/// A call in flight from `who` (incarnation `inc`: a crash makes later replies stale).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Msg {
    who: Who,
    inc: u8,
    call: Call,
}

/// What a reply says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Reply {
    Record(Option<OrderState>),
    /// An item's hold: held (applied or replayed) or refused.
    Held(bool),
    Settled,
    Nothing,
}

/// A hold run's place in `hold_order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Run {
    Idle,
    Opening,
    /// Both items' holds sent: their answers so far.
    Holding([Option<bool>; 2]),
    Marking,
    Refusing,
    /// Items sent their settlements (post?), waiting for these many replies; then answers.
    Settling(bool, u8),
    Done,
}

/// A decider's or the sweeper's place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Job {
    Idle,
    /// The record step sent (the sweeper: for item `usize`).
    Asking(usize),
    /// Settlements sent (post?), replies awaited.
    Settling(bool, u8),
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    now: u64,
    record: Option<OrderRecord>,
    segs: [Segment; 2],
    net: Vec<Msg>,
    runs: [Run; 2],
    deciders: [Job; 2],
    sweeper: Job,
    inc: [u8; 5],
    sale_sent: bool,
    /// Faults and starts left: crashes, re-sends, hold runs.
    crashes: u8,
    resends: u8,
    /// The first decision the record took, and whether it ever changed.
    decision: Option<OrderState>,
    changed_decision: bool,
    /// A confirm was written at or past the deadline.
    late_confirm: bool,
    /// Someone finished giving both items back (a refusal, a cancel, an expiry answered).
    released: bool,
    /// Reached: an item's hold replayed its void; the sweeper settled an item.
    void_replayed: bool,
    swept: bool,
}

fn actor(w: Who) -> usize {
    match w {
        Who::Hold(r) => r as usize,
        Who::Decider(c) => 2 + c as usize,
        Who::Sweeper | Who::Buyer => 4,
    }
}

fn user(i: usize) -> UserId {
    UserId::new(if i == 0 { "u0" } else { "u1" }).unwrap()
}

fn item_rid(i: usize) -> RequestId {
    RequestId::new(format!("o#{}", i + 1)).unwrap()
}

/// Item `i`'s record at its segment.
fn item(s: &State, i: usize) -> Option<RecordState> {
    let l = s.segs[i].users.get(&user(0))?;
    l.records.get(&item_rid(i)).map(|r| r.state)
}

fn held(s: &State) -> bool {
    (0..2).any(|i| item(s, i) == Some(RecordState::Item(ItemState::Held)))
}

/// What a world lets happen.
#[derive(Debug, Clone, Copy)]
struct World {
    name: &'static str,
    /// The buyer may take Y's unit.
    sale: bool,
    /// A confirm may come; a cancel may come.
    confirm: bool,
    cancel: bool,
    /// A retry of the hold (after the first answered or died).
    retry: bool,
    crashes: u8,
    resends: u8,
}

/// Confirm, cancel and the deadline race; the sale makes a refusal possible.
const RACE: World = World {
    name: "race",
    sale: true,
    confirm: true,
    cancel: true,
    retry: false,
    crashes: 0,
    resends: 0,
};

/// A confirm, a retry of the hold, one crash and one re-sent call.
const FAULTS: World = World {
    name: "faults",
    sale: false,
    confirm: true,
    cancel: false,
    retry: true,
    crashes: 1,
    resends: 1,
};

/// A refusal (the sale takes Y's unit), a retry, a cancel and one crash: a hold that arrives
/// after its order was refused or cancelled (sent by the run that died).
const REFUSAL: World = World {
    name: "refusal",
    sale: true,
    confirm: false,
    cancel: true,
    retry: true,
    crashes: 1,
    resends: 0,
};

struct Orders {
    world: World,
    mutation: Mutation,
}

impl Orders {
    fn send(s: &mut State, who: Who, call: Call) {
        let inc = s.inc[actor(who)];
        s.net.push(Msg { who, inc, call });
        s.net.sort();
    }

    /// Runs `m` at its place; the reply.
    fn apply(&self, s: &mut State, m: Msg) -> Reply {
        let now = s.now;
        let step = match m.call {
            Call::Open => Some(OrderStep::Open {
                hold_ms: HOLD_MS,
                items: ITEMS,
            }),
            Call::Held => Some(OrderStep::Held),
            Call::Refuse => Some(OrderStep::Refuse { why: "2 sold_out" }),
            Call::Confirm => Some(OrderStep::Confirm),
            Call::Cancel => Some(OrderStep::Cancel),
            Call::Expire => Some(OrderStep::Expire),
            _ => None,
        };
        if let Some(step) = step {
            let before = s.record.as_ref().map(|r| r.state);
            let deadline = s.record.as_ref().map_or(u64::MAX, |r| r.deadline);
            let r = record::step(&mut s.record, step, now, TTL_MS);
            if let Some(st) = r.state.filter(|st| st.posts().is_some()) {
                match s.decision {
                    None => s.decision = Some(st),
                    Some(d) if d != st => s.changed_decision = true,
                    _ => {}
                }
                if st == OrderState::Confirmed && before != Some(st) && now >= deadline {
                    s.late_confirm = true;
                }
            }
            return Reply::Record(r.state);
        }
        match m.call {
            Call::Hold(i) => {
                let (u, rid) = (user(0), item_rid(i));
                let args = SellArgs {
                    request_id: &rid,
                    user: &u,
                    qty: 1,
                    resv_ttl_ms: HOLD_MS,
                    order_item: true,
                    ttl_ms: TTL_MS,
                    credits: &[],
                    fence: 0,
                };
                let was_void = item(s, i) == Some(RecordState::Item(ItemState::Voided));
                match s.segs[i].sell(&args, now) {
                    SellReply::Applied { .. } => Reply::Held(true),
                    SellReply::Replay => {
                        s.void_replayed |= was_void;
                        Reply::Held(true)
                    }
                    _ => Reply::Held(false),
                }
            }
            Call::Settle(i, post) => {
                if self.mutation == Mutation::NoVoidRecord && !post && item(s, i).is_none() {
                    return Reply::Settled;
                }
                let r = s.segs[i].settle(&user(0), &item_rid(i), 1, post, TTL_MS, now);
                assert!(
                    !matches!(r, SettleReply::Mismatch | SettleReply::Stale),
                    "{r:?}"
                );
                Reply::Settled
            }
            Call::Sale => {
                let (u, rid) = (user(1), RequestId::new("s").unwrap());
                let args = SellArgs {
                    request_id: &rid,
                    user: &u,
                    qty: 1,
                    resv_ttl_ms: 0,
                    order_item: false,
                    ttl_ms: TTL_MS,
                    credits: &[],
                    fence: 0,
                };
                s.segs[1].sell(&args, now);
                Reply::Nothing
            }
            _ => unreachable!(),
        }
    }

    /// Settlements of both items (post?) sent by `who`.
    fn settle_both(s: &mut State, who: Who, post: bool) {
        Self::send(s, who, Call::Settle(0, post));
        Self::send(s, who, Call::Settle(1, post));
    }

    /// `who` uses reply `r`.
    fn receive(&self, s: &mut State, who: Who, r: Reply) {
        match who {
            Who::Hold(k) => {
                let k = k as usize;
                s.runs[k] = match (s.runs[k], r) {
                    (Run::Opening, Reply::Record(Some(st))) if st.is_open() => {
                        Self::send(s, who, Call::Hold(0));
                        Self::send(s, who, Call::Hold(1));
                        Run::Holding([None, None])
                    }
                    (
                        Run::Opening | Run::Marking | Run::Refusing,
                        Reply::Record(Some(OrderState::Held)),
                    ) => Run::Done,
                    (Run::Opening | Run::Marking | Run::Refusing, Reply::Record(Some(st))) => {
                        let post = st.posts() == Some(true);
                        Self::settle_both(s, who, post);
                        Run::Settling(post, 2)
                    }
                    (Run::Holding(mut got), Reply::Held(ok)) => {
                        let i = got.iter().position(Option::is_none).unwrap();
                        got[i] = Some(ok);
                        match got {
                            [Some(true), Some(true)] => {
                                Self::send(s, who, Call::Held);
                                Run::Marking
                            }
                            [Some(_), Some(_)] => {
                                Self::send(s, who, Call::Refuse);
                                Run::Refusing
                            }
                            _ => Run::Holding(got),
                        }
                    }
                    (Run::Settling(post, n), Reply::Settled) => {
                        self.settled(s, post, n, Run::Done, Run::Settling)
                    }
                    (run, _) => run,
                };
            }
            Who::Decider(c) => {
                let d = c as usize;
                s.deciders[d] = match (s.deciders[d], r) {
                    (Job::Asking(_), Reply::Record(st)) => match st.and_then(OrderState::posts) {
                        Some(post) => {
                            if self.mutation == Mutation::ConfirmWithoutDecision && c {
                                Job::Done // the items were posted with the step
                            } else {
                                Self::settle_both(s, who, post);
                                Job::Settling(post, 2)
                            }
                        }
                        None => Job::Done,
                    },
                    (Job::Settling(post, n), Reply::Settled) => {
                        self.settled(s, post, n, Job::Done, Job::Settling)
                    }
                    (job, _) => job,
                };
            }
            Who::Sweeper => {
                s.sweeper = match (s.sweeper, r) {
                    (Job::Asking(i), Reply::Record(st)) => match st.and_then(OrderState::posts) {
                        Some(post) => {
                            Self::send(s, who, Call::Settle(i, post));
                            Job::Settling(post, 1)
                        }
                        None => Job::Idle,
                    },
                    (Job::Settling(..), Reply::Settled) => {
                        s.swept = true;
                        Job::Idle
                    }
                    (job, _) => job,
                };
            }
            Who::Buyer => {}
        }
    }

    /// One settlement answered: the next place, `done` once both answered (a release of both
    /// items is then recorded).
    fn settled<T>(
        &self,
        s: &mut State,
        post: bool,
        n: u8,
        done: T,
        more: impl Fn(bool, u8) -> T,
    ) -> T {
        if n > 1 {
            return more(post, n - 1);
        }
        if !post {
            s.released = true;
        }
        done
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Action {
    Hold(u8),
    Decide(bool),
    Sweep(usize),
    Sale,
    Deliver(Msg),
    Resend(Msg),
    Crash(Who),
    Tick,
}

impl Model for Orders {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            record: None,
            segs: [Segment::loaded(1, 1, 1), Segment::loaded(1, 1, 0)],
            net: Vec::new(),
            runs: [Run::Idle; 2],
            deciders: [Job::Idle; 2],
            sweeper: Job::Idle,
            inc: [0; 5],
            sale_sent: false,
            crashes: self.world.crashes,
            resends: self.world.resends,
            decision: None,
            changed_decision: false,
            late_confirm: false,
            released: false,
            void_replayed: false,
            swept: false,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        // The retry starts only once the first run ended or died (a client retries after an
        // answer or an error).
        let w = &self.world;
        if s.runs[0] == Run::Idle {
            out.push(Action::Hold(0));
        } else if w.retry && s.runs[1] == Run::Idle && (s.runs[0] == Run::Done || s.inc[0] > 0) {
            out.push(Action::Hold(1));
        }
        for (c, may) in [(true, w.confirm), (false, w.cancel)] {
            if may && s.deciders[c as usize] == Job::Idle && s.runs[0] != Run::Idle {
                out.push(Action::Decide(c));
            }
        }
        if s.sweeper == Job::Idle {
            for i in 0..2 {
                if !s.segs[i].holds_due(1, s.now).is_empty() {
                    out.push(Action::Sweep(i));
                }
            }
        }
        if w.sale && !s.sale_sent {
            out.push(Action::Sale);
        }
        let mut seen = None;
        for m in &s.net {
            if seen == Some(*m) {
                continue;
            }
            seen = Some(*m);
            out.push(Action::Deliver(*m));
            if s.resends > 0 {
                out.push(Action::Resend(*m));
            }
        }
        if s.crashes > 0 {
            for (k, r) in s.runs.iter().enumerate() {
                if !matches!(r, Run::Idle | Run::Done) {
                    out.push(Action::Crash(Who::Hold(k as u8)));
                }
            }
            for c in [true, false] {
                if matches!(s.deciders[c as usize], Job::Asking(_) | Job::Settling(..)) {
                    out.push(Action::Crash(Who::Decider(c)));
                }
            }
            if s.sweeper != Job::Idle {
                out.push(Action::Crash(Who::Sweeper));
            }
        }
        // The clock passes the deadline once, and again for each item held after that (its
        // hint is then ahead of the clock): time goes on.
        if s.now == 0 || (0..2).any(|i| s.segs[i].holds.iter().any(|(hint, _, _)| *hint > s.now)) {
            out.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Hold(k) => {
                s.runs[k as usize] = Run::Opening;
                Self::send(&mut s, Who::Hold(k), Call::Open);
            }
            Action::Decide(c) => {
                s.deciders[c as usize] = Job::Asking(0);
                Self::send(
                    &mut s,
                    Who::Decider(c),
                    if c { Call::Confirm } else { Call::Cancel },
                );
                if c && self.mutation == Mutation::ConfirmWithoutDecision {
                    Self::settle_both(&mut s, Who::Buyer, true);
                }
            }
            Action::Sweep(i) => {
                if self.mutation == Mutation::ExpiryIgnoresTheRecord {
                    s.sweeper = Job::Settling(false, 1);
                    Self::send(&mut s, Who::Sweeper, Call::Settle(i, false));
                } else {
                    s.sweeper = Job::Asking(i);
                    Self::send(&mut s, Who::Sweeper, Call::Expire);
                }
            }
            Action::Sale => {
                s.sale_sent = true;
                Self::send(&mut s, Who::Buyer, Call::Sale);
            }
            Action::Deliver(m) => {
                let at = s.net.iter().position(|x| *x == m)?;
                s.net.remove(at);
                let r = self.apply(&mut s, m);
                if m.inc == s.inc[actor(m.who)] {
                    self.receive(&mut s, m.who, r);
                }
            }
            Action::Resend(m) => {
                s.resends -= 1;
                self.apply(&mut s, m);
            }
            Action::Crash(w) => {
                s.crashes -= 1;
                s.inc[actor(w)] += 1;
                match w {
                    Who::Hold(k) => s.runs[k as usize] = Run::Done,
                    Who::Decider(c) => s.deciders[c as usize] = Job::Done,
                    Who::Sweeper => s.sweeper = Job::Idle,
                    Who::Buyer => {}
                }
            }
            Action::Tick => {
                s.now += TICK_MS;
                if self.mutation == Mutation::ItemsExpireOnTheirOwn {
                    for i in 0..2 {
                        if item(&s, i) == Some(RecordState::Item(ItemState::Held)) {
                            s.segs[i].settle(&user(0), &item_rid(i), 1, false, TTL_MS, s.now);
                        }
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "an item is sold only for a confirmed order",
                |_, s: &State| {
                    (0..2).all(|i| {
                        item(s, i) != Some(RecordState::Item(ItemState::Posted))
                            || s.record.as_ref().map(|r| r.state) == Some(OrderState::Confirmed)
                    })
                },
            ),
            Property::always(
                "an item goes back only for an order that did not confirm",
                |_, s: &State| {
                    (0..2).all(|i| {
                        item(s, i) != Some(RecordState::Item(ItemState::Voided))
                            || s.record
                                .as_ref()
                                .is_some_and(|r| r.state.posts() == Some(false))
                    })
                },
            ),
            Property::always("one decision", |_, s: &State| !s.changed_decision),
            Property::always("no confirm at or after the deadline", |_, s: &State| {
                !s.late_confirm
            }),
            Property::always("units are conserved", |_, s: &State| {
                s.segs.iter().all(|g| {
                    let c = &g.counters;
                    c.balances() && c.stock + c.reserved + c.sold == 1
                })
            }),
            Property::always(
                "nothing held once a release was answered",
                |_, s: &State| !s.released || !held(s),
            ),
            Property::always("nothing stranded at the end", |m: &Orders, s: &State| {
                let mut a = Vec::new();
                m.actions(s, &mut a);
                !a.is_empty() || !held(s)
            }),
            Property::sometimes("an order is confirmed", |_, s: &State| {
                (0..2).all(|i| item(s, i) == Some(RecordState::Item(ItemState::Posted)))
            }),
            Property::sometimes("an order expires", |_, s: &State| {
                s.record.as_ref().map(|r| r.state) == Some(OrderState::Expired)
            }),
            Property::sometimes("an order is refused", |_, s: &State| {
                s.record.as_ref().map(|r| r.state) == Some(OrderState::Refused)
            }),
            Property::sometimes("a cancel overtakes the open", |_, s: &State| {
                s.record
                    .as_ref()
                    .is_some_and(|r| r.state == OrderState::Cancelled && r.items.is_empty())
            }),
            Property::sometimes("a late hold replays its void", |_, s: &State| {
                s.void_replayed
            }),
            Property::sometimes("the sweeper settles an item", |_, s: &State| s.swept),
        ]
    }
}

fn print_trace(name: &str, path: &Path<State, Action>) {
    let steps = path.clone().into_vec();
    println!("--- {name}: {} actions ---", steps.len() - 1);
    for (i, (_, action)) in steps.iter().enumerate() {
        if let Some(a) = action {
            let s = &steps[i + 1].0;
            println!(
                "{:>3}. {a:?}\n       now {} record {:?} items {:?} {:?} runs {:?} deciders {:?} sweeper {:?}",
                i + 1,
                s.now,
                s.record.as_ref().map(|r| r.state),
                item(s, 0),
                item(s, 1),
                s.runs,
                s.deciders,
                s.sweeper
            );
        }
    }
}

fn check(world: World, mutation: Mutation, stop: Option<&'static str>) -> impl Checker<Orders> {
    let t = Instant::now();
    let mut b = Orders { world, mutation }.checker().threads(2);
    if let Some(name) = stop {
        b = b.finish_when(HasDiscoveries::AnyOf(BTreeSet::from([name])));
    }
    let c = b.spawn_bfs().join();
    println!(
        "orders, {} (mutation {mutation:?}): {} unique states ({} generated), depth {}, {:.1?}",
        world.name,
        c.unique_state_count(),
        c.state_count(),
        c.max_depth(),
        t.elapsed()
    );
    c
}

/// Checks `world` to the end: no counterexample to any `always` property, and an example of
/// each of `reached`.
fn holds(world: World, reached: &[&str]) {
    let c = check(world, Mutation::None, None);
    let props = c.model().properties();
    let mut broken = Vec::new();
    for p in &props {
        match (p.expectation.clone(), c.discovery(p.name)) {
            (Expectation::Always, Some(path)) => {
                print_trace(p.name, &path);
                broken.push(p.name);
            }
            (Expectation::Sometimes, None) if reached.contains(&p.name) => broken.push(p.name),
            _ => {}
        }
    }
    assert!(broken.is_empty(), "broken or never reached: {broken:?}");
}

#[test]
fn model_orders_hold_when_confirm_cancel_and_the_deadline_race() {
    holds(
        RACE,
        &[
            "an order is confirmed",
            "an order expires",
            "an order is refused",
            "a cancel overtakes the open",
            "the sweeper settles an item",
        ],
    );
}

#[test]
fn model_orders_hold_under_crashes_resends_and_retries() {
    holds(
        FAULTS,
        &["an order is confirmed", "the sweeper settles an item"],
    );
}

#[test]
fn model_orders_hold_when_a_hold_arrives_after_the_end() {
    holds(
        REFUSAL,
        &[
            "an order is refused",
            "a late hold replays its void",
            "the sweeper settles an item",
        ],
    );
}

/// Each mutation is caught by the property named.
#[test]
fn model_orders_mutations_are_caught() {
    for (world, m, property) in [
        (
            RACE,
            Mutation::ConfirmWithoutDecision,
            "an item is sold only for a confirmed order",
        ),
        (
            REFUSAL,
            Mutation::NoVoidRecord,
            "nothing held once a release was answered",
        ),
        (
            FAULTS,
            Mutation::ExpiryIgnoresTheRecord,
            "an item goes back only for an order that did not confirm",
        ),
        (
            RACE,
            Mutation::ItemsExpireOnTheirOwn,
            "an item goes back only for an order that did not confirm",
        ),
    ] {
        let c = check(world, m, Some(property));
        let path = c
            .discovery(property)
            .unwrap_or_else(|| panic!("{m:?}: no counterexample to {property:?}"));
        print_trace(property, &path);
    }
}
