//! Property-based differential tests.
//!
//! 1. `memory_and_redis_agree`: random sequences of load / deduct / restock / replay run on
//!    `MemoryStore` and on `RedisStore` (a real redis-server, with and without coalescing) must
//!    give identical outcomes and identical per-segment stock after every step, and both must
//!    conserve stock.
//! 2. `memory_and_redis_agree_at_the_edges`: the same in lockstep over three worlds (memory,
//!    Redis, coalesced Redis), each with **two engines sharing one store**, with per-user limits,
//!    reservations (reserve / confirm / cancel / expiry), request ids reused across users and
//!    kinds, simulated crashes (store-level calls, then nothing) that later calls verify, seal or
//!    take over, and explicit waits past every lease and TTL. Besides identical transcripts, a
//!    model of what each answer promised is checked after every step (see [`World::check`]).
//! 3. `cancellation_keeps_invariants`: the same worlds and ops plus calls dropped at random
//!    points (`tokio::time::timeout` of a few µs); outcomes are timing-dependent, so only the
//!    invariants are checked, and at the end every dropped call is resolved by a retry.
//! 4. `regressions::*`: shrunk failures of 2 and 3 as fixed op lists, each naming what it found.
//!
//! Checked after every step (2, 3): audit ok; `loaded + restocked = remaining + reserved +
//! sold`; `reserved` covers the live reservations (equals them after expire + sweep); `sold`
//! lies between the units answered sold and that plus abandoned or dropped calls (after expire +
//! sweep: abandoned claims repaired, dropped calls all in or all out); per user, units sold +
//! reserved ≤ limit; no request id applied twice or as both kinds; no `limit_reached` for a
//! user whose sold + live reserved + asked units fit the limit; no lasting `user_busy`; no
//! protocol error. Every case ends with an expire and a purchase probe for every user on both
//! engines.
//!
//! Timing: every timer the ops create (reservation TTLs 60..100 ms, claim lease 100 ms, per-user
//! claim TTL 120 ms) is kept out of races: the runner notes when the first live timer was
//! created and, 35 ms later, waits 150 ms (past all of them) before the next op; an op that
//! straddles a timer anyway makes the case be run again (differential mode).
//!
//! Environment: `DIFF_CASES` (cases per property), `DIFF_SKIP` (comma-separated op families
//! left out of generation: load, deduct, reserve, confirm, cancel, replay, conflict, other-user,
//! other-kind, restock, crash-claim, crash-sold, crash-resv, crash-fallback, wait, expire, drop,
//! limits, two-engines), `DIFF_IGNORE` (comma-separated violation tags to look past, e.g.
//! `kind,lockout/expired`; every violation message starts with its `[tag]`),
//! `DIFF_SHRINK_SECS` (shrink time budget).

mod common;
use common::*;
use proptest::prelude::*;
use proptest::strategy::Strategy;
use shardstock::*;
use std::time::Duration;

#[derive(Debug, Clone)]
enum Op {
    Load {
        total: u64,
        segments: u32,
    },
    Deduct {
        user: u8,
        qty: u64,
        rid: u16,
    },
    /// Re-send the n-th earlier deduct (same id, same parameters).
    Replay {
        nth: usize,
    },
    /// Re-send an earlier request id with another quantity (a conflict).
    Conflict {
        nth: usize,
    },
    Restock {
        qty: u64,
        rid: u16,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0u64..40, 1u32..8).prop_map(|(total, segments)| Op::Load { total, segments }),
        8 => (0u8..6, 1u64..6, 0u16..60).prop_map(|(user, qty, rid)| Op::Deduct { user, qty, rid }),
        2 => (0usize..64).prop_map(|nth| Op::Replay { nth }),
        1 => (0usize..64).prop_map(|nth| Op::Conflict { nth }),
        2 => (1u64..12, 0u16..20).prop_map(|(qty, rid)| Op::Restock { qty, rid }),
    ]
}

/// Runs `ops` on one engine; returns a transcript of outcomes and states.
async fn run<S: Store>(e: &Engine<S>, sku_name: &str, ops: &[Op]) -> Vec<String> {
    let sku = Sku::new(sku_name).unwrap();
    let mut log = Vec::new();
    let mut sent: Vec<Deduct> = Vec::new();
    let mut generation = 0u32;
    let mut loaded = 0;
    let mut restocked = 0;
    for op in ops {
        let line = match op {
            Op::Load { total, segments } => {
                let r = e
                    .load(&sku, *total, LoadOptions::new(*segments).replace(true))
                    .await;
                generation += 1;
                loaded = *total;
                restocked = 0;
                // Generations are clock-based and differ between stores: compare the outcome.
                format!("load {:?}", r.map(|_| "new generation"))
            }
            Op::Deduct { user, qty, rid } => {
                // Request ids are scoped by generation on purpose: a reload resets the ledger.
                let d = Deduct::new(
                    sku_name,
                    &format!("u{user}"),
                    *qty,
                    &format!("g{generation}-r{rid}"),
                )
                .unwrap();
                let r = e.deduct(&d).await;
                sent.push(d);
                format!("deduct {r:?}")
            }
            Op::Replay { nth } if !sent.is_empty() => {
                let d = sent[nth % sent.len()].clone();
                format!("replay {:?}", e.deduct(&d).await)
            }
            Op::Conflict { nth } if !sent.is_empty() => {
                let mut d = sent[nth % sent.len()].clone();
                d.qty = d.qty % 5 + 1;
                format!("conflict {:?}", e.deduct(&d).await)
            }
            Op::Restock { qty, rid } => {
                let r = e
                    .restock(
                        &sku,
                        *qty,
                        &RequestId::new(format!("g{generation}-s{rid}")).unwrap(),
                    )
                    .await;
                if let Ok(Restocked { added, .. }) = &r {
                    restocked += added;
                }
                format!("restock {r:?}")
            }
            _ => continue,
        };
        log.push(line);
        if let Ok(a) = e.audit(&sku).await {
            assert!(a.ok, "{a:?}");
            assert_eq!(a.loaded, loaded);
            assert_eq!(a.restocked, restocked);
            assert_eq!(a.loaded + a.restocked, a.remaining + a.sold);
            let per: Vec<u64> = a.segments.iter().map(|s| s.state.stock).collect();
            log.push(format!("  state {per:?} sold {}", a.sold));
        }
    }
    log
}

#[test]
fn memory_and_redis_agree() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let srv = RedisServer::start();
    // Long hints so routing depends only on the sequence, never on timing.
    let builder = || {
        Engine::builder()
            .per_user_limit(0)
            .hint_ttl(Duration::from_secs(3600))
            .max_qty(5)
    };
    let redis = rt.block_on(redis_engine(&srv, builder()));
    // The same again with request coalescing on (own key prefix on the same server).
    let coalesced = rt.block_on(coalesced_engine(
        &srv,
        builder(),
        Coalescing::default(),
        "c",
    ));
    let cases = std::env::var("DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    let n = std::sync::atomic::AtomicU32::new(0);
    proptest!(ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() },
        |(first in (1u64..40, 1u32..8), ops in proptest::collection::vec(op(), 1..60))| {
        let name = format!("diff-{}", n.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let mut all = vec![Op::Load { total: first.0, segments: first.1 }];
        all.extend(ops);
        // A fresh memory engine per case; a fresh SKU name on the shared Redis server.
        let memory = memory_engine(builder());
        let a = rt.block_on(run(&memory, &name, &all));
        let b = rt.block_on(run(&redis, &name, &all));
        let c = rt.block_on(run(&coalesced, &name, &all));
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(a, c);
    });
}

// ---------------------------------------------------------------------------------------------
// At the edges: limits, reservations, reused ids, crashes, several engines, cancellation.
// ---------------------------------------------------------------------------------------------

use shardstock::segments::home;
use shardstock::store::{
    HomeReply, OnShort, ReqArgs, ResvState, SegAddr, SegmentRole, TakeReply, UserClaim,
};
use std::collections::BTreeMap;
use std::time::Instant;

/// Sleep of a `Wait` / `Expire`: past every timer below.
const WAIT: Duration = Duration::from_millis(150);
/// The sweeper takes over an abandoned claim one claim lease (100 ms here) after its lease.
const SWEEP_GRACE: Duration = Duration::from_millis(100);
/// Shortest timer an op can start (the shortest reservation TTL).
const SHORTEST_TIMER: Duration = Duration::from_millis(60);
/// A live timer this old makes the runner wait before the next op.
const AUTO_WAIT_AFTER: Duration = Duration::from_millis(35);
/// An op that ends this close to the shortest timer may have raced it.
const TIMER_MARGIN: Duration = Duration::from_millis(5);
/// TTL of a reservation left by a simulated crash.
const CRASH_RESV_TTL_MS: u64 = 80;
/// How long a `UserBusy` is retried when nothing is in flight (the promised cleanup bound).
const BUSY_POLL: Duration = Duration::from_secs(1);

fn edge_builder() -> EngineBuilder {
    Engine::builder()
        .per_user_limit(0)
        .hint_ttl(Duration::from_secs(3600))
        .max_qty(5)
        .claim_lease(Duration::from_millis(100))
        .user_claim_ttl(Duration::from_millis(120))
        // A retry of a claimed request answers InFlight at once instead of waiting out the
        // lease: its outcome then never depends on timing.
        .pending_wait(Duration::from_millis(5))
}

