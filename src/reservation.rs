//! Reservations (pre-deduction): [`Engine::reserve`] holds units at the request's home
//! segment for a while; [`Engine::confirm`] sells them, [`Engine::cancel`] gives them back, and
//! expiry gives them back by itself (inside every script of the segment, and in bulk by the
//! sweeper). The reservation, its user's ledger and its units live in one segment, so each of
//! those endings is one atomic step.

use crate::engine::{Deduct, Deduction, Engine, Intent};
use crate::error::{Error, Result};
use crate::ids::{MAX_SEGMENTS, RequestId, Sku, UserId, escape, unescape};
use crate::store::{ReservationAction, ReserveEnd, ResvState, SegAddr, Store};
use std::time::Duration;

/// The largest load generation a [`ReservationId`] can name: generations are the Redis clock in
/// milliseconds, and the scripts take at most 15 digits (past the year 33000).
pub const MAX_GENERATION: u64 = 999_999_999_999_999;

/// A reservation's id: where its units are held (SKU, load generation, segment) and the
/// request that made it (user and request id). Its text form,
/// `<sku>~<generation>~<segment>~<user>~<request id>`, is what the HTTP API and the CLI show and
/// take; a `!`, `~` or `%` in the user or request id is written `!!`, `!t`, `!p`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReservationId {
    sku: Sku,
    generation: u64,
    segment: u32,
    user: UserId,
    request_id: RequestId,
}

impl ReservationId {
    /// The id of `user`'s reservation `request_id` of `sku`, held in segment `segment` of load
    /// generation `generation`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (field `reservation`) when `segment` is not below
    /// [`MAX_SEGMENTS`] or `generation` is above [`MAX_GENERATION`].
    pub fn new(
        sku: Sku,
        generation: u64,
        segment: u32,
        user: UserId,
        request_id: RequestId,
    ) -> Result<Self> {
        if segment >= MAX_SEGMENTS || generation > MAX_GENERATION {
            return Err(Self::malformed());
        }
        Ok(Self {
            sku,
            generation,
            segment,
            user,
            request_id,
        })
    }

    /// The SKU.
    pub fn sku(&self) -> &Sku {
        &self.sku
    }

    /// The load generation the units are held in.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The segment that holds the units (the request's home).
    pub fn segment(&self) -> u32 {
        self.segment
    }

    /// The user who reserved.
    pub fn user(&self) -> &UserId {
        &self.user
    }

    /// The request that made the reservation.
    pub fn request_id(&self) -> &RequestId {
        &self.request_id
    }

    /// The segment holding the units, placed with `suffix` (see [`Engine::suffix_of`]).
    fn addr(&self, suffix: Option<u16>) -> SegAddr<'_> {
        SegAddr::new(&self.sku, self.generation, self.segment).with_suffix(suffix)
    }

    fn malformed() -> Error {
        Error::invalid(
            "reservation",
            "expected <sku>~<generation>~<segment>~<user>~<request id>",
        )
    }
}

impl std::fmt::Display for ReservationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}~{}~{}~{}~{}",
            self.sku,
            self.generation,
            self.segment,
            escape(self.user.as_str()),
            escape(self.request_id.as_str())
        )
    }
}

impl std::str::FromStr for ReservationId {
    type Err = Error;

    /// Parses the text form.
    ///
    /// # Errors
    /// [`Error::InvalidInput`]: field `sku`, `user` or `request_id` for an invalid id in it,
    /// else field `reservation`.
    fn from_str(s: &str) -> Result<Self> {
        // Exactly five parts: the ids' own `~` are escaped.
        let mut it = s.split('~');
        let (Some(sku), Some(generation), Some(segment), Some(user), Some(request_id), None) = (
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
        ) else {
            return Err(Self::malformed());
        };
        let sku = Sku::new(sku)?;
        let user = UserId::new(unescape(user).ok_or_else(Self::malformed)?)?;
        let request_id = RequestId::new(unescape(request_id).ok_or_else(Self::malformed)?)?;
        let generation = canonical(generation).ok_or_else(Self::malformed)?;
        let segment = canonical(segment).ok_or_else(Self::malformed)?;
        Self::new(sku, generation, segment, user, request_id)
    }
}

