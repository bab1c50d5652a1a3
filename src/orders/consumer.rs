//! The consumer: reads segment streams through a consumer group, hands events to a
//! [`Handler`], acknowledges, claims what dead consumers left, dead-letters poison events and
//! trims what every group has acknowledged.
//!
//! Why each step is safe:
//! - **Ack after success.** An event is acknowledged only after its handler answered `Ok`;
//!   a consumer that dies in between leaves it pending, and another consumer claims it once it
//!   has been idle for [`OrdersOptions::min_idle`] (`XAUTOCLAIM`). So an event is handled at
//!   least once, and the handler's idempotency by request id makes the effect exactly once.
//! - **Deliveries are counted by Redis** (the pending entry's delivery count), not by the
//!   consumer, so they survive consumer restarts. An event delivered
//!   [`OrdersOptions::max_deliveries`] times without an ack moves to the segment's dead-letter
//!   stream with the last reason a handler gave, atomically with its ack (`outbox_dead.lua`).
//! - **Trimming** (`outbox_trim.lua`) never drops an event some group has not acknowledged.
//! - **Discovery.** Streams are found from the set of SKUs loaded with the outbox and each
//!   SKU's metadata (segment count ever used with the outbox, placement); groups are created
//!   on first sight from the stream's beginning, so events appended before the first consumer
//!   started are not missed.

use super::{Handler, OrderEvent};
use crate::error::{Error, Result};
use crate::ids::Sku;
use crate::store::redis::RedisStore;
use crate::store::redis::outbox::{Entry, OutboxStream};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Options of an [`Orders`] consumer.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OrdersOptions {
    /// Consumer group name (every instance of one order service shares it; default
    /// `orders`).
    pub group: String,
    /// This consumer's name within the group (unique per process; default `<host>-<pid>`,
    /// the host name from `HOSTNAME` or `/etc/hostname`, so containers that all run as pid 1
    /// still differ).
    pub consumer: String,
    /// SKUs served; empty (default) = every SKU loaded with the outbox on.
    pub skus: Vec<Sku>,
    /// Most entries read per stream per call (default 256).
    pub batch: usize,
    /// An entry pending this long (its consumer died, or its handler failed) is claimed and
    /// delivered again (default 30 s). Longer than a handler ever takes: a slow handler's
    /// entry claimed by another consumer is handled twice (harmless, but wasted).
    pub min_idle: Duration,
    /// Deliveries after which a failing event moves to the dead-letter stream (default 5).
    pub max_deliveries: u64,
    /// How often streams and SKUs are discovered again (default 5 s).
    pub discover_every: Duration,
    /// How often acknowledged events are trimmed (default 1 s).
    pub trim_every: Duration,
    /// Longest sleep when every stream is empty (default 100 ms; the sleep starts at 1 ms
    /// and doubles while nothing comes).
    pub idle_sleep: Duration,
}

impl Default for OrdersOptions {
    fn default() -> Self {
        Self {
            group: "orders".into(),
            consumer: default_consumer(),
            skus: Vec::new(),
            batch: 256,
            min_idle: Duration::from_secs(30),
            max_deliveries: 5,
            discover_every: Duration::from_secs(5),
            trim_every: Duration::from_secs(1),
            idle_sleep: Duration::from_millis(100),
        }
    }
}

/// `<host>-<pid>`, reduced to the characters a consumer name may hold.
fn default_consumer() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .unwrap_or_else(|| "consumer".into());
    let host: String = host
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "_.:-".contains(*c))
        .take(100)
        .collect();
    let host = if host.is_empty() {
        "consumer".into()
    } else {
        host
    };
    format!("{host}-{}", std::process::id())
}