/// One op of the edge tests. `e` picks engine 0 or 1 (both over the same store); `rid` and
/// `user` are small so ids and users repeat; `nth` picks an earlier request or reservation
/// counting back from the latest (0), modulo their number.
#[derive(Debug, Clone)]
enum Act {
    /// Reload (replace) with a per-user limit (0 = none).
    Load {
        e: u8,
        total: u64,
        segments: u32,
        limit: u64,
    },
    Deduct {
        e: u8,
        user: u8,
        qty: u64,
        rid: u8,
    },
    Reserve {
        e: u8,
        user: u8,
        qty: u64,
        rid: u8,
        ttl_ms: u64,
    },
    /// Confirm the nth reservation id answered so far.
    Confirm {
        e: u8,
        nth: usize,
    },
    /// Cancel the nth reservation id answered so far.
    Cancel {
        e: u8,
        nth: usize,
    },
    /// Re-send the nth earlier request (same kind, user, qty and id).
    Replay {
        e: u8,
        nth: usize,
    },
    /// The nth earlier request's id with another quantity.
    Conflict {
        e: u8,
        nth: usize,
    },
    /// The nth earlier request's id and quantity for another user.
    OtherUser {
        e: u8,
        nth: usize,
        user: u8,
    },
    /// The nth earlier request (id, user, qty) as the other kind: sale <-> reservation.
    OtherKind {
        e: u8,
        nth: usize,
        ttl_ms: u64,
    },
    Restock {
        e: u8,
        qty: u64,
        rid: u8,
    },
    /// Crash after `user_claim`: a pending per-user entry (limited SKUs only).
    CrashClaim {
        e: u8,
        user: u8,
        qty: u64,
        rid: u8,
    },
    /// Crash after `user_claim` + `deduct_home` applied: sold, per-user entry still pending.
    CrashSold {
        e: u8,
        user: u8,
        qty: u64,
        rid: u8,
    },
    /// Crash after `user_claim` + `deduct_home` reserving (TTL 80 ms): entry still pending.
    CrashResv {
        e: u8,
        user: u8,
        qty: u64,
        rid: u8,
    },
    /// Crash in a fallback: `deduct_home(claim)` answered short, `take` of `part` units at the
    /// next segment, then nothing (an abandoned claim).
    CrashFallback {
        e: u8,
        user: u8,
        qty: u64,
        rid: u8,
        part: u64,
    },
    /// Sleep past every lease and TTL.
    Wait,
    /// Sleep past every lease and TTL, then `sweep` on both engines.
    Expire,
    /// (Cancellation test.) A deduct or reservation dropped after `us` µs. Its request id is
    /// new (`d<n>`); `Replay` & co. reuse it later.
    Drop {
        e: u8,
        user: u8,
        qty: u64,
        us: u64,
        resv: bool,
    },
}

fn skipped(family: &str) -> bool {
    std::env::var("DIFF_SKIP")
        .map(|s| s.split(',').any(|f| f.trim() == family))
        .unwrap_or(false)
}

fn act(cancellation: bool) -> impl Strategy<Value = Act> {
    let e = if skipped("two-engines") {
        0u8..1
    } else {
        0u8..2
    };
    let limit = if skipped("limits") { 0u64..1 } else { 0u64..4 };
    let (user, qty, rid) = (0u8..3, 1u64..4, 0u8..16);
    let ttl = 60u64..=100;
    let all: Vec<(&str, u32, BoxedStrategy<Act>)> = vec![
        (
            "load",
            1,
            (e.clone(), 0u64..16, 1u32..5, limit)
                .prop_map(|(e, total, segments, limit)| Act::Load {
                    e,
                    total,
                    segments,
                    limit,
                })
                .boxed(),
        ),
        (
            "deduct",
            8,
            (e.clone(), user.clone(), qty.clone(), rid.clone())
                .prop_map(|(e, user, qty, rid)| Act::Deduct { e, user, qty, rid })
                .boxed(),
        ),
        (
            "reserve",
            4,
            (
                e.clone(),
                user.clone(),
                qty.clone(),
                rid.clone(),
                ttl.clone(),
            )
                .prop_map(|(e, user, qty, rid, ttl_ms)| Act::Reserve {
                    e,
                    user,
                    qty,
                    rid,
                    ttl_ms,
                })
                .boxed(),
        ),
        (
            "confirm",
            2,
            (e.clone(), 0usize..64)
                .prop_map(|(e, nth)| Act::Confirm { e, nth })
                .boxed(),
        ),
        (
            "cancel",
            2,
            (e.clone(), 0usize..64)
                .prop_map(|(e, nth)| Act::Cancel { e, nth })
                .boxed(),
        ),
        (
            "replay",
            2,
            (e.clone(), 0usize..64)
                .prop_map(|(e, nth)| Act::Replay { e, nth })
                .boxed(),
        ),
        (
            "conflict",
            1,
            (e.clone(), 0usize..64)
                .prop_map(|(e, nth)| Act::Conflict { e, nth })
                .boxed(),
        ),
        (
            "other-user",
            2,
            (e.clone(), 0usize..64, user.clone())
                .prop_map(|(e, nth, user)| Act::OtherUser { e, nth, user })
                .boxed(),
        ),
        (
            "other-kind",
            2,
            (e.clone(), 0usize..64, ttl)
                .prop_map(|(e, nth, ttl_ms)| Act::OtherKind { e, nth, ttl_ms })
                .boxed(),
        ),
        (
            "restock",
            1,
            (e.clone(), 1u64..6, 0u8..8)
                .prop_map(|(e, qty, rid)| Act::Restock { e, qty, rid })
                .boxed(),
        ),
        (
            "crash-claim",
            1,
            (e.clone(), user.clone(), qty.clone(), rid.clone())
                .prop_map(|(e, user, qty, rid)| Act::CrashClaim { e, user, qty, rid })
                .boxed(),
        ),
        (
            "crash-sold",
            1,
            (e.clone(), user.clone(), qty.clone(), rid.clone())
                .prop_map(|(e, user, qty, rid)| Act::CrashSold { e, user, qty, rid })
                .boxed(),
        ),
        (
            "crash-resv",
            1,
            (e.clone(), user.clone(), qty.clone(), rid.clone())
                .prop_map(|(e, user, qty, rid)| Act::CrashResv { e, user, qty, rid })
                .boxed(),
        ),
        (
            "crash-fallback",
            2,
            (e.clone(), user.clone(), qty.clone(), rid.clone(), 1u64..4)
                .prop_map(|(e, user, qty, rid, part)| Act::CrashFallback {
                    e,
                    user,
                    qty,
                    rid,
                    part,
                })
                .boxed(),
        ),
        ("wait", 1, Just(Act::Wait).boxed()),
        ("expire", 1, Just(Act::Expire).boxed()),
        (
            "drop",
            if cancellation { 6 } else { 0 },
            (e, user, qty, 0u64..3000, proptest::bool::weighted(0.3))
                .prop_map(|(e, user, qty, us, resv)| Act::Drop {
                    e,
                    user,
                    qty,
                    us,
                    resv,
                })
                .boxed(),
        ),
    ];
    let kept: Vec<(u32, BoxedStrategy<Act>)> = all
        .into_iter()
        .filter(|(family, weight, _)| *weight > 0 && !skipped(family))
        .map(|(_, weight, s)| (weight, s))
        .collect();
    proptest::strategy::Union::new_weighted(kept)
}

/// A case: a first load, then up to `len` ops.
fn case(cancellation: bool, len: usize) -> impl Strategy<Value = Vec<Act>> {
    let limit = if skipped("limits") { 0u64..1 } else { 0u64..4 };
    (
        (1u64..16, 1u32..5, limit),
        proptest::collection::vec(act(cancellation), 1..len),
    )
        .prop_map(|((total, segments, limit), ops)| {
            let mut all = vec![Act::Load {
                e: 0,
                total,
                segments,
                limit,
            }];
            all.extend(ops);
            all
        })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sale,
    Resv,
}

/// What the answers so far say a request id did (current generation).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fx {
    /// Its units are sold for good (a sale, or a confirmed reservation).
    Sold,
    /// A reservation holding its units (until a wait passes).
    Held,
    /// A reservation that ended (cancelled or expired): holds nothing.
    Ended,
    /// A fallback claim abandoned by a crash, `taken` units taken so far.
    Limbo { taken: u64 },
    /// A dropped call: all of it in, or nothing.
    Unknown,
}

#[derive(Debug, Clone)]
struct RidFx {
    user: String,
    qty: u64,
    kind: Kind,
    fx: Fx,
    /// Waits before it was sent (a reservation of a dropped call found applied later is
    /// live only if no wait passed since).
    born: u32,
}

/// A request sent, for `Replay` & co.
#[derive(Debug, Clone)]
struct Sent {
    d: Deduct,
    kind: Kind,
    ttl_ms: u64,
}

/// The answers of one store kind, in a normalised form, and the model they build.
#[derive(Default)]
struct Model {
    /// Loads so far (request ids are scoped by it: a reload resets the ledger).
    loads: u32,
    loaded: u64,
    restocked: u64,
    limit: u64,
    rids: BTreeMap<String, RidFx>,
    /// Units known sold in this generation.
    sold: u64,
    /// Waits so far.
    waits: u32,
    /// Users per possible cause of a lockout, to name it (`lockout/<causes>`), so that
    /// `DIFF_IGNORE` can look past one cause: a reservation of theirs expired, they bought
    /// before the last reload, a crash left a pending claim of theirs that has not expired, a
    /// request of theirs was refused as a conflict, a crash left a reservation of theirs with a
    /// pending per-user entry, a reservation of theirs was cancelled, they were refused
    /// (rightly) with limit_reached before, a crash left a claim of theirs (expired or not).
    causes: BTreeMap<&'static str, std::collections::BTreeSet<String>>,
}

