//! Reservations (pre-deduction): reserve, confirm, cancel, and automatic return on expiry —
//! exactly once, on the store's clock, with and without the sweeper.

use crate::common;
use common::*;
use futures::future::join_all;
use shardstock::store::ResvState;
use shardstock::*;
use std::time::{Duration, Instant};

fn held(r: Reserved) -> ReservationId {
    match r {
        Reserved::Held { id, .. } => id,
        other => panic!("not held: {other:?}"),
    }
}

async fn audit_ok<S: Store>(e: &Engine<S>, sku: &Sku) -> Audit {
    let a = e.audit(sku).await.unwrap();
    assert!(a.ok, "{a:?}");
    assert_eq!(
        a.loaded + a.restocked,
        a.remaining + a.in_transit + a.reserved + a.sold
    );
    a
}

/// The life of reservations on both stores, with the per-user limit counting them.
async fn lifecycle<S: Store>(e: Engine<S>) {
    let sku = Sku::new("resv").unwrap();
    e.load(&sku, 10, LoadOptions::new(2).per_user_limit(1))
        .await
        .unwrap();
    let ttl = Duration::from_millis(300);
    let a = held(
        e.reserve(&Deduct::new("resv", "ann", 1, "a1").unwrap(), ttl)
            .await
            .unwrap(),
    );
    let b = held(
        e.reserve(&Deduct::new("resv", "bob", 1, "b1").unwrap(), ttl)
            .await
            .unwrap(),
    );
    let c = held(
        e.reserve(&Deduct::new("resv", "cat", 1, "c1").unwrap(), ttl)
            .await
            .unwrap(),
    );
    let x = audit_ok(&e, &sku).await;
    assert_eq!((x.reserved, x.remaining, x.sold), (3, 7, 0));
    // Replays return the same reservation; the limit counts the reservation.
    let again = e
        .reserve(&Deduct::new("resv", "ann", 1, "a1").unwrap(), ttl)
        .await
        .unwrap();
    assert!(
        matches!(&again, Reserved::Replayed { id, .. } if *id == a),
        "{again:?}"
    );
    let more = e
        .reserve(&Deduct::new("resv", "ann", 1, "a2").unwrap(), ttl)
        .await
        .unwrap();
    assert_eq!(
        more,
        Reserved::NotHeld(Deduction::LimitReached { limit: 1 })
    );
    // Confirm, cancel, and one left to expire.
    let r = e.confirm(&a).await.unwrap();
    assert_eq!((r.state, r.done), (Some(ResvState::Confirmed), true));
    assert_eq!(
        e.confirm(&a).await.unwrap().state,
        Some(ResvState::Confirmed),
        "idempotent"
    );
    assert!(
        !e.cancel(&a).await.unwrap().done,
        "a confirmed reservation cannot be cancelled"
    );
    let r = e.cancel(&b).await.unwrap();
    assert_eq!((r.state, r.done), (Some(ResvState::Cancelled), true));
    // bob's chance came back.
    let d = e
        .deduct(&Deduct::new("resv", "bob", 1, "b2").unwrap())
        .await
        .unwrap();
    assert_eq!(d.units_applied(), 1, "{d:?}");
    tokio::time::sleep(Duration::from_millis(350)).await;
    // Expired: confirming sells nothing; the units came back (lazily, on this very call).
    let r = e.confirm(&c).await.unwrap();
    assert_eq!((r.state, r.done), (Some(ResvState::Expired), false));
    let x = audit_ok(&e, &sku).await;
    assert_eq!((x.reserved, x.sold, x.remaining), (0, 2, 8));
    // cat's chance came back too.
    let d = e
        .deduct(&Deduct::new("resv", "cat", 1, "c2").unwrap())
        .await
        .unwrap();
    assert_eq!(d.units_applied(), 1, "{d:?}");
    // Malformed ids are input errors (caught when the id is parsed, before any I/O).
    assert!(matches!(
        "nope".parse::<ReservationId>(),
        Err(Error::InvalidInput { .. })
    ));
    let never: ReservationId = "resv~1~0~u~never".parse().unwrap();
    assert_eq!(e.confirm(&never).await.unwrap().state, None);
}

