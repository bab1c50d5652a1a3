//! Reservations (pre-deduction): [`Engine::reserve`] holds units in one segment for a
//! while; [`Engine::confirm`] sells them, [`Engine::cancel`] gives them back, and expiry gives
//! them back by itself (lazily inside every script, and in bulk by the sweeper).

use crate::engine::{Attempt, Deduct, Deduction, Engine, Intent, seg_at};
use crate::error::{Error, Result};
use crate::ids::{MAX_SEGMENTS, RequestId, Sku, UserId};
use crate::segments::Part;
use crate::store::{RecordState, RequestKind, ReserveEnd, ResvState, SegAddr, Store, UserFinish};
use std::time::Duration;

/// The outcome of [`Engine::reserve`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Reserved {
    /// Held now; confirm or cancel it with `id`.
    Held {
        /// Reservation id: `<sku>~<generation>~<segment>~<request id>`.
        id: String,
        /// Where the units are held.
        parts: Vec<Part>,
    },
    /// This request id reserved before; same reservation.
    Replayed {
        /// Reservation id.
        id: String,
        /// Where the units are held.
        parts: Vec<Part>,
    },
    /// Nothing held: sold out, insufficient, limit reached, in flight, ...
    NotHeld(Deduction),
}

/// The outcome of [`Engine::confirm`] / [`Engine::cancel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ReservationEnd {
    /// The reservation's state now (`None`: no such reservation).
    pub state: Option<ResvState>,
    /// This call (or an earlier one with the same intent) brought it there; false when it had
    /// ended otherwise (e.g. confirming an expired reservation: nothing sold).
    pub done: bool,
}

impl<S: Store> Engine<S> {
    /// Reserves `req.qty` units for `ttl` (pre-deduction): they leave the sellable stock at
    /// once and become sold on [`confirm`](Self::confirm), or go back on
    /// [`cancel`](Self::cancel) — and by themselves, exactly once, when `ttl` passes
    /// unconfirmed (on the store's clock). Idempotent by request id like [`deduct`](Self::deduct);
    /// counts against the per-user limit until cancelled or expired. A reservation is held in
    /// one segment (so its expiry and its units are decided atomically); a quantity no single
    /// segment holds is answered `Insufficient`.
    ///
    /// # Errors
    /// As [`deduct`](Self::deduct); [`Error::Config`] when the store's strategy is an unsafe
    /// baseline (reservations need `lua`, `lock` or `redlock`); [`Error::InvalidInput`] for a
    /// zero or over-long `ttl`.
    pub async fn reserve(&self, req: &Deduct, ttl: Duration) -> Result<Reserved> {
        let strategy = self.store().strategy();
        if !matches!(
            strategy,
            crate::Strategy::Lua | crate::Strategy::Lock | crate::Strategy::Redlock
        ) {
            return Err(Error::Config(format!(
                "reservations need the lua, lock or redlock strategy, not {strategy}"
            )));
        }
        let ms = ttl.as_millis() as u64;
        if ms == 0 || ttl > self.options().request_ttl {
            return Err(Error::invalid(
                "ttl",
                "must be at least 1 ms and at most the request TTL",
            ));
        }
        // The generation the units are held in (not a re-read layout: a reload may have
        // happened since).
        let (d, generation) = self.metered(req, Intent::Reserve { ttl_ms: ms }).await?;
        let id = |parts: &[Part]| {
            let seg = parts.first().map_or(0, |p| p.segment);
            format!("{}~{}~{}~{}", req.sku, generation, seg, req.request_id)
        };
        Ok(match d {
            Deduction::Applied { parts } => {
                crate::metrics::reservation("created");
                Reserved::Held {
                    id: id(&parts),
                    parts,
                }
            }
            Deduction::Replayed { parts } => Reserved::Replayed {
                id: id(&parts),
                parts,
            },
            other => Reserved::NotHeld(other),
        })
    }

    /// Confirms a reservation: its units become sold. Confirming one that expired or was
    /// cancelled sells nothing and says so; confirming twice is harmless.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed id; store errors (retry: it is idempotent).
    pub async fn confirm(&self, reservation: &str) -> Result<ReservationEnd> {
        self.end_reservation(reservation, true).await
    }

    /// Cancels a reservation: its units go back to their segment and the user's chance comes
    /// back. Cancelling twice is harmless; a confirmed one cannot be cancelled.
    ///
    /// # Errors
    /// As [`confirm`](Self::confirm).
    pub async fn cancel(&self, reservation: &str) -> Result<ReservationEnd> {
        self.end_reservation(reservation, false).await
    }

