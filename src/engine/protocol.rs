//! The request protocol: what an engine does between store calls for one sale or reservation,
//! as a pure state machine (no I/O, no clock, no randomness). The engine drives it against a
//! store (`engine/deduct.rs`); the model checker (`tests/it/model.rs`) drives the very same machine
//! against [`crate::store::memory::Segment`]s, interleaving it with other engines, the sweeper,
//! crashes and re-sent calls.
//!
//! # The protocol
//! Every request is decided by one [`Store::sell`](crate::Store::sell) call at its *home*
//! segment (the user's; [`crate::segments::home`]). When home is short, units move home first,
//! forward only:
//! 1. `sell` at home, no credits. Applied, replay, limit reached, conflict: the answer. Short:
//!    `need` = qty − home's stock.
//! 2. Transfers: pick a donor from the stock hints (the fullest not yet tried this round),
//!    debit `need + batch` above the donor's floor with a fresh transfer id. In the first
//!    round the floor is the fair share (the average hinted stock, so a donor keeps what its
//!    own users need and homes don't pull units back and forth in the last-units storm);
//!    later rounds take everything. Units debited are *in transit*: the donor remembers the
//!    transfer, and any sweeper credits it home once its lease runs out.
//! 3. Once the transfers cover `need` (or no donor is left), `sell` at home *with the credits*:
//!    each credit applies at most once per id, in the same atomic step that decides the
//!    request, so a request spends its own credit before anyone else can. Units credited stay
//!    home whatever the answer (never refunded). Short again (others sold home's units in
//!    between): another round, at most [`MAX_ROUNDS`].
//! 4. No donor had anything: a survey of every segment (returning expired reservations)
//!    decides. Units in transit anywhere are credited first (early crediting is safe), then
//!    `sold out` only when every segment is empty and nothing is in transit; `insufficient`
//!    when the SKU holds fewer units than asked.
//! 5. Credits used: each transfer is marked done at its donor (best effort: the sweeper marks
//!    what is left once it finds the credit applied).
//!
//! A segment whose master refuses writes (Redis's `min-replicas-to-write`: it cannot reach
//! its replicas, [`crate::Error::NoReplicas`]) refuses every call before running it, so a
//! refusal wrote nothing. As a donor it is passed over for the rest of the request
//! ([`Machine::on_refused`]); in a survey its stock is unknown ([`Look::Down`]): the request
//! gathers from the segments that answer when they hold enough, and otherwise ends
//! [`Answer::Unavailable`] — never `sold out` or `insufficient` while units may sit behind a
//! master that cannot replicate. Home refusing ends the request with the error itself: the
//! request's records live there, so nothing else may decide it.

use crate::store::{Credit, SellReply, TransferArgs, TransferId, TransferReply};

/// Rounds of transfers (and surveys) before a request gives up with the last survey's answer.
pub const MAX_ROUNDS: u32 = 6;

/// Most credits one `sell` call takes (`sell.lua` refuses a call with more). A request that
/// debits more transfers than this (many small donors) sells with the credits it holds, then
/// goes on with the same round's donors.
pub const MAX_CREDITS: usize = 64;

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Step {
    /// Call `sell` at home, crediting these transfers first.
    Sell {
        /// Transfers debited for this request, not yet credited.
        credits: Vec<Credit>,
    },
    /// Debit a transfer at `donor`.
    Transfer {
        /// The donor segment.
        donor: u32,
        /// The transfer.
        args: TransferArgs,
    },
    /// Survey every segment ([`Machine::on_survey`]).
    Survey,
    /// Credit every transfer in transit to its destination, then survey again
    /// ([`Machine::on_drained`]).
    Drain,
    /// Mark these transfers done at their donors, then answer.
    Finish {
        /// (donor, transfer id) of each credit the request used.
        done: Vec<(u32, TransferId)>,
        /// The answer.
        answer: Answer,
    },
}

