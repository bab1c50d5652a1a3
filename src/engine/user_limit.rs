//! The per-user limit, in two layers: the in-process guard ([`Engine::guarded`]) filters
//! double clicks and users this process already saw at the limit; the user's record in the
//! store ([`Engine::user_counted`]) decides, claimed before the deduction and settled after it.
//! Entries left pending by dead callers are verified here too.

use super::claim::Unfinished;
use super::deduct::{Done, Flow, Refused, Short, Stale};
use super::request::Recorded;
use super::{Attempt, Deduct, Deduction, Engine, Intent, Layout};
use crate::error::Result;
use crate::guard::Local;
use crate::store::{
    RequestKind, SealReply, StaleEntry, Store, TakeoverReply, UserClaim, UserFinish,
};
use std::sync::Arc;

/// Armed while a call of the per-user path runs (from its claim in the user record until that
/// record is settled): if the call's future is dropped — a client disconnected and the server
/// dropped its handler — a task finishes the call in the background, with the same request id:
/// its per-user entry is settled at once instead of keeping the user busy until it expires,
/// and a retry of that id by the client replays whatever the background call did. Every step
/// is idempotent by request id, so the background run and whatever the dropped call had in
/// flight cannot apply twice.
struct PendingEntry<'a, S: Store> {
    engine: &'a Engine<S>,
    attempt: &'a Attempt<'a>,
    armed: bool,
}

impl<S: Store> Drop for PendingEntry<'_, S> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return; // no runtime (shutting down): the entry is verified when it lingers
        };
        let a = self.attempt;
        let (engine, l, req, intent, token) = (
            self.engine.clone(),
            Arc::clone(a.layout),
            a.req.clone(),
            a.intent,
            a.args.attempt,
        );
        rt.spawn(async move {
            // The same attempt, carried on: it released nothing and joins nothing new.
            let a = engine.attempt(&l, &req, intent).token(token);
            if let Err(e) = Box::pin(engine.user_counted(&a)).await {
                tracing::warn!(error = %e, request_id = %req.request_id,
                    "finishing a dropped call failed; its per-user entry is verified when it lingers");
            }
        });
    }
}

impl<S: Store> Engine<S> {
    /// Layer 3a, the in-process guard: turns away a second attempt of the user running in
    /// this process, and users it saw at the limit (unless this request is a retry of one
    /// that applied); the rest go on to [`user_counted`](Self::user_counted).
    pub(super) async fn guarded(&self, a: &Attempt<'_>) -> Result<Flow> {
        let (l, req) = (a.layout, a.req);
        let limit = l.user_limit;
        if req.qty > limit {
            // Answered from the cached layout alone: make sure it is still the SKU's (a
            // reload may have changed the limit).
            return Ok(if self.is_current(l).await? {
                Done(Deduction::OverLimit { limit })
            } else {
                Stale
            });
        }
        let g = &self.inner.guard;
        let entered = g.enter(
            l.generation,
            &req.sku,
            &req.user,
            &req.request_id,
            req.qty,
            limit,
        );
        crate::metrics::guard(entered.is_err(), g);
        let entered = match entered {
            Ok(entered) => entered,
            Err(Local::InFlight) => return Ok(Done(Deduction::UserBusy)),
            // This process saw the user's units; but a retry of a request applied through
            // another instance must still replay.
            Err(_) => return self.replay_or_limit(a).await,
        };
        let r = self.user_counted(a).await;
        match &r {
            // Remember only units sold for good: pending claims and reservations may still be
            // given back, and the store must see the next attempt.
            Ok((Done(Deduction::LimitReached { .. }), Some(final_units))) => {
                entered.saturate(*final_units)
            }
            Ok((Done(Deduction::Applied { parts } | Deduction::Replayed { parts }), _))
                if a.intent.kind() == RequestKind::Sale =>
            {
                entered.finish(parts.iter().map(|p| p.units).sum())
            }
            _ => entered.finish(0),
        }
        r.map(|(flow, _)| flow)
    }