impl OrdersOptions {
    /// Group `group`, consumer `consumer`, other options default.
    pub fn new(group: impl Into<String>, consumer: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            consumer: consumer.into(),
            ..Self::default()
        }
    }

    /// See [`OrdersOptions::skus`](#structfield.skus).
    pub fn skus(mut self, skus: Vec<Sku>) -> Self {
        self.skus = skus;
        self
    }

    /// See [`OrdersOptions::batch`](#structfield.batch).
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n;
        self
    }

    /// See [`OrdersOptions::min_idle`](#structfield.min_idle).
    pub fn min_idle(mut self, d: Duration) -> Self {
        self.min_idle = d;
        self
    }

    /// See [`OrdersOptions::max_deliveries`](#structfield.max_deliveries).
    pub fn max_deliveries(mut self, n: u64) -> Self {
        self.max_deliveries = n;
        self
    }

    /// See [`OrdersOptions::discover_every`](#structfield.discover_every).
    pub fn discover_every(mut self, d: Duration) -> Self {
        self.discover_every = d;
        self
    }

    /// See [`OrdersOptions::trim_every`](#structfield.trim_every).
    pub fn trim_every(mut self, d: Duration) -> Self {
        self.trim_every = d;
        self
    }

    /// See [`OrdersOptions::idle_sleep`](#structfield.idle_sleep).
    pub fn idle_sleep(mut self, d: Duration) -> Self {
        self.idle_sleep = d;
        self
    }

    /// Checks every option.
    ///
    /// # Errors
    /// [`Error::Config`] naming the option.
    pub fn validate(&self) -> Result<()> {
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 128
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
        };
        let bad = |cond: bool, what: &str| {
            if cond {
                Err(Error::Config(format!("orders: {what}")))
            } else {
                Ok(())
            }
        };
        bad(
            !name_ok(&self.group),
            "group must be 1..=128 of [A-Za-z0-9_.:-]",
        )?;
        bad(
            !name_ok(&self.consumer),
            "consumer must be 1..=128 of [A-Za-z0-9_.:-]",
        )?;
        bad(
            self.batch == 0 || self.batch > 10_000,
            "batch must be 1..=10000",
        )?;
        bad(
            self.min_idle < Duration::from_millis(10)
                || self.min_idle > Duration::from_secs(86_400),
            "min_idle must be 10 ms ..= 1 day",
        )?;
        bad(
            self.max_deliveries == 0 || self.max_deliveries > 1000,
            "max_deliveries must be 1..=1000",
        )?;
        for (d, what) in [
            (self.discover_every, "discover_every"),
            (self.trim_every, "trim_every"),
            (self.idle_sleep, "idle_sleep"),
        ] {
            bad(
                d < Duration::from_millis(1) || d > Duration::from_secs(3600),
                &format!("{what} must be 1 ms ..= 1 h"),
            )?;
        }
        Ok(())
    }
}

/// What one [`Orders::poll`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Polled {
    /// Events handled and acknowledged.
    pub handled: u64,
    /// Events whose handler failed (left pending for a later delivery).
    pub failed: u64,
    /// Events moved to the dead letters.
    pub dead: u64,
    /// Deliveries after the first (claimed from a dead consumer or after a failure).
    pub redelivered: u64,
}

impl Polled {
    fn add(&mut self, o: Polled) {
        self.handled += o.handled;
        self.failed += o.failed;
        self.dead += o.dead;
        self.redelivered += o.redelivered;
    }

    /// Whether anything was delivered.
    pub fn is_empty(&self) -> bool {
        self.handled + self.failed + self.dead == 0
    }
}

/// A group's standing over every stream it reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lag {
    /// Streams read.
    pub streams: u64,
    /// Events delivered, not yet acknowledged.
    pub pending: u64,
    /// Events not yet delivered to the group.
    pub undelivered: u64,
    /// Age of the oldest pending event (Redis clock of its append to this process's clock).
    pub oldest_pending: Option<Duration>,
    /// Events ever appended to the streams.
    pub appended: u64,
    /// Events still in the streams (pending, undelivered, or not trimmed yet).
    pub length: u64,
}

impl Lag {
    /// Nothing pending and nothing undelivered.
    pub fn is_idle(&self) -> bool {
        self.pending == 0 && self.undelivered == 0
    }
}

