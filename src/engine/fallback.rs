//! The claim holder path.

use super::*;

impl<S: Store> Engine<S> {
    pub(crate) async fn refund_all(
        &self,
        l: &Layout,
        req: &Deduct,
        epoch: u64,
        parts: &[Part],
        tr: &Trace,
    ) -> Result<()> {
        let store = &self.inner.store;
        let args = self.args(req, tr);
        let home = home(&req.request_id, l.segments);
        let refunds = parts.iter().map(|p| {
            store.refund(
                self.seg(l, &req.sku, p.segment),
                args,
                epoch,
                p.segment == home,
            )
        });
        let back = futures::future::try_join_all(refunds).await?;
        for (p, _) in parts.iter().zip(back) {
            l.hints.forget(p.segment); // stock came back: don't skip it
        }
        Ok(())
    }

    /// The claim holder's path: other segments, then a fresh read, then an all-or-nothing
    /// multi-segment take. Ends by settling (applied) or releasing the claim.
    pub(crate) async fn fallback(
        &self,
        l: &Layout,
        req: &Deduct,
        epoch: u64,
        tr: &Trace,
    ) -> Result<Flow<Deduction>> {
        let store = &self.inner.store;
        let args = self.args(req, tr);
        let qty = req.qty;
        let home_at = self.home_of(l, req);
        let home = home_at.index;
        let at = |index| self.seg(l, &req.sku, index);

        // 1. Whole quantity from one other segment, skipping fresh "short" hints.
        for j in others(home, l.segments) {
            if l.hints.likely_short(j, qty) {
                crate::metrics::empty_skip();
                continue;
            }
            tr.attempt();
            match store.take(at(j), args, qty, epoch, false).await? {
                TakeReply::Taken { stock_after, part } => {
                    l.hints.observe(j, stock_after);
                    let parts = [Part {
                        segment: j,
                        units: part,
                    }];
                    return self.settle(l, req, epoch, &parts, tr).await;
                }
                TakeReply::Short { stock } => l.hints.observe(j, stock),
                TakeReply::Fenced => return self.superseded(l, req, tr).await,
                TakeReply::Mismatch(f) => {
                    return self
                        .give_up(l, req, epoch, &[], tr, f, SettleAs::Release)
                        .await;
                }
                TakeReply::Stale => return Ok(Stale),
            }
        }

        // 2. Read everything; then one segment if any can, else all or nothing across several.
        let mut available = 0;
        for _ in 0..self.inner.opts.fallback_rounds {
            let segs = self.read_segments(l, &req.sku).await?;
            let Some(stocks) = observe(l, &segs) else {
                return Ok(Stale);
            };
            available = stocks.iter().map(|(_, s)| s).sum();
            if available < qty {
                break;
            }
            let single = std::iter::once(home)
                .chain(others(home, l.segments))
                .find(|j| stocks[*j as usize].1 >= qty);
            let plan = match single {
                Some(j) => vec![(j, qty)],
                // A reservation lives in one segment, so that its expiry and its units are
                // decided in one atomic step (see reserve_end.lua).
                None if tr.resv > 0 => break,
                None => plan_split(&stocks, qty).unwrap_or_default(),
            };
            let mut parts = Vec::with_capacity(plan.len());
            let mut complete = true;
            if plan.len() > 1 {
                crate::metrics::multi_segment();
            }
            for (j, want) in plan {
                tr.attempt();
                match store.take(at(j), args, want, epoch, j == home).await? {
                    TakeReply::Taken { stock_after, part } => {
                        l.hints.observe(j, stock_after);
                        parts.push(Part {
                            segment: j,
                            units: part,
                        });
                    }
                    TakeReply::Short { stock } => {
                        l.hints.observe(j, stock);
                        complete = false;
                        break;
                    }
                    TakeReply::Fenced => return self.superseded(l, req, tr).await,
                    TakeReply::Mismatch(f) => {
                        return self
                            .give_up(l, req, epoch, &parts, tr, f, SettleAs::Release)
                            .await;
                    }
                    TakeReply::Stale => return Ok(Stale),
                }
            }
            if complete && parts.iter().map(|p| p.units).sum::<u64>() == qty {
                parts.sort();
                return self.settle(l, req, epoch, &parts, tr).await;
            }
            self.refund_all(l, req, epoch, &parts, tr).await?;
        }

        // 3. Nothing sold: release the claim so the request id stays free.
        match store
            .settle(home_at, args, epoch, SettleAs::Release)
            .await?
        {
            SettleReply::Ok | SettleReply::Gone => {}
            SettleReply::Applied(parts) => return Ok(Done(Deduction::Replayed { parts })),
            SettleReply::Superseded => return Ok(Done(Deduction::InFlight)),
        }
        Ok(Done(if available == 0 {
            Deduction::SoldOut
        } else {
            Deduction::Insufficient { available }
        }))
    }

    /// The claim holder met a live part of another request under this id at some segment
    /// (its request id is taken): refund what it took, end the claim `how` (released; or
    /// sealed, when an older holder of it must never complete it), refuse.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn give_up(
        &self,
        l: &Layout,
        req: &Deduct,
        epoch: u64,
        parts: &[Part],
        tr: &Trace,
        field: &'static str,
        how: SettleAs<'_>,
    ) -> Result<Flow<Deduction>> {
        self.refund_all(l, req, epoch, parts, tr).await?;
        let ended = self
            .inner
            .store
            .settle(self.home_of(l, req), self.args(req, tr), epoch, how)
            .await?;
        Ok(match ended {
            SettleReply::Ok | SettleReply::Gone => Refused(Self::conflict(req, field)),
            SettleReply::Applied(parts) => Done(Deduction::Replayed { parts }),
            SettleReply::Superseded => Done(Deduction::InFlight),
        })
    }

    pub(crate) async fn settle(
        &self,
        l: &Layout,
        req: &Deduct,
        epoch: u64,
        parts: &[Part],
        tr: &Trace,
    ) -> Result<Flow<Deduction>> {
        let home_at = self.home_of(l, req);
        Ok(
            match self
                .inner
                .store
                .settle(home_at, self.args(req, tr), epoch, SettleAs::Applied(parts))
                .await?
            {
                SettleReply::Ok => Done(Deduction::Applied {
                    parts: parts.to_vec(),
                }),
                SettleReply::Applied(parts) => Done(Deduction::Replayed { parts }),
                // A newer holder fenced us (and counts our parts), or released the claim after
                // refunding them: either way our parts are not ours to report.
                SettleReply::Superseded | SettleReply::Gone => Done(Deduction::InFlight),
            },
        )
    }

    /// Our claim was taken over while we worked: report what the record says now.
    pub(crate) async fn superseded(
        &self,
        l: &Layout,
        req: &Deduct,
        tr: &Trace,
    ) -> Result<Flow<Deduction>> {
        let home_at = self.home_of(l, req);
        Ok(
            match self
                .inner
                .store
                .takeover(home_at, self.args(req, tr))
                .await?
            {
                TakeoverReply::Replay(parts) => Done(Deduction::Replayed { parts }),
                TakeoverReply::Mismatch(f) => return Err(Self::conflict(req, f)),
                _ => Done(Deduction::InFlight),
            },
        )
    }
}
