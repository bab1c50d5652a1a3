//! Test support: the whole harness the integration tests (and the benches) share.
//!
//! - [`redis_server`]: real `redis-server` processes on free loopback ports, killed on drop,
//!   their log printed when a test panics;
//! - [`ports`]: free loopback ports;
//! - [`postgres`]: throwaway PostgreSQL clusters (`initdb`, trust, free port), removed on drop;
//! - [`cluster`]: a local Redis Cluster (masters + replicas) started with `redis-cli --cluster`;
//! - [`connection_killer`]: client connections killed under a running test;
//! - [`process`]: child processes killed on drop with their log shown on panic; required tools;
//! - [`binary`]: the `shardstock` binary run with a scrubbed environment (no `SHARDSTOCK_*`,
//!   no `RUST_LOG`), bounded in time, and [`json`]: typed access to its `--json` output;
//! - [`cli`]: the CLI calls and report checks the CLI tests share;
//! - [`edges`]: what the edge-case regression tests (`tests/it/edges_*.rs`) share;
//! - [`serve_process`]: a `shardstock serve` process and its address;
//! - [`http_client`] and [`prometheus`]: HTTP calls and a real Prometheus for the metrics test;
//! - [`tls`]: a CA and a server certificate made by `openssl`, once per test process;
//! - [`proxy`]: a TCP proxy that partitions one client from Redis and heals;
//! - [`history`]: the history checker (workload, records, checks) of the history and nemesis
//!   suites; [`differential`]: the memory store against the scripts, step by step;
//! - here: engines over fresh stores, an admin connection for checks, and the two knobs a run
//!   sets for the whole suite: `SHARDSTOCK_TEST_ACL=1` (engines log in as the least-privilege
//!   user `scripts/acl.sh` describes) and `SHARDSTOCK_TEST_TLS=1` (single-node servers speak
//!   TLS only); `scripts/test.sh --acl-tls` runs the suites with both.
//!
//! The test binary (`tests/it/main.rs`) and the benches mount it as `mod common;`; the benches
//! use a part of it, hence `allow(dead_code)`.
#![allow(dead_code)]

use std::time::Duration;

use shardstock::store::redis::RedisStoreBuilder;
use shardstock::{Engine, EngineBuilder, MemoryStore, RedisStore};

pub mod binary;
pub mod cli;
pub mod cluster;
pub mod connection_killer;
pub mod differential;
pub mod edges;
pub mod history;
pub mod http_client;
pub mod json;
pub mod ports;
pub mod postgres;
pub mod process;
pub mod prometheus;
pub mod proxy;
pub mod redis_server;
pub mod refusing;
pub mod serve_process;
pub mod tls;

pub use redis_server::RedisServer;

/// A test's knob from the environment (`DIFF_CASES`, `HISTORY_OPS`, ...), parsed (surrounding
/// spaces allowed); `None` when unset or unparsable, so the test falls back to its default.
pub fn env_knob<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// `SHARDSTOCK_TEST_ACL=1`: engines made by these helpers log in as the least-privilege user
/// of their key prefix ([`RedisServer::acl_url`]); checks go through [`admin_client`] or
/// redis-cli (the `default` user, the harness's).
pub fn acl_knob() -> bool {
    env_knob::<u8>("SHARDSTOCK_TEST_ACL") == Some(1)
}

/// `SHARDSTOCK_TEST_TLS=1`: single-node [`RedisServer`]s listen with TLS only, their URLs are
/// `rediss://` and the engines trust the process's CA (`store.tls_ca_file`).
pub fn tls_knob() -> bool {
    env_knob::<u8>("SHARDSTOCK_TEST_TLS") == Some(1)
}

/// Where a test's Redis store lives: one [`RedisServer`] or a [`cluster::RedisCluster`]. The
/// engine helpers below take either, so one test body runs on a single node and on a cluster.
pub trait RedisAt {
    /// The store URL (`redis://` or `redis-cluster://`).
    fn store_url(&self) -> String;

    /// The URL of a store with keys under `prefix`: [`RedisAt::store_url`], or with
    /// `SHARDSTOCK_TEST_ACL=1` a single node's least-privilege user for that prefix
    /// ([`RedisServer::acl_url`]), so a suite runs as the documented ACL user.
    fn store_url_for(&self, prefix: &str) -> String {
        let _ = prefix;
        self.store_url()
    }

