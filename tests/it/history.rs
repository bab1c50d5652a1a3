//! History checker ("make the suite find the next ones").
//!
//! The randomized workload of `common/history/workload.rs` (deductions, reservations with
//! short TTLs, confirms, cancels and restocks; request ids reused; futures dropped at random
//! points) runs against several engines (each its own connection pool) sharing one SKU on one
//! real redis-server, and the history plus the store's records are checked (one file per check
//! under `common/history/check/`): one effect per request (a request is a user and a request
//! id: ids are scoped per user), all of it at the request's home; ok sales counted once,
//! unknown ones all or nothing; no user above the limit (the users' ledgers agree with their
//! records); one end state per reservation; conservation with the units in transit, every
//! transfer credited once and, after the sweep, none left in transit; no user refused below the
//! limit; sold out only when nothing was left. The nemesis suite (`tests/it/nemesis.rs`) runs
//! the same workload with faults injected.
//!
//! `HISTORY_SEED` replays a seed (printed at start; thread timing still varies),
//! `HISTORY_OPS` scales the workload (operations per variant), `HISTORY_REUSE` (percent of
//! requests reusing an earlier id, default 30) and `HISTORY_DROPS` (percent of calls dropped
//! after a tiny timeout, default 12) narrow a failure down. The whole history of each variant
//! is written to `target/tmp/history-<variant>.log`.

use crate::common;

use common::connection_killer::ConnectionKiller;
use common::history::workload::{self, *};
use common::history::*;
use common::*;
use shardstock::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;

#[derive(Clone, Copy)]
struct Variant {
    name: &'static str,
    lua: usize,
    coalesced: usize,
    kills: bool,
}

async fn run(srv: &RedisServer, v: Variant) {
    let mut engines = Vec::new();
    for _ in 0..v.lua {
        engines.push(redis_engine(srv, builder()).await);
    }
    for _ in 0..v.coalesced {
        engines.push(coalesced_engine(srv, builder(), Coalescing::default(), "t").await);
    }
    let port = srv.port;
    let fault = v.kills.then(|| {
        Fault::new("client connections killed every ~5 ms", move |stop| {
            tokio::spawn(async move {
                // Bounded: at most 12 000 rounds of ~5 ms.
                let killer = ConnectionKiller::start(port, 12_000);
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(ms(20)).await;
                }
                killer.stop()
            })
        })
    });
    workload::run(Run {
        name: v.name.into(),
        targets: engines
            .iter()
            .map(|e| Arc::new(e.clone()) as Arc<dyn Target>)
            .collect(),
        engines,
        fresh: Arc::new(redis_engine(srv, builder()).await),
        admin: admin_client(srv).await,
        fault,
        tolerated: none_tolerated(),
        tolerated_why: "",
    })
    .await;
}

/// (a) Three engines, plain lua.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_lua_three_engines() {
    let srv = RedisServer::start();
    run(
        &srv,
        Variant {
            name: "lua",
            lua: 3,
            coalesced: 0,
            kills: false,
        },
    )
    .await;
}

/// (b) Request coalescing: two coalesced engines and a plain one on the same keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_coalesced() {
    let srv = RedisServer::start();
    run(
        &srv,
        Variant {
            name: "coalesced",
            lua: 1,
            coalesced: 2,
            kills: false,
        },
    )
    .await;
}

/// (c) Three engines while every client connection is killed every few ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_connection_kills() {
    let srv = RedisServer::start();
    run(
        &srv,
        Variant {
            name: "kills",
            lua: 3,
            coalesced: 0,
            kills: true,
        },
    )
    .await;
}

// The checker itself, on small synthetic histories (no Redis): it accepts a correct one and
// names each broken promise in a broken one.

fn synthetic_op(seq: usize, kind: Kind, rid: &str, user: &str, qty: u64, out: Out) -> Op {
    Op {
        seq,
        engine: 0,
        kind,
        rid: rid.into(),
        user: user.into(),
        qty,
        ttl_ms: if kind == Kind::Reserve { 500 } else { 0 },
        resv: if matches!(kind, Kind::Confirm | Kind::Cancel) {
            resv_id(user, rid).to_string()
        } else {
            String::new()
        },
        why: "fresh",
        inv: 1_000_000 + seq as u64 * 10_000,
        ret: 1_000_000 + seq as u64 * 10_000 + 1_000,
        out,
    }
}

/// The home of `user`'s requests (the SKU has a per-user limit: the user's segment).
fn home_of(user: &str) -> u32 {
    shardstock::segments::home(
        &UserId::new(user).unwrap(),
        &RequestId::new("any").unwrap(),
        SEGMENTS,
        true,
    )
}

