//! Fallback claims held by others.

use super::*;

impl<S: Store> Engine<S> {
    /// Takes over the fallback claims at `seg` (their home) whose lease ran out, and settles
    /// or refunds and seals them (see [`sweep`](Self::sweep)). Returns how many it recovered.
    pub(crate) async fn recover_claims(&self, l: &Layout, seg: SegAddr<'_>) -> Result<usize> {
        let store = &self.inner.store;
        let mut recovered = 0;
        // One more lease of grace: holders do not renew, and a slow live one should finish
        // its own request rather than find it sealed.
        let grace = self.inner.opts.claim_lease.as_millis() as u64;
        for c in store.claims_due(seg, CLAIMS_PER_SWEEP, grace).await? {
            let req = Deduct {
                sku: seg.sku.clone(),
                user: c.user,
                qty: c.qty,
                request_id: c.request_id,
            };
            let tr = Trace::recovering(c.kind);
            let home_at = self.home_of(l, &req);
            if home_at.index != seg.index {
                continue; // indexed under another segment count: not ours to judge
            }
            let TakeoverReply::Won { epoch, home_part } =
                store.takeover(home_at, self.args(&req, &tr)).await?
            else {
                continue; // settled, renewed or taken over meanwhile
            };
            let outcome = match self
                .reconcile_as(l, &req, epoch, home_part, &tr, true)
                .await
            {
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
                outcome = ?outcome_name(&outcome), "recovered an abandoned fallback claim");
            if l.user_limit > 0 {
                let how = match outcome {
                    Done(Deduction::Replayed { .. }) => match c.kind {
                        RequestKind::Sale => Some(UserFinish::Sold),
                        RequestKind::Reservation => {
                            self.reservation_finish(l, &req, home_at).await?
                        }
                    },
                    Done(Deduction::SoldOut) | Refused(_) => Some(UserFinish::Void),
                    _ => None,
                };
                if let Some(how) = how {
                    store
                        .user_finish(&req.sku, l.generation, self.args(&req, &tr), how)
                        .await?;
                }
            }
        }
        Ok(recovered)
    }

    /// Another call holds this request's claim: wait for it to finish, or take it over once
    /// its lease ran out on the store's clock.
    pub(crate) async fn wait_for_claim(
        &self,
        l: &Layout,
        req: &Deduct,
        tr: &Trace,
    ) -> Result<Flow<Deduction>> {
        let store = &self.inner.store;
        let args = self.args(req, tr);
        let home_at = self.home_of(l, req);
        let deadline = Instant::now() + self.inner.opts.pending_wait;
        let mut pause = Duration::from_millis(1);
        loop {
            match store.takeover(home_at, args).await? {
                TakeoverReply::Replay(parts) => return Ok(Done(Deduction::Replayed { parts })),
                TakeoverReply::Gone => return Ok(Restart),
                TakeoverReply::Sealed => {
                    return Ok(Refused(Error::Sealed(req.request_id.to_string())));
                }
                TakeoverReply::Mismatch(f) => return Ok(Refused(Self::conflict(req, f))),
                TakeoverReply::Won { epoch, home_part } => {
                    return self.reconcile_as(l, req, epoch, home_part, tr, false).await;
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

    /// After a takeover: fence every other segment, count what the previous holder took, and
    /// either settle it (it was complete) or refund it and — unless `cancel` — serve the
    /// request afresh. With `cancel` (a verified-void per-user claim, or an abandoned claim the
    /// sweeper recovers) an incomplete request is refunded and sealed.
    pub(crate) async fn reconcile_as(
        &self,
        l: &Layout,
        req: &Deduct,
        epoch: u64,
        home_part: u64,
        tr: &Trace,
        cancel: bool,
    ) -> Result<Flow<Deduction>> {
        let store = &self.inner.store;
        let args = self.args(req, tr);
        let home_at = self.home_of(l, req);
        let home = home_at.index;
        let fences = others(home, l.segments)
            .map(|j| async move { (j, store.fence(self.seg(l, &req.sku, j), args, epoch).await) });
        let mut parts = Vec::new();
        if home_part > 0 {
            parts.push(Part {
                segment: home,
                units: home_part,
            });
        }
        let mut taken_by_other = None;
        for (j, r) in futures::future::join_all(fences).await {
            match r? {
                FenceReply::Clear => {}
                FenceReply::Applied { part } if part > 0 => parts.push(Part {
                    segment: j,
                    units: part,
                }),
                FenceReply::Applied { .. } => {}
                FenceReply::Fenced => return Ok(Done(Deduction::InFlight)),
                FenceReply::Mismatch(f) => taken_by_other = Some(f),
            }
        }
        if let Some(f) = taken_by_other {
            // A live part of another request under this id: this one can never complete. Give
            // back what it took and seal it, rather than leave its units stranded.
            return self
                .give_up(l, req, epoch, &parts, tr, f, SettleAs::Seal)
                .await;
        }
        let taken: u64 = parts.iter().map(|p| p.units).sum();
        if taken == req.qty {
            parts.sort();
            return Ok(
                match store
                    .settle(home_at, args, epoch, SettleAs::Applied(&parts))
                    .await?
                {
                    SettleReply::Ok => Done(Deduction::Replayed { parts }),
                    SettleReply::Applied(parts) => Done(Deduction::Replayed { parts }),
                    // A newer holder took over (or released) meanwhile: it decides.
                    SettleReply::Superseded | SettleReply::Gone => Done(Deduction::InFlight),
                },
            );
        }
        self.refund_all(l, req, epoch, &parts, tr).await?;
        if cancel {
            return Ok(
                match store.settle(home_at, args, epoch, SettleAs::Seal).await? {
                    SettleReply::Ok | SettleReply::Gone => Done(Deduction::SoldOut),
                    SettleReply::Applied(parts) => Done(Deduction::Replayed { parts }),
                    SettleReply::Superseded => Done(Deduction::InFlight),
                },
            );
        }
        self.fallback(l, req, epoch, tr).await
    }
}
