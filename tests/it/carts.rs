//! Carts: orders of several SKUs held all or nothing, confirmed, cancelled or expired as one;
//! the coordinator's pitfalls (a cancel before the hold, a hold after the cancel, repeated
//! decisions) and its crash points, on both stores.

use crate::common;
use common::edges::sell_args;
use common::*;
use shardstock::cart::{MAX_ITEMS, OrderStep};
use shardstock::store::SegAddr;
use shardstock::store::{ItemState, RecordState};
use shardstock::*;
use std::time::Duration;

fn cart(user: &str, rid: &str, items: &[(&str, u64)], hold_ms: u64) -> Cart {
    Cart {
        user: UserId::new(user).unwrap(),
        request_id: RequestId::new(rid).unwrap(),
        items: items
            .iter()
            .map(|(s, q)| CartItem {
                sku: Sku::new(s).unwrap(),
                qty: *q,
            })
            .collect(),
        hold: Duration::from_millis(hold_ms),
    }
}

fn order_id(c: &Cart) -> OrderId {
    OrderId::new(c.user.clone(), c.request_id.clone()).unwrap()
}

async fn audit_ok<S: Store>(e: &Engine<S>, sku: &str) -> Audit {
    let a = e.audit(&Sku::new(sku).unwrap()).await.unwrap();
    assert!(a.ok, "{a:?}");
    assert_eq!(
        a.loaded + a.restocked,
        a.remaining + a.in_transit + a.reserved + a.sold,
        "{a:?}"
    );
    a
}

/// The home segment of `user`'s request `rid` of `sku` now: (generation, index, placement
/// suffix).
async fn home<S: Store>(
    e: &Engine<S>,
    sku: &Sku,
    user: &UserId,
    rid: &RequestId,
) -> (u64, u32, Option<u16>) {
    let m = e.store().meta(sku).await.unwrap().unwrap();
    let by_user = m.user_limit > 0;
    let h = segments::home(user, rid, m.segments, by_user);
    (m.generation, h, m.placement.suffix(h))
}

fn at(sku: &Sku, (g, h, suffix): (u64, u32, Option<u16>)) -> SegAddr<'_> {
    SegAddr::new(sku, g, h).with_suffix(suffix)
}

/// Each item's record at its home (what the store holds, not what the engine says).
async fn item_states<S: Store>(e: &Engine<S>, c: &Cart) -> Vec<Option<RecordState>> {
    let id = order_id(c);
    let mut out = Vec::new();
    for (i, it) in c.items.iter().enumerate() {
        let rid = id.item_request_id(i + 1);
        let h = home(e, &it.sku, &c.user, &rid).await;
        let r = e
            .store()
            .record(at(&it.sku, h), &c.user, &rid)
            .await
            .unwrap();
        out.push(r.map(|r| r.state));
    }
    out
}

/// A holder that dies after holding this one item: `sell` at its home as the engine sends it.
async fn hold_one<S: Store>(
    e: &Engine<S>,
    sku: &Sku,
    user: &UserId,
    rid: &RequestId,
    qty: u64,
    hint_ms: u64,
) {
    let h = home(e, sku, user, rid).await;
    let mut a = sell_args(e, rid, user, qty, hint_ms, &[]);
    a.order_item = true;
    let r = e.store().sell(at(sku, h), a).await.unwrap();
    assert!(
        matches!(r, shardstock::store::SellReply::Applied { .. }),
        "{r:?}"
    );
}

