//! The deduction's layers, outside in; each adds one thing:
//! 1. [`metered`](Engine::metered): metrics (outcome, latency, segment tries);
//! 2. [`in_current_layout`](Engine::in_current_layout): the SKU's layout, and running again
//!    after a reload or a released twin claim;
//! 3. with a per-user limit, [`guarded`](Engine::guarded) and
//!    [`user_counted`](Engine::user_counted) (in `user_limit.rs`);
//! 4. [`take_units`](Engine::take_units): the home attempt, then the fallback under a claim
//!    (`fallback.rs`), or waiting for the claim's holder (`claim.rs`).

use super::request::Recorded;
use super::{Attempt, Deduct, Deduction, Engine, Intent};
use crate::error::{Error, Result};
use crate::ids::check_qty;
use crate::segments::Part;
use crate::store::{HomeReply, OnShort, Store};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Instant;

/// Metrics bookkeeping of one call (an atomic so the futures stay `Send`).
#[derive(Debug, Default)]
pub(super) struct Trace {
    /// Segment scripts sent that could take units.
    tries: AtomicU32,
}

impl Trace {
    /// Counts one segment script that could take units.
    pub(super) fn tried(&self) {
        self.tries.fetch_add(1, Relaxed);
    }
}

/// How many times a call re-reads a SKU's layout after `Stale` before giving up.
pub(super) const STALE_RETRIES: usize = 4;

/// How many times a call starts afresh after the twin it waited for released the claim,
/// before answering `InFlight`.
const MAX_RESTARTS: usize = 16;

/// What a fresh read says before anything is claimed.
pub(super) enum Short {
    /// Replayed, sold out or insufficient: answer this, nothing to do.
    Decided(Deduction),
    /// The request's fallback claim is held by someone.
    Pending,
    /// The layout changed.
    Stale,
    /// The request id is taken by another request (or sealed): this request can never apply.
    Refused(Error),
    /// Enough stock exists: go on.
    Go,
}

/// A step's result, or why the call cannot answer in this layout.
pub(super) enum Flow {
    /// The answer.
    Done(Deduction),
    /// The layout changed under us: read it again and start over.
    Stale,
    /// The claim was released by its holder meanwhile: start the request again.
    Restart,
    /// Refused before anything was taken: the request id belongs to another request (user,
    /// qty or kind differ) or was sealed. This request can never apply under this id, so its
    /// per-user entry goes; the error is the answer.
    Refused(Error),
}

pub(super) use Flow::{Done, Refused, Restart, Stale};

impl Flow {
    /// The outcome's name, for logs.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Done(d) => d.kind(),
            Stale => "stale",
            Restart => "restart",
            Refused(_) => "refused",
        }
    }
}

impl<S: Store> Engine<S> {
    /// Layer 1, metrics: runs the request (a sale or a reservation) and records its outcome,
    /// latency and segment tries. Also returns the load generation the outcome belongs to.
    pub(crate) async fn metered(&self, req: &Deduct, intent: Intent) -> Result<(Deduction, u64)> {
        let start = Instant::now();
        let trace = Trace::default();
        let r = self.in_current_layout(req, intent, &trace).await;
        match &r {
            Ok((d, _)) => crate::metrics::deduction(
                d,
                self.inner.store.strategy(),
                start.elapsed(),
                trace.tries.load(Relaxed),
            ),
            Err(e) => crate::metrics::error(e),
        }
        r
    }

    /// Layer 2, layout: checks the quantity, runs the request in the SKU's current layout,
    /// and runs it again after a reload (`Stale`) or after the twin it waited for released
    /// the claim (`Restart`).
    async fn in_current_layout(
        &self,
        req: &Deduct,
        intent: Intent,
        trace: &Trace,
    ) -> Result<(Deduction, u64)> {
        check_qty("qty", req.qty, self.inner.opts.max_qty)?;
        let (mut stale, mut restarts) = (0, 0);
        // One token for the whole call (restarts included): the per-user entry counts this
        // call as one attempt, whatever twins of its request id run elsewhere.
        let token = fastrand::u64(1..);
        loop {
            let layout = self.layout(&req.sku).await?;
            let a = self
                .attempt(&layout, req, intent)
                .traced(trace)
                .token(token);
            let flow = if layout.user_limit > 0 {
                // Boxed, as the claim wait and the fallback below: the rare paths' state stays
                // out of the common path's future, which is built and moved per request.
                Box::pin(self.guarded(&a)).await?
            } else {
                self.take_units(&a).await?
            };
            match flow {
                Done(d) => {
                    layout.sold_out.applied(&d); // sold out from memory
                    self.maybe_gauges(&layout);
                    return Ok((d, layout.generation));
                }
                Refused(e) => return Err(e),
                Stale => {
                    self.forget(&layout);
                    stale += 1;
                    if stale == STALE_RETRIES {
                        return Err(Error::NotReady(req.sku.to_string()));
                    }
                }
                // A twin released the claim we waited for (it sold nothing): try afresh. Twins
                // racing for the claim of a sold-out SKU can do this a few times.
                Restart => {
                    restarts += 1;
                    if restarts == MAX_RESTARTS {
                        return Ok((Deduction::InFlight, layout.generation));
                    }
                }
            }
        }
    }