fn resv_id(user: &str, rid: &str) -> ReservationId {
    format!("{SKU}~1~{}~{user}~{rid}", home_of(user))
        .parse()
        .unwrap()
}

/// The audit of a SKU that sold `sold` units and moved nothing.
fn audit(sold: u64) -> Audit {
    Audit {
        sku: SKU.into(),
        generation: 1,
        loaded: LOADED,
        restocked: 0,
        remaining: LOADED - sold,
        sold,
        reserved: 0,
        expired: 0,
        in_transit: 0,
        ok: true,
        problems: Vec::new(),
        segments: Vec::new(),
    }
}

/// Facts with `recs`: per user, (request id, stored record) in the user's ledger at home.
fn synthetic_facts(recs: &[(&str, Vec<(&str, &str)>)], sold: u64) -> Facts {
    let mut f = Facts::empty(SEGMENTS, LIMIT, audit(sold));
    for (user, rs) in recs {
        add_ledger(&mut f, user, rs);
    }
    f
}

fn params() -> Params {
    Params {
        limit: LIMIT,
        loaded: LOADED,
        busy_grace_us: 0,
        sold_out_grace_us: 100_000,
        engines: 3,
    }
}

fn applied(user: &str, units: u64) -> Out {
    Out::Ok(Val::Ded(Deduction::Applied {
        segment: home_of(user),
        units,
    }))
}

fn classes(vs: &[Violation]) -> std::collections::BTreeSet<&'static str> {
    vs.iter().map(|v| v.class).collect()
}

#[test]
fn checker_accepts_a_correct_history() {
    let held = Reserved::Held {
        id: resv_id("ann", "r2"),
        segment: home_of("ann"),
        units: 1,
    };
    let ops = vec![
        synthetic_op(0, Kind::Deduct, "r1", "ann", 1, applied("ann", 1)),
        synthetic_op(
            1,
            Kind::Deduct,
            "r1",
            "ann",
            1,
            Out::Ok(Val::Ded(Deduction::Replayed {
                segment: home_of("ann"),
                units: 1,
            })),
        ),
        synthetic_op(2, Kind::Reserve, "r2", "ann", 1, Out::Ok(Val::Res(held))),
        synthetic_op(
            3,
            Kind::Deduct,
            "r3",
            "ann",
            1,
            Out::Ok(Val::Ded(Deduction::LimitReached { limit: LIMIT })),
        ),
        synthetic_op(
            4,
            Kind::Confirm,
            "r2",
            "ann",
            0,
            Out::Ok(Val::End(ReservationEnd {
                state: Some(shardstock::store::ResvState::Confirmed),
                done: true,
            })),
        ),
        // The same request id under another user: another request, applied on its own.
        synthetic_op(5, Kind::Deduct, "r1", "bob", 1, applied("bob", 1)),
        synthetic_op(
            6,
            Kind::Deduct,
            "r4",
            "bob",
            1,
            Out::Unknown("timeout".into()),
        ),
    ];
    let mut facts = synthetic_facts(
        &[
            // exp: 1600 ms on the server clock, 580 ms after the reserve returned.
            ("ann", vec![("r1", "A:1:0:0"), ("r2", "C:1:0:1600")]),
            // The unknown one took effect: fully in.
            ("bob", vec![("r1", "A:1:0:0"), ("r4", "A:1:0:0")]),
        ],
        4,
    );
    // A transfer moved 2 units home and was credited and marked done.
    facts.debits.push(Debit {
        donor: (home_of("bob") + 1) % SEGMENTS,
        id: "77".into(),
        dest: home_of("bob"),
        units: 2,
        done: true,
    });
    facts.credits.push(CreditFact {
        dest: home_of("bob"),
        id: "77".into(),
        units: 2,
    });
    let vs = check(&ops, &facts, params());
    assert!(vs.is_empty(), "{}", report(&ops, &facts, &vs, 4));
}

