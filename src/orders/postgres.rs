//! A [`Handler`] that writes orders into PostgreSQL, one row per request id
//! (feature `postgres`, on by default; client: `tokio-postgres`).
//!
//! [`PostgresOrders::migrate`] creates the table [`TABLE`] if absent:
//!
//! ```text
//! request_id  text primary key   the idempotency key (the engine's id rules, as a CHECK)
//! sku, user_id, units, parts, generation   of the event that set the status
//! status      text               sold | reserved | confirmed | cancelled | expired
//! created_ms  bigint             Redis clock of the request's earliest event seen
//! updated_ms  bigint             Redis clock of the event that set the status
//! stream, entry_id, deliveries   where that event was, and its delivery count
//! ```
//!
//! The row of a request is a function of the **set** of its events, whatever their order and
//! however often each one comes: a final status (every status but `reserved`) is never
//! overwritten, `reserved` never overwrites a final one, and `created_ms` is the least clock
//! seen. So a reservation's `reserved` event and its `confirmed` (or `cancelled`, `expired`)
//! event, which may sit in different segment streams, give the same row in either order, and a
//! redelivered event changes nothing (not even the row's version: the guard is in the
//! statement's `WHERE`).
//!
//! A batch is one `INSERT ... SELECT FROM UNNEST(...) ON CONFLICT (request_id) DO UPDATE ...
//! WHERE ...` statement (one round trip, atomic). When a batch holds several events of one
//! request (a reservation and its confirmation, or one event twice), they go in rounds of one
//! event per request each, in one transaction. When the batch fails, each event is written on
//! its own, so one poison event (say a request id the engine could not have issued, refused by
//! the table's CHECK) answers `Err` with PostgreSQL's reason and the others `Ok`. A broken
//! connection is opened again on the next call; when it breaks under a call, the call writes
//! its batch once more on a new connection (safe: the writes are idempotent).

use std::collections::HashMap;

use tokio::sync::Mutex;
use tokio_postgres::{Client, Config, NoTls, Statement};

use super::{Handler, OrderEvent};
use crate::error::{Error, Result};
use crate::segments::encode_parts;

/// The orders table.
pub const TABLE: &str = "shardstock_orders";

/// How long connecting may take when the URL sets no `connect_timeout`.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The schema, created under an advisory lock so that consumers starting together do not race
/// on `CREATE TABLE IF NOT EXISTS` (which is not safe against itself).
const SCHEMA: &str = "
BEGIN;
SELECT pg_advisory_xact_lock(7316180414);
CREATE TABLE IF NOT EXISTS shardstock_orders (
    request_id text PRIMARY KEY
        CONSTRAINT shardstock_orders_request_id_ok
        CHECK (octet_length(request_id) BETWEEN 1 AND 128
               AND request_id !~ '[[:space:][:cntrl:]{}]'),
    sku text NOT NULL,
    user_id text NOT NULL,
    units bigint NOT NULL CHECK (units > 0),
    status text NOT NULL
        CHECK (status IN ('sold', 'reserved', 'confirmed', 'cancelled', 'expired')),
    parts text NOT NULL,
    generation bigint NOT NULL,
    created_ms bigint NOT NULL,
    updated_ms bigint NOT NULL,
    stream text NOT NULL,
    entry_id text NOT NULL,
    deliveries bigint NOT NULL
);
-- A table made when request ids were ASCII only carries that charset check; ids are any UTF-8
-- of 1..=128 bytes without whitespace, control characters or braces now (as the engine checks).
ALTER TABLE shardstock_orders DROP CONSTRAINT IF EXISTS shardstock_orders_request_id_check;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conname = 'shardstock_orders_request_id_ok') THEN
        ALTER TABLE shardstock_orders ADD CONSTRAINT shardstock_orders_request_id_ok
            CHECK (octet_length(request_id) BETWEEN 1 AND 128
                   AND request_id !~ '[[:space:][:cntrl:]{}]');
    END IF;
END $$;
COMMIT;
";

/// The columns an event sets when it sets the status (all but `request_id` and `created_ms`).
const FROM_EVENT: [&str; 10] = [
    "sku",
    "user_id",
    "units",
    "parts",
    "status",
    "generation",
    "updated_ms",
    "stream",
    "entry_id",
    "deliveries",
];

