//! Validation, strict script arguments, NOSCRIPT recovery, explicit reloads, and the crash
//! points of moving stock: a process that dies between a transfer's debit and its home's
//! credit (the sweeper credits, the audit is exact), a credit sent again (applied once), the
//! sweeper racing a credit, a reload while units are in transit — against real redis-server
//! processes and the memory store.

use crate::common;
use common::*;
use fred::prelude::LuaInterface;
use fred::types::Value;
use shardstock::store::{Credit, SegAddr, SellArgs, SellReply, TransferArgs, TransferReply};
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
/// `tonumber` would accept are refused, and nothing is written. `sell.lua` answers a bad
/// request of a batch on its own (`bad`), writing nothing for it while the good ones around
/// it apply; a bad header (generation, home function, index, fence, credits, count) refuses the
/// whole call before any write (a request of quantity 0 is no request: a credit-only call,
/// which records nothing); `transfer.lua` refuses a bad id, destination, quantity, floor
/// or lease before debiting anything.
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
    let sell = concat!(
        include_str!("../../src/scripts/prelude.lua"),
        include_str!("../../src/scripts/sell.lua")
    );
    let seg = "t:{strict#0}:seg".to_string();
    let gbase = format!("t:{{strict#0}}:g{g}");
    // "1" when a record of `user` is kept (record hash or a sales window), else "0".
    let ledger = |user: &str| {
        if srv.unlimited_records(&gbase, user).is_empty() {
            "0"
        } else {
            "1"
        }
    };
    let hf = shardstock::segments::HOME_FN.to_string();
    // KEYS and the header of ARGV (up to the request count); the request lines follow.
    let head = |credits: &[[&str; 3]], n: usize| -> (Vec<String>, Vec<String>) {
        let keys = vec![
            seg.clone(),
            format!("t:{{strict#0}}:g{g}:resv"),
            format!("t:{{strict#0}}:g{g}:in"),
            "t:{strict#0}:out".to_string(),
            format!("t:{{strict#0}}:g{g}:led"),
            format!("t:{{strict#0}}:g{g}:hold"),
        ];
        let mut args: Vec<String> = vec![g.clone(), hf.clone(), "0".into(), "0".into()];
        args.push(credits.len().to_string());
        for c in credits {
            args.extend(c.iter().map(|x| x.to_string()));
        }
        args.push(n.to_string());
        (keys, args)
    };
    // A request: user, request id, `<qty>:<resv_ttl_ms>:<ttl_ms>`.
    let req = |user: &str, rid: &str, qty: &str| -> (String, String, String) {
        (user.into(), rid.into(), format!("{qty}:0:1000"))
    };
    // One request: (user, request id, qty).
    let one = |user: &str, rid: &str, qty: &str| -> (Vec<String>, Vec<String>) {
        let (keys, mut args) = head(&[], 1);
        args.extend(sell_runs(&[req(user, rid, qty)]));
        (keys, args)
    };
    // The reply: the stock before the requests, then `a` per applied one, `b<argument>` per
    // refused one.
    let answers = |v: &Value| -> Vec<String> {
        v.as_str()
            .unwrap_or_else(|| panic!("a one-string reply: {v:?}"))
            .split(' ')
            .map(String::from)
            .collect()
    };
    // Valid call first, so we know the harness is right.
    let (k, a) = one("u", "x", "1");
    let ok: Value = client.eval(sell, k, a).await.unwrap();
    assert_eq!(answers(&ok), ["10", "a"], "{ok:?}");
    let stock = || srv.cli(&["HGET", "t:{strict#0}:seg", "stock"]);
    let before = stock();
    // Quantity 0 is no request (a credit-only call): it answers the stock, records nothing.
    let (k, a) = one("u2", "x2", "0");
    let r: Value = client.eval(sell, k, a).await.unwrap();
    assert_eq!(answers(&r), ["9", "a"], "{r:?}");
    for qty in [
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
        let (k, a) = one("u2", "x2", qty);
        let r: Value = client.eval(sell, k, a).await.unwrap();
        assert_eq!(answers(&r), ["9", "bqty"], "{qty:?}: {r:?}");
    }
    for user in ["a{b}", "a b", "a\nb", "", &*"u".repeat(129)] {
        let (k, a) = one(user, "x3", "1");
        let r: Value = client.eval(sell, k, a).await.unwrap();
        assert_eq!(answers(&r), ["9", "buser"], "{user:?}: {r:?}");
    }
    for rid in ["r}", "r r", "", &*"r".repeat(129)] {
        let (k, a) = one("u3", rid, "1");
        let r: Value = client.eval(sell, k, a).await.unwrap();
        assert_eq!(answers(&r), ["9", "brequest_id"], "{rid:?}: {r:?}");
    }
    assert_eq!(stock(), before);
    assert_eq!(ledger("u2"), "0");
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok && a.sold == 1, "{a:?}");

    // A batch: a bad request is answered "bad" on its own and writes nothing; the good ones
    // around it apply.
    let reqs = [
        ("u1", "b1", "1"),
        ("u2", "b2", "0x10"),
        ("a{b}", "b3", "1"),
        ("u4", "b4", "2"),
    ];
    let (keys, mut args) = head(&[], reqs.len());
    let sent: Vec<_> = reqs.iter().map(|(u, r, q)| req(u, r, q)).collect();
    args.extend(sell_runs(&sent));
    let v: Value = client.eval(sell, keys.clone(), args.clone()).await.unwrap();
    assert_eq!(answers(&v), ["9", "a", "bqty", "buser", "a"], "{v:?}");
    for (user, present) in [("u1", "1"), ("u2", "0"), ("a{b}", "0"), ("u4", "1")] {
        assert_eq!(ledger(user), present, "{user}");
    }
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok && a.sold == 4, "{a:?}");

    // A bad header refuses the whole call before any write: generation, home function,
    // index, fence, a credit's id, donor or units, the request count.
    let before = stock();
    let credit = ["5", "1", "2"];
    for (i, bad) in [(0, "x"), (1, "01"), (2, "1e3"), (3, "-1")] {
        let (k, mut a) = one("u9", "c1", "1");
        a[i] = bad.to_string();
        let r = client.eval::<Value, _, _, _>(sell, k, a).await;
        assert!(r.is_err(), "header {i} = {bad:?}: {r:?}");
    }
    {
        // A malformed fence is refused even when the generation is stale anyway.
        let stale = (g.parse::<u64>().unwrap() + 1).to_string();
        let (mut k, mut a) = one("u9", "c1", "1");
        for key in &mut k {
            *key = key.replace(&format!(":g{g}:"), &format!(":g{stale}:"));
        }
        a[0] = stale;
        a[3] = "07".into();
        let r = client.eval::<Value, _, _, _>(sell, k, a).await;
        assert!(
            r.as_ref()
                .is_err_and(|e| e.details().contains("bad argument: fence")),
            "{r:?}"
        );
    }
    for bad in [
        ["0", "1", "2"],
        ["0x5", "1", "2"],
        ["5", "x", "2"],
        ["5", "1", "0"],
        ["5", "1", "2.5"],
    ] {
        let (k, mut a) = head(&[bad], 1);
        a.extend(sell_runs(&[req("u9", "c2", "1")]));
        let r = client.eval::<Value, _, _, _>(sell, k, a).await;
        assert!(r.is_err(), "credit {bad:?}: {r:?}");
    }
    for (n, extra) in [(2, 0), (1, 1), (1, 2)] {
        // A count that does not match the arguments sent.
        let (k, mut a) = head(&[credit], n);
        a.extend(sell_runs(&[req("u9", "c3", "1")]));
        a.extend((0..extra).map(|_| "x".to_string()));
        let r = client.eval::<Value, _, _, _>(sell, k, a).await;
        assert!(r.is_err(), "n {n}, {extra} more: {r:?}");
    }
    for (n, runs) in [
        // A run of length 0, a run past n, runs that do not add up to n, a length that is
        // not a whole number.
        (
            1,
            vec![vec!["1:0:1000", "0"], vec!["1:0:1000", "1", "u9", "c4"]],
        ),
        (1, vec![vec!["1:0:1000", "2", "u9", "u8", "c4", "c5"]]),
        (
            3,
            vec![
                vec!["1:0:1000", "1", "u9", "c4"],
                vec!["2:0:1000", "1", "u8", "c5"],
            ],
        ),
        (1, vec![vec!["1:0:1000", "1.0", "u9", "c4"]]),
        (1, vec![vec!["1:0:1000", "x", "u9", "c4"]]),
    ] {
        let (k, mut a) = head(&[credit], n);
        a.extend(runs.concat().into_iter().map(String::from));
        let r = client.eval::<Value, _, _, _>(sell, k, a.clone()).await;
        assert!(r.is_err(), "runs {a:?}: {r:?}");
    }
    {
        // A key more than the five.
        let (mut k, mut a) = head(&[credit], 1);
        k.push(format!("{gbase}:rec"));
        a.extend(sell_runs(&[req("u9", "c3", "1")]));
        let r = client.eval::<Value, _, _, _>(sell, k, a).await;
        assert!(r.is_err(), "keys: {r:?}");
    }
    assert_eq!(stock(), before, "a refused call changed the stock");
    assert_eq!(ledger("u9"), "0");
    assert_eq!(
        srv.cli(&["EXISTS", &format!("t:{{strict#0}}:g{g}:in")]),
        "0",
        "a refused call recorded a credit"
    );

    // transfer.lua: debit with a bad argument writes nothing.
    let transfer = concat!(
        include_str!("../../src/scripts/prelude.lua"),
        include_str!("../../src/scripts/transfer.lua")
    );
    let tkeys = vec![
        seg.clone(),
        format!("t:{{strict#0}}:g{g}:resv"),
        format!("t:{{strict#0}}:g{g}:tx"),
        format!("t:{{strict#0}}:g{g}:txq"),
        "t:{strict#0}:out".to_string(),
        format!("t:{{strict#0}}:g{g}:led"),
    ];
    let debit = |id: &str, dest: &str, want: &str, floor: &str, lease: &str| -> Vec<String> {
        ["debit", g.as_str(), id, dest, want, floor, lease]
            .map(String::from)
            .to_vec()
    };
    for (what, a) in [
        ("id 0", debit("0", "0", "1", "0", "100")),
        ("id hex", debit("0x10", "0", "1", "0", "100")),
        (
            "id too large",
            debit("18446744073709551616", "0", "1", "0", "100"),
        ),
        ("dest", debit("7", "-1", "1", "0", "100")),
        ("want 0", debit("7", "0", "0", "0", "100")),
        ("want exp", debit("7", "0", "1e3", "0", "100")),
        ("floor", debit("7", "0", "1", " 1", "100")),
        ("lease", debit("7", "0", "1", "0", "5.5")),
    ] {
        let r = client
            .eval::<Value, _, _, _>(transfer, tkeys.clone(), a)
            .await;
        assert!(
            r.as_ref()
                .is_err_and(|e| e.details().contains("bad argument")),
            "{what}: {r:?}"
        );
    }
    assert_eq!(stock(), before);
    for k in &tkeys[2..4] {
        assert_eq!(srv.cli(&["EXISTS", k]), "0", "{k}");
    }
    // And the valid debit, so the refusals above prove something.
    let r: Value = client
        .eval(transfer, tkeys.clone(), debit("7", "0", "1", "0", "100"))
        .await
        .unwrap();
    assert!(format!("{r:?}").contains("debited"), "{r:?}");
}

