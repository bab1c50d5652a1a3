//! The deduction's layers, outside in; each adds one thing:
//! 1. [`metered`](Engine::metered): metrics (outcome, latency, segment calls);
//! 2. [`in_current_layout`](Engine::in_current_layout): the SKU's layout, and running again
//!    after a reload;
//! 3. with a per-user limit, [`guarded`](Engine::guarded): the in-process guard in front of the
//!    user's ledger (double clicks, users this process saw at the limit);
//! 4. [`decide`](Engine::decide): one `sell` at the request's home segment — the common case,
//!    one round trip, the per-user limit included — and, when home is short, the transfers
//!    of [`super::protocol`] driven against the store ([`moved`](Engine::moved)).

use super::layout::Surveyed;
use super::protocol::{Answer, Look, Machine, Seen, Step};
use super::request::Trace;
use super::{Attempt, Deduct, Deduction, Engine, Intent, Layout};
use crate::error::{Error, Result};
use crate::guard::Local;
use crate::ids::check_qty;
use crate::store::{Credit, SellArgs, SellReply, Store, TransferArgs, TransferReply};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// How many times a call re-reads a SKU's layout after `Stale` before giving up.
pub(super) const STALE_RETRIES: usize = 4;

/// A step's result, or why the call cannot answer in this layout.
pub(super) enum Flow {
    /// The answer.
    Done(Deduction),
    /// The layout changed under us: read it again and start over.
    Stale,
    /// Refused: the error is the answer. The request id belongs to another request (qty or
    /// kind differ: it can never apply under this id), or nothing could be decided now (a
    /// lock lost; segments whose masters cannot replicate): the same request may apply later.
    Refused(Error),
}

pub(super) use Flow::{Done, Refused, Stale};

impl<S: Store> Engine<S> {
    /// Deducts `req.qty` units: see the [engine module docs](crate::engine) for the route a request takes.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (quantity), [`Error::NotLoaded`], [`Error::NotReady`],
    /// [`Error::RequestIdConflict`] (this user's request id used with another quantity or kind
    /// — e.g. the id of a reservation —, also when the new quantity is above the per-user
    /// limit; request ids are scoped per user), and store errors — after which the outcome is unknown
    /// and the request may be retried with the same id.
    pub async fn deduct(&self, req: &Deduct) -> Result<Deduction> {
        self.metered(req, Intent::Sale).await.map(|(d, _)| d)
    }

    /// Layer 1, metrics: runs the request (a sale or a reservation) and records its outcome,
    /// latency and segment calls. Also returns the load generation the outcome belongs to.
    pub(crate) async fn metered(&self, req: &Deduct, intent: Intent) -> Result<(Deduction, u64)> {
        let trace = Trace::begin();
        let r = self.in_current_layout(req, intent, &trace).await;
        match &r {
            Ok((d, _)) => {
                let strategy = self.inner.store.strategy();
                debug_assert_eq!(crate::metrics::OUTCOMES[d.kind_index()], d.kind());
                crate::metrics::deduction(
                    d.kind_index(),
                    matches!(d, Deduction::Replayed { .. }),
                    crate::strategy::Strategy::ALL
                        .iter()
                        .position(|x| *x == strategy)
                        .unwrap_or(0),
                    trace.start.elapsed(),
                    trace.tries.load(Relaxed),
                )
            }
            Err(e) => crate::metrics::error(e),
        }
        r
    }