/// When an incoming event (`excluded`) sets the status of an existing row (`o`): only a final
/// event over a `reserved` row.
const TAKES_OVER: &str = "(o.status = 'reserved' AND excluded.status <> 'reserved')";

/// The batch upsert: parameters are one array per column, one element per event.
fn upsert_sql() -> String {
    let set: Vec<String> = FROM_EVENT
        .iter()
        .map(|c| format!("{c} = CASE WHEN {TAKES_OVER} THEN excluded.{c} ELSE o.{c} END"))
        .collect();
    format!(
        "INSERT INTO {TABLE} AS o (request_id, sku, user_id, units, status, parts, generation, \
         created_ms, updated_ms, stream, entry_id, deliveries) \
         SELECT r, s, u, n, st, p, g, t, t, sm, e, d FROM UNNEST($1::text[], $2::text[], \
         $3::text[], $4::int8[], $5::text[], $6::text[], $7::int8[], $8::int8[], $9::text[], \
         $10::text[], $11::int8[]) AS x(r, s, u, n, st, p, g, t, sm, e, d) \
         ON CONFLICT (request_id) DO UPDATE SET {}, \
         created_ms = LEAST(o.created_ms, excluded.created_ms) \
         WHERE {TAKES_OVER} OR excluded.created_ms < o.created_ms",
        set.join(", ")
    )
}

/// Rows per status in the orders table (of one SKU or all), to compare with the engine's
/// [`Audit`](crate::Audit).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct OrdersSummary {
    /// Rows (request ids).
    pub rows: u64,
    /// Rows with status `sold`.
    pub sold: u64,
    /// Rows with status `reserved` (neither confirmed nor ended yet).
    pub reserved: u64,
    /// Rows with status `confirmed`.
    pub confirmed: u64,
    /// Rows with status `cancelled`.
    pub cancelled: u64,
    /// Rows with status `expired`.
    pub expired: u64,
    /// Units of `sold` and `confirmed` rows: the audit's `sold` once every event is consumed.
    pub sold_units: u64,
    /// Units of `reserved` rows: the audit's `reserved` once every event is consumed.
    pub reserved_units: u64,
}

/// One connection and its prepared upsert (prepared on first use, after [`migrate`](PostgresOrders::migrate)).
struct Conn {
    client: Client,
    upsert: Option<Statement>,
}

/// The PostgreSQL orders handler (see the [module docs](self)). Calls are serialised on one
/// connection.
pub struct PostgresOrders {
    config: Config,
    conn: Mutex<Option<Conn>>,
}

impl std::fmt::Debug for PostgresOrders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOrders").finish_non_exhaustive()
    }
}

/// The columns of a batch, one element per event.
#[derive(Default)]
struct Columns {
    request_id: Vec<String>,
    sku: Vec<String>,
    user_id: Vec<String>,
    units: Vec<i64>,
    status: Vec<&'static str>,
    parts: Vec<String>,
    generation: Vec<i64>,
    at_ms: Vec<i64>,
    stream: Vec<String>,
    entry_id: Vec<String>,
    deliveries: Vec<i64>,
}

impl Columns {
    fn push(&mut self, e: &OrderEvent) {
        self.request_id.push(e.request_id.clone());
        self.sku.push(e.sku.clone());
        self.user_id.push(e.user.clone());
        self.units.push(e.units as i64);
        self.status.push(e.kind.as_str());
        self.parts.push(encode_parts(&e.parts));
        self.generation.push(e.generation as i64);
        self.at_ms.push(e.at_ms as i64);
        self.stream.push(e.stream.clone());
        self.entry_id.push(e.entry_id.clone());
        self.deliveries.push(e.deliveries as i64);
    }
}

/// Why `e` cannot be written (a figure beyond `bigint`), if so.
fn unwritable(e: &OrderEvent) -> Option<String> {
    let figures = [
        ("units", e.units),
        ("generation", e.generation),
        ("at_ms", e.at_ms),
        ("deliveries", e.deliveries),
    ];
    figures
        .iter()
        .find(|(_, v)| i64::try_from(*v).is_err())
        .map(|(name, v)| format!("{name} {v} does not fit a PostgreSQL bigint"))
}