/// Answers folded into what the model needs.
#[derive(Debug)]
enum Got {
    Applied,
    Replayed,
    LimitReached(u64),
    NoStock,
    Sealed,
    Other,
}

fn got_deduct(r: &Result<Deduction>) -> Got {
    match r {
        Ok(Deduction::Applied { .. }) => Got::Applied,
        Ok(Deduction::Replayed { .. }) => Got::Replayed,
        Ok(Deduction::LimitReached { limit } | Deduction::OverLimit { limit }) => {
            Got::LimitReached(*limit)
        }
        Ok(
            Deduction::SoldOut | Deduction::Insufficient { .. } | Deduction::TooLargeToHold { .. },
        ) => Got::NoStock,
        Err(Error::Sealed(_)) => Got::Sealed,
        _ => Got::Other,
    }
}

fn got_reserve(r: &Result<Reserved>) -> Got {
    match r {
        Ok(Reserved::Held { .. }) => Got::Applied,
        Ok(Reserved::Replayed { .. }) => Got::Replayed,
        Ok(Reserved::NotHeld(d)) => got_deduct(&Ok(d.clone())),
        Err(Error::Sealed(_)) => Got::Sealed,
        _ => Got::Other,
    }
}

impl Model {
    fn holds(&self, user: &str) -> u64 {
        self.rids
            .values()
            .filter(|f| f.user == user)
            .map(|f| match f.fx {
                Fx::Sold | Fx::Held => f.qty,
                Fx::Limbo { taken } if taken == f.qty => f.qty,
                _ => 0,
            })
            .sum()
    }

    fn possible(&self, user: &str) -> u64 {
        self.rids
            .values()
            .filter(|f| f.user == user && f.fx == Fx::Unknown)
            .map(|f| f.qty)
            .sum()
    }

    fn live_reserved(&self) -> u64 {
        let held = self.rids.values().filter(|f| f.fx == Fx::Held);
        held.map(|f| f.qty).sum()
    }

    /// Units that may be sold beyond `sold`: abandoned takes and dropped calls.
    fn unsure(&self) -> u64 {
        self.rids
            .values()
            .map(|f| match f.fx {
                Fx::Limbo { taken } => taken,
                Fx::Unknown => f.qty,
                _ => 0,
            })
            .sum()
    }

    /// A wait passed every TTL: live reservations ended.
    fn after_wait(&mut self) {
        self.waits += 1;
        for f in self.rids.values_mut() {
            if f.fx == Fx::Held {
                f.fx = Fx::Ended;
                self.causes
                    .entry("expired")
                    .or_default()
                    .insert(f.user.clone());
            }
        }
        self.causes.remove("pending");
    }

    fn cause(&mut self, cause: &'static str, user: &str) {
        self.causes
            .entry(cause)
            .or_default()
            .insert(user.to_string());
    }

    /// A reload: a new ledger.
    fn reload(&mut self, total: u64, limit: u64) {
        // Anyone who did anything before: the old generation's ledger may still speak.
        let before: std::collections::BTreeSet<String> = self
            .rids
            .values()
            .map(|f| f.user.clone())
            .chain(self.causes.values().flatten().cloned())
            .collect();
        self.causes.clear();
        self.causes.insert("reload", before);
        self.loads += 1;
        self.rids.clear();
        self.sold = 0;
        self.loaded = total;
        self.restocked = 0;
        self.limit = limit;
    }

    fn lockout_tag(&self, user: &str) -> String {
        let causes: Vec<&str> = self
            .causes
            .iter()
            .filter(|(_, users)| users.contains(user))
            .map(|(c, _)| *c)
            .collect();
        if causes.is_empty() {
            "lockout".to_string()
        } else {
            format!("lockout/{}", causes.join("+"))
        }
    }

    /// Folds the answer to a `kind` request `d` into the model; returns what it broke.
    fn on_got(&mut self, kind: Kind, d: &Deduct, got: &Got) -> Option<String> {
        let rid = d.request_id.to_string();
        let user = d.user.to_string();
        let cur = self.rids.get(&rid).cloned();
        let born = self.waits;
        let fresh = |fx| RidFx {
            user: user.clone(),
            qty: d.qty,
            kind,
            fx,
            born,
        };
        let effect = match kind {
            Kind::Sale => Fx::Sold,
            Kind::Resv => Fx::Held,
        };
        match got {
            Got::Applied => {
                // (A dropped call of either kind that is found out by this: it never applied.)
                let broken = match &cur {
                    Some(c) if c.kind != kind && c.fx != Fx::Unknown => Some(format!(
                        "[kind] request id {rid} was used for a {:?} ({:?}) and now applied as a {kind:?} too",
                        c.kind, c.fx
                    )),
                    Some(c) if !matches!(c.fx, Fx::Limbo { .. } | Fx::Unknown) => Some(format!(
                        "[twice] request id {rid} ({:?} of {} by {}) applied a second time (for {user})",
                        c.fx, c.qty, c.user
                    )),
                    _ => None,
                };
                if kind == Kind::Sale {
                    self.sold += d.qty;
                }
                self.rids.insert(rid, fresh(effect));
                return broken;
            }
            Got::Replayed => match cur {
                None => {
                    return Some(format!(
                        "[replay-never] {kind:?} {rid} of {user} answered replayed, but it never applied"
                    ));
                }
                Some(c) if c.kind != kind => {
                    if c.fx == Fx::Unknown {
                        // The dropped call applied (as its own kind).
                        let fx = match c.kind {
                            Kind::Sale => {
                                self.sold += c.qty;
                                Fx::Sold
                            }
                            Kind::Resv if c.born == self.waits => Fx::Held,
                            Kind::Resv => {
                                self.cause("expired", &c.user);
                                Fx::Ended
                            }
                        };
                        self.rids.get_mut(&rid).unwrap().fx = fx;
                    }
                    return Some(format!(
                        "[kind] a {kind:?} with request id {rid} answered replayed, but the id holds a {:?} ({:?})",
                        c.kind, c.fx
                    ));
                }
                Some(c) if c.user != user || c.qty != d.qty => {
                    return Some(format!(
                        "[replay-other] {rid} of {user} x{} answered replayed, but it applied for {} x{}",
                        d.qty, c.user, c.qty
                    ));
                }
                Some(c) => {
                    if matches!(c.fx, Fx::Limbo { .. } | Fx::Unknown) {
                        if kind == Kind::Sale {
                            self.sold += d.qty;
                        }
                        let fx = match kind {
                            Kind::Resv if c.fx == Fx::Unknown && c.born != self.waits => {
                                self.cause("expired", &user);
                                Fx::Ended
                            }
                            _ => effect,
                        };
                        self.rids.insert(rid, fresh(fx));
                    }
                }
            },
            Got::LimitReached(limit) => {
                let holds = self.holds(&user) + self.possible(&user);
                let tag = self.lockout_tag(&user);
                // Refused rightly (too many units asked): a cause of later lockouts too.
                self.cause("refused", &user);
                if *limit != self.limit {
                    return Some(format!(
                        "[lockout/stale-layout] {user} refused with limit_reached (limit {limit}), but the SKU is now loaded with limit {} (holding {holds}, asking {})",
                        self.limit, d.qty
                    ));
                }
                if holds + d.qty <= *limit {
                    return Some(format!(
                        "[{tag}] {user} refused with limit_reached (limit {limit}) holding {holds} units, asking {}",
                        d.qty
                    ));
                }
            }
            Got::NoStock | Got::Sealed => {
                if let Some(c) = &cur {
                    if matches!(c.fx, Fx::Limbo { .. } | Fx::Unknown) {
                        self.rids.remove(&rid);
                    } else if matches!(got, Got::Sealed) {
                        return Some(format!(
                            "[sealed-applied] {rid} answered sealed but it applied ({c:?})"
                        ));
                    }
                }
            }
            Got::Other => {}
        }
        None
    }
}

/// One store kind: two engines sharing one store, the SKU of this case and the model.
struct World<S: Store> {
    label: &'static str,
    engines: [Engine<S>; 2],
    name: String,
    sku: Sku,
    /// Generations seen, for normalising (after issue 11 they are large clock-based numbers
    /// that differ between stores).
    gens: Vec<u64>,
    m: Model,
    sent: Vec<Sent>,
    /// Reservation ids answered so far (raw).
    resv_ids: Vec<String>,
    log: Vec<String>,
    bad: Vec<String>,
    cancellation: bool,
    /// Dropped calls so far (their request ids).
    drops: u32,
}

/// What one step did in one world.
struct Out {
    line: String,
    /// The step may have started a timer (reservation, lease, pending entry).
    timers: bool,
}

impl<S: Store> World<S> {
    fn new(label: &'static str, engines: [Engine<S>; 2], name: &str, cancellation: bool) -> Self {
        Self {
            label,
            engines,
            name: name.to_string(),
            sku: Sku::new(name).unwrap(),
            gens: Vec::new(),
            m: Model::default(),
            sent: Vec::new(),
            resv_ids: Vec::new(),
            log: Vec::new(),
            bad: Vec::new(),
            cancellation,
            drops: 0,
        }
    }

