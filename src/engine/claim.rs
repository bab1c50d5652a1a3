//! Fallback claims held by someone else: waiting for the holder, taking the claim over once
//! its lease ran out (with a higher *epoch*), reconciling what the old holder took, and the
//! sweeper's recovery of abandoned claims.
//!
//! Epochs: the home script claims a request with epoch 1 (after a released claim of the same
//! request id, one above that claim's: see `settle.lua`); each takeover bumps it. A takeover
//! shuts every other segment to older epochs (`shut_out.lua`), so a holder that lost its claim
//! can no longer take or refund anywhere; its parts are counted by the new holder.

use super::deduct::{Done, Flow, Refused, Restart};
use super::{Attempt, Deduct, Deduction, Engine, Intent, Layout};
use crate::error::Result;
use crate::router::others;
use crate::segments::Part;
use crate::store::{
    RequestKind, SettleAs, SettleReply, ShutOutReply, Store, TakeoverReply, UserFinish,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most abandoned claims one sweep recovers per segment.
const CLAIMS_PER_SWEEP: usize = 64;

/// What a takeover does with a request the old holder left incomplete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unfinished {
    /// Refund its parts and serve the request afresh (a retry of the request took over).
    ServeAfresh,
    /// Refund its parts and seal the request id, so it never applies (a verified-void
    /// per-user entry, or an abandoned claim the sweeper recovers).
    Seal,
}

impl<S: Store> Engine<S> {
    /// Takes over the fallback claims at segment `index` (their home) whose lease ran out, and
    /// settles or refunds and seals them (see [`sweep`](Self::sweep)). Returns how many it
    /// recovered.
    pub(super) async fn recover_claims(&self, l: &Arc<Layout>, index: u32) -> Result<usize> {
        let store = &self.inner.store;
        let mut recovered = 0;
        // One more lease of grace: holders do not renew, and a slow live one should finish
        // its own request rather than find it sealed.
        let grace = self.inner.opts.claim_lease.as_millis() as u64;
        for c in store
            .claims_due(l.seg(index), CLAIMS_PER_SWEEP, grace)
            .await?
        {
            let req = Deduct {
                sku: l.sku.clone(),
                user: c.user,
                qty: c.qty,
                request_id: c.request_id,
            };
            let a = self.attempt(l, &req, Intent::Finish(c.kind));
            if a.home != index {
                continue; // indexed under another segment count: not ours to judge
            }
            let TakeoverReply::Won { epoch, home_part } =
                store.takeover(a.home_at(), a.args).await?
            else {
                continue; // settled, renewed or taken over meanwhile
            };
            let outcome = match self.reconcile(&a, epoch, home_part, Unfinished::Seal).await {
                Ok(outcome) => outcome,
                Err(e) => {
                    // One claim that cannot be judged (e.g. its id is taken by a live part of
                    // another request) must not hold up the others.
                    tracing::warn!(sku = %req.sku, request_id = %req.request_id, error = %e,
                        "abandoned claim not recovered");
                    continue;
                }
            };
            recovered += 1;
            tracing::info!(sku = %req.sku, request_id = %req.request_id,
                outcome = ?outcome.name(), "recovered an abandoned fallback claim");
            if l.user_limit > 0 {
                let how = match outcome {
                    Done(Deduction::Replayed { .. }) => match c.kind {
                        RequestKind::Sale => Some(UserFinish::Sold),
                        RequestKind::Reservation => self.reservation_finish(&a).await?,
                    },
                    Done(Deduction::SoldOut) | Refused(_) => Some(UserFinish::Void),
                    _ => None,
                };
                if let Some(how) = how {
                    store
                        .user_finish(&req.sku, l.generation, a.args, how)
                        .await?;
                }
            }
        }
        Ok(recovered)
    }