/// Running totals of one consumer.
#[derive(Debug, Default)]
struct Totals {
    handled: AtomicU64,
    failed: AtomicU64,
    dead: AtomicU64,
    redelivered: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    streams: Vec<OutboxStream>,
    /// Streams whose group exists.
    grouped: std::collections::HashSet<String>,
    /// XAUTOCLAIM cursor per stream.
    cursors: HashMap<String, String>,
    discovered: Option<Instant>,
    claimed: Option<Instant>,
    trimmed: Option<Instant>,
}

/// A running outbox consumer (see the [module docs](self)). Many may run, in one process or
/// many, with one group: each event goes to one of them at a time.
pub struct Orders<H> {
    store: RedisStore,
    handler: Arc<H>,
    opts: OrdersOptions,
    state: tokio::sync::Mutex<State>,
    totals: Totals,
}

impl<H> std::fmt::Debug for Orders<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orders")
            .field("opts", &self.opts)
            .field("totals", &self.totals)
            .finish_non_exhaustive()
    }
}

impl<H: Handler> Orders<H> {
    /// A consumer of `store`'s outbox streams handing events to `handler`.
    ///
    /// # Errors
    /// [`Error::Config`] for bad options.
    pub fn new(store: RedisStore, handler: H, opts: OrdersOptions) -> Result<Self> {
        opts.validate()?;
        Ok(Self {
            store,
            handler: Arc::new(handler),
            opts,
            state: tokio::sync::Mutex::new(State::default()),
            totals: Totals::default(),
        })
    }

    /// The options.
    pub fn options(&self) -> &OrdersOptions {
        &self.opts
    }

    /// The handler.
    pub fn handler(&self) -> &H {
        &self.handler
    }

    /// Totals since this consumer started.
    pub fn totals(&self) -> Polled {
        let t = &self.totals;
        Polled {
            handled: t.handled.load(Ordering::Relaxed),
            failed: t.failed.load(Ordering::Relaxed),
            dead: t.dead.load(Ordering::Relaxed),
            redelivered: t.redelivered.load(Ordering::Relaxed),
        }
    }

    /// Finds the streams (and creates the group on new ones) now; the number of streams.
    ///
    /// # Errors
    /// Store errors.
    pub async fn discover(&self) -> Result<usize> {
        let mut st = self.state.lock().await;
        self.discover_locked(&mut st).await?;
        Ok(st.streams.len())
    }

    async fn discover_locked(&self, st: &mut State) -> Result<()> {
        let mut skus = self.store.outbox_skus().await?;
        if !self.opts.skus.is_empty() {
            skus.retain(|s| self.opts.skus.contains(s));
        }
        skus.sort();
        let mut streams = Vec::new();
        for sku in &skus {
            streams.extend(self.store.outbox_streams(sku).await?);
        }
        for s in &streams {
            if !st.grouped.contains(&s.key) {
                self.store.outbox_group(s, &self.opts.group).await?;
                st.grouped.insert(s.key.clone());
            }
        }
        st.streams = streams;
        st.discovered = Some(Instant::now());
        Ok(())
    }

    /// One round: discovers streams when due, reads what is new on every stream, claims
    /// what has been pending longer than [`OrdersOptions::min_idle`] (when due), trims (when
    /// due), and hands everything to the handler.
    ///
    /// # Errors
    /// Store errors (the round stops; what was acknowledged stays acknowledged, the rest is
    /// delivered again).
    pub async fn poll(&self) -> Result<Polled> {
        let r = self.round().await;
        if let Err(e) = &r
            && e.to_string().contains("NOGROUP")
        {
            // A stream or its group vanished (Redis restarted empty, a key deleted): find the
            // streams and create the groups again on the next round.
            let mut st = self.state.lock().await;
            st.grouped.clear();
            st.discovered = None;
        }
        r
    }

