//! What the edge-case tests (`tests/it/edges_*.rs`) share: one scenario run on every store with
//! each store's failure named, short engine timings, request and store-call builders (to play a
//! crash point with store-level calls), futures dropped at a chosen suspension point, the
//! sweeper run until nothing is in transit, and audit checks.

use super::{RedisServer, coalesced_engine, memory_engine, redis_engine};
use futures::FutureExt;
use futures::future::{BoxFuture, join_all};
use shardstock::segments::home;
use shardstock::store::{Credit, SegAddr, SellArgs, SellReply};
use shardstock::*;
use std::panic::AssertUnwindSafe;
use std::task::Poll;
use std::time::{Duration, Instant};

pub fn sku(s: &str) -> Sku {
    Sku::new(s).unwrap()
}

pub fn rid(s: &str) -> RequestId {
    RequestId::new(s).unwrap()
}

pub fn uid(s: &str) -> UserId {
    UserId::new(s).unwrap()
}

pub fn d(sku: &str, user: &str, qty: u64, request_id: &str) -> Deduct {
    Deduct::new(sku, user, qty, request_id).unwrap()
}

/// Segment `index` with the plain tag (these scenarios run on a single Redis).
pub fn at(sku: &Sku, generation: u64, index: u32) -> SegAddr<'_> {
    SegAddr::new(sku, generation, index)
}

/// The home segment of `user`'s request `request_id` among `segments` (by user when the SKU
/// has a per-user limit).
pub fn home_of(user: &str, request_id: &str, segments: u32, by_user: bool) -> u32 {
    home(&uid(user), &rid(request_id), segments, by_user)
}

/// `n` users `<prefix><k>` whose home (with a per-user limit: by user) is segment `index`.
pub fn users_homed(prefix: &str, segments: u32, index: u32, n: usize) -> Vec<String> {
    (0..)
        .map(|k| format!("{prefix}{k}"))
        .filter(|u| home_of(u, "x", segments, true) == index)
        .take(n)
        .collect()
}

/// `n` request ids `<prefix><k>` of `user` whose home without a per-user limit is segment
/// `index`.
pub fn ids_homed(prefix: &str, user: &str, segments: u32, index: u32, n: usize) -> Vec<String> {
    (0..)
        .map(|k| format!("{prefix}{k}"))
        .filter(|r| home_of(user, r, segments, false) == index)
        .take(n)
        .collect()
}

/// The `sell` arguments the engine `e` sends for a request: a sale, or a reservation held
/// `resv_ttl_ms`, crediting `credits`.
pub fn sell_args<'a, S: Store>(
    e: &Engine<S>,
    request_id: &'a RequestId,
    user: &'a UserId,
    qty: u64,
    resv_ttl_ms: u64,
    credits: &'a [Credit],
) -> SellArgs<'a> {
    SellArgs {
        request_id,
        user,
        qty,
        resv_ttl_ms,
        order_item: false,
        ttl_ms: e.options().request_ttl.as_millis() as u64,
        credits,
        fence: 0,
    }
}

/// [`sell_args`] without credits (the old `args`, kept for the suites that call it).
pub fn args<'a, S: Store>(
    e: &Engine<S>,
    request_id: &'a RequestId,
    user: &'a UserId,
    qty: u64,
    resv_ttl_ms: u64,
) -> SellArgs<'a> {
    sell_args(e, request_id, user, qty, resv_ttl_ms, &[])
}

/// A credit-only `sell` (qty 0) of `credits` at `home`, as the sweeper sends it.
pub async fn credit_only<S: Store>(
    e: &Engine<S>,
    home: SegAddr<'_>,
    credits: &[Credit],
) -> SellReply {
    let (r, u) = (rid("credit"), uid("credit"));
    e.store()
        .sell(home, sell_args(e, &r, &u, 0, 0, credits))
        .await
        .unwrap()
}

/// The audit, which must be ok and balance with units in transit counted.
pub async fn audit_ok<S: Store>(e: &Engine<S>, s: &Sku, tag: &str) -> Audit {
    let a = e.audit(s).await.unwrap();
    assert!(a.ok, "[{tag}] audit of {s} failed: {a:?}");
    assert_eq!(
        a.loaded + a.restocked,
        a.remaining + a.in_transit + a.reserved + a.sold,
        "[{tag}] {a:?}"
    );
    a
}

