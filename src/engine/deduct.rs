//! The deduction path.

use super::*;

/// Per-call context: what the call is (sale or reservation) and metrics bookkeeping (atomics
/// so the futures stay `Send`).
pub(crate) struct Trace {
    pub(crate) attempts: std::sync::atomic::AtomicU32,
    /// 0: a sale; > 0: a reservation for this many ms.
    pub(crate) resv: u64,
    /// Sale or reservation (a reservation verified by the sweeper has `resv` 0: it takes no
    /// units, it only settles or gives back what an earlier call took).
    pub(crate) kind: RequestKind,
}

impl Trace {
    /// A sale (`resv_ms` = 0) or a reservation for `resv_ms`.
    pub(crate) fn new(resv_ms: u64) -> Self {
        Self {
            attempts: Default::default(),
            resv: resv_ms,
            kind: if resv_ms > 0 {
                RequestKind::Reservation
            } else {
                RequestKind::Sale
            },
        }
    }

    /// Recovery of an earlier call of `kind` (takes no new units).
    pub(crate) fn recovering(kind: RequestKind) -> Self {
        Self {
            kind,
            ..Self::new(0)
        }
    }

    pub(crate) fn attempt(&self) {
        self.attempts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How many times a call re-reads a SKU's layout after `Stale` before giving up.
pub(crate) const STALE_RETRIES: usize = 4;

/// How many times a call starts afresh after the twin it waited for released the claim,
/// before answering `InFlight`.
pub(crate) const MAX_RESTARTS: usize = 16;

/// Most abandoned claims one sweep recovers per segment.
pub(crate) const CLAIMS_PER_SWEEP: usize = 64;

/// What a fresh read says before anything is claimed.
pub(crate) enum Short {
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

/// Internal: a step's result, or "the layout changed under us".
pub(crate) enum Flow<T> {
    Done(T),
    Stale,
    /// The claim was released by its holder meanwhile: start the request again.
    Restart,
    /// Refused at the home segment before anything was taken: the request id belongs to
    /// another request (user, qty or kind differ) or was sealed. This request can never apply
    /// under this id, so its per-user entry goes; the error is the answer.
    Refused(Error),
}

pub(crate) use Flow::{Done, Refused, Restart, Stale};

impl<S: Store> Engine<S> {
    /// Runs a deduction (`resv_ms` = 0) or reservation and records its outcome, latency and
    /// segment attempts. Also returns the load generation the outcome belongs to.
    pub(crate) async fn measured(&self, req: &Deduct, resv_ms: u64) -> Result<(Deduction, u64)> {
        let start = Instant::now();
        let trace = Trace::new(resv_ms);
        let r = self.deduct_traced(req, &trace).await;
        match &r {
            Ok((d, _)) => crate::metrics::deduction(
                d.kind(),
                self.inner.store.strategy().name(),
                start.elapsed(),
                trace.attempts.load(std::sync::atomic::Ordering::Relaxed),
            ),
            Err(e) => crate::metrics::error(e),
        }
        r
    }

    pub(crate) async fn deduct_traced(&self, req: &Deduct, tr: &Trace) -> Result<(Deduction, u64)> {
        check_qty("qty", req.qty, self.inner.opts.max_qty)?;
        let (mut stale, mut restarts) = (0, 0);
        loop {
            let layout = self.layout(&req.sku).await?;
            let flow = if layout.user_limit > 0 {
                self.deduct_limited(&layout, req, tr).await?
            } else {
                self.deduct_in(&layout, req, tr).await?
            };
            match flow {
                Done(d) => {
                    self.maybe_gauges(&layout, &req.sku);
                    return Ok((d, layout.generation));
                }
                Refused(e) => return Err(e),
                Stale => {
                    self.forget(&req.sku, layout.generation);
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

    pub(crate) async fn deduct_in(
        &self,
        l: &Layout,
        req: &Deduct,
        tr: &Trace,
    ) -> Result<Flow<Deduction>> {
        let store = &self.inner.store;
        let args = self.args(req, tr);
        let home_at = self.home_of(l, req);
        let home = home_at.index;

        if l.hints.likely_short(home, req.qty) {
            // Home looks short: one read of everything (and of this request's record) decides
            // between replay, sold out, insufficient, and going to claim.
            match self.check_short(l, req, tr).await? {
                Short::Decided(d) => return Ok(Done(d)),
                Short::Pending => return self.wait_for_claim(l, req, tr).await,
                Short::Stale => return Ok(Stale),
                Short::Refused(e) => return Ok(Refused(e)),
                Short::Go => {}
            }
        }

        tr.attempt();
        match store.deduct_home(home_at, args, true).await? {
            HomeReply::Applied { stock_after } => {
                l.hints.observe(home, stock_after);
                Ok(Done(Deduction::Applied {
                    parts: vec![Part {
                        segment: home,
                        units: req.qty,
                    }],
                }))
            }
            HomeReply::Replay(parts) => Ok(Done(Deduction::Replayed { parts })),
            HomeReply::Mismatch(f) => Ok(Refused(Self::conflict(req, f))),
            HomeReply::Stale => Ok(Stale),
            HomeReply::Sealed => Ok(Refused(Error::Sealed(req.request_id.to_string()))),
            HomeReply::Pending { .. } => self.wait_for_claim(l, req, tr).await,
            HomeReply::Short { stock, claimed } => {
                l.hints.observe(home, stock);
                if !claimed {
                    return Err(Error::Protocol("deduct: short without claim".into()));
                }
                crate::metrics::fallback();
                self.fallback(l, req, 1, tr).await
            }
        }
    }

    /// Reads every segment (coalesced) and this request's home record: enough to answer a
    /// replay, sold out or insufficient without writing anything.
    pub(crate) async fn check_short(&self, l: &Layout, req: &Deduct, tr: &Trace) -> Result<Short> {
        let at = self.home_of(l, req);
        let (segs, rec) = futures::join!(
            self.read_segments(l, &req.sku),
            self.inner.store.record(at, &req.request_id)
        );
        let Some(stocks) = observe(l, &segs?) else {
            return Ok(Short::Stale);
        };
        if let Some(rec) = rec? {
            let field = if rec.user != req.user.as_str() {
                Some("user")
            } else if rec.qty != req.qty {
                Some("qty")
            } else if rec.kind != tr.kind {
                Some("kind")
            } else {
                None
            };
            if let Some(f) = field {
                return Ok(Short::Refused(Self::conflict(req, f)));
            }
            return Ok(match rec.state {
                RecordState::Applied(parts) => Short::Decided(Deduction::Replayed { parts }),
                RecordState::Pending { .. } => Short::Pending,
                RecordState::Sealed => Short::Refused(Error::Sealed(req.request_id.to_string())),
            });
        }
        let total: u64 = stocks.iter().map(|(_, s)| s).sum();
        Ok(if total == 0 {
            Short::Decided(Deduction::SoldOut)
        } else if total < req.qty {
            Short::Decided(Deduction::Insufficient { available: total })
        } else {
            Short::Go
        })
    }
}

/// A flow's outcome for logs.
pub(crate) fn outcome_name(f: &Flow<Deduction>) -> &'static str {
    match f {
        Done(d) => d.kind(),
        Stale => "stale",
        Restart => "restart",
        Refused(_) => "refused",
    }
}
