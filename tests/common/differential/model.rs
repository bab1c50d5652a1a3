//! What the answers of one store kind promised: each request id's effect ([`Fx`]), units
//! known sold, live reservations, and the possible causes of a lockout, so that a later answer
//! that breaks a promise is named (every violation starts with its `[tag]`).

use shardstock::*;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sale,
    Resv,
}

/// What the answers so far say a request id did (current generation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fx {
    /// Its units are sold for good (a sale, or a confirmed reservation).
    Sold,
    /// A reservation holding its units (until a wait passes).
    Held,
    /// A reservation that ended (cancelled or expired): holds nothing.
    Ended,
    /// A fallback claim abandoned by a crash, `taken` units taken so far.
    Limbo { taken: u64 },
    /// A dropped call: all of it in, or nothing.
    Unknown,
}

#[derive(Debug, Clone)]
pub struct RidFx {
    pub user: String,
    pub qty: u64,
    pub kind: Kind,
    pub fx: Fx,
    /// Waits before it was sent (a reservation of a dropped call found applied later is
    /// live only if no wait passed since).
    pub born: u32,
}

/// A request sent, for `Replay` & co.
#[derive(Debug, Clone)]
pub struct Sent {
    pub d: Deduct,
    pub kind: Kind,
    pub ttl_ms: u64,
}

/// The answers of one store kind, in a normalised form, and the model they build.
#[derive(Default)]
pub struct Model {
    /// Loads so far (request ids are scoped by it: a reload resets the ledger).
    pub loads: u32,
    pub loaded: u64,
    pub restocked: u64,
    pub limit: u64,
    pub rids: BTreeMap<String, RidFx>,
    /// Units known sold in this generation.
    pub sold: u64,
    /// Waits so far.
    pub waits: u32,
    /// Users per possible cause of a lockout, to name it (`lockout/<causes>`), so that
    /// `DIFF_IGNORE` can look past one cause: a reservation of theirs expired, they bought
    /// before the last reload, a crash left a pending claim of theirs that has not expired, a
    /// request of theirs was refused as a conflict, a crash left a reservation of theirs with a
    /// pending per-user entry, a reservation of theirs was cancelled, they were refused
    /// (rightly) with limit_reached before, a crash left a claim of theirs (expired or not).
    pub causes: BTreeMap<&'static str, std::collections::BTreeSet<String>>,
}

/// Answers folded into what the model needs.
#[derive(Debug)]
pub enum Got {
    Applied,
    Replayed,
    LimitReached(u64),
    NoStock,
    Sealed,
    Other,
}

pub fn got_deduct(r: &Result<Deduction>) -> Got {
    match r {
        Ok(Deduction::Applied { .. }) => Got::Applied,
        Ok(Deduction::Replayed { .. }) => Got::Replayed,
        Ok(Deduction::LimitReached { limit } | Deduction::OverLimit { limit }) => {
            Got::LimitReached(*limit)
        }
        Ok(
            Deduction::SoldOut | Deduction::Insufficient { .. } | Deduction::TooLargeToHold { .. },
        ) => Got::NoStock,
        Err(Error::Sealed(_)) => Got::Sealed,
        _ => Got::Other,
    }
}

pub fn got_reserve(r: &Result<Reserved>) -> Got {
    match r {
        Ok(Reserved::Held { .. }) => Got::Applied,
        Ok(Reserved::Replayed { .. }) => Got::Replayed,
        Ok(Reserved::NotHeld(d)) => got_deduct(&Ok(d.clone())),
        Err(Error::Sealed(_)) => Got::Sealed,
        _ => Got::Other,
    }
}

impl Model {
    pub fn holds(&self, user: &str) -> u64 {
        self.rids
            .values()
            .filter(|f| f.user == user)
            .map(|f| match f.fx {
                Fx::Sold | Fx::Held => f.qty,
                Fx::Limbo { taken } if taken == f.qty => f.qty,
                _ => 0,
            })
            .sum()
    }

    pub fn possible(&self, user: &str) -> u64 {
        self.rids
            .values()
            .filter(|f| f.user == user && f.fx == Fx::Unknown)
            .map(|f| f.qty)
            .sum()
    }

    pub fn live_reserved(&self) -> u64 {
        let held = self.rids.values().filter(|f| f.fx == Fx::Held);
        held.map(|f| f.qty).sum()
    }

    /// Units that may be sold beyond `sold`: abandoned takes and dropped calls.
    pub fn unsure(&self) -> u64 {
        self.rids
            .values()
            .map(|f| match f.fx {
                Fx::Limbo { taken } => taken,
                Fx::Unknown => f.qty,
                _ => 0,
            })
            .sum()
    }

    /// A wait passed every TTL: live reservations ended.
    pub fn after_wait(&mut self) {
        self.waits += 1;
        for f in self.rids.values_mut() {
            if f.fx == Fx::Held {
                f.fx = Fx::Ended;
                self.causes
                    .entry("expired")
                    .or_default()
                    .insert(f.user.clone());
            }
        }
        self.causes.remove("pending");
    }

    pub fn cause(&mut self, cause: &'static str, user: &str) {
        self.causes
            .entry(cause)
            .or_default()
            .insert(user.to_string());
    }

