//! An attempt that passed the guard, as a value: [`LocalGuard::enter`] hands it out and it owns
//! the user's busy mark until it ends — finished with what the store answered, or dropped. A
//! request future may be dropped at any await (a client disconnected and the server dropped its
//! handler); tying the busy mark to a value means a dropped request never leaves its user busy.
//! It touches only the guard's own decisions (`guard.rs`) and the ids it holds.

use super::{Local, LocalGuard, Place};
use crate::ids::{RequestId, Sku, UserId};
use std::time::Instant;

impl LocalGuard {
    /// [`begin`](Self::begin), with the busy mark owned by the returned [`Attempt`]: if the
    /// attempt is dropped before [`Attempt::finish`] (a cancelled future: a client
    /// disconnected and the server dropped its handler), the user is no longer busy.
    ///
    /// # Errors
    /// The refusal ([`Local::InFlight`] or [`Local::LimitReached`]) when not [`Local::Pass`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enter<'a>(
        &'a self,
        at: Instant,
        generation: u64,
        sku: &Sku,
        user: &UserId,
        rid: &'a RequestId,
        qty: u64,
        limit: u64,
    ) -> Result<Attempt<'a>, Local> {
        match self.begin_in(at, generation, sku, user, rid, qty, limit) {
            (Local::Pass, place) => Ok(Attempt {
                guard: self,
                at,
                key: place.map(|p| (p, rid)),
            }),
            (refused, _) => Err(refused),
        }
    }
}

/// A running attempt that passed the guard (see [`LocalGuard::enter`]); dropping it unfinished
/// ends it as if nothing was bought.
#[derive(Debug)]
pub(crate) struct Attempt<'a> {
    guard: &'a LocalGuard,
    /// When the attempt began (what its end stamps the entry with).
    at: Instant,
    /// `None`: finished, or never had an entry.
    key: Option<(Place, &'a RequestId)>,
}

impl Attempt<'_> {
    /// Ends the attempt: `sold_units` > 0 when the store sold units for good for this request
    /// (now or earlier). Reserved units are not remembered here — a reservation may go back.
    pub(crate) fn finish(mut self, sold_units: u64) {
        if let Some((p, rid)) = self.key.take() {
            self.guard.finish_at(self.at, p, rid, sold_units);
        }
    }

    /// Ends the attempt after the store answered "limit reached" with `final_units` sold for
    /// good to this user.
    pub(crate) fn saturate(mut self, final_units: u64) {
        if let Some((p, _)) = self.key.take() {
            self.guard.saturate_at(p, final_units);
        }
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if let Some((p, rid)) = self.key.take() {
            self.guard.finish_at(self.at, p, rid, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::tests::ids;
    use std::time::Duration;

    #[test]
    fn a_dropped_attempt_frees_the_user_and_busy_answers_do_not_extend_the_entry() {
        let ttl = Duration::from_millis(100);
        let g = LocalGuard::new(ttl, 100);
        let (s, u, r1) = ids("u", "r1");
        let a = g.enter(Instant::now(), 7, &s, &u, &r1, 1, 1).unwrap();
        drop(a);
        // The entry begins between these two instants; the checks below hold whatever the
        // scheduler does (no timed assertion: each one is made only when its premise held).
        let before = Instant::now();
        let a = g
            .enter(Instant::now(), 7, &s, &u, &r1, 1, 1)
            .expect("free again after a drop");
        let after = Instant::now();
        // A stuck attempt (never finished, never dropped) expires `ttl` after it began, however
        // many double clicks ask meanwhile.
        std::mem::forget(a);
        let mut asked = 0;
        while before.elapsed() < ttl {
            let r = g.begin_in(Instant::now(), 7, &s, &u, &r1, 1, 1).0;
            if before.elapsed() < ttl {
                assert_eq!(r, Local::InFlight, "younger than its ttl");
                asked += 1;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(
            (after + ttl + Duration::from_millis(20)).saturating_duration_since(Instant::now()),
        );
        assert_eq!(
            g.begin_in(Instant::now(), 7, &s, &u, &r1, 1, 1).0,
            Local::Pass,
            "expired after {asked} double clicks"
        );
    }
}