#[tokio::test]
async fn reservation_lifecycle_both_stores() {
    lifecycle(memory_engine(Engine::builder())).await;
    let srv = RedisServer::start();
    lifecycle(redis_engine(&srv, Engine::builder()).await).await;
    let e = coalesced_engine(&srv, Engine::builder(), Coalescing::default(), "c").await;
    lifecycle(e).await;
}

/// "Never" and "not now" are told apart: a quantity above the per-user limit is final; a
/// reservation larger than any segment is held all the same (units move to its home first);
/// a purchase above the stock left is insufficient, not final.
async fn never_and_not_now<S: Store>(e: Engine<S>) {
    let sku = Sku::new("never").unwrap();
    // Segments of 3, 3, 2, 2 units.
    e.load(&sku, 10, LoadOptions::new(4).per_user_limit(4))
        .await
        .unwrap();
    let ttl = Duration::from_secs(60);
    let d = |user: &str, qty, rid: &str| Deduct::new("never", user, qty, rid).unwrap();
    let r = e.reserve(&d("ann", 4, "n1"), ttl).await.unwrap();
    let Reserved::Held { id, segment, units } = r else {
        panic!("4 units reserved over segments of at most 3: {r:?}")
    };
    assert_eq!((segment, units), (id.segment(), 4), "held at its home");
    let d5 = e.deduct(&d("bob", 5, "n2")).await.unwrap();
    assert_eq!(d5, Deduction::OverLimit { limit: 4 });
    assert!(d5.is_final());
    // Nothing was held or sold by the refusal; a sale of 4 is served at its home too.
    let a = audit_ok(&e, &sku).await;
    assert_eq!((a.remaining, a.reserved, a.in_transit), (6, 4, 0), "{a:?}");
    let bought = e.deduct(&d("bob", 4, "n3")).await.unwrap();
    assert_eq!(bought.units_applied(), 4, "{bought:?}");
    assert!(!bought.is_final());
    let more = e.deduct(&d("dan", 4, "n5")).await.unwrap();
    assert_eq!(more, Deduction::Insufficient { available: 2 });
    assert!(!more.is_final());
    // 2 units left, wherever they are: a reservation of 2 is held at its home.
    let r = e.reserve(&d("cat", 2, "n6"), ttl).await.unwrap();
    assert!(matches!(r, Reserved::Held { .. }), "{r:?}");
    let a = audit_ok(&e, &sku).await;
    assert_eq!(
        (a.remaining, a.reserved, a.sold, a.in_transit),
        (0, 6, 4, 0),
        "{a:?}"
    );
}

#[tokio::test]
async fn never_possible_answers_are_final_both_stores() {
    never_and_not_now(memory_engine(Engine::builder())).await;
    let srv = RedisServer::start();
    never_and_not_now(redis_engine(&srv, Engine::builder()).await).await;
}

/// 1000 confirms racing their own expiry (TTL 2 s, confirms at 2 s ± 50 ms): each reservation
/// ends in exactly one state, no unit is sold twice or lost.
async fn confirms_race_expiry<S: Store>(e: Engine<S>) {
    let sku = Sku::new("race").unwrap();
    e.load(&sku, 1000, LoadOptions::new(8).per_user_limit(0))
        .await
        .unwrap();
    let ttl = Duration::from_secs(2);
    let mut ids = Vec::new();
    for i in 0..1000 {
        let d = Deduct::new("race", &format!("u{i}"), 1, &format!("r{i}")).unwrap();
        ids.push((held(e.reserve(&d, ttl).await.unwrap()), Instant::now()));
    }
    assert_eq!(audit_ok(&e, &sku).await.reserved, 1000);
    let confirms = ids.into_iter().map(|(id, at)| {
        let e = e.clone();
        tokio::spawn(async move {
            let jitter = fastrand::i64(-50..=50);
            let when = at + Duration::from_millis((2000 + jitter) as u64);
            tokio::time::sleep_until(when.into()).await;
            e.confirm(&id).await.unwrap()
        })
    });
    let ends: Vec<ReservationEnd> = join_all(confirms)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let confirmed = ends
        .iter()
        .filter(|r| r.done && r.state == Some(ResvState::Confirmed))
        .count() as u64;
    let expired = ends
        .iter()
        .filter(|r| !r.done && r.state == Some(ResvState::Expired))
        .count() as u64;
    assert_eq!(
        confirmed + expired,
        1000,
        "some reservation ended in no or two states"
    );
    e.sweep().await.unwrap();
    let a = audit_ok(&e, &sku).await;
    assert_eq!(
        (a.sold, a.reserved, a.remaining),
        (confirmed, 0, 1000 - confirmed)
    );
    eprintln!("race: {confirmed} confirmed in time, {expired} expired first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confirms_racing_expiry_end_in_exactly_one_state() {
    confirms_race_expiry(memory_engine(Engine::builder())).await;
    let srv = RedisServer::start();
    confirms_race_expiry(redis_engine(&srv, Engine::builder()).await).await;
}

/// The sweeper returns expired units promptly with no traffic; killed mid-run, lazy reclaim
/// still returns them; a restarted sweeper returns nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_and_lazy_reclaim_return_each_unit_once() {
    sweeper_and_lazy_reclaim(
        redis_engine(&RedisServer::start(), Engine::builder().per_user_limit(0)).await,
    )
    .await;
}

