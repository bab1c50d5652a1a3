//! The first property's world: random sequences of load / deduct / restock / replay on one
//! engine, written down as a transcript of outcomes and per-segment stock (audited after every
//! step) that must be the same on every store.

use proptest::prelude::*;
use proptest::strategy::Strategy;
use shardstock::*;

#[derive(Debug, Clone)]
pub enum Op {
    Load {
        total: u64,
        segments: u32,
    },
    Deduct {
        user: u8,
        qty: u64,
        rid: u16,
    },
    /// Re-send the n-th earlier deduct (same id, same parameters).
    Replay {
        nth: usize,
    },
    /// Re-send an earlier request id with another quantity (a conflict).
    Conflict {
        nth: usize,
    },
    Restock {
        qty: u64,
        rid: u16,
    },
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0u64..40, 1u32..8).prop_map(|(total, segments)| Op::Load { total, segments }),
        8 => (0u8..6, 1u64..6, 0u16..60).prop_map(|(user, qty, rid)| Op::Deduct { user, qty, rid }),
        2 => (0usize..64).prop_map(|nth| Op::Replay { nth }),
        1 => (0usize..64).prop_map(|nth| Op::Conflict { nth }),
        2 => (1u64..12, 0u16..20).prop_map(|(qty, rid)| Op::Restock { qty, rid }),
    ]
}

/// Runs `ops` on one engine; returns a transcript of outcomes and states.
pub async fn run<S: Store>(e: &Engine<S>, sku_name: &str, ops: &[Op]) -> Vec<String> {
    let sku = Sku::new(sku_name).unwrap();
    let mut log = Vec::new();
    let mut sent: Vec<Deduct> = Vec::new();
    let mut generation = 0u32;
    let mut loaded = 0;
    let mut restocked = 0;
    for op in ops {
        let line = match op {
            Op::Load { total, segments } => {
                let r = e
                    .load(&sku, *total, LoadOptions::new(*segments).replace(true))
                    .await;
                generation += 1;
                loaded = *total;
                restocked = 0;
                // Generations are clock-based and differ between stores: compare the outcome.
                format!("load {:?}", r.map(|_| "new generation"))
            }
            Op::Deduct { user, qty, rid } => {
                // Request ids are scoped by generation on purpose: a reload resets the ledger.
                let d = Deduct::new(
                    sku_name,
                    &format!("u{user}"),
                    *qty,
                    &format!("g{generation}-r{rid}"),
                )
                .unwrap();
                let r = e.deduct(&d).await;
                sent.push(d);
                format!("deduct {r:?}")
            }
            Op::Replay { nth } if !sent.is_empty() => {
                let d = sent[nth % sent.len()].clone();
                format!("replay {:?}", e.deduct(&d).await)
            }
            Op::Conflict { nth } if !sent.is_empty() => {
                let mut d = sent[nth % sent.len()].clone();
                d.qty = d.qty % 5 + 1;
                format!("conflict {:?}", e.deduct(&d).await)
            }
            Op::Restock { qty, rid } => {
                let r = e
                    .restock(
                        &sku,
                        *qty,
                        &RequestId::new(format!("g{generation}-s{rid}")).unwrap(),
                    )
                    .await;
                if let Ok(Restocked { added, .. }) = &r {
                    restocked += added;
                }
                format!("restock {r:?}")
            }
            _ => continue,
        };
        log.push(line);
        if let Ok(a) = e.audit(&sku).await {
            assert!(a.ok, "{a:?}");
            assert_eq!(a.loaded, loaded);
            assert_eq!(a.restocked, restocked);
            assert_eq!(a.loaded + a.restocked, a.remaining + a.sold);
            let per: Vec<u64> = a.segments.iter().map(|s| s.state.stock).collect();
            log.push(format!("  state {per:?} sold {}", a.sold));
        }
    }
    log
}
