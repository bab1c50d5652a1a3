//! Check 5: conservation, and the counters explained by the records.

use super::super::record::Val;
use super::*;
use std::collections::BTreeSet;

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
}
