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
//! Batching is natural (group commit): whatever arrives while a lane's call is out goes in its
//! next call, up to `max_batch` requests. A lane with nothing in flight sends at once when the
//! store has no call out, or when it holds at least as many requests as the calls out carry on
//! average; otherwise it waits in line until calls come back (at most two rounds of the calls
//! out when it began to wait; see [`Gate`]): with many quiet lanes, sending the moment a lane
//! had one request made calls of ~2.5 requests at 16 segments and 64 buyers, each paying the
//! script's whole fixed part. A lane adds a parallel call (up to `max_in_flight`) only once
//! max_batch/8 (at least 2) requests wait and they are as full as the calls out. An idle store
//! therefore adds no latency; a busy one sends fewer, fuller calls.
//! An optional `window` makes the sender wait (up to that long, or until `max_batch` requests
//! are queued) before sending, to build bigger batches at light load.
//!
//! Semantics do not change: each request keeps its own record (request id), validation and
//! reply; a re-sent call (fred re-sends in-flight commands after a reconnect) replays every
//! request that applied. A caller that stops waiting cannot withdraw a queued request — like a
//! written command, its outcome is then unknown and its request id settles it.

use super::coalescing::{CoalesceStats, Coalescing};
use super::conn::Conn;
use super::lua::sell::{Sell, SellHead, SellItem};
use crate::error::{Error, Result};
use crate::ids::Sku;
use crate::store::{SegAddr, SellArgs, SellReply};
use dashmap::DashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// One queued request and where its reply goes.
struct Item {
    call: SellItem,
    tx: oneshot::Sender<Result<SellReply>>,
}

#[derive(Default)]
struct LaneState {
    queue: Vec<Item>,
    /// Senders working for this lane (each has at most one call out).
    in_flight: usize,
    /// Waiting in its server's line for a call to come back (see [`Gate`]).
    parked: bool,
    /// Its entry is in the line (at most one: a lane parked again while its entry waits
    /// keeps that entry).
    in_line: bool,
    /// When it parked last (the watch sends it [`PARKED_AT_MOST`] later whatever comes back).
    parked_at: Option<Instant>,
    /// While parked: the gate's count of calls back by which the lane goes whatever it
    /// holds (the calls that were out when it parked have come back by then).
    due: u64,
}

/// The queue of one (segment, generation).
struct Lane {
    key: LaneKey,
    /// Its calls' keys and head arguments, made once.
    head: SellHead,
    state: Mutex<LaneState>,
}

/// The coalesced calls a store has out, and the lanes waiting to send.
///
/// Every call pays the script's fixed part (and the server's wake-up, read and reply)
/// whatever it carries: with 16 segments and 64 buyers a lane holds ~4 requests at a time, and
/// lanes that sent the moment they had one request made calls of 2.5 on average, each paying
/// the whole fixed part. So a lane sends at once only when nothing is out, or when it holds at
/// least as many requests as the calls out carry on average (it is full enough); otherwise it
/// waits in line, and each call that comes back sends the lanes at the head of the line that
/// are full enough by then, or that have waited for [`ROUNDS`] rounds of the calls out when
/// they began to wait. An idle store adds no latency, a request waits at most two rounds of
/// calls, and a busy store sends fewer, fuller calls. The same rule holds a lane's further
/// calls in parallel (`max_in_flight`) back until they too are full enough.
///
/// One line per store, not per server: on a cluster a call to one master holds back a lane of
/// another master only as long as the rule above says, and every master gets calls as full as
/// a single server would (measured in docs/capacity.md).
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    /// Calls out, and calls about to go (a sender admitted, its batch not yet taken).
    calls: usize,
    /// Calls that came back so far.
    back: u64,
    /// The requests they carry (for the about-to-go ones: what their lane held).
    carried: usize,
    /// Lanes waiting for calls to come back, oldest first (a lane that sent meanwhile, by
    /// other means, is skipped when its turn comes).
    line: std::collections::VecDeque<Arc<Lane>>,
    /// A watch runs ([`Batcher::watch`]): it sends lanes parked for [`PARKED_AT_MOST`].
    watching: bool,
}

/// Rounds of the calls out a lane waits at most before it sends whatever it holds.
const ROUNDS: u64 = 2;

