//! Redis ACL: shardstock as the least-privilege user `scripts/acl.sh` describes (keys under
//! the prefix only, only the commands the client and the scripts use), with the `default` user
//! switched off; and a user without a right gets [`ErrorKind::Permission`] naming what is
//! missing.

use crate::common;

use common::redis_server::{acl_line, redis_cli_stdin};
use common::{RedisServer, redis_config};
use shardstock::orders::{Handler, OrderEvent, Orders, OrdersOptions};
use shardstock::{
    Deduct, Deduction, Engine, EngineBuilder, ErrorKind, LoadOptions, RedisStore, RequestId,
    Reserved, Sku, Strategy,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PASS: &str = "acl-pass";

/// A server where `user` has exactly `line`'s rights, an `admin` user has all, and `default`
/// is off: nothing of shardstock can lean on the default user.
fn server_with(line: &str) -> RedisServer {
    let redis = RedisServer::start();
    assert_eq!(redis.acl_setuser(line), "OK", "{line}");
    assert_eq!(
        redis.acl_setuser("ACL SETUSER admin on >admin ~* &* +@all"),
        "OK"
    );
    assert_eq!(redis.acl_setuser("ACL SETUSER default off"), "OK");
    redis
}

/// Runs an `ACL SETUSER` line as `admin` (`default` is off).
fn admin(redis: &RedisServer, line: &str) -> String {
    let auth = ["--user", "admin", "--pass", "admin", "--no-auth-warning"];
    redis_cli_stdin(redis.port, &auth, line)
}

/// The server's URL (`rediss://` under `SHARDSTOCK_TEST_TLS=1`) logging in as `user`.
fn url(redis: &RedisServer, user: &str) -> String {
    redis
        .url()
        .replacen("://", &format!("://{user}:{PASS}@"), 1)
}

fn config(redis: &RedisServer, user: &str, prefix: &str) -> shardstock::Config {
    let mut c = redis_config(redis, prefix);
    c.store.redis_url = url(redis, user);
    c
}

async fn engine(
    redis: &RedisServer,
    user: &str,
    prefix: &str,
    coalesce: bool,
) -> Engine<RedisStore> {
    let mut c = config(redis, user, prefix);
    c.store.coalesce = coalesce;
    let store = c.build_store().await.unwrap();
    EngineBuilder::default()
        .per_user_limit(0)
        .transfer_lease(Duration::from_millis(300))
        .build(store)
        .unwrap()
}

fn rid(s: &str) -> RequestId {
    RequestId::new(s).unwrap()
}

#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<OrderEvent>>>);

impl Handler for Collect {
    async fn handle(&self, events: &[OrderEvent]) -> Vec<Result<(), String>> {
        self.0.lock().unwrap().extend_from_slice(events);
        vec![Ok(()); events.len()]
    }
}

/// Load, deductions at home and with units moved home from other segments (transfers: debit,
/// credit, done, the sweeper's due list), a per-user limit, a coalesced burst,
/// reservations confirmed / cancelled / expired and swept, a restock, status and audit, the
/// `lock` strategy, the orders consumer draining the outbox, and durability mode's `WAIT`:
/// all as the documented least-privilege user.
#[tokio::test]
async fn core_flows_as_the_least_privilege_user() {
    let redis = server_with(&acl_line("shop", "shardstock", PASS, &[]));
    let e = engine(&redis, "shardstock", "shop", false).await;
    let sku = Sku::new("flash").unwrap();
    e.load(&sku, 40, LoadOptions::new(4).per_user_limit(3).outbox(true))
        .await
        .unwrap();
    // At home (10 units in each segment).
    let d = e
        .deduct(&Deduct::new("flash", "ann", 1, "d1").unwrap())
        .await
        .unwrap();
    assert!(matches!(d, Deduction::Applied { .. }), "{d:?}");
    let d = e
        .deduct(&Deduct::new("flash", "bob", 3, "d2").unwrap())
        .await
        .unwrap();
    assert!(matches!(d, Deduction::Applied { .. }), "{d:?}");
    let d = e
        .deduct(&Deduct::new("flash", "ann", 3, "d3").unwrap())
        .await
        .unwrap();
    assert!(matches!(d, Deduction::LimitReached { .. }), "{d:?}");
    let d = e
        .deduct(&Deduct::new("flash", "ann", 1, "d1").unwrap())
        .await
        .unwrap();
    assert!(matches!(d, Deduction::Replayed { .. }), "{d:?}");
    // A coalesced burst (batch script) from a second engine.
    let c = Arc::new(engine(&redis, "shardstock", "shop", true).await);
    let burst = (0..20).map(|i| {
        let c = c.clone();
        tokio::spawn(async move {
            c.deduct(&Deduct::new("flash", &format!("u{i}"), 1, &format!("b{i}")).unwrap())
                .await
                .unwrap()
        })
    });
    for d in futures::future::join_all(burst).await {
        assert!(matches!(d.unwrap(), Deduction::Applied { .. }));
    }
    // Reservations: confirmed, cancelled, expired (swept).
    let ttl = Duration::from_secs(30);
    let mut ids = Vec::new();
    for (user, r) in [("cat", "r1"), ("dan", "r2")] {
        match e
            .reserve(&Deduct::new("flash", user, 1, r).unwrap(), ttl)
            .await
            .unwrap()
        {
            Reserved::Held { id, .. } => ids.push(id),
            other => panic!("{other:?}"),
        }
    }
    e.confirm(&ids[0]).await.unwrap();
    e.cancel(&ids[1]).await.unwrap();
    let short = e
        .reserve(
            &Deduct::new("flash", "eve", 1, "r3").unwrap(),
            Duration::from_millis(50),
        )
        .await
        .unwrap();
    assert!(matches!(short, Reserved::Held { .. }), "{short:?}");
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(e.sweep().await.unwrap(), 1);
    // Restock, status, audit.
    let r = e.restock(&sku, 5, &rid("rs1")).await.unwrap();
    assert_eq!(r.added, 5);
    let left = e.remaining(&sku).await.unwrap();
    let audit = e.audit(&sku).await.unwrap();
    assert!(audit.ok, "{:?}", audit.problems);
    assert_eq!(audit.sold, 1 + 3 + 20 + 1);
    assert_eq!(audit.remaining, 45 - audit.sold);
    assert_eq!(left.total, audit.remaining);
    // The orders consumer drains every sale's event.
    let h = Collect::default();
    let orders = Orders::new(
        config(&redis, "shardstock", "shop")
            .build_store()
            .await
            .unwrap(),
        h.clone(),
        OrdersOptions::new("orders", "c1").discover_every(Duration::from_millis(20)),
    )
    .unwrap();
    orders.drain(Duration::from_secs(20)).await.unwrap();
    assert!(
        h.0.lock().unwrap().len() >= 25,
        "{}",
        h.0.lock().unwrap().len()
    );

    // More than a home holds (2 each): units move home from the other segments (transfer.lua
    // debits, sell.lua credits, transfer.lua marks them done); the sweeper reads the due lists.
    let msku = Sku::new("moving").unwrap();
    e.load(&msku, 8, LoadOptions::new(4).per_user_limit(0))
        .await
        .unwrap();
    let d = e
        .deduct(&Deduct::new("moving", "mo", 5, "m1").unwrap())
        .await
        .unwrap();
    assert!(matches!(&d, Deduction::Applied { units: 5, .. }), "{d:?}");
    e.sweep().await.unwrap();
    let a = e.audit(&msku).await.unwrap();
    assert!(
        a.ok && a.sold == 5 && a.remaining == 3 && a.in_transit == 0,
        "{a:?}"
    );

    // The lock strategy (lock scripts, fenced writes).
    let mut lc = config(&redis, "shardstock", "shop");
    lc.store.strategy = Strategy::Lock;
    lc.store.coalesce = false;
    let locked = EngineBuilder::default()
        .per_user_limit(0)
        .build(lc.build_store().await.unwrap())
        .unwrap();
    let lsku = Sku::new("locked").unwrap();
    locked.load(&lsku, 4, LoadOptions::new(2)).await.unwrap();
    for i in 0..5 {
        let d = locked
            .deduct(&Deduct::new("locked", "u", 1, &format!("l{i}")).unwrap())
            .await
            .unwrap();
        assert_eq!(matches!(d, Deduction::Applied { .. }), i < 4, "{d:?}");
    }
    locked.sweep().await.unwrap();
    let a = locked.audit(&lsku).await.unwrap();
    assert!(a.ok && a.sold == 4 && a.in_transit == 0, "{a:?}");

    // Durability mode: WAIT is allowed (no replica here, so the answer is "not durable", not
    // a permission error).
    let mut dc = config(&redis, "shardstock", "shop");
    dc.store.wait_replicas = 1;
    dc.store.wait_timeout_ms = 20;
    let durable = EngineBuilder::default()
        .build(dc.build_store().await.unwrap())
        .unwrap();
    let err = durable
        .deduct(&Deduct::new("flash", "zed", 1, "w1").unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotDurable, "{err}");
}

/// The line, without `drop` (one of its `+command` grants).
fn line_without(prefix: &str, user: &str, drop: &str) -> String {
    let line = acl_line(prefix, user, PASS, &[]);
    let needle = format!(" {drop}");
    assert!(line.contains(&needle), "{line}");
    line.replacen(&needle, "", 1)
}

#[tokio::test]
async fn a_missing_right_is_named_in_a_permission_error() {
    // A command the client sends: Redis names it.
    let redis = server_with(&line_without("shop", "noevalsha", "+evalsha"));
    let e = engine(&redis, "noevalsha", "shop", false).await;
    let err = e
        .load(&Sku::new("s").unwrap(), 10, LoadOptions::new(2))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Permission, "{err}");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("'evalsha'"), "{err}");

    // A command only a script runs (XADD, the outbox): Redis names the script by its SHA1;
    // the error names the script and the commands it calls.
    assert_eq!(
        admin(&redis, &line_without("shop", "noxadd", "+xadd")),
        "OK"
    );
    let e = engine(&redis, "noxadd", "shop", false).await;
    let sku = Sku::new("out").unwrap();
    e.load(&sku, 10, LoadOptions::new(2).outbox(true))
        .await
        .unwrap();
    let err = e
        .deduct(&Deduct::new("out", "ann", 1, "x1").unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Permission, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("xadd") && msg.contains("outbox") && msg.contains("scripts/acl.sh"),
        "{msg}"
    );
    // Redis does not roll a script back, so the scripts ask `redis.acl_check_cmd` before
    // their first write: the sale is refused whole, never written without its event. The
    // audit writes nothing (no event either), so this user can still read it.
    let audit = e.audit(&sku).await.unwrap();
    assert!(audit.ok && audit.sold == 0, "{audit:?}");
    assert_eq!(admin(&redis, &acl_line("shop", "full", PASS, &[])), "OK");
    let full = engine(&redis, "full", "shop", false).await;
    let audit = full.audit(&sku).await.unwrap();
    assert!(audit.ok, "{:?}", audit.problems);
    assert_eq!(audit.sold, 0, "{audit:?}");
    println!("missing +xadd: {msg}; sold {}", audit.sold);

    // A key outside the user's pattern (the store's prefix is not the user's).
    assert_eq!(
        admin(&redis, &acl_line("other", "otherprefix", PASS, &[])),
        "OK"
    );
    let e = engine(&redis, "otherprefix", "shop", false).await;
    let err = e
        .deduct(&Deduct::new("out", "bob", 1, "x2").unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Permission, "{err}");
    assert!(err.to_string().contains("key"), "{err}");

    // A command only scripts call, refused by Redis inside the script (no `+time`: a sale
    // without a limit reads the clock): Redis names the script by its SHA1 and line; the
    // error names the script and the command on that line.
    assert_eq!(
        admin(&redis, &line_without("shop", "notime", "+time")),
        "OK"
    );
    let e = engine(&redis, "notime", "shop", false).await;
    let sku = Sku::new("clock").unwrap();
    let err = match e
        .load(&sku, 10, LoadOptions::new(1).per_user_limit(0))
        .await
    {
        Err(err) => err,
        Ok(_) => e
            .deduct(&Deduct::new("clock", "cy", 1, "c1").unwrap())
            .await
            .unwrap_err(),
    };
    assert_eq!(err.kind(), ErrorKind::Permission, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("script ") && msg.contains(" runs TIME: a command the user may not run"),
        "{msg}"
    );
    println!("missing +time: {msg}");
}

/// Every command a script calls (`redis.call('CMD'`, or a table `{ 'CMD', ...}` unpacked
/// into one) is granted by the line: a script that starts calling a new command fails here,
/// not in production with a permission error after half its writes.
#[test]
fn the_acl_line_grants_every_command_the_scripts_call() {
    let line = format!("{} ", acl_line("p", "u", PASS, &[]));
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/scripts");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let src = std::fs::read_to_string(&path).unwrap();
        for open in ["redis.call('", "redis.pcall('", "{ '"] {
            for (i, _) in src.match_indices(open) {
                let cmd = src[i + open.len()..].split('\'').next().unwrap();
                if cmd.is_empty() || !cmd.bytes().all(|b| b.is_ascii_uppercase()) {
                    continue;
                }
                let grant = format!("+{}", cmd.to_ascii_lowercase());
                assert!(
                    line.contains(&format!("{grant} ")) || line.contains(&format!("{grant}|")),
                    "{} calls {cmd}, which scripts/acl.sh does not grant: {line}",
                    path.display()
                );
                seen += 1;
            }
        }
    }
    assert!(seen > 50, "{seen}");
}