/// `sell.lua`'s KEYS at segment 0 of `sku` in generation `g`, and the head of its ARGV (no
/// fence, no credits) for `n` requests.
fn sell_call(sku: &str, g: u64, n: usize) -> (Vec<String>, Vec<String>) {
    let seg = format!("t:{{{sku}#0}}");
    let keys = vec![
        format!("{seg}:seg"),
        format!("{seg}:g{g}:resv"),
        format!("{seg}:g{g}:in"),
        format!("{seg}:out"),
        format!("{seg}:g{g}:led"),
        format!("{seg}:g{g}:hold"),
    ];
    let args = [
        g.to_string(),
        segments::HOME_FN.to_string(),
        "0".into(),
        "0".into(),
        "0".into(),
        n.to_string(),
    ];
    (keys, args.to_vec())
}

/// `sell.lua`'s ARGV for `reqs` (user, request id, spec), after the head: consecutive requests
/// of one spec as one run — the spec, the run's length, its users, then their request ids.
fn sell_runs(reqs: &[(String, String, String)]) -> Vec<String> {
    let mut args = Vec::new();
    for run in reqs.chunk_by(|a, b| a.2 == b.2) {
        args.push(run[0].2.clone());
        args.push(run.len().to_string());
        args.extend(run.iter().map(|r| r.0.clone()));
        args.extend(run.iter().map(|r| r.1.clone()));
    }
    args
}