/// How long a lane waits in line at most, whatever comes back: two rounds of calls take ~0.5 ms
/// on loopback, so this bound acts when calls stop coming back — a master that stopped
/// answering holds its calls until the command timeout, and lanes of every other master
/// would wait in line behind them (the line is the store's).
const PARKED_AT_MOST: Duration = Duration::from_millis(2);

impl GateState {
    /// Whether a lane holding `queued` requests may send now: nothing is out, or it is at
    /// least as full as the calls out on average.
    fn admits(&self, queued: usize) -> bool {
        self.calls == 0 || queued * self.calls >= self.carried
    }

    fn reserve(&mut self, queued: usize) {
        self.calls += 1;
        self.carried += queued;
    }

    /// A call that carried `carried` came back (or one about to go did not go).
    fn release(&mut self, carried: usize) {
        self.calls -= 1;
        self.carried -= carried;
    }

    /// Puts `lane` (its state `st`) at the end of the line, due once the calls out now came
    /// back [`ROUNDS`] times over. True when no watch runs: the caller starts one.
    fn park(&mut self, lane: &Arc<Lane>, st: &mut LaneState) -> bool {
        st.parked = true;
        st.parked_at = Some(Instant::now());
        st.due = self.due();
        if !st.in_line {
            st.in_line = true;
            self.line.push_back(Arc::clone(lane));
        }
        !std::mem::replace(&mut self.watching, true)
    }

    /// The count of calls back by which a lane that waits from now goes whatever it holds.
    fn due(&self) -> u64 {
        self.back + self.calls as u64 * ROUNDS
    }
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
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
    /// The calls out and the lanes waiting.
    gate: Gate,
    calls: AtomicU64,
    requests: AtomicU64,
}

/// A sender slot of a lane. A normal exit gives the slot back in the same critical section
/// that finds the queue empty or parks the lane (and sets `done`); if the sending task ends
/// any other way (a panic, a runtime shutdown) the drop gives it back, and when no sender is
/// left the queued callers are answered with an error instead of waiting forever.
struct Sender {
    batcher: Arc<Batcher>,
    lane: Arc<Lane>,
    /// The requests counted at the gate for this sender's call (out or about to go).
    reserved: Option<usize>,
    done: bool,
}

impl Drop for Sender {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Lanes waiting in line are woken by calls coming back: with none left out, nothing
        // would wake them, so their callers are answered too.
        let stranded: Vec<Arc<Lane>> = {
            let mut g = self.batcher.gate.lock();
            if let Some(n) = self.reserved.take() {
                g.release(n);
            }
            if g.calls == 0 {
                g.watching = false;
                g.line.drain(..).collect()
            } else {
                Vec::new()
            }
        };
        {
            let mut st = self.lane.lock();
            st.in_flight -= 1;
            if st.in_flight == 0 && !st.parked {
                stop(&mut st);
            }
        }
        for lane in stranded {
            let mut st = lane.lock();
            st.in_line = false;
            if st.parked {
                st.parked = false;
                stop(&mut st);
            }
        }
    }
}

/// Answers every request queued in a lane left without a sender.
fn stop(st: &mut LaneState) {
    for item in st.queue.drain(..) {
        let _ = item.tx.send(Err(Error::Protocol(
            "coalesced sale: sender stopped".into(),
        )));
    }
}

