//! The PostgreSQL orders handler alone, against a real PostgreSQL (a throwaway cluster per
//! test): one row per request id, redelivery writes nothing (not even a new row version), a
//! reservation's events give one row in either order, a final status is never overwritten, a
//! poison event fails alone, a restarted server is reconnected, and the summary the CLI and
//! the end-to-end tests compare with the audit.

use crate::common;
use common::postgres::PostgresServer;
use shardstock::orders::postgres::{OrdersSummary, PostgresOrders};
use shardstock::orders::{EventKind, Handler, OrderEvent};
use shardstock::segments::Part;
use std::time::Instant;

/// An event of `kind` for request `rid` on stream `s<segment>`, at `at_ms`.
fn event(kind: EventKind, rid: &str, units: u64, segment: u32, at_ms: u64) -> OrderEvent {
    let mut e = OrderEvent::new(kind, rid, "sku-1", format!("user-{rid}"), units);
    e.stream = format!("t:{{sku-1#{segment}}}:outbox");
    e.entry_id = format!("{at_ms}-0");
    e.parts = vec![Part { segment, units }];
    e.generation = 1;
    e.at_ms = at_ms;
    e
}

/// `n` sales `sale-0..n` of 1 to 3 units.
fn sales(n: usize) -> Vec<OrderEvent> {
    (0..n)
        .map(|i| {
            event(
                EventKind::Sold,
                &format!("sale-{i}"),
                1 + i as u64 % 3,
                i as u32 % 16,
                1_700_000_000_000 + i as u64,
            )
        })
        .collect()
}

async fn handler(pg: &PostgresServer) -> PostgresOrders {
    let orders = PostgresOrders::connect(&pg.url()).await.unwrap();
    orders.migrate().await.unwrap();
    orders
}

/// Every row, with its row version (`xmin`): a statement that rewrites a row, even with the
/// same values, changes it.
fn rows_with_versions(pg: &PostgresServer) -> String {
    pg.psql("SELECT xmin, * FROM shardstock_orders ORDER BY request_id")
}

/// The row of `rid`, every column.
fn row(pg: &PostgresServer, rid: &str) -> String {
    pg.psql(&format!(
        "SELECT * FROM shardstock_orders WHERE request_id = '{rid}'"
    ))
}

fn all_ok(results: &[Result<(), String>]) {
    for (i, r) in results.iter().enumerate() {
        assert!(r.is_ok(), "event {i}: {r:?}");
    }
}

/// A batch is written once: the same batch again (a redelivery) answers Ok for every event and
/// changes nothing — no row, not even a row version.
#[tokio::test]
async fn a_batch_is_written_once() {
    let pg = PostgresServer::start();
    let orders = handler(&pg).await;
    let batch = sales(500);

    let results = orders.handle(&batch).await;
    assert_eq!(results.len(), batch.len());
    all_ok(&results);
    let first = rows_with_versions(&pg);
    assert_eq!(first.lines().count(), 500);

    all_ok(&orders.handle(&batch).await);
    assert_eq!(rows_with_versions(&pg), first, "a replay changed rows");
    assert_eq!(
        orders.apply(&batch).await.unwrap(),
        0,
        "a replay writes no row"
    );

    // Half of it again, within a new batch: only the new half is written.
    let mut mixed = batch[250..].to_vec();
    mixed.extend(sales(600)[500..].iter().cloned());
    assert_eq!(orders.apply(&mixed).await.unwrap(), 100);
    let s = orders.summary(None).await.unwrap();
    assert_eq!((s.rows, s.sold), (600, 600));
}