    /// The CA to trust (`store.tls_ca_file`) when the URL is `rediss://`.
    fn tls_ca(&self) -> Option<&std::path::Path> {
        None
    }
}

impl RedisAt for RedisServer {
    fn store_url(&self) -> String {
        self.url()
    }

    fn store_url_for(&self, prefix: &str) -> String {
        if acl_knob() {
            self.acl_url(prefix)
        } else {
            self.url()
        }
    }

    fn tls_ca(&self) -> Option<&std::path::Path> {
        RedisServer::tls_ca(self)
    }
}

impl RedisAt for cluster::RedisCluster {
    fn store_url(&self) -> String {
        self.url()
    }
}

/// The store settings of the test engines: `server`, 2 clients, keys under `prefix`, no
/// request coalescing.
pub fn redis_config(server: &impl RedisAt, prefix: &str) -> shardstock::Config {
    let mut config = shardstock::Config::default();
    config.store.redis_url = server.store_url_for(prefix);
    config.store.pool_size = 2;
    config.store.key_prefix = prefix.into();
    config.store.coalesce = false;
    if let Some(ca) = server.tls_ca() {
        config.store.tls_ca_file = ca.to_str().unwrap().into();
    }
    config
}

/// The store builder of [`redis_config`] (the knobs' user and CA included), for tests that set
/// more store options by hand.
pub fn store_builder(server: &impl RedisAt, prefix: &str) -> RedisStoreBuilder {
    redis_config(server, prefix).store.redis_builder()
}

/// A connection to `server` as the `default` user (all rights; over TLS when the server
/// speaks it), for what a test inspects or breaks on purpose: `KEYS`, raw records, raw `EVAL`.
/// Never the engine's own connection: under `SHARDSTOCK_TEST_ACL=1` that one has only the
/// rights `scripts/acl.sh` grants.
pub async fn admin_client(server: &RedisServer) -> fred::clients::Client {
    use fred::interfaces::ClientLike;
    let mut config = fred::types::config::Config::from_url(&server.url()).unwrap();
    if let Some(ca) = server.tls_ca() {
        config.tls = Some(tls::connector(ca).into());
    }
    // Reconnects (every 50 ms, forever): a nemesis test kills and restarts the server under it.
    let policy = fred::types::config::ReconnectPolicy::new_constant(0, 50);
    let client = fred::clients::Client::new(config, None, None, Some(policy));
    client.init().await.unwrap();
    client
}

/// An engine over a fresh Redis store on `server`.
pub async fn redis_engine(server: &impl RedisAt, builder: EngineBuilder) -> Engine<RedisStore> {
    prefixed_engine(server, builder, "t").await
}

/// An engine over a Redis store on `server` with keys under `prefix` (tests sharing one
/// server or cluster keep apart by prefix).
pub async fn prefixed_engine(
    server: &impl RedisAt,
    builder: EngineBuilder,
    prefix: &str,
) -> Engine<RedisStore> {
    let store = redis_config(server, prefix).build_store().await.unwrap();
    builder.build(store).unwrap()
}

/// An engine over a fresh Redis store with request coalescing (`opts`) under key prefix
/// `prefix`.
pub async fn coalesced_engine(
    server: &impl RedisAt,
    builder: EngineBuilder,
    opts: shardstock::Coalescing,
    prefix: &str,
) -> Engine<RedisStore> {
    let store = store_builder(server, prefix)
        .coalescing(Some(opts))
        .connect()
        .await
        .unwrap();
    builder.build(store).unwrap()
}

/// An engine over a Redis store running `strategy` with `lock` options.
pub async fn strategy_engine(
    server: &impl RedisAt,
    builder: EngineBuilder,
    strategy: shardstock::Strategy,
    lock: shardstock::lock::LockOptions,
) -> Engine<RedisStore> {
    let store = store_builder(server, "t")
        .strategy(strategy)
        .lock_options(lock)
        .connect()
        .await
        .unwrap();
    builder.build(store).unwrap()
}

/// Lock options with the given lease and wait.
pub fn lock_opts(lease_ms: u64, wait_ms: u64) -> shardstock::lock::LockOptions {
    let mut o = shardstock::lock::LockOptions::default();
    o.lease = Duration::from_millis(lease_ms);
    o.wait = Duration::from_millis(wait_ms);
    o
}

/// An engine over a fresh memory store.
pub fn memory_engine(builder: EngineBuilder) -> Engine<MemoryStore> {
    builder.build(MemoryStore::new()).unwrap()
}