/// How a request ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// Taken at home.
    Applied,
    /// Applied before (same user and request id).
    Replay,
    /// Nothing left anywhere, nothing in transit.
    SoldOut,
    /// Fewer units left than asked.
    Insufficient {
        /// Units left at the last survey.
        available: u64,
    },
    /// The user would exceed the per-user limit.
    LimitReached {
        /// The limit.
        limit: u64,
        /// Units the user holds.
        held: u64,
        /// Of those, for good.
        sold: u64,
    },
    /// The request id was used with another quantity or kind.
    Mismatch(&'static str),
    /// The layout changed (reload): read it again.
    Stale,
    /// Lock strategies: the lock was lost.
    LockLost,
    /// Not enough units at the segments that answered, and some segment refused (its master
    /// cannot replicate): its units are unknown and cannot move now. Nothing was decided;
    /// retry later.
    Unavailable,
}

/// What a survey learnt of one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Look {
    /// Its counters.
    Seen(Seen),
    /// Missing, or of another generation (a reload).
    Gone,
    /// Its master refused the read-and-reclaim (cannot reach its replicas): stock unknown.
    Down,
}

/// What a survey of one segment tells the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Seen {
    /// Units left.
    pub stock: u64,
    /// Units debited there by transfers.
    pub moved_out: u64,
    /// Units credited there by transfers.
    pub moved_in: u64,
}

/// One request's protocol state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Machine {
    home: u32,
    qty: u64,
    lease_ms: u64,
    /// What this machine believes each segment holds (starts from the engine's hints).
    hints: Vec<u64>,
    /// Donors tried in this round.
    tried: Vec<bool>,
    /// Segments that refused a call of this request (their master cannot replicate): no
    /// donors for the rest of it.
    down: Vec<bool>,
    /// Some segment refused a call of this request: giving up after the last round is
    /// "unavailable", not "insufficient" (the units may sit behind a master that flapped).
    refused: bool,
    /// Debited for this request, not yet credited.
    credits: Vec<Credit>,
    /// The last `sell` carried [`MAX_CREDITS`] credits before they covered `need`: a short
    /// answer continues the round instead of starting another.
    partial: bool,
    /// Credited by a `sell` that used them: marked done at the end.
    used: Vec<(u32, TransferId)>,
    /// Units still needed at home beyond its stock.
    need: u64,
    round: u32,
    drains: u32,
    /// The next transfer id (the engine seeds it at random; the model with a fixed value).
    next_id: TransferId,
}

impl Machine {
    /// A request for `qty` units homed at `home`, with the engine's stock hints per segment
    /// (`u64::MAX`: unknown), transfer leases of `lease_ms`, and transfer ids drawn from
    /// `first_id` upwards (never 0).
    pub fn new(home: u32, qty: u64, hints: Vec<u64>, lease_ms: u64, first_id: TransferId) -> Self {
        let n = hints.len();
        Self {
            home,
            qty,
            lease_ms,
            hints,
            tried: vec![false; n],
            down: vec![false; n],
            refused: false,
            credits: Vec::new(),
            partial: false,
            used: Vec::new(),
            need: 0,
            round: 0,
            drains: 0,
            next_id: first_id.max(1),
        }
    }

    /// The first step: `sell` at home.
    pub fn start(&self) -> Step {
        Step::Sell {
            credits: Vec::new(),
        }
    }

    /// The request's home segment.
    pub fn home(&self) -> u32 {
        self.home
    }

    /// Rounds of transfers started so far (0: the first). A round after the first means
    /// others took what this request moved home, or donors ran dry: the engine backs off a
    /// little, at random, before the next one.
    pub fn round(&self) -> u32 {
        self.round
    }

    /// Credits debited for this request and not yet credited (in transit because of it).
    pub fn in_transit(&self) -> &[Credit] {
        &self.credits
    }

    fn finish(&mut self, answer: Answer) -> Step {
        Step::Finish {
            done: std::mem::take(&mut self.used),
            answer,
        }
    }