    /// Layer 2, layout: checks the quantity, runs the request in the SKU's current layout,
    /// and runs it again after a reload (`Stale`).
    async fn in_current_layout(
        &self,
        req: &Deduct,
        intent: Intent,
        trace: &Trace,
    ) -> Result<(Deduction, u64)> {
        check_qty("qty", req.qty, self.inner.opts.max_qty)?;
        for _ in 0..STALE_RETRIES {
            let layout = self.layout(&req.sku).await?;
            let a = self.attempt(&layout, req, intent).traced(trace);
            // An order's item skips the in-process guard: a double submit of the order must
            // replay, not be turned away as `UserBusy` (which would refuse the whole order);
            // sell.lua decides the limit exactly either way.
            let hold = matches!(intent, Intent::Hold { .. });
            let flow = if layout.user_limit > 0 && !hold {
                // Not boxed: a box cost every limited sale an allocation and a copy of ~800
                // bytes (measured: ~6 % of the client's CPU per sale at 256 tasks); inline,
                // the call's future grows from 936 to 1,168 bytes.
                self.guarded(&a).await?
            } else if hold && layout.user_limit > 0 && req.qty > layout.user_limit {
                // Never possible under this limit, as the guard answers it (unless the request
                // id is taken).
                let limit = layout.user_limit;
                Box::pin(self.replay_or(&a, Deduction::OverLimit { limit })).await?
            } else {
                self.decide(&a).await?
            };
            match flow {
                Done(d) => {
                    layout.sold_out.applied(&d); // sold out from memory
                    return Ok((d, layout.generation));
                }
                Refused(e) => return Err(e),
                Stale => self.forget(&layout),
            }
        }
        Err(Error::NotReady(req.sku.to_string()))
    }

    /// Layer 3, the in-process guard: turns away a second attempt of the user running in this
    /// process, and users it saw at the limit (unless this request is a retry of one that
    /// applied: its record answers); the rest go on to [`decide`](Self::decide), whose one
    /// script checks the user's ledger.
    async fn guarded(&self, a: &Attempt<'_>) -> Result<Flow> {
        let (l, req) = (a.layout, a.req);
        let limit = l.user_limit;
        if req.qty > limit {
            // Never possible under this limit: "over limit" — unless the request id is taken.
            // As in `sell.lua`, a request id's record is looked at first: an id used with
            // another quantity or kind is a conflict, whatever the limit says. The record and
            // the metadata (a reload may have changed the limit) are read in one round trip.
            // (Boxed, like every rare path here: a metadata read's state is kilobytes.)
            return Box::pin(self.replay_or(a, Deduction::OverLimit { limit })).await;
        }
        let g = &self.inner.guard;
        let entered = g.enter(
            a.now(),
            l.generation,
            &req.sku,
            &req.user,
            &req.request_id,
            req.qty,
            limit,
        );
        crate::metrics::guard(
            entered.is_err(),
            g.stats()
                .evictions
                .load(std::sync::atomic::Ordering::Relaxed),
            g.len(),
        );
        let entered = match entered {
            Ok(entered) => entered,
            Err(Local::InFlight) => return Ok(Done(Deduction::UserBusy)),
            // This process saw the user's units; a retry of a request applied (perhaps through
            // another instance) must still replay.
            Err(_) => {
                let limit = Deduction::LimitReached { limit };
                return Box::pin(self.replay_or(a, limit)).await;
            }
        };
        let r = self.decide_limited(a).await;
        match &r {
            // Remember only units held for good: reservations may still go back.
            Ok((Done(Deduction::LimitReached { .. }), Some(sold))) => entered.saturate(*sold),
            Ok((Done(Deduction::Applied { units, .. } | Deduction::Replayed { units, .. }), _))
                if a.intent == Intent::Sale =>
            {
                entered.finish(*units)
            }
            _ => entered.finish(0),
        }
        r.map(|(flow, _)| flow)
    }

    /// `refusal` (limit reached, over limit), answered without a script — unless this very
    /// request applied before: then its replay; or its request id was used with another
    /// quantity or kind: then that conflict. One round trip (the record and the metadata,
    /// pipelined); a reload since the layout was read answers `Stale`.
    async fn replay_or(&self, a: &Attempt<'_>, refusal: Deduction) -> Result<Flow> {
        let (rec, current) = futures::join!(
            self.inner
                .store
                .record(a.home_at(), &a.req.user, &a.req.request_id),
            self.is_current(a.layout)
        );
        if !current? {
            return Ok(Stale);
        }
        let Some(rec) = rec? else {
            return Ok(Done(refusal));
        };
        Ok(if rec.qty != a.req.qty {
            Refused(a.conflict("qty"))
        } else if rec.kind != a.intent.kind() {
            Refused(a.conflict("kind"))
        } else {
            Done(a.replayed())
        })
    }

    /// [`decide`](Self::decide), with the units the user holds for good when the answer is
    /// "limit reached" (for the guard).
    async fn decide_limited(&self, a: &Attempt<'_>) -> Result<(Flow, Option<u64>)> {
        let mut sold = None;
        let flow = self.decide_with(a, &mut sold).await?;
        Ok((flow, sold))
    }

