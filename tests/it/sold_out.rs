//! Sold out from memory (`engine/sold_out.rs`), against real redis-server processes: after a
//! proven sell-out an engine answers without sending a command; a restock, cancel, expiry or
//! reload made through ANOTHER engine (its own store and connections) makes it sell again; a
//! killed subscriber voids the flags; a retry of an applied request id still replays.

use crate::common;
use common::*;
use fred::interfaces::ClientLike;
use shardstock::*;
use std::time::{Duration, Instant};

fn sku(s: &str) -> Sku {
    Sku::new(s).unwrap()
}

fn req(s: &str, i: &str) -> Deduct {
    Deduct::new(s, &format!("u-{i}"), 1, &format!("r-{i}")).unwrap()
}

/// Commands the server ran so far (`INFO commandstats`), leaving out the `INFO` calls
/// themselves.
async fn commands(admin: &fred::clients::Client) -> u64 {
    let info: String = admin
        .info(Some(fred::types::InfoKind::CommandStats))
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// An engine (per-user limit off) whose sold-out flags live `ttl`.
async fn engine(server: &RedisServer, ttl: Duration) -> Engine<RedisStore> {
    redis_engine(
        server,
        Engine::builder().per_user_limit(0).sold_out_ttl(ttl),
    )
    .await
}

/// Sells every unit of `s` through `e`, then asks until an answer comes from memory (the
/// first sold-out answer reads, and proves the flag).
async fn sell_out(e: &Engine<RedisStore>, s: &str, tag: &str) {
    let mut i = 0;
    loop {
        i += 1;
        if e.deduct(&req(s, &format!("{tag}-{i}"))).await.unwrap() == Deduction::SoldOut {
            break;
        }
    }
    // The flag was set by that read: one more answer to be sure it is there.
    assert_eq!(
        e.deduct(&req(s, &format!("{tag}-x"))).await.unwrap(),
        Deduction::SoldOut
    );
}

/// Asks `e` until it sells (each ask a new request id); the time it took and the asks.
async fn until_sold(e: &Engine<RedisStore>, s: &str, tag: &str) -> (Duration, u32) {
    let start = Instant::now();
    for i in 0.. {
        match e.deduct(&req(s, &format!("{tag}-{i}"))).await.unwrap() {
            Deduction::Applied { .. } => return (start.elapsed(), i + 1),
            Deduction::SoldOut => {}
            other => panic!("{other:?}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the units made sellable elsewhere were never sold here"
        );
        tokio::task::yield_now().await;
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sold_out_answers_send_nothing_and_replays_still_replay() {
    let server = RedisServer::start();
    let admin = admin_client(&server).await;
    let e = engine(&server, Duration::from_secs(60)).await;
    // Another instance, subscribed before the load (it sees the load's notification too).
    let other = engine(&server, Duration::from_secs(60)).await;
    let s = sku("storm");
    e.load(&s, 8, LoadOptions::new(2)).await.unwrap();
    sell_out(&e, "storm", "a").await;
    let dbsize = server.dbsize();
    let before = commands(&admin).await;
    for i in 0..2000 {
        let d = e.deduct(&req("storm", &format!("m-{i}"))).await.unwrap();
        assert_eq!(d, Deduction::SoldOut);
    }
    // Two buyers asking 3 at once: sold out, too (total 0).
    let big = Deduct::new("storm", "u-big", 3, "r-big").unwrap();
    assert_eq!(e.deduct(&big).await.unwrap(), Deduction::SoldOut);
    assert_eq!(
        commands(&admin).await,
        before,
        "sold-out answers sent commands"
    );
    assert_eq!(server.dbsize(), dbsize, "sold-out answers wrote");
    // A retry of a request that applied here reads its record: a replay, not "sold out".
    let d = e.deduct(&req("storm", "a-1")).await.unwrap();
    assert!(matches!(d, Deduction::Replayed { .. }), "{d:?}");
    // Another instance that sold nothing cannot prove every unit went to ids it knows: it
    // reads, and a retry of an id applied through the first replays there too.
    let before = commands(&admin).await;
    for i in 0..20 {
        let d = other
            .deduct(&req("storm", &format!("o-{i}")))
            .await
            .unwrap();
        assert_eq!(d, Deduction::SoldOut);
    }
    assert!(
        commands(&admin).await > before,
        "no proof, no memory answers"
    );
    let d = other.deduct(&req("storm", "a-2")).await.unwrap();
    assert!(matches!(d, Deduction::Replayed { .. }), "{d:?}");
    // Whatever a call left in transit is credited before the audit.
    e.sweep().await.unwrap();
    let a = e.audit(&s).await.unwrap();
    assert_eq!(a.in_transit, 0, "{a:?}");
    assert!(a.ok && a.sold == 8, "{a:?}");
}

/// Restocks through another engine, 200 times: this engine sells each unit again. The time from
/// the restock's acknowledgement to the first sale here is printed (p50/p99): the staleness.
/// With the flags' TTL at 60 s, only the notification can end them in time (the mutation check:
/// no PUBLISH in restock.lua makes this test fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restock_elsewhere_sells_again_here() {
    let server = RedisServer::start();
    let admin = admin_client(&server).await;
    let here = engine(&server, Duration::from_secs(60)).await;
    let there = engine(&server, Duration::from_secs(60)).await;
    let s = sku("again");
    here.load(&s, 3, LoadOptions::new(1)).await.unwrap();
    sell_out(&here, "again", "first").await;
    let trials = env_knob("SOLD_OUT_TRIALS").unwrap_or(200u32);
    let (mut lag, mut memory_answers) = (Vec::new(), 0);
    for t in 0..trials {
        // The flag stands: the next answer sends nothing.
        let before = commands(&admin).await;
        let d = here
            .deduct(&req("again", &format!("t{t}-pre")))
            .await
            .unwrap();
        assert_eq!(d, Deduction::SoldOut);
        assert_eq!(commands(&admin).await, before, "trial {t}: no flag");
        let rid = RequestId::new(format!("restock-{t}")).unwrap();
        there.restock(&s, 1, &rid).await.unwrap();
        let (took, asks) = until_sold(&here, "again", &format!("t{t}")).await;
        lag.push(took);
        memory_answers += asks - 1;
        // Sold out again, proven again by the next read.
        sell_out(&here, "again", &format!("t{t}-post")).await;
    }
    lag.sort();
    let p = |q: f64| lag[((lag.len() as f64 - 1.0) * q) as usize];
    println!(
        "staleness over {trials} restocks elsewhere: p50 {:?}, p99 {:?}, max {:?}; {memory_answers} sold-out answers in between",
        p(0.5),
        p(0.99),
        lag.last().unwrap()
    );
    // Whatever a call left in transit is credited before the audit.
    here.sweep().await.unwrap();
    let a = here.audit(&s).await.unwrap();
    assert_eq!(a.in_transit, 0, "{a:?}");
    assert!(a.ok, "{a:?}");
    assert_eq!(a.sold, 3 + u64::from(trials));
}

/// A flag stands here (checked: the answer sent nothing).
async fn flag_stands(e: &Engine<RedisStore>, admin: &fred::clients::Client, s: &str, tag: &str) {
    // The server's command count is everyone's (a layout re-read, a client's health check):
    // an answer with no command run while it was asked shows the flag; a few tries allow for
    // a command of someone else's landing in the window on a loaded machine.
    let mut ran = Vec::new();
    for i in 0..20 {
        let before = commands(admin).await;
        assert_eq!(
            e.deduct(&req(s, &format!("{tag}-{i}"))).await.unwrap(),
            Deduction::SoldOut
        );
        match commands(admin).await - before {
            0 => return,
            n => ran.push(n),
        }
    }
    panic!("{tag}: no flag (commands run per answer: {ran:?})");
}

fn held(d: Reserved) -> ReservationId {
    match d {
        Reserved::Held { id, .. } => id,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_expiry_and_reload_elsewhere_sell_again_here() {
    let server = RedisServer::start();
    let admin = admin_client(&server).await;
    let here = engine(&server, Duration::from_secs(60)).await;
    let there = engine(&server, Duration::from_secs(60)).await;

    // Cancel: a reservation held here, the other unit sold here, flag; cancelled elsewhere.
    let c = sku("cancel");
    here.load(&c, 2, LoadOptions::new(1)).await.unwrap();
    let r = held(
        here.reserve(&req("cancel", "c"), Duration::from_secs(600))
            .await
            .unwrap(),
    );
    sell_out(&here, "cancel", "a").await;
    flag_stands(&here, &admin, "cancel", "pre").await;
    there.cancel(&r).await.unwrap();
    until_sold(&here, "cancel", "after").await;
    // Units went back: this generation proves no more flags (another instance's reservation
    // might have gone back too and its units been sold here). Answers read: still exact.
    let before = commands(&admin).await;
    assert_eq!(
        here.deduct(&req("cancel", "y")).await.unwrap(),
        Deduction::SoldOut
    );
    assert!(commands(&admin).await > before);

    // Expiry: the reservation's units come back when a script reclaims them — here another
    // instance's sweeper. Until then the flag hides them (the documented bound).
    let x = sku("expire");
    here.load(&x, 2, LoadOptions::new(1)).await.unwrap();
    held(
        here.reserve(&req("expire", "x"), Duration::from_millis(200))
            .await
            .unwrap(),
    );
    sell_out(&here, "expire", "a").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    flag_stands(&here, &admin, "expire", "expired-unswept").await;
    // The sweeper goes over every SKU the store knows (this engine never used this one).
    assert_eq!(there.sweep().await.unwrap(), 1);
    until_sold(&here, "expire", "after").await;

    // Reload elsewhere: the new generation sells here, and proves its own flag.
    let l = sku("reload");
    here.load(&l, 1, LoadOptions::new(1)).await.unwrap();
    sell_out(&here, "reload", "a").await;
    flag_stands(&here, &admin, "reload", "pre").await;
    there
        .load(&l, 2, LoadOptions::new(1).replace(true))
        .await
        .unwrap();
    until_sold(&here, "reload", "after").await;
    sell_out(&here, "reload", "gen2").await;
    flag_stands(&here, &admin, "reload", "gen2-flag").await;
    for s in [&c, &x, &l] {
        // Whatever a call left in transit is credited before the audit.
        here.sweep().await.unwrap();
        let a = here.audit(s).await.unwrap();
        assert_eq!(a.in_transit, 0, "{a:?}");
        assert!(a.ok && a.remaining == 0, "{a:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_subscriber_voids_the_flags() {
    let server = RedisServer::start();
    let admin = admin_client(&server).await;
    let e = engine(&server, Duration::from_secs(60)).await;
    let s = sku("killed");
    e.load(&s, 2, LoadOptions::new(1)).await.unwrap();
    sell_out(&e, "killed", "a").await;
    flag_stands(&e, &admin, "killed", "m").await;
    let killed: u64 = server
        .cli(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .parse()
        .unwrap();
    assert_eq!(killed, 1, "one subscriber");
    // Messages may have been lost: answers come from reads again (the flag is void as soon as
    // the subscriber sees its connection fail; wait for that, bounded).
    let start = Instant::now();
    loop {
        let before = commands(&admin).await;
        let d = e.deduct(&req("killed", "after")).await.unwrap();
        assert_eq!(d, Deduction::SoldOut);
        if commands(&admin).await > before {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "flag outlived its subscriber"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Resubscribed, but a message about this generation may have been missed: no more flags
    // for it (still exact). A restock elsewhere still sells here.
    let there = engine(&server, Duration::from_secs(60)).await;
    there
        .restock(&s, 1, &RequestId::new("rs-1").unwrap())
        .await
        .unwrap();
    until_sold(&e, "killed", "b").await;
    // Whatever a call left in transit is credited before the audit.
    e.sweep().await.unwrap();
    let a = e.audit(&s).await.unwrap();
    assert_eq!(a.in_transit, 0, "{a:?}");
    assert!(a.ok && a.sold == 3, "{a:?}");
}