/// One coalesced call decides its requests one after another, exactly as the reference
/// segment does: twins of a request id, a user's second request, a new buyer's sale followed
/// by its own replay, a reservation and a sale of one id, across two calls on a limited
/// segment (the hot path keeps a new buyer's ledger as text until a twin needs it parsed).
#[tokio::test]
async fn a_call_decides_its_twins_in_order_as_the_reference_does() {
    use shardstock::store::memory::Segment;
    let srv = RedisServer::start();
    let e = redis_engine(&srv, Engine::builder().per_user_limit(2)).await;
    let s = sku("twins");
    let g = e.load(&s, 10, LoadOptions::new(1)).await.unwrap();
    let client = admin_client(&srv).await;
    let sell = concat!(
        include_str!("../../src/scripts/prelude.lua"),
        include_str!("../../src/scripts/sell.lua")
    );
    let mut reference = Segment::loaded(g, 10, 2);
    // (user, request id, qty, reservation ms)
    let calls: [&[(&str, &str, u64, u64)]; 2] = [
        &[
            ("u1", "r1", 1, 0),
            ("u1", "r1", 1, 0),
            ("u1", "r1", 2, 0),
            ("u1", "r2", 1, 0),
            ("u1", "r3", 1, 0),
            ("u2", "r1", 3, 0),
            ("u3", "r4", 1, 60_000),
            ("u3", "r4", 1, 0),
            ("u3", "r5", 1, 0),
            ("u4", "r6", 2, 0),
            ("u4", "r6", 2, 0),
            ("u5", "r7", 0, 0),
        ],
        &[
            ("u1", "r1", 1, 0),
            ("u1", "r9", 1, 0),
            ("u4", "r6", 2, 0),
            ("u6", "r8", 2, 0),
            ("u6", "r8", 2, 0),
            ("u7", "r8", 1, 0),
        ],
    ];
    for reqs in calls {
        let (keys, mut args) = sell_call("twins", g, reqs.len());
        let mut want = Vec::new();
        let mut sent = Vec::new();
        for &(user, rid, qty, resv) in reqs {
            sent.push((user.into(), rid.into(), format!("{qty}:{resv}:60000")));
            let (u, r) = (UserId::new(user).unwrap(), RequestId::new(rid).unwrap());
            let a = SellArgs {
                request_id: &r,
                user: &u,
                qty,
                resv_ttl_ms: resv,
                order_item: false,
                ttl_ms: 60_000,
                credits: &[],
                fence: 0,
            };
            want.push(match reference.sell(&a, 1) {
                SellReply::Applied { .. } => "a".to_string(),
                SellReply::Replay => "p".into(),
                SellReply::Short { .. } => "s".into(),
                SellReply::LimitReached { limit, held, sold } => format!("l{limit}/{held}/{sold}"),
                SellReply::Mismatch(f) => format!("m{}", &f[..1]),
                other => panic!("{other:?}"),
            });
        }
        args.extend(sell_runs(&sent));
        let v: Value = client.eval(sell, keys.clone(), args).await.unwrap();
        let got: Vec<String> = v
            .as_str()
            .unwrap()
            .split(' ')
            .skip(1)
            .map(String::from)
            .collect();
        assert_eq!(got, want, "{reqs:?}");
    }
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok, "{a:?}");
    assert_eq!(
        (a.sold, a.reserved),
        (reference.counters.sold, reference.counters.reserved),
        "{a:?}"
    );

    // Without a limit a sale's record goes into its sales window, which expires once every
    // record in it is forgotten, twins in the call or not.
    let s = sku("twins0");
    let g = e
        .load(&s, 10, LoadOptions::new(1).per_user_limit(0))
        .await
        .unwrap();
    let (keys, mut args) = sell_call("twins0", g, 2);
    let twin = ("w1".to_string(), "r1".to_string(), "1:0:60000".to_string());
    args.extend(sell_runs(&[twin.clone(), twin]));
    let v: Value = client.eval(sell, keys, args).await.unwrap();
    assert_eq!(v.as_str().unwrap(), "10 a p");
    let recs = srv.unlimited_records(&format!("t:{{twins0#0}}:g{g}"), "w1");
    assert_eq!(recs.len(), 1, "{recs:?}");
    let (rid, rec, key) = &recs[0];
    assert!(rid == "r1" && rec.starts_with("A:1:"), "{recs:?}");
    assert!(key.contains(":w60000:"), "{key}");
    // Kept in the short form: the record's `until` less the window's start, digits only.
    let raw = srv.cli(&["HGET", key, "w1 r1"]);
    assert!(
        !raw.is_empty() && raw.bytes().all(|c| c.is_ascii_digit()) && raw.len() <= 12,
        "{raw:?}"
    );
    let ttl: i64 = srv.cli(&["PTTL", key]).parse().unwrap();
    assert!(ttl > 0 && ttl <= 120_000, "the window's TTL: {ttl}");
}