    fn e(&self, i: u8) -> Engine<S> {
        self.engines[usize::from(i % 2)].clone()
    }

    fn req(&self, user: u8, qty: u64, rid: u8) -> Deduct {
        let rid = format!("g{}-r{rid}", self.m.loads);
        Deduct::new(&self.name, &format!("u{user}"), qty, &rid).unwrap()
    }

    fn gen_name(&mut self, g: u64) -> String {
        match self.gens.iter().position(|x| *x == g) {
            Some(i) => format!("G{}", i + 1),
            None => {
                self.gens.push(g);
                format!("G{}", self.gens.len())
            }
        }
    }

    /// `<sku>~<generation>~<segment>~<rid>` with the generation normalised.
    fn norm_id(&mut self, id: &str) -> String {
        let p: Vec<&str> = id.splitn(4, '~').collect();
        match p[..] {
            [sku, g, seg, rid] => match g.parse() {
                Ok(g) => format!("{sku}~{}~{seg}~{rid}", self.gen_name(g)),
                Err(_) => id.to_string(),
            },
            _ => id.to_string(),
        }
    }

    fn show_reserved(&mut self, r: &Result<Reserved>) -> String {
        match r {
            Ok(Reserved::Held { id, parts }) => {
                format!("Held {} {parts:?}", self.norm_id(&id.to_string()))
            }
            Ok(Reserved::Replayed { id, parts }) => {
                format!("Replayed {} {parts:?}", self.norm_id(&id.to_string()))
            }
            other => format!("{other:?}"),
        }
    }

    fn note(&mut self, v: Option<String>) {
        if let Some(v) = v {
            self.bad.push(v);
        }
    }

    fn check_error<T: std::fmt::Debug>(&mut self, what: &str, r: &Result<T>) {
        if let Err(e @ (Error::Protocol(_) | Error::Redis(_))) = r {
            self.bad.push(format!("[error] {what}: {e:?}"));
        }
    }

    /// Notes a refusal as a conflict: a possible cause of a later lockout.
    fn conflicted<T>(&mut self, d: &Deduct, r: &Result<T>) {
        if let Err(Error::RequestIdConflict { .. }) = r {
            self.m.cause("conflict", d.user.as_str());
        }
    }

    /// A deduct; `UserBusy` is retried for up to `BUSY_POLL` in the cancellation test
    /// (nothing else is in flight there, so the busy entry must go away).
    async fn sale(&mut self, e: u8, d: &Deduct, what: &str) -> String {
        let eng = self.e(e);
        let start = Instant::now();
        let mut r = eng.deduct(d).await;
        while self.cancellation
            && matches!(r, Ok(Deduction::UserBusy))
            && start.elapsed() < BUSY_POLL
        {
            tokio::time::sleep(Duration::from_millis(25)).await;
            r = eng.deduct(d).await;
        }
        if self.cancellation && matches!(r, Ok(Deduction::UserBusy)) {
            self.bad.push(format!(
                "[busy] {} still user_busy after {BUSY_POLL:?} with nothing in flight",
                d.user
            ));
        }
        self.check_error(what, &r);
        self.conflicted(d, &r);
        let v = self.m.on_got(Kind::Sale, d, &got_deduct(&r));
        self.note(v);
        format!("{what} {r:?}")
    }

    async fn reserve(&mut self, e: u8, d: &Deduct, ttl_ms: u64, what: &str) -> String {
        let eng = self.e(e);
        let ttl = Duration::from_millis(ttl_ms);
        let start = Instant::now();
        let mut r = eng.reserve(d, ttl).await;
        while self.cancellation
            && matches!(r, Ok(Reserved::NotHeld(Deduction::UserBusy)))
            && start.elapsed() < BUSY_POLL
        {
            tokio::time::sleep(Duration::from_millis(25)).await;
            r = eng.reserve(d, ttl).await;
        }
        if self.cancellation && matches!(r, Ok(Reserved::NotHeld(Deduction::UserBusy))) {
            self.bad.push(format!(
                "[busy] {} still user_busy after {BUSY_POLL:?} with nothing in flight",
                d.user
            ));
        }
        self.check_error(what, &r);
        self.conflicted(d, &r);
        if let Ok(Reserved::Held { id, .. } | Reserved::Replayed { id, .. }) = &r {
            self.resv_ids.push(id.to_string());
        }
        let v = self.m.on_got(Kind::Resv, d, &got_reserve(&r));
        self.note(v);
        format!("{what} {}", self.show_reserved(&r))
    }

    /// Sends `s` again (its own kind) or as `as_kind`.
    async fn resend(&mut self, e: u8, d: &Deduct, kind: Kind, ttl_ms: u64, what: &str) -> String {
        match kind {
            Kind::Sale => self.sale(e, d, what).await,
            Kind::Resv => self.reserve(e, d, ttl_ms, what).await,
        }
    }

    async fn end(&mut self, e: u8, nth: usize, confirm: bool) -> Option<String> {
        if self.resv_ids.is_empty() {
            return None;
        }
        let id = self.resv_ids[back(nth, self.resv_ids.len())].clone();
        let eng = self.e(e);
        let parsed: ReservationId = id.parse().unwrap();
        let r = if confirm {
            eng.confirm(&parsed).await
        } else {
            eng.cancel(&parsed).await
        };
        self.check_error("end", &r);
        let what = if confirm { "confirm" } else { "cancel" };
        let line = format!("{what} {} {r:?}", self.norm_id(&id));
        // Only reservations of the current generation are in the model.
        let p: Vec<&str> = id.splitn(4, '~').collect();
        let current = self.gens.last().map(|g| g.to_string());
        if p.len() == 4 && Some(p[1].to_string()) == current {
            let rid = p[3].to_string();
            let v = self.on_end(&rid, confirm, &r);
            self.note(v);
        }
        Some(line)
    }

    fn on_end(&mut self, rid: &str, confirm: bool, r: &Result<ReservationEnd>) -> Option<String> {
        let Ok(ReservationEnd { state, done }) = r else {
            return None;
        };
        let cur = self.m.rids.get(rid).cloned();
        let fx = cur.as_ref().map(|c| c.fx.clone());
        let resv = cur.as_ref().is_some_and(|c| c.kind == Kind::Resv);
        match (state, confirm, *done) {
            (Some(ResvState::Confirmed), true, true) => match fx {
                Some(Fx::Held | Fx::Unknown) if resv => {
                    let c = self.m.rids.get_mut(rid).unwrap();
                    c.fx = Fx::Sold;
                    self.m.sold += c.qty;
                }
                Some(Fx::Sold) if resv => {}
                other => {
                    return Some(format!(
                        "[resv] confirmed reservation {rid}, but it was {other:?}"
                    ));
                }
            },
            (Some(ResvState::Cancelled), false, true) => match fx {
                Some(Fx::Held | Fx::Unknown) if resv => {
                    let c = self.m.rids.get_mut(rid).unwrap();
                    c.fx = Fx::Ended;
                    let user = c.user.clone();
                    self.m.cause("cancelled", &user);
                }
                Some(Fx::Ended) => {}
                other => {
                    return Some(format!(
                        "[resv] cancelled reservation {rid}, but it was {other:?}"
                    ));
                }
            },
            (Some(ResvState::Expired | ResvState::Cancelled), _, _) => match fx {
                Some(Fx::Held) => {
                    return Some(format!(
                        "[resv] reservation {rid} is {state:?} in the store but live (no wait passed, not cancelled)"
                    ));
                }
                Some(Fx::Unknown) => self.m.rids.get_mut(rid).unwrap().fx = Fx::Ended,
                Some(Fx::Sold) if resv => {
                    return Some(format!(
                        "[resv] reservation {rid} was confirmed, the store says {state:?}"
                    ));
                }
                _ => {}
            },
            (Some(ResvState::Confirmed), false, _) if fx == Some(Fx::Held) => {
                return Some(format!(
                    "[resv] reservation {rid} confirmed behind our back"
                ));
            }
            (None, _, _) if fx == Some(Fx::Held) && resv => {
                return Some(format!(
                    "[resv] live reservation {rid} unknown to the store"
                ));
            }
            _ => {}
        }
        None
    }