    /// "Limit reached" — unless this very request applied before (a retry, perhaps through
    /// another instance): then its replay; or its request id is taken by another request
    /// (other user, quantity or kind): then that conflict; or the cached layout is no longer
    /// the SKU's: then stale. One round trip (home record and metadata, pipelined).
    async fn replay_or_limit(&self, a: &Attempt<'_>) -> Result<Flow> {
        // The limit and the ledger come from the cached layout: make sure it is still the SKU's
        // (a reload elsewhere may have changed the limit), in the same round trip.
        let (rec, current) = futures::join!(
            self.inner.store.record(a.home_at(), &a.req.request_id),
            self.is_current(a.layout)
        );
        if !current? {
            return Ok(Stale);
        }
        let limit = Done(Deduction::LimitReached {
            limit: a.layout.user_limit,
        });
        let Some(rec) = rec? else { return Ok(limit) };
        Ok(match a.recorded(rec) {
            Recorded::Other(field) => Refused(a.conflict(field)),
            Recorded::Applied(parts) => Done(Deduction::Replayed { parts }),
            Recorded::Sealed => Refused(a.sealed()),
            Recorded::Pending => limit,
        })
    }

    /// Layer 3b, the user's record in the store: claim the units there, deduct, then settle
    /// the record (see `user_claim.lua` for why this compensated two-step is exact). With a
    /// "limit reached", also the units the user holds for good (sold) when the store knows
    /// them.
    pub(super) async fn user_counted(&self, a: &Attempt<'_>) -> Result<(Flow, Option<u64>)> {
        let store = &self.inner.store;
        let (l, req) = (a.layout, a.req);
        let claim_ttl = self.inner.opts.user_claim_ttl.as_millis() as u64;
        // After a sell-out most buyers are turned away: answer them from a fresh read before
        // touching the user record (nothing would be sold, so nothing needs counting).
        if l.sold_out.is_set() || (0..l.segments).all(|i| l.hints.likely_short(i, req.qty)) {
            match self.check_short(a).await? {
                Short::Decided(d) => return Ok((Done(d), None)),
                Short::Stale => return Ok((Stale, None)),
                Short::Refused(e) => return Ok((Refused(e), None)),
                Short::Pending | Short::Go => {}
            }
        }
        // Armed before the claim is sent: a call dropped while its claim is in flight must not
        // leave the entry pending either.
        let mut pending = PendingEntry {
            engine: self,
            attempt: a,
            armed: true,
        };
        let mut verified = false;
        loop {
            let claim = store
                .user_claim(&req.sku, l.generation, a.args, l.user_limit, claim_ttl)
                .await;
            if claim.is_err() {
                pending.armed = false; // unknown: a retry with the same id finds its entry
            }
            match claim? {
                UserClaim::Ok | UserClaim::Dup { .. } => break,
                UserClaim::Mismatch(f) => {
                    pending.armed = false;
                    return Err(a.conflict(f));
                }
                UserClaim::Limit {
                    used,
                    final_used,
                    fresh_pending,
                    stale,
                } => {
                    if verified || stale.is_empty() {
                        // Refuse with "limit reached" only for units the user holds (sold, or
                        // reserved and live); attempts still pending may give theirs back.
                        let in_flight: u64 = fresh_pending
                            + stale
                                .iter()
                                .filter(|e| !e.reserved)
                                .map(|e| e.qty)
                                .sum::<u64>();
                        pending.armed = false; // refused: nothing was claimed
                        if used.saturating_sub(in_flight) + req.qty > l.user_limit {
                            let flow = self.replay_or_limit(a).await?;
                            return Ok((flow, Some(final_used)));
                        }
                        return Ok((Done(Deduction::UserBusy), None));
                    }
                    let checked = self.verify_stale(l, req, &stale).await;
                    if checked.is_err() {
                        pending.armed = false;
                    }
                    checked?;
                    verified = true;
                }
            }
        }
        let flow = match self.take_units(a).await {
            Ok(flow) => flow,
            Err(e) => {
                // The outcome is unknown: the entry stays pending, a retry with the same id
                // finds it (or it is verified once it lingers).
                pending.armed = false;
                return Err(e);
            }
        };
        let reservation = a.intent.kind() == RequestKind::Reservation;
        // Stale in a generation that is over (the SKU was reloaded, or Redis lost its data and
        // the metadata is gone): nothing this call did can count, so its entry goes instead of
        // lingering in that generation's record (after a data loss, a record written for a
        // sale that cannot happen). While the metadata still names this generation (a segment
        // alone is missing), the entry stays pending and is verified if it lingers.
        let over = matches!(flow, Stale) && matches!(self.is_current(l).await, Ok(false));
        let how = match &flow {
            Stale if over => Some(UserFinish::Void),
            // A replayed reservation may have ended since (expired, cancelled, confirmed): its
            // entry follows its state, never "reserved" for units it no longer holds.
            Done(Deduction::Replayed { .. }) if reservation => self.reservation_finish(a).await?,
            Done(Deduction::Applied { .. } | Deduction::Replayed { .. }) if reservation => {
                Some(UserFinish::Reserved)
            }
            Done(Deduction::Applied { .. } | Deduction::Replayed { .. }) => Some(UserFinish::Sold),
            // This attempt sold nothing; a twin of the request id may still sell (user_claim.lua).
            Done(
                Deduction::SoldOut
                | Deduction::Insufficient { .. }
                | Deduction::TooLargeToHold { .. },
            ) => Some(UserFinish::Release),
            // The request id is another request's, or sealed: no twin of this request can sell.
            Refused(_) => Some(UserFinish::Void),
            // In flight, restarted or stale: the entry stays pending (verified if it lingers).
            _ => None,
        };
        // Still armed here: dropped during this write, the entry is resolved all the same.
        if let Some(how) = how {
            store
                .user_finish(&req.sku, l.generation, a.args, how)
                .await?;
        }
        pending.armed = false;
        Ok((flow, None))
    }