    /// A reload: a new ledger.
    pub fn reload(&mut self, total: u64, limit: u64) {
        // Anyone who did anything before: the old generation's ledger may still speak.
        let before: std::collections::BTreeSet<String> = self
            .rids
            .values()
            .map(|f| f.user.clone())
            .chain(self.causes.values().flatten().cloned())
            .collect();
        self.causes.clear();
        self.causes.insert("reload", before);
        self.loads += 1;
        self.rids.clear();
        self.sold = 0;
        self.loaded = total;
        self.restocked = 0;
        self.limit = limit;
    }

    pub fn lockout_tag(&self, user: &str) -> String {
        let causes: Vec<&str> = self
            .causes
            .iter()
            .filter(|(_, users)| users.contains(user))
            .map(|(c, _)| *c)
            .collect();
        if causes.is_empty() {
            "lockout".to_string()
        } else {
            format!("lockout/{}", causes.join("+"))
        }
    }

    /// Folds the answer to a `kind` request `d` into the model; returns what it broke.
    pub fn on_got(&mut self, kind: Kind, d: &Deduct, got: &Got) -> Option<String> {
        let rid = d.request_id.to_string();
        let user = d.user.to_string();
        let cur = self.rids.get(&rid).cloned();
        let born = self.waits;
        let fresh = |fx| RidFx {
            user: user.clone(),
            qty: d.qty,
            kind,
            fx,
            born,
        };
        let effect = match kind {
            Kind::Sale => Fx::Sold,
            Kind::Resv => Fx::Held,
        };
        match got {
            Got::Applied => {
                // (A dropped call of either kind that is found out by this: it never applied.)
                let broken = match &cur {
                    Some(c) if c.kind != kind && c.fx != Fx::Unknown => Some(format!(
                        "[kind] request id {rid} was used for a {:?} ({:?}) and now applied as a {kind:?} too",
                        c.kind, c.fx
                    )),
                    Some(c) if !matches!(c.fx, Fx::Limbo { .. } | Fx::Unknown) => Some(format!(
                        "[twice] request id {rid} ({:?} of {} by {}) applied a second time (for {user})",
                        c.fx, c.qty, c.user
                    )),
                    _ => None,
                };
                if kind == Kind::Sale {
                    self.sold += d.qty;
                }
                self.rids.insert(rid, fresh(effect));
                return broken;
            }
            Got::Replayed => match cur {
                None => {
                    return Some(format!(
                        "[replay-never] {kind:?} {rid} of {user} answered replayed, but it never applied"
                    ));
                }
                Some(c) if c.kind != kind => {
                    if c.fx == Fx::Unknown {
                        // The dropped call applied (as its own kind).
                        let fx = match c.kind {
                            Kind::Sale => {
                                self.sold += c.qty;
                                Fx::Sold
                            }
                            Kind::Resv if c.born == self.waits => Fx::Held,
                            Kind::Resv => {
                                self.cause("expired", &c.user);
                                Fx::Ended
                            }
                        };
                        self.rids.get_mut(&rid).unwrap().fx = fx;
                    }
                    return Some(format!(
                        "[kind] a {kind:?} with request id {rid} answered replayed, but the id holds a {:?} ({:?})",
                        c.kind, c.fx
                    ));
                }
                Some(c) if c.user != user || c.qty != d.qty => {
                    return Some(format!(
                        "[replay-other] {rid} of {user} x{} answered replayed, but it applied for {} x{}",
                        d.qty, c.user, c.qty
                    ));
                }
                Some(c) => {
                    if matches!(c.fx, Fx::Limbo { .. } | Fx::Unknown) {
                        if kind == Kind::Sale {
                            self.sold += d.qty;
                        }
                        let fx = match kind {
                            Kind::Resv if c.fx == Fx::Unknown && c.born != self.waits => {
                                self.cause("expired", &user);
                                Fx::Ended
                            }
                            _ => effect,
                        };
                        self.rids.insert(rid, fresh(fx));
                    }
                }
            },
            Got::LimitReached(limit) => {
                let holds = self.holds(&user) + self.possible(&user);
                let tag = self.lockout_tag(&user);
                // Refused rightly (too many units asked): a cause of later lockouts too.
                self.cause("refused", &user);
                if *limit != self.limit {
                    return Some(format!(
                        "[lockout/stale-layout] {user} refused with limit_reached (limit {limit}), but the SKU is now loaded with limit {} (holding {holds}, asking {})",
                        self.limit, d.qty
                    ));
                }
                if holds + d.qty <= *limit {
                    return Some(format!(
                        "[{tag}] {user} refused with limit_reached (limit {limit}) holding {holds} units, asking {}",
                        d.qty
                    ));
                }
            }
            Got::NoStock | Got::Sealed => {
                if let Some(c) = &cur {
                    if matches!(c.fx, Fx::Limbo { .. } | Fx::Unknown) {
                        self.rids.remove(&rid);
                    } else if matches!(got, Got::Sealed) {
                        return Some(format!(
                            "[sealed-applied] {rid} answered sealed but it applied ({c:?})"
                        ));
                    }
                }
            }
            Got::Other => {}
        }
        None
    }
}
