//! Connections killed in the middle of a sale. fred re-sends in-flight commands after a
//! reconnect and a written command cannot be recalled, so a deduction script can run twice for
//! one call; and a call can fail with its outcome unknown. The contract: retrying with the same
//! request id is always safe. This test holds the engine to it against a real redis-server.

use crate::common;
use common::connection_killer::ConnectionKiller;
use common::*;
use shardstock::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_connections_never_double_sell() {
    let srv = RedisServer::start();
    let e = redis_engine(
        &srv,
        Engine::builder()
            .per_user_limit(0)
            .transfer_lease(Duration::from_millis(300)),
    )
    .await;
    sale_under_kills(&srv, e).await;
}

/// The same with request coalescing: a re-sent call carries many requests at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_connections_never_double_sell_coalesced() {
    let srv = RedisServer::start();
    let e = coalesced_engine(
        &srv,
        Engine::builder()
            .per_user_limit(0)
            .transfer_lease(Duration::from_millis(300)),
        Coalescing::default(),
        "t",
    )
    .await;
    sale_under_kills(&srv, e).await;
}

async fn sale_under_kills(srv: &RedisServer, e: Engine<RedisStore>) {
    let sku = Sku::new("kill").unwrap();
    e.load(&sku, 12_000, LoadOptions::new(8)).await.unwrap();

    // Bounded: at most 400 rounds of 5 ms.
    let killer = ConnectionKiller::start(srv.port, 400);

    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let buyers = (0..64).map(|_| {
        let (e, next, errors) = (e.clone(), next.clone(), errors.clone());
        tokio::spawn(async move {
            let mut answers = HashMap::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= 8000 {
                    break;
                }
                let d = Deduct::new("kill", &format!("u{i}"), 1 + i % 2, &format!("k{i}")).unwrap();
                // Retry with the same id until the answer is definite (bounded: 1000 tries).
                let mut tries = 0;
                let answer = loop {
                    tries += 1;
                    assert!(tries <= 1000, "no definite answer for {d:?}");
                    match e.deduct(&d).await {
                        Ok(a) => break a,
                        Err(Error::Redis(_)) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err(other) => panic!("{other}"),
                    }
                };
                answers.insert(i, answer);
            }
            answers
        })
    });
    let mut sold_to_buyers = 0;
    let mut replayed = 0;
    for b in futures::future::join_all(buyers).await {
        for (_, a) in b.unwrap() {
            match a {
                Deduction::Applied { units, .. } => sold_to_buyers += units,
                Deduction::Replayed { units, .. } => {
                    // Each id is sent by one buyer only: a replay here is a re-sent script.
                    replayed += 1;
                    sold_to_buyers += units;
                }
                Deduction::SoldOut | Deduction::Insufficient { .. } => {}
                other => panic!("{other:?}"),
            }
        }
    }
    let kills = killer.stop();

    // A call cut between a transfer's debit and its credit left units in transit: the
    // sweeper credits them once the lease ran out.
    tokio::time::sleep(Duration::from_millis(400)).await;
    e.sweep().await.unwrap();
    let a = e.audit(&sku).await.unwrap();
    assert!(a.ok, "{a:?}");
    assert_eq!(a.sold, sold_to_buyers, "store and buyers disagree");
    assert!(a.sold <= 12_000);
    assert_eq!(a.in_transit, 0, "{a:?}");
    assert_eq!(
        a.loaded + a.restocked,
        a.remaining + a.in_transit + a.reserved + a.sold
    );
    assert!(a.remaining <= 1, "stock left unsold: {}", a.remaining);
    assert!(kills > 0, "the killer never hit a connection");
    eprintln!(
        "connections killed: {kills}, errors retried: {}, replays seen: {replayed}",
        errors.load(Ordering::Relaxed)
    );
}