    /// Resolves per-user entries of `req.user` whose claimer is presumed dead (pending past
    /// expiry) or whose reservation may have ended: counted for good if their request applied,
    /// removed once the request is sealed so it never can.
    async fn verify_stale(
        &self,
        l: &Arc<Layout>,
        req: &Deduct,
        stale: &[StaleEntry],
    ) -> Result<()> {
        for e in stale {
            let counted = Deduct {
                qty: e.qty,
                request_id: e.request_id.clone(),
                ..req.clone()
            };
            let a = self.attempt(l, &counted, Intent::Finish(e.kind));
            if let Some(how) = self.resolve_entry(&a, e).await? {
                self.inner
                    .store
                    .user_finish(&req.sku, l.generation, a.args, how)
                    .await?;
            }
        }
        Ok(())
    }

    /// What the per-user entry `e` (of the request `counted` attempts) should become (`None`:
    /// leave it for now).
    async fn resolve_entry(
        &self,
        counted: &Attempt<'_>,
        e: &StaleEntry,
    ) -> Result<Option<UserFinish>> {
        let store = &self.inner.store;
        if e.reserved {
            // A reservation counts until it is confirmed, cancelled or expired.
            return self.reservation_finish(counted).await;
        }
        let mut kind = e.kind;
        for flips in 0..2 {
            let a = self.attempt(counted.layout, counted.req, Intent::Finish(kind));
            let applied = match store.seal(a.home_at(), a.args).await? {
                SealReply::Sealed => Some(false),
                SealReply::Applied => Some(true),
                // Same user and quantity, other kind: the record is this user's request under
                // this id after all (an entry counted under the wrong kind); judge it as what
                // it is.
                SealReply::Mismatch("kind") if flips == 0 => {
                    kind = match kind {
                        RequestKind::Sale => RequestKind::Reservation,
                        RequestKind::Reservation => RequestKind::Sale,
                    };
                    continue;
                }
                // The home record belongs to another request: this one can never apply.
                SealReply::Mismatch(_) => Some(false),
                SealReply::Pending { lease_left_ms: 0 } => {
                    match store.takeover(a.home_at(), a.args).await? {
                        TakeoverReply::Won { epoch, home_part } => {
                            match self
                                .reconcile(&a, epoch, home_part, Unfinished::Seal)
                                .await?
                            {
                                Done(Deduction::Replayed { .. }) => Some(true),
                                Done(Deduction::SoldOut) | Refused(_) => Some(false),
                                _ => None,
                            }
                        }
                        TakeoverReply::Replay(_) => Some(true),
                        TakeoverReply::Sealed | TakeoverReply::Mismatch(_) => Some(false),
                        TakeoverReply::Pending { .. } | TakeoverReply::Gone => None,
                    }
                }
                SealReply::Pending { .. } => None,
            };
            return Ok(match applied {
                Some(false) => Some(UserFinish::Void),
                Some(true) if kind == RequestKind::Sale => Some(UserFinish::Sold),
                // A reservation that applied: it counts only while it holds its units.
                Some(true) => self.reservation_finish(&a).await?,
                None => None,
            });
        }
        Ok(None)
    }
}
