//! The per-user limit.

use super::*;

/// Armed while a call of the per-user path runs (from its claim in the user record until that
/// record is settled): if the call's future is dropped — a client disconnected and the server
/// dropped its handler — a task finishes the call in the background, with the same request id:
/// its per-user entry is settled at once instead of keeping the user busy until it expires,
/// and a retry of that id by the client replays whatever the background call did. Every step
/// is idempotent by request id, so the background run and whatever the dropped call had in
/// flight cannot apply twice.
pub(crate) struct PendingEntry<'a, S: Store> {
    pub(crate) engine: &'a Engine<S>,
    pub(crate) layout: &'a Arc<Layout>,
    pub(crate) req: &'a Deduct,
    pub(crate) resv: u64,
    pub(crate) armed: bool,
}

impl<S: Store> Drop for PendingEntry<'_, S> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return; // no runtime (shutting down): the entry is verified when it lingers
        };
        let (engine, l, req) = (
            self.engine.clone(),
            Arc::clone(self.layout),
            self.req.clone(),
        );
        let resv = self.resv;
        rt.spawn(async move {
            let tr = Trace::new(resv);
            if let Err(e) = Box::pin(engine.deduct_counted(&l, &req, &tr)).await {
                tracing::warn!(error = %e, request_id = %req.request_id,
                    "finishing a dropped call failed; its per-user entry is verified when it lingers");
            }
        });
    }
}

impl<S: Store> Engine<S> {
    /// The per-user limit in two layers: the in-process guard filters double clicks and users
    /// this process already saw at the limit; the store's user record decides.
    pub(crate) async fn deduct_limited(
        &self,
        l: &Arc<Layout>,
        req: &Deduct,
        tr: &Trace,
    ) -> Result<Flow<Deduction>> {
        use crate::guard::Local;
        let limit = l.user_limit;
        if req.qty > limit {
            // Answered from the cached layout alone: make sure it is still the SKU's (a
            // reload may have changed the limit).
            return Ok(if self.is_current(l, &req.sku).await? {
                Done(Deduction::LimitReached { limit })
            } else {
                Stale
            });
        }
        let g = &self.inner.guard;
        let attempt = g.enter(
            l.generation,
            &req.sku,
            &req.user,
            &req.request_id,
            req.qty,
            limit,
        );
        crate::metrics::guard(attempt.is_err(), g);
        let attempt = match attempt {
            Ok(a) => a,
            Err(Local::InFlight) => return Ok(Done(Deduction::UserBusy)),
            // This process saw the user's units; but a retry of a request applied through
            // another instance must still replay.
            Err(_) => return self.replay_or_limit(l, req, tr).await,
        };
        let r = self.deduct_counted(l, req, tr).await;
        match &r {
            // Remember only units sold for good: pending claims and reservations may still be
            // given back, and the store must see the next attempt.
            Ok((Done(Deduction::LimitReached { .. }), Some(final_units))) => {
                attempt.saturate(*final_units)
            }
            Ok((Done(Deduction::Applied { parts } | Deduction::Replayed { parts }), _))
                if tr.kind == RequestKind::Sale =>
            {
                attempt.finish(parts.iter().map(|p| p.units).sum())
            }
            _ => attempt.finish(0),
        }
        r.map(|(flow, _)| flow)
    }

    /// "Limit reached" — unless this very request applied before (a retry, perhaps through
    /// another instance): then its replay; or its request id is taken by another request
    /// (other user, quantity or kind): then that conflict; or the cached layout is no longer
    /// the SKU's: then stale. One round trip (home record and metadata, pipelined).
    pub(crate) async fn replay_or_limit(
        &self,
        l: &Layout,
        req: &Deduct,
        tr: &Trace,
    ) -> Result<Flow<Deduction>> {
        // The limit and the ledger come from the cached layout: make sure it is still the SKU's
        // (a reload elsewhere may have changed the limit), in the same round trip.
        let (rec, current) = futures::join!(
            self.inner
                .store
                .record(self.home_of(l, req), &req.request_id),
            self.is_current(l, &req.sku)
        );
        if !current? {
            return Ok(Stale);
        }
        let rec = rec?;
        let limit = Done(Deduction::LimitReached {
            limit: l.user_limit,
        });
        let Some(rec) = rec else { return Ok(limit) };
        let field = if rec.user != req.user.as_str() {
            "user"
        } else if rec.qty != req.qty {
            "qty"
        } else if rec.kind != tr.kind {
            "kind"
        } else {
            return Ok(match rec.state {
                RecordState::Applied(parts) => Done(Deduction::Replayed { parts }),
                RecordState::Sealed => Refused(Error::Sealed(req.request_id.to_string())),
                RecordState::Pending { .. } => limit,
            });
        };
        Ok(Refused(Self::conflict(req, field)))
    }