/// A number as `Display` writes it (digits, no sign, no leading zero), so that one reservation
/// has one text form: `+9` or `009` are no generation or segment.
fn canonical<T: std::str::FromStr + ToString>(s: &str) -> Option<T> {
    let n: T = s.parse().ok()?;
    (n.to_string() == s).then_some(n)
}

impl serde::Serialize for ReservationId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ReservationId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The outcome of [`Engine::reserve`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reserved {
    /// Held now; confirm or cancel it with `id`.
    Held {
        /// The reservation's id.
        id: ReservationId,
        /// The segment the units are held at: the request's home (also in `id`).
        segment: u32,
        /// Units held: the request's quantity.
        units: u64,
    },
    /// This request id reserved before; same reservation.
    Replayed {
        /// The reservation's id.
        id: ReservationId,
        /// The segment the units are held at.
        segment: u32,
        /// Units held.
        units: u64,
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

/// How [`Engine::confirm`] / [`Engine::cancel`] end a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Confirm,
    Cancel,
}

impl Ending {
    /// The state this ending brings a live reservation to.
    fn state(self) -> ResvState {
        match self {
            Ending::Confirm => ResvState::Confirmed,
            Ending::Cancel => ResvState::Cancelled,
        }
    }

    /// What the store is asked to do.
    fn action(self) -> ReservationAction {
        match self {
            Ending::Confirm => ReservationAction::Confirm,
            Ending::Cancel => ReservationAction::Cancel,
        }
    }

    /// The `event` label of the reservations metric.
    fn event(self) -> &'static str {
        match self {
            Ending::Confirm => "confirmed",
            Ending::Cancel => "cancelled",
        }
    }
}

impl<S: Store> Engine<S> {
    /// Reserves `req.qty` units for `ttl` (pre-deduction): they leave the sellable stock at
    /// once and become sold on [`confirm`](Self::confirm), or go back on
    /// [`cancel`](Self::cancel) — and by themselves, exactly once, when `ttl` passes
    /// unconfirmed (on the store's clock). Idempotent by request id like
    /// [`deduct`](Self::deduct); counts against the per-user limit until cancelled or expired.
    /// The units are held at the request's home segment (moved there first when it is
    /// short), so expiry, confirmation and the user's ledger are decided in one atomic step.
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
        let id = |segment: u32| ReservationId {
            sku: req.sku.clone(),
            generation,
            segment,
            user: req.user.clone(),
            request_id: req.request_id.clone(),
        };
        Ok(match d {
            Deduction::Applied { segment, units } => {
                crate::metrics::reservation("created");
                Reserved::Held {
                    id: id(segment),
                    segment,
                    units,
                }
            }
            Deduction::Replayed { segment, units } => Reserved::Replayed {
                id: id(segment),
                segment,
                units,
            },
            other => Reserved::NotHeld(other),
        })
    }

    /// Confirms a reservation: its units become sold. Confirming one that expired or was
    /// cancelled sells nothing and says so; confirming twice is harmless.
    ///
    /// # Errors
    /// Store errors (retry: it is idempotent).
    pub async fn confirm(&self, id: &ReservationId) -> Result<ReservationEnd> {
        self.end_reservation(id, Ending::Confirm).await
    }

    /// Cancels a reservation: its units go back to their segment and the user's chance comes
    /// back. Cancelling twice is harmless; a confirmed one cannot be cancelled.
    ///
    /// # Errors
    /// As [`confirm`](Self::confirm).
    pub async fn cancel(&self, id: &ReservationId) -> Result<ReservationEnd> {
        self.end_reservation(id, Ending::Cancel).await
    }

    async fn end_reservation(&self, id: &ReservationId, how: Ending) -> Result<ReservationEnd> {
        let suffix = self.suffix_of(&id.sku, id.generation, id.segment).await?;
        let (state, changed) = match self
            .store()
            .reserve_end(id.addr(suffix), &id.user, &id.request_id, how.action())
            .await?
        {
            ReserveEnd::Done { state, .. } => (state, true),
            ReserveEnd::Ended { state, .. } => (state, false),
            ReserveEnd::Unknown | ReserveEnd::Stale => {
                return Ok(ReservationEnd {
                    state: None,
                    done: false,
                });
            }
        };
        let done = changed && state == how.state();
        if matches!(state, ResvState::Cancelled | ResvState::Expired) {
            // The user's chance came back: the in-process guard must not hold it against them.
            self.guard().forget(&id.sku, &id.user);
        }
        if done {
            crate::metrics::reservation(how.event());
        }
        Ok(ReservationEnd {
            state: Some(state),
            done,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_their_text_form() {
        let id: ReservationId = "phone-1~1717~3~alice~r:42".parse().unwrap();
        assert_eq!(id.sku().as_str(), "phone-1");
        assert_eq!((id.generation(), id.segment()), (1717, 3));
        assert_eq!(id.user().as_str(), "alice");
        assert_eq!(id.request_id().as_str(), "r:42");
        assert_eq!(id.to_string(), "phone-1~1717~3~alice~r:42");
        // The JSON form is the same string (the HTTP API shows and takes it).
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"phone-1~1717~3~alice~r:42\"");
        assert_eq!(serde_json::from_str::<ReservationId>(&json).unwrap(), id);
        // Ids holding the separator or the escape character split back whole.
        for (user, rid) in [
            ("a~b", "r~1%7E"),
            ("%", "~!"),
            ("!t", "!"),
            ("Zoë@x.io", "o+1/2"),
        ] {
            let id = ReservationId::new(
                Sku::new("s").unwrap(),
                9,
                0,
                UserId::new(user).unwrap(),
                RequestId::new(rid).unwrap(),
            )
            .unwrap();
            let text = id.to_string();
            assert_eq!(text.matches('~').count(), 4, "{text}");
            assert!(!text.contains('%'), "{text}");
            assert_eq!(text.parse::<ReservationId>().unwrap(), id, "{text}");
        }
        for bad in ["s~9~0~a!x~r", "s~9~0~a!~r", "s~9~0~a%41~r", "s~9~0~a~r%25"] {
            assert!(bad.parse::<ReservationId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn malformed_ids_are_refused_naming_the_field() {
        let field = |s: &str| match s.parse::<ReservationId>() {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("{s:?}: {other:?}"),
        };
        assert_eq!(field("nope"), "reservation");
        assert_eq!(field("a~1~2~u"), "reservation");
        assert_eq!(field("a~x~2~u~r"), "reservation");
        assert_eq!(field("a~1~-2~u~r"), "reservation");
        // One text form per reservation: no sign, no leading zero.
        for other_form in [
            "a~+1~2~u~r",
            "a~01~2~u~r",
            "a~1~+2~u~r",
            "a~1~02~u~r",
            "a~1~ 2~u~r",
        ] {
            assert_eq!(field(other_form), "reservation", "{other_form}");
        }
        assert!("a~0~0~u~r".parse::<ReservationId>().is_ok());
        assert_eq!(field(&format!("a~1~{MAX_SEGMENTS}~u~r")), "reservation");
        assert_eq!(field("a{b~1~2~u~r"), "sku");
        assert_eq!(field("a~1~2~u{~r"), "user");
        assert_eq!(field("a~1~2~u~r~s"), "reservation");
        assert_eq!(field("a~1~2~u~r s"), "request_id");
        assert!(serde_json::from_str::<ReservationId>("\"nope\"").is_err());
        // The scripts take generations of up to 15 digits.
        assert!("s~999999999999999~0~u~r".parse::<ReservationId>().is_ok());
        assert!("s~1000000000000000~0~u~r".parse::<ReservationId>().is_err());
    }
}
