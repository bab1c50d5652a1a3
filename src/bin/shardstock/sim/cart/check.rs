//! After the sale: every order of the run read back and checked to have ended as one (all its
//! items posted iff it is confirmed, else all voided or never held). This is the sim's
//! end-to-end check of the cart protocol, and all that `--check-only` runs over an earlier
//! run's orders. It only reads: each order through the engine (`Engine::order`, which writes
//! nothing) and each item's record at its home through the store (`Store::meta` for the
//! layout, `Store::record`); what it found goes into the report (`cart/report.rs`).

use super::order_id;
use crate::sim::report::OrderRecords;
use futures::StreamExt;
use shardstock::store::{HomeRecord, ItemState, RecordState, RequestKind, SegAddr};
use shardstock::{Engine, OrderId, OrderState, RequestId, Sku, Store, UserId};

/// Orders read back at once in the checks.
const CHECK_CONCURRENCY: usize = 64;
/// Problems listed in the report (the count covers them all).
const MAX_PROBLEMS: usize = 10;

/// Where a SKU's items live now: what the home function needs.
pub(super) struct Homes {
    sku: Sku,
    generation: u64,
    segments: u32,
    by_user: bool,
    placement: shardstock::placement::Placement,
}

impl Homes {
    pub(super) async fn read<S: Store>(engine: &Engine<S>, sku: &Sku) -> shardstock::Result<Self> {
        let m = engine
            .store()
            .meta(sku)
            .await?
            .ok_or_else(|| shardstock::Error::NotLoaded(sku.to_string()))?;
        Ok(Self {
            sku: sku.clone(),
            generation: m.generation,
            segments: m.segments,
            by_user: m.user_limit > 0,
            placement: m.placement,
        })
    }

    fn home(&self, user: &UserId, rid: &RequestId) -> SegAddr<'_> {
        let index = shardstock::segments::home(user, rid, self.segments, self.by_user);
        SegAddr::new(&self.sku, self.generation, index).with_suffix(self.placement.suffix(index))
    }
}

/// What reading the orders back found.
#[derive(Debug, Default)]
pub(super) struct Found {
    pub(super) records: OrderRecords,
    pub(super) items: u64,
    pub(super) split: u64,
    pub(super) problems: Vec<String>,
}

impl Found {
    fn problem(&mut self, p: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(p);
        }
    }
}

/// Reads every order of the run (`engine.order`, which writes nothing) and each item's record
/// at its home, and checks that the order ended as one: all items posted iff it is
/// confirmed; else (cancelled, expired, refused, or never opened) all voided or never held.
/// An order still open (holding, held) is a problem: the reading comes after its deadline.
pub(super) async fn check_orders<S: Store>(
    engine: &Engine<S>,
    homes: &[Homes],
    run_id: &str,
    requests: u64,
    users: u64,
    qty: u64,
) -> shardstock::Result<Found> {
    let reads = futures::stream::iter(0..requests)
        .map(|i| async move {
            let id: OrderId = order_id(run_id, i, users)?;
            let state = engine.order(&id).await?.map(|e| e.state);
            let mut items = Vec::with_capacity(homes.len());
            for (n, h) in homes.iter().enumerate() {
                let rid = id.item_request_id(n + 1);
                items.push(
                    engine
                        .store()
                        .record(h.home(id.user(), &rid), id.user(), &rid)
                        .await?,
                );
            }
            Ok::<_, shardstock::Error>((id, state, items))
        })
        .buffer_unordered(CHECK_CONCURRENCY);
    let mut reads = std::pin::pin!(reads);
    let mut found = Found::default();
    while let Some(r) = reads.next().await {
        let (id, state, items) = r?;
        found.items += items.len() as u64;
        let posts = match state {
            None => {
                found.records.none += 1;
                false
            }
            Some(s) => {
                let r = &mut found.records;
                match s {
                    OrderState::Confirmed => r.confirmed += 1,
                    OrderState::Cancelled => r.cancelled += 1,
                    OrderState::Expired => r.expired += 1,
                    OrderState::Refused => r.refused += 1,
                    _ => r.open += 1,
                }
                match s.posts() {
                    Some(p) => p,
                    None => {
                        found.split += 1;
                        found.problem(format!("order {id} is still {s} after its deadline"));
                        continue;
                    }
                }
            }
        };
        let fits = |rec: &Option<HomeRecord>| match rec {
            None => !posts,
            Some(r) => {
                r.kind == RequestKind::OrderItem
                    && r.qty == qty
                    && r.state
                        == RecordState::Item(if posts {
                            ItemState::Posted
                        } else {
                            ItemState::Voided
                        })
            }
        };
        if !items.iter().all(fits) {
            found.split += 1;
            let seen: Vec<String> = items
                .iter()
                .map(|r| {
                    r.as_ref()
                        .map_or("none".into(), |r| format!("{:?}", r.state))
                })
                .collect();
            found.problem(format!(
                "order {id} is {} but its items are [{}]",
                state.map_or("unknown", OrderState::as_str),
                seen.join(", ")
            ));
        }
    }
    Ok(found)
}
