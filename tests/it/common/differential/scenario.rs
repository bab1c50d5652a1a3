//! The helpers of the named differential scenarios (`tests/it/differential.rs`,
//! `tests/it/differential_carts.rs`): each scenario runs on the memory store, Redis and
//! coalesced Redis (`edges::run_all`) and asserts every answer.

use super::run;
use crate::common::RedisServer;
use crate::common::edges::sku;
use shardstock::store::{Credit, SegAddr, SellArgs, SellReply};
use shardstock::*;

/// The three stores of a scenario (the Redis ones on `srv`, own key prefixes).
pub async fn three_stores(srv: &RedisServer) -> (MemoryStore, RedisStore, RedisStore) {
    let (r, c) = run::redis_stores(srv).await;
    (MemoryStore::new(), r, c)
}

/// Loads `name` with `load --replace` semantics through an engine (load_begin, load_segment,
/// drop_segment, load_commit); returns the generation.
pub async fn load<S: Store + Clone>(
    store: &S,
    name: &str,
    total: u64,
    segments: u32,
    limit: u64,
) -> u64 {
    Engine::builder()
        .build(store.clone())
        .unwrap()
        .load(
            &sku(name),
            total,
            LoadOptions::new(segments)
                .replace(true)
                .per_user_limit(limit),
        )
        .await
        .unwrap()
}

/// `sell` of `qty` for `user` / `rid` (a reservation held `resv_ms` when > 0), records kept
/// `ttl_ms`, crediting `credits`.
#[allow(clippy::too_many_arguments)]
pub async fn sell<S: Store>(
    store: &S,
    home: SegAddr<'_>,
    user: &str,
    rid: &str,
    qty: u64,
    resv_ms: u64,
    ttl_ms: u64,
    credits: &[Credit],
) -> SellReply {
    let (u, r) = (UserId::new(user).unwrap(), RequestId::new(rid).unwrap());
    store
        .sell(
            home,
            SellArgs {
                request_id: &r,
                user: &u,
                qty,
                resv_ttl_ms: resv_ms,
                order_item: false,
                ttl_ms,
                credits,
                fence: 0,
            },
        )
        .await
        .unwrap()
}

pub async fn audit_of<S: Store + Clone>(store: &S, name: &str) -> Audit {
    Engine::builder()
        .build(store.clone())
        .unwrap()
        .audit(&sku(name))
        .await
        .unwrap()
}

/// `sell` of order item `rid` of `user` (`order_item`), of `qty` units, hint `hint_ms`.
pub async fn hold<S: Store>(
    store: &S,
    home: SegAddr<'_>,
    user: &str,
    rid: &str,
    qty: u64,
    hint_ms: u64,
) -> SellReply {
    let (u, r) = (UserId::new(user).unwrap(), RequestId::new(rid).unwrap());
    store
        .sell(
            home,
            SellArgs {
                request_id: &r,
                user: &u,
                qty,
                resv_ttl_ms: hint_ms,
                order_item: true,
                ttl_ms: 60_000,
                credits: &[],
                fence: 0,
            },
        )
        .await
        .unwrap()
}

/// `settle` of item `rid` of `user`, of `qty` units (`post`, or void), records kept 60 s.
pub async fn settle<S: Store>(
    store: &S,
    home: SegAddr<'_>,
    user: &str,
    rid: &str,
    qty: u64,
    post: bool,
) -> shardstock::store::SettleReply {
    let (u, r) = (UserId::new(user).unwrap(), RequestId::new(rid).unwrap());
    store.settle(home, &u, &r, qty, post, 60_000).await.unwrap()
}
