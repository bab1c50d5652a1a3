//! Edge cases of request ids: one request id has one effect, whatever reuses it — a sale and a
//! reservation sharing it (kind), another user sending it, a sealed id, twins of one id racing
//! (decr-compensate, a shared per-user entry).
//!
//! Each asserts the behaviour promised after the fixes of issue 11, against real stores: the
//! embedded `MemoryStore` and `redis-server` processes (plain and with request coalescing).
//! Crash points are simulated with store-level calls (`engine.store()`) or by dropping futures.
//! Where a case runs on several stores, every store runs to its end and the test then fails
//! with each store's failure, named (`[redis] ...`). Shared helpers: `tests/common/edges.rs`.

mod common;
use common::edges::*;
use common::*;
use futures::FutureExt;
use futures::future::join_all;
use shardstock::segments::home;
use shardstock::store::{HomeReply, OnShort, ReqArgs, SealReply, UserClaim, UserFinish};
use shardstock::*;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// 1. A reservation and a sale with the same request id are a conflict ("kind").

async fn e01<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("kind");
    e.load(&s, 10, LoadOptions::new(2).per_user_limit(1))
        .await
        .unwrap();
    let ttl = Duration::from_secs(30);

    // Reservation first, then a sale with its request id.
    let (ann, _) = held(
        e.reserve(&d("kind", "ann", 1, "k1"), ttl).await,
        "ann reserves k1",
    );
    let sale = e.deduct(&d("kind", "ann", 1, "k1")).await;
    assert!(
        matches!(sale, Err(Error::RequestIdConflict { field: "kind", .. })),
        "[{tag}] a sale reusing reservation k1's request id: expected RequestIdConflict {{ field: \"kind\" }}, got {sale:?}"
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(
        (a.reserved, a.sold, a.remaining),
        (1, 0, 9),
        "[{tag}] the conflict changed something: {a:?}"
    );
    // Ann's entry is untouched: her reservation still counts against the limit.
    let more = e.deduct(&d("kind", "ann", 1, "k1b")).await.unwrap();
    assert_eq!(
        more,
        Deduction::LimitReached { limit: 1 },
        "[{tag}] ann holds a reservation"
    );
    let c = e.cancel(&ann).await.unwrap();
    assert!(c.done, "[{tag}] cancel of k1: {c:?}");
    let buy = e.deduct(&d("kind", "ann", 1, "k1c")).await.unwrap();
    assert_eq!(buy.units_applied(), 1, "[{tag}] ann after cancel: {buy:?}");

    // Sale first, then a reservation with its request id.
    let buy = e.deduct(&d("kind", "bob", 1, "k2")).await.unwrap();
    assert_eq!(buy.units_applied(), 1, "[{tag}] bob buys k2: {buy:?}");
    let resv = e.reserve(&d("kind", "bob", 1, "k2"), ttl).await;
    assert!(
        matches!(resv, Err(Error::RequestIdConflict { field: "kind", .. })),
        "[{tag}] a reservation reusing sale k2's request id: expected RequestIdConflict {{ field: \"kind\" }}, got {resv:?}"
    );
    // Bob's entry is untouched: his sale still counts (also after a verification round).
    for id in ["k3", "k4"] {
        let more = e.deduct(&d("kind", "bob", 1, id)).await.unwrap();
        assert_eq!(
            more,
            Deduction::LimitReached { limit: 1 },
            "[{tag}] bob bought k2 and asks again with {id}"
        );
    }
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(
        (a.reserved, a.sold, a.remaining),
        (0, 2, 8),
        "[{tag}] {a:?}"
    );

    // Without a per-user limit no user entry stands in front: the records alone must tell
    // the kinds apart (at the home segment, and for a sale served by fallback).
    let s = sku("kind0");
    e.load(&s, 4, LoadOptions::new(2).per_user_limit(0))
        .await
        .unwrap();
    held(
        e.reserve(&d("kind0", "cy", 1, "n1"), ttl).await,
        "cy reserves n1",
    );
    let sale = e.deduct(&d("kind0", "cy", 1, "n1")).await;
    assert!(
        matches!(sale, Err(Error::RequestIdConflict { field: "kind", .. })),
        "[{tag}] no limit: a sale reusing reservation n1's id: {sale:?}"
    );
    let buy = e.deduct(&d("kind0", "cy", 3, "n2")).await.unwrap();
    assert_eq!(buy.units_applied(), 3, "[{tag}] cy buys n2: {buy:?}");
    let resv = e.reserve(&d("kind0", "cy", 3, "n2"), ttl).await;
    assert!(
        matches!(resv, Err(Error::RequestIdConflict { field: "kind", .. })),
        "[{tag}] no limit: a reservation reusing sale n2's id: {resv:?}"
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!(
        (a.reserved, a.sold, a.remaining),
        (1, 3, 0),
        "[{tag}] no limit: {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e01_reservation_and_sale_with_one_request_id_conflict() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick()).await;
    run_all(
        true,
        vec![
            ("memory", e01(m, "memory").boxed()),
            ("redis", e01(r, "redis").boxed()),
            ("coalesced", e01(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// 3. A request id used by another user does not lock that user out (conflicts, seals and
//    mismatches end the pending entry).

async fn e03<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("reuse");
    let generation = e
        .load(&s, 10, LoadOptions::new(2).per_user_limit(1))
        .await
        .unwrap();
    let buy = e.deduct(&d("reuse", "alice", 1, "order-1")).await.unwrap();
    assert_eq!(buy.units_applied(), 1, "[{tag}] {buy:?}");
    let bob = e.deduct(&d("reuse", "bob", 1, "order-1")).await;
    assert!(
        matches!(bob, Err(Error::RequestIdConflict { field: "user", .. })),
        "[{tag}] bob reusing alice's order-1: {bob:?}"
    );
    let bob = e.deduct(&d("reuse", "bob", 1, "order-2")).await.unwrap();
    assert_eq!(
        bob.units_applied(),
        1,
        "[{tag}] bob bought nothing (order-1 was alice's) but his fresh order-2 got {bob:?}"
    );
    let more = e.deduct(&d("reuse", "alice", 1, "order-3")).await.unwrap();
    assert_eq!(more, Deduction::LimitReached { limit: 1 }, "[{tag}]");

    // A sealed request id ends the pending entry too.
    let store = e.store();
    let (r20, erin) = (rid("order-20"), uid("erin"));
    let seal = store
        .seal(
            at(&s, generation, home(&r20, 2)),
            args(&e, &r20, &erin, 1, 0),
        )
        .await
        .unwrap();
    assert_eq!(seal, SealReply::Sealed, "[{tag}]");
    let sealed = e.deduct(&d("reuse", "erin", 1, "order-20")).await;
    assert!(
        matches!(sealed, Err(Error::Sealed(_))),
        "[{tag}] erin's sealed order-20: {sealed:?}"
    );
    let erin_buys = e.deduct(&d("reuse", "erin", 1, "order-21")).await.unwrap();
    assert_eq!(
        erin_buys.units_applied(),
        1,
        "[{tag}] erin's order-20 was sealed (nothing sold) but her fresh order-21 got {erin_buys:?}"
    );

    // The seal path: carl's claim for order-9 stayed pending (his process died before
    // deducting); dora then used order-9. Once carl's claim expires it is verified: the home
    // record belongs to dora, so carl's entry is void, not kept forever.
    let (r9, carl) = (rid("order-9"), uid("carl"));
    let claim = store
        .user_claim(&s, generation, args(&e, &r9, &carl, 1, 0), 1, 200)
        .await
        .unwrap();
    assert_eq!(claim, UserClaim::Ok, "[{tag}]");
    let dora = e.deduct(&d("reuse", "dora", 1, "order-9")).await.unwrap();
    assert_eq!(dora.units_applied(), 1, "[{tag}] {dora:?}");
    let (carl_buys, busy) = until_not_busy(
        &e,
        &d("reuse", "carl", 1, "order-10"),
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(
        carl_buys.as_ref().map(Deduction::units_applied).ok(),
        Some(1),
        "[{tag}] carl's pending claim for order-9 (a request id dora then used) expired after 200 ms; his fresh order-10 got {carl_buys:?} (after {busy} UserBusy)"
    );
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!((a.sold, a.remaining), (5, 5), "[{tag}] {a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e03_request_id_of_another_user_does_not_lock_out() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick()).await;
    run_all(
        true,
        vec![
            ("memory", e03(m, "memory").boxed()),
            ("redis", e03(r, "redis").boxed()),
            ("coalesced", e03(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// 7. A sealed request id answers Err(Sealed) on every store and every path.

async fn e07<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("sealed");
    let generation = e
        .load(&s, 6, LoadOptions::new(2).per_user_limit(1))
        .await
        .unwrap(); // [3, 3]
    let seal = |id: &'static str, user: &'static str| {
        let e = e.clone();
        let s = s.clone();
        async move {
            let (r, u) = (rid(id), uid(user));
            let home_at = at(&s, generation, home(&r, 2));
            let reply = e.store().seal(home_at, args(&e, &r, &u, 1, 0)).await;
            assert_eq!(reply.unwrap(), SealReply::Sealed, "[{tag}] seal {id}");
        }
    };
    let expect_sealed = |r: Result<Deduction>, what: &str| {
        assert!(
            matches!(r, Err(Error::Sealed(_))),
            "[{tag}] sealed request id, {what}: expected Err(Sealed), got {r:?}"
        );
    };
    // (a) Its home segment has stock.
    seal("s-a", "sa").await;
    expect_sealed(
        e.deduct(&d("sealed", "sa", 1, "s-a")).await,
        "home segment has stock",
    );
    // (b) Its home segment is known to be empty (the engine reads the record first).
    let b_id = homed("s-b", 2, 0, 1).remove(0);
    let b_id: &'static str = Box::leak(b_id.into_boxed_str());
    seal(b_id, "sb").await;
    for (k, id) in homed("drain0-", 2, 0, 3).iter().enumerate() {
        let r = e
            .deduct(&d("sealed", &format!("d0{k}"), 1, id))
            .await
            .unwrap();
        assert_eq!(r.units_applied(), 1, "[{tag}] {r:?}");
    }
    expect_sealed(
        e.deduct(&d("sealed", "sb", 1, b_id)).await,
        "home segment empty",
    );
    // (c) Sold out.
    seal("s-c", "sc").await;
    for k in 0..10 {
        let r = e
            .deduct(&d("sealed", &format!("d1{k}"), 1, &format!("drain1-{k}")))
            .await
            .unwrap();
        if r == Deduction::SoldOut {
            break;
        }
    }
    expect_sealed(e.deduct(&d("sealed", "sc", 1, "s-c")).await, "sold out");
    let a = audit_ok(&e, &s, tag).await;
    assert_eq!((a.sold, a.remaining), (6, 0), "[{tag}] {a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e07_sealed_request_id_is_sealed_on_both_stores() {
    let srv = RedisServer::start();
    let b = quick().hint_ttl(Duration::from_secs(10));
    let (m, r, c) = three(&srv, b).await;
    run_all(
        true,
        vec![
            ("memory", e07(m, "memory").boxed()),
            ("redis", e07(r, "redis").boxed()),
            ("coalesced", e07(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// 8. decr-compensate: twins of one request id never both apply; no oversell; audit ok.

/// Found by review: decr-compensate's give-back ran on every run of its script, so a run
/// re-sent after a lost reply (fred re-sends in-flight commands) created units; and a stale
/// answer skipped the give-back, losing the units the decrement took from the new generation.
#[tokio::test]
async fn e08_decr_compensate_gives_back_once_per_decrement() {
    use fred::prelude::{LuaInterface, Value};
    let srv = RedisServer::start();
    let e = strategy_engine(
        &srv,
        Engine::builder().per_user_limit(0),
        Strategy::DecrCompensate,
        lock_opts(2000, 1000),
    )
    .await;
    let s = sku("decr1");
    let g = e
        .load(&s, 10, LoadOptions::new(1))
        .await
        .unwrap()
        .to_string();
    // Raw EVAL is the harness's, not the engine's (its ACL user may only EVALSHA).
    let client = admin_client(&srv).await;
    let lua = concat!(
        include_str!("../src/scripts/prelude.lua"),
        include_str!("../src/scripts/deduct_core.lua"),
        include_str!("../src/scripts/deduct.lua")
    );
    let keys = |g: &str| {
        vec![
            "t:{decr1#0}:seg".to_string(),
            format!("t:{{decr1#0}}:g{g}:rq:x"),
            format!("t:{{decr1#0}}:g{g}:resv"),
            format!("t:{{decr1#0}}:g{g}:claims"),
            "t:{decr1#0}:out".to_string(),
            "t:{decr1#0}:seg:dt:77".to_string(),
        ]
    };
    let args = |g: &str| -> Vec<String> {
        [g, "u", "3", "0", "60000", "1000", "1", "decr", "77", "0"]
            .map(String::from)
            .to_vec()
    };
    // One decrement, its script run twice (the second a re-send after a lost reply).
    srv.cli(&["HINCRBY", "t:{decr1#0}:seg", "stock", "-3"]);
    for _ in 0..2 {
        let _: Value = client.eval(lua, keys(&g), args(&g)).await.unwrap();
    }
    let a = e.audit(&s).await.unwrap();
    assert!(
        a.ok && (a.remaining, a.sold) == (7, 3),
        "one decrement, its script run twice: {a:?}"
    );
    // A decrement that lands on a newer generation than its script believes in: given back.
    let g2 = e
        .load(&s, 10, LoadOptions::new(1).replace(true))
        .await
        .unwrap();
    srv.cli(&["HINCRBY", "t:{decr1#0}:seg", "stock", "-3"]);
    let mut k = keys(&g);
    k[5] = "t:{decr1#0}:seg:dt:78".to_string();
    let mut a2 = args(&g);
    a2[8] = "78".to_string();
    let r: Value = client.eval(lua, k, a2).await.unwrap();
    assert!(format!("{r:?}").contains("stale"), "{r:?}");
    let a = e.audit(&s).await.unwrap();
    assert!(
        a.generation == g2 && a.ok && (a.remaining, a.sold) == (10, 0),
        "a stale script still gives its decrement back: {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e08_decr_compensate_twins_apply_once() {
    let srv = RedisServer::start();
    let mk = || {
        strategy_engine(
            &srv,
            Engine::builder().per_user_limit(0),
            Strategy::DecrCompensate,
            lock_opts(2000, 1000),
        )
    };
    let engines = [mk().await, mk().await];
    let mut problems = Vec::new();
    for round in 0..3 {
        let name = format!("twins{round}");
        let s = sku(&name);
        engines[0].load(&s, 30, LoadOptions::new(4)).await.unwrap();
        let mut tasks = Vec::new();
        // 20 request ids sent 8 times each at once (over two engines), 40 distinct ones.
        for k in 0..20 {
            for t in 0..8 {
                let (e, name) = (engines[t % 2].clone(), name.clone());
                tasks.push(tokio::spawn(async move {
                    let id = format!("tw{k}");
                    let r = e.deduct(&d(&name, &format!("tu{k}"), 1, &id)).await;
                    (id, r)
                }));
            }
        }
        for j in 0..40 {
            let (e, name) = (engines[j % 2].clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                let id = format!("dj{j}");
                let r = e.deduct(&d(&name, &format!("du{j}"), 1, &id)).await;
                (id, r)
            }));
        }
        let mut applied: std::collections::BTreeMap<String, u64> = Default::default();
        for t in join_all(tasks).await {
            let (id, r) = t.unwrap();
            match r {
                Ok(Deduction::Applied { .. }) => *applied.entry(id).or_default() += 1,
                Ok(_) => {}
                Err(e) => problems.push(format!("{name}: {id}: {e}")),
            }
        }
        let twice: Vec<String> = applied
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, n)| format!("{id} ×{n}"))
            .collect();
        if !twice.is_empty() {
            problems.push(format!(
                "{name}: request ids applied more than once: {}",
                twice.join(", ")
            ));
        }
        let a = engines[1].audit(&s).await.unwrap();
        if !a.ok || a.sold > 30 || a.sold != applied.len() as u64 {
            problems.push(format!(
                "{name}: {} request ids applied, audit: {a:?}",
                applied.len()
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "decr-compensate twins:\n  {}",
        problems.join("\n  ")
    );
    let summary = Strategy::DecrCompensate.summary().to_lowercase();
    assert!(
        summary.contains("exactly-once") || summary.contains("exactly once"),
        "decr-compensate's summary must say it is not exactly-once: {summary:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Found by review: twins of one request id share one per-user entry. One twin (sold out)
// removed it while the other, paused, then sold: its "sold" found no entry, so the unit was
// never counted and the user could buy past the limit. "sold" now writes the entry back.

async fn twin_voided_entry<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("twinvoid");
    let generation = e
        .load(&s, 10, LoadOptions::new(1).per_user_limit(1))
        .await
        .unwrap();
    let (x1, bob) = (rid("x1"), uid("bob"));
    let st = e.store();
    let a = args(&e, &x1, &bob, 1, 0);
    assert_eq!(
        st.user_claim(&s, generation, a, 1, 60_000).await.unwrap(),
        UserClaim::Ok,
        "[{tag}]"
    );
    // Twin 1 sold nothing and removed the entry.
    st.user_finish(&s, generation, a, UserFinish::Void)
        .await
        .unwrap();
    // Twin 2 (paused until now) sells and records it.
    let placed = st
        .deduct_home(at(&s, generation, home(&x1, 1)), a, OnShort::Claim)
        .await
        .unwrap();
    assert!(
        matches!(placed, HomeReply::Applied { .. }),
        "[{tag}] {placed:?}"
    );
    st.user_finish(&s, generation, a, UserFinish::Sold)
        .await
        .unwrap();
    let r = e.deduct(&d("twinvoid", "bob", 1, "y1")).await.unwrap();
    assert_eq!(
        r,
        Deduction::LimitReached { limit: 1 },
        "[{tag}] bob bought x1 through the second twin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_sold_twin_is_counted_after_its_twin_removed_the_entry() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick()).await;
    run_all(
        true,
        vec![
            ("memory", twin_voided_entry(m, "memory").boxed()),
            ("redis", twin_voided_entry(r, "redis").boxed()),
            ("coalesced", twin_voided_entry(c, "coalesced").boxed()),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Found by the history suite under connection kills over TLS (user above the limit): twins of
// one request id ran at once — a dropped call's background finish on one instance, a retry on
// another. The first sold nothing (shut out by the second's takeover) and removed the shared
// entry; the second's units went uncounted until its "reserved", and a third request of the user
// passed the limit in between. Now an attempt that sold nothing only releases itself: the entry
// stays while another attempt that joined it may still sell, and goes with the last one.

async fn twin_release<S: Store>(e: Engine<S>, tag: &'static str) {
    let s = sku("twinrel");
    let generation = e
        .load(&s, 10, LoadOptions::new(1).per_user_limit(1))
        .await
        .unwrap();
    let (x2, bob) = (rid("x2"), uid("bob"));
    let st = e.store();
    let twin = |attempt| ReqArgs {
        attempt,
        ..args(&e, &x2, &bob, 1, 0)
    };
    let (a, b) = (twin(11), twin(22));
    assert_eq!(
        st.user_claim(&s, generation, a, 1, 60_000).await.unwrap(),
        UserClaim::Ok,
        "[{tag}]"
    );
    assert!(
        matches!(
            st.user_claim(&s, generation, b, 1, 60_000).await.unwrap(),
            UserClaim::Dup { sold: false }
        ),
        "[{tag}] the twin joins"
    );
    // Twin a sold nothing: it releases itself; twin b is still in flight.
    st.user_finish(&s, generation, a, UserFinish::Release)
        .await
        .unwrap();
    let r = e.deduct(&d("twinrel", "bob", 1, "y2")).await.unwrap();
    assert_eq!(
        r,
        Deduction::UserBusy,
        "[{tag}] bob's unit in flight through twin b went uncounted"
    );
    // Twin b sells.
    let placed = st
        .deduct_home(at(&s, generation, home(&x2, 1)), b, OnShort::Claim)
        .await
        .unwrap();
    assert!(
        matches!(placed, HomeReply::Applied { .. }),
        "[{tag}] {placed:?}"
    );
    st.user_finish(&s, generation, b, UserFinish::Sold)
        .await
        .unwrap();
    // A late release of a twin that sold nothing leaves a sold entry alone.
    st.user_finish(&s, generation, a, UserFinish::Release)
        .await
        .unwrap();
    let r = e.deduct(&d("twinrel", "bob", 1, "y3")).await.unwrap();
    assert_eq!(r, Deduction::LimitReached { limit: 1 }, "[{tag}]");

    // Both twins of another id sell nothing: the entry goes with the last release, and the
    // user is not locked out.
    let (x4, ann) = (rid("x4"), uid("ann"));
    let twin = |attempt| ReqArgs {
        attempt,
        ..args(&e, &x4, &ann, 1, 0)
    };
    let (a, b) = (twin(33), twin(44));
    st.user_claim(&s, generation, a, 1, 60_000).await.unwrap();
    st.user_claim(&s, generation, b, 1, 60_000).await.unwrap();
    // The same attempt claiming again (a command re-sent by the client) joins once.
    st.user_claim(&s, generation, b, 1, 60_000).await.unwrap();
    st.user_finish(&s, generation, b, UserFinish::Release)
        .await
        .unwrap();
    assert_eq!(
        e.deduct(&d("twinrel", "ann", 1, "y4")).await.unwrap(),
        Deduction::UserBusy,
        "[{tag}] twin a still in flight"
    );
    st.user_finish(&s, generation, a, UserFinish::Release)
        .await
        .unwrap();
    let r = e.deduct(&d("twinrel", "ann", 1, "y5")).await.unwrap();
    assert!(
        matches!(r, Deduction::Applied { .. }),
        "[{tag}] ann locked out after both twins released: {r:?}"
    );
    audit_ok(&e, &s, tag).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_finding_a_twin_that_sold_nothing_never_uncounts_the_other_twin() {
    let srv = RedisServer::start();
    let (m, r, c) = three(&srv, quick()).await;
    run_all(
        true,
        vec![
            ("memory", twin_release(m, "memory").boxed()),
            ("redis", twin_release(r, "redis").boxed()),
            ("coalesced", twin_release(c, "coalesced").boxed()),
        ],
    )
    .await;
}
