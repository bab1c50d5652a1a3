//! Putting stock in: [`load`](Engine::load) (a new generation, split over the segments) and
//! [`restock`](Engine::restock) (once per request id, spread over the segments).

use super::deduct::STALE_RETRIES;
use super::{Engine, LoadOptions, Restocked, seg_at};
use crate::error::{Error, Result};
use crate::ids::{MAX_SEGMENTS, MAX_UNITS, RequestId, Sku, check_qty};
use crate::segments::split;
use crate::store::{IfLoaded, LoadBegin, LoadSpec, RestockReply, SegmentLoad, Store};

impl<S: Store> Engine<S> {
    /// Loads `sku` with `total` units split over `opts.segments` (sizes differ by at most
    /// one). Refuses an existing SKU unless `opts.replace`; a replace starts a new generation:
    /// stock, counters and request records of the old one no longer count. Returns the new
    /// generation.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for bad figures; [`Error::AlreadyLoaded`]; [`Error::NotReady`]
    /// when another load overtook this one; store errors.
    pub async fn load(&self, sku: &Sku, total: u64, opts: LoadOptions) -> Result<u64> {
        let LoadOptions {
            segments,
            replace,
            per_user_limit,
            outbox,
        } = opts;
        let outbox = outbox.unwrap_or(self.inner.opts.outbox);
        let per_user_limit = per_user_limit.unwrap_or(self.inner.opts.per_user_limit);
        if per_user_limit > MAX_UNITS {
            return Err(Error::invalid(
                "per_user_limit",
                format!("must be at most {MAX_UNITS}"),
            ));
        }
        if segments == 0 || segments > MAX_SEGMENTS {
            return Err(Error::invalid(
                "segments",
                format!("must be in 1..={MAX_SEGMENTS}"),
            ));
        }
        if total > MAX_UNITS {
            return Err(Error::invalid(
                "stock",
                format!("must be at most {MAX_UNITS}"),
            ));
        }
        let store = &self.inner.store;
        let (generation, old, replaces, placement) = match store
            .load_begin(
                sku,
                LoadSpec {
                    segments,
                    total,
                    if_loaded: if replace {
                        IfLoaded::Replace
                    } else {
                        IfLoaded::Refuse
                    },
                    user_limit: per_user_limit,
                    outbox,
                },
            )
            .await?
        {
            LoadBegin::Exists { generation } => {
                return Err(Error::AlreadyLoaded {
                    sku: sku.to_string(),
                    generation,
                });
            }
            LoadBegin::Started {
                generation,
                old_segments,
                old_generation,
                placement,
            } => (generation, old_segments, old_generation, placement),
        };
        self.inner.layouts.remove(sku);
        self.saw(sku, generation);
        let amounts = split(total, segments);
        let at = |index| seg_at(sku, generation, index, &placement);
        let writes = amounts.iter().enumerate().map(|(i, units)| {
            store.load_segment(
                at(i as u32),
                SegmentLoad {
                    units: *units,
                    outbox,
                    replaces,
                    user_limit: per_user_limit,
                },
            )
        });
        let written = futures::future::try_join_all(writes).await?;
        // A concurrent load of a newer generation wrote some segment first: it wins (its
        // segments are never overwritten by ours), and this load is overtaken.
        if written.contains(&false) {
            return Err(Error::NotReady(sku.to_string()));
        }
        let drops = (segments..old).map(|i| store.drop_segment(at(i), replaces));
        futures::future::try_join_all(drops).await?;
        if !store.load_commit(sku, generation).await? {
            // Overtaken by a newer load (which replaces or drops these segments), or the
            // metadata is gone: Redis lost its data while this load ran, and its segments
            // reached the empty server. Then nothing names them, and a retry with fewer
            // segments would not drop the ones beyond its count: delete what this load wrote
            // (a segment a newer load holds is kept). Best effort: a failure leaves only
            // segments no layout can sell from.
            if matches!(store.meta(sku).await, Ok(None)) {
                let ours = (0..segments).map(|i| {
                    let newer = seg_at(sku, generation + 1, i, &placement);
                    store.drop_segment(newer, generation)
                });
                let _ = futures::future::join_all(ours).await;
            }
            return Err(Error::NotReady(sku.to_string()));
        }
        Ok(generation)
    }

    /// Adds `qty` units, spread evenly over the segments (shares differ by at most one, the
    /// larger ones starting at the request's home segment), once per `request_id`. Local
    /// hints are refreshed, so the units sell at once.
    ///
    /// # Errors
    /// [`Error::InvalidInput`]; [`Error::RequestIdConflict`] (same id, other quantity);
    /// [`Error::NotLoaded`]; store errors (retry with the same id).
    pub async fn restock(&self, sku: &Sku, qty: u64, request_id: &RequestId) -> Result<Restocked> {
        check_qty("qty", qty, MAX_UNITS)?;
        for _ in 0..STALE_RETRIES {
            let l = self.layout(sku).await?;
            // The request's home segment gets the first (never empty) share and is written
            // first: a retry with another quantity is caught there, before anything changes.
            // Where the restock starts: any stable spread of request ids will do.
            let home = (crate::segments::fnv1a(request_id.as_str().as_bytes())
                % u64::from(l.segments)) as u32;
            let shares: Vec<(u32, u64)> = split(qty, l.segments)
                .into_iter()
                .enumerate()
                .map(|(k, a)| ((home + k as u32) % l.segments, a))
                .filter(|(_, a)| *a > 0)
                .collect();
            let record_ttl_ms = self.inner.opts.request_ttl.as_millis() as u64;
            let call = |(index, units): (u32, u64)| {
                let seg = l.seg(index);
                async move {
                    let r = self
                        .inner
                        .store
                        .restock(seg, request_id, units, qty, record_ttl_ms)
                        .await;
                    (index, units, r)
                }
            };
            let mut results = vec![call(shares[0]).await];
            if matches!(
                results[0].2,
                Ok(RestockReply::Restocked { .. } | RestockReply::Replay { .. })
            ) {
                results
                    .extend(futures::future::join_all(shares[1..].iter().copied().map(call)).await);
            }
            let mut added = 0;
            let mut stale = false;
            let mut all_replay = true;
            for (i, units, r) in results {
                match r? {
                    RestockReply::Restocked { stock_after } => {
                        l.hints.observe(i, stock_after);
                        added += units;
                        all_replay = false;
                    }
                    RestockReply::Replay { stock } => l.hints.observe(i, stock),
                    RestockReply::Mismatch => {
                        return Err(Error::RequestIdConflict {
                            request_id: request_id.to_string(),
                            field: "qty",
                        });
                    }
                    RestockReply::Stale => stale = true,
                }
            }
            if stale {
                self.forget(&l);
                continue;
            }
            return Ok(Restocked {
                added,
                replayed: all_replay,
            });
        }
        Err(Error::NotReady(sku.to_string()))
    }
}
