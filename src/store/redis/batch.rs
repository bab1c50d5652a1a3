//! Request coalescing (batching of requests, not to be confused with the engine's sharing of
//! reads): concurrent sales bound for one home segment share one script call.
//!
//! A Lua call costs far more inside Redis than the work it does (script dispatch, argument
//! conversion, reading the segment and reclaiming expired reservations), and every call is one
//! more command for the client to encode, send and match. When many buyers hit the same
//! segment at once, their requests are queued in that segment's *lane* and sent as one
//! `sell.lua` call — the very script a lone request runs as a batch of one — which decides
//! each in queue order and answers each one separately. Only requests without credits and
//! without a fence token are coalesced: a request carrying transfers to credit, or a lock
//! holder's fenced request, goes alone.
//!
//! Batching is natural (group commit): a lane sends at once when it has nothing in flight, and
//! whatever arrives while a call is out goes in the next call, up to `max_batch` requests. A
//! lane adds a parallel call (up to `max_in_flight`) only once max_batch/8 (at least 2)
//! requests wait. An idle lane therefore adds no latency; a busy lane batches by itself.
//! An optional `window` makes the sender wait (up to that long, or until `max_batch` requests
//! are queued) before sending, to build bigger batches at light load.
//!
//! Semantics do not change: each request keeps its own record (request id), validation and
//! reply; a re-sent call (fred re-sends in-flight commands after a reconnect) replays every
//! request that applied. A caller that stops waiting cannot withdraw a queued request — like a
//! written command, its outcome is then unknown and its request id settles it.

use super::Conn;
use super::lua::sell::{Sell, SellHead, SellItem};
use crate::error::{Error, Result};
use crate::ids::Sku;
use crate::store::{SegAddr, SellArgs, SellReply};
use dashmap::DashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Tuning of request coalescing: concurrent `lua` sales bound for one home segment go to Redis
/// as one `sell.lua` call, each request keeping its own record, checks and reply.
///
/// A segment's queue sends at once when it has nothing in flight; whatever arrives while a
/// call is out goes in the next call (group commit), so an idle segment adds no latency.
///
/// ```
/// use shardstock::Coalescing;
/// let c = Coalescing::default().max_batch(128).max_in_flight(4);
/// assert!(c.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Coalescing {
    /// Most requests in one script call (1..=1000).
    pub max_batch: usize,
    /// How long a lane may wait for more requests before sending (zero = send at once; the
    /// batch is whatever queued while earlier calls were in flight). Below 1 ms the wait yields
    /// to the scheduler instead of sleeping (Tokio timers tick in milliseconds).
    pub window: Duration,
    /// Script calls a lane may have in flight at once (≥ 1; default 3). With fewer, one hot
    /// segment's calls leave Redis and the client idle in turn at moderate load; with more,
    /// a busy lane splits its batches into more calls. Measured in docs/benchmarks.md ("Calls
    /// in flight per lane").
    pub max_in_flight: usize,
}

impl Default for Coalescing {
    fn default() -> Self {
        Self {
            max_batch: 64,
            window: Duration::ZERO,
            max_in_flight: 3,
        }
    }
}

impl Coalescing {
    /// Sets [`max_batch`](Self::max_batch).
    #[must_use]
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n;
        self
    }

    /// Sets [`window`](Self::window).
    #[must_use]
    pub fn window(mut self, d: Duration) -> Self {
        self.window = d;
        self
    }

    /// Sets [`max_in_flight`](Self::max_in_flight).
    #[must_use]
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }

    /// Checks the bounds.
    ///
    /// # Errors
    /// [`Error::Config`] naming the bad field.
    pub fn validate(&self) -> Result<()> {
        if !(1..=1000).contains(&self.max_batch) {
            return Err(Error::Config("coalesce max_batch must be 1..=1000".into()));
        }
        if self.max_in_flight == 0 || self.max_in_flight > 64 {
            return Err(Error::Config(
                "coalesce max_in_flight must be 1..=64".into(),
            ));
        }
        if self.window > Duration::from_millis(100) {
            return Err(Error::Config(
                "coalesce window must be at most 100 ms".into(),
            ));
        }
        Ok(())
    }
}

/// Request coalescing as configured, with what it did so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CoalesceStats {
    /// The options in force.
    pub options: Coalescing,
    /// Coalesced script calls sent.
    pub calls: u64,
    /// Requests they carried.
    pub requests: u64,
}

/// One queued request and where its reply goes.
struct Item {
    call: SellItem,
    tx: oneshot::Sender<Result<SellReply>>,
}

#[derive(Default)]
struct LaneState {
    queue: Vec<Item>,
    in_flight: usize,
}

/// The queue of one (segment, generation).
struct Lane {
    key: LaneKey,
    /// Its calls' keys and head arguments, made once.
    head: SellHead,
    state: Mutex<LaneState>,
}

impl Lane {
    fn lock(&self) -> std::sync::MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Idle lanes kept for reuse before idle ones are dropped.
const MAX_IDLE_LANES: usize = 4096;

/// The segment (SKU, index, placement suffix: its key in this store) and generation. Made of
/// the ids themselves, not of the formatted key: finding a request's lane allocates nothing
/// (the SKU id is shared, not copied).
type LaneKey = (Sku, u32, Option<u16>, u64);

/// The lanes of one store.
pub(super) struct Batcher {
    opts: Coalescing,
    /// Hashed with foldhash: every request hashes its lane key.
    lanes: DashMap<LaneKey, Arc<Lane>, foldhash::fast::RandomState>,
    calls: AtomicU64,
    requests: AtomicU64,
}

/// A sender slot of a lane. A normal exit gives the slot back in the same critical section
/// that finds the queue empty (and sets `done`); if the sending task ends any other way (a
/// panic, a runtime shutdown) the drop gives it back, and when no sender is left the queued
/// callers are answered with an error instead of waiting forever.
struct Sender {
    lane: Arc<Lane>,
    done: bool,
}

impl Drop for Sender {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = self.lane.lock();
        st.in_flight -= 1;
        if st.in_flight == 0 {
            for item in st.queue.drain(..) {
                let _ = item.tx.send(Err(Error::Protocol(
                    "coalesced sale: sender stopped".into(),
                )));
            }
        }
    }
}