    async fn round(&self) -> Result<Polled> {
        let mut st = self.state.lock().await;
        let due = |at: Option<Instant>, every: Duration| at.is_none_or(|t| t.elapsed() >= every);
        if due(st.discovered, self.opts.discover_every) {
            self.discover_locked(&mut st).await?;
        }
        let mut done = Polled::default();
        let reads = st.streams.iter().map(|s| self.read_new(s));
        for r in futures::future::join_all(reads).await {
            done.add(r?);
        }
        let claim_every = (self.opts.min_idle / 2).max(Duration::from_millis(10));
        if due(st.claimed, claim_every) {
            st.claimed = Some(Instant::now());
            let streams = st.streams.clone();
            for s in &streams {
                let cursor = st
                    .cursors
                    .get(&s.key)
                    .cloned()
                    .unwrap_or_else(|| "0-0".into());
                let (next, got) = self.claim_idle(s, &cursor).await?;
                done.add(got);
                st.cursors.insert(s.key.clone(), next);
            }
        }
        if due(st.trimmed, self.opts.trim_every) {
            st.trimmed = Some(Instant::now());
            for s in &st.streams {
                self.store.outbox_trim(s).await?;
            }
        }
        crate::metrics::orders_polled(done.handled, done.failed, done.redelivered, done.dead);
        Ok(done)
    }