    /// A process dies part-way through a request: store-level calls, then nothing.
    async fn crash(&mut self, act: &Act) -> String {
        let (e, user, qty, rid, part) = match *act {
            Act::CrashClaim { e, user, qty, rid }
            | Act::CrashSold { e, user, qty, rid }
            | Act::CrashResv { e, user, qty, rid } => (e, user, qty, rid, 0),
            Act::CrashFallback {
                e,
                user,
                qty,
                rid,
                part,
            } => (e, user, qty, rid, part),
            _ => unreachable!(),
        };
        let what = match act {
            Act::CrashClaim { .. } => "crash-claim",
            Act::CrashSold { .. } => "crash-sold",
            Act::CrashResv { .. } => "crash-resv",
            _ => "crash-fallback",
        };
        let eng = self.e(e);
        let store = eng.store();
        let sku = self.sku.clone();
        let d = self.req(user, qty, rid);
        let resv = matches!(act, Act::CrashResv { .. });
        let resv_ttl_ms = if resv { CRASH_RESV_TTL_MS } else { 0 };
        self.sent.push(Sent {
            d: d.clone(),
            kind: if resv { Kind::Resv } else { Kind::Sale },
            ttl_ms: resv_ttl_ms,
        });
        let meta = match store.meta(&sku).await {
            Ok(Some(m)) => m,
            other => return format!("{what}: meta {other:?}"),
        };
        let opts = eng.options();
        let args = ReqArgs {
            request_id: &d.request_id,
            user: &d.user,
            qty,
            ttl_ms: opts.request_ttl.as_millis() as u64,
            lease_ms: opts.claim_lease.as_millis() as u64,
            resv_ttl_ms,
            kind: if resv {
                shardstock::store::RequestKind::Reservation
            } else {
                shardstock::store::RequestKind::Sale
            },
        };
        let mut log = what.to_string();
        if meta.user_limit > 0 {
            let claim_ttl = opts.user_claim_ttl.as_millis() as u64;
            let c = store
                .user_claim(&sku, meta.generation, args, meta.user_limit, claim_ttl)
                .await;
            match &c {
                Ok(UserClaim::Limit {
                    used,
                    final_used,
                    stale,
                    ..
                }) => {
                    let mut stale = stale.clone();
                    stale.sort();
                    log += &format!(" claim Limit {used}/{final_used} {stale:?}");
                }
                other => log += &format!(" claim {other:?}"),
            }
            self.check_error(what, &c);
            if !matches!(c, Ok(UserClaim::Ok | UserClaim::Dup { .. })) {
                return log;
            }
        } else if matches!(act, Act::CrashClaim { .. }) {
            return format!("{log}: no limit");
        }
        if meta.user_limit > 0 {
            let user = d.user.as_str();
            if resv {
                self.m.cause("crash-resv", user);
            } else {
                self.m.cause("pending", user);
                self.m.cause("crashed", user);
            }
        }
        if matches!(act, Act::CrashClaim { .. }) {
            return log;
        }
        let n = meta.segments;
        let h = home(&d.request_id, n);
        let at = |index| SegAddr {
            sku: &sku,
            generation: meta.generation,
            index,
        };
        let fallback = matches!(act, Act::CrashFallback { .. });
        let on_short = if fallback {
            OnShort::Claim
        } else {
            OnShort::Report
        };
        let r = store.deduct_home(at(h), args, on_short).await;
        self.check_error(what, &r);
        match &r {
            // The lease left depends on timing.
            Ok(HomeReply::Pending { epoch, .. }) => log += &format!(" home Pending e{epoch}"),
            other => log += &format!(" home {other:?}"),
        }
        match r {
            Ok(HomeReply::Applied { .. }) => {
                let kind = if resv { Kind::Resv } else { Kind::Sale };
                if resv {
                    self.resv_ids.push(format!(
                        "{}~{}~{h}~{}",
                        self.name, meta.generation, d.request_id
                    ));
                }
                let v = self.m.on_got(kind, &d, &Got::Applied);
                self.note(v);
            }
            Ok(HomeReply::Short { claimed: true, .. }) => {
                let mut taken = 0;
                if n > 1 {
                    let t = store
                        .take(
                            at((h + 1) % n),
                            args,
                            part.min(qty),
                            1,
                            SegmentRole::Fallback,
                        )
                        .await;
                    self.check_error(what, &t);
                    log += &format!(" take {t:?}");
                    if let Ok(TakeReply::Taken { part, .. }) = t {
                        taken = part;
                    }
                }
                self.m.cause("pending", d.user.as_str());
                let prev = self.m.rids.insert(
                    d.request_id.to_string(),
                    RidFx {
                        user: d.user.to_string(),
                        qty,
                        kind: Kind::Sale,
                        fx: Fx::Limbo { taken },
                        born: self.m.waits,
                    },
                );
                if let Some(p) = prev.filter(|p| p.fx != Fx::Unknown) {
                    self.bad.push(format!(
                        "[twice] {what}: claimed {} although it was {p:?}",
                        d.request_id
                    ));
                }
            }
            _ => {}
        }
        log
    }

    /// Runs one op; returns its transcript line.
    async fn step(&mut self, act: &Act) -> Out {
        let mut timers = false;
        let line = match act {
            Act::Load {
                e,
                total,
                segments,
                limit,
            } => {
                let r = self
                    .e(*e)
                    .load(
                        &self.sku,
                        *total,
                        LoadOptions::new(*segments)
                            .replace(true)
                            .per_user_limit(*limit),
                    )
                    .await;
                self.check_error("load", &r);
                self.m.reload(*total, *limit);
                match r {
                    Ok(g) => format!("load {}", self.gen_name(g)),
                    Err(e) => format!("load {e:?}"),
                }
            }
            Act::Deduct { e, user, qty, rid } => {
                let d = self.req(*user, *qty, *rid);
                self.sent.push(Sent {
                    d: d.clone(),
                    kind: Kind::Sale,
                    ttl_ms: 0,
                });
                self.sale(*e, &d, "deduct").await
            }
            Act::Reserve {
                e,
                user,
                qty,
                rid,
                ttl_ms,
            } => {
                timers = true;
                let d = self.req(*user, *qty, *rid);
                self.sent.push(Sent {
                    d: d.clone(),
                    kind: Kind::Resv,
                    ttl_ms: *ttl_ms,
                });
                self.reserve(*e, &d, *ttl_ms, "reserve").await
            }
            Act::Confirm { e, nth } => match self.end(*e, *nth, true).await {
                Some(l) => l,
                None => return Out::skip(),
            },
            Act::Cancel { e, nth } => match self.end(*e, *nth, false).await {
                Some(l) => l,
                None => return Out::skip(),
            },
            Act::Replay { e, nth } | Act::Conflict { e, nth } | Act::OtherUser { e, nth, .. } => {
                if self.sent.is_empty() {
                    return Out::skip();
                }
                let s = self.sent[back(*nth, self.sent.len())].clone();
                let mut d = s.d.clone();
                let what = match act {
                    Act::Replay { .. } => "replay",
                    Act::Conflict { .. } => {
                        d.qty = d.qty % 3 + 1;
                        "conflict"
                    }
                    Act::OtherUser { user, .. } => {
                        let mut u = format!("u{user}");
                        if u == d.user.as_str() {
                            u = format!("u{}", (user + 1) % 3);
                        }
                        d.user = UserId::new(u).unwrap();
                        "other-user"
                    }
                    _ => unreachable!(),
                };
                timers = s.kind == Kind::Resv;
                let line = self.resend(*e, &d, s.kind, s.ttl_ms, what).await;
                format!("{line} [{} {} x{}]", d.request_id, d.user, d.qty)
            }
            Act::OtherKind { e, nth, ttl_ms } => {
                if self.sent.is_empty() {
                    return Out::skip();
                }
                let s = self.sent[back(*nth, self.sent.len())].clone();
                timers = true;
                let (kind, what) = match s.kind {
                    Kind::Sale => (Kind::Resv, "other-kind reserve"),
                    Kind::Resv => (Kind::Sale, "other-kind deduct"),
                };
                let line = self.resend(*e, &s.d, kind, *ttl_ms, what).await;
                format!("{line} [{} {} x{}]", s.d.request_id, s.d.user, s.d.qty)
            }
            Act::Restock { e, qty, rid } => {
                let id = RequestId::new(format!("g{}-s{rid}", self.m.loads)).unwrap();
                let r = self.e(*e).restock(&self.sku, *qty, &id).await;
                self.check_error("restock", &r);
                if let Ok(Restocked { added, .. }) = &r {
                    self.m.restocked += added;
                }
                format!("restock {r:?}")
            }
            Act::CrashClaim { .. }
            | Act::CrashSold { .. }
            | Act::CrashResv { .. }
            | Act::CrashFallback { .. } => {
                timers = true;
                self.crash(act).await
            }
            Act::Wait => {
                tokio::time::sleep(WAIT).await;
                self.m.after_wait();
                "wait".to_string()
            }
            Act::Expire => return self.expire().await,
            Act::Drop {
                e,
                user,
                qty,
                us,
                resv,
            } => {
                timers = true;
                self.dropped(*e, *user, *qty, *us, *resv).await
            }
        };
        // Anything refused or in flight may leave a pending entry or claim behind.
        timers |= line.contains("Err(") || line.contains("InFlight") || line.contains("UserBusy");
        Out { line, timers }
    }

    async fn dropped(&mut self, e: u8, user: u8, qty: u64, us: u64, resv: bool) -> String {
        self.drops += 1;
        let rid = format!("g{}-d{}", self.m.loads, self.drops);
        let d = Deduct::new(&self.name, &format!("u{user}"), qty, &rid).unwrap();
        let kind = if resv { Kind::Resv } else { Kind::Sale };
        self.sent.push(Sent {
            d: d.clone(),
            kind,
            ttl_ms: CRASH_RESV_TTL_MS,
        });
        let eng = self.e(e);
        let limit = Duration::from_micros(us);
        let ttl = Duration::from_millis(CRASH_RESV_TTL_MS);
        if resv {
            if let Ok(r) = tokio::time::timeout(limit, eng.reserve(&d, ttl)).await {
                self.check_error("drop", &r);
                self.conflicted(&d, &r);
                if let Ok(Reserved::Held { id, .. } | Reserved::Replayed { id, .. }) = &r {
                    self.resv_ids.push(id.to_string());
                }
                let v = self.m.on_got(kind, &d, &got_reserve(&r));
                self.note(v);
                return format!("drop(reserve) finished {}", self.show_reserved(&r));
            }
        } else {
            if let Ok(r) = tokio::time::timeout(limit, eng.deduct(&d)).await {
                self.check_error("drop", &r);
                self.conflicted(&d, &r);
                let v = self.m.on_got(kind, &d, &got_deduct(&r));
                self.note(v);
                return format!("drop(deduct) finished {r:?}");
            }
        }
        let rid = d.request_id.to_string();
        let prev = self.m.rids.get(&rid).map(|c| c.fx.clone());
        match prev {
            // A retry of something that took effect: no new effect possible.
            Some(Fx::Sold | Fx::Held | Fx::Ended) => {}
            _ => {
                self.m.cause("pending", d.user.as_str());
                self.m.cause("crashed", d.user.as_str());
                self.m.rids.insert(
                    rid,
                    RidFx {
                        user: d.user.to_string(),
                        qty,
                        kind,
                        fx: Fx::Unknown,
                        born: self.m.waits,
                    },
                );
            }
        }
        "dropped".to_string()
    }