    /// After `sell` answered `reply`.
    pub fn on_sell(&mut self, reply: &SellReply) -> Step {
        let sent = std::mem::take(&mut self.credits);
        // The credits sent are home now (or were before) — unless the call wrote nothing: a
        // lock lost, or another generation. Then they stay in transit, due to the sweeper
        // after their lease; marking them done would strand them for good.
        if !matches!(reply, SellReply::LockLost | SellReply::Stale) {
            self.used.extend(sent.iter().map(|c| (c.donor, c.id)));
        }
        match *reply {
            SellReply::Applied { stock_after } => {
                self.hints[self.home as usize] = stock_after;
                self.finish(Answer::Applied)
            }
            SellReply::Replay => self.finish(Answer::Replay),
            SellReply::LimitReached { limit, held, sold } => {
                self.finish(Answer::LimitReached { limit, held, sold })
            }
            SellReply::Mismatch(f) => self.finish(Answer::Mismatch(f)),
            SellReply::Stale => self.finish(Answer::Stale),
            SellReply::LockLost => self.finish(Answer::LockLost),
            SellReply::Short { stock } => {
                self.hints[self.home as usize] = stock;
                self.need = self.qty.saturating_sub(stock).max(1);
                if std::mem::take(&mut self.partial) {
                    // Only part of this round's credits were sold with: its donors go on.
                    return self.next_transfer();
                }
                if !sent.is_empty() || self.round > 0 {
                    self.round += 1;
                    self.tried.iter_mut().for_each(|t| *t = false);
                }
                if self.round >= MAX_ROUNDS {
                    return Step::Survey;
                }
                self.next_transfer()
            }
        }
    }

    /// The donor to ask next and the floor it keeps, or `None`.
    fn donor(&self) -> Option<(u32, u64)> {
        let n = self.hints.len();
        let known: Vec<u64> = self.hints.iter().map(|h| (*h).min(u64::MAX / 2)).collect();
        // First round: donors keep their fair share of what the hints show.
        let floor = if self.round == 0 {
            let sum: u64 = known
                .iter()
                .enumerate()
                .filter(|(i, h)| **h != u64::MAX / 2 && *i as u32 != self.home)
                .map(|(_, h)| *h)
                .sum();
            sum / n as u64
        } else {
            0
        };
        // From the third round on (others keep taking what this request moves home), pull in
        // one direction only, alternating by round: towards lower-indexed homes in even
        // rounds, higher in odd ones. Two requests can then no longer take each other's units
        // in the same round (units flow one way), which breaks the symmetry of requests on
        // different instances pulling the last units back and forth.
        let directed = |i: u32| match self.round {
            0 | 1 => true,
            r if r % 2 == 0 => i > self.home,
            _ => i < self.home,
        };
        (0..n as u32)
            .filter(|&i| {
                i != self.home && !self.tried[i as usize] && !self.down[i as usize] && directed(i)
            })
            .filter(|&i| known[i as usize] > floor)
            // Fullest first; ties by index: deterministic.
            .max_by_key(|&i| (known[i as usize], std::cmp::Reverse(i)))
            .map(|i| (i, floor.min(known[i as usize])))
    }

    fn next_transfer(&mut self) -> Step {
        let collected: u64 = self.credits.iter().map(|c| c.units).sum();
        if collected >= self.need || self.credits.len() >= MAX_CREDITS {
            self.partial = collected < self.need;
            return Step::Sell {
                credits: self.credits.clone(),
            };
        }
        match self.donor() {
            Some((donor, floor)) => {
                self.tried[donor as usize] = true;
                let id = self.next_id;
                self.next_id = self.next_id.wrapping_add(1).max(1);
                let left = self.need - collected;
                Step::Transfer {
                    donor,
                    args: TransferArgs {
                        id,
                        dest: self.home,
                        // First round: what is missing plus as much again, for the next buyers
                        // homed here. Later rounds (units are scarce): only what is missing,
                        // so no surplus sits at one home while others need it.
                        want: if self.round == 0 {
                            left.saturating_add(self.qty)
                        } else {
                            left
                        },
                        floor,
                        lease_ms: self.lease_ms,
                    },
                }
            }
            None if !self.credits.is_empty() => Step::Sell {
                credits: self.credits.clone(),
            },
            None if self.round == 0 => {
                // Nothing above the fair shares: try again taking everything.
                self.round = 1;
                self.tried.iter_mut().for_each(|t| *t = false);
                self.next_transfer()
            }
            None => Step::Survey,
        }
    }

