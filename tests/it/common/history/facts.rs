//! What the store holds at the end (request records in the users' ledgers, the ledgers' units,
//! the transfers, the audit), read after everything settled, and its verdict per request
//! ([`req_facts`]).
//!
//! A request is a (user, request id) pair ([`Key`]): its record is one field of the user's
//! ledger at the request's home segment (`=<request id>` → `<S>:<qty>:<until>:<exp>`, the
//! letters of `src/store/redis/lua.rs`), and every unit of an applied request is counted
//! there. Transfers are remembered at both ends: debited at the donor (`…:tx`: id →
//! `<dest>:<units>:<lease end>`, lease end 0 once done), credited at the destination (`…:in`:
//! id → units).

use super::record::{Key, Kind, OwnedKey};
use shardstock::{Audit, Part};
use std::collections::BTreeMap;

/// A request's record as stored (`<S>:<qty>:<until>:<exp>` in its user's ledger).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rec {
    /// The segment whose ledger holds it.
    pub seg: u32,
    /// `A` sold, `R` reserved, `C` confirmed, `K` cancelled, `X` expired.
    pub state: char,
    pub qty: u64,
    /// Forgotten at (server ms; 0: kept for the generation).
    pub until: u64,
    /// A reservation's expiry (server ms; 0 for a sale).
    pub exp: u64,
    /// The stored text.
    pub raw: String,
}

impl Rec {
    /// Parses a stored record; `None` when malformed.
    pub fn parse(seg: u32, raw: &str) -> Option<Rec> {
        let mut it = raw.split(':');
        let state = it.next()?.chars().next()?;
        let qty = it.next()?.parse().ok()?;
        let until = it.next()?.parse().ok()?;
        let exp = it.next()?.parse().ok()?;
        it.next().is_none().then(|| Rec {
            seg,
            state,
            qty,
            until,
            exp,
            raw: raw.to_string(),
        })
    }
}

/// One user's ledger at one segment: `h` (units held) and `f` (of those, for good) with a
/// per-user limit, and the raw fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    pub h: Option<u64>,
    pub f: Option<u64>,
    /// Every field, as stored (for reports).
    pub fields: BTreeMap<String, String>,
}

/// A transfer as its donor remembers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Debit {
    pub donor: u32,
    pub id: String,
    pub dest: u32,
    pub units: u64,
    /// Marked done (lease end 0): credited home, no longer due.
    pub done: bool,
}

/// A transfer as its destination remembers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreditFact {
    pub dest: u32,
    pub id: String,
    pub units: u64,
}

/// What the store holds at the end, read after everything settled.
#[derive(Debug, Clone)]
pub struct Facts {
    pub segments: u32,
    pub limit: u64,
    /// (user, request id) → its records, wherever found (one, at its home, when all is well).
    pub records: BTreeMap<OwnedKey, Vec<Rec>>,
    /// (segment, user) → the user's ledger there.
    pub ledgers: BTreeMap<(u32, String), Ledger>,
    /// Malformed ledger fields: (segment, user, field, value).
    pub malformed: Vec<(u32, String, String, String)>,
    pub debits: Vec<Debit>,
    pub credits: Vec<CreditFact>,
    pub audit: Audit,
}

impl Facts {
    /// Facts with no records or transfers (the checker's own tests add what they need).
    pub fn empty(segments: u32, limit: u64, audit: Audit) -> Self {
        Facts {
            segments,
            limit,
            records: BTreeMap::new(),
            ledgers: BTreeMap::new(),
            malformed: Vec::new(),
            debits: Vec::new(),
            credits: Vec::new(),
            audit,
        }
    }

    /// The home segment of `user`'s request `rid` (the user's with a per-user limit, else the
    /// pair's).
    pub fn home(&self, (user, rid): Key<'_>) -> u32 {
        shardstock::segments::home(
            &shardstock::UserId::new(user).unwrap(),
            &shardstock::RequestId::new(rid).unwrap(),
            self.segments,
            self.limit > 0,
        )
    }

    /// Adds one ledger field read from the store.
    pub fn add_field(&mut self, seg: u32, user: &str, field: &str, value: &str) {
        let l = self.ledgers.entry((seg, user.to_string())).or_default();
        l.fields.insert(field.to_string(), value.to_string());
        let ok = if let Some(rid) = field.strip_prefix('=') {
            match Rec::parse(seg, value) {
                Some(r) => {
                    let recs = self
                        .records
                        .entry((user.to_string(), rid.to_string()))
                        .or_default();
                    recs.retain(|x| x.seg != seg);
                    recs.push(r);
                    true
                }
                None => false,
            }
        } else if field == "h" || field == "f" {
            match value.parse() {
                Ok(n) if field == "h" => {
                    l.h = Some(n);
                    true
                }
                Ok(n) => {
                    l.f = Some(n);
                    true
                }
                Err(_) => false,
            }
        } else {
            false
        };
        if !ok {
            self.malformed
                .push((seg, user.to_string(), field.to_string(), value.to_string()));
        }
    }
}

