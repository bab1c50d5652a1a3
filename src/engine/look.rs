//! Looking at the stock without writing: [`Engine::remaining`] (the status) and
//! [`Engine::audit`] read every segment with [`Store::peek`] (`peek.lua`, a `no-writes`
//! script), so both answer while a master refuses writes. Reservations past their expiry are
//! not returned by a look: they are counted as expired, on their way back to stock (the next
//! step that writes at their segment, a sale included, returns them first; so the status
//! counts them as sellable, and the audit shows them inside `reserved` with `expired` saying
//! how many).
//!
//! Each look also sets the SKU's stock gauges (sellable per segment and in total, in transit,
//! held by live reservations: [`crate::metrics`]), so the gauges show what the last full read
//! of the store saw: the same figures `status` answers.

use super::{Engine, Remaining, seg_at};
use crate::error::{Error, Result};
use crate::ids::Sku;
use crate::store::{Meta, Store, Survey};

/// Reads a SKU's segments are retried when a reload replaced them between the metadata read
/// and the segment reads.
const RELOAD_RETRIES: usize = 4;

impl<S: Store> Engine<S> {
    /// Units left, in total and per segment, units in transit and units of expired
    /// reservations on their way back (one read of every segment; nothing is written).
    ///
    /// # Errors
    /// [`Error::NotLoaded`], [`Error::NotReady`], store errors.
    pub async fn remaining(&self, sku: &Sku) -> Result<Remaining> {
        for _ in 0..RELOAD_RETRIES {
            let (_, segs) = self.look(sku, false).await?;
            let Some(segs) = segs.into_iter().collect::<Option<Vec<Survey>>>() else {
                continue; // a reload replaced a segment: read the new generation
            };
            let per_segment: Vec<u64> = segs.iter().map(|s| s.state.stock + s.expired).collect();
            let (out, inn) = segs.iter().fold((0u64, 0u64), |(o, i), s| {
                (o + s.state.moved_out, i + s.state.moved_in)
            });
            let expired: u64 = segs.iter().map(|s| s.expired).sum();
            let r = Remaining {
                total: per_segment.iter().sum(),
                per_segment,
                in_transit: out.saturating_sub(inn),
                // Saturating: a `reserved` counter below its expired holds (a segment the
                // audit fails) must still be shown, not panic.
                reserved: segs
                    .iter()
                    .map(|s| s.state.reserved)
                    .sum::<u64>()
                    .saturating_sub(expired),
                expired,
            };
            crate::metrics::stock(
                &self.inner.sku_labels,
                sku.as_str(),
                &r.per_segment,
                r.in_transit,
                r.reserved,
            );
            return Ok(r);
        }
        Err(Error::NotReady(sku.to_string()))
    }

    /// Checks conservation for `sku`; see [`Audit`](crate::Audit). A failed check is a report,
    /// not an error. Writes nothing.
    ///
    /// # Errors
    /// [`Error::NotLoaded`], [`Error::NotReady`], store errors.
    pub async fn audit(&self, sku: &Sku) -> Result<crate::Audit> {
        let (meta, segs) = self.look(sku, true).await?;
        let a = crate::Audit::check(sku, &meta, &segs);
        if segs.iter().all(Option::is_some) {
            let per_segment = a.sellable_per_segment();
            crate::metrics::stock(
                &self.inner.sku_labels,
                sku.as_str(),
                &per_segment,
                a.in_transit,
                a.live_reserved(),
            );
        }
        Ok(a)
    }

    /// The SKU's metadata and a [`Store::peek`] of each of its segments (`None`: missing or of
    /// another generation). Segments are read one by one, so a transfer between two reads
    /// would show a debit without its credit (or the reverse): read until two reads agree on
    /// what moved (at most 8 more).
    async fn look(&self, sku: &Sku, detail: bool) -> Result<(Meta, Vec<Option<Survey>>)> {
        let store = &self.inner.store;
        let meta = store
            .meta(sku)
            .await?
            .ok_or_else(|| Error::NotLoaded(sku.to_string()))?;
        if !meta.ready {
            return Err(Error::NotReady(sku.to_string()));
        }
        self.saw(sku, meta.generation);
        let at = |index| seg_at(sku, meta.generation, index, &meta.placement);
        let read = || {
            let reads = (0..meta.segments).map(|index| store.peek(at(index), detail));
            futures::future::try_join_all(reads)
        };
        let moved = |v: &[Option<Survey>]| -> Vec<Option<(u64, u64)>> {
            v.iter()
                .map(|s| s.map(|s| (s.state.moved_out, s.state.moved_in)))
                .collect()
        };
        let mut segs = read().await?;
        for _ in 0..8 {
            let again = read().await?;
            let same = moved(&again) == moved(&segs);
            segs = again;
            if same {
                break;
            }
        }
        Ok((meta, segs))
    }
}