    /// After a transfer debit at `donor` answered `reply`.
    pub fn on_transfer(&mut self, donor: u32, id: TransferId, reply: &TransferReply) -> Step {
        match *reply {
            TransferReply::Debited { units, stock_after } => {
                self.hints[donor as usize] = stock_after;
                self.credits.push(Credit { id, donor, units });
                self.next_transfer()
            }
            TransferReply::Short { stock } => {
                self.hints[donor as usize] = stock;
                self.next_transfer()
            }
            // A reload: what is in transit belongs to the old generation and ends with it.
            TransferReply::Stale => self.finish(Answer::Stale),
        }
    }

    /// After a transfer debit at `donor` was refused before it ran (its master cannot reach
    /// its replicas): nothing was debited; the donor is passed over for the rest of the request.
    pub fn on_refused(&mut self, donor: u32) -> Step {
        self.down[donor as usize] = true;
        self.refused = true;
        self.tried[donor as usize] = true;
        self.next_transfer()
    }

    /// After a survey of every segment.
    pub fn on_survey(&mut self, seen: &[Look]) -> Step {
        let mut total = 0u64;
        let (mut out, mut inn) = (0u64, 0u64);
        let mut down = false;
        for (i, s) in seen.iter().enumerate() {
            let s = match s {
                Look::Seen(s) => s,
                Look::Gone => return self.finish(Answer::Stale),
                Look::Down => {
                    self.down[i] = true;
                    self.refused = true;
                    down = true;
                    continue;
                }
            };
            // It answered: a donor again (its master reaches its replicas once more).
            self.down[i] = false;
            self.hints[i] = s.stock;
            total = total.saturating_add(s.stock);
            out = out.saturating_add(s.moved_out);
            inn = inn.saturating_add(s.moved_in);
        }
        let in_transit = out.saturating_sub(inn);
        // With a segment silent, what moved to or from it is unknown: gather from the segments
        // that answered when they hold enough.
        if down && total >= self.qty && self.round <= MAX_ROUNDS && !self.down[self.home as usize] {
            return self.gather();
        }
        if in_transit > 0 && self.drains < MAX_ROUNDS {
            // Units on their way somewhere: credit them first (a drain passes over silent
            // segments), then look again.
            self.drains += 1;
            return Step::Drain;
        }
        if down {
            // Not enough where segments answer: nothing can be decided now.
            return self.finish(Answer::Unavailable);
        }
        if total == 0 && in_transit == 0 {
            return self.finish(Answer::SoldOut);
        }
        if self.round > MAX_ROUNDS && self.refused {
            return self.finish(Answer::Unavailable);
        }
        if total.saturating_add(in_transit) < self.qty || self.round > MAX_ROUNDS {
            return self.finish(Answer::Insufficient { available: total });
        }
        self.gather()
    }

    /// Enough exists: gather it, taking everything from each donor.
    fn gather(&mut self) -> Step {
        self.round = self.round.max(1) + 1;
        self.tried.iter_mut().for_each(|t| *t = false);
        self.need = self.qty.saturating_sub(self.hints[self.home as usize]);
        self.next_transfer()
    }