/// The store's verdict on one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// No record: never applied.
    None,
    /// A sale, applied (all at home).
    Sale { user: String, qty: u64, part: Part },
    /// A reservation, applied, now in `state` (R, C, X, K) at segment `seg`; expiry on the
    /// server clock (ms).
    Resv {
        user: String,
        qty: u64,
        seg: u32,
        state: char,
        exp_ms: u64,
    },
}

impl Effect {
    pub fn owner(&self) -> Option<(&str, u64, Kind)> {
        match self {
            Effect::Sale { user, qty, .. } => Some((user, *qty, Kind::Deduct)),
            Effect::Resv { user, qty, .. } => Some((user, *qty, Kind::Reserve)),
            Effect::None => None,
        }
    }

    /// Units this effect took and still keeps out of stock (sold, or held by a live
    /// reservation).
    pub fn keeps(&self) -> u64 {
        match self {
            Effect::Sale { qty, .. }
            | Effect::Resv {
                qty,
                state: 'R' | 'C',
                ..
            } => *qty,
            _ => 0,
        }
    }
}

/// Per request: the effect, units the counters hold for it, and inconsistencies.
#[derive(Debug, Clone)]
pub struct ReqFacts {
    pub effect: Effect,
    /// Units counted in the segments' `sold` because of this request's records.
    pub sold: u64,
    /// Units counted in `reserved` (live reservations).
    pub reserved: u64,
    /// (class, text)
    pub problems: Vec<(&'static str, String)>,
}

impl ReqFacts {
    pub fn none() -> Self {
        ReqFacts {
            effect: Effect::None,
            sold: 0,
            reserved: 0,
            problems: Vec::new(),
        }
    }
}

/// Interprets the records of request `key` (found in the ledgers of `recs`' segments).
pub fn req_facts(key: Key<'_>, recs: &[Rec], facts: &Facts) -> ReqFacts {
    let home = facts.home(key);
    let mut f = ReqFacts::none();
    for r in recs {
        match r.state {
            'A' | 'C' => f.sold += r.qty,
            'R' => f.reserved += r.qty,
            'K' | 'X' => {}
            other => f.problems.push((
                "record in an unknown state",
                format!("record at segment {} in state {other:?}: {}", r.seg, r.raw),
            )),
        }
        if r.seg != home {
            f.problems.push((
                "record outside the request's home",
                format!(
                    "record at segment {} ({}), but the request's home is segment {home}",
                    r.seg, r.raw
                ),
            ));
        }
    }
    if recs.len() > 1 {
        f.problems.push((
            "records at more than one segment",
            format!(
                "{} records: {}",
                recs.len(),
                recs.iter()
                    .map(|r| format!("{}@{}", r.raw, r.seg))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let Some(r) = recs.iter().find(|r| r.seg == home).or(recs.first()) else {
        return f;
    };
    let user = key.0.to_string();
    f.effect = match r.state {
        'A' => Effect::Sale {
            user,
            qty: r.qty,
            part: Part {
                segment: r.seg,
                units: r.qty,
            },
        },
        'R' | 'C' | 'K' | 'X' => Effect::Resv {
            user,
            qty: r.qty,
            seg: r.seg,
            state: r.state,
            exp_ms: r.exp,
        },
        _ => Effect::None,
    };
    f
}

/// A ledger field map helper for the checker's own tests: `user`'s records `(rid, stored)`
/// at their home, with `h` / `f` worked out from them when the facts have a limit.
pub fn add_ledger(facts: &mut Facts, user: &str, recs: &[(&str, &str)]) {
    let (mut h, mut f) = (0, 0);
    for (rid, stored) in recs {
        let seg = facts.home((user, rid));
        facts.add_field(seg, user, &format!("={rid}"), stored);
        let r = Rec::parse(seg, stored).expect("a well-formed record");
        if matches!(r.state, 'A' | 'C' | 'R') {
            h += r.qty;
        }
        if matches!(r.state, 'A' | 'C') {
            f += r.qty;
        }
        if facts.limit > 0 {
            // With a limit every record of the user is at the user's home.
            facts.add_field(seg, user, "h", &h.to_string());
            facts.add_field(seg, user, "f", &f.to_string());
        }
    }
}
