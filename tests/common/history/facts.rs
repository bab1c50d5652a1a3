//! What the store holds at the end (request records, user records, the audit), read after
//! everything settled, and its verdict per request id ([`rid_facts`]).

use super::record::Kind;
use shardstock::{Audit, Part};
use std::collections::{BTreeMap, HashMap};

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

pub(super) fn fields(m: &HashMap<String, String>) -> String {
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
        // No home record, or a released claim ('F': the id is free).
        None | Some("F") => {
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

/// `HashMap` of records helper for tests of the checker itself.
pub fn rec(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