    /// Layer 4, stock: the whole quantity at the home segment (claiming the request when
    /// the home is short), then the fallback; or, when a twin holds the claim, waiting for it.
    pub(super) async fn take_units(&self, a: &Attempt<'_>) -> Result<Flow> {
        let l = a.layout;
        if l.sold_out.is_set() || l.hints.likely_short(a.home, a.req.qty) {
            // Home looks short: one read of everything (and of this request's record) decides
            // between replay, sold out, insufficient, and going to claim.
            match self.check_short(a).await? {
                Short::Decided(d) => return Ok(Done(d)),
                Short::Pending => return Box::pin(self.wait_for_claim(a)).await,
                Short::Stale => return Ok(Stale),
                Short::Refused(e) => return Ok(Refused(e)),
                Short::Go => {}
            }
        }

        l.sold_out.sent(&a.req.request_id); // sold out from memory: ids with a record here
        a.tried();
        match self
            .inner
            .store
            .deduct_home(a.home_at(), a.args, OnShort::Claim)
            .await?
        {
            HomeReply::Applied { stock_after } => {
                l.hints.observe(a.home, stock_after);
                Ok(Done(Deduction::Applied {
                    parts: vec![Part {
                        segment: a.home,
                        units: a.req.qty,
                    }],
                }))
            }
            HomeReply::Replay(parts) => Ok(Done(Deduction::Replayed { parts })),
            HomeReply::Mismatch(f) => Ok(Refused(a.conflict(f))),
            HomeReply::Stale => Ok(Stale),
            HomeReply::Sealed => Ok(Refused(a.sealed())),
            HomeReply::Pending { .. } => Box::pin(self.wait_for_claim(a)).await,
            HomeReply::Short { stock, claimed } => {
                l.hints.observe(a.home, stock);
                let Some(epoch) = claimed else {
                    return Err(Error::Protocol("deduct: short without claim".into()));
                };
                crate::metrics::fallback();
                Box::pin(self.fallback(a, epoch)).await
            }
        }
    }

    /// Reads every segment (shared read) and this request's home record: enough to answer a
    /// replay, sold out or insufficient without writing anything.
    pub(super) async fn check_short(&self, a: &Attempt<'_>) -> Result<Short> {
        // --- sold out from memory (sold_out.rs): no read, nothing written ---
        if a.layout.sold_out.answers(&a.req.request_id) {
            crate::metrics::sold_out_from_memory();
            return Ok(Short::Decided(Deduction::SoldOut));
        }
        // Boxed: the two reads' state stays out of the callers' futures, which the common
        // path (and a sold-out storm answered above) builds and moves per request.
        Box::pin(self.read_short(a)).await
    }

    /// [`check_short`](Self::check_short) past the memory answer: the reads.
    async fn read_short(&self, a: &Attempt<'_>) -> Result<Short> {
        let ticket = a.layout.sold_out.before_read();
        // ---
        let (segs, rec) = futures::join!(
            self.read_segments(a.layout),
            self.inner.store.record(a.home_at(), &a.req.request_id)
        );
        let segs = segs?;
        let Some(stocks) = a.layout.observe(&segs) else {
            return Ok(Short::Stale);
        };
        a.layout
            .sold_out
            .after_read(ticket, a.layout.generation, &segs); // sold out from memory
        if let Some(rec) = rec? {
            a.layout.sold_out.sent(&a.req.request_id); // sold out from memory: has a record
            return Ok(match a.recorded(rec) {
                Recorded::Other(field) => Short::Refused(a.conflict(field)),
                Recorded::Applied(parts) => Short::Decided(Deduction::Replayed { parts }),
                Recorded::Pending => Short::Pending,
                Recorded::Sealed => Short::Refused(a.sealed()),
            });
        }
        let total: u64 = stocks.iter().sum();
        Ok(if total == 0 {
            Short::Decided(Deduction::SoldOut)
        } else if total < a.req.qty {
            Short::Decided(Deduction::Insufficient { available: total })
        } else {
            Short::Go
        })
    }
}
