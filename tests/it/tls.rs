//! TLS to Redis: a `rediss://` store over a TLS-only `redis-server` whose certificate a
//! self-made CA (openssl) signed, trusted through `store.tls_ca_file`; another CA is refused.
//! (With `SHARDSTOCK_TEST_TLS=1` the other single-node suites run over TLS too.)

use crate::common;

use common::RedisServer;
use common::tls::Ca;
use shardstock::{Deduct, Deduction, EngineBuilder, ErrorKind, LoadOptions, Sku};

fn config(url: String, ca: &std::path::Path) -> shardstock::Config {
    let mut c = shardstock::Config::default();
    c.store.redis_url = url;
    c.store.pool_size = 2;
    c.store.key_prefix = "t".into();
    c.store.tls_ca_file = ca.to_str().unwrap().into();
    c
}

#[tokio::test]
async fn a_sale_over_tls_with_the_servers_ca() {
    let redis = RedisServer::start_tls();
    let store = config(redis.url(), redis.tls_ca().unwrap())
        .build_store()
        .await
        .unwrap();
    let engine = EngineBuilder::default()
        .per_user_limit(0)
        .build(store)
        .unwrap();
    let sku = Sku::new("tls").unwrap();
    engine.load(&sku, 10, LoadOptions::new(2)).await.unwrap();
    for i in 0..12 {
        let d = engine
            .deduct(&Deduct::new("tls", "u", 1, &format!("r{i}")).unwrap())
            .await
            .unwrap();
        assert_eq!(matches!(d, Deduction::Applied { .. }), i < 10, "{i}: {d:?}");
    }
    let audit = engine.audit(&sku).await.unwrap();
    assert!(audit.ok, "{:?}", audit.problems);
    assert_eq!((audit.sold, audit.remaining), (10, 0));
    // The keys really are on the TLS server.
    assert_ne!(redis.cli(&["DBSIZE"]), "0");
}

#[tokio::test]
async fn another_ca_is_refused_with_a_clear_error() {
    let redis = RedisServer::start_tls();
    let other = tempfile::tempdir().unwrap();
    let wrong = Ca::new(other.path(), "other-ca");
    let err = config(redis.url(), &wrong.cert)
        .build_store()
        .await
        .expect_err("a certificate from another CA must be refused");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("certificate was refused") && msg.contains("tls_ca_file"),
        "{msg}"
    );
}

#[tokio::test]
async fn tls_options_that_cannot_work_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    // A CA file with a plain redis:// URL: TLS would silently not be used.
    let err = config("redis://127.0.0.1:1".into(), &ca.cert)
        .build_store()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not rediss://"), "{err}");
    // A missing file, and a file without a certificate.
    let missing = dir.path().join("missing.pem");
    let err = config("rediss://127.0.0.1:1".into(), &missing)
        .build_store()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("missing.pem"), "{err}");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let err = config("rediss://127.0.0.1:1".into(), &empty)
        .build_store()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no CA certificate"), "{err}");
}

/// The suite-wide knobs are in force, not just set: with `SHARDSTOCK_TEST_TLS=1` a harness
/// server does not answer plain RESP and the engines' connections use TLS; with
/// `SHARDSTOCK_TEST_ACL=1` they log in as the least-privilege user, refused `KEYS`, while the
/// admin connection (the harness's checks) may. `scripts/test.sh --acl-tls` runs it with both.
#[tokio::test]
async fn the_suite_knobs_are_in_force() {
    use fred::interfaces::ClientLike;
    // Read here, not through the harness's knob functions: a broken knob must not agree with
    // itself.
    let set = |name| std::env::var(name).is_ok_and(|v| v.trim() == "1");
    let (tls, acl) = (set("SHARDSTOCK_TEST_TLS"), set("SHARDSTOCK_TEST_ACL"));
    eprintln!("SHARDSTOCK_TEST_TLS: {tls}, SHARDSTOCK_TEST_ACL: {acl}");
    let srv = RedisServer::start();
    assert_eq!(srv.url().starts_with("rediss://"), tls, "{}", srv.url());
    assert_eq!(
        common::redis_server::ping(srv.port),
        !tls,
        "plain PING answered"
    );
    let e = common::redis_engine(&srv, EngineBuilder::default()).await;
    let sku = Sku::new("knob").unwrap();
    e.load(&sku, 3, LoadOptions::new(1)).await.unwrap();
    let conn = e.store().pool().next();
    let config = conn.client_config();
    assert_eq!(config.uses_tls(), tls);
    assert_eq!(config.username.is_some(), acl, "{:?}", config.username);
    let keys: Result<Vec<String>, _> = conn.custom(fred::cmd!("KEYS"), vec!["*"]).await;
    assert_eq!(keys.is_err(), acl, "{keys:?}");
    let admin = common::admin_client(&srv).await;
    assert_eq!(admin.client_config().uses_tls(), tls);
    let keys: Vec<String> = admin.custom(fred::cmd!("KEYS"), vec!["*"]).await.unwrap();
    assert!(keys.iter().any(|k| k.contains("{knob#0}")), "{keys:?}");
}