    /// Layer 4: the request at its home segment (see the module docs).
    pub(super) async fn decide(&self, a: &Attempt<'_>) -> Result<Flow> {
        self.decide_with(a, &mut None).await
    }

    async fn decide_with(&self, a: &Attempt<'_>, sold: &mut Option<u64>) -> Result<Flow> {
        let l = a.layout;
        let key = a.sold_out_key();
        // Sold out from memory, or else the id is noted as one that may have a record here.
        if l.sold_out.answers_or_sends(key) {
            crate::metrics::sold_out_from_memory();
            return Ok(Done(Deduction::SoldOut));
        }
        a.tried();
        let reply = self.inner.store.sell(a.home_at(), a.sell_args(&[])).await?;
        match reply {
            SellReply::Applied { stock_after } => {
                l.hints.observe_at(a.now(), a.home, stock_after);
                Ok(Done(a.applied()))
            }
            SellReply::Short { stock } => {
                l.hints.observe_at(a.now(), a.home, stock);
                crate::metrics::fallback();
                Box::pin(self.moved(a, reply, sold)).await
            }
            other => Ok(self.answer(a, Answer::from_reply(&other), sold)),
        }
    }

    /// Home was short: units move home by transfers, then home decides with the credits
    /// ([`super::protocol`]).
    async fn moved(
        &self,
        a: &Attempt<'_>,
        first: SellReply,
        sold: &mut Option<u64>,
    ) -> Result<Flow> {
        let l = a.layout;
        let store = &self.inner.store;
        let mut m = Machine::new(
            a.home,
            a.req.qty,
            l.hints.observed(),
            self.transfer_lease_ms(),
            fastrand::u64(1..u64::MAX / 2),
        );
        let mut step = m.on_sell(&first);
        let mut gathering = None;
        loop {
            if gathering.is_none() && m.round() >= 2 {
                gathering = Some(l.gather.lock().await);
            }
            step = match step {
                Step::Sell { credits } => {
                    a.tried();
                    let reply = store.sell(a.home_at(), a.sell_args(&credits)).await?;
                    if let SellReply::Applied { stock_after }
                    | SellReply::Short { stock: stock_after } = reply
                    {
                        l.hints.observe(a.home, stock_after);
                    }
                    let round = m.round();
                    let next = m.on_sell(&reply);
                    if m.round() > round.max(1) && gathering.is_none() {
                        // Contention for the last units: a jittered pause, growing with the
                        // rounds, so homes do not pull the same units back and forth in step.
                        let us = fastrand::u64(100..=500) * u64::from(m.round());
                        tokio::time::sleep(std::time::Duration::from_micros(us)).await;
                    }
                    next
                }
                Step::Transfer { donor, args } => {
                    a.tried();
                    crate::metrics::transfer();
                    let reply = match store.transfer(a.at(donor), args).await {
                        // Refused before it ran: nothing debited, another donor serves.
                        Err(Error::NoReplicas(_)) => {
                            // Other requests pass it over too until a survey sees it again.
                            l.hints.observe(donor, 0);
                            step = m.on_refused(donor);
                            continue;
                        }
                        r => r?,
                    };
                    match reply {
                        TransferReply::Debited { stock_after, .. } => {
                            l.hints.observe(donor, stock_after)
                        }
                        TransferReply::Short { stock } => l.hints.observe(donor, stock),
                        TransferReply::Stale => {}
                    }
                    m.on_transfer(donor, args.id, &reply)
                }
                Step::Survey => {
                    let ticket = l.sold_out.before_read();
                    let pass = self.survey_all(l).await?;
                    l.sold_out.after_read(ticket, l.generation, &pass.segs); // sold out from memory
                    let seen: Vec<Look> = pass
                        .segs
                        .iter()
                        .zip(&pass.down)
                        .map(|(s, &down)| match s {
                            _ if down => Look::Down,
                            Some(s) => Look::Seen(Seen {
                                stock: s.stock,
                                moved_out: s.moved_out,
                                moved_in: s.moved_in,
                            }),
                            None => Look::Gone,
                        })
                        .collect();
                    m.on_survey(&seen)
                }
                Step::Drain => {
                    self.drain(l, false).await?;
                    m.on_drained()
                }
                Step::Finish { done, answer } => {
                    // Best effort: what is left is marked by the sweeper.
                    let marks = done
                        .iter()
                        .map(|(donor, id)| store.transfer_done(a.at(*donor), *id));
                    for r in futures::future::join_all(marks).await {
                        if let Err(e) = r {
                            tracing::debug!(error = %e, "marking a transfer done failed; the sweeper will");
                        }
                    }
                    return Ok(self.answer(a, answer, sold));
                }
            };
        }
    }

