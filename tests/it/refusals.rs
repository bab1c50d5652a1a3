//! Segments whose master refuses every call before it runs (Redis below its
//! `min-replicas-to-write`: `NoReplicas`, nothing written), played deterministically over the
//! memory store through `common::refusing::Refusing`: what the engine answers and what it
//! leaves, call by call.
//!
//! - units only behind a refusing segment: `NoReplicas`, never sold out; the same request id
//!   sells once the segment answers;
//! - a refusing donor is passed over for one that answers;
//! - the sweeper credits the transfers of the donors that answer while another refuses, and
//!   the refusing one's once it answers; nothing is lost or made.

use crate::common;

use common::refusing::Refusing;
use shardstock::ids::{RequestId, UserId};
use shardstock::segments::home;
use shardstock::store::memory::MemoryStore;
use shardstock::store::{SegAddr, Store, TransferArgs, TransferReply};
use shardstock::{Deduct, Deduction, Engine, Error, LoadOptions, Sku};
use std::time::Duration;

const SEGMENTS: u32 = 3;

fn engine(store: &Refusing<MemoryStore>) -> Engine<Refusing<MemoryStore>> {
    Engine::builder()
        .per_user_limit(1)
        .transfer_lease(Duration::from_millis(1))
        .build(store.clone())
        .unwrap()
}

/// `n` fresh user names homed at `segment` (per-user limit: home by user).
fn users_at(segment: u32, n: usize, tag: &str) -> Vec<String> {
    let any = RequestId::new("any").unwrap();
    (0..)
        .map(|i| format!("{tag}{i}"))
        .filter(|u| home(&UserId::new(u).unwrap(), &any, SEGMENTS, true) == segment)
        .take(n)
        .collect()
}

fn sale(sku: &str, user: &str) -> Deduct {
    Deduct::new(sku, user, 1, &format!("r-{user}")).unwrap()
}

fn sold(d: &shardstock::Result<Deduction>) -> bool {
    matches!(
        d,
        Ok(Deduction::Applied { .. } | Deduction::Replayed { .. })
    )
}

/// The last unit sits at a segment that refuses: the buyer gets `NoReplicas` (not sold out,
/// not insufficient), and so does `remaining`; once the segment answers, the same request id
/// sells the unit, and only then is the SKU sold out.
#[tokio::test]
async fn units_only_behind_a_refusing_segment_are_never_sold_out() {
    let store = Refusing::new(MemoryStore::new());
    let e = engine(&store);
    let sku = Sku::new("ro").unwrap();
    e.load(&sku, 3, LoadOptions::new(SEGMENTS).per_user_limit(1))
        .await
        .unwrap();
    // Segments 0 and 1 sell their unit to their own buyers.
    for s in [0, 1] {
        let u = &users_at(s, 1, &format!("own{s}-"))[0];
        assert!(sold(&e.deduct(&sale("ro", u)).await), "segment {s}");
    }
    store.set_down(&[2]);
    let buyer = &users_at(0, 2, "late-")[1];
    match e.deduct(&sale("ro", buyer)).await {
        Err(Error::NoReplicas(_)) => {}
        other => panic!("the unit behind the refusing segment: {other:?}"),
    }
    assert!(store.refused() > 0);
    // Looking writes nothing: the unit behind the refusing segment is still counted.
    let r = e.remaining(&sku).await.unwrap();
    assert_eq!((r.total, r.per_segment), (1, vec![0, 0, 1]));

    store.set_down(&[]);
    let again = e.deduct(&sale("ro", buyer)).await;
    assert!(matches!(again, Ok(Deduction::Applied { .. })), "{again:?}");
    let next = &users_at(1, 2, "next-")[1];
    assert!(matches!(
        e.deduct(&sale("ro", next)).await,
        Ok(Deduction::SoldOut)
    ));
    let a = e.audit(&sku).await.unwrap();
    assert!(
        a.ok && a.sold == 3 && a.remaining == 0 && a.in_transit == 0,
        "{a:?}"
    );
}

/// Home runs short; the fullest donor refuses: the next donor serves the request.
#[tokio::test]
async fn a_refusing_donor_is_passed_over_for_one_that_answers() {
    let store = Refusing::new(MemoryStore::new());
    let e = engine(&store);
    let sku = Sku::new("rd").unwrap();
    e.load(&sku, 6, LoadOptions::new(SEGMENTS).per_user_limit(1))
        .await
        .unwrap();
    // Home 0 emptied by its own buyers, segment 1 left with one unit: segment 2 (two) is the
    // fullest donor.
    for u in users_at(0, 2, "h0-") {
        assert!(sold(&e.deduct(&sale("rd", &u)).await));
    }
    assert!(sold(
        &e.deduct(&sale("rd", &users_at(1, 1, "h1-")[0])).await
    ));
    store.set_down(&[2]);
    let buyer = &users_at(0, 3, "short-")[2];
    let r = e.deduct(&sale("rd", buyer)).await;
    assert!(matches!(r, Ok(Deduction::Applied { .. })), "{r:?}");
    assert!(store.refused() > 0, "segment 2 was never asked");
    store.set_down(&[]);
    let a = e.audit(&sku).await.unwrap();
    assert!(a.ok && a.sold == 4 && a.remaining == 2, "{a:?}");
}

/// Units in transit from two donors; one refuses. A sweep credits the other's transfer and
/// leaves the refusing one's due; once it answers, the next sweep credits that one too.
#[tokio::test]
async fn the_sweeper_credits_what_it_can_while_a_donor_refuses() {
    let store = Refusing::new(MemoryStore::new());
    let e = engine(&store);
    let sku = Sku::new("rs").unwrap();
    e.load(&sku, 9, LoadOptions::new(SEGMENTS).per_user_limit(1))
        .await
        .unwrap();
    let generation = e.audit(&sku).await.unwrap().generation;
    let at = |i| SegAddr::new(&sku, generation, i);
    for (donor, id) in [(1, 11), (2, 22)] {
        let t = TransferArgs {
            id,
            dest: 0,
            want: 2,
            floor: 0,
            lease_ms: 1,
        };
        let r = store.transfer(at(donor), t).await.unwrap();
        assert!(
            matches!(r, TransferReply::Debited { units: 2, .. }),
            "{r:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(20)).await; // the leases run out
    // The refusing donor comes first in the sweep's order: the one after it is still reached.
    store.set_down(&[1]);
    e.sweep().await.unwrap();
    store.set_down(&[]);
    assert!(store.transfers_due(at(2), 10).await.unwrap().is_empty());
    assert_eq!(store.transfers_due(at(1), 10).await.unwrap().len(), 1);
    let r = e.remaining(&sku).await.unwrap();
    assert_eq!((r.per_segment[0], r.in_transit), (5, 2), "{r:?}");

    e.sweep().await.unwrap();
    assert!(store.transfers_due(at(1), 10).await.unwrap().is_empty());
    let a = e.audit(&sku).await.unwrap();
    assert!(a.ok && a.remaining == 9 && a.in_transit == 0, "{a:?}");
    assert_eq!(e.remaining(&sku).await.unwrap().per_segment, vec![7, 1, 1]);
}