impl Batcher {
    pub(super) fn new(opts: Coalescing) -> Self {
        Self {
            opts,
            lanes: DashMap::default(),
            gate: Gate::default(),
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

    /// Requests queued behind a lane's calls that justify one more call in parallel.
    fn extra_at(&self) -> usize {
        (self.opts.max_batch / 8).max(2)
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
        let (start, watch) = {
            let mut st = lane.lock();
            st.queue.push(item);
            let queued = st.queue.len();
            // A lane with nothing in flight sends at once when nothing is out, or when it is
            // as full as the calls out; else it waits in line for calls to come back (see
            // `Gate`). Another call in parallel on one lane only pays when enough has queued
            // behind the one in flight: on one hot lane it keeps Redis busy while the client
            // handles a reply.
            let extra = queued >= self.extra_at();
            let mut watch = false;
            let start = if st.in_flight == 0 && !st.parked {
                let mut g = self.gate.lock();
                if g.admits(queued) {
                    g.reserve(queued);
                    st.in_flight = 1;
                    Some(queued)
                } else {
                    watch = g.park(&lane, &mut st);
                    None
                }
            } else if extra && st.in_flight < self.opts.max_in_flight {
                // A further call in parallel, or a parked lane that filled up: it goes if it
                // is as full as the calls out (a parked lane leaves the line: its entry there
                // is skipped).
                let mut g = self.gate.lock();
                if g.admits(queued) {
                    g.reserve(queued);
                    st.parked = false;
                    st.in_flight += 1;
                    Some(queued)
                } else {
                    None
                }
            } else {
                None
            };
            (start, watch)
        };
        if let Some(queued) = start {
            self.spawn_sender(conn, lane, queued);
        }
        if watch {
            tokio::spawn(Self::watch(self.clone(), conn.clone()));
        }
        rx.await
            .map_err(|_| Error::Protocol("coalesced sale: sender dropped".into()))?
    }

    /// While lanes wait in line: every [`PARKED_AT_MOST`]/2, sends those parked for
    /// [`PARKED_AT_MOST`] whatever came back. Calls coming back wake the line, but a call
    /// stuck at a master that stopped answering would hold every quieter lane of the store
    /// (whatever master it sells at) until its command timeout.
    async fn watch(self: Arc<Self>, conn: Conn) {
        loop {
            tokio::time::sleep(PARKED_AT_MOST / 2).await;
            let waiting: Vec<Arc<Lane>> = {
                let mut g = self.gate.lock();
                if g.line.is_empty() {
                    g.watching = false;
                    return;
                }
                g.line.iter().cloned().collect()
            };
            for lane in waiting {
                let late = {
                    let st = lane.lock();
                    st.parked && st.parked_at.is_some_and(|t| t.elapsed() >= PARKED_AT_MOST)
                };
                if late {
                    self.kick(&conn, &lane);
                }
            }
        }
    }

    /// Sends `lane` now if it still waits in line (its entry there is skipped later, or
    /// serves when it parks again).
    fn kick(self: &Arc<Self>, conn: &Conn, lane: &Arc<Lane>) {
        let mut st = lane.lock();
        if !st.parked {
            return;
        }
        st.parked = false;
        let queued = st.queue.len();
        if queued == 0 {
            return;
        }
        self.gate.lock().reserve(queued);
        st.in_flight += 1;
        drop(st);
        self.spawn_sender(conn, Arc::clone(lane), queued);
    }

    /// Starts a sender for `lane`, whose call the gate has counted already (`queued`
    /// requests).
    fn spawn_sender(self: &Arc<Self>, conn: &Conn, lane: Arc<Lane>, queued: usize) {
        let sender = Sender {
            batcher: Arc::clone(self),
            lane,
            reserved: Some(queued),
            done: false,
        };
        tokio::spawn(Self::send_loop(self.clone(), conn.clone(), sender));
    }

    /// Sends the lanes waiting in line, oldest first, while the gate admits them or they are
    /// due.
    fn wake(self: &Arc<Self>, conn: &Conn) {
        let gate = &self.gate;
        loop {
            let Some(lane) = gate.lock().line.pop_front() else {
                return;
            };
            let mut st = lane.lock();
            st.in_line = false;
            if !st.parked {
                continue; // it sent meanwhile
            }
            if st.queue.is_empty() {
                st.parked = false;
                continue;
            }
            let queued = st.queue.len();
            let mut g = gate.lock();
            if !g.admits(queued) && g.back < st.due {
                st.in_line = true;
                g.line.push_front(Arc::clone(&lane));
                return;
            }
            g.reserve(queued);
            drop(g);
            st.parked = false;
            st.in_flight += 1;
            drop(st);
            self.spawn_sender(conn, lane, queued);
        }
    }

    /// Ends `sender` (the lane's state locked as `st`): gives its slot back and forgets the
    /// lane when idle and there are many.
    fn finish(&self, sender: &mut Sender, st: &mut LaneState) {
        st.in_flight -= 1;
        sender.done = true;
        let lane = &sender.lane;
        if st.in_flight == 0 && !st.parked && self.lanes.len() > MAX_IDLE_LANES {
            // Many lanes (old generations, many SKUs): forget this idle one. A caller that
            // already holds the Arc still works through it (it starts its own sender); a new
            // caller makes a fresh lane. Below the bound, idle lanes stay: re-creating one per
            // call cost ~8 % on 64 quiet lanes.
            self.lanes.remove_if(&lane.key, |_, l| Arc::ptr_eq(l, lane));
        }
    }

    /// Sends what the lane has queued, call after call, until the queue is empty or the lane
    /// waits in line.
    async fn send_loop(self: Arc<Self>, conn: Conn, mut sender: Sender) {
        let lane = sender.lane.clone();
        loop {
            self.wait_window(&lane).await;
            let (items, txs): (Vec<SellItem>, Vec<_>) = {
                let mut st = lane.lock();
                if st.queue.is_empty() {
                    if let Some(n) = sender.reserved.take() {
                        self.gate.lock().release(n);
                    }
                    self.finish(&mut sender, &mut st);
                    drop(st);
                    self.wake(&conn);
                    return;
                }
                let n = st.queue.len().min(self.opts.max_batch);
                let mut g = self.gate.lock();
                let was = sender.reserved.replace(n).unwrap_or(0);
                g.carried = g.carried - was + n;
                drop(g);
                st.queue.drain(..n).map(|i| (i.call, i.tx)).unzip()
            };
            let n = items.len();
            crate::metrics::coalesced_batch(n);
            self.calls.fetch_add(1, Relaxed);
            self.requests.fetch_add(n as u64, Relaxed);
            let call = Sell {
                head: &lane.head,
                fence: 0,
                credits: &[],
                items,
            };
            let outcome = conn.run(call).await;
            Self::answer(outcome, txs);
            // The call is back: the lanes waiting in line go first, then this lane's next
            // call if the gate admits it (else the lane waits in line).
            if let Some(n) = sender.reserved.take() {
                let mut g = self.gate.lock();
                g.release(n);
                g.back += 1;
            }
            self.wake(&conn);
            let mut st = lane.lock();
            let queued = st.queue.len();
            let mut g = self.gate.lock();
            if queued > 0 && g.admits(queued) {
                g.reserve(queued);
                sender.reserved = Some(queued);
                continue;
            }
            let mut watch = false;
            if queued > 0 && st.in_flight == 1 && !st.parked {
                watch = g.park(&lane, &mut st);
            }
            // Else the queue is empty, or another sender of this lane is out (it takes the
            // queue next), or the lane waits in line already.
            drop(g);
            self.finish(&mut sender, &mut st);
            drop(st);
            if watch {
                tokio::spawn(Self::watch(self.clone(), conn.clone()));
            }
            return;
        }
    }

    /// Hands each request of a call its reply (or the call's error).
    fn answer(
        outcome: Result<Vec<Result<SellReply>>>,
        txs: Vec<oneshot::Sender<Result<SellReply>>>,
    ) {
        match outcome {
            Ok(replies) => {
                for (tx, reply) in txs.into_iter().zip(replies) {
                    let _ = tx.send(reply);
                }
            }
            Err(e) => {
                // The whole call failed (connection, timeout), or in durability mode too few
                // replicas acknowledged it (one WAIT per batch): every request in it has an
                // unknown outcome, exactly like a lone call that failed, and gets the error.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_admits_when_idle_or_as_full_as_the_calls_out() {
        let mut g = GateState::default();
        // Nothing out: a lane of one goes at once.
        assert!(g.admits(1));
        g.reserve(1);
        // One call of one out: another of one is as full.
        assert!(g.admits(1));
        g.reserve(5);
        // Calls of 1 and 5 out (3 on average): 2 waits, 3 goes.
        assert!(!g.admits(2));
        assert!(g.admits(3));
        // A lane that waits from now goes after two rounds of the two calls out.
        assert_eq!(g.due(), 4);
        g.release(5);
        g.back += 1;
        assert!(g.admits(1));
        assert_eq!(g.due(), 1 + 2);
        g.release(1);
        assert_eq!((g.calls, g.carried), (0, 0));
    }
}