    /// The engine's answer for the protocol's.
    fn answer(&self, a: &Attempt<'_>, answer: Answer, sold: &mut Option<u64>) -> Flow {
        match answer {
            Answer::Applied => Done(a.applied()),
            Answer::Replay => Done(a.replayed()),
            Answer::SoldOut => Done(Deduction::SoldOut),
            Answer::Insufficient { available } => Done(Deduction::Insufficient { available }),
            Answer::LimitReached { limit, sold: s, .. } => {
                *sold = Some(s);
                Done(Deduction::LimitReached { limit })
            }
            Answer::Mismatch(f) => Refused(a.conflict(f)),
            Answer::Stale => Stale,
            Answer::LockLost => Refused(Error::LeaseLost(format!(
                "segment {} of {}",
                a.home, a.req.sku
            ))),
            // The request may apply once the segments answer.
            Answer::Unavailable => Refused(Error::NoReplicas(format!(
                "units of {} may remain at segments whose masters cannot reach their replicas",
                a.req.sku
            ))),
        }
    }

    /// Every segment surveyed (returning expired reservations): each segment's counters
    /// (`None`: missing or of another generation, or refused: see [`Surveyed::down`]).
    ///
    /// Segments are read one by one, so a transfer may run between two reads. Debits happen
    /// before credits, and a unit is counted wherever it is read: a pass can count a moving
    /// unit twice (at the donor read before the debit and at home read after the credit, which
    /// shows as more credited than debited) but never miss one — a unit read at neither end is
    /// debited and not yet credited in that pass, i.e. in transit. So one pass decides sold
    /// out (every segment empty and Σ moved_out = Σ moved_in) unless credits outrun debits;
    /// then it reads again.
    ///
    /// Concurrent callers share one survey that starts after they asked (as fresh as a survey
    /// of their own); a caller whose shared survey failed surveys alone, so errors come back
    /// typed.
    pub(crate) async fn survey_all(&self, l: &Layout) -> Result<Surveyed> {
        let (inner, sku) = (Arc::clone(&self.inner), l.sku.clone());
        let (generation, segments, placement) = (l.generation, l.segments, l.placement.clone());
        let shared = l
            .surveys
            .join(move || {
                let (inner, sku, placement) = (Arc::clone(&inner), sku.clone(), placement.clone());
                async move {
                    let at = |i| super::seg_at(&sku, generation, i, &placement);
                    survey_pass(&inner.store, segments, at).await.ok()
                }
            })
            .await;
        let last = match shared {
            Some(v) => v.as_ref().clone(),
            None => survey_pass(&self.inner.store, l.segments, |i| l.seg(i)).await?,
        };
        for (i, s) in last.segs.iter().enumerate() {
            if let Some(s) = s {
                l.hints.observe(i as u32, s.stock);
            }
        }
        Ok(last)
    }