/// Without a limit a sale's record goes into a sales window: the smallest in use at least its
/// `ttl_ms`, else a new one of its `ttl_ms` or twice the widest in use, whichever is more (so a
/// generation has few windows whatever `ttl_ms` its callers send). Every window is read: a
/// re-send with another `ttl_ms` replays. Each window's hash expires within two of its widths.
#[tokio::test]
async fn sales_windows_are_chosen_few_and_all_read() {
    let srv = RedisServer::start();
    let e = redis_engine(&srv, Engine::builder().per_user_limit(0)).await;
    let client = admin_client(&srv).await;
    let sell = concat!(
        include_str!("../../src/scripts/prelude.lua"),
        include_str!("../../src/scripts/sell.lua")
    );
    let s = sku("wins");
    let g = e
        .load(&s, 100, LoadOptions::new(1).per_user_limit(0))
        .await
        .unwrap();
    let seg = "t:{wins#0}:seg";
    let call = |user: &str, rid: &str, ttl: u64| {
        let (keys, mut args) = sell_call("wins", g, 1);
        args.extend(sell_runs(&[(
            user.into(),
            rid.into(),
            format!("1:0:{ttl}"),
        )]));
        (keys, args)
    };
    // (ttl_ms, the window it must land in): the first makes a window of its ttl; a longer one
    // doubles the widest (3000 -> 4000), or takes its own when more (9000); a shorter one
    // takes the smallest that fits.
    let plan = [
        ("r1", 2000, 2000),
        ("r2", 3000, 4000),
        ("r3", 1000, 2000),
        ("r4", 9000, 9000),
        ("r5", 4001, 9000),
        ("r6", 9001, 18000),
        ("r7", 2001, 4000),
    ];
    for (rid, ttl, _) in plan {
        let (k, a) = call("u", rid, ttl);
        let v: Value = client.eval(sell, k, a).await.unwrap();
        assert!(v.as_str().unwrap().ends_with(" a"), "{rid}: {v:?}");
    }
    assert_eq!(srv.cli(&["HGET", seg, "rw"]), "2000,4000,9000,18000");
    let recs = srv.unlimited_records(&format!("t:{{wins#0}}:g{g}"), "u");
    for (rid, _, w) in plan {
        let r = recs.iter().find(|r| r.0 == rid).expect("kept");
        assert!(r.2.contains(&format!(":w{w}:")), "{rid}: {recs:?}");
    }
    for (_, _, key) in &recs {
        let w: i64 = key.rsplit(':').nth(1).unwrap()[1..].parse().unwrap();
        let ttl: i64 = srv.cli(&["PTTL", key]).parse().unwrap();
        assert!(ttl > 0 && ttl <= 2 * w, "{key}: {ttl}");
    }
    // A re-send with another ttl_ms (another instance's request_ttl) replays.
    for (rid, ttl) in [("r6", 1000), ("r1", 60_000), ("r7", 2001)] {
        let (k, a) = call("u", rid, ttl);
        let v: Value = client.eval(sell, k, a).await.unwrap();
        assert!(
            v.as_str().unwrap().ends_with(" p"),
            "{rid} with {ttl}: {v:?}"
        );
    }
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok && a.sold == plan.len() as u64, "{a:?}");
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