#[test]
fn checker_names_broken_promises() {
    let ops = vec![
        synthetic_op(0, Kind::Deduct, "r1", "ann", 1, applied("ann", 1)),
        // Replayed to a reservation of the same request: a kind mix-up.
        synthetic_op(
            1,
            Kind::Reserve,
            "r1",
            "ann",
            1,
            Out::Ok(Val::Res(Reserved::Replayed {
                id: resv_id("ann", "r1"),
                segment: home_of("ann"),
                units: 1,
            })),
        ),
        // Applied twice.
        synthetic_op(2, Kind::Deduct, "r1", "ann", 1, applied("ann", 1)),
        // Refused while holding nothing.
        synthetic_op(
            3,
            Kind::Deduct,
            "r9",
            "cat",
            1,
            Out::Ok(Val::Ded(Deduction::LimitReached { limit: LIMIT })),
        ),
        // Sold out while 10 units surely remained.
        synthetic_op(
            4,
            Kind::Deduct,
            "r5",
            "dan",
            1,
            Out::Ok(Val::Ded(Deduction::SoldOut)),
        ),
        // Units taken away from home.
        synthetic_op(
            5,
            Kind::Deduct,
            "r6",
            "eve",
            1,
            Out::Ok(Val::Ded(Deduction::Applied {
                segment: (home_of("eve") + 1) % SEGMENTS,
                units: 1,
            })),
        ),
    ];
    // The store sold 3 units but its records explain 2; eve's ledger counts a unit no record
    // holds; a credit matches no debit; a debit was never credited.
    let mut facts = synthetic_facts(&[("ann", vec![("r1", "A:1:0:0")])], 3);
    facts.add_field(home_of("eve"), "eve", "=r6", "A:1:0:0");
    facts.add_field(home_of("eve"), "eve", "h", "2");
    facts.add_field(home_of("eve"), "eve", "f", "2");
    facts.credits.push(CreditFact {
        dest: 0,
        id: "5".into(),
        units: 3,
    });
    facts.debits.push(Debit {
        donor: 1,
        id: "6".into(),
        dest: 2,
        units: 1,
        done: false,
    });
    let vs = check(&ops, &facts, params());
    let classes = classes(&vs);
    for want in [
        "applied more than once",
        "replayed across kinds (sale vs reservation)",
        "sold not explained by the request records",
        "refused below the limit (no stale entry left in the store)",
        "sold out while units surely remained",
        "units are not the request's at home",
        "ledger disagrees with its records",
        "credit without a matching debit",
        "units left in transit after the sweep",
    ] {
        assert!(
            classes.contains(want),
            "missing {want:?} in {classes:?}\n{}",
            table(&vs)
        );
    }
}

/// A sold out is judged with the units that surely came back: a restock acknowledged before
/// the sold-out TTL makes a later SoldOut wrong; one acknowledged just before it does not
/// (answered from memory).
#[test]
fn checker_allows_sold_out_only_when_nothing_is_left() {
    let restock = |seq: usize, qty: u64| {
        let mut o = synthetic_op(
            seq,
            Kind::Restock,
            &format!("s{seq}"),
            "",
            qty,
            Out::Ok(Val::Stock(Restocked {
                added: qty,
                replayed: false,
            })),
        );
        o.user = String::new();
        o
    };
    // Everything loaded was sold by 12 users with 1 unit each.
    let users: Vec<String> = (0..LOADED).map(|i| format!("u{i}")).collect();
    let mut ops: Vec<Op> = users
        .iter()
        .enumerate()
        .map(|(i, u)| synthetic_op(i, Kind::Deduct, "r", u, 1, applied(u, 1)))
        .collect();
    let recs: Vec<(&str, Vec<(&str, &str)>)> = users
        .iter()
        .map(|u| (u.as_str(), vec![("r", "A:1:0:0")]))
        .collect();
    let n = ops.len();
    ops.push(synthetic_op(
        n,
        Kind::Deduct,
        "x",
        "late",
        1,
        Out::Ok(Val::Ded(Deduction::SoldOut)),
    ));
    let facts = synthetic_facts(&recs, LOADED);
    let vs = check(&ops, &facts, params());
    assert!(vs.is_empty(), "{}", table(&vs));
    // A restock 5 ms before the sold out: within the grace.
    let mut near = ops.clone();
    let mut r = restock(n + 1, 2);
    r.inv = near[n].inv - 6_000;
    r.ret = near[n].inv - 5_000;
    near.push(r);
    let mut facts2 = facts.clone();
    facts2.audit.restocked = 2;
    facts2.audit.remaining = 2;
    let vs = check(&near, &facts2, params());
    assert!(
        !classes(&vs).contains("sold out while units surely remained"),
        "{}",
        table(&vs)
    );
    // The same restock 200 ms before: the units were there.
    let mut far = ops.clone();
    let mut r = restock(n + 1, 2);
    r.inv = far[n].inv - 201_000;
    r.ret = far[n].inv - 200_000;
    far.push(r);
    let vs = check(&far, &facts2, params());
    assert!(
        classes(&vs).contains("sold out while units surely remained"),
        "{}",
        table(&vs)
    );
}
