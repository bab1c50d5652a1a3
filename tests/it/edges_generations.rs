//! Edge cases of generations: concurrent reloads, a Redis data loss, reservation ids that name
//! the generation their units are held in, reloads while requests are in flight (no unit of
//! an old generation sold in the new one, no request applied into the new generation without
//! its caller being told; on every safe strategy), and what a reload does to the per-user
//! limit (a new generation starts with fresh ledgers).
//!
//! Each runs against real stores: the embedded `MemoryStore` and `redis-server` processes
//! (plain and with request coalescing). Where a case runs on several stores, every store runs
//! to its end and the test then fails with each store's failure, named (`[redis] ...`).
//! Shared helpers: `tests/it/common/edges.rs`.

use crate::common;
use common::edges::*;
use common::*;
use futures::future::join_all;
use futures::{FutureExt, poll};
use shardstock::store::{RecordState, ResvState};
use shardstock::*;
use std::task::Poll;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Concurrent reloads from two engines leave the SKU sellable and the audit ok.

async fn concurrent_reloads<S: Store>(
    e1: Engine<S>,
    e2: Engine<S>,
    rounds: u64,
    tag: &'static str,
) {
    let s = sku("reload");
    e1.load(&s, 100, LoadOptions::new(4)).await.unwrap();
    for round in 0..rounds {
        let (n1, n2) = if round % 2 == 0 { (4, 2) } else { (3, 5) };
        let (t1, t2) = (100 + round, 50 + round);
        let load = |e: &Engine<S>, total: u64, segs: u32| {
            let (e, s) = (e.clone(), s.clone());
            tokio::spawn(async move {
                e.load(&s, total, LoadOptions::new(segs).replace(true))
                    .await
            })
        };
        let (h1, h2) = (load(&e1, t1, n1), load(&e2, t2, n2));
        let (r1, r2) = (h1.await.unwrap(), h2.await.unwrap());
        for r in [&r1, &r2] {
            assert!(
                matches!(r, Ok(_) | Err(Error::NotReady(_))),
                "[{tag}] round {round}: load: {r:?}"
            );
        }
        let won = [(&r1, t1, n1), (&r2, t2, n2)]
            .into_iter()
            .filter_map(|(r, t, n)| r.as_ref().ok().map(|g| (*g, t, n)))
            .max();
        let Some((g, total, segs)) = won else {
            panic!("[{tag}] round {round}: both loads failed: {r1:?} {r2:?}");
        };
        for (k, e) in [&e1, &e2].into_iter().enumerate() {
            let r = e
                .deduct(&d(
                    "reload",
                    &format!("b{round}-{k}"),
                    1,
                    &format!("x{round}-{k}"),
                ))
                .await;
            assert!(
                matches!(&r, Ok(x) if x.units_applied() == 1),
                "[{tag}] round {round}: after concurrent reloads ({n1} and {n2} segments; generation {g} with {segs} won), a deduct via engine {} got {r:?}; audit {:?}",
                k + 1,
                e1.audit(&s).await
            );
        }
        let a = e1.audit(&s).await.unwrap();
        assert!(
            a.ok && a.generation == g
                && a.loaded == total
                && a.segments.len() == segs as usize
                && a.sold == 2
                && a.in_transit == 0,
            "[{tag}] round {round}: generation {g} ({total} units, {segs} segments) won: {a:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reloads_leave_the_sku_sellable() {
    let srv = RedisServer::start();
    let b = Engine::builder().per_user_limit(0);
    let mem = MemoryStore::new();
    let (m1, m2) = (
        b.clone().build(mem.clone()).unwrap(),
        b.clone().build(mem).unwrap(),
    );
    let (r1, r2) = (
        redis_engine(&srv, b.clone()).await,
        redis_engine(&srv, b.clone()).await,
    );
    run_all(
        false,
        vec![
            ("memory", concurrent_reloads(m1, m2, 1000, "memory").boxed()),
            ("redis", concurrent_reloads(r1, r2, 60, "redis").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Generations stay unique across a Redis data loss; cached layouts follow the new one.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generations_unique_across_redis_data_loss() {
    let srv = RedisServer::start();
    let plain = redis_engine(&srv, Engine::builder()).await;
    let coalesced = coalesced_engine(&srv, Engine::builder(), Coalescing::default(), "t").await;
    let loader = redis_engine(&srv, Engine::builder()).await;
    let s = sku("lost");
    let g1 = plain
        .load(&s, 40, LoadOptions::new(4).per_user_limit(1))
        .await
        .unwrap();
    // Both engines cache the layout (generation g1, 4 segments, limit 1).
    for (k, e) in [&plain, &coalesced].into_iter().enumerate() {
        let r = e
            .deduct(&d("lost", &format!("early{k}"), 1, &format!("e{k}")))
            .await;
        assert!(matches!(&r, Ok(x) if x.units_applied() == 1), "{r:?}");
    }
    assert_eq!(srv.cli(&["FLUSHALL"]), "OK");
    let missing = loader.audit(&s).await;
    assert!(
        missing.is_err(),
        "the SKU's data is gone, audit says {missing:?}"
    );
    let g2 = loader
        .load(&s, 30, LoadOptions::new(2).per_user_limit(3))
        .await
        .unwrap();
    assert!(
        g2 > g1,
        "after FLUSHALL, a new load got generation {g2}: not greater than the lost generation {g1}"
    );
    // The engines that cached the old layout follow the new one (2 segments, limit 3).
    for (name, e) in [("plain", &plain), ("coalesced", &coalesced)] {
        let r = e
            .deduct(&d(
                "lost",
                &format!("carl-{name}"),
                3,
                &format!("c3-{name}"),
            ))
            .await;
        assert!(
            matches!(&r, Ok(x) if x.units_applied() == 3),
            "[{name}] an engine that cached generation {g1} (limit 1) after the reload to {g2} (limit 3): 3 units got {r:?}"
        );
        let r = e
            .deduct(&d(
                "lost",
                &format!("carl-{name}"),
                1,
                &format!("c4-{name}"),
            ))
            .await;
        assert!(
            matches!(r, Ok(Deduction::LimitReached { limit: 3 })),
            "[{name}] {r:?}"
        );
    }
    let a = audit_ok(&loader, &s, "redis").await;
    assert!(
        a.generation == g2 && a.loaded == 30 && a.segments.len() == 2 && a.sold == 6,
        "{a:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// A reservation id names the generation its units are held in, even when a reload happens
// right after the units were held and before the call answered.

async fn resv_id_generation<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("regen");
    let mut caught = 0;
    let mut generation = e
        .load(&s, 100, LoadOptions::new(2).per_user_limit(1))
        .await
        .unwrap();
    for attempt in 0..60 {
        let user = format!("u{attempt}");
        let (u, r) = (uid(&user), rid(&format!("rv{attempt}")));
        let req = d("regen", &user, 1, r.as_str());
        let home_at = at(&s, generation, home_of(&user, r.as_str(), 2, true));
        let fut = e.reserve(&req, Duration::from_secs(30));
        tokio::pin!(fut);
        // Drive the reservation until its units are held in the store, but do not let it
        // finish: then reload the SKU (same engine), then let it finish.
        let early = loop {
            if let Poll::Ready(out) = poll!(fut.as_mut()) {
                break Some(out);
            }
            if e.store().record(home_at, &u, &r).await.unwrap().is_some() {
                break None;
            }
        };
        if early.is_some() {
            continue;
        }
        let old = generation;
        generation = e
            .load(&s, 100, LoadOptions::new(2).replace(true).per_user_limit(1))
            .await
            .unwrap();
        let out = fut.await;
        caught += 1;
        match &out {
            Ok(Reserved::Held { id, .. } | Reserved::Replayed { id, .. }) => assert_eq!(
                id.generation(),
                old,
                "[{tag}] units held in generation {old} (reloaded to {generation} right after), but the reservation id is {id}"
            ),
            other => panic!(
                "[{tag}] units held in generation {old} (reloaded to {generation} right after): {other:?}"
            ),
        }
        if caught >= 5 {
            break;
        }
    }
    assert!(caught > 0, "[{tag}] the window was never hit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservation_id_names_its_generation_across_a_reload() {
    let srv = RedisServer::start();
    // The memory store's reservation completes in one poll: no window to reload in.
    let (_, r, c) = three(&srv, quick()).await;
    run_all(
        true,
        vec![
            ("redis", resv_id_generation(r, "redis").boxed()),
            ("coalesced", resv_id_generation(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Reloads while requests are in flight (finding 3, for the safe strategies). Buyers on two
// engines send requests without pause (sales and reservations, one unit each, every user and
// request id distinct) while a third engine reloads the SKU six times; stock is spread thin
// (40 units over 4 segments, a per-user limit, so every request is homed at its user's
// segment) and many requests move units home first. In the final generation:
// - the audit balances and, after a sweep, nothing is in transit (no unit debited in an old
//   generation is ever credited into it);
// - `sold` is exactly the number of sale records there, and `reserved` exactly the number of
//   reservations answered `Held` naming it (each held at its home, in state reserved);
// - no request answered anything but applied / held has a record there, and no reservation
//   answered held in an older generation has one (no request applied into the new
//   generation without its caller being told so).
// Run on lua (plain and coalesced), lock and redlock; the memory store too.
//
// Mutation checks (done): `sell.lua` without its generation check (a request addressed to an
// older generation applied to whatever the segment holds) fails `[redis]` and `[coalesced]`
// (the audit: reserved units held by nothing, sales without records); `[lock]` and `[redlock]`
// still pass, because a reload rewrites the segment hash and so resets its fence token (the
// old holder's fenced write answers lock_lost). Dropping both guards (`load_segment.lua`
// keeping the `fence` field across the reload too) fails `[lock]` and `[redlock]` as well.

/// One buyer's answer: (user / request index, reservation?, generation named (reservation
/// held) or 0 (sale applied) or None (not applied), the answer shown).
type Answer = (String, bool, Option<u64>, String);

async fn reload_in_flight<S: Store>(
    buyers: [Engine<S>; 2],
    loader: Engine<S>,
    name: &'static str,
    tag: &'static str,
) {
    let s = sku(name);
    loader
        .load(&s, 40, LoadOptions::new(4).per_user_limit(1))
        .await
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks: Vec<_> = (0..6)
        .map(|t| {
            let (e, stop) = (buyers[t % 2].clone(), stop.clone());
            tokio::spawn(async move {
                let mut out: Vec<Answer> = Vec::new();
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || n < 10 {
                    let key = format!("{t}-{n}");
                    let req = d(name, &format!("b{key}"), 1, &format!("q{key}"));
                    out.push(if n % 3 == 0 {
                        match e.reserve(&req, Duration::from_secs(20)).await {
                            Ok(Reserved::Held { id, .. }) => {
                                (key, true, Some(id.generation()), format!("held {id}"))
                            }
                            other => (key, true, None, format!("{other:?}")),
                        }
                    } else {
                        let r = e.deduct(&req).await;
                        let applied = matches!(r, Ok(Deduction::Applied { .. }));
                        (key, false, applied.then_some(0), format!("{r:?}"))
                    });
                    n += 1;
                    // The memory store never suspends: let the reloads run.
                    tokio::task::yield_now().await;
                }
                out
            })
        })
        .collect();
    let mut loads = Vec::new();
    for k in 0..6u64 {
        tokio::time::sleep(Duration::from_millis(4 + 3 * k)).await;
        loads.push(
            loader
                .load(
                    &s,
                    30 + k,
                    LoadOptions::new(4).replace(true).per_user_limit(1),
                )
                .await,
        );
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Stopped before anything may fail: the buyers never outlive the scenario.
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let generations: Vec<u64> = loads.into_iter().map(Result::unwrap).collect();
    let mut answers: Vec<Answer> = Vec::new();
    for t in join_all(tasks).await {
        answers.extend(t.unwrap());
    }
    let a = swept(&loader, &s, Duration::from_secs(2), tag).await;
    let g = a.generation;
    assert_eq!(Some(&g), generations.last(), "[{tag}]");
    let mut bad = Vec::new();
    let (mut sale_records, mut held_here, mut held_before) = (0u64, 0u64, 0u64);
    for (key, resv, answer_gen, shown) in &answers {
        let (user, request) = (format!("b{key}"), format!("q{key}"));
        let h = home_of(&user, &request, 4, true);
        let rec = loader
            .store()
            .record(at(&s, g, h), &uid(&user), &rid(&request))
            .await
            .unwrap();
        match (resv, answer_gen, &rec) {
            // A sale told applied may have applied in any generation.
            (false, Some(_), Some(r)) if r.state == RecordState::Sold => sale_records += 1,
            (false, Some(_), None) => {}
            (true, Some(ag), Some(r))
                if *ag == g && r.state == RecordState::Reservation(ResvState::Reserved) =>
            {
                held_here += 1
            }
            (true, Some(ag), None) if *ag != g => held_before += 1,
            // Not applied (sold out, ...): nothing anywhere.
            (_, None, None) => {}
            _ => bad.push(format!(
                "q{key} ({}) answered {shown}; its record in the final generation: {rec:?}",
                if *resv { "reservation" } else { "sale" }
            )),
        }
    }
    if a.sold != sale_records || a.reserved != held_here || a.sold + a.reserved > a.loaded {
        bad.push(format!(
            "final generation: {sale_records} sale records, {held_here} reservations held there, audit {a:?}"
        ));
    }
    assert!(
        bad.is_empty(),
        "[{tag}] reloads in flight (final generation {g}):\n  {}",
        bad.join("\n  ")
    );
    eprintln!(
        "[{tag}] {} requests; {held_before} reservations held in older generations; final generation: {sale_records} sold, {held_here} held",
        answers.len()
    );
    assert!(
        held_before > 0 && answers.len() > 30,
        "[{tag}] the reloads met no request in flight: {} requests, {held_before} held in older generations",
        answers.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_in_flight_never_sell_an_old_unit_in_the_new_generation() {
    let srv = RedisServer::start();
    let b = || quick().sold_out_ttl(Duration::ZERO);
    let mem = MemoryStore::new();
    let m = |st: &MemoryStore| b().build(st.clone()).unwrap();
    let mut cases = Vec::new();
    cases.push((
        "memory",
        reload_in_flight([m(&mem), m(&mem)], m(&mem), "inflight", "memory").boxed(),
    ));
    let r = [redis_engine(&srv, b()).await, redis_engine(&srv, b()).await];
    let rl = redis_engine(&srv, b()).await;
    cases.push((
        "redis",
        reload_in_flight(r, rl, "inflight", "redis").boxed(),
    ));
    let c = [
        coalesced_engine(&srv, b(), Coalescing::default(), "c").await,
        coalesced_engine(&srv, b(), Coalescing::default(), "c").await,
    ];
    let cl = coalesced_engine(&srv, b(), Coalescing::default(), "c").await;
    cases.push((
        "coalesced",
        reload_in_flight(c, cl, "inflight", "coalesced").boxed(),
    ));
    // The lock strategies: each step at home under a fenced per-segment lock.
    // A pause inside each critical section (between the fenced read and the write) widens the
    // window a reload can fall into.
    let pause = |e: Engine<RedisStore>| {
        e.store()
            .set_critical_section_pause(Duration::from_millis(2));
        e
    };
    let lk = || strategy_engine(&srv, b(), Strategy::Lock, lock_opts(2000, 1000));
    let l = [pause(lk().await), pause(lk().await)];
    let ll = lk().await;
    cases.push((
        "lock",
        reload_in_flight(l, ll, "inflight-lock", "lock").boxed(),
    ));
    let nodes: Vec<RedisServer> = (0..3)
        .map(|_| {
            let n = RedisServer::start_plain(common::redis_server::LOCK_NODE);
            // Brand-new nodes, marked so: they vote at once (see shardstock::lock::redlock).
            assert_eq!(
                n.cli(&["SET", shardstock::lock::redlock::QUARANTINE_KEY, "0"]),
                "OK"
            );
            n
        })
        .collect();
    let urls: Vec<String> = nodes.iter().map(|n| n.url()).collect();
    let rlk = || async {
        let store = store_builder(&srv, "t")
            .strategy(Strategy::Redlock)
            .lock_nodes(&urls)
            .lock_options(lock_opts(2000, 1000))
            .connect()
            .await
            .unwrap();
        b().build(store).unwrap()
    };
    let rl2 = [pause(rlk().await), pause(rlk().await)];
    let rll = rlk().await;
    cases.push((
        "redlock",
        reload_in_flight(rl2, rll, "inflight-redlock", "redlock").boxed(),
    ));
    run_all(false, cases).await;
}

/// Finding 3, the baseline: `decr-compensate`'s decrement and give-back are plain commands not
/// tied to a generation, so a decrement checked against generation g can land on g+1 after a
/// reload (the store's docs: src/store/redis/strategies.rs). Wherever the strategy is
/// described to users — the strategy table of `docs/design.md`, `Strategy::summary` — it must
/// say that it can oversell across a reload, and it must not claim `never_oversells`.
#[test]
fn decr_compensate_says_it_can_oversell_across_a_reload() {
    let design = include_str!("../../docs/design.md");
    let rows: Vec<&str> = design
        .lines()
        .filter(|l| l.starts_with("| `decr-compensate`"))
        .collect();
    assert!(
        !rows.is_empty(),
        "docs/design.md's strategy table has no decr-compensate row"
    );
    for row in rows {
        assert!(
            row.contains("reload"),
            "docs/design.md: decr-compensate's row does not say it can oversell across a reload: {row}"
        );
    }
    let summary = Strategy::DecrCompensate.summary();
    assert!(
        summary.contains("reload"),
        "Strategy::DecrCompensate.summary() does not say it can oversell across a reload: {summary}"
    );
    assert!(
        !Strategy::DecrCompensate.never_oversells(),
        "Strategy::DecrCompensate.never_oversells() is true, but it can oversell across a reload"
    );
    assert!(!Strategy::DecrCompensate.exactly_once());
}

// ---------------------------------------------------------------------------------------------
// What a reload does to the per-user limit: a new generation starts with fresh ledgers and
// fresh records. A user at the limit in generation g may buy again in g+1 — with a new request
// id, and also with the id of the request that bought in g (in g+1 it names no request yet) —
// on the engine whose in-process guard saw the user at the limit and on any other.

async fn limit_after_reload<S: Store>(a: Engine<S>, b: Engine<S>, tag: &'static str) {
    let s = sku("fresh");
    a.load(&s, 10, LoadOptions::new(2).per_user_limit(1))
        .await
        .unwrap();
    let r = a.deduct(&d("fresh", "una", 1, "u1")).await.unwrap();
    assert_eq!(r.units_applied(), 1, "[{tag}] {r:?}");
    let r = a.deduct(&d("fresh", "una", 1, "u2")).await.unwrap();
    assert_eq!(r, Deduction::LimitReached { limit: 1 }, "[{tag}]");
    let r = b.deduct(&d("fresh", "vic", 1, "v1")).await.unwrap();
    assert_eq!(r.units_applied(), 1, "[{tag}] {r:?}");
    b.load(&s, 10, LoadOptions::new(2).replace(true).per_user_limit(1))
        .await
        .unwrap();
    // una on the engine that saw her at the limit: a new id, then (another user's engine) the
    // old one.
    let r = a.deduct(&d("fresh", "una", 1, "u3")).await.unwrap();
    assert_eq!(
        r.units_applied(),
        1,
        "[{tag}] una after the reload (fresh ledger), on the engine that saw her at the limit: {r:?}"
    );
    let r = a.deduct(&d("fresh", "vic", 1, "v1")).await.unwrap();
    assert_eq!(
        r.units_applied(),
        1,
        "[{tag}] vic's v1 of the old generation, sent again after the reload, is a new request: {r:?}"
    );
    for (e, user, id) in [(&a, "una", "u4"), (&b, "vic", "v2")] {
        let r = e.deduct(&d("fresh", user, 1, id)).await.unwrap();
        assert_eq!(
            r,
            Deduction::LimitReached { limit: 1 },
            "[{tag}] {user} {id}"
        );
    }
    let au = audit_ok(&a, &s, tag).await;
    assert_eq!((au.sold, au.remaining), (2, 8), "[{tag}] {au:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_starts_fresh_per_user_ledgers() {
    let srv = RedisServer::start();
    let mem = MemoryStore::new();
    let (m1, m2) = (
        quick().build(mem.clone()).unwrap(),
        quick().build(mem).unwrap(),
    );
    let (r1, r2) = (
        redis_engine(&srv, quick()).await,
        redis_engine(&srv, quick()).await,
    );
    let c1 = coalesced_engine(&srv, quick(), Coalescing::default(), "c").await;
    let c2 = coalesced_engine(&srv, quick(), Coalescing::default(), "c").await;
    run_all(
        true,
        vec![
            ("memory", limit_after_reload(m1, m2, "memory").boxed()),
            ("redis", limit_after_reload(r1, r2, "redis").boxed()),
            ("coalesced", limit_after_reload(c1, c2, "coalesced").boxed()),
        ],
    )
    .await;
}

/// A generation written by a build with the earlier ledger layout (version 1: under a per-user
/// limit each user's ledger a hash of its own, with `h` and `f` beside the records) is still
/// read by the scripts that end it: a survey returns its expired reservation (the user's `h`
/// falls, an `expired` event), and the reload that replaces it cancels its live one (a
/// `cancelled` event), so no unit and no event is lost across the upgrade.
#[tokio::test]
async fn a_generation_of_the_earlier_ledger_layout_is_still_read_and_ended() {
    let srv = RedisServer::start();
    let e = redis_engine(&srv, Engine::builder()).await;
    let sku = Sku::new("old").unwrap();
    let (seg, base) = ("t:{old#0}:seg", "t:{old#0}:g5");
    let now = srv
        .cli(&["TIME"])
        .lines()
        .next()
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1000;
    let (gone, later) = (now - 60_000, now + 3_600_000);
    for (k, v) in [
        ("gen", "5"),
        ("stock", "8"),
        ("sold", "0"),
        ("loaded", "10"),
        ("restocked", "0"),
        ("reserved", "2"),
        ("tin", "0"),
        ("tout", "0"),
        ("lim", "1"),
        ("hf", "1"),
        ("out", "1"),
    ] {
        srv.cli(&["HSET", seg, k, v]);
    }
    let rec = |exp: u64| format!("R:1:{}:{exp}", exp + 60_000);
    for (user, rid, exp) in [("v1", "r1", gone), ("v2", "r2", later)] {
        let ledger = format!("{base}:u:{user}");
        srv.cli(&[
            "HSET",
            &ledger,
            "h",
            "1",
            "f",
            "0",
            &format!("={rid}"),
            &rec(exp),
        ]);
        srv.cli(&[
            "ZADD",
            &format!("{base}:resv"),
            &exp.to_string(),
            &format!("{user} {rid}"),
        ]);
    }
    let s = e
        .store()
        .survey(shardstock::store::SegAddr::new(&sku, 5, 0), true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            s.reclaimed,
            s.held,
            s.live,
            s.orphans,
            s.state.reserved,
            s.state.stock
        ),
        (1, 1, 1, 0, 1, 9),
        "{s:?}"
    );
    assert_eq!(srv.cli(&["HGET", &format!("{base}:u:v1"), "h"]), "0");
    assert!(
        srv.cli(&["HGET", &format!("{base}:u:v1"), "=r1"])
            .starts_with('X')
    );
    e.load(&sku, 10, LoadOptions::new(1).replace(true))
        .await
        .unwrap();
    let events = srv.cli(&["XRANGE", "t:{old#0}:out", "-", "+"]);
    let kinds: Vec<&str> = events
        .lines()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0] == "kind")
        .map(|w| w[1])
        .collect();
    assert_eq!(kinds, ["expired", "cancelled"], "{events}");
}
