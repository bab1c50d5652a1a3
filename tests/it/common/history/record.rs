//! What the workload records of each operation: its kind, request, engine, invoke and return
//! times (client clock, µs) and outcome — ok, failed (nothing happened) or unknown.

use shardstock::store::ResvState;
use shardstock::{Deduction, Part, ReservationEnd, Reserved, Restocked};
use std::collections::BTreeSet;

/// What an operation was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Deduct,
    Reserve,
    Confirm,
    Cancel,
    Restock,
    /// The end-of-run deduct of a user below the limit (fresh id; must not be refused).
    Final,
}

impl Kind {
    /// Deduct-like (sells on apply).
    pub fn sells(self) -> bool {
        matches!(self, Kind::Deduct | Kind::Final)
    }
    /// Takes units for a user (deduct, final or reserve).
    pub fn takes(self) -> bool {
        matches!(self, Kind::Deduct | Kind::Final | Kind::Reserve)
    }
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Deduct => "deduct",
            Kind::Reserve => "reserve",
            Kind::Confirm => "confirm",
            Kind::Cancel => "cancel",
            Kind::Restock => "restock",
            Kind::Final => "final-deduct",
        }
    }
}

/// An ok answer.
#[derive(Debug, Clone)]
pub enum Val {
    Ded(Deduction),
    Res(Reserved),
    End(ReservationEnd),
    Stock(Restocked),
}

/// How an operation ended.
#[derive(Debug, Clone)]
pub enum Out {
    /// A definite answer.
    Ok(Val),
    /// A typed error meaning nothing happened (conflict, invalid input).
    Fail(String),
    /// Infrastructure error, timeout or dropped future: it may or may not have taken effect.
    Unknown(String),
}

/// One recorded operation.
#[derive(Debug, Clone)]
pub struct Op {
    pub seq: usize,
    pub engine: usize,
    pub kind: Kind,
    /// The request id (for confirm / cancel: the reservation's request id).
    pub rid: String,
    pub user: String,
    pub qty: u64,
    /// Reservation TTL (reserve) in ms.
    pub ttl_ms: u64,
    /// Reservation id (confirm / cancel).
    pub resv: String,
    /// Why this request id: fresh, retry, collision, cross-kind, other-qty.
    pub why: &'static str,
    /// Invoke and return, µs since the UNIX epoch (the server's TIME runs on the same clock).
    pub inv: u64,
    pub ret: u64,
    pub out: Out,
}

impl Op {
    pub fn ded(&self) -> Option<&Deduction> {
        match &self.out {
            Out::Ok(Val::Ded(d)) | Out::Ok(Val::Res(Reserved::NotHeld(d))) => Some(d),
            _ => None,
        }
    }
    /// Applied now (deduct Applied, reserve Held): where and how many units.
    pub fn applied(&self) -> Option<Part> {
        match &self.out {
            Out::Ok(Val::Ded(Deduction::Applied { segment, units }))
            | Out::Ok(Val::Res(Reserved::Held { segment, units, .. })) => Some(Part {
                segment: *segment,
                units: *units,
            }),
            _ => None,
        }
    }
    /// Replayed: where and how many units.
    pub fn replayed(&self) -> Option<Part> {
        match &self.out {
            Out::Ok(Val::Ded(Deduction::Replayed { segment, units }))
            | Out::Ok(Val::Res(Reserved::Replayed { segment, units, .. })) => Some(Part {
                segment: *segment,
                units: *units,
            }),
            _ => None,
        }
    }
    /// Applied or replayed: the answer says this request holds units.
    pub fn holds(&self) -> Option<Part> {
        self.applied().or_else(|| self.replayed())
    }
    /// The request this operation is about: (user, request id) — request ids are scoped per
    /// user (for confirm / cancel: the reservation's).
    pub fn key(&self) -> Key<'_> {
        (self.user.as_str(), self.rid.as_str())
    }
    pub fn unknown(&self) -> bool {
        matches!(self.out, Out::Unknown(_))
    }
    /// An ok confirm/cancel that says it brought the reservation there.
    pub fn end_done(&self) -> bool {
        matches!(&self.out, Out::Ok(Val::End(e)) if e.done)
    }
    fn outcome(&self) -> String {
        match &self.out {
            Out::Ok(Val::Ded(d)) => format!("{d:?}"),
            Out::Ok(Val::Res(r)) => format!("{r:?}"),
            Out::Ok(Val::End(e)) => format!("state {:?} done {}", e.state, e.done),
            Out::Ok(Val::Stock(s)) => format!("{s:?}"),
            Out::Fail(e) => format!("FAIL {e}"),
            Out::Unknown(e) => format!("UNKNOWN {e}"),
        }
    }
    pub fn line(&self, t0: u64) -> String {
        let ms = |t: u64| (t.saturating_sub(t0)) as f64 / 1000.0;
        let what = match self.kind {
            Kind::Confirm | Kind::Cancel => format!("{} {}", self.kind.name(), self.resv),
            Kind::Restock => format!("restock {} qty {}", self.rid, self.qty),
            Kind::Reserve => format!(
                "reserve {} user {} qty {} ttl {}ms ({})",
                self.rid, self.user, self.qty, self.ttl_ms, self.why
            ),
            _ => format!(
                "{} {} user {} qty {} ({})",
                self.kind.name(),
                self.rid,
                self.user,
                self.qty,
                self.why
            ),
        };
        format!(
            "#{:<5} e{} [{:>8.1} .. {:>8.1} ms] {what} -> {}",
            self.seq,
            self.engine,
            ms(self.inv),
            ms(self.ret),
            self.outcome()
        )
    }
}

/// A request: (user, request id). Request ids are scoped per (SKU, user): the same id under
/// another user is another request.
pub type Key<'a> = (&'a str, &'a str);

/// A request's key as owned strings.
pub type OwnedKey = (String, String);

/// The key as text, `user/request id` (for reports).
pub fn key_text((user, rid): Key<'_>) -> String {
    format!("{user}/{rid}")
}

/// (user, request id) of a reservation id `<sku>~<generation>~<segment>~<user>~<request id>`.
pub fn resv_key(id: &str) -> Option<(&str, &str)> {
    let mut it = id.splitn(5, '~').skip(3);
    Some((it.next()?, it.next()?))
}

/// (generation, segment) of a reservation id.
pub fn resv_place(id: &str) -> Option<(u64, u32)> {
    let mut it = id.splitn(5, '~');
    it.next()?;
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The requests of a history (restocks aside).
pub fn key_set(ops: &[Op]) -> BTreeSet<OwnedKey> {
    ops.iter()
        .filter(|o| o.kind != Kind::Restock)
        .map(|o| (o.user.clone(), o.rid.clone()))
        .collect()
}

/// States of reservation end answers, for callers that need them.
pub fn end_state(o: &Op) -> Option<ResvState> {
    match &o.out {
        Out::Ok(Val::End(e)) => e.state,
        _ => None,
    }
}