/// Sweeps (`engine.sweep()`) until nothing of `s` is in transit or `within` passed; returns
/// the last audit, which must be ok with nothing in transit.
pub async fn swept<S: Store>(e: &Engine<S>, s: &Sku, within: Duration, tag: &str) -> Audit {
    let deadline = Instant::now() + within;
    loop {
        e.sweep().await.unwrap();
        let a = e.audit(s).await.unwrap();
        if a.in_transit == 0 || Instant::now() > deadline {
            assert!(
                a.ok && a.in_transit == 0,
                "[{tag}] {s}: units still in transit {within:?} of sweeps later (or the audit failed): {a:?}"
            );
            return a;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A held reservation's id and segment.
pub fn held(r: Result<Reserved>, what: &str) -> (ReservationId, u32) {
    match r {
        Ok(Reserved::Held { id, segment, .. }) => (id, segment),
        other => panic!("{what}: expected a held reservation, got {other:?}"),
    }
}

pub fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        "panic".to_string()
    }
}

/// Runs every named scenario to its end (concurrently, or one after the other); returns their
/// failures, each named.
pub async fn run<'a>(
    concurrent: bool,
    cases: Vec<(&'static str, BoxFuture<'a, ()>)>,
) -> Vec<String> {
    let run = |(name, f): (&'static str, BoxFuture<'a, ()>)| async move {
        (name, AssertUnwindSafe(f).catch_unwind().await)
    };
    let results = if concurrent {
        join_all(cases.into_iter().map(run)).await
    } else {
        let mut v = Vec::new();
        for c in cases {
            v.push(run(c).await);
        }
        v
    };
    results
        .into_iter()
        .filter_map(|(n, r)| {
            r.err().map(|p| {
                let text = panic_text(p);
                if text.contains(&format!("[{n}]")) {
                    text
                } else {
                    format!("[{n}] {text}")
                }
            })
        })
        .collect()
}

/// Fails with every failure of [`run`].
pub fn check(failures: Vec<String>) {
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// [`run`], then [`check`].
pub async fn run_all<'a>(concurrent: bool, cases: Vec<(&'static str, BoxFuture<'a, ()>)>) {
    check(run(concurrent, cases).await);
}

/// A builder with short timings: transfer leases of 300 ms, request records kept 30 s.
pub fn quick() -> EngineBuilder {
    Engine::builder()
        .request_ttl(Duration::from_secs(30))
        .transfer_lease(Duration::from_millis(300))
}

/// The memory store, Redis, and Redis with request coalescing, all with `b`.
pub async fn three(
    srv: &RedisServer,
    b: EngineBuilder,
) -> (Engine<MemoryStore>, Engine<RedisStore>, Engine<RedisStore>) {
    (
        memory_engine(b.clone()),
        redis_engine(srv, b.clone()).await,
        coalesced_engine(srv, b, Coalescing::default(), "c").await,
    )
}

/// Drives `fut`, but drops it at its `k`-th suspension (the `k`-th time it answers Pending:
/// a command has been sent and its reply not yet handled — where a crash or a client
/// disconnect leaves it). `None` when it was dropped unfinished.
pub async fn drop_at<F: std::future::Future>(fut: F, k: usize) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let mut suspended = 0;
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(out) => Poll::Ready(Some(out)),
        Poll::Pending => {
            suspended += 1;
            if suspended >= k {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        }
    })
    .await
}

/// Deducts until the answer is not `UserBusy` (or `within` passed); returns the last answer
/// and how many `UserBusy` came before it.
pub async fn until_not_busy<S: Store>(
    e: &Engine<S>,
    req: &Deduct,
    within: Duration,
) -> (Result<Deduction>, u32) {
    let deadline = Instant::now() + within;
    let mut busy = 0;
    loop {
        let r = e.deduct(req).await;
        if matches!(r, Ok(Deduction::UserBusy)) && Instant::now() < deadline {
            busy += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        return (r, busy);
    }
}

/// `cmdstat_<command>` calls so far on `srv` (`INFO commandstats`; 0 before the first).
pub fn command_calls(srv: &RedisServer, command: &str) -> u64 {
    let info = srv.cli(&["INFO", "commandstats"]);
    let key = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}