async fn sweeper_and_lazy_reclaim(e: Engine<RedisStore>) {
    let sku = Sku::new("sweep").unwrap();
    e.load(&sku, 40, LoadOptions::new(4).per_user_limit(0))
        .await
        .unwrap();
    let sweeper = e.start_sweeper(Duration::from_millis(50));
    for i in 0..10 {
        let d = Deduct::new("sweep", "u", 1, &format!("s{i}")).unwrap();
        held(e.reserve(&d, Duration::from_millis(100)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = audit_ok(&e, &sku).await;
    assert_eq!(
        (a.reserved, a.remaining),
        (0, 40),
        "the sweeper returned them without traffic"
    );

    // Kill the sweeper; reserve more; let them expire; only lazy reclaim can return them.
    // (The audit reclaims too — its survey returns expired reservations first — so the
    // counters are read raw until then.)
    drop(sweeper);
    for i in 0..12 {
        let d = Deduct::new("sweep", "u", 1, &format!("t{i}")).unwrap();
        held(e.reserve(&d, Duration::from_millis(100)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(raw_reserved(&e, &sku).await, 12, "no sweeper ran");
    // Any deduction touching a segment reclaims that segment's expired reservations.
    let mut k = 0;
    while raw_reserved(&e, &sku).await > 0 {
        let d = Deduct::new("sweep", &format!("b{k}"), 1, &format!("b{k}")).unwrap();
        e.deduct(&d).await.unwrap();
        k += 1;
        assert!(k < 200, "lazy reclaim never returned the stock");
    }
    let before = audit_ok(&e, &sku).await;
    assert_eq!(before.remaining + before.sold, 40);
    // A restarted sweeper finds nothing left to return.
    let _sweeper = e.start_sweeper(Duration::from_millis(20));
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(e.sweep().await.unwrap(), 0);
    assert_eq!(audit_ok(&e, &sku).await, before);
}

/// Units the segments of `sku` count as reserved, read from their hashes (no script runs: no
/// reclaim).
async fn raw_reserved(e: &Engine<RedisStore>, sku: &Sku) -> u64 {
    use fred::prelude::HashesInterface;
    let meta = e.store().meta(sku).await.unwrap().expect("loaded");
    let mut sum = 0;
    for i in 0..meta.segments {
        let tag = shardstock::placement::tag(sku, i, meta.placement.suffix(i));
        let key = e.store().keyspace().segment(&tag);
        let v: Option<u64> = e
            .store()
            .pool()
            .next()
            .hget(&key, "reserved")
            .await
            .unwrap();
        sum += v.unwrap_or(0);
    }
    sum
}

/// The reservation suites on a 3-master cluster (one cluster for all, one key prefix each).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reservations_on_a_cluster() {
    let c = cluster::RedisCluster::start(3, 0);
    lifecycle(prefixed_engine(&c, Engine::builder(), "life").await).await;
    lifecycle(coalesced_engine(&c, Engine::builder(), Coalescing::default(), "c").await).await;
    never_and_not_now(prefixed_engine(&c, Engine::builder(), "never").await).await;
    confirms_race_expiry(prefixed_engine(&c, Engine::builder(), "race").await).await;
    sweeper_and_lazy_reclaim(
        prefixed_engine(&c, Engine::builder().per_user_limit(0), "sweep").await,
    )
    .await;
}