impl Batcher {
    pub(super) fn new(opts: Coalescing) -> Self {
        Self {
            opts,
            lanes: DashMap::default(),
            calls: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        }
    }

    pub(super) fn stats(&self) -> CoalesceStats {
        CoalesceStats {
            options: self.opts,
            calls: self.calls.load(Relaxed),
            requests: self.requests.load(Relaxed),
        }
    }

    /// Queues one request (no credits, no fence: the caller checked) for `sell.lua` and waits
    /// for its reply.
    pub(super) async fn submit(
        self: &Arc<Self>,
        conn: &Conn,
        seg: SegAddr<'_>,
        req: SellArgs<'_>,
    ) -> Result<SellReply> {
        let key = (seg.sku.clone(), seg.index, seg.suffix, seg.generation);
        // The lane exists but for the first request of a segment: a shared lock finds it.
        let found = self.lanes.get(&key).map(|l| Arc::clone(&l));
        let lane = found.unwrap_or_else(|| {
            Arc::clone(&self.lanes.entry(key.clone()).or_insert_with(|| {
                Arc::new(Lane {
                    key,
                    head: SellHead::new(&conn.at(seg)),
                    state: Mutex::default(),
                })
            }))
        });
        let (tx, rx) = oneshot::channel();
        let item = Item {
            call: SellItem::new(&req),
            tx,
        };
        let start = {
            let mut st = lane.lock();
            st.queue.push(item);
            // A lane with nothing in flight sends at once. Another call in parallel only pays
            // when enough has queued behind the one in flight: on many quiet lanes, parallel
            // calls would split the queue into tiny batches (measured: 16 segments at 64
            // buyers, 1.6 requests per call and no gain); on one hot lane they keep Redis busy
            // while the client handles a reply.
            let extra_at = (self.opts.max_batch / 8).max(2);
            if st.in_flight == 0
                || (st.in_flight < self.opts.max_in_flight && st.queue.len() >= extra_at)
            {
                st.in_flight += 1;
                true
            } else {
                false
            }
        };
        if start {
            let sender = Sender { lane, done: false };
            tokio::spawn(Self::send_loop(self.clone(), conn.clone(), sender));
        }
        rx.await
            .map_err(|_| Error::Protocol("coalesced sale: sender dropped".into()))?
    }

    /// Sends what the lane has queued, call after call, until the queue is empty.
    async fn send_loop(self: Arc<Self>, conn: Conn, mut sender: Sender) {
        let lane = sender.lane.clone();
        loop {
            self.wait_window(&lane).await;
            let (items, txs): (Vec<SellItem>, Vec<_>) = {
                let mut st = lane.lock();
                if st.queue.is_empty() {
                    st.in_flight -= 1;
                    sender.done = true;
                    if st.in_flight == 0 && self.lanes.len() > MAX_IDLE_LANES {
                        // Many lanes (old generations, many SKUs): forget this idle one. A
                        // caller that already holds the Arc still works through it (it starts
                        // its own sender); a new caller makes a fresh lane. Below the bound,
                        // idle lanes stay: re-creating one per call cost ~8 % on 64 quiet lanes.
                        self.lanes
                            .remove_if(&lane.key, |_, l| Arc::ptr_eq(l, &lane));
                    }
                    return;
                }
                let n = st.queue.len().min(self.opts.max_batch);
                st.queue.drain(..n).map(|i| (i.call, i.tx)).unzip()
            };
            crate::metrics::coalesced_batch(items.len());
            self.calls.fetch_add(1, Relaxed);
            self.requests.fetch_add(items.len() as u64, Relaxed);
            let call = Sell {
                head: &lane.head,
                fence: 0,
                credits: &[],
                items,
            };
            match conn.run(call).await {
                Ok(replies) => {
                    for (tx, reply) in txs.into_iter().zip(replies) {
                        let _ = tx.send(reply);
                    }
                }
                Err(e) => {
                    // The whole call failed (connection, timeout), or in durability mode too
                    // few replicas acknowledged it (one WAIT per batch): every request in it
                    // has an unknown outcome, exactly like a lone call that failed, and gets
                    // the error.
                    for tx in txs {
                        let err = match &e {
                            Error::Redis(r) => Error::Redis(r.clone()),
                            Error::Permission(p) => Error::Permission(p.clone()),
                            // Refused before running: nothing written for any of them.
                            Error::NoReplicas(d) => Error::NoReplicas(d.clone()),
                            Error::NotDurable { acked, wanted } => Error::NotDurable {
                                acked: *acked,
                                wanted: *wanted,
                            },
                            other => Error::Protocol(other.to_string()),
                        };
                        let _ = tx.send(Err(err));
                    }
                }
            }
        }
    }

    async fn wait_window(&self, lane: &Lane) {
        let window = self.opts.window;
        if window.is_zero() {
            return;
        }
        let deadline = Instant::now() + window;
        let full = || lane.lock().queue.len() >= self.opts.max_batch;
        if window < Duration::from_millis(1) {
            while !full() && Instant::now() < deadline {
                tokio::task::yield_now().await;
            }
        } else {
            while !full() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_micros(250).min(deadline - Instant::now())).await;
            }
        }
    }
}
