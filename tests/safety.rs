//! Validation, strict script arguments, NOSCRIPT recovery, explicit reloads, and recovery of
//! a fallback claim whose holder died — against real redis-server processes.

mod common;
use common::*;
use fred::prelude::LuaInterface;
use fred::types::Value;
use shardstock::store::{HomeReply, OnShort, ReqArgs, SegAddr, SegmentRole, TakeReply};
use shardstock::*;
use std::time::Duration;

fn sku(s: &str) -> Sku {
    Sku::new(s).unwrap()
}

fn field(e: Error) -> &'static str {
    match e {
        Error::InvalidInput { field, .. } => field,
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

/// Every validation rule gives a typed error naming the field, and touches nothing.
#[tokio::test]
async fn bad_input_is_rejected_and_changes_nothing() {
    let srv = RedisServer::start();
    let e = redis_engine(&srv, Engine::builder().per_user_limit(0).max_qty(5)).await;
    let s = sku("valid");
    e.load(&s, 20, LoadOptions::new(4)).await.unwrap();
    let keys_before = srv.cli(&["DBSIZE"]);
    let audit_before = e.audit(&s).await.unwrap();

    for bad in [
        "",
        "a}b",
        "{x}",
        "a{b",
        "a b",
        "a\nb",
        "a#b",
        "a:b",
        "ü",
        &"s".repeat(65),
    ] {
        assert_eq!(
            field(Deduct::new(bad, "u", 1, "r").unwrap_err()),
            "sku",
            "{bad:?}"
        );
    }
    for bad in ["", "u}", "{u}", "u v", "u\t", "u\u{0}", &"u".repeat(129)] {
        assert_eq!(
            field(Deduct::new("valid", bad, 1, "r").unwrap_err()),
            "user",
            "{bad:?}"
        );
        assert_eq!(
            field(Deduct::new("valid", "u", 1, bad).unwrap_err()),
            "request_id",
            "{bad:?}"
        );
    }
    for qty in [0, 6, u64::MAX] {
        let d = Deduct::new("valid", "u", qty, "rq").unwrap();
        assert_eq!(field(e.deduct(&d).await.unwrap_err()), "qty", "{qty}");
    }
    assert_eq!(
        field(
            e.load(&sku("n1"), 10, LoadOptions::new(0))
                .await
                .unwrap_err()
        ),
        "segments"
    );
    assert_eq!(
        field(
            e.load(&sku("n2"), 10, LoadOptions::new(1025))
                .await
                .unwrap_err()
        ),
        "segments"
    );
    assert_eq!(
        field(
            e.load(&sku("n3"), u64::MAX, LoadOptions::new(4))
                .await
                .unwrap_err()
        ),
        "stock"
    );
    let rid = RequestId::new("rs").unwrap();
    assert_eq!(field(e.restock(&s, 0, &rid).await.unwrap_err()), "qty");
    assert_eq!(
        field(e.restock(&s, u64::MAX, &rid).await.unwrap_err()),
        "qty"
    );
    assert!(matches!(
        e.deduct(&Deduct::new("never-loaded", "u", 1, "r").unwrap())
            .await,
        Err(Error::NotLoaded(_))
    ));

    assert_eq!(
        srv.cli(&["DBSIZE"]),
        keys_before,
        "an invalid call wrote a key"
    );
    assert_eq!(e.audit(&s).await.unwrap(), audit_before);
}

/// The scripts validate every argument strictly before their first write: the forms Lua's
/// `tonumber` would accept are refused, and nothing is written.
#[tokio::test]
async fn scripts_refuse_sloppy_numbers_before_writing() {
    let srv = RedisServer::start();
    let e = redis_engine(&srv, Engine::builder().per_user_limit(0)).await;
    let s = sku("strict");
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
    let keys = vec![
        "t:{strict#0}:seg".to_string(),
        format!("t:{{strict#0}}:g{g}:rq:x"),
        format!("t:{{strict#0}}:g{g}:resv"),
        format!("t:{{strict#0}}:g{g}:claims"),
        "t:{strict#0}:out".to_string(),
    ];
    let args = |qty: &str, user: &str| -> Vec<String> {
        [&g, user, qty, "0", "1000", "1000", "1", "lua", "0", "0"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    // Valid call first, so we know the harness is right.
    let ok: Value = client
        .eval(lua, keys.clone(), args("1", "u"))
        .await
        .unwrap();
    assert!(format!("{ok:?}").contains("applied"), "{ok:?}");
    let before = srv.cli(&["HGET", "t:{strict#0}:seg", "stock"]);
    for qty in [
        "0",
        "0x10",
        "1e3",
        " 5",
        "5 ",
        "5.9",
        "inf",
        "nan",
        "-1",
        "01",
        "",
        "9999999999999999",
    ] {
        let r: Result<Value, _> = client.eval(lua, keys.clone(), args(qty, "u2")).await;
        let err = r.expect_err(qty);
        assert!(
            err.details().contains("bad argument: qty"),
            "{qty:?}: {err:?}"
        );
    }
    for user in ["a{b}", "a b", ""] {
        let r: Result<Value, _> = client.eval(lua, keys.clone(), args("1", user)).await;
        assert!(r.is_err(), "{user:?}");
    }
    assert_eq!(srv.cli(&["HGET", "t:{strict#0}:seg", "stock"]), before);
    assert_eq!(
        srv.cli(&["EXISTS", &format!("t:{{strict#0}}:g{g}:rq:x2")]),
        "0"
    );
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok && a.sold == 1, "{a:?}");

    // The coalesced script: a bad request is answered "bad" on its own and writes nothing;
    // the good ones around it apply. A bad header refuses the whole call before any write.
    let batch = concat!(
        include_str!("../src/scripts/prelude.lua"),
        include_str!("../src/scripts/deduct_core.lua"),
        include_str!("../src/scripts/deduct_batch.lua")
    );
    let reqs = [
        ("b1", "u1", "1"),
        ("b2", "u2", "0x10"),
        ("b3", "a{b}", "1"),
        ("b4", "u4", "2"),
    ];
    let mut keys = vec![
        "t:{strict#0}:seg".to_string(),
        format!("t:{{strict#0}}:g{g}:resv"),
        format!("t:{{strict#0}}:g{g}:claims"),
        "t:{strict#0}:out".to_string(),
    ];
    let mut args: Vec<String> = [g.as_str(), "0", "1000", "1000", "4"]
        .map(String::from)
        .to_vec();
    for (rid, user, qty) in reqs {
        keys.push(format!("t:{{strict#0}}:g{g}:rq:{rid}"));
        args.extend([user, qty, "1", "0"].map(String::from));
    }
    let v: Value = client
        .eval(batch, keys.clone(), args.clone())
        .await
        .unwrap();
    let v = format!("{v:?}");
    // An applied request's reply is the bare stock after it (an integer).
    assert_eq!(v.matches("Integer(").count(), 2, "{v}");
    assert!(
        v.contains("bad argument: qty") && v.contains("bad argument: user"),
        "{v}"
    );
    assert_eq!(
        srv.cli(&["EXISTS", &format!("t:{{strict#0}}:g{g}:rq:b2")]),
        "0"
    );
    assert_eq!(
        srv.cli(&["EXISTS", &format!("t:{{strict#0}}:g{g}:rq:b3")]),
        "0"
    );
    // Applied sales of a batch are remembered as fields of the segment's window hashes
    // (compact records), not as keys: the refused requests must not be there either, and the
    // applied ones must (else this check proves nothing).
    let window_fields = || -> Vec<String> {
        srv.cli(&["KEYS", &format!("t:{{strict#0}}:g{g}:rw:*")])
            .lines()
            .filter(|k| !k.trim().is_empty())
            .flat_map(|k| {
                srv.cli(&["HKEYS", k.trim()])
                    .lines()
                    .map(|f| f.trim().to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let mut remembered = window_fields();
    remembered.sort();
    assert_eq!(remembered, ["b1", "b4"], "window entries");
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok && a.sold == 4, "{a:?}");
    let before = srv.cli(&["HGET", "t:{strict#0}:seg", "stock"]);
    for (i, bad) in [(2, "0"), (3, "1e3"), (4, "5"), (0, "x")] {
        let mut a2 = args.clone();
        a2[i] = bad.to_string();
        let keys2: Vec<String> = keys.iter().map(|k| k.replace(":b", ":c")).collect();
        let r: Result<Value, _> = client.eval(batch, keys2, a2).await;
        assert!(r.is_err(), "header {i} = {bad:?}");
    }
    assert_eq!(srv.cli(&["HGET", "t:{strict#0}:seg", "stock"]), before);
    assert_eq!(
        srv.cli(&["EXISTS", &format!("t:{{strict#0}}:g{g}:rq:c1")]),
        "0"
    );
    let mut remembered = window_fields();
    remembered.sort();
    assert_eq!(
        remembered,
        ["b1", "b4"],
        "a refused batch wrote window entries"
    );
}

/// After SCRIPT FLUSH the engine reloads scripts on NOSCRIPT and carries on.
#[tokio::test]
async fn noscript_recovery_after_script_flush() {
    let srv = RedisServer::start();
    let e = redis_engine(&srv, Engine::builder().per_user_limit(0)).await;
    let s = sku("flush");
    e.load(&s, 10, LoadOptions::new(2)).await.unwrap();
    assert_eq!(
        e.deduct(&Deduct::new("flush", "u", 1, "f1").unwrap())
            .await
            .unwrap()
            .units_applied(),
        1
    );
    assert_eq!(srv.cli(&["SCRIPT", "FLUSH"]), "OK");
    assert_eq!(
        e.deduct(&Deduct::new("flush", "u", 1, "f2").unwrap())
            .await
            .unwrap()
            .units_applied(),
        1
    );
    e.restock(&s, 1, &RequestId::new("fr").unwrap())
        .await
        .unwrap();
    srv.cli(&["SCRIPT", "FLUSH"]);
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok && a.sold == 2 && a.remaining == 9, "{a:?}");
    srv.cli(&["SCRIPT", "FLUSH"]);
    e.load(&sku("flush2"), 3, LoadOptions::new(1))
        .await
        .unwrap();
}

/// Reloading is explicit; a reload starts a new generation that other instances notice.
async fn reloads<S: Store>(a: Engine<S>, b: Engine<S>) {
    let s = sku("reload");
    let g1 = a.load(&s, 10, LoadOptions::new(4)).await.unwrap();
    assert!(matches!(
        a.load(&s, 99, LoadOptions::new(4)).await,
        Err(Error::AlreadyLoaded { generation, .. }) if generation == g1
    ));
    assert_eq!(
        a.remaining(&s).await.unwrap().total,
        10,
        "a refused load changed nothing"
    );
    assert_eq!(
        b.deduct(&Deduct::new("reload", "u", 2, "r1").unwrap())
            .await
            .unwrap()
            .units_applied(),
        2
    );
    // `a` replaces the SKU with fewer segments; `b` still caches the old layout.
    let g2 = a
        .load(&s, 6, LoadOptions::new(2).replace(true))
        .await
        .unwrap();
    assert!(g2 > g1, "generations only grow: {g1} then {g2}");
    let d = b
        .deduct(&Deduct::new("reload", "u", 2, "r1").unwrap())
        .await
        .unwrap();
    assert_eq!(
        d.units_applied(),
        2,
        "a new generation has a clean ledger: {d:?}"
    );
    let r = b.remaining(&s).await.unwrap();
    assert_eq!((r.total, r.per_segment.len()), (4, 2));
    let audit = a.audit(&s).await.unwrap();
    assert!(audit.ok, "{audit:?}");
    assert_eq!((audit.generation, audit.loaded, audit.sold), (g2, 6, 2));
}

#[tokio::test]
async fn reload_is_explicit_and_noticed_by_other_instances() {
    let m = MemoryStore::new();
    reloads(
        Engine::builder()
            .per_user_limit(0)
            .build(m.clone())
            .unwrap(),
        Engine::builder().per_user_limit(0).build(m).unwrap(),
    )
    .await;
    let srv = RedisServer::start();
    reloads(
        redis_engine(&srv, Engine::builder().per_user_limit(0)).await,
        redis_engine(&srv, Engine::builder().per_user_limit(0)).await,
    )
    .await;
    // The dropped segments' keys are gone.
    assert_eq!(
        srv.cli(&["EXISTS", "t:{reload#2}:seg", "t:{reload#3}:seg"]),
        "0"
    );
}

/// A process claims a request (its home was short), takes units elsewhere, and dies before
/// settling. A retry after the lease takes over, fences, counts what the dead holder took, and
/// answers without selling twice. A zombie holder waking later can neither take nor refund.
async fn dead_claim_holder<S: Store>(e: Engine<S>, complete: bool) {
    let name = if complete { "dead-full" } else { "dead-part" };
    let s = sku(name);
    // 4 segments of 1 unit; find a request id whose home we then empty.
    let generation = e.load(&s, 4, LoadOptions::new(4)).await.unwrap();
    let rid = RequestId::new(format!("{name}-r")).unwrap();
    let user = UserId::new("carol").unwrap();
    let home = shardstock::segments::home(&rid, 4);
    let at = |index| SegAddr::new(&s, generation, index);
    let qty = 2;
    let args = ReqArgs {
        attempt: 0,
        request_id: &rid,
        user: &user,
        qty,
        ttl_ms: 60_000,
        lease_ms: 100,
        resv_ttl_ms: 0,
        kind: shardstock::store::RequestKind::Sale,
    };
    let st = e.store();
    // Empty the home with a one-unit request routed there explicitly.
    let filler = RequestId::new("filler").unwrap();
    let fa = ReqArgs {
        attempt: 0,
        request_id: &filler,
        user: &user,
        qty: 1,
        ttl_ms: 60_000,
        lease_ms: 100,
        resv_ttl_ms: 0,
        kind: shardstock::store::RequestKind::Sale,
    };
    assert!(matches!(
        st.deduct_home(at(home), fa, OnShort::Report).await.unwrap(),
        HomeReply::Applied { .. }
    ));
    // The doomed holder: claims, then takes 1 (or 2 = complete) units at other segments.
    assert_eq!(
        st.deduct_home(at(home), args, OnShort::Claim)
            .await
            .unwrap(),
        HomeReply::Short {
            stock: 0,
            claimed: Some(1)
        }
    );
    // The other segments, in the order the engine falls back to them.
    let others: Vec<u32> = (1..4).map(|k| (home + k) % 4).collect();
    assert!(matches!(
        st.take(at(others[0]), args, 1, 1, SegmentRole::Fallback)
            .await
            .unwrap(),
        TakeReply::Taken { part: 1, .. }
    ));
    if complete {
        assert!(matches!(
            st.take(at(others[1]), args, 1, 1, SegmentRole::Fallback)
                .await
                .unwrap(),
            TakeReply::Taken { part: 1, .. }
        ));
    }
    // ...and dies. A duplicate arriving now waits (lease 100 ms), then takes over.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let d = e
        .deduct(&Deduct {
            sku: s.clone(),
            user: user.clone(),
            qty,
            request_id: rid.clone(),
        })
        .await
        .unwrap();
    match (&d, complete) {
        (Deduction::Replayed { parts }, true) => {
            assert_eq!(parts.iter().map(|p| p.units).sum::<u64>(), 2)
        }
        (Deduction::Applied { parts }, false) => {
            assert_eq!(parts.iter().map(|p| p.units).sum::<u64>(), 2)
        }
        other => panic!("{other:?}"),
    }
    // The zombie wakes: its epoch-1 takes are fenced and its refunds do nothing.
    assert_eq!(
        st.take(at(others[2]), args, 1, 1, SegmentRole::Fallback)
            .await
            .unwrap(),
        TakeReply::Superseded
    );
    assert_eq!(
        st.refund(at(others[0]), args, 1, SegmentRole::Fallback)
            .await
            .unwrap(),
        0
    );
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok, "{a:?}");
    assert_eq!(
        (a.sold, a.remaining),
        (3, 1),
        "filler 1 + request 2, exactly once"
    );
    // Replays from now on agree.
    let again = e
        .deduct(&Deduct {
            sku: s.clone(),
            user,
            qty,
            request_id: rid,
        })
        .await
        .unwrap();
    assert!(matches!(again, Deduction::Replayed { .. }), "{again:?}");
}

#[tokio::test]
async fn dead_claim_holder_is_taken_over_exactly_once() {
    let b = || {
        Engine::builder()
            .per_user_limit(0)
            .claim_lease(Duration::from_millis(100))
            .pending_wait(Duration::from_secs(2))
    };
    dead_claim_holder(b().build(MemoryStore::new()).unwrap(), true).await;
    dead_claim_holder(b().build(MemoryStore::new()).unwrap(), false).await;
    let srv = RedisServer::start();
    dead_claim_holder(redis_engine(&srv, b()).await, true).await;
    dead_claim_holder(redis_engine(&srv, b()).await, false).await;
}

/// While a live holder's lease runs, a duplicate answers `InFlight` after `pending_wait`
/// instead of deducting.
#[tokio::test]
async fn duplicate_of_a_live_claim_is_in_flight() {
    let e = Engine::builder()
        .per_user_limit(0)
        .claim_lease(Duration::from_secs(30))
        .user_claim_ttl(Duration::from_secs(60))
        .pending_wait(Duration::from_millis(50))
        .build(MemoryStore::new())
        .unwrap();
    let s = sku("live");
    let generation = e.load(&s, 2, LoadOptions::new(2)).await.unwrap();
    let rid = RequestId::new("live-r").unwrap();
    let user = UserId::new("dan").unwrap();
    let home = shardstock::segments::home(&rid, 2);
    let at = SegAddr::new(&s, generation, home);
    let args = ReqArgs {
        attempt: 0,
        request_id: &rid,
        user: &user,
        qty: 2,
        ttl_ms: 60_000,
        lease_ms: 30_000,
        resv_ttl_ms: 0,
        kind: shardstock::store::RequestKind::Sale,
    };
    assert!(matches!(
        e.store()
            .deduct_home(at, args, OnShort::Claim)
            .await
            .unwrap(),
        HomeReply::Short {
            claimed: Some(1),
            ..
        }
    ));
    let d = e
        .deduct(&Deduct {
            sku: s.clone(),
            user,
            qty: 2,
            request_id: rid,
        })
        .await
        .unwrap();
    assert_eq!(d, Deduction::InFlight);
    assert_eq!(e.remaining(&s).await.unwrap().total, 2);
}
