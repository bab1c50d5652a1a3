//! Orders that cannot be lost, end to end in one process: a SKU loaded with the outbox, a few
//! sales, and the outbox consumer writing one PostgreSQL row per sale.
//!
//! ```text
//! redis-server --port 6379 &
//! # a PostgreSQL you may write to, e.g. a throwaway one:
//! #   runuser -u postgres -- /usr/lib/postgresql/15/bin/initdb -D /tmp/pg -A trust
//! #   runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D /tmp/pg -o "-p 5433" start
//! cargo run --features postgres --example orders_postgres -- redis://127.0.0.1:6379 postgres://postgres@127.0.0.1:5433/postgres
//! ```
//!
//! The lesson: the sale and its event are one atomic script in Redis, so there is no window
//! where Redis sold and the order was never written; the consumer acknowledges an event only
//! after PostgreSQL took it, and the table's key is the request id, so a redelivery (a
//! consumer killed between the insert and the ack) inserts nothing twice. Write your own
//! handler by implementing `shardstock::orders::Handler` with the same contract.

use shardstock::orders::postgres::PostgresOrders;
use shardstock::orders::{Orders, OrdersOptions};
use shardstock::{Deduct, Deduction, EngineBuilder, LoadOptions, RedisStore, Sku};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let redis = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let postgres = args
        .next()
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into());

    // The selling side: a SKU with the outbox on, and 150 buyers for 100 units.
    let store = RedisStore::builder(&redis)
        .key_prefix("example")
        .connect()
        .await?;
    let engine = EngineBuilder::default().build(store.clone())?;
    let sku = Sku::new("sneaker")?;
    engine
        .load(&sku, 100, LoadOptions::new(4).replace(true).outbox(true))
        .await?;
    let mut sold = 0;
    for i in 0..150 {
        let req = Deduct::new("sneaker", &format!("buyer-{i}"), 1, &format!("order-{i}"))?;
        if let Deduction::Applied { .. } = engine.deduct(&req).await? {
            sold += 1;
        }
    }

    // The order side: usually another process (`shardstock orders --postgres URL`).
    let pg = PostgresOrders::connect(&postgres).await?;
    pg.migrate().await?;
    let orders = Orders::new(store, pg, OrdersOptions::new("orders", "example"))?;
    let polled = orders.drain(Duration::from_secs(30)).await?;
    let summary = orders.handler().summary(Some("sneaker")).await?;
    println!(
        "sold {sold}; consumer handled {} events; PostgreSQL holds {} orders of sneaker ({} units)",
        polled.handled, summary.rows, summary.sold_units
    );
    assert_eq!(summary.sold_units, engine.audit(&sku).await?.sold);
    Ok(())
}