/// A load writes the segment, and with a per-user limit the generation's ledgers, as hash
/// tables (each holds a `pad` value longer than Redis's listpack limit): a listpack ledger of a
/// few hundred users is scanned entry by entry for every buyer. The pad is no user's ledger:
/// the audit and sales read past it.
#[tokio::test]
async fn a_load_writes_the_hot_hashes_as_hash_tables() {
    let srv = RedisServer::start();
    let e = redis_engine(&srv, Engine::builder().per_user_limit(1)).await;
    let s = sku("enc");
    for round in 1..=2u64 {
        let generation = e
            .load(&s, 10, LoadOptions::new(2).replace(true))
            .await
            .unwrap();
        for i in 0..2 {
            for key in [
                format!("t:{{enc#{i}}}:seg"),
                format!("t:{{enc#{i}}}:g{generation}:led"),
            ] {
                assert_eq!(srv.cli(&["OBJECT", "ENCODING", &key]), "hashtable", "{key}");
            }
            assert_eq!(
                srv.cli(&["HLEN", &format!("t:{{enc#{i}}}:g{generation}:led")]),
                "1"
            );
        }
        for u in ["a", "b", "c"] {
            let d = Deduct::new("enc", u, 1, &format!("{u}{round}")).unwrap();
            assert_eq!(e.deduct(&d).await.unwrap().units_applied(), 1);
        }
        let a = e.audit(&s).await.unwrap();
        assert!(a.ok && a.sold == 3 && a.remaining == 7, "{a:?}");
    }
    // Without a limit no ledgers hash is written; the segment is still a hash table.
    let free = redis_engine(&srv, Engine::builder().per_user_limit(0)).await;
    let g = free
        .load(&sku("enc0"), 4, LoadOptions::new(1))
        .await
        .unwrap();
    assert_eq!(
        srv.cli(&["OBJECT", "ENCODING", "t:{enc0#0}:seg"]),
        "hashtable"
    );
    assert_eq!(srv.cli(&["EXISTS", &format!("t:{{enc0#0}}:g{g}:led")]), "0");
}

/// A new buyer's one-unit sale is remembered as its request id alone (the ledger's short form:
/// no string built, ~12 bytes less per buyer), and read back as the full ledger it stands for:
/// its re-send is a replay (rewritten as it is, short), the user's next sale counts it against
/// the limit and turns the ledger into the full form; a sale of more units is written in the
/// full form from the start.
#[tokio::test]
async fn a_one_unit_sale_is_remembered_as_its_request_id_alone() {
    let srv = RedisServer::start();
    let e = redis_engine(&srv, Engine::builder().per_user_limit(2)).await;
    let s = sku("short");
    let g = e.load(&s, 10, LoadOptions::new(1)).await.unwrap();
    let led = format!("t:{{short#0}}:g{g}:led");
    let sell = |user: &str, qty: u64, rid: &str| Deduct::new("short", user, qty, rid).unwrap();
    assert_eq!(
        e.deduct(&sell("a", 1, "r1")).await.unwrap().units_applied(),
        1
    );
    assert_eq!(srv.cli(&["HGET", &led, "a"]), "r1");
    assert!(matches!(
        e.deduct(&sell("a", 1, "r1")).await.unwrap(),
        Deduction::Replayed { .. }
    ));
    // The replay rewrote the ledger as it is (for the durability mode's WAIT): still short.
    assert_eq!(srv.cli(&["HGET", &led, "a"]), "r1");
    assert_eq!(
        e.deduct(&sell("a", 1, "r2")).await.unwrap().units_applied(),
        1
    );
    let full = srv.cli(&["HGET", &led, "a"]);
    assert!(
        full.starts_with("2 2 ") && full.contains(" r1 A:1:0:0") && full.contains(" r2 A:1:0:0"),
        "{full}"
    );
    assert!(matches!(
        e.deduct(&sell("a", 1, "r3")).await.unwrap(),
        Deduction::LimitReached { limit: 2 }
    ));
    assert_eq!(
        e.deduct(&sell("b", 2, "r4")).await.unwrap().units_applied(),
        2
    );
    assert_eq!(srv.cli(&["HGET", &led, "b"]), "2 2 r4 A:2:0:0");
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok && a.sold == 4 && a.remaining == 6, "{a:?}");
}

/// The same load again (`load_segment.lua` sent again) writes nothing: the units sold since stay
/// sold, the ledgers keep their buyers. Another load of the same generation is written.
#[tokio::test]
async fn a_re_sent_load_writes_nothing() {
    let srv = RedisServer::start();
    let e = redis_engine(&srv, Engine::builder().per_user_limit(1)).await;
    let s = sku("resent");
    let g = e.load(&s, 10, LoadOptions::new(1)).await.unwrap();
    for u in ["a", "b", "c"] {
        let d = Deduct::new("resent", u, 1, u).unwrap();
        assert_eq!(e.deduct(&d).await.unwrap().units_applied(), 1);
    }
    let client = admin_client(&srv).await;
    let load = concat!(
        include_str!("../../src/scripts/prelude.lua"),
        include_str!("../../src/scripts/load_segment.lua")
    );
    let keys = vec![
        "t:{resent#0}:seg".to_string(),
        "t:{resent#0}:out".to_string(),
        format!("t:{{resent#0}}:g{g}:led"),
    ];
    let args = vec![
        g.to_string(),
        "10".into(),
        "0".into(),
        "1".into(),
        segments::HOME_FN.to_string(),
    ];
    let r: Vec<Value> = client.eval(load, keys.clone(), args.clone()).await.unwrap();
    assert_eq!(r[0].as_str().as_deref(), Some("ok"), "{r:?}");
    assert_eq!(r[1].as_i64(), Some(0), "{r:?}");
    assert_eq!(srv.cli(&["HGET", "t:{resent#0}:seg", "sold"]), "3");
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok && a.sold == 3 && a.remaining == 7, "{a:?}");
    let again = Deduct::new("resent", "a", 1, "a2").unwrap();
    assert_eq!(
        e.deduct(&again).await.unwrap().units_applied(),
        0,
        "a buyer kept"
    );
    // Another load that drew the same generation (other units) is written as a new one.
    let mut other = args;
    other[1] = "12".into();
    let r: Vec<Value> = client.eval(load, keys, other).await.unwrap();
    assert_eq!(r[0].as_str().as_deref(), Some("ok"), "{r:?}");
    assert_eq!(srv.cli(&["HGET", "t:{resent#0}:seg", "stock"]), "12");
    assert_eq!(srv.cli(&["HGET", "t:{resent#0}:seg", "sold"]), "0");
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