/// Splits events (by index) into rounds holding at most one event per request id, in order.
fn rounds(events: &[&OrderEvent]) -> Vec<Vec<usize>> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let n = seen.entry(e.request_id.as_str()).or_insert(0);
        if rounds.len() <= *n {
            rounds.push(Vec::new());
        }
        rounds[*n].push(i);
        *n += 1;
    }
    rounds
}

/// A one-line reason for a PostgreSQL failure (the server's SQLSTATE and message when it
/// answered one).
fn reason(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} ({}): {}", db.severity(), db.code().code(), db.message());
            if let Some(detail) = db.detail() {
                s.push_str(" — ");
                s.push_str(detail);
            }
            s
        }
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

/// Whether `e` means the connection is gone (rather than a statement refused on a live one).
fn broke(conn: &Conn, e: &tokio_postgres::Error) -> bool {
    e.is_closed()
        || conn.client.is_closed()
        || std::error::Error::source(e).is_some_and(|c| c.is::<std::io::Error>())
}

fn pg_error(e: &tokio_postgres::Error) -> Error {
    Error::Postgres(reason(e))
}

async fn open(config: &Config) -> Result<Conn> {
    let (client, connection) = config.connect(NoTls).await.map_err(|e| pg_error(&e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %reason(&e), "postgres connection ended");
        }
    });
    Ok(Conn {
        client,
        upsert: None,
    })
}

impl Conn {
    async fn upsert(&mut self) -> std::result::Result<Statement, tokio_postgres::Error> {
        if let Some(s) = &self.upsert {
            return Ok(s.clone());
        }
        let s = self.client.prepare(&upsert_sql()).await?;
        self.upsert = Some(s.clone());
        Ok(s)
    }

    /// Writes `events` atomically (rounds of distinct request ids, in one transaction when
    /// there are several); the number of rows inserted or changed.
    async fn write(
        &mut self,
        events: &[&OrderEvent],
    ) -> std::result::Result<u64, tokio_postgres::Error> {
        let stmt = self.upsert().await?;
        let rounds = rounds(events);
        let columns: Vec<Columns> = rounds
            .iter()
            .map(|round| {
                let mut c = Columns::default();
                for &i in round {
                    c.push(events[i]);
                }
                c
            })
            .collect();
        if let [c] = columns.as_slice() {
            return self.client.execute(&stmt, &c.params()).await;
        }
        let tx = self.client.transaction().await?;
        let mut written = 0;
        for c in &columns {
            written += tx.execute(&stmt, &c.params()).await?;
        }
        tx.commit().await?;
        Ok(written)
    }
}

impl Columns {
    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 11] {
        [
            &self.request_id,
            &self.sku,
            &self.user_id,
            &self.units,
            &self.status,
            &self.parts,
            &self.generation,
            &self.at_ms,
            &self.stream,
            &self.entry_id,
            &self.deliveries,
        ]
    }
}

impl PostgresOrders {
    /// Connects to `url` (`postgres://user@host:port/db`, or `host=... user=...`; no TLS: use
    /// it on a trusted network or through a local proxy). Without a `connect_timeout` in
    /// `url`, connecting gives up after [`CONNECT_TIMEOUT`].
    ///
    /// # Errors
    /// [`Error::Config`] when `url` does not parse; [`Error::Postgres`] when the connection
    /// cannot be opened.
    pub async fn connect(url: &str) -> Result<Self> {
        let mut config: Config = url
            .parse()
            .map_err(|e| Error::Config(format!("postgres url: {}", reason(&e))))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let conn = open(&config).await?;
        Ok(Self {
            config,
            conn: Mutex::new(Some(conn)),
        })
    }