    /// Polls until `stop` resolves; store errors are logged and retried after a pause (the
    /// work is idempotent). Sleeps up to [`OrdersOptions::idle_sleep`] while nothing comes,
    /// and refreshes the lag gauges once per discovery interval.
    ///
    /// # Errors
    /// None so far: every error is retried; the signature leaves room for fatal ones.
    pub async fn run(&self, stop: impl std::future::Future<Output = ()>) -> Result<()> {
        tokio::pin!(stop);
        let mut sleep = Duration::from_millis(1);
        let mut lag_at: Option<Instant> = None;
        loop {
            let round = async {
                let polled = self.poll().await?;
                if lag_at.is_none_or(|t| t.elapsed() >= self.opts.discover_every) {
                    lag_at = Some(Instant::now());
                    self.lag().await?;
                }
                Ok::<_, Error>(polled)
            };
            let wait = tokio::select! {
                _ = &mut stop => return Ok(()),
                r = round => match r {
                    Ok(p) if !p.is_empty() => Duration::ZERO,
                    Ok(_) => {
                        sleep = (sleep * 2).min(self.opts.idle_sleep);
                        sleep
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "orders: poll failed; retrying");
                        crate::metrics::error(&e);
                        self.opts.idle_sleep.max(Duration::from_millis(100))
                    }
                },
            };
            if wait.is_zero() {
                sleep = Duration::from_millis(1);
                continue;
            }
            tokio::select! {
                _ = &mut stop => return Ok(()),
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Polls until nothing is pending or undelivered in any stream (and, after `settle`
    /// without news, nothing new came), or `limit` passes. For tests and `shardstock orders
    /// --until-idle`; a service calls [`run`](Self::run).
    ///
    /// # Errors
    /// Store errors; [`Error::NotReady`] when `limit` passes first.
    pub async fn drain(&self, limit: Duration) -> Result<Polled> {
        let start = Instant::now();
        let mut total = Polled::default();
        loop {
            let p = self.poll().await?;
            total.add(p);
            if p.is_empty() {
                self.discover().await?;
                if self.lag().await?.is_idle() {
                    return Ok(total);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if start.elapsed() > limit {
                return Err(Error::NotReady(format!(
                    "orders: still events pending after {limit:?}"
                )));
            }
        }
    }

    /// The group's standing over every stream (also exported as gauges).
    ///
    /// # Errors
    /// Store errors.
    pub async fn lag(&self) -> Result<Lag> {
        let streams = self.state.lock().await.streams.clone();
        let mut lag = Lag {
            streams: streams.len() as u64,
            ..Lag::default()
        };
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        for s in &streams {
            let l = self.store.outbox_lag(s, &self.opts.group).await?;
            lag.pending += l.pending;
            lag.undelivered += l.undelivered.unwrap_or(0);
            lag.appended += l.appended;
            lag.length += l.length;
            if let Some(ms) = l
                .oldest_pending
                .as_deref()
                .and_then(|id| id.split_once('-'))
                .and_then(|(ms, _)| ms.parse::<u64>().ok())
            {
                let age = Duration::from_millis(now_ms.saturating_sub(ms));
                lag.oldest_pending = Some(lag.oldest_pending.map_or(age, |a| a.max(age)));
            }
        }
        crate::metrics::orders_lag(
            &self.opts.group,
            lag.appended,
            lag.pending,
            lag.undelivered,
            lag.oldest_pending,
        );
        Ok(lag)
    }

    /// New entries of one stream.
    async fn read_new(&self, s: &OutboxStream) -> Result<Polled> {
        let (group, me) = (&self.opts.group, &self.opts.consumer);
        let entries = self
            .store
            .outbox_read(s, group, me, self.opts.batch as u64)
            .await?;
        let delivered = entries.into_iter().map(|e| (e, 1)).collect();
        self.deliver(s, delivered).await
    }

    /// Entries idle past `min_idle` on one stream, from `cursor`.
    async fn claim_idle(&self, s: &OutboxStream, cursor: &str) -> Result<(String, Polled)> {
        let (group, me) = (&self.opts.group, &self.opts.consumer);
        let idle = self.opts.min_idle.as_millis() as u64;
        let (next, claimed) = self
            .store
            .outbox_claim(s, group, me, idle, cursor, self.opts.batch as u64)
            .await?;
        let mut done = Polled::default();
        let mut deliver = Vec::new();
        for (e, n) in claimed {
            if n > self.opts.max_deliveries {
                // Delivered max_deliveries times before, never acknowledged: the handler
                // failed each time or its consumers died. It is not handed out again.
                if self.store.outbox_dead(s, group, me, &e.0, n, n - 1).await? {
                    done.dead += 1;
                }
            } else {
                deliver.push((e, n));
            }
        }
        done.add(self.deliver(s, deliver).await?);
        Ok((next, done))
    }

    /// Hands `entries` (with their delivery counts) to the handler; acknowledges what it
    /// took, records why it refused the rest, and dead-letters what has failed its last
    /// delivery.
    async fn deliver(&self, s: &OutboxStream, entries: Vec<(Entry, u64)>) -> Result<Polled> {
        let mut done = Polled::default();
        if entries.is_empty() {
            return Ok(done);
        }
        let mut events = Vec::with_capacity(entries.len());
        // (entry id, deliveries, index into `events` or the parse error)
        let mut slots: Vec<(String, u64, std::result::Result<usize, String>)> = Vec::new();
        for ((id, fields), n) in entries {
            if n > 1 {
                done.redelivered += 1;
            }
            match OrderEvent::from_fields(&s.key, &id, &fields, n) {
                Ok(ev) => {
                    slots.push((id, n, Ok(events.len())));
                    events.push(ev);
                }
                Err(why) => slots.push((id, n, Err(why))),
            }
        }
        let mut results = if events.is_empty() {
            Vec::new()
        } else {
            self.handler.handle(&events).await
        };
        if results.len() != events.len() {
            let why = format!(
                "handler answered {} results for {} events",
                results.len(),
                events.len()
            );
            results = vec![Err(why); events.len()];
        }
        let mut acks = Vec::new();
        let mut redelivered_acks = Vec::new();
        for (id, n, slot) in slots {
            let outcome = match slot {
                Ok(i) => std::mem::replace(&mut results[i], Ok(())),
                Err(why) => Err(why),
            };
            match outcome {
                Ok(()) => {
                    if n > 1 {
                        redelivered_acks.push(id.clone());
                    }
                    acks.push(id);
                }
                Err(why) => {
                    done.failed += 1;
                    self.store.outbox_failed(s, &id, &why).await?;
                    if n >= self.opts.max_deliveries
                        && self
                            .store
                            .outbox_dead(s, &self.opts.group, &self.opts.consumer, &id, n, n)
                            .await?
                    {
                        done.dead += 1;
                    }
                }
            }
        }
        done.handled += acks.len() as u64;
        self.store
            .outbox_ack(s, &self.opts.group, &acks, &redelivered_acks)
            .await?;
        let t = &self.totals;
        t.handled.fetch_add(done.handled, Ordering::Relaxed);
        t.failed.fetch_add(done.failed, Ordering::Relaxed);
        t.dead.fetch_add(done.dead, Ordering::Relaxed);
        t.redelivered.fetch_add(done.redelivered, Ordering::Relaxed);
        Ok(done)
    }
}