    /// Credits home every transfer of `l`'s SKU in transit (only those whose lease ran out
    /// when `due_only`; crediting earlier is safe: a credit applies once per id), and marks
    /// each done at its donor. Re-sends the debit first, so that with the durability mode the
    /// donor's debit is replicated before any home credits it. Returns the units credited.
    ///
    /// A segment whose master refuses ([`Error::NoReplicas`]: nothing ran) is passed over: its
    /// transfers stay due, for a later drain.
    pub(crate) async fn drain(&self, l: &Layout, due_only: bool) -> Result<u64> {
        let store = &self.inner.store;
        let mut credited = 0;
        for donor in 0..l.segments {
            let due = match store.transfers_due(l.seg(donor), 256).await {
                Err(Error::NoReplicas(_)) => continue,
                r => r?,
            };
            for t in due {
                if due_only && t.lease_left_ms > 0 {
                    continue;
                }
                if t.dest >= l.segments {
                    continue;
                }
                let again = TransferArgs {
                    id: t.id,
                    dest: t.dest,
                    want: t.units,
                    floor: 0,
                    lease_ms: self.transfer_lease_ms(),
                };
                let reply = match store.transfer(l.seg(donor), again).await {
                    Err(Error::NoReplicas(_)) => break,
                    r => r?,
                };
                let TransferReply::Debited { units, .. } = reply else {
                    continue;
                };
                let credit = [Credit {
                    id: t.id,
                    donor,
                    units,
                }];
                let args = SellArgs {
                    request_id: &SWEEP_ID,
                    user: &SWEEP_USER,
                    qty: 0,
                    resv_ttl_ms: 0,
                    order_item: false,
                    ttl_ms: 1,
                    credits: &credit,
                    fence: 0,
                };
                let reply = match store.sell(l.seg(t.dest), args).await {
                    Err(Error::NoReplicas(_)) => continue,
                    r => r?,
                };
                if let SellReply::Applied { stock_after } = reply {
                    l.hints.observe(t.dest, stock_after);
                    match store.transfer_done(l.seg(donor), t.id).await {
                        // The mark is bookkeeping: a later drain finds the credit applied.
                        Err(Error::NoReplicas(_)) | Ok(()) => {}
                        Err(e) => return Err(e),
                    }
                    credited += units;
                }
            }
        }
        if credited > 0 {
            crate::metrics::transfers_credited(credited);
        }
        Ok(credited)
    }

    /// The transfer lease in ms.
    pub(super) fn transfer_lease_ms(&self) -> u64 {
        self.inner.opts.transfer_lease.as_millis() as u64
    }
}

/// The placeholder ids of a credit-only `sell` (qty 0: no request is decided).
static SWEEP_ID: std::sync::LazyLock<crate::ids::RequestId> =
    std::sync::LazyLock::new(|| crate::ids::RequestId::new("credit").expect("valid id"));
static SWEEP_USER: std::sync::LazyLock<crate::ids::UserId> =
    std::sync::LazyLock::new(|| crate::ids::UserId::new("credit").expect("valid id"));

impl Answer {
    /// The protocol's reading of a `sell` reply that ends the request.
    fn from_reply(r: &SellReply) -> Answer {
        match *r {
            SellReply::Applied { .. } => Answer::Applied,
            SellReply::Replay => Answer::Replay,
            SellReply::LimitReached { limit, held, sold } => {
                Answer::LimitReached { limit, held, sold }
            }
            SellReply::Mismatch(f) => Answer::Mismatch(f),
            SellReply::Stale => Answer::Stale,
            SellReply::LockLost => Answer::LockLost,
            SellReply::Short { .. } => Answer::Insufficient { available: 0 },
        }
    }
}

/// [`Engine::survey_all`]'s read: every segment (`at(i)`), one pass, another while credits
/// outrun debits (at most 8). A segment refused with [`Error::NoReplicas`] is marked down (no
/// other error is tolerated).
async fn survey_pass<'a, S: Store>(
    store: &S,
    segments: u32,
    at: impl Fn(u32) -> crate::store::SegAddr<'a>,
) -> Result<Surveyed> {
    let mut last = Surveyed::default();
    for _ in 0..8 {
        let reads = (0..segments).map(|i| {
            let seg = at(i);
            async move {
                match store.survey(seg, false).await {
                    Err(Error::NoReplicas(_)) => Ok((None, true)),
                    r => r.map(|s| (s.map(|s| s.state), false)),
                }
            }
        });
        let all = futures::future::try_join_all(reads).await?;
        (last.segs, last.down) = all.into_iter().unzip();
        let (out, inn) = last
            .segs
            .iter()
            .flatten()
            .fold((0u64, 0u64), |(o, i), s| (o + s.moved_out, i + s.moved_in));
        // With a segment down its transfers are missing from the sums: another pass would
        // see the same, for as long as the outage lasts.
        if inn <= out || last.down.contains(&true) {
            break;
        }
    }
    Ok(last)
}