async fn lifecycle<S: Store>(e: Engine<S>) {
    e.load(
        &Sku::new("phone").unwrap(),
        3,
        LoadOptions::new(2).per_user_limit(1),
    )
    .await
    .unwrap();
    e.load(
        &Sku::new("case").unwrap(),
        10,
        LoadOptions::new(3).per_user_limit(0),
    )
    .await
    .unwrap();
    // Held: every item, counted as reserved; a retry replays.
    let a = cart("ann", "o1", &[("phone", 1), ("case", 2)], 60_000);
    let held = e.hold_order(&a).await.unwrap();
    let OrderHold::Held { items, left_ms, .. } = &held else {
        panic!("{held:?}")
    };
    assert_eq!(items.len(), 2);
    assert!(*left_ms > 0 && *left_ms <= 60_000);
    assert!(matches!(
        e.hold_order(&a).await.unwrap(),
        OrderHold::Held { .. }
    ));
    assert_eq!(audit_ok(&e, "phone").await.reserved, 1);
    assert_eq!(audit_ok(&e, "case").await.reserved, 2);
    let held_state = Some(RecordState::Item(ItemState::Held));
    assert_eq!(item_states(&e, &a).await, vec![held_state; 2]);
    // The same request id with other items is a conflict; nothing changes.
    let other = cart("ann", "o1", &[("phone", 1)], 60_000);
    assert!(matches!(
        e.hold_order(&other).await,
        Err(Error::RequestIdConflict { field: "items", .. })
    ));
    // A reservation call cannot end an order's item.
    let id = order_id(&a);
    // Confirm: every item sold, once.
    let c = e.confirm_order(&id).await.unwrap().unwrap();
    assert_eq!((c.state, c.done), (OrderState::Confirmed, true));
    let again = e.confirm_order(&id).await.unwrap().unwrap();
    assert_eq!((again.state, again.done), (OrderState::Confirmed, true));
    let k = e.cancel_order(&id).await.unwrap().unwrap();
    assert_eq!((k.state, k.done), (OrderState::Confirmed, false));
    let posted = Some(RecordState::Item(ItemState::Posted));
    assert_eq!(item_states(&e, &a).await, vec![posted; 2]);
    let (p, cs) = (audit_ok(&e, "phone").await, audit_ok(&e, "case").await);
    assert_eq!((p.sold, p.reserved, cs.sold, cs.reserved), (1, 0, 2, 0));
    // The per-user limit counts the confirmed phone: ann's second cart is refused at item 1
    // and holds nothing (its case was given back before the answer).
    let a2 = cart("ann", "o2", &[("case", 1), ("phone", 1)], 60_000);
    let r = e.hold_order(&a2).await.unwrap();
    assert!(
        matches!(
            &r,
            OrderHold::Refused {
                item: 2,
                reason: Deduction::LimitReached { limit: 1 },
                ..
            }
        ),
        "{r:?}"
    );
    assert_eq!(audit_ok(&e, "case").await.reserved, 0);
    assert_eq!(
        e.order(&order_id(&a2)).await.unwrap().unwrap().state,
        OrderState::Refused
    );
    // A retry of the refused order replays the refusal.
    assert!(matches!(
        e.hold_order(&a2).await.unwrap(),
        OrderHold::Refused { item: 2, .. }
    ));
    // Cancel: every item back, the user's chance too.
    let b = cart("bob", "o1", &[("phone", 1), ("case", 1)], 60_000);
    assert!(matches!(
        e.hold_order(&b).await.unwrap(),
        OrderHold::Held { .. }
    ));
    let k = e.cancel_order(&order_id(&b)).await.unwrap().unwrap();
    assert_eq!((k.state, k.done), (OrderState::Cancelled, true));
    assert!(!e.confirm_order(&order_id(&b)).await.unwrap().unwrap().done);
    let voided = Some(RecordState::Item(ItemState::Voided));
    assert_eq!(item_states(&e, &b).await, vec![voided; 2]);
    let b2 = cart("bob", "o2", &[("phone", 1)], 60_000);
    assert!(matches!(
        e.hold_order(&b2).await.unwrap(),
        OrderHold::Held { .. }
    ));
    // Sold out names the item; nothing held.
    let c1 = cart("cat", "o1", &[("case", 1), ("phone", 1)], 60_000);
    assert!(matches!(
        e.hold_order(&c1).await.unwrap(),
        OrderHold::Held { .. }
    ));
    let d1 = cart("dan", "o1", &[("case", 1), ("phone", 1)], 60_000);
    let r = e.hold_order(&d1).await.unwrap();
    assert!(
        matches!(
            &r,
            OrderHold::Refused {
                item: 2,
                reason: Deduction::SoldOut,
                ..
            }
        ),
        "{r:?}"
    );
    let p = audit_ok(&e, "phone").await;
    assert_eq!((p.sold, p.reserved, p.remaining), (1, 2, 0));
    // Bad input changes nothing.
    for bad in [
        cart("eve", "o1", &[], 1000),
        cart("eve", "o1", &[("case", 0)], 1000),
        cart("eve", "o1", &[("case", 1)], 0),
        cart("eve", &"r".repeat(126), &[("case", 1)], 1000),
    ] {
        assert!(
            matches!(e.hold_order(&bad).await, Err(Error::InvalidInput { .. })),
            "{bad:?}"
        );
    }
    let many: Vec<(&str, u64)> = vec![("case", 1); MAX_ITEMS + 1];
    assert!(matches!(
        e.hold_order(&cart("eve", "o1", &many, 1000)).await,
        Err(Error::InvalidInput { field: "items", .. })
    ));
    assert_eq!(
        e.order(&order_id(&cart("eve", "o1", &[], 1)))
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn an_order_is_held_confirmed_or_cancelled_as_one_both_stores() {
    lifecycle(memory_engine(Engine::builder())).await;
    let srv = RedisServer::start();
    lifecycle(redis_engine(&srv, Engine::builder()).await).await;
}

/// The coordinator's pitfalls: a cancel that arrives before the order was ever opened (empty
/// rollback) is remembered, and the hold that comes after it holds nothing (suspension); a
/// hold arriving at an item after its order was voided takes nothing.
async fn pitfalls<S: Store>(e: Engine<S>) {
    e.load(
        &Sku::new("ticket").unwrap(),
        5,
        LoadOptions::new(2).per_user_limit(0),
    )
    .await
    .unwrap();
    e.load(
        &Sku::new("parking").unwrap(),
        5,
        LoadOptions::new(2).per_user_limit(1),
    )
    .await
    .unwrap();
    let a = cart("ann", "late", &[("ticket", 1), ("parking", 1)], 60_000);
    let k = e.cancel_order(&order_id(&a)).await.unwrap().unwrap();
    assert_eq!((k.state, k.done), (OrderState::Cancelled, true));
    let r = e.hold_order(&a).await.unwrap();
    assert!(
        matches!(
            r,
            OrderHold::Ended {
                state: OrderState::Cancelled,
                ..
            }
        ),
        "{r:?}"
    );
    assert_eq!(audit_ok(&e, "ticket").await.reserved, 0);
    assert_eq!(audit_ok(&e, "parking").await.reserved, 0);
    // An item voided before its hold ran: the hold replays the void and takes nothing.
    let b = cart("bob", "slow", &[("ticket", 2)], 60_000);
    let id = order_id(&b);
    let rid = id.item_request_id(1);
    let h = home(&e, &b.items[0].sku, &b.user, &rid).await;
    let v = e
        .store()
        .settle(at(&b.items[0].sku, h), &b.user, &rid, 2, false, 60_000)
        .await
        .unwrap();
    assert_eq!(v, shardstock::store::SettleReply::Done(ItemState::Voided));
    // The hold that was in flight meanwhile arrives: it replays the void and takes nothing.
    let mut late = sell_args(&e, &rid, &b.user, 2, 60_000, &[]);
    late.order_item = true;
    let r = e.store().sell(at(&b.items[0].sku, h), late).await.unwrap();
    assert_eq!(r, shardstock::store::SellReply::Replay);
    e.store()
        .order(&id, OrderStep::Cancel, 60_000)
        .await
        .unwrap();
    let r = e.hold_order(&b).await.unwrap();
    assert!(
        matches!(
            r,
            OrderHold::Ended {
                state: OrderState::Cancelled,
                ..
            }
        ),
        "{r:?}"
    );
    let t = audit_ok(&e, "ticket").await;
    assert_eq!((t.reserved, t.remaining), (0, 5));
    // Over the per-user limit alone: final, as a deduction answers it.
    let big = cart("cat", "big", &[("ticket", 1), ("parking", 2)], 60_000);
    let r = e.hold_order(&big).await.unwrap();
    assert!(
        matches!(
            r,
            OrderHold::Refused {
                item: 2,
                reason: Deduction::OverLimit { limit: 1 },
                ..
            }
        ),
        "{r:?}"
    );
    // The same SKU twice in one order, under a limit of 1: the second item is refused, the
    // first given back.
    let c = cart("cat", "twice", &[("parking", 1), ("parking", 1)], 60_000);
    let r = e.hold_order(&c).await.unwrap();
    assert!(
        matches!(
            r,
            OrderHold::Refused {
                item: 2,
                reason: Deduction::LimitReached { .. },
                ..
            }
        ),
        "{r:?}"
    );
    assert_eq!(audit_ok(&e, "parking").await.reserved, 0);
    let c2 = cart(
        "cat",
        "once",
        &[("parking", 1), ("ticket", 2), ("ticket", 1)],
        60_000,
    );
    assert!(matches!(
        e.hold_order(&c2).await.unwrap(),
        OrderHold::Held { .. }
    ));
    assert_eq!(audit_ok(&e, "ticket").await.reserved, 3);
}

#[tokio::test]
async fn empty_rollback_and_suspension_both_stores() {
    pitfalls(memory_engine(Engine::builder())).await;
    let srv = RedisServer::start();
    pitfalls(redis_engine(&srv, Engine::builder()).await).await;
}

/// The deadline on the record's clock decides: a confirm after it answers expired, and the
/// sweeper gives every item back; a holder that died after holding one item of two leaves
/// nothing stranded past the deadline and one sweep.
async fn deadline<S: Store>(e: Engine<S>) {
    e.load(
        &Sku::new("a").unwrap(),
        4,
        LoadOptions::new(2).per_user_limit(1),
    )
    .await
    .unwrap();
    e.load(
        &Sku::new("b").unwrap(),
        4,
        LoadOptions::new(2).per_user_limit(0),
    )
    .await
    .unwrap();
    let x = cart("ann", "x", &[("a", 1), ("b", 1)], 200);
    assert!(matches!(
        e.hold_order(&x).await.unwrap(),
        OrderHold::Held { .. }
    ));
    // A holder that died half way: the record opened, one item held, nothing more.
    let y = cart("bob", "y", &[("a", 1), ("b", 1)], 200);
    let yid = order_id(&y);
    e.store()
        .order(
            &yid,
            OrderStep::Open {
                hold_ms: 200,
                items: "a:1,b:1",
            },
            60_000,
        )
        .await
        .unwrap();
    hold_one(
        &e,
        &Sku::new("b").unwrap(),
        &y.user,
        &yid.item_request_id(2),
        1,
        200,
    )
    .await;
    // A decider that died between the decision and the items: confirmed on the record only.
    let z = cart("cat", "z", &[("a", 1), ("b", 1)], 200);
    assert!(matches!(
        e.hold_order(&z).await.unwrap(),
        OrderHold::Held { .. }
    ));
    let zr = e
        .store()
        .order(&order_id(&z), OrderStep::Confirm, 60_000)
        .await
        .unwrap();
    assert_eq!(zr.state, Some(OrderState::Confirmed));
    assert_eq!(audit_ok(&e, "b").await.reserved, 3);
    tokio::time::sleep(Duration::from_millis(260)).await;
    // Read: expired before anything wrote it.
    assert_eq!(
        e.order(&order_id(&x)).await.unwrap().unwrap().state,
        OrderState::Expired
    );
    let c = e.confirm_order(&order_id(&x)).await.unwrap().unwrap();
    assert_eq!((c.state, c.done), (OrderState::Expired, false));
    // Nothing expires by itself: bob's and cat's items are still held until a sweep asks
    // their orders.
    assert_eq!(audit_ok(&e, "b").await.reserved, 2);
    e.sweep().await.unwrap();
    let (a, b) = (audit_ok(&e, "a").await, audit_ok(&e, "b").await);
    assert_eq!(
        (a.reserved, a.remaining, b.reserved, b.remaining),
        (0, 3, 0, 3)
    );
    assert_eq!(
        (a.sold, b.sold),
        (1, 1),
        "cat's confirmed order sold by the sweeper"
    );
    let posted = Some(RecordState::Item(ItemState::Posted));
    assert_eq!(item_states(&e, &z).await, vec![posted; 2]);
    assert_eq!(
        e.order(&yid).await.unwrap().unwrap().state,
        OrderState::Expired
    );
    // ann's chance came back (the limit counts no expired item).
    let x2 = cart("ann", "x2", &[("a", 1)], 60_000);
    assert!(matches!(
        e.hold_order(&x2).await.unwrap(),
        OrderHold::Held { .. }
    ));
}

#[tokio::test]
async fn the_deadline_and_the_sweeper_end_what_nobody_decided_both_stores() {
    deadline(memory_engine(Engine::builder())).await;
    let srv = RedisServer::start();
    deadline(redis_engine(&srv, Engine::builder()).await).await;
}

/// Every order's items, as their records hold them, agree with the order's record: all
/// posted iff confirmed; otherwise none posted (voided, or never held).
async fn all_or_nothing<S: Store>(e: &Engine<S>, carts: &[Cart]) -> (u64, u64) {
    let (mut confirmed, mut other) = (0, 0);
    for c in carts {
        let state = e.order(&order_id(c)).await.unwrap().map(|o| o.state);
        let items = item_states(e, c).await;
        let posted = items
            .iter()
            .filter(|s| **s == Some(RecordState::Item(ItemState::Posted)))
            .count();
        let held = items
            .iter()
            .filter(|s| **s == Some(RecordState::Item(ItemState::Held)))
            .count();
        assert_eq!(held, 0, "{c:?} {state:?} {items:?}");
        if state == Some(OrderState::Confirmed) {
            assert_eq!(posted, c.items.len(), "{c:?} {items:?}");
            confirmed += 1;
        } else {
            assert_eq!(posted, 0, "{c:?} {state:?} {items:?}");
            other += 1;
        }
    }
    (confirmed, other)
}

/// Many two-item carts race for few units while confirms, cancels and the deadline race each
/// other, and some holders give up half way (their futures dropped): once the deadline and
/// one sweep have passed, every order is in one state for all its items, nothing is held,
/// and the units sold are the confirmed orders'.
async fn storm<S: Store>(e: Engine<S>) {
    e.load(
        &Sku::new("x").unwrap(),
        30,
        LoadOptions::new(4).per_user_limit(1),
    )
    .await
    .unwrap();
    e.load(
        &Sku::new("y").unwrap(),
        40,
        LoadOptions::new(4).per_user_limit(0),
    )
    .await
    .unwrap();
    let carts: Vec<Cart> = (0..80)
        .map(|i| cart(&format!("u{i}"), "c", &[("x", 1), ("y", 1)], 400))
        .collect();
    let tasks = carts.iter().enumerate().map(|(i, c)| {
        let e = e.clone();
        let c = c.clone();
        async move {
            let hold = e.hold_order(&c);
            let r = if i % 7 == 3 {
                // Gives up half way: whatever it held is left to the deadline.
                let _ = tokio::time::timeout(Duration::from_micros(300), hold).await;
                return;
            } else {
                hold.await.unwrap()
            };
            if let OrderHold::Held { order_id, .. } = r {
                match i % 4 {
                    0 => {
                        let (a, b) =
                            tokio::join!(e.confirm_order(&order_id), e.cancel_order(&order_id));
                        let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
                        assert_eq!(a.state, b.state, "one decision");
                        assert!(a.done != b.done, "{a:?} {b:?}");
                    }
                    1 => {
                        e.confirm_order(&order_id).await.unwrap();
                    }
                    2 => {
                        e.cancel_order(&order_id).await.unwrap();
                    }
                    _ => {} // left to expire
                }
            }
        }
    });
    futures::future::join_all(tasks.map(tokio::spawn)).await;
    tokio::time::sleep(Duration::from_millis(450)).await;
    e.sweep().await.unwrap();
    let (confirmed, _) = all_or_nothing(&e, &carts).await;
    let (x, y) = (audit_ok(&e, "x").await, audit_ok(&e, "y").await);
    assert_eq!(
        (x.reserved, y.reserved, x.in_transit, y.in_transit),
        (0, 0, 0, 0)
    );
    assert_eq!((x.sold, y.sold), (confirmed, confirmed));
    assert!(confirmed > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cart_storm_ends_every_order_in_one_state_both_stores() {
    storm(memory_engine(Engine::builder())).await;
    let srv = RedisServer::start();
    storm(redis_engine(&srv, Engine::builder()).await).await;
    storm(coalesced_engine(&srv, Engine::builder(), Coalescing::default(), "co").await).await;
}

/// The suites on a 3-master cluster: an order's record and its items in other slots, on
/// other masters (one cluster for all, one key prefix each).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn carts_on_a_cluster() {
    let c = cluster::RedisCluster::start(3, 0);
    lifecycle(prefixed_engine(&c, Engine::builder(), "life").await).await;
    pitfalls(prefixed_engine(&c, Engine::builder(), "pit").await).await;
    deadline(prefixed_engine(&c, Engine::builder(), "dl").await).await;
    storm(coalesced_engine(&c, Engine::builder(), Coalescing::default(), "st").await).await;
}

/// A reload ends every hold of the generation it replaces, an order's items included: the
/// confirm that follows names the reloaded item (nothing sold there), the audit stays true.
async fn reload<S: Store>(e: Engine<S>) {
    e.load(&Sku::new("r1").unwrap(), 5, LoadOptions::new(2))
        .await
        .unwrap();
    e.load(&Sku::new("r2").unwrap(), 5, LoadOptions::new(2))
        .await
        .unwrap();
    let a = cart("ann", "re", &[("r1", 1), ("r2", 1)], 60_000);
    assert!(matches!(
        e.hold_order(&a).await.unwrap(),
        OrderHold::Held { .. }
    ));
    e.load(
        &Sku::new("r2").unwrap(),
        7,
        LoadOptions::new(3).replace(true),
    )
    .await
    .unwrap();
    let c = e.confirm_order(&order_id(&a)).await.unwrap().unwrap();
    assert_eq!(
        (c.state, c.reloaded.as_slice()),
        (OrderState::Confirmed, &[2][..])
    );
    let (r1, r2) = (audit_ok(&e, "r1").await, audit_ok(&e, "r2").await);
    assert_eq!(
        (r1.sold, r1.reserved, r2.sold, r2.reserved, r2.remaining),
        (1, 0, 0, 0, 7)
    );
    // Held in the new generation, cancelled: both back.
    let b = cart("bob", "re", &[("r1", 1), ("r2", 1)], 60_000);
    assert!(matches!(
        e.hold_order(&b).await.unwrap(),
        OrderHold::Held { .. }
    ));
    let k = e.cancel_order(&order_id(&b)).await.unwrap().unwrap();
    assert!(k.done && k.reloaded.is_empty(), "{k:?}");
    assert_eq!(audit_ok(&e, "r2").await.remaining, 7);
}

#[tokio::test]
async fn a_reload_mid_order_is_named_both_stores() {
    reload(memory_engine(Engine::builder().per_user_limit(0))).await;
    let srv = RedisServer::start();
    reload(redis_engine(&srv, Engine::builder().per_user_limit(0)).await).await;
}

/// An item whose segment refuses writes (a master below `min-replicas-to-write`: nothing runs
/// there): the hold answers the refusal as an error — outcome unknown, the order still
/// holding — and whatever the caller does next ends in one state: a retry once the segment
/// answers holds every item; a cancel gives back what was held, and, retried once the segment
/// answers, leaves the void there so that a late hold takes nothing.
#[tokio::test]
async fn an_item_behind_a_refusing_segment_leaves_the_order_unknown_then_one_state() {
    use common::refusing::Refusing;
    use shardstock::store::memory::MemoryStore;
    let store = Refusing::new(MemoryStore::new());
    let e = Engine::builder()
        .per_user_limit(1)
        .build(store.clone())
        .unwrap();
    e.load(&Sku::new("p").unwrap(), 6, LoadOptions::new(3))
        .await
        .unwrap();
    e.load(&Sku::new("q").unwrap(), 6, LoadOptions::new(3))
        .await
        .unwrap();
    for (user, then_cancel) in [("ann", false), ("bob", true)] {
        let c = cart(user, "o", &[("p", 1), ("q", 1)], 60_000);
        let id = order_id(&c);
        let (_, q_home, _) = home(&e, &c.items[1].sku, &c.user, &id.item_request_id(2)).await;
        store.set_down(&[q_home]);
        let r = e.hold_order(&c).await;
        assert!(matches!(r, Err(Error::NoReplicas(_))), "{r:?}");
        assert_eq!(
            e.order(&id).await.unwrap().unwrap().state,
            OrderState::Holding
        );
        if then_cancel {
            let k = e.cancel_order(&id).await;
            assert!(matches!(k, Err(Error::NoReplicas(_))), "{k:?}");
            store.set_down(&[]);
            let k = e.cancel_order(&id).await.unwrap().unwrap();
            assert_eq!((k.state, k.done), (OrderState::Cancelled, true));
            let voided = Some(RecordState::Item(ItemState::Voided));
            assert_eq!(item_states(&e, &c).await, vec![voided; 2]);
            // The hold, re-sent late, takes nothing.
            let r = e.hold_order(&c).await.unwrap();
            assert!(
                matches!(
                    r,
                    OrderHold::Ended {
                        state: OrderState::Cancelled,
                        ..
                    }
                ),
                "{r:?}"
            );
        } else {
            store.set_down(&[]);
            assert!(matches!(
                e.hold_order(&c).await.unwrap(),
                OrderHold::Held { .. }
            ));
            let k = e.confirm_order(&id).await.unwrap().unwrap();
            assert_eq!((k.state, k.done), (OrderState::Confirmed, true));
        }
    }
    let (p, q) = (audit_ok(&e, "p").await, audit_ok(&e, "q").await);
    assert_eq!((p.sold, p.reserved, q.sold, q.reserved), (1, 0, 1, 0));
}

/// Under the lock strategy the items are held by the same script under the segment's fenced
/// lock; an unsafe baseline refuses orders (it keeps no records).
#[tokio::test]
async fn carts_under_the_lock_strategy_and_refused_by_baselines() {
    let srv = RedisServer::start();
    let lock = strategy_engine(
        &srv,
        Engine::builder(),
        Strategy::Lock,
        lock_opts(2_000, 2_000),
    )
    .await;
    lifecycle(lock).await;
    let naive = strategy_engine(
        &srv,
        Engine::builder().per_user_limit(0),
        Strategy::Naive,
        lock_opts(2_000, 2_000),
    )
    .await;
    let r = naive
        .hold_order(&cart("ann", "n", &[("phone", 1)], 1_000))
        .await;
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
}

/// A double submit of one order in one process (the same request id, both calls at once):
/// both answer the order held — the in-process guard's "user busy" never refuses an order.
/// And a request id used again once its order was forgotten (past the request TTL): its items'
/// records, sold under a per-user limit, are no hold; the new order is refused as a conflict
/// and nothing more is sold or held.
async fn double_submit_and_forgotten<S: Store>(e: Engine<S>) {
    e.load(
        &Sku::new("d1").unwrap(),
        6,
        LoadOptions::new(2).per_user_limit(2),
    )
    .await
    .unwrap();
    e.load(
        &Sku::new("d2").unwrap(),
        6,
        LoadOptions::new(2).per_user_limit(2),
    )
    .await
    .unwrap();
    for n in 0..6 {
        let c = cart(&format!("u{n}"), "twice", &[("d1", 1), ("d2", 1)], 250);
        let (a, b) = tokio::join!(e.hold_order(&c), e.hold_order(&c));
        for r in [a, b] {
            let r = r.unwrap();
            assert!(matches!(r, OrderHold::Held { .. }), "{r:?}");
        }
    }
    let d1 = audit_ok(&e, "d1").await;
    assert_eq!((d1.reserved, d1.remaining), (6, 0));
    for n in 0..6 {
        let c = cart(&format!("u{n}"), "twice", &[], 1);
        e.cancel_order(&order_id(&c)).await.unwrap();
    }
    // Forgotten: a confirmed order, its record gone after the request TTL (300 ms here).
    let c = cart("ann", "once", &[("d1", 1), ("d2", 1)], 200);
    assert!(matches!(
        e.hold_order(&c).await.unwrap(),
        OrderHold::Held { .. }
    ));
    assert!(e.confirm_order(&order_id(&c)).await.unwrap().unwrap().done);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(e.order(&order_id(&c)).await.unwrap(), None);
    let again = e.hold_order(&c).await;
    assert!(
        matches!(
            again,
            Err(Error::RequestIdConflict {
                field: "request_id",
                ..
            })
        ),
        "{again:?}"
    );
    let (d1, d2) = (audit_ok(&e, "d1").await, audit_ok(&e, "d2").await);
    assert_eq!((d1.sold, d1.reserved, d2.sold, d2.reserved), (1, 0, 1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_double_submit_holds_once_and_a_forgotten_order_is_no_hold_both_stores() {
    let b = || Engine::builder().request_ttl(Duration::from_millis(300));
    double_submit_and_forgotten(memory_engine(b())).await;
    let srv = RedisServer::start();
    double_submit_and_forgotten(redis_engine(&srv, b()).await).await;
}