    /// Waits past every timer, sweeps with both engines, then checks strictly: nothing
    /// reserved, and every abandoned claim resolved (units back, or settled when complete).
    async fn expire(&mut self) -> Out {
        // Past every timer, and past the sweeper's grace on abandoned claims (one more claim
        // lease: holders do not renew, so a slow live one gets that long to finish).
        tokio::time::sleep(WAIT + SWEEP_GRACE).await;
        self.m.after_wait();
        let mut swept = 0;
        for i in 0..2 {
            let eng = self.e(i);
            // So both engines know the current layout (sweep covers the SKUs an engine used).
            let _ = eng.remaining(&self.sku).await;
            match eng.sweep().await {
                Ok(n) => swept += n,
                Err(e) => self.bad.push(format!("[error] sweep: {e:?}")),
            }
        }
        Out {
            line: format!("expire swept {swept}"),
            timers: false,
        }
    }

    /// After every step: the audit and the model agree.
    ///
    /// - audit ok, `loaded + restocked = remaining + reserved + sold`, loaded and restocked as
    ///   sent;
    /// - `reserved` covers the live reservations; after an expire it equals them (0);
    /// - `sold` is at least the units answered sold, at most that plus abandoned takes and
    ///   dropped calls; after an expire, exactly the units answered sold plus dropped calls
    ///   that are fully in (each dropped call is all in or all out);
    /// - per user, units sold + reserved ≤ limit.
    async fn check(&mut self, strict: bool) -> String {
        let a = match self.engines[0].audit(&self.sku).await {
            Ok(a) => a,
            Err(e) => {
                self.check_error("audit", &Err::<(), _>(e));
                return "  audit failed".to_string();
            }
        };
        let mut bad = Vec::new();
        if !a.ok {
            bad.push(format!("[audit] audit not ok: {:?}", a.problems));
        }
        if a.loaded + a.restocked != a.remaining + a.reserved + a.sold {
            bad.push(format!(
                "[audit] loaded {} + restocked {} != remaining {} + reserved {} + sold {}",
                a.loaded, a.restocked, a.remaining, a.reserved, a.sold
            ));
        }
        if (a.loaded, a.restocked) != (self.m.loaded, self.m.restocked) {
            bad.push(format!(
                "[audit] loaded/restocked {}/{} but {}/{} were sent",
                a.loaded, a.restocked, self.m.loaded, self.m.restocked
            ));
        }
        let live = self.m.live_reserved();
        if a.reserved < live || (strict && a.reserved != live) {
            bad.push(format!(
                "[reserved] reserved {} but live reservations hold {live}{}",
                a.reserved,
                if strict {
                    " (after expire + sweep)"
                } else {
                    ""
                }
            ));
        }
        let (lo, unsure) = (self.m.sold, self.m.unsure());
        if a.sold < lo || a.sold > lo + unsure {
            bad.push(format!(
                "[sold] sold {} but answers say {lo} (+ up to {unsure} from abandoned or dropped calls)",
                a.sold
            ));
        } else if strict {
            // After the fixes an expired claim is repaired by the sweeper: refunded and
            // sealed, or settled as applied when all its parts were taken. So `sold` is what
            // the answers say, plus complete abandoned claims, plus dropped calls that are
            // wholly in.
            let complete: u64 = self
                .m
                .rids
                .values()
                .filter(|f| f.fx == (Fx::Limbo { taken: f.qty }))
                .map(|f| f.qty)
                .sum();
            let unknown: Vec<u64> = self
                .m
                .rids
                .values()
                .filter(|f| f.fx == Fx::Unknown && f.kind == Kind::Sale)
                .map(|f| f.qty)
                .collect();
            let extra = a.sold.checked_sub(lo + complete);
            if !extra.is_some_and(|x| subset_sum(&unknown, x)) {
                bad.push(format!(
                    "[abandoned] after expire + sweep sold {} = {lo} answered + {complete} of complete abandoned claims + {extra:?}, which no set of dropped calls {unknown:?} makes: units taken by an abandoned claim were not returned",
                    a.sold
                ));
            }
            for f in self.m.rids.values_mut() {
                if f.fx == (Fx::Limbo { taken: f.qty }) {
                    f.fx = Fx::Sold;
                }
            }
            self.m.sold += complete;
        }
        if self.m.limit > 0 {
            for u in 0..3 {
                let user = format!("u{u}");
                let h = self.m.holds(&user);
                if h > self.m.limit {
                    bad.push(format!(
                        "[limit] {user} holds {h} units, limit {}",
                        self.m.limit
                    ));
                }
            }
        }
        self.bad.extend(bad);
        let per: Vec<(u64, u64, u64)> = a
            .segments
            .iter()
            .map(|s| (s.state.stock, s.state.reserved, s.state.sold))
            .collect();
        format!("  (stock, reserved, sold) {per:?}")
    }