/// A reservation's `reserved` event and its end, in either order, in two batches or in one,
/// each possibly twice: the same row.
#[tokio::test]
async fn a_reservation_gives_one_row_in_either_order() {
    let pg = PostgresServer::start();
    let orders = handler(&pg).await;
    for end in [
        EventKind::Confirmed,
        EventKind::Cancelled,
        EventKind::Expired,
    ] {
        let reserved = event(EventKind::Reserved, "resv-1", 2, 3, 1_000);
        let mut ended = event(end, "resv-1", 2, 3, 61_000);
        ended.deliveries = 2;
        let orders_of_arrival: [Vec<Vec<&OrderEvent>>; 5] = [
            vec![vec![&reserved], vec![&ended]],
            vec![vec![&ended], vec![&reserved]],
            vec![vec![&reserved, &ended]],
            vec![vec![&ended, &reserved]],
            vec![vec![&ended, &reserved, &ended], vec![&reserved, &reserved]],
        ];
        let mut seen = Vec::new();
        for batches in orders_of_arrival {
            pg.psql("DELETE FROM shardstock_orders");
            for batch in batches {
                let batch: Vec<OrderEvent> = batch.into_iter().cloned().collect();
                all_ok(&orders.handle(&batch).await);
            }
            seen.push(row(&pg, "resv-1"));
        }
        let expected = format!(
            "resv-1|sku-1|user-resv-1|2|{end}|3:2|1|1000|61000|t:{{sku-1#3}}:outbox|61000-0|2"
        );
        for (i, r) in seen.iter().enumerate() {
            assert_eq!(r, &expected, "{end}, arrival order {i}");
        }
    }
}

/// A final status is never overwritten (a confirmation racing an expiry: the first one
/// written stays), and `reserved` never overwrites a final status.
#[tokio::test]
async fn a_final_status_is_never_overwritten() {
    let pg = PostgresServer::start();
    let orders = handler(&pg).await;
    let finals = [
        EventKind::Sold,
        EventKind::Confirmed,
        EventKind::Cancelled,
        EventKind::Expired,
    ];
    for first in finals {
        for then in finals.into_iter().filter(|k| *k != first) {
            let rid = format!("{first}-{then}");
            all_ok(&orders.handle(&[event(first, &rid, 1, 0, 5_000)]).await);
            let before = row(&pg, &rid);
            assert!(before.contains(&format!("|{first}|")), "{before}");
            let late = [
                event(then, &rid, 1, 1, 6_000),
                event(EventKind::Reserved, &rid, 1, 1, 7_000),
            ];
            all_ok(&orders.handle(&late).await);
            assert_eq!(row(&pg, &rid), before, "{then} after {first}");
        }
    }
}

/// One poison event in a batch — a request id the engine could not have issued (refused by
/// the table's CHECK), zero units, a figure beyond `bigint` — answers Err with the reason; the
/// other events of the batch answer Ok and are written.
#[tokio::test]
async fn a_poison_event_fails_alone() {
    let pg = PostgresServer::start();
    let orders = handler(&pg).await;
    let mut batch = sales(10);
    batch[3].request_id = "not an engine id".into();
    batch[5].units = 0;
    batch[7].units = u64::MAX;

    let results = orders.handle(&batch).await;
    for (i, r) in results.iter().enumerate() {
        match i {
            3 | 5 => {
                let why = r.as_ref().unwrap_err();
                assert!(why.contains("check constraint"), "event {i}: {why}");
            }
            7 => assert!(
                r.as_ref().unwrap_err().contains("does not fit"),
                "event 7: {r:?}"
            ),
            _ => assert!(r.is_ok(), "event {i}: {r:?}"),
        }
    }
    let s = orders.summary(None).await.unwrap();
    assert_eq!(s.rows, 7);
    assert!(
        orders.apply(&batch[..4]).await.is_err(),
        "apply is all or nothing"
    );
}

