//! TLS to Redis: a `rediss://` store over a TLS-only `redis-server` whose certificate a
//! self-made CA (openssl) signed, trusted through `store.tls_ca_file`; another CA is refused.
//! (With `SHARDSTOCK_TEST_TLS=1` the other single-node suites run over TLS too.)

mod common;

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