    /// End of a case: retry every dropped call until it is decided, then probe that every
    /// user below the limit can still buy on both engines.
    async fn finish(&mut self) -> String {
        let mut lines = Vec::new();
        let unknown: Vec<Sent> = self
            .sent
            .iter()
            .filter(|s| {
                s.d.request_id
                    .as_str()
                    .starts_with(&format!("g{}-", self.m.loads))
                    && self
                        .m
                        .rids
                        .get(s.d.request_id.as_str())
                        .is_some_and(|f| f.fx == Fx::Unknown && f.user == s.d.user.as_str())
            })
            .cloned()
            .collect();
        for s in unknown {
            let start = Instant::now();
            loop {
                let line = self.resend(0, &s.d, s.kind, s.ttl_ms, "resolve").await;
                let undecided = self
                    .m
                    .rids
                    .get(s.d.request_id.as_str())
                    .is_some_and(|f| f.fx == Fx::Unknown);
                if !undecided || start.elapsed() > BUSY_POLL {
                    lines.push(line);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
        if self.m.limit > 0 {
            for i in 0..2u8 {
                for u in 0..3u8 {
                    if self.m.holds(&format!("u{u}")) + 1 > self.m.limit {
                        continue;
                    }
                    let d = Deduct::new(
                        &self.name,
                        &format!("u{u}"),
                        1,
                        &format!("g{}-probe{i}-u{u}", self.m.loads),
                    )
                    .unwrap();
                    let eng = self.e(i);
                    let start = Instant::now();
                    let mut r = eng.deduct(&d).await;
                    while matches!(r, Ok(Deduction::UserBusy)) && start.elapsed() < BUSY_POLL {
                        tokio::time::sleep(Duration::from_millis(25)).await;
                        r = eng.deduct(&d).await;
                    }
                    if matches!(r, Ok(Deduction::UserBusy)) {
                        self.bad.push(format!(
                            "[busy] probe: u{u} user_busy on engine {i} for {BUSY_POLL:?}, nothing in flight"
                        ));
                    }
                    self.check_error("probe", &r);
                    let v = self.m.on_got(Kind::Sale, &d, &got_deduct(&r));
                    self.note(v);
                    lines.push(format!("probe e{i} u{u} {r:?}"));
                }
            }
        }
        lines.join("\n")
    }
}

impl Out {
    fn skip() -> Self {
        Out {
            line: String::new(),
            timers: false,
        }
    }
}

/// Index of the `nth` latest of `len` items (0: the latest), so shrinking keeps the target.
fn back(nth: usize, len: usize) -> usize {
    len - 1 - nth % len
}

fn subset_sum(items: &[u64], target: u64) -> bool {
    let mut reach = std::collections::BTreeSet::from([0u64]);
    for i in items {
        let next: Vec<u64> = reach.iter().map(|r| r + i).collect();
        reach.extend(next);
    }
    reach.contains(&target)
}

/// The three worlds of one case.
struct Worlds {
    m: World<MemoryStore>,
    r: World<RedisStore>,
    c: World<RedisStore>,
    /// Violation tags to look past (besides `DIFF_IGNORE`).
    ignore: &'static [&'static str],
}

impl Worlds {
    async fn new(srv: &RedisServer, name: &str, cancellation: bool) -> Self {
        let b = edge_builder;
        let mem = MemoryStore::new();
        let m = [b().build(mem.clone()).unwrap(), b().build(mem).unwrap()];
        let url = srv.url();
        let redis = || {
            RedisStore::builder(&url)
                .pool_size(2)
                .key_prefix("t")
                .connect()
        };
        let r = [
            b().build(redis().await.unwrap()).unwrap(),
            b().build(redis().await.unwrap()).unwrap(),
        ];
        let coalesced = || async {
            RedisStore::builder(&url)
                .pool_size(2)
                .key_prefix("c")
                .coalescing(Some(Coalescing::default()))
                .connect()
                .await
                .unwrap()
        };
        let c = [
            b().build(coalesced().await).unwrap(),
            b().build(coalesced().await).unwrap(),
        ];
        Self {
            m: World::new("memory", m, name, cancellation),
            r: World::new("redis", r, name, cancellation),
            c: World::new("coalesced", c, name, cancellation),
            ignore: &[],
        }
    }

    async fn close(&self) {
        for e in self.r.engines.iter().chain(&self.c.engines) {
            e.store().quit().await;
        }
    }

    fn after_wait(&mut self) {
        self.m.m.after_wait();
        self.r.m.after_wait();
        self.c.m.after_wait();
    }

    fn push(&mut self, lines: [&str; 3]) {
        for (w, l) in [&mut self.m.log, &mut self.r.log, &mut self.c.log]
            .into_iter()
            .zip(lines)
        {
            w.push(l.to_string());
        }
    }

    /// The first world with a broken invariant, or the first differing line.
    fn verdict(&self, i: usize, act: &str, compare: bool) -> Option<String> {
        for (label, bad, log) in [
            (self.m.label, &self.m.bad, &self.m.log),
            (self.r.label, &self.r.bad, &self.r.log),
            (self.c.label, &self.c.bad, &self.c.log),
        ] {
            let bad: Vec<&String> = bad.iter().filter(|v| !ignored(v, self.ignore)).collect();
            if !bad.is_empty() {
                return Some(format!(
                    "step {i} ({act}) on {label}: {}\n--- {label} transcript ---\n{}",
                    bad.iter()
                        .map(|v| v.as_str())
                        .collect::<Vec<_>>()
                        .join("; "),
                    tail(log)
                ));
            }
        }
        if compare && (self.m.log != self.r.log || self.m.log != self.c.log) {
            return Some(format!(
                "step {i} ({act}): transcripts differ\n--- memory ---\n{}\n--- redis ---\n{}\n--- coalesced ---\n{}",
                tail(&self.m.log),
                tail(&self.r.log),
                tail(&self.c.log)
            ));
        }
        None
    }
}

/// A violation tagged `[tag]` with a tag listed in `DIFF_IGNORE` or `also` (to look past a
/// known one); `lockout/a+b` is ignored when `lockout/a` and `lockout/b` are listed.
fn ignored(violation: &str, also: &[&str]) -> bool {
    let Some((tag, _)) = violation.strip_prefix('[').and_then(|v| v.split_once(']')) else {
        return false;
    };
    let ignore = std::env::var("DIFF_IGNORE").unwrap_or_default();
    let listed = |t: &str| ignore.split(',').any(|i| i.trim() == t) || also.contains(&t);
    listed(tag)
        || tag
            .strip_prefix("lockout/")
            .is_some_and(|causes| causes.split('+').all(|c| listed(&format!("lockout/{c}"))))
}

fn tail(log: &[String]) -> String {
    let keep = std::env::var("DIFF_TAIL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let from = log.len().saturating_sub(keep);
    log[from..].join("\n")
}

enum Verdict {
    Pass,
    Fail(String),
    /// An op may have raced a timer: run the case again.
    Tainted,
}

/// Runs `acts` in lockstep on the three worlds (each op on all three at once, so timers age
/// alike); `compare`: transcripts must be identical.
async fn run_edges(ws: &mut Worlds, acts: &[Act], compare: bool) -> Verdict {
    let mut timers_since: Option<Instant> = None;
    let all = acts.iter().chain([&Act::Expire]);
    for (i, act) in all.enumerate() {
        let sleeps = matches!(act, Act::Wait | Act::Expire);
        if !sleeps && timers_since.is_some_and(|t| t.elapsed() >= AUTO_WAIT_AFTER) {
            tokio::time::sleep(WAIT).await;
            ws.after_wait();
            ws.push(["(wait: timers)"; 3]);
            timers_since = None;
        }
        let t0 = Instant::now();
        let (a, b, c) = futures::join!(ws.m.step(act), ws.r.step(act), ws.c.step(act));
        if a.line.is_empty() && b.line.is_empty() && c.line.is_empty() {
            continue;
        }
        if sleeps {
            timers_since = None;
        } else if a.timers || b.timers || c.timers {
            timers_since.get_or_insert(t0);
        }
        if timers_since.is_some_and(|t| t.elapsed() >= SHORTEST_TIMER - TIMER_MARGIN) {
            if compare {
                return Verdict::Tainted;
            }
            // Invariants only: let every timer pass before looking.
            tokio::time::sleep(WAIT).await;
            ws.after_wait();
            timers_since = None;
        }
        ws.push([&a.line, &b.line, &c.line]);
        let strict = matches!(act, Act::Expire);
        let (sa, sb, sc) =
            futures::join!(ws.m.check(strict), ws.r.check(strict), ws.c.check(strict));
        ws.push([&sa, &sb, &sc]);
        if let Some(v) = ws.verdict(i, &format!("{act:?}"), compare) {
            return Verdict::Fail(v);
        }
    }
    let (a, b, c) = futures::join!(ws.m.finish(), ws.r.finish(), ws.c.finish());
    ws.push([&a, &b, &c]);
    let (sa, sb, sc) = futures::join!(ws.m.check(false), ws.r.check(false), ws.c.check(false));
    ws.push([&sa, &sb, &sc]);
    match ws.verdict(
        acts.len() + 1,
        "finish: resolve dropped calls, probe users",
        compare,
    ) {
        Some(v) => Verdict::Fail(v),
        None => Verdict::Pass,
    }
}

static CASE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// One case on fresh worlds (fresh SKU name), run again (up to 3 times) when it raced a timer.
async fn edge_case(
    srv: &RedisServer,
    acts: &[Act],
    cancellation: bool,
    ignore: &'static [&'static str],
) -> Verdict {
    for _ in 0..3 {
        let n = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("edge-{}-{n}", std::process::id());
        let mut ws = Worlds::new(srv, &name, cancellation).await;
        ws.ignore = ignore;
        let v = run_edges(&mut ws, acts, !cancellation).await;
        ws.close().await;
        if !matches!(v, Verdict::Tainted) {
            return v;
        }
    }
    Verdict::Tainted
}

fn edge_config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    let shrink_secs: u32 = std::env::var("DIFF_SHRINK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    ProptestConfig {
        cases,
        failure_persistence: None,
        max_shrink_time: shrink_secs * 1000,
        max_shrink_iters: 100_000,
        ..ProptestConfig::default()
    }
}

fn edge_property(cancellation: bool, default_cases: u32, len: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let srv = RedisServer::start();
    proptest!(edge_config(default_cases), |(acts in case(cancellation, len))| {
        match rt.block_on(edge_case(&srv, &acts, cancellation, &[])) {
            Verdict::Pass => {}
            Verdict::Fail(why) => prop_assert!(false, "{}", why),
            Verdict::Tainted => prop_assume!(false, "raced a timer three times"),
        }
    });
}

#[test]
fn memory_and_redis_agree_at_the_edges() {
    edge_property(false, 48, 40);
}

#[test]
fn cancellation_keeps_invariants() {
    edge_property(true, 32, 30);
}

/// Runs a fixed op list (a shrunk failure kept as a regression test).
fn regression(acts: Vec<Act>, cancellation: bool) {
    regression_past(acts, cancellation, &[]);
}

/// [`regression`], looking past violations tagged `ignore` (to reach a later finding).
fn regression_past(acts: Vec<Act>, cancellation: bool, ignore: &'static [&'static str]) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let srv = RedisServer::start();
    match rt.block_on(edge_case(&srv, &acts, cancellation, ignore)) {
        Verdict::Pass => {}
        Verdict::Fail(why) => panic!("{why}"),
        Verdict::Tainted => panic!("raced a timer three times"),
    }
}

// ---------------------------------------------------------------------------------------------
// Shrunk failures, kept as regression tests (found on the code before issue 11's fixes; each
// names what it found). `use Act::*` lists are the proptest output, trimmed after the failing
// step; the runner adds a final expire + probe of every user on both engines.
// ---------------------------------------------------------------------------------------------
#[rustfmt::skip]
mod regressions {
    use super::*;