    /// The open connection, opened again when it broke.
    async fn ready<'a>(&self, slot: &'a mut Option<Conn>) -> Result<&'a mut Conn> {
        if slot.as_ref().is_none_or(|c| c.client.is_closed()) {
            *slot = Some(open(&self.config).await?);
        }
        Ok(slot.as_mut().expect("just opened"))
    }

    /// Creates the table [`TABLE`] if absent (safe to call from consumers starting together).
    ///
    /// # Errors
    /// [`Error::Postgres`].
    pub async fn migrate(&self) -> Result<()> {
        let mut slot = self.conn.lock().await;
        let conn = self.ready(&mut slot).await?;
        conn.client
            .batch_execute(SCHEMA)
            .await
            .map_err(|e| pg_error(&e))
    }

    /// Writes `events` all or nothing, in one statement (or one transaction when the batch
    /// holds several events of a request): the number of rows inserted or changed, 0 for a
    /// batch already written. [`Handler::handle`] is this, with a fallback to one event at a
    /// time when the batch fails.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (field `event`) when a figure does not fit a `bigint`;
    /// [`Error::Postgres`] when the statement fails (nothing was written).
    pub async fn apply(&self, events: &[OrderEvent]) -> Result<u64> {
        if let Some(why) = events.iter().find_map(unwritable) {
            return Err(Error::invalid("event", why));
        }
        self.write(&events.iter().collect::<Vec<_>>()).await
    }

    /// [`apply`](Self::apply) of events known to be writable.
    async fn write(&self, events: &[&OrderEvent]) -> Result<u64> {
        if events.is_empty() {
            return Ok(0);
        }
        let mut slot = self.conn.lock().await;
        let mut retried = false;
        loop {
            let conn = self.ready(&mut slot).await?;
            let e = match conn.write(events).await {
                Ok(n) => return Ok(n),
                Err(e) => e,
            };
            if !broke(conn, &e) {
                return Err(pg_error(&e));
            }
            *slot = None;
            if retried {
                return Err(pg_error(&e));
            }
            tracing::warn!(error = %reason(&e), "postgres connection broke; writing the batch again on a new one");
            retried = true;
        }
    }

    /// Rows per status and units sold, of `sku` or of every SKU.
    ///
    /// # Errors
    /// [`Error::Postgres`].
    pub async fn summary(&self, sku: Option<&str>) -> Result<OrdersSummary> {
        let mut slot = self.conn.lock().await;
        let conn = self.ready(&mut slot).await?;
        let rows = conn
            .client
            .query(
                &format!(
                    "SELECT status, count(*)::int8, coalesce(sum(units), 0)::int8 FROM {TABLE} \
                     WHERE $1::text IS NULL OR sku = $1 GROUP BY status"
                ),
                &[&sku],
            )
            .await
            .map_err(|e| pg_error(&e))?;
        let mut s = OrdersSummary::default();
        for row in rows {
            let status: &str = row.get(0);
            let count = row.get::<_, i64>(1) as u64;
            let units = row.get::<_, i64>(2) as u64;
            s.rows += count;
            match status {
                "sold" => s.sold = count,
                "reserved" => s.reserved = count,
                "confirmed" => s.confirmed = count,
                "cancelled" => s.cancelled = count,
                "expired" => s.expired = count,
                other => {
                    return Err(Error::Postgres(format!(
                        "{TABLE} holds a row with status {other:?}"
                    )));
                }
            }
            match status {
                "sold" | "confirmed" => s.sold_units += units,
                "reserved" => s.reserved_units += units,
                _ => {}
            }
        }
        Ok(s)
    }

    /// Handles a batch: [`apply`](Self::apply) first; when it fails with the connection still
    /// up, each event on its own.
    async fn handle_batch(&self, events: &[OrderEvent]) -> Vec<std::result::Result<(), String>> {
        let mut results: Vec<Option<std::result::Result<(), String>>> =
            events.iter().map(|e| unwritable(e).map(Err)).collect();
        let writable: Vec<&OrderEvent> = events
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_none())
            .map(|(e, _)| e)
            .collect();
        match self.write(&writable).await {
            Ok(_) => {
                for r in results.iter_mut().filter(|r| r.is_none()) {
                    *r = Some(Ok(()));
                }
            }
            Err(batch_error) => {
                let broken = {
                    let slot = self.conn.lock().await;
                    slot.as_ref().is_none_or(|c| c.client.is_closed())
                };
                for (e, r) in events.iter().zip(results.iter_mut()) {
                    if r.is_some() {
                        continue;
                    }
                    *r = Some(if broken {
                        Err(batch_error.to_string())
                    } else {
                        self.write(&[e])
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    });
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every event answered"))
            .collect()
    }
}

impl Handler for PostgresOrders {
    fn handle(
        &self,
        events: &[OrderEvent],
    ) -> impl Future<Output = Vec<std::result::Result<(), String>>> + Send {
        self.handle_batch(events)
    }
}