    pub(crate) async fn end_reservation(
        &self,
        reservation: &str,
        confirm: bool,
    ) -> Result<ReservationEnd> {
        let bad = || {
            Error::invalid(
                "reservation",
                "expected <sku>~<generation>~<segment>~<request id>",
            )
        };
        let mut it = reservation.splitn(4, '~');
        let (Some(sku), Some(generation), Some(seg), Some(rid)) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(bad());
        };
        let sku = Sku::new(sku)?;
        let rid = RequestId::new(rid)?;
        let generation: u64 = generation.parse().map_err(|_| bad())?;
        let index: u32 = seg.parse().map_err(|_| bad())?;
        if index >= MAX_SEGMENTS {
            return Err(bad());
        }
        let at = seg_at(&sku, generation, index);
        let (state, changed, user, units) =
            match self.store().reserve_end(at, &rid, Some(confirm)).await? {
                ReserveEnd::Done { state, user, units } => (state, true, user, units),
                ReserveEnd::Ended { state, user, units } => (state, false, user, units),
                ReserveEnd::Unknown | ReserveEnd::Stale => {
                    return Ok(ReservationEnd {
                        state: None,
                        done: false,
                    });
                }
            };
        let done = changed
            && state
                == if confirm {
                    ResvState::Confirmed
                } else {
                    ResvState::Cancelled
                };
        // The user's record follows (idempotent; a crash here is repaired when the user next
        // reaches the limit, by verify_stale).
        if let Ok(user) = UserId::new(&user)
            && units > 0
        {
            let how = match state {
                ResvState::Confirmed => Some(UserFinish::Sold),
                ResvState::Cancelled | ResvState::Expired => Some(UserFinish::Void),
                ResvState::Reserved => None,
            };
            if let Some(how) = how {
                let req = Deduct {
                    sku: sku.clone(),
                    user: user.clone(),
                    qty: units,
                    request_id: rid.clone(),
                };
                let args = self.req_args(&req, Intent::Finish(RequestKind::Reservation));
                self.store()
                    .user_finish(&sku, generation, args, how)
                    .await?;
                if how == UserFinish::Void {
                    self.guard().forget(&sku, &user);
                }
            }
        }
        if done {
            crate::metrics::reservation(if confirm { "confirmed" } else { "cancelled" });
        }
        Ok(ReservationEnd {
            state: Some(state),
            done,
        })
    }

    /// What the per-user entry of the reservation `a` attempts should become, from its state.
    pub(crate) async fn reservation_finish(&self, a: &Attempt<'_>) -> Result<Option<UserFinish>> {
        Ok(match self.reservation_state(a).await? {
            None | Some(ResvState::Expired | ResvState::Cancelled) => Some(UserFinish::Void),
            Some(ResvState::Confirmed) => Some(UserFinish::Sold),
            Some(ResvState::Reserved) => Some(UserFinish::Reserved),
        })
    }

    /// The state of the reservation `a` attempts, where it lives (its home record's part).
    async fn reservation_state(&self, a: &Attempt<'_>) -> Result<Option<ResvState>> {
        let rid = &a.req.request_id;
        let Some(rec) = self.store().record(a.home_at(), rid).await? else {
            return Ok(None);
        };
        let parts = match rec.state {
            RecordState::Applied(parts) => parts,
            RecordState::Pending { .. } => return Ok(Some(ResvState::Reserved)), // being placed
            RecordState::Sealed => return Ok(None),
        };
        let Some(part) = parts.first() else {
            return Ok(None);
        };
        Ok(
            match self
                .store()
                .reserve_end(a.at(part.segment), rid, None)
                .await?
            {
                ReserveEnd::Done { state, .. } | ReserveEnd::Ended { state, .. } => Some(state),
                ReserveEnd::Unknown | ReserveEnd::Stale => None,
            },
        )
    }

    /// Gives back the expired reservations of segment `seg`: (units given back, units still
    /// reserved there).
    pub(crate) async fn reclaim_expired(&self, seg: SegAddr<'_>) -> Result<(u64, u64)> {
        let mut back = 0;
        // Each call returns at most one batch (64 reservations): repeat while it finds some.
        for _ in 0..1000 {
            let (units, held) = self.store().reclaim(seg).await?;
            back += units;
            if units == 0 {
                return Ok((back, held));
            }
        }
        Ok((back, 0))
    }
}