/// Segment `index` of `sku` in `generation` (plain tag: one node, or the memory store).
fn at(sku: &Sku, generation: u64, index: u32) -> SegAddr<'_> {
    SegAddr::new(sku, generation, index)
}

/// A sale's `sell` arguments crediting `credits`.
fn sale<'a>(user: &'a UserId, rid: &'a RequestId, qty: u64, credits: &'a [Credit]) -> SellArgs<'a> {
    SellArgs {
        request_id: rid,
        user,
        qty,
        resv_ttl_ms: 0,
        order_item: false,
        ttl_ms: 60_000,
        credits,
        fence: 0,
    }
}

/// A process debits a transfer for its request (home short) and dies before its home credits
/// it: the units are in transit — the audit counts them, the remaining stock shows them, no
/// sweeper touches them while the lease runs, a re-sent debit replays them. Once the lease
/// runs out the sweeper credits them home, exactly once; the dead process's credit arriving
/// late (a re-sent `sell`) applies nothing more, and its sale replays.
async fn dead_mover<S: Store>(e: Engine<S>, tag: &str) {
    let s = sku(&format!("mover-{tag}"));
    let g = e.load(&s, 10, LoadOptions::new(2)).await.unwrap(); // [5, 5]
    let (user, rid) = (UserId::new("carol").unwrap(), RequestId::new("r1").unwrap());
    let home = shardstock::segments::home(&user, &rid, 2, false);
    let donor = 1 - home;
    let st = e.store();
    let t = TransferArgs {
        id: 7,
        dest: home,
        want: 3,
        floor: 0,
        lease_ms: 200,
    };
    let r = st.transfer(at(&s, g, donor), t).await.unwrap();
    assert_eq!(
        r,
        TransferReply::Debited {
            units: 3,
            stock_after: 2
        },
        "[{tag}]"
    );
    // ...and dies.
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok, "[{tag}] {a:?}");
    assert_eq!(
        (a.remaining, a.in_transit, a.sold),
        (7, 3, 0),
        "[{tag}] {a:?}"
    );
    let r = e.remaining(&s).await.unwrap();
    assert_eq!((r.total, r.in_transit), (7, 3), "[{tag}] {r:?}");
    // The lease runs: the sweeper leaves it; a re-sent debit replays the same units.
    e.sweep().await.unwrap();
    assert_eq!(
        e.audit(&s).await.unwrap().in_transit,
        3,
        "[{tag}] swept early"
    );
    let again = st.transfer(at(&s, g, donor), t).await.unwrap();
    assert!(
        matches!(again, TransferReply::Debited { units: 3, .. }),
        "[{tag}] {again:?}"
    );
    let due = st.transfers_due(at(&s, g, donor), 10).await.unwrap();
    assert_eq!(due.len(), 1, "[{tag}] {due:?}");
    assert_eq!(
        (due[0].id, due[0].dest, due[0].units),
        (7, home, 3),
        "[{tag}]"
    );
    // The lease ran out: the sweeper credits the units home.
    tokio::time::sleep(Duration::from_millis(250)).await;
    e.sweep().await.unwrap();
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok, "[{tag}] {a:?}");
    assert_eq!((a.remaining, a.in_transit), (10, 0), "[{tag}] {a:?}");
    assert_eq!(
        (
            a.segments[home as usize].state.stock,
            a.segments[donor as usize].state.stock
        ),
        (8, 2),
        "[{tag}] {a:?}"
    );
    assert!(
        st.transfers_due(at(&s, g, donor), 10)
            .await
            .unwrap()
            .is_empty(),
        "[{tag}] still due after the sweeper credited it"
    );
    // The dead process's own credit arrives late, with its sale: the credit adds nothing.
    let credit = [Credit {
        id: 7,
        donor,
        units: 3,
    }];
    let r = st
        .sell(at(&s, g, home), sale(&user, &rid, 4, &credit))
        .await
        .unwrap();
    assert_eq!(r, SellReply::Applied { stock_after: 4 }, "[{tag}]");
    let r = st
        .sell(at(&s, g, home), sale(&user, &rid, 4, &credit))
        .await
        .unwrap();
    assert_eq!(r, SellReply::Replay, "[{tag}]");
    // The request, retried through the engine, replays at its home.
    let d = Deduct {
        sku: s.clone(),
        user: user.clone(),
        qty: 4,
        request_id: rid.clone(),
    };
    let r = e.deduct(&d).await.unwrap();
    assert_eq!(
        r,
        Deduction::Replayed {
            segment: home,
            units: 4
        },
        "[{tag}]"
    );
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok, "[{tag}] {a:?}");
    assert_eq!(
        (a.remaining, a.in_transit, a.sold),
        (6, 0, 4),
        "[{tag}] {a:?}"
    );
    assert_eq!(
        (
            a.segments[home as usize].state.moved_in,
            a.segments[donor as usize].state.moved_out
        ),
        (3, 3),
        "[{tag}] credited once: {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mover_that_died_between_debit_and_credit_is_credited_by_the_sweeper_once() {
    let b = || Engine::builder().per_user_limit(0);
    dead_mover(b().build(MemoryStore::new()).unwrap(), "memory").await;
    let srv = RedisServer::start();
    dead_mover(redis_engine(&srv, b()).await, "redis").await;
    dead_mover(
        coalesced_engine(&srv, b(), Coalescing::default(), "c").await,
        "coalesced",
    )
    .await;
}

