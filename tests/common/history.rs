//! History checking: operations recorded as invoke → ok / fail / unknown, store facts read
//! from Redis at the end, and the checks of issue 11 ("make the suite find the next ones").
//!
//! Pure logic: the workload (tests/history.rs) records [`Op`]s and reads [`Facts`]; [`check`]
//! turns them into [`Violation`]s and [`report`] prints each with the operations of the
//! request ids and users involved (the shrunk description of a failure).
#![allow(dead_code)]

use shardstock::store::ResvState;
use shardstock::{Audit, Deduction, Part, ReservationEnd, Reserved, Restocked};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

/// Slack (µs) when comparing client clocks with the server's `TIME` (same host).
pub const SLACK_US: u64 = 20_000;

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
    fn name(self) -> &'static str {
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
    /// A typed error meaning nothing happened (conflict, invalid input, sealed).
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
    /// Applied now (deduct Applied, reserve Held), with parts.
    pub fn applied(&self) -> Option<&[Part]> {
        match &self.out {
            Out::Ok(Val::Ded(Deduction::Applied { parts }))
            | Out::Ok(Val::Res(Reserved::Held { parts, .. })) => Some(parts),
            _ => None,
        }
    }
    /// Replayed, with parts.
    pub fn replayed(&self) -> Option<&[Part]> {
        match &self.out {
            Out::Ok(Val::Ded(Deduction::Replayed { parts }))
            | Out::Ok(Val::Res(Reserved::Replayed { parts, .. })) => Some(parts),
            _ => None,
        }
    }
    /// Applied or replayed: the answer says this request holds units.
    pub fn holds(&self) -> Option<&[Part]> {
        self.applied().or_else(|| self.replayed())
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

/// The request id of a reservation id `<sku>~<generation>~<segment>~<request id>`.
pub fn resv_rid(id: &str) -> Option<&str> {
    id.splitn(4, '~').nth(3)
}

/// (generation, segment) of a reservation id.
pub fn resv_place(id: &str) -> Option<(u64, u32)> {
    let mut it = id.splitn(4, '~');
    it.next()?;
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// What the store holds at the end, read after everything settled.
#[derive(Debug, Clone)]
pub struct Facts {
    pub segments: u32,
    pub limit: u64,
    /// rid → per segment index, the request record's fields (empty: none).
    pub records: BTreeMap<String, Vec<HashMap<String, String>>>,
    /// user → user record fields (`r:<rid>` → `<qty>:<P|R|S>:<expiry>`).
    pub users: BTreeMap<String, HashMap<String, String>>,
    pub audit: Audit,
}

/// The store's verdict on one request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// No record (never applied, or released).
    None,
    /// Sealed: can never apply.
    Sealed { user: String, qty: u64 },
    /// A sale, applied.
    Sale {
        user: String,
        qty: u64,
        parts: Vec<Part>,
    },
    /// A reservation, applied, now in `state` (R, C, X, K); expiry on the server clock (ms).
    Resv {
        user: String,
        qty: u64,
        seg: u32,
        state: char,
        exp_ms: u64,
    },
    /// A fallback claim still pending (never settled).
    Claim { user: String, qty: u64 },
}

impl Effect {
    pub fn owner(&self) -> Option<(&str, u64, Kind)> {
        match self {
            Effect::Sale { user, qty, .. } => Some((user, *qty, Kind::Deduct)),
            Effect::Resv { user, qty, .. } => Some((user, *qty, Kind::Reserve)),
            _ => None,
        }
    }
}

/// Per request id: the effect, units the counters hold for it, and inconsistencies.
#[derive(Debug, Clone)]
pub struct RidFacts {
    pub effect: Effect,
    /// Units counted in the segments' `sold` because of this id's records.
    pub sold: u64,
    /// Units counted in `reserved` (live reservations).
    pub reserved: u64,
    /// Units taken for this id while its claim never settled or after it ended (stranded).
    pub stranded: u64,
    /// (class, text)
    pub problems: Vec<(&'static str, String)>,
}

fn num(m: &HashMap<String, String>, f: &str) -> u64 {
    m.get(f).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Units a part record still keeps out of stock (a reserved part that expired or was
/// cancelled gave its units back).
fn kept(r: &HashMap<String, String>) -> u64 {
    match r.get("rs").map(String::as_str) {
        Some("X" | "K") => 0,
        _ => num(r, "p"),
    }
}

fn fields(m: &HashMap<String, String>) -> String {
    let mut v: Vec<_> = m.iter().collect();
    v.sort();
    v.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn parts_of(s: &str) -> Vec<Part> {
    shardstock::segments::decode_parts(s).unwrap_or_default()
}

/// Interprets the records of one request id.
pub fn rid_facts(rid: &str, recs: &[HashMap<String, String>], segments: u32) -> RidFacts {
    let home = shardstock::segments::home(&shardstock::RequestId::new(rid).unwrap(), segments);
    let h = &recs[home as usize];
    let mut f = RidFacts {
        effect: Effect::None,
        sold: 0,
        reserved: 0,
        stranded: 0,
        problems: Vec::new(),
    };
    // Units per record: rs = C sold, R reserved; sale parts: home part in `parts` (or `hp`
    // while claimed), other segments' parts in their own record (s=A, p).
    for (i, r) in recs.iter().enumerate() {
        match r.get("rs").map(String::as_str) {
            Some("C") => f.sold += num(r, "rq"),
            Some("R") => f.reserved += num(r, "rq"),
            _ => {}
        }
        let rs = r.contains_key("rs");
        if i as u32 != home && r.get("s").map(String::as_str) == Some("A") && !rs {
            f.sold += num(r, "p");
        }
    }
    let user = h.get("u").cloned().unwrap_or_default();
    let qty = num(h, "q");
    match h.get("s").map(String::as_str) {
        None => {
            for (i, r) in recs.iter().enumerate() {
                if r.get("s").map(String::as_str) == Some("A") {
                    f.stranded += kept(r);
                    f.problems.push((
                        "part taken, no home record",
                        format!(
                            "no home record (segment {home}) but a part record at segment {i}: {}",
                            fields(r)
                        ),
                    ));
                }
            }
        }
        Some("A") => {
            let parts = parts_of(h.get("parts").map(String::as_str).unwrap_or(""));
            let sum: u64 = parts.iter().map(|p| p.units).sum();
            if sum != qty {
                f.problems.push((
                    "applied parts do not sum to qty",
                    format!("applied parts {parts:?} sum {sum} != qty {qty}"),
                ));
            }
            let holder = parts
                .iter()
                .map(|p| p.segment)
                .find(|s| recs.get(*s as usize).is_some_and(|r| r.contains_key("rs")));
            if let Some(seg) = holder {
                let r = &recs[seg as usize];
                let state = r.get("rs").and_then(|s| s.chars().next()).unwrap_or('?');
                f.effect = Effect::Resv {
                    user: user.clone(),
                    qty,
                    seg,
                    state,
                    exp_ms: num(r, "exp"),
                };
            } else {
                if !h.contains_key("rs")
                    && let Some(p) = parts.iter().find(|p| p.segment == home)
                {
                    f.sold += p.units;
                }
                f.effect = Effect::Sale {
                    user: user.clone(),
                    qty,
                    parts: parts.clone(),
                };
            }
            for p in &parts {
                if p.segment == home {
                    continue;
                }
                let r = &recs[p.segment as usize];
                if r.get("s").map(String::as_str) != Some("A") || num(r, "p") != p.units {
                    f.problems.push((
                        "applied part missing at its segment",
                        format!(
                            "applied part {}:{} but the record there is [{}]",
                            p.segment,
                            p.units,
                            fields(r)
                        ),
                    ));
                }
            }
            for (i, r) in recs.iter().enumerate() {
                if i as u32 != home
                    && r.get("s").map(String::as_str) == Some("A")
                    && !parts.iter().any(|p| p.segment == i as u32)
                {
                    f.stranded += kept(r);
                    f.problems.push((
                        "part taken outside the applied parts",
                        format!(
                            "part record at segment {i} not among the applied parts: {}",
                            fields(r)
                        ),
                    ));
                }
            }
        }
        Some("P") => {
            f.effect = Effect::Claim {
                user: user.clone(),
                qty,
            };
            if !h.contains_key("rs") {
                f.sold += num(h, "hp");
            }
            let home_kept = match h.get("rs").map(String::as_str) {
                Some("X" | "K") => 0,
                _ => num(h, "hp"),
            };
            let taken: u64 = home_kept
                + recs
                    .iter()
                    .enumerate()
                    .filter(|(i, r)| {
                        *i as u32 != home && r.get("s").map(String::as_str) == Some("A")
                    })
                    .map(|(_, r)| kept(r))
                    .sum::<u64>();
            f.stranded += taken;
            f.problems.push(("fallback claim never settled (abandoned)", format!(
                "fallback claim never settled (after the sweeper and past its lease): {taken} of {qty} units still taken for it [{}]",
                fields(h)
            )));
        }
        Some("X") => {
            f.effect = Effect::Sealed { user, qty };
            for (i, r) in recs.iter().enumerate() {
                if i as u32 != home && r.get("s").map(String::as_str) == Some("A") {
                    f.stranded += kept(r);
                    f.problems.push((
                        "sealed, yet a part is taken",
                        format!("sealed, yet a part is taken at segment {i}: {}", fields(r)),
                    ));
                }
            }
        }
        Some(other) => f.problems.push((
            "home record in an unknown state",
            format!("home record in state {other:?}"),
        )),
    }
    f
}

/// A broken promise.
#[derive(Debug, Clone)]
pub struct Violation {
    pub check: &'static str,
    /// What kind of failure (violations of one class are shown by example).
    pub class: &'static str,
    pub text: String,
    pub rids: Vec<String>,
    pub users: Vec<String>,
    /// Time window (µs) of interest for the users' operations.
    pub window: Option<(u64, u64)>,
}

fn v(
    check: &'static str,
    class: &'static str,
    text: String,
    rids: &[&str],
    users: &[&str],
) -> Violation {
    Violation {
        check,
        class,
        text,
        rids: rids.iter().map(|s| s.to_string()).collect(),
        users: users.iter().map(|s| s.to_string()).collect(),
        window: None,
    }
}

pub const C1: &str = "1 one effect per request id";
pub const C2: &str = "2 ok sales counted once, unknown all-or-nothing";
pub const C3: &str = "3 no user above the limit";
pub const C4: &str = "4 one end state per reservation";
pub const C5: &str = "5 conservation";
pub const C6: &str = "6 no user refused below the limit";
pub const C0: &str = "0 unexpected errors";

/// Options the checks need.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub limit: u64,
    pub loaded: u64,
    /// The engines' user claim TTL (µs): a dropped attempt may keep the user busy that long.
    /// How long after a call with an unknown outcome its user may still be answered UserBusy
    /// (the per-user claim TTL plus the fallback claim lease, with slack).
    pub user_claim_ttl_us: u64,
    /// Engines of the workload; the final purchase may also use a new one (index `engines`).
    pub engines: usize,
}

/// Runs every check; `facts` were read after the sweeper ran and everything expired.
pub fn check(ops: &[Op], facts: &Facts, p: Params) -> Vec<Violation> {
    let mut out = Vec::new();
    let rf: BTreeMap<&str, RidFacts> = facts
        .records
        .iter()
        .map(|(rid, recs)| (rid.as_str(), rid_facts(rid, recs, facts.segments)))
        .collect();
    let none = RidFacts {
        effect: Effect::None,
        sold: 0,
        reserved: 0,
        stranded: 0,
        problems: Vec::new(),
    };
    let fact = |rid: &str| rf.get(rid).unwrap_or(&none);
    // Ops by request id (confirm / cancel under their reservation's request id).
    let mut by_rid: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for o in ops {
        if o.kind != Kind::Restock {
            by_rid.entry(o.rid.as_str()).or_default().push(o);
        }
    }

    // 0. Errors that are neither "nothing happened" nor infrastructure.
    for o in ops {
        if let Out::Unknown(e) = &o.out
            && (e.starts_with("unexpected") || e.contains("store reply"))
        {
            out.push(v(
                C0,
                "unexpected error",
                format!("op #{} answered an unexpected error: {e}", o.seq),
                &[&o.rid],
                &[],
            ));
        }
    }

    // 1. One effect per request id.
    for (rid, os) in &by_rid {
        let f = fact(rid);
        let takers: Vec<&&Op> = os.iter().filter(|o| o.kind.takes()).collect();
        let applied: Vec<&&&Op> = takers.iter().filter(|o| o.applied().is_some()).collect();
        if applied.len() > 1 {
            out.push(v(
                C1,
                "applied more than once",
                format!(
                    "{rid}: applied {} times: {}",
                    applied.len(),
                    applied
                        .iter()
                        .map(|o| format!("#{} {} {} qty {}", o.seq, o.kind.name(), o.user, o.qty))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                &[rid],
                &[],
            ));
        }
        let first_parts = applied.first().and_then(|o| o.applied());
        for o in &takers {
            let Some(parts) = o.holds() else { continue };
            let how = if o.applied().is_some() {
                "applied"
            } else {
                "replayed"
            };
            let kind = if o.kind.sells() {
                Kind::Deduct
            } else {
                Kind::Reserve
            };
            match f.effect.owner() {
                Some((u, q, k)) if (u, q, k) == (o.user.as_str(), o.qty, kind) => {}
                Some((u, q, k)) => out.push(v(
                    C1,
                    if u != o.user {
                        "replayed to another user"
                    } else if q == o.qty {
                        "replayed across kinds (sale vs reservation)"
                    } else {
                        "answer disagrees with the store's record"
                    },
                    format!(
                        "{rid}: op #{} ({} by {} qty {}) answered {how}, but the request id's effect in the store is a {} by {u} qty {q}{}",
                        o.seq,
                        o.kind.name(),
                        o.user,
                        o.qty,
                        k.name(),
                        match &f.effect {
                            Effect::Resv { state, .. } => format!(" (reservation state {state})"),
                            _ => String::new(),
                        }
                    ),
                    &[rid],
                    &[&o.user],
                )),
                None => out.push(v(
                    C1, "holds per the answer, no applied record in the store",
                    format!(
                        "{rid}: op #{} ({} by {} qty {}) answered {how}, but the store has no applied record: {:?}",
                        o.seq,
                        o.kind.name(),
                        o.user,
                        o.qty,
                        f.effect
                    ),
                    &[rid],
                    &[&o.user],
                )),
            }
            if let Some(fp) = first_parts
                && fp != parts
            {
                out.push(v(
                    C1, "replay parts differ from the applying op",
                    format!(
                        "{rid}: op #{} answered {how} with parts {parts:?}, the applying op with {fp:?}",
                        o.seq
                    ),
                    &[rid],
                    &[],
                ));
            }
            if let Effect::Sale { parts: sp, .. } = &f.effect
                && sp != parts
            {
                out.push(v(
                    C1, "parts differ from the store's record",
                    format!(
                        "{rid}: op #{} answered {how} with parts {parts:?}, the store's record says {sp:?}",
                        o.seq
                    ),
                    &[rid],
                    &[],
                ));
            }
        }
        // Sealed means it can never apply.
        if let Some(o) = takers
            .iter()
            .find(|o| matches!(&o.out, Out::Fail(e) if e.starts_with("Sealed")))
            && f.effect.owner().is_some()
        {
            out.push(v(
                C1,
                "sealed, yet applied",
                format!(
                    "{rid}: op #{} answered Sealed, yet the request id applied: {:?}",
                    o.seq, f.effect
                ),
                &[rid],
                &[],
            ));
        }
        // A conflict when every sender used the very same parameters is spurious.
        let keys: BTreeSet<(&str, u64, bool)> = takers
            .iter()
            .map(|o| (o.user.as_str(), o.qty, o.kind.sells()))
            .collect();
        if keys.len() == 1
            && let Some(o) = takers
                .iter()
                .find(|o| matches!(&o.out, Out::Fail(e) if e.starts_with("RequestIdConflict")))
        {
            out.push(v(
                C1, "spurious conflict",
                format!(
                    "{rid}: op #{} answered a conflict, but every use of the id had the same user, qty and kind",
                    o.seq
                ),
                &[rid],
                &[],
            ));
        }
    }

    // 2. Every ok sale and confirmed reservation counted in `sold` once; unknown ones all or
    //    nothing.
    let mut hist_sold = 0u64;
    let mut unknown_max = 0u64;
    for (rid, os) in &by_rid {
        let f = fact(rid);
        for (pc, p) in &f.problems {
            out.push(v(C2, pc, format!("{rid}: {p}"), &[rid], &[]));
        }
        let ok_sale = os.iter().find(|o| o.kind.sells() && o.holds().is_some());
        let confirmed = os.iter().find(|o| o.kind == Kind::Confirm && o.end_done());
        if let Some(o) = ok_sale {
            hist_sold += o.qty;
            if !matches!(&f.effect, Effect::Sale { user, qty, .. } if *user == o.user && *qty == o.qty)
            {
                out.push(v(
                    C2, "ok sale not in sold as a sale",
                    format!(
                        "{rid}: ok sale (op #{}, {} qty {}) is not in `sold` as a sale; the store says {:?}",
                        o.seq, o.user, o.qty, f.effect
                    ),
                    &[rid],
                    &[&o.user],
                ));
            }
        }
        if let Some(c) = confirmed {
            let q = match &f.effect {
                Effect::Resv { qty, .. } => *qty,
                _ => os
                    .iter()
                    .find(|o| o.kind == Kind::Reserve)
                    .map_or(0, |o| o.qty),
            };
            if ok_sale.is_none() {
                hist_sold += q;
            }
            if !matches!(&f.effect, Effect::Resv { state: 'C', .. }) {
                out.push(v(
                    C2,
                    "confirmed, but not confirmed in the store",
                    format!(
                        "{rid}: confirmed (op #{} done) but the store says {:?}",
                        c.seq, f.effect
                    ),
                    &[rid],
                    &[],
                ));
            }
        }
        if ok_sale.is_none() && confirmed.is_none() {
            // Whatever may have sold without a definite answer.
            let sale_unknown = os
                .iter()
                .filter(|o| o.kind.sells() && o.unknown())
                .map(|o| o.qty)
                .max()
                .unwrap_or(0);
            let confirm_unknown = if os.iter().any(|o| o.kind == Kind::Confirm && o.unknown()) {
                os.iter()
                    .filter(|o| o.kind == Kind::Reserve)
                    .map(|o| o.qty)
                    .max()
                    .unwrap_or(0)
            } else {
                0
            };
            unknown_max += sale_unknown.max(confirm_unknown);
        }
    }
    let a = &facts.audit;
    if a.sold < hist_sold || a.sold > hist_sold + unknown_max {
        out.push(v(
            C2,
            "sold outside the history's bounds",
            format!(
                "sold {} is outside [ok sales + ok confirms {hist_sold}, + unknown ones {}]",
                a.sold,
                hist_sold + unknown_max
            ),
            &[],
            &[],
        ));
    }

    // 3. No user above the limit: units surely held at once (from definite answers and the
    //    store's records), and units sold at the end.
    let mut by_user: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for o in ops.iter().filter(|o| o.kind.takes()) {
        by_user.entry(o.user.as_str()).or_default().push(o);
    }
    let mut sure: BTreeMap<String, Vec<(u64, u64, u64, String)>> = BTreeMap::new(); // user → (from, to, qty, rid)
    let mut maybe: BTreeMap<String, Vec<(u64, u64, u64, String)>> = BTreeMap::new();
    let mut final_units: BTreeMap<String, (u64, Vec<String>)> = BTreeMap::new();
    for (rid, os) in &by_rid {
        let f = fact(rid);
        let first_inv = os
            .iter()
            .filter(|o| o.kind.takes())
            .map(|o| o.inv)
            .min()
            .unwrap_or(0);
        match &f.effect {
            Effect::Sale { user, qty, .. } => {
                let e = final_units.entry(user.clone()).or_default();
                e.0 += qty;
                e.1.push(rid.to_string());
                let known = os
                    .iter()
                    .filter(|o| o.kind.sells() && o.holds().is_some() && o.user == *user)
                    .map(|o| o.ret)
                    .min();
                if let Some(t) = known {
                    sure.entry(user.clone()).or_default().push((
                        t,
                        u64::MAX,
                        *qty,
                        rid.to_string(),
                    ));
                }
                maybe.entry(user.clone()).or_default().push((
                    first_inv,
                    u64::MAX,
                    *qty,
                    rid.to_string(),
                ));
            }
            Effect::Resv {
                user,
                qty,
                state,
                exp_ms,
                ..
            } => {
                let exp = exp_ms * 1000;
                if *state == 'C' {
                    let e = final_units.entry(user.clone()).or_default();
                    e.0 += qty;
                    e.1.push(rid.to_string());
                }
                let held = os
                    .iter()
                    .filter(|o| o.kind == Kind::Reserve && o.holds().is_some() && o.user == *user)
                    .map(|o| o.ret)
                    .min();
                let cancels = || os.iter().filter(|o| o.kind == Kind::Cancel);
                let (sure_to, maybe_to) = match state {
                    'C' | 'R' => (u64::MAX, u64::MAX),
                    'X' => (exp.saturating_sub(SLACK_US), exp + SLACK_US),
                    _ => {
                        let first_cancel = cancels().map(|o| o.inv).min().unwrap_or(exp);
                        let last_cancel = cancels()
                            .map(|o| if o.unknown() { u64::MAX } else { o.ret })
                            .max()
                            .unwrap_or(exp);
                        (
                            first_cancel.min(exp).saturating_sub(SLACK_US),
                            last_cancel.min(exp) + SLACK_US,
                        )
                    }
                };
                if let Some(t) = held
                    && t < sure_to
                {
                    sure.entry(user.clone())
                        .or_default()
                        .push((t, sure_to, *qty, rid.to_string()));
                }
                maybe.entry(user.clone()).or_default().push((
                    first_inv,
                    maybe_to,
                    *qty,
                    rid.to_string(),
                ));
            }
            Effect::Claim { user, qty } => {
                maybe.entry(user.clone()).or_default().push((
                    first_inv,
                    u64::MAX,
                    *qty,
                    rid.to_string(),
                ));
            }
            _ => {}
        }
    }
    for (user, (units, rids)) in &final_units {
        if *units > p.limit {
            let r: Vec<&str> = rids.iter().map(String::as_str).collect();
            out.push(v(
                C3,
                "sold above the limit at the end",
                format!(
                    "{user} ends with {units} units sold (limit {}): {}",
                    p.limit,
                    rids.join(", ")
                ),
                &r,
                &[user],
            ));
        }
    }
    for (user, iv) in &sure {
        let mut worst: Option<(u64, u64, Vec<&str>)> = None;
        for (t, ..) in iv {
            let at: Vec<&(u64, u64, u64, String)> =
                iv.iter().filter(|(a, b, ..)| a <= t && *t < *b).collect();
            let units: u64 = at.iter().map(|x| x.2).sum();
            if units > p.limit && worst.as_ref().is_none_or(|w| units > w.1) {
                worst = Some((*t, units, at.iter().map(|x| x.3.as_str()).collect()));
            }
        }
        if let Some((t, units, rids)) = worst {
            let mut x = v(
                C3,
                "held above the limit at once",
                format!(
                    "{user} held {units} units at once (limit {}): {}",
                    p.limit,
                    rids.join(", ")
                ),
                &rids,
                &[user],
            );
            x.window = Some((t.saturating_sub(2_000_000), t));
            out.push(x);
        }
    }

    // 4. Every reservation in exactly one end state.
    for (rid, os) in &by_rid {
        let f = fact(rid);
        let confirms: Vec<&&Op> = os
            .iter()
            .filter(|o| o.kind == Kind::Confirm && o.end_done())
            .collect();
        let cancels: Vec<&&Op> = os
            .iter()
            .filter(|o| o.kind == Kind::Cancel && o.end_done())
            .collect();
        if let (Some(c), Some(k)) = (confirms.first(), cancels.first()) {
            out.push(v(
                C4,
                "both confirmed and cancelled",
                format!(
                    "{rid}: both confirmed (op #{}) and cancelled (op #{})",
                    c.seq, k.seq
                ),
                &[rid],
                &[],
            ));
        }
        if let Effect::Resv { state, exp_ms, .. } = &f.effect {
            if let Some(k) = cancels.first()
                && *state != 'K'
            {
                out.push(v(
                    C4,
                    "cancelled, but not cancelled in the store",
                    format!(
                        "{rid}: cancelled (op #{} done) but the store's state is {state}",
                        k.seq
                    ),
                    &[rid],
                    &[],
                ));
            }
            if *state == 'R' {
                out.push(v(
                    C4,
                    "still held after expiry and sweep",
                    format!("{rid}: still held after its expiry and the sweeper"),
                    &[rid],
                    &[],
                ));
            }
            let all_confirms: Vec<&&Op> = os.iter().filter(|o| o.kind == Kind::Confirm).collect();
            if *state == 'C'
                && !all_confirms.is_empty()
                && all_confirms
                    .iter()
                    .all(|o| o.inv > exp_ms * 1000 + SLACK_US)
            {
                out.push(v(
                    C4,
                    "confirmed after expiry",
                    format!(
                        "{rid}: confirmed although every confirm came after its expiry ({} ms)",
                        exp_ms
                    ),
                    &[rid],
                    &[],
                ));
            }
        }
        for o in os.iter().filter(|o| o.kind == Kind::Reserve) {
            let id = match &o.out {
                Out::Ok(Val::Res(Reserved::Held { id, .. } | Reserved::Replayed { id, .. })) => id,
                _ => continue,
            };
            let here = resv_place(&id.to_string());
            let want = match &f.effect {
                Effect::Resv { seg, .. } => Some((facts.audit.generation, *seg)),
                _ => None,
            };
            if want.is_some() && here != want {
                out.push(v(
                    C4, "reservation id names the wrong place",
                    format!(
                        "{rid}: op #{} returned reservation id {id}, but the units are held at (generation, segment) {want:?}",
                        o.seq
                    ),
                    &[rid],
                    &[],
                ));
            }
        }
    }

    // 5. Conservation, and the counters explained by the records.
    if !a.ok {
        out.push(v(
            C5,
            "audit not ok",
            format!("audit not ok: {:?}", a.problems),
            &[],
            &[],
        ));
    }
    if a.loaded + a.restocked != a.remaining + a.reserved + a.sold {
        out.push(v(
            C5,
            "loaded + restocked != remaining + reserved + sold",
            format!(
                "loaded {} + restocked {} != remaining {} + reserved {} + sold {}",
                a.loaded, a.restocked, a.remaining, a.reserved, a.sold
            ),
            &[],
            &[],
        ));
    }
    if a.loaded != p.loaded {
        out.push(v(
            C5,
            "loaded differs",
            format!("loaded {} != {}", a.loaded, p.loaded),
            &[],
            &[],
        ));
    }
    if a.reserved != 0 {
        out.push(v(
            C5,
            "reserved after settling",
            format!(
                "reserved {} after every reservation expired and the sweeper ran",
                a.reserved
            ),
            &[],
            &[],
        ));
    }
    let rec_sold: u64 = rf.values().map(|f| f.sold).sum();
    let rec_reserved: u64 = rf.values().map(|f| f.reserved).sum();
    if rec_sold != a.sold {
        out.push(v(
            C5,
            "sold not explained by the request records",
            format!(
                "segments count {} sold, the request records account for {rec_sold}",
                a.sold
            ),
            &[],
            &[],
        ));
    }
    if rec_reserved != a.reserved {
        out.push(v(
            C5,
            "reserved not explained by live reservations",
            format!(
                "segments count {} reserved, live reservations hold {rec_reserved}",
                a.reserved
            ),
            &[],
            &[],
        ));
    }
    let stranded: Vec<(&str, u64)> = rf
        .iter()
        .filter(|(_, f)| f.stranded > 0)
        .map(|(r, f)| (*r, f.stranded))
        .collect();
    if !stranded.is_empty() {
        let r: Vec<&str> = stranded.iter().map(|x| x.0).collect();
        out.push(v(
            C5, "units stranded",
            format!(
                "{} units taken by requests that never applied (counted as sold, sold to nobody): {stranded:?}",
                stranded.iter().map(|x| x.1).sum::<u64>()
            ),
            &r,
            &[],
        ));
    }
    let mut restock_ok = 0;
    let mut restock_unknown = 0;
    let mut seen = BTreeSet::new();
    for o in ops.iter().filter(|o| o.kind == Kind::Restock) {
        if let Out::Ok(Val::Stock(s)) = &o.out
            && !s.replayed
            && seen.insert(o.rid.as_str())
        {
            restock_ok += o.qty;
        }
    }
    let mut unknown_rs = BTreeSet::new();
    for o in ops
        .iter()
        .filter(|o| o.kind == Kind::Restock && o.unknown())
    {
        if !seen.contains(o.rid.as_str()) && unknown_rs.insert(o.rid.as_str()) {
            restock_unknown += o.qty;
        }
    }
    if a.restocked < restock_ok || a.restocked > restock_ok + restock_unknown {
        out.push(v(
            C5,
            "restocked outside the history's bounds",
            format!(
                "restocked {} outside [ok restocks {restock_ok}, + unknown {}]",
                a.restocked,
                restock_ok + restock_unknown
            ),
            &[],
            &[],
        ));
    }

    // 6. No user refused with LimitReached who held less; UserBusy only while another attempt
    //    of the user runs.
    for o in ops
        .iter()
        .filter(|o| o.kind.takes() && o.kind != Kind::Final)
    {
        match o.ded() {
            Some(Deduction::LimitReached { limit }) => {
                if o.qty > *limit {
                    continue;
                }
                // A retry of a request id this user was already told it holds: it must replay
                // (same kind) or be refused as a conflict (other kind); never count it against
                // itself.
                let told_before = by_rid.get(o.rid.as_str()).is_some_and(|os| {
                    os.iter()
                        .any(|x| x.user == o.user && x.holds().is_some() && x.ret < o.inv)
                });
                if let Some((u, q, k)) = fact(&o.rid).effect.owner()
                    && u == o.user
                    && told_before
                {
                    let same = (k == Kind::Deduct) == o.kind.sells() && q == o.qty;
                    if same {
                        let mut x = v(
                            C1,
                            "retry answered LimitReached instead of a replay",
                            format!(
                                "{}: op #{} ({} by {} qty {}, engine {}) is a retry of an applied request but answered LimitReached instead of replaying it",
                                o.rid,
                                o.seq,
                                o.kind.name(),
                                o.user,
                                o.qty,
                                o.engine
                            ),
                            &[&o.rid],
                            &[&o.user],
                        );
                        x.window = Some((o.inv.saturating_sub(1_000_000), o.ret));
                        out.push(x);
                    }
                    continue;
                }
                let iv = maybe.get(&o.user).map(Vec::as_slice).unwrap_or(&[]);
                let mut ts = vec![o.inv];
                ts.extend(iv.iter().map(|x| x.0).filter(|t| *t > o.inv && *t <= o.ret));
                let most = ts
                    .iter()
                    .map(|t| {
                        iv.iter()
                            .filter(|(a, b, _, r)| a <= t && t < b && *r != o.rid)
                            .map(|x| x.2)
                            .sum::<u64>()
                    })
                    .max()
                    .unwrap_or(0);
                if most + o.qty <= *limit {
                    let holding: Vec<&str> = iv
                        .iter()
                        .filter(|(a, b, _, r)| *a <= o.ret && o.inv < *b && *r != o.rid)
                        .map(|x| x.3.as_str())
                        .collect();
                    let (mut class, mut hint) = lockout(&o.user, facts, &rf);
                    if hint.is_empty() {
                        // Engine-local causes, from what this engine answered the user before.
                        let prior: Vec<&&Op> = by_user
                            .get(o.user.as_str())
                            .map(|os| {
                                os.iter()
                                    .filter(|q| q.engine == o.engine && q.ret < o.inv)
                                    .collect()
                            })
                            .unwrap_or_default();
                        if let Some(q) = prior.iter().rev().find(|q| {
                            matches!(q.ded(), Some(Deduction::LimitReached { .. })) && q.qty > o.qty
                        }) {
                            class = "engine remembers the refusal of a larger quantity";
                            hint = format!(
                                "; this engine refused qty {} to the user before (op #{})",
                                q.qty, q.seq
                            );
                        } else if let Some(q) = prior.iter().rev().find(|q| {
                            q.kind == Kind::Reserve
                                && q.holds().is_some()
                                && match fact(&q.rid).effect {
                                    Effect::Resv {
                                        state: 'X', exp_ms, ..
                                    } => exp_ms * 1000 < o.inv,
                                    Effect::Resv { state: 'K', .. } => {
                                        by_rid.get(q.rid.as_str()).is_some_and(|os| {
                                            os.iter().any(|c| {
                                                c.kind == Kind::Cancel
                                                    && c.end_done()
                                                    && c.ret < o.inv
                                            })
                                        })
                                    }
                                    _ => false,
                                }
                        }) {
                            class = "engine still counts an ended reservation";
                            hint = format!(
                                "; this engine held reservation {} for the user (op #{}), which ended before",
                                q.rid, q.seq
                            );
                        }
                    }
                    let mut x = v(
                        C6,
                        class,
                        format!(
                            "{} (op #{} {} {} qty {}, engine {}) refused LimitReached while holding at most {most} units (limit {limit}); units possibly held then: {holding:?}{hint}",
                            o.user,
                            o.seq,
                            o.kind.name(),
                            o.rid,
                            o.qty,
                            o.engine
                        ),
                        &[&o.rid],
                        &[&o.user],
                    );
                    x.window = Some((o.inv.saturating_sub(3_000_000), o.ret));
                    out.push(x);
                }
            }
            Some(Deduction::UserBusy) => {
                let busy = by_user.get(o.user.as_str()).is_some_and(|os| {
                    os.iter().any(|q| {
                        q.seq != o.seq
                            && q.inv <= o.ret
                            && (q.ret >= o.inv
                                || (q.unknown() && q.ret + p.user_claim_ttl_us >= o.inv))
                    })
                });
                if !busy {
                    let dropped = by_user.get(o.user.as_str()).and_then(|os| {
                        os.iter()
                            .filter(|q| q.engine == o.engine && q.unknown() && q.ret <= o.inv)
                            .max_by_key(|q| q.ret)
                    });
                    let mut x = v(
                        C6,
                        "UserBusy with no attempt of the user running",
                        format!(
                            "{} (op #{} {} {}, engine {}) answered UserBusy with no other attempt of the user running{}",
                            o.user,
                            o.seq,
                            o.kind.name(),
                            o.rid,
                            o.engine,
                            match dropped {
                                Some(q) => format!(
                                    "; the user's last dropped attempt on that engine: op #{} ({}) ended {:.0} ms before",
                                    q.seq,
                                    q.rid,
                                    (o.inv - q.ret) as f64 / 1000.0
                                ),
                                None => "; no dropped attempt of the user on that engine".into(),
                            }
                        ),
                        &[&o.rid],
                        &[&o.user],
                    );
                    x.window = Some((o.inv.saturating_sub(3_000_000), o.ret));
                    out.push(x);
                }
            }
            _ => {}
        }
    }
    // The end-of-run purchase of every user below the limit: never refused.
    let mut finals: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for o in ops.iter().filter(|o| o.kind == Kind::Final) {
        finals.entry(o.user.as_str()).or_default().push(o);
    }
    for (user, os) in finals {
        let bought = os.iter().find(|o| {
            matches!(
                o.ded(),
                Some(
                    Deduction::Applied { .. }
                        | Deduction::Replayed { .. }
                        | Deduction::SoldOut
                        | Deduction::Insufficient { .. }
                )
            )
        });
        let mut refusals: BTreeMap<(usize, String), usize> = BTreeMap::new();
        for o in &os {
            if bought.is_some_and(|b| b.seq == o.seq) {
                continue;
            }
            let what = match o.ded() {
                Some(d) => d.kind().to_string(),
                None => format!("{:?}", o.out),
            };
            *refusals.entry((o.engine, what)).or_default() += 1;
        }
        if refusals.is_empty() {
            continue;
        }
        let busy = refusals.keys().any(|(_, w)| w == "user_busy");
        let (class, hint) = lockout(user, facts, &rf);
        let class = match (bought.map(|b| b.engine), busy) {
            (Some(e), true) if e < p.engines => {
                "final purchase: UserBusy on an engine with nothing running; another engine sold"
            }
            (Some(e), false) if e < p.engines => {
                "final purchase: LimitReached from an engine's in-process state; another engine sold"
            }
            (Some(_), true) => {
                "final purchase refused by every engine (UserBusy among them); a new engine sold"
            }
            (Some(_), false) => {
                "final purchase: LimitReached from every engine's in-process state; a new engine sold"
            }
            (None, _) => match class {
                "locked out by an entry of another user's request id" => {
                    "final purchase refused even by a new engine: entry of another user's request id"
                }
                "locked out by a pending entry of a request that holds nothing" => {
                    "final purchase refused even by a new engine: pending entry of a request that holds nothing"
                }
                "locked out by an entry of a request that holds nothing" => {
                    "final purchase refused even by a new engine: entry of a request that holds nothing"
                }
                _ => "final purchase refused even by a new engine, no stale entry in the store",
            },
        };
        let held: u64 = os.first().map(|o| o.qty).map_or(0, |_| {
            rf.iter()
                .filter(|(r, _)| **r != os[0].rid)
                .filter_map(|(_, f)| match &f.effect {
                    Effect::Sale { user: u, qty, .. }
                    | Effect::Resv {
                        user: u,
                        qty,
                        state: 'C',
                        ..
                    } if u == user => Some(*qty),
                    _ => None,
                })
                .sum()
        });
        if held + os[0].qty > p.limit {
            continue; // e.g. an abandoned claim of the user's was completed meanwhile
        }
        let mut x = v(
            C6,
            class,
            format!(
                "{user} holds {held} unit(s) (limit {}) after everything settled; one more unit (request {}) was refused: {}{}{hint}",
                p.limit,
                os[0].rid,
                refusals
                    .iter()
                    .map(|((e, w), n)| format!("engine {e}: {w} x{n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                match bought {
                    Some(b) => format!(
                        "; then {} answered {}",
                        if b.engine < p.engines {
                            format!("engine {}", b.engine)
                        } else {
                            "a new engine".to_string()
                        },
                        b.ded().map_or("?", |d| d.kind())
                    ),
                    None => "; never bought, not even from a new engine".into(),
                }
            ),
            &[&os[0].rid],
            &[user],
        );
        x.window = Some((os[0].inv.saturating_sub(3_000_000), os[0].inv));
        out.push(x);
    }
    out
}

fn effect_user(e: &Effect) -> Option<&str> {
    match e {
        Effect::Sale { user, .. }
        | Effect::Resv { user, .. }
        | Effect::Claim { user, .. }
        | Effect::Sealed { user, .. } => Some(user),
        Effect::None => None,
    }
}

/// Why a user may be refused: entries of the user's record (at the end) that hold nothing.
fn lockout(user: &str, facts: &Facts, rf: &BTreeMap<&str, RidFacts>) -> (&'static str, String) {
    let Some(entries) = facts.users.get(user) else {
        return (
            "refused below the limit (no stale entry left in the store)",
            String::new(),
        );
    };
    let (mut other, mut pending) = (false, false);
    let mut phantom = Vec::new();
    let mut keys: Vec<_> = entries.iter().collect();
    keys.sort();
    for (k, val) in keys {
        let rid = k.strip_prefix("r:").unwrap_or(k);
        let e = rf.get(rid).map(|f| &f.effect);
        let live = matches!(
            e,
            Some(Effect::Sale { user: u, .. } | Effect::Resv { user: u, state: 'C' | 'R', .. })
                if u == user
        );
        if live {
            continue;
        }
        let owner = e.and_then(effect_user);
        if owner.is_some_and(|u| u != user) {
            other = true;
        }
        if val.contains(":P:") {
            pending = true;
        }
        phantom.push(format!(
            "{rid}={val} ({})",
            match (e, owner) {
                (None, _) | (Some(Effect::None), _) => "no record".to_string(),
                (Some(e), Some(u)) if u != user => format!("request id of {u}: {e:?}"),
                (Some(e), _) => format!("{e:?}"),
            }
        ));
    }
    let class = if other {
        "locked out by an entry of another user's request id"
    } else if pending {
        "locked out by a pending entry of a request that holds nothing"
    } else if !phantom.is_empty() {
        "locked out by an entry of a request that holds nothing"
    } else {
        "refused below the limit (no stale entry left in the store)"
    };
    let hint = if phantom.is_empty() {
        String::new()
    } else {
        format!(
            "; at the end the user record still counts {}",
            phantom.join(", ")
        )
    };
    (class, hint)
}

/// The violations, grouped by check, each with the operations of its request ids and users
/// (at most `per_check` examples per check).
pub fn report(ops: &[Op], facts: &Facts, vs: &[Violation], per_check: usize) -> String {
    let t0 = ops.iter().map(|o| o.inv).min().unwrap_or(0);
    let mut by: BTreeMap<&str, BTreeMap<&str, Vec<&Violation>>> = BTreeMap::new();
    for x in vs {
        by.entry(x.check)
            .or_default()
            .entry(x.class)
            .or_default()
            .push(x);
    }
    let mut s = String::new();
    for (check, classes) in &by {
        let n: usize = classes.values().map(Vec::len).sum();
        let _ = writeln!(s, "\n=== check {check}: {n} violation(s)");
        for (class, xs) in classes {
            let _ = writeln!(s, "\n  ## {class}: {} violation(s)", xs.len());
            for x in xs.iter().take(per_check) {
                let _ = writeln!(s, "--- {}", x.text);
                let mut shown = BTreeSet::new();
                let mut lines = Vec::new();
                for o in ops {
                    let by_rid = x.rids.contains(&o.rid);
                    // The user's other operations only where the user's holdings matter.
                    let by_user = x.users.contains(&o.user)
                        && (x.window.is_some() || x.check == C3)
                        && o.kind.takes()
                        && x.window.is_none_or(|(a, b)| o.ret >= a && o.inv <= b);
                    if (by_rid || by_user) && shown.insert(o.seq) {
                        lines.push(o);
                    }
                }
                let n = lines.len();
                for o in lines.iter().take(40) {
                    let _ = writeln!(s, "    {}", o.line(t0));
                }
                if n > 40 {
                    let _ = writeln!(s, "    ... {} more", n - 40);
                }
                for r in x.rids.iter().take(6) {
                    if let Some(recs) = facts.records.get(r) {
                        for (i, m) in recs.iter().enumerate() {
                            if !m.is_empty() {
                                let _ = writeln!(s, "    store {r} @ segment {i}: {}", fields(m));
                            }
                        }
                    }
                }
                for u in &x.users {
                    if let Some(m) = facts.users.get(u) {
                        let _ = writeln!(s, "    store user {u}: {}", fields(m));
                    }
                }
            }
            if xs.len() > per_check {
                let _ = writeln!(s, "    ({} more of this class)", xs.len() - per_check);
                for x in xs.iter().skip(per_check).take(6) {
                    let _ = writeln!(s, "    - {}", x.text);
                }
            }
        }
    }
    s
}

/// One line per check and class: `check | class | count | first example`.
pub fn table(vs: &[Violation]) -> String {
    let mut by: BTreeMap<(&str, &str), Vec<&Violation>> = BTreeMap::new();
    for x in vs {
        by.entry((x.check, x.class)).or_default().push(x);
    }
    let mut s = String::new();
    for ((check, class), xs) in by {
        let _ = writeln!(s, "  [{check}] {class}: {} (e.g. {})", xs.len(), xs[0].text);
    }
    s
}

/// Helper for rids in a map keyed by `String`.
pub fn rid_set(ops: &[Op]) -> BTreeSet<String> {
    ops.iter()
        .filter(|o| o.kind != Kind::Restock)
        .map(|o| o.rid.clone())
        .collect()
}

/// `HashMap` of records helper for tests of the checker itself.
pub fn rec(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Counts per outcome, for the run summary.
pub fn summary(ops: &[Op]) -> String {
    let mut c: BTreeMap<String, usize> = BTreeMap::new();
    for o in ops {
        let k = match &o.out {
            Out::Ok(Val::Ded(d)) => format!("{} {}", o.kind.name(), d.kind()),
            Out::Ok(Val::Res(Reserved::Held { .. })) => "reserve held".into(),
            Out::Ok(Val::Res(Reserved::Replayed { .. })) => "reserve replayed".into(),
            Out::Ok(Val::Res(Reserved::NotHeld(d))) => format!("reserve {}", d.kind()),
            Out::Ok(Val::Res(other)) => format!("reserve {other:?}"),
            Out::Ok(Val::End(e)) => format!("{} {:?} done={}", o.kind.name(), e.state, e.done),
            Out::Ok(Val::Stock(_)) => "restock ok".into(),
            Out::Fail(e) => format!(
                "{} fail {}",
                o.kind.name(),
                e.split(['(', ' ', '{']).next().unwrap_or("")
            ),
            Out::Unknown(e) => format!(
                "{} unknown {}",
                o.kind.name(),
                e.split([':', '(', ' ']).next().unwrap_or("")
            ),
        };
        *c.entry(k).or_default() += 1;
    }
    c.iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// States of reservation end answers, for callers that need them.
pub fn end_state(o: &Op) -> Option<ResvState> {
    match &o.out {
        Out::Ok(Val::End(e)) => e.state,
        _ => None,
    }
}