/// The summary: rows per status and units, of one SKU or all.
#[tokio::test]
async fn the_summary_counts_rows_and_units() {
    let pg = PostgresServer::start();
    let orders = handler(&pg).await;
    assert_eq!(
        orders.summary(None).await.unwrap(),
        OrdersSummary::default()
    );
    let mut batch = vec![
        event(EventKind::Sold, "a", 3, 0, 1),
        event(EventKind::Sold, "b", 2, 1, 2),
        event(EventKind::Reserved, "c", 4, 2, 3),
        event(EventKind::Reserved, "d", 5, 3, 4),
        event(EventKind::Confirmed, "d", 5, 3, 5),
        event(EventKind::Expired, "e", 6, 0, 6),
        event(EventKind::Cancelled, "f", 7, 0, 7),
    ];
    let mut other = event(EventKind::Sold, "g", 10, 0, 8);
    other.sku = "sku-2".into();
    batch.push(other);
    all_ok(&orders.handle(&batch).await);

    let s = orders.summary(Some("sku-1")).await.unwrap();
    assert_eq!(
        (
            s.rows,
            s.sold,
            s.reserved,
            s.confirmed,
            s.cancelled,
            s.expired
        ),
        (6, 2, 1, 1, 1, 1)
    );
    assert_eq!((s.sold_units, s.reserved_units), (3 + 2 + 5, 4));
    let all = orders.summary(None).await.unwrap();
    assert_eq!((all.rows, all.sold, all.sold_units), (7, 3, 20));
    assert_eq!(orders.summary(Some("none")).await.unwrap().rows, 0);
}

/// A restarted server is reconnected within the next call; while it is down every event
/// answers Err (left pending by the consumer), and the call after it is back writes them.
#[tokio::test]
async fn a_restarted_server_is_reconnected() {
    let mut pg = PostgresServer::start();
    let orders = handler(&pg).await;
    let batch = sales(30);
    all_ok(&orders.handle(&batch[..10]).await);

    pg.restart();
    all_ok(&orders.handle(&batch[10..20]).await);

    pg.stop();
    let down = orders.handle(&batch[20..]).await;
    assert!(down.iter().all(|r| r.is_err()), "{down:?}");
    assert!(orders.summary(None).await.is_err());
    pg.boot();
    all_ok(&orders.handle(&batch[20..]).await);
    assert_eq!(orders.summary(None).await.unwrap().rows, 30);
}

/// Consumers starting together migrate together: one creates the table, none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_create_the_table_once() {
    let pg = PostgresServer::start();
    let url = pg.url();
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(
                async move { PostgresOrders::connect(&url).await.unwrap().migrate().await },
            )
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_tables WHERE tablename = 'shardstock_orders'"),
        "1"
    );
}

/// Throughput into PostgreSQL, batches of 100 and 1000 (a figure, not an assertion):
/// `cargo test --release --all-features --test it -- --ignored --nocapture orders_postgres::throughput`.
#[tokio::test]
#[ignore]
async fn throughput() {
    let pg = PostgresServer::start();
    let orders = handler(&pg).await;
    let n = 100_000;
    let events = sales(n);
    for batch in [100, 1000] {
        pg.psql("TRUNCATE shardstock_orders");
        let started = Instant::now();
        for chunk in events.chunks(batch) {
            all_ok(&orders.handle(chunk).await);
        }
        let new = started.elapsed();
        let started = Instant::now();
        for chunk in events.chunks(batch) {
            all_ok(&orders.handle(chunk).await);
        }
        let replay = started.elapsed();
        assert_eq!(orders.summary(None).await.unwrap().rows, n as u64);
        println!(
            "batch {batch}: {n} new events in {:.2?} = {:.0} events/s; replayed in {:.2?} = {:.0} events/s",
            new,
            n as f64 / new.as_secs_f64(),
            replay,
            n as f64 / replay.as_secs_f64()
        );
    }
}

/// Bad input and a server that is not there are typed errors: a URL that does not parse is
/// `Config`; nothing listening is `Postgres`, retryable.
#[tokio::test]
async fn connect_errors_are_typed() {
    use shardstock::error::ErrorKind;
    let bad = PostgresOrders::connect("postgres://host:notaport/db")
        .await
        .unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::Config, "{bad}");
    let port = common::ports::free_port();
    let down = PostgresOrders::connect(&format!("postgres://postgres@127.0.0.1:{port}/postgres"))
        .await
        .unwrap_err();
    assert_eq!(down.kind(), ErrorKind::Postgres, "{down}");
    assert!(down.is_retryable());
}
