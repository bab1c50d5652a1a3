//! The claim holder's path: the home segment was short, so the request's claim is ours (with
//! some epoch); try the other segments, then a fresh read and a split across segments; end by
//! settling the claim as applied or releasing it. Everything taken under the claim is
//! refunded when the request cannot complete.

use super::deduct::{Done, Flow, Refused, Stale};
use super::{Attempt, Deduction, Engine};
use crate::error::Result;
use crate::router::{others, plan_split};
use crate::segments::Part;
use crate::store::{SegmentRole, SettleAs, SettleReply, Store, TakeReply, TakeoverReply};

impl<S: Store> Engine<S> {
    /// The claim holder's path: other segments, then a fresh read, then an all-or-nothing
    /// multi-segment take. Ends by settling (applied) or releasing the claim.
    pub(super) async fn fallback(&self, a: &Attempt<'_>, epoch: u64) -> Result<Flow> {
        let store = &self.inner.store;
        let (l, qty) = (a.layout, a.req.qty);

        // 1. Whole quantity from one other segment, skipping fresh "short" hints.
        for j in others(a.home, l.segments) {
            if l.hints.likely_short(j, qty) {
                crate::metrics::empty_skip();
                continue;
            }
            a.tried();
            match store
                .take(a.at(j), a.args, qty, epoch, SegmentRole::Fallback)
                .await?
            {
                TakeReply::Taken { stock_after, part } => {
                    l.hints.observe(j, stock_after);
                    let parts = [Part {
                        segment: j,
                        units: part,
                    }];
                    return self.settle(a, epoch, &parts).await;
                }
                TakeReply::Short { stock } => l.hints.observe(j, stock),
                TakeReply::Superseded => return self.superseded(a).await,
                TakeReply::Mismatch(f) => {
                    return self.give_up(a, epoch, &[], f, SettleAs::Release).await;
                }
                TakeReply::Stale => return Ok(Stale),
            }
        }

        // 2. Read everything; then one segment if any can, else all or nothing across several.
        let mut available = 0;
        let mut too_large = None;
        for _ in 0..self.inner.opts.fallback_rounds {
            let segs = self.read_segments(l).await?;
            let Some(stocks) = l.observe(&segs) else {
                return Ok(Stale);
            };
            available = stocks.iter().sum();
            if available < qty {
                break;
            }
            let single = std::iter::once(a.home)
                .chain(others(a.home, l.segments))
                .find(|j| stocks[*j as usize] >= qty);
            let plan = match single {
                Some(j) => vec![(j, qty)],
                // A reservation lives in one segment, so that its expiry and its units are
                // decided in one atomic step (see reserve_end.lua). Larger than any segment
                // is (its load and restocks): never; else units may come back to one.
                None if a.intent.hold_ms() > 0 => {
                    let largest_segment = segs
                        .iter()
                        .flatten()
                        .map(|s| s.loaded + s.restocked)
                        .max()
                        .unwrap_or(0);
                    if qty > largest_segment {
                        too_large = Some(largest_segment);
                    }
                    break;
                }
                None => plan_split(&stocks, qty).unwrap_or_default(),
            };
            let mut parts = Vec::with_capacity(plan.len());
            let mut complete = true;
            if plan.len() > 1 {
                crate::metrics::multi_segment();
            }
            for (j, want) in plan {
                a.tried();
                match store
                    .take(a.at(j), a.args, want, epoch, SegmentRole::of(j, a.home))
                    .await?
                {
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
                    TakeReply::Superseded => return self.superseded(a).await,
                    TakeReply::Mismatch(f) => {
                        return self.give_up(a, epoch, &parts, f, SettleAs::Release).await;
                    }
                    TakeReply::Stale => return Ok(Stale),
                }
            }
            if complete && parts.iter().map(|p| p.units).sum::<u64>() == qty {
                parts.sort();
                return self.settle(a, epoch, &parts).await;
            }
            self.refund_all(a, epoch, &parts).await?;
        }

        // 3. Nothing sold: release the claim so the request id stays free.
        match store
            .settle(a.home_at(), a.args, epoch, SettleAs::Release)
            .await?
        {
            SettleReply::Ok | SettleReply::Gone => {}
            SettleReply::Applied(parts) => return Ok(Done(Deduction::Replayed { parts })),
            SettleReply::Superseded => return Ok(Done(Deduction::InFlight)),
        }
        Ok(Done(if let Some(largest_segment) = too_large {
            Deduction::TooLargeToHold { largest_segment }
        } else if available == 0 {
            Deduction::SoldOut
        } else {
            Deduction::Insufficient { available }
        }))
    }

    /// Gives back every part taken under the claim with `epoch` (or an older one).
    pub(super) async fn refund_all(
        &self,
        a: &Attempt<'_>,
        epoch: u64,
        parts: &[Part],
    ) -> Result<()> {
        let store = &self.inner.store;
        let refunds = parts.iter().map(|p| {
            store.refund(
                a.at(p.segment),
                a.args,
                epoch,
                SegmentRole::of(p.segment, a.home),
            )
        });
        let back = futures::future::try_join_all(refunds).await?;
        for (p, _) in parts.iter().zip(back) {
            a.layout.hints.forget(p.segment); // stock came back: don't skip it
        }
        Ok(())
    }

    /// The claim holder met a live part of another request under this id at some segment
    /// (its request id is taken): refund what it took, end the claim `how` (released; or
    /// sealed, when an older holder of it must never complete it), refuse.
    pub(super) async fn give_up(
        &self,
        a: &Attempt<'_>,
        epoch: u64,
        parts: &[Part],
        field: &'static str,
        how: SettleAs<'_>,
    ) -> Result<Flow> {
        self.refund_all(a, epoch, parts).await?;
        let ended = self
            .inner
            .store
            .settle(a.home_at(), a.args, epoch, how)
            .await?;
        Ok(match ended {
            SettleReply::Ok | SettleReply::Gone => Refused(a.conflict(field)),
            SettleReply::Applied(parts) => Done(Deduction::Replayed { parts }),
            SettleReply::Superseded => Done(Deduction::InFlight),
        })
    }

    /// Settles the claim as applied with `parts`.
    async fn settle(&self, a: &Attempt<'_>, epoch: u64, parts: &[Part]) -> Result<Flow> {
        Ok(
            match self
                .inner
                .store
                .settle(a.home_at(), a.args, epoch, SettleAs::Applied(parts))
                .await?
            {
                SettleReply::Ok => Done(Deduction::Applied {
                    parts: parts.to_vec(),
                }),
                SettleReply::Applied(parts) => Done(Deduction::Replayed { parts }),
                // A newer holder shut us out (and counts our parts), or released the claim
                // after refunding them: either way our parts are not ours to report.
                SettleReply::Superseded | SettleReply::Gone => Done(Deduction::InFlight),
            },
        )
    }

    /// Our claim was taken over while we worked: report what the record says now.
    async fn superseded(&self, a: &Attempt<'_>) -> Result<Flow> {
        Ok(
            match self.inner.store.takeover(a.home_at(), a.args).await? {
                TakeoverReply::Replay(parts) => Done(Deduction::Replayed { parts }),
                TakeoverReply::Mismatch(f) => return Err(a.conflict(f)),
                _ => Done(Deduction::InFlight),
            },
        )
    }
}