    /// Issue 11 #1: a sale's request id sent again as a reservation answers `Replayed` (the record
    /// has no kind); the user's entry is rewritten from sold to reserved.
    #[test]
    fn edge_sale_id_reused_for_a_reservation() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 6, segments: 1, limit: 0 },
                Deduct { e: 0, user: 0, qty: 1, rid: 0 },
                OtherKind { e: 0, nth: 0, ttl_ms: 60 },
            ],
            false,
        );
    }

    /// Issue 11 #1, the other way round: a reservation's id sent as a sale answers `Replayed`
    /// (a "sale" whose unit goes back to stock when the reservation expires).
    #[test]
    fn edge_reservation_id_reused_for_a_sale() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 6, segments: 1, limit: 0 },
                Reserve { e: 0, user: 0, qty: 1, rid: 0, ttl_ms: 60 },
                OtherKind { e: 0, nth: 0, ttl_ms: 60 },
            ],
            false,
        );
    }

    /// Issue 11 #1, its consequence on the limit (looking past the replay itself): the sale's
    /// entry rewritten as a reservation is verified void, and the user (limit 1) gets a second
    /// unit.
    #[test]
    fn edge_kind_reuse_passes_the_limit() {
        use Act::*;
        regression_past(
            vec![
                Load { e: 0, total: 1, segments: 2, limit: 1 },
                Deduct { e: 0, user: 1, qty: 1, rid: 8 },
                OtherKind { e: 0, nth: 0, ttl_ms: 60 },
                Reserve { e: 1, user: 1, qty: 1, rid: 0, ttl_ms: 60 },
                Restock { e: 0, qty: 1, rid: 0 },
                CrashFallback { e: 0, user: 1, qty: 1, rid: 0, part: 1 },
            ],
            false,
            &["kind"],
        );
    }

    /// Issue 11 #3: Bob sends Alice's request id (conflict, 409); his pending claim stays and he,
    /// who bought nothing, is refused with limit_reached.
    #[test]
    fn edge_other_users_request_id_locks_out() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 3, segments: 1, limit: 1 },
                Deduct { e: 0, user: 0, qty: 1, rid: 0 },
                OtherUser { e: 0, nth: 0, user: 1 },
            ],
            false,
        );
    }

    /// Issue 11 #3 (seal path): a crash leaves u0's pending claim of request id r0, which u1 then
    /// buys with; verifying u0's entry answers mismatch forever, and u0 (3 of 3 free) is refused.
    #[test]
    fn edge_stale_claim_of_an_id_another_user_bought_with() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 5, segments: 1, limit: 3 },
                CrashClaim { e: 0, user: 0, qty: 2, rid: 0 },
                OtherUser { e: 0, nth: 0, user: 1 },
            ],
            false,
        );
    }

    /// Issue 11 #4 (and the plan's "LimitReached only when sold + live reserved + qty > limit"):
    /// a pending claim of another request id that has not expired answers limit_reached (should
    /// be user_busy) although the user holds nothing.
    #[test]
    fn edge_pending_claim_answers_limit_reached() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 0, segments: 1, limit: 2 },
                CrashClaim { e: 0, user: 0, qty: 1, rid: 0 },
                Deduct { e: 0, user: 0, qty: 2, rid: 1 },
            ],
            false,
        );
    }

    /// Issue 11 #5: a fallback abandoned after taking 1 of 2 units (crash between `take`s): after
    /// the lease and a sweep, the unit is still taken (sold 1, nothing sold).
    #[test]
    fn edge_abandoned_fallback_is_not_repaired() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 1, segments: 2, limit: 0 },
                CrashFallback { e: 0, user: 0, qty: 2, rid: 1, part: 1 },
                Expire,
            ],
            false,
        );
    }

    /// Issue 11 #6: a reservation whose per-user entry stayed pending (crash before
    /// `user_finish`) is verified as sold after it expired: u0 (1 of 2 held) is refused.
    #[test]
    fn edge_expired_crash_reservation_counts_as_sold() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 5, segments: 1, limit: 2 },
                CrashResv { e: 0, user: 0, qty: 1, rid: 0 },
            ],
            false,
        );
    }

    /// Issue 11 #7: a sealed request id read on the "home looks short" path is
    /// `Error::Protocol` on Redis (the record parser knows A and P only), a conflict on memory.
    #[test]
    fn edge_sealed_record_is_a_protocol_error_on_redis() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 1, segments: 3, limit: 3 },
                CrashClaim { e: 0, user: 0, qty: 2, rid: 0 },
                Restock { e: 1, qty: 3, rid: 0 },
                CrashClaim { e: 0, user: 0, qty: 1, rid: 0 },
                Wait,
                Deduct { e: 0, user: 0, qty: 2, rid: 1 },
                Deduct { e: 0, user: 0, qty: 1, rid: 0 },
                OtherUser { e: 1, nth: 3, user: 0 },
            ],
            false,
        );
    }

    /// Not in issue 11: the in-process guard keeps counting a reservation after it expired; the
    /// engine that made it answers limit_reached (for `guard_ttl`, 60 s) to a user holding nothing.
    #[test]
    fn edge_guard_counts_an_expired_reservation() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 2, segments: 1, limit: 1 },
                Reserve { e: 0, user: 0, qty: 1, rid: 0, ttl_ms: 60 },
            ],
            false,
        );
    }

    /// Not in issue 11: a reservation cancelled through another engine (instance) is not
    /// forgotten by the guard of the engine that made it: limit_reached for a user holding nothing.
    #[test]
    fn edge_guard_counts_a_reservation_cancelled_elsewhere() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 4, segments: 1, limit: 1 },
                Reserve { e: 0, user: 0, qty: 1, rid: 0, ttl_ms: 60 },
                Cancel { e: 1, nth: 0 },
                Deduct { e: 0, user: 0, qty: 1, rid: 1 },
            ],
            false,
        );
    }

    /// Not in issue 11: asking for more than is left of the limit (1 bought through the other
    /// engine, limit 2, asks 2: rightly refused by the store) saturates the guard at the limit; the
    /// same user asking for the 1 unit left is refused too.
    #[test]
    fn edge_guard_saturates_on_an_oversized_ask() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 5, segments: 1, limit: 2 },
                Deduct { e: 1, user: 0, qty: 1, rid: 2 },
                Deduct { e: 0, user: 0, qty: 2, rid: 0 },
                Deduct { e: 0, user: 0, qty: 1, rid: 1 },
            ],
            false,
        );
    }

    /// Not in issue 11: the guard is not scoped by generation: after a reload (a new ledger) a
    /// user who bought in the old generation is refused by the engine that saw it.
    #[test]
    fn edge_guard_survives_a_reload() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 1, segments: 1, limit: 1 },
                Deduct { e: 0, user: 0, qty: 1, rid: 0 },
                Load { e: 0, total: 1, segments: 1, limit: 1 },
                Deduct { e: 0, user: 0, qty: 1, rid: 0 },
            ],
            false,
        );
    }

    /// Issue 11 #10 without a data loss: after another engine reloads the SKU without a limit,
    /// an engine with the cached layout answers limit_reached {limit: 1} from its guard / the old
    /// generation's user record, without any call that would notice the new generation.
    #[test]
    fn edge_stale_layout_keeps_the_old_limit() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 1, segments: 1, limit: 1 },
                Deduct { e: 0, user: 0, qty: 1, rid: 0 },
                Load { e: 1, total: 1, segments: 1, limit: 0 },
                Deduct { e: 0, user: 0, qty: 1, rid: 0 },
            ],
            false,
        );
    }

    /// Not in issue 11: memory and Redis differ on the previous generation's records after a
    /// reload (memory's `load_segment` wipes them, Redis keeps them under `g<old>`); an engine
    /// with the stale layout verifies an expired entry there: memory seals (then sells on the new
    /// generation: sold_out), Redis finds the old sale (limit_reached {limit: 2} on an unlimited
    /// SKU). (Looks past the stale limit itself, see `edge_stale_layout_keeps_the_old_limit`.)
    #[test]
    fn edge_old_generation_records_differ_after_reload() {
        use Act::*;
        regression_past(
            vec![
                Load { e: 0, total: 1, segments: 1, limit: 0 },
                Deduct { e: 0, user: 1, qty: 1, rid: 0 },
                Load { e: 0, total: 2, segments: 1, limit: 2 },
                Deduct { e: 0, user: 0, qty: 3, rid: 0 },
                CrashFallback { e: 0, user: 1, qty: 2, rid: 0, part: 1 },
                Load { e: 1, total: 0, segments: 1, limit: 0 },
                Deduct { e: 0, user: 0, qty: 3, rid: 0 },
                Deduct { e: 0, user: 0, qty: 3, rid: 0 },
                Wait,
                Replay { e: 0, nth: 54 },
            ],
            false,
            &["lockout/stale-layout"],
        );
    }

    /// Issue 11 #4: a deduct dropped after the guard marked the user busy (Redis: at its first
    /// round trip) leaves the user busy on that engine for good (every busy answer refreshes
    /// it). (Shrunk to the first drop; a few more delays make a hit certain under load.)
    #[test]
    fn edge_dropped_deduct_leaves_user_busy() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 5, segments: 1, limit: 1 },
                Deduct { e: 0, user: 1, qty: 1, rid: 0 },
                Drop { e: 0, user: 0, qty: 1, us: 0, resv: false },
                Drop { e: 0, user: 0, qty: 1, us: 50, resv: false },
                Drop { e: 0, user: 0, qty: 1, us: 200, resv: true },
                Drop { e: 0, user: 0, qty: 1, us: 500, resv: false },
            ],
            true,
        );
    }

    /// Issue 11 #5 through cancellation: a deduct of 2 units over 4 segments of 1 unit, dropped at
    /// various points; one dropped mid-way through its multi-segment take leaves units taken for
    /// good (found with the drop at 2.2 ms; the spread of delays makes a hit likely anywhere).
    #[test]
    fn edge_dropped_fallback_is_not_repaired() {
        use Act::*;
        let mut acts = Vec::new();
        for us in (100..4000).step_by(150) {
            acts.push(Load { e: 0, total: 2, segments: 4, limit: 0 });
            acts.push(Deduct { e: 1, user: 1, qty: 1, rid: 0 });
            acts.push(Restock { e: 1, qty: 1, rid: 0 });
            acts.push(Drop {
                e: 1,
                user: 0,
                qty: 2,
                us,
                resv: false,
            });
            acts.push(Expire);
        }
        regression(acts, true);
    }
}