    /// After the drain: survey again.
    pub fn on_drained(&mut self) -> Step {
        Step::Survey
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_well_stocked_home_is_one_call() {
        let mut m = Machine::new(0, 1, vec![5, 5], 100, 1);
        assert_eq!(
            m.start(),
            Step::Sell {
                credits: Vec::new()
            }
        );
        assert_eq!(
            m.on_sell(&SellReply::Applied { stock_after: 4 }),
            Step::Finish {
                done: Vec::new(),
                answer: Answer::Applied
            }
        );
    }

    #[test]
    fn a_short_home_pulls_from_the_fullest_donor_and_spends_the_credit() {
        let mut m = Machine::new(0, 2, vec![0, 3, 9], 100, 7);
        let Step::Transfer { donor, args } = m.on_sell(&SellReply::Short { stock: 1 }) else {
            panic!()
        };
        assert_eq!((donor, args.id, args.dest), (2, 7, 0));
        let s = m.on_transfer(
            2,
            7,
            &TransferReply::Debited {
                units: 3,
                stock_after: 6,
            },
        );
        let Step::Sell { credits } = s else { panic!() };
        assert_eq!(credits.len(), 1);
        assert_eq!(
            m.on_sell(&SellReply::Applied { stock_after: 2 }),
            Step::Finish {
                done: vec![(2, 7)],
                answer: Answer::Applied
            }
        );
    }

    /// Drives a machine against segments holding `stock` (home first, no other traffic) to its
    /// answer; every `sell` carries at most `MAX_CREDITS` credits.
    fn drive(m: &mut Machine, stock: &mut [u64], qty: u64) -> (Answer, usize) {
        let home = m.home() as usize;
        let (mut step, mut sells) = (m.start(), 0);
        loop {
            step = match step {
                Step::Sell { credits } => {
                    assert!(credits.len() <= MAX_CREDITS, "{} credits", credits.len());
                    sells += 1;
                    stock[home] += credits.iter().map(|c| c.units).sum::<u64>();
                    if stock[home] >= qty {
                        stock[home] -= qty;
                        m.on_sell(&SellReply::Applied {
                            stock_after: stock[home],
                        })
                    } else {
                        m.on_sell(&SellReply::Short { stock: stock[home] })
                    }
                }
                Step::Transfer { donor, args } => {
                    let d = donor as usize;
                    let units = stock[d].saturating_sub(args.floor).min(args.want);
                    if units == 0 {
                        m.on_transfer(donor, args.id, &TransferReply::Short { stock: stock[d] })
                    } else {
                        stock[d] -= units;
                        let debited = TransferReply::Debited {
                            units,
                            stock_after: stock[d],
                        };
                        m.on_transfer(donor, args.id, &debited)
                    }
                }
                Step::Survey => {
                    let seen: Vec<Look> = stock
                        .iter()
                        .map(|&s| {
                            Look::Seen(Seen {
                                stock: s,
                                moved_out: 0,
                                moved_in: 0,
                            })
                        })
                        .collect();
                    m.on_survey(&seen)
                }
                Step::Drain => m.on_drained(),
                Step::Finish { answer, .. } => return (answer, sells),
            }
        }
    }

    #[test]
    fn many_small_donors_are_sold_with_in_batches_of_max_credits() {
        // 1,024 segments of one unit, an empty home: 250 units come from 250 donors.
        let n = 1024;
        let mut stock = vec![1u64; n];
        stock[0] = 0;
        let mut m = Machine::new(0, 250, stock.clone(), 100, 1);
        let (answer, sells) = drive(&mut m, &mut stock, 250);
        assert_eq!(answer, Answer::Applied);
        assert_eq!(sells, 1 + 250usize.div_ceil(MAX_CREDITS), "{sells} sells");
        assert_eq!(stock.iter().sum::<u64>(), (n as u64 - 1) - 250);
        assert!(
            include_str!("../scripts/sell.lua")
                .contains(&format!("if c > {MAX_CREDITS} then bad('credits') end")),
            "sell.lua's credit cap is MAX_CREDITS"
        );
    }

    #[test]
    fn a_lock_lost_leaves_the_credits_in_transit() {
        let mut m = Machine::new(0, 2, vec![0, 5], 100, 3);
        let Step::Transfer { args, .. } = m.on_sell(&SellReply::Short { stock: 0 }) else {
            panic!()
        };
        let debited = TransferReply::Debited {
            units: 4,
            stock_after: 1,
        };
        assert!(matches!(
            m.on_transfer(1, args.id, &debited),
            Step::Sell { .. }
        ));
        // Nothing was written: the transfer must stay due (not marked done) for the sweeper.
        assert_eq!(
            m.on_sell(&SellReply::LockLost),
            Step::Finish {
                done: Vec::new(),
                answer: Answer::LockLost
            }
        );
    }

    #[test]
    fn a_refusing_donor_is_passed_over_and_never_hides_units_as_sold_out() {
        let seen = |stock| {
            Look::Seen(Seen {
                stock,
                moved_out: 0,
                moved_in: 0,
            })
        };
        // Home 0 empty; donor 2 is the fullest but refuses: donor 1 serves.
        let mut m = Machine::new(0, 1, vec![0, 3, 9], 100, 1);
        let Step::Transfer { donor: 2, .. } = m.on_sell(&SellReply::Short { stock: 0 }) else {
            panic!()
        };
        let Step::Transfer { donor: 1, .. } = m.on_refused(2) else {
            panic!("the next donor is asked")
        };
        // Only the refusing segment holds units: neither sold out nor insufficient.
        let mut m = Machine::new(0, 1, vec![0, 0, 9], 100, 1);
        let Step::Transfer { donor: 2, .. } = m.on_sell(&SellReply::Short { stock: 0 }) else {
            panic!()
        };
        assert_eq!(m.on_refused(2), Step::Survey);
        assert_eq!(
            m.on_survey(&[seen(0), seen(0), Look::Down]),
            Step::Finish {
                done: Vec::new(),
                answer: Answer::Unavailable
            }
        );
        // Enough at the segments that answer: gathered from them, the silent one left alone.
        let mut m = Machine::new(0, 2, vec![0, 0, 0], 100, 1);
        assert_eq!(m.on_sell(&SellReply::Short { stock: 0 }), Step::Survey);
        let Step::Transfer { donor: 1, .. } = m.on_survey(&[seen(0), seen(5), Look::Down]) else {
            panic!("gathers from the segment that answered")
        };
        // A master that flaps (answers surveys, refuses transfers) until the rounds run out:
        // "unavailable", never "insufficient" over the units it holds.
        let mut m = Machine::new(0, 1, vec![0, 4], 100, 1);
        m.on_sell(&SellReply::Short { stock: 0 });
        assert_eq!(m.on_refused(1), Step::Survey);
        m.round = MAX_ROUNDS + 1;
        assert_eq!(
            m.on_survey(&[seen(0), seen(4)]),
            Step::Finish {
                done: Vec::new(),
                answer: Answer::Unavailable
            }
        );
        // Units in transit between segments that answer are credited before giving up.
        let mut m = Machine::new(0, 2, vec![0, 0, 0], 100, 1);
        m.on_sell(&SellReply::Short { stock: 0 });
        let moving = Look::Seen(Seen {
            stock: 0,
            moved_out: 2,
            moved_in: 0,
        });
        assert_eq!(m.on_survey(&[seen(0), moving, Look::Down]), Step::Drain);
        // A segment that answers again is a donor again.
        let mut m = Machine::new(0, 1, vec![0, 4], 100, 1);
        m.on_sell(&SellReply::Short { stock: 0 });
        assert_eq!(m.on_refused(1), Step::Survey);
        assert!(matches!(
            m.on_survey(&[seen(0), seen(4)]),
            Step::Transfer { donor: 1, .. }
        ));
    }

    #[test]
    fn contended_rounds_pull_one_way() {
        // Home 1, round 2: only higher-indexed donors; round 3: only lower.
        let mut m = Machine::new(1, 1, vec![9, 0, 9], 100, 1);
        m.round = 2;
        assert_eq!(m.donor().map(|(d, _)| d), Some(2));
        m.round = 3;
        assert_eq!(m.donor().map(|(d, _)| d), Some(0));
    }

    #[test]
    fn sold_out_only_when_nothing_is_in_transit() {
        let mut m = Machine::new(0, 1, vec![0, 0], 100, 1);
        assert_eq!(m.on_sell(&SellReply::Short { stock: 0 }), Step::Survey);
        let moving = Seen {
            stock: 0,
            moved_out: 2,
            moved_in: 0,
        };
        let empty = Seen {
            stock: 0,
            moved_out: 0,
            moved_in: 0,
        };
        assert_eq!(
            m.on_survey(&[Look::Seen(empty), Look::Seen(moving)]),
            Step::Drain
        );
        assert_eq!(m.on_drained(), Step::Survey);
        let credited = Seen {
            stock: 2,
            moved_out: 0,
            moved_in: 2,
        };
        assert!(matches!(
            m.on_survey(&[Look::Seen(credited), Look::Seen(moving)]),
            Step::Sell { .. }
        ));
        assert_eq!(
            Machine::new(0, 1, vec![0, 0], 1, 1).on_survey(&[Look::Seen(empty), Look::Seen(empty)]),
            Step::Finish {
                done: Vec::new(),
                answer: Answer::SoldOut
            }
        );
    }
}
