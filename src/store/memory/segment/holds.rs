//! Order items at their home segment: what settles them and what the sweeper and the audit
//! read of them. Mirrors `settle.lua`, `holds_due.lua` and the hold index part of
//! `survey.lua`/`peek.lua`.
//!
//! An item is held by [`Segment::sell`] with [`SellArgs::order_item`](crate::store::SellArgs)
//! (record `Held`, counted in `reserved` and against the per-user limit, indexed in `holds`)
//! and never ends by itself: its order's decision, read from the order's record wherever that
//! lives, is brought here by [`Segment::settle`]. Posting sells the units; voiding returns
//! them — or, when the hold has not run (a cancel that overtook it, a hold refused), writes a
//! `Voided` record that makes the late hold a replay which takes nothing (the TCC frameworks'
//! "empty rollback" and "suspension").

use super::{Record, Segment};
use crate::ids::{RequestId, UserId};
use crate::store::{DueHold, ItemState, RecordState, SettleReply};

impl Segment {
    /// `settle.lua`: brings the order's decision to item `rid` of `user`, of `qty` units:
    /// `post` sells a held item, otherwise it is voided (its units back to stock; nothing held:
    /// a `Voided` record of `ttl_ms` so that a late hold takes nothing). Idempotent; the
    /// other end than asked answers [`SettleReply::Ended`].
    pub fn settle(
        &mut self,
        user: &UserId,
        rid: &RequestId,
        qty: u64,
        post: bool,
        ttl_ms: u64,
        now: u64,
    ) -> SettleReply {
        self.reclaim(now);
        let want = if post {
            ItemState::Posted
        } else {
            ItemState::Voided
        };
        let limited = self.limit > 0;
        let Some(rec) = self.live_record(user, rid, now) else {
            if post {
                return SettleReply::Unknown;
            }
            let fresh = !self.users.contains_key(user);
            let l = self.users.entry(user.clone()).or_default();
            l.records.insert(
                rid.clone(),
                Record {
                    qty,
                    state: RecordState::Item(ItemState::Voided),
                    exp: 0,
                    until: now + ttl_ms,
                },
            );
            // Without a limit a fresh ledger is dropped once this record is forgotten; an older
            // one keeps the later end (a ledger kept for the generation, none).
            if !limited && (fresh || l.until != 0) {
                l.until = l.until.max(now + ttl_ms);
            }
            return SettleReply::Done(ItemState::Voided);
        };
        let RecordState::Item(state) = rec.state else {
            return SettleReply::Mismatch;
        };
        if rec.qty != qty {
            return SettleReply::Mismatch;
        }
        match state {
            ItemState::Held => {}
            s if s == want => return SettleReply::Done(s),
            s => return SettleReply::Ended(s),
        }
        self.holds.remove(&(rec.exp, user.clone(), rid.clone()));
        self.counters.reserved -= qty;
        let l = self
            .users
            .get_mut(user)
            .expect("a live record has its ledger");
        if post {
            self.counters.sold += qty;
            if limited {
                l.sold += qty;
            }
        } else {
            self.counters.stock += qty;
            if limited {
                l.held -= qty;
            }
        }
        let r = l.records.get_mut(rid).expect("live record");
        r.state = RecordState::Item(want);
        // A posted item under a limit is kept for the generation (like a sale); otherwise the
        // record outlives its end by the request TTL.
        r.until = if post && limited { 0 } else { now + ttl_ms };
        SettleReply::Done(want)
    }

    /// `holds_due.lua`: items held whose hint is at or before `now`, oldest first, at most
    /// `max` (the sweeper asks each one's order).
    pub fn holds_due(&self, max: usize, now: u64) -> Vec<DueHold> {
        self.holds
            .iter()
            .take_while(|(hint, _, _)| *hint <= now)
            .filter_map(|(_, user, rid)| {
                let r = self.users.get(user)?.records.get(rid)?;
                (r.state == RecordState::Item(ItemState::Held)).then(|| DueHold {
                    user: user.clone(),
                    request_id: rid.clone(),
                    qty: r.qty,
                })
            })
            .take(max)
            .collect()
    }

    /// The hold index as the audit reads it: units of items held, items held, and entries
    /// whose record is gone or no longer held.
    pub(super) fn holds_detail(&self) -> (u64, u64, u64) {
        let (mut held, mut n, mut orphans) = (0, 0, 0);
        for (_, user, rid) in &self.holds {
            match self
                .users
                .get(user)
                .and_then(|l| l.records.get(rid))
                .filter(|r| r.state == RecordState::Item(ItemState::Held))
            {
                Some(r) => {
                    held += r.qty;
                    n += 1;
                }
                None => orphans += 1,
            }
        }
        (held, n, orphans)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{SellArgs, SellReply};

    fn ids(u: &str, r: &str) -> (UserId, RequestId) {
        (UserId::new(u).unwrap(), RequestId::new(r).unwrap())
    }

    fn hold<'a>(u: &'a UserId, r: &'a RequestId, qty: u64) -> SellArgs<'a> {
        SellArgs {
            request_id: r,
            user: u,
            qty,
            resv_ttl_ms: 100,
            order_item: true,
            ttl_ms: 1000,
            credits: &[],
            fence: 0,
        }
    }

    #[test]
    fn a_held_item_never_expires_and_ends_as_settled() {
        let mut s = Segment::loaded(1, 5, 2);
        let (u, r) = ids("u", "o#1");
        assert!(matches!(
            s.sell(&hold(&u, &r, 2), 0),
            SellReply::Applied { .. }
        ));
        // Long past its hint: still held, due to the sweeper.
        assert_eq!(s.survey(10_000, true).held, 2);
        assert_eq!(s.holds_due(10, 10_000).len(), 1);
        assert_eq!(s.counters.reserved, 2);
        assert_eq!(
            s.settle(&u, &r, 2, true, 1000, 10_001),
            SettleReply::Done(ItemState::Posted)
        );
        assert_eq!(
            s.settle(&u, &r, 2, true, 1000, 10_002),
            SettleReply::Done(ItemState::Posted)
        );
        assert_eq!(
            s.settle(&u, &r, 2, false, 1000, 10_002),
            SettleReply::Ended(ItemState::Posted)
        );
        assert_eq!((s.counters.sold, s.counters.reserved), (2, 0));
        assert!(s.holds_due(10, 20_000).is_empty());
        assert!(s.counters.balances());
        // The user's limit counts the posted units.
        let r2 = RequestId::new("o2#1").unwrap();
        assert!(matches!(
            s.sell(&hold(&u, &r2, 1), 1),
            SellReply::LimitReached { .. }
        ));
    }

    #[test]
    fn a_void_before_the_hold_refuses_the_hold() {
        let mut s = Segment::loaded(1, 5, 0);
        let (u, r) = ids("u", "o#1");
        assert_eq!(
            s.settle(&u, &r, 1, false, 1000, 0),
            SettleReply::Done(ItemState::Voided)
        );
        assert_eq!(s.sell(&hold(&u, &r, 1), 1), SellReply::Replay);
        assert_eq!(s.counters.stock, 5);
        assert_eq!(
            s.settle(&u, &r, 1, true, 1000, 2),
            SettleReply::Ended(ItemState::Voided)
        );
        // Posting what was never held sells nothing.
        let (u2, r2) = ids("v", "o#1");
        assert_eq!(s.settle(&u2, &r2, 1, true, 1000, 2), SettleReply::Unknown);
        assert!(s.counters.balances());
    }
}
