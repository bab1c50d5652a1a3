//! Check 5: conservation (units in transit included), the counters explained by the records,
//! and every transfer debited once, credited once, at the place it names.

use super::super::record::Val;
use super::*;
use std::collections::{BTreeMap, BTreeSet};

pub(super) fn check(cx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let (ops, p, rf) = (cx.ops, cx.p, &cx.rf);
    let a = &cx.facts.audit;
    if !a.ok {
        out.push(v(
            C5,
            "audit not ok",
            format!("audit not ok: {:?}", a.problems),
            &[],
            &[],
        ));
    }
    if a.loaded + a.restocked != a.remaining + a.in_transit + a.reserved + a.sold {
        out.push(v(
            C5,
            "loaded + restocked != remaining + in transit + reserved + sold",
            format!(
                "loaded {} + restocked {} != remaining {} + in transit {} + reserved {} + sold {}",
                a.loaded, a.restocked, a.remaining, a.in_transit, a.reserved, a.sold
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
    if a.in_transit != 0 {
        out.push(v(
            C5,
            "in transit after settling",
            format!(
                "{} units in transit after every transfer lease ran out and the sweeper ran",
                a.in_transit
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
    // Per segment, too: each segment's sold is what the records homed there hold.
    let mut per_seg = vec![0u64; cx.facts.segments as usize];
    for recs in cx.facts.records.values() {
        for r in recs {
            if matches!(r.state, 'A' | 'C')
                && let Some(s) = per_seg.get_mut(r.seg as usize)
            {
                *s += r.qty;
            }
        }
    }
    for s in &a.segments {
        let want = per_seg.get(s.index as usize).copied().unwrap_or(0);
        if s.state.sold != want {
            out.push(v(
                C5,
                "a segment's sold not explained by the records homed there",
                format!(
                    "segment {} counts {} sold, the records in its ledgers account for {want}",
                    s.index, s.state.sold
                ),
                &[],
                &[],
            ));
        }
    }
    // A record no operation of the history explains.
    for (u, r) in cx.facts.records.keys() {
        let key = (u.as_str(), r.as_str());
        if !cx.by_key.contains_key(&key) {
            out.push(v(
                C5,
                "record of a request never sent",
                format!(
                    "{}: the store holds {:?}, but no operation sent this request",
                    key_text(key),
                    cx.facts.records[&(u.clone(), r.clone())]
                ),
                &[key],
                &[u],
            ));
        }
    }
    transfers(cx, out);
    restocks(ops, a, out);
}

/// Every credit matches a debit (same id, destination and units), each id is debited at one
/// donor and credited at most once, every debit is credited and marked done after the sweep,
/// and each segment's `moved_out` / `moved_in` are what its transfer records say.
fn transfers(cx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let facts = cx.facts;
    let mut debits: BTreeMap<&str, Vec<&super::super::facts::Debit>> = BTreeMap::new();
    for d in &facts.debits {
        debits.entry(d.id.as_str()).or_default().push(d);
    }
    let mut credits: BTreeMap<&str, Vec<&super::super::facts::CreditFact>> = BTreeMap::new();
    for c in &facts.credits {
        credits.entry(c.id.as_str()).or_default().push(c);
    }
    for (id, ds) in &debits {
        if ds.len() > 1 {
            out.push(v(
                C5,
                "transfer id debited at two donors",
                format!("transfer {id}: {ds:?}"),
                &[],
                &[],
            ));
        }
    }
    for (id, cs) in &credits {
        if cs.len() > 1 {
            out.push(v(
                C5,
                "transfer credited twice",
                format!("transfer {id} credited at {cs:?}"),
                &[],
                &[],
            ));
        }
        for c in cs {
            let matched = debits
                .get(id)
                .is_some_and(|ds| ds.iter().any(|d| d.dest == c.dest && d.units == c.units));
            if !matched {
                out.push(v(
                    C5,
                    "credit without a matching debit",
                    format!(
                        "transfer {id}: {} units credited at segment {}, debits of that id: {:?}",
                        c.units,
                        c.dest,
                        debits.get(id)
                    ),
                    &[],
                    &[],
                ));
            }
        }
    }
    for d in &facts.debits {
        if !credits.contains_key(d.id.as_str()) {
            out.push(v(
                C5,
                "units left in transit after the sweep",
                format!(
                    "transfer {} ({} units from segment {} to {}) debited, never credited",
                    d.id, d.units, d.donor, d.dest
                ),
                &[],
                &[],
            ));
        } else if !d.done {
            out.push(v(
                C5,
                "transfer still due after the sweep",
                format!(
                    "transfer {} ({} units from segment {} to {}) credited but never marked done",
                    d.id, d.units, d.donor, d.dest
                ),
                &[],
                &[],
            ));
        }
    }
    for s in &facts.audit.segments {
        let out_units: u64 = facts
            .debits
            .iter()
            .filter(|d| d.donor == s.index)
            .map(|d| d.units)
            .sum();
        let in_units: u64 = facts
            .credits
            .iter()
            .filter(|c| c.dest == s.index)
            .map(|c| c.units)
            .sum();
        if (s.state.moved_out, s.state.moved_in) != (out_units, in_units) {
            out.push(v(
                C5,
                "a segment's transfer counters disagree with its transfer records",
                format!(
                    "segment {}: moved out {}, moved in {}; its debits add up to {out_units}, its credits to {in_units}",
                    s.index, s.state.moved_out, s.state.moved_in
                ),
                &[],
                &[],
            ));
        }
    }
}

/// Restocked units within what the history's restocks allow.
fn restocks(ops: &[Op], a: &shardstock::Audit, out: &mut Vec<Violation>) {
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
}