    /// Claim in the user record, deduct, then settle the user record (see `user_claim.lua`
    /// for why this compensated two-step is exact). With a "limit reached", the units the user
    /// holds for good (sold) when the store knows them.
    pub(crate) async fn deduct_counted(
        &self,
        l: &Arc<Layout>,
        req: &Deduct,
        tr: &Trace,
    ) -> Result<(Flow<Deduction>, Option<u64>)> {
        let store = &self.inner.store;
        let args = self.args(req, tr);
        let claim_ttl = self.inner.opts.user_claim_ttl.as_millis() as u64;
        // After a sell-out most buyers are turned away: answer them from a fresh read before
        // touching the user record (nothing would be sold, so nothing needs counting).
        if (0..l.segments).all(|i| l.hints.likely_short(i, req.qty)) {
            match self.check_short(l, req, tr).await? {
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
            layout: l,
            req,
            resv: tr.resv,
            armed: true,
        };
        let mut verified = false;
        loop {
            let claim = store
                .user_claim(&req.sku, l.generation, args, l.user_limit, claim_ttl)
                .await;
            if claim.is_err() {
                pending.armed = false; // unknown: a retry with the same id finds its entry
            }
            match claim? {
                UserClaim::Ok | UserClaim::Dup { .. } => break,
                UserClaim::Mismatch(f) => {
                    pending.armed = false;
                    return Err(Self::conflict(req, f));
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
                        let limit = l.user_limit;
                        pending.armed = false; // refused: nothing was claimed
                        if used.saturating_sub(in_flight) + req.qty > limit {
                            let flow = self.replay_or_limit(l, req, tr).await?;
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
        let flow = match self.deduct_in(l, req, tr).await {
            Ok(flow) => flow,
            Err(e) => {
                // The outcome is unknown: the entry stays pending, a retry with the same id
                // finds it (or it is verified once it lingers).
                pending.armed = false;
                return Err(e);
            }
        };
        let held = match tr.kind {
            RequestKind::Reservation => UserFinish::Reserved,
            RequestKind::Sale => UserFinish::Sold,
        };
        let how = match &flow {
            // A replayed reservation may have ended since (expired, cancelled, confirmed): its
            // entry follows its state, never "reserved" for units it no longer holds.
            Done(Deduction::Replayed { .. }) if tr.kind == RequestKind::Reservation => {
                self.reservation_finish(l, req, self.home_of(l, req))
                    .await?
            }
            Done(Deduction::Applied { .. } | Deduction::Replayed { .. }) => Some(held),
            Done(Deduction::SoldOut | Deduction::Insufficient { .. }) | Refused(_) => {
                Some(UserFinish::Void)
            }
            // In flight, restarted or stale: the entry stays pending (verified if it lingers).
            _ => None,
        };
        // Still armed here: dropped during this write, the entry is resolved all the same.
        if let Some(how) = how {
            store.user_finish(&req.sku, l.generation, args, how).await?;
        }
        pending.armed = false;
        Ok((flow, None))
    }

    /// Resolves per-user entries whose claimer is presumed dead (pending past expiry) or
    /// whose reservation may have ended: counted for good if their request applied, removed
    /// once the request is sealed so it never can.
    pub(crate) async fn verify_stale(
        &self,
        l: &Layout,
        req: &Deduct,
        stale: &[StaleEntry],
    ) -> Result<()> {
        for e in stale {
            if let Some(how) = self.resolve_entry(l, req, e).await? {
                let counted = Deduct {
                    qty: e.qty,
                    request_id: e.request_id.clone(),
                    ..req.clone()
                };
                let args = self.args(&counted, &Trace::recovering(e.kind));
                self.inner
                    .store
                    .user_finish(&req.sku, l.generation, args, how)
                    .await?;
            }
        }
        Ok(())
    }

    /// What a per-user entry of `req.user` should become (`None`: leave it for now).
    pub(crate) async fn resolve_entry(
        &self,
        l: &Layout,
        req: &Deduct,
        e: &StaleEntry,
    ) -> Result<Option<UserFinish>> {
        let store = &self.inner.store;
        let other = Deduct {
            sku: req.sku.clone(),
            user: req.user.clone(),
            qty: e.qty,
            request_id: e.request_id.clone(),
        };
        let at = self.home_of(l, &other);
        if e.reserved {
            // A reservation counts until it is confirmed, cancelled or expired.
            return self.reservation_finish(l, &other, at).await;
        }
        let mut kind = e.kind;
        for flips in 0..2 {
            let tr = Trace::recovering(kind);
            let args = self.args(&other, &tr);
            let applied = match store.seal(at, args).await? {
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
                SealReply::Pending { lease_left_ms: 0 } => match store.takeover(at, args).await? {
                    TakeoverReply::Won { epoch, home_part } => {
                        match self
                            .reconcile_as(l, &other, epoch, home_part, &tr, true)
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
                },
                SealReply::Pending { .. } => None,
            };
            return Ok(match applied {
                Some(false) => Some(UserFinish::Void),
                Some(true) if kind == RequestKind::Sale => Some(UserFinish::Sold),
                // A reservation that applied: it counts only while it holds its units.
                Some(true) => self.reservation_finish(l, &other, at).await?,
                None => None,
            });
        }
        Ok(None)
    }
}