/// A transfer whose lease ran out is credited by the sweeper while its request credits it
/// too, concurrently, round after round: each credit applies once, and the audit is exact
/// after every round.
async fn sweeper_races_credits<S: Store>(e: Engine<S>, tag: &str) {
    let s = sku(&format!("race-{tag}"));
    let g = e.load(&s, 400, LoadOptions::new(2)).await.unwrap(); // [200, 200]
    let st = e.store();
    let mut sold = 0;
    for round in 0..40u64 {
        let user = UserId::new(format!("u{round}")).unwrap();
        let rid = RequestId::new(format!("r{round}")).unwrap();
        let home = shardstock::segments::home(&user, &rid, 2, false);
        let donor = 1 - home;
        let t = TransferArgs {
            id: 100 + round,
            dest: home,
            want: 2,
            floor: 0,
            lease_ms: 1,
        };
        let r = st.transfer(at(&s, g, donor), t).await.unwrap();
        assert!(
            matches!(r, TransferReply::Debited { units: 2, .. }),
            "[{tag}] {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await; // the lease ran out
        let credit = [Credit {
            id: 100 + round,
            donor,
            units: 2,
        }];
        let (sold_now, swept) = futures::join!(
            st.sell(at(&s, g, home), sale(&user, &rid, 1, &credit)),
            e.sweep()
        );
        assert!(
            matches!(sold_now, Ok(SellReply::Applied { .. })),
            "[{tag}] round {round}: {sold_now:?}"
        );
        swept.unwrap();
        sold += 1;
        let a = e.audit(&s).await.unwrap();
        assert!(a.ok, "[{tag}] round {round}: {a:?}");
        let moved_in: u64 = a.segments.iter().map(|x| x.state.moved_in).sum();
        let moved_out: u64 = a.segments.iter().map(|x| x.state.moved_out).sum();
        assert_eq!(
            (a.remaining, a.in_transit, a.sold, moved_in, moved_out),
            (400 - sold, 0, sold, 2 * (round + 1), 2 * (round + 1)),
            "[{tag}] round {round}: {a:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_racing_a_credit_credits_once() {
    let b = || Engine::builder().per_user_limit(0);
    sweeper_races_credits(b().build(MemoryStore::new()).unwrap(), "memory").await;
    let srv = RedisServer::start();
    sweeper_races_credits(redis_engine(&srv, b()).await, "redis").await;
    sweeper_races_credits(
        coalesced_engine(&srv, b(), Coalescing::default(), "c").await,
        "coalesced",
    )
    .await;
}

/// A reload while units are in transit: the new generation starts with its own counters
/// (nothing in transit, the audit exact); the old transfer's credit and re-sent debit answer
/// `Stale` and write nothing; the sweeper finds nothing due; the request, retried, sells in
/// the new generation.
async fn reload_mid_transfer<S: Store>(e: Engine<S>, tag: &str) {
    let s = sku(&format!("reload-mid-{tag}"));
    let g1 = e.load(&s, 10, LoadOptions::new(2)).await.unwrap();
    let (user, rid) = (UserId::new("dan").unwrap(), RequestId::new("r").unwrap());
    let home = shardstock::segments::home(&user, &rid, 2, false);
    let donor = 1 - home;
    let st = e.store();
    let t = TransferArgs {
        id: 9,
        dest: home,
        want: 4,
        floor: 0,
        lease_ms: 1,
    };
    let r = st.transfer(at(&s, g1, donor), t).await.unwrap();
    assert!(
        matches!(r, TransferReply::Debited { units: 4, .. }),
        "[{tag}] {r:?}"
    );
    assert_eq!(e.audit(&s).await.unwrap().in_transit, 4, "[{tag}]");
    let g2 = e
        .load(&s, 6, LoadOptions::new(2).replace(true))
        .await
        .unwrap();
    assert!(g2 > g1);
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok, "[{tag}] {a:?}");
    assert_eq!(
        (a.generation, a.remaining, a.in_transit),
        (g2, 6, 0),
        "[{tag}] {a:?}"
    );
    // The old generation's transfer, finished late: nothing applies.
    let credit = [Credit {
        id: 9,
        donor,
        units: 4,
    }];
    let r = st
        .sell(at(&s, g1, home), sale(&user, &rid, 1, &credit))
        .await
        .unwrap();
    assert_eq!(r, SellReply::Stale, "[{tag}]");
    let r = st.transfer(at(&s, g1, donor), t).await.unwrap();
    assert_eq!(r, TransferReply::Stale, "[{tag}]");
    tokio::time::sleep(Duration::from_millis(5)).await;
    e.sweep().await.unwrap();
    for i in 0..2 {
        assert!(
            st.transfers_due(at(&s, g2, i), 10)
                .await
                .unwrap()
                .is_empty(),
            "[{tag}] segment {i}"
        );
    }
    let a = e.audit(&s).await.unwrap();
    assert!(a.ok, "[{tag}] {a:?}");
    assert_eq!(
        (a.remaining, a.in_transit, a.sold),
        (6, 0, 0),
        "[{tag}] {a:?}"
    );
    let d = Deduct {
        sku: s.clone(),
        user,
        qty: 1,
        request_id: rid,
    };
    assert_eq!(e.deduct(&d).await.unwrap().units_applied(), 1, "[{tag}]");
    let a = e.audit(&s).await.unwrap();
    assert!(
        a.ok && a.sold == 1 && a.remaining == 5 && a.in_transit == 0,
        "[{tag}] {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_mid_transfer_leaves_nothing_in_transit() {
    let b = || Engine::builder().per_user_limit(0);
    reload_mid_transfer(b().build(MemoryStore::new()).unwrap(), "memory").await;
    let srv = RedisServer::start();
    reload_mid_transfer(redis_engine(&srv, b()).await, "redis").await;
    // The dropped generation's transfer records are gone with its keys.
    assert_eq!(
        srv.cli(&["KEYS", "t:*:tx*"]).trim(),
        "",
        "old transfer keys left"
    );
}

/// The same crash point reached through the engine: a deduction whose home is short is
/// dropped after its transfer's debit reached Redis and before the engine saw the reply (so
/// before it could send the credit) — a process killed there. The units stay in transit
/// (audited), the sweeper credits them once the lease runs out, and the request, retried,
/// applies once at its home. One thread: the deduction moves only when the test polls it.
#[tokio::test(flavor = "current_thread")]
async fn a_deduction_dropped_after_its_debit_leaves_units_the_sweeper_credits() {
    use futures::poll;
    use std::task::Poll;
    let srv = RedisServer::start();
    for (tag, coalesce) in [("lua", false), ("coalesced", true)] {
        let b = Engine::builder()
            .per_user_limit(0)
            .transfer_lease(Duration::from_millis(300));
        let e = if coalesce {
            coalesced_engine(&srv, b, Coalescing::default(), "t").await
        } else {
            redis_engine(&srv, b).await
        };
        let s = sku(&format!("dropped-{tag}"));
        let g = e.load(&s, 10, LoadOptions::new(2)).await.unwrap(); // [5, 5]
        let (user, rid) = (UserId::new("eve").unwrap(), RequestId::new("r7").unwrap());
        let home = shardstock::segments::home(&user, &rid, 2, false);
        let donor = 1 - home;
        let tx = format!("t:{{{s}#{donor}}}:g{g}:tx");
        let debited = || srv.cli(&["HLEN", &tx]) != "0";
        let d = Deduct {
            sku: s.clone(),
            user: user.clone(),
            qty: 7,
            request_id: rid.clone(),
        };
        {
            let fut = e.deduct(&d);
            tokio::pin!(fut);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            'drive: loop {
                if let Poll::Ready(r) = poll!(fut.as_mut()) {
                    panic!("[{tag}] the deduction finished before its debit could be cut: {r:?}");
                }
                // Let fred send and receive without polling the deduction: once the debit is
                // in Redis, the deduction has not seen its reply yet.
                for _ in 0..50 {
                    tokio::task::yield_now().await;
                    if debited() {
                        break 'drive;
                    }
                }
                assert!(std::time::Instant::now() < deadline, "[{tag}] no debit");
            }
        } // dropped: the process "dies" here
        for _ in 0..20 {
            tokio::task::yield_now().await; // anything fred still had queued goes out
        }
        let a = e.audit(&s).await.unwrap();
        assert!(a.ok, "[{tag}] {a:?}");
        assert!(a.in_transit > 0, "[{tag}] nothing in transit: {a:?}");
        assert_eq!(a.sold, 0, "[{tag}] {a:?}");
        assert_eq!(a.remaining + a.in_transit, 10, "[{tag}] {a:?}");
        tokio::time::sleep(Duration::from_millis(350)).await;
        e.sweep().await.unwrap();
        let a = e.audit(&s).await.unwrap();
        assert!(a.ok, "[{tag}] {a:?}");
        assert_eq!((a.remaining, a.in_transit), (10, 0), "[{tag}] {a:?}");
        let r = e.deduct(&d).await.unwrap();
        assert_eq!(
            r,
            Deduction::Applied {
                segment: home,
                units: 7
            },
            "[{tag}]"
        );
        assert!(matches!(e.deduct(&d).await, Ok(Deduction::Replayed { .. })));
        tokio::time::sleep(Duration::from_millis(350)).await;
        e.sweep().await.unwrap();
        let a = e.audit(&s).await.unwrap();
        assert!(a.ok, "[{tag}] {a:?}");
        assert_eq!(
            (a.remaining, a.in_transit, a.sold),
            (3, 0, 7),
            "[{tag}] {a:?}"
        );
        let moved_in: u64 = a.segments.iter().map(|x| x.state.moved_in).sum();
        let moved_out: u64 = a.segments.iter().map(|x| x.state.moved_out).sum();
        assert_eq!(moved_in, moved_out, "[{tag}] {a:?}");
    }
}