    /// Another call holds this request's claim: wait for it to finish, or take it over once
    /// its lease ran out on the store's clock.
    pub(super) async fn wait_for_claim(&self, a: &Attempt<'_>) -> Result<Flow> {
        let store = &self.inner.store;
        let deadline = Instant::now() + self.inner.opts.pending_wait;
        let mut pause = Duration::from_millis(1);
        loop {
            match store.takeover(a.home_at(), a.args).await? {
                TakeoverReply::Replay(parts) => return Ok(Done(Deduction::Replayed { parts })),
                TakeoverReply::Gone => return Ok(Restart),
                TakeoverReply::Sealed => return Ok(Refused(a.sealed())),
                TakeoverReply::Mismatch(f) => return Ok(Refused(a.conflict(f))),
                TakeoverReply::Won { epoch, home_part } => {
                    return self
                        .reconcile(a, epoch, home_part, Unfinished::ServeAfresh)
                        .await;
                }
                TakeoverReply::Pending { lease_left_ms, .. } => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(Done(Deduction::InFlight));
                    }
                    let wait = pause
                        .min(Duration::from_millis(lease_left_ms.max(1)))
                        .min(deadline - now);
                    tokio::time::sleep(wait).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        }
    }

    /// After a takeover with `epoch`: shut older epochs out of every other segment, count what
    /// the previous holders took (`home_part` at home), and either settle it (it was complete)
    /// or refund it and go on as `unfinished` says.
    pub(super) async fn reconcile(
        &self,
        a: &Attempt<'_>,
        epoch: u64,
        home_part: u64,
        unfinished: Unfinished,
    ) -> Result<Flow> {
        let store = &self.inner.store;
        let shut_outs = others(a.home, a.layout.segments)
            .map(|j| async move { (j, store.shut_out(a.at(j), a.args, epoch).await) });
        let mut parts = Vec::new();
        if home_part > 0 {
            parts.push(Part {
                segment: a.home,
                units: home_part,
            });
        }
        let mut taken_by_other = None;
        for (j, r) in futures::future::join_all(shut_outs).await {
            match r? {
                ShutOutReply::Clear => {}
                ShutOutReply::Applied { part } if part > 0 => parts.push(Part {
                    segment: j,
                    units: part,
                }),
                ShutOutReply::Applied { .. } => {}
                // A newer epoch is there already: this call was superseded.
                ShutOutReply::Superseded => return Ok(Done(Deduction::InFlight)),
                ShutOutReply::Mismatch(f) => taken_by_other = Some(f),
            }
        }
        if let Some(f) = taken_by_other {
            // A live part of another request under this id: this one can never complete. Give
            // back what it took and seal it, rather than leave its units stranded.
            return self.give_up(a, epoch, &parts, f, SettleAs::Seal).await;
        }
        let taken: u64 = parts.iter().map(|p| p.units).sum();
        if taken == a.req.qty {
            parts.sort();
            return Ok(
                match store
                    .settle(a.home_at(), a.args, epoch, SettleAs::Applied(&parts))
                    .await?
                {
                    SettleReply::Ok => Done(Deduction::Replayed { parts }),
                    SettleReply::Applied(parts) => Done(Deduction::Replayed { parts }),
                    // A newer holder took over (or released) meanwhile: it decides.
                    SettleReply::Superseded | SettleReply::Gone => Done(Deduction::InFlight),
                },
            );
        }
        self.refund_all(a, epoch, &parts).await?;
        match unfinished {
            Unfinished::Seal => Ok(
                match store
                    .settle(a.home_at(), a.args, epoch, SettleAs::Seal)
                    .await?
                {
                    SettleReply::Ok | SettleReply::Gone => Done(Deduction::SoldOut),
                    SettleReply::Applied(parts) => Done(Deduction::Replayed { parts }),
                    SettleReply::Superseded => Done(Deduction::InFlight),
                },
            ),
            Unfinished::ServeAfresh => self.fallback(a, epoch).await,
        }
    }
}
