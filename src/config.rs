//! Configuration: a serde struct read from a TOML file, with environment overrides.
//!
//! Precedence: defaults < `config/*.toml` file < environment. Environment variables are
//! `SHARDSTOCK_<SECTION>__<KEY>`, e.g. `SHARDSTOCK_STORE__REDIS_URL=redis://127.0.0.1:6379`
//! or `SHARDSTOCK_ENGINE__MAX_QTY=5`. Reading them is `Config::load` (feature `config`,
//! which brings figment); the structs are plain serde, so a service may instead deserialize a
//! [`Config`] (or one section) from its own configuration.
//!
//! [`Config::build_store`] connects the Redis store the `[store]` section describes;
//! [`EngineConfig::options`] gives the engine's options.

use crate::engine::EngineOptions;
use crate::error::{Error, Result};
use crate::store::redis::lock::LockOptions;
use crate::store::redis::{RedisStore, RedisStoreBuilder};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::time::Duration;

/// Where stock lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct StoreConfig {
    /// `redis://[user:password@]host:port[/db]`, `rediss://` for TLS (see `tls_ca_file`);
    /// empty = the embedded [`crate::MemoryStore`].
    pub redis_url: String,
    /// fred clients in the pool (each one connection; fred pipelines across tasks).
    pub pool_size: usize,
    /// Namespace in front of every key.
    pub key_prefix: String,
    /// A Redis command that has not completed after this long fails (its outcome is then
    /// unknown; retry with the same request id).
    pub command_timeout_ms: u64,
    /// Deduction strategy: `lua` (default), `lock`, `redlock`, or the unsafe baselines
    /// `naive`, `local-mutex`, `decr-compensate` (Redis only).
    pub strategy: crate::strategy::Strategy,
    /// Lock lease for `lock` / `redlock` (renewed every lease/3 while held).
    pub lock_lease_ms: u64,
    /// How long a lock acquisition waits before the request falls back to another segment.
    pub lock_wait_ms: u64,
    /// Independent Redis nodes for `redlock` (3 or 5).
    pub lock_nodes: Vec<String>,
    /// Request coalescing (strategy `lua`): concurrent deductions bound for one segment go to
    /// Redis as one script call. `false` = one script call per request.
    pub coalesce: bool,
    /// Most requests in one coalesced call.
    pub coalesce_max_batch: usize,
    /// How long (µs) a segment's queue may wait for more requests before sending; 0 = send at
    /// once (batches form from what queues while earlier calls are in flight).
    pub coalesce_window_us: u64,
    /// Coalesced calls one segment may have in flight at once.
    pub coalesce_max_in_flight: usize,
    /// Durability mode: replicas that must acknowledge each mutating call before it answers
    /// (`WAIT`); 0 = off (default), at most 16. See [`RedisStoreBuilder::wait_replicas`].
    pub wait_replicas: u32,
    /// How long (ms) durability mode waits for the replicas before answering
    /// [`Error::NotDurable`] (1..=60000).
    pub wait_timeout_ms: u64,
    /// TLS (`rediss://` URLs): a PEM file of the CA certificates to trust instead of the
    /// system's roots; empty = the system's roots. See [`RedisStoreBuilder::tls_ca_file`].
    pub tls_ca_file: String,
}

impl Default for StoreConfig {
    fn default() -> Self {
        let c = crate::Coalescing::default();
        Self {
            redis_url: String::new(),
            pool_size: 4,
            key_prefix: "ss".into(),
            command_timeout_ms: 5000,
            strategy: crate::strategy::Strategy::Lua,
            lock_lease_ms: 2000,
            lock_wait_ms: 1000,
            lock_nodes: Vec::new(),
            coalesce: true,
            coalesce_max_batch: c.max_batch,
            coalesce_window_us: c.window.as_micros() as u64,
            coalesce_max_in_flight: c.max_in_flight,
            wait_replicas: 0,
            wait_timeout_ms: 1000,
            tls_ca_file: String::new(),
        }
    }
}

impl StoreConfig {
    /// The coalescing options, or None when `coalesce` is off.
    pub fn coalescing(&self) -> Option<crate::Coalescing> {
        self.coalesce.then(|| {
            crate::Coalescing::default()
                .max_batch(self.coalesce_max_batch)
                .window(Duration::from_micros(self.coalesce_window_us))
                .max_in_flight(self.coalesce_max_in_flight)
        })
    }

    /// The lock options these settings stand for.
    pub fn lock_options(&self) -> LockOptions {
        LockOptions::default()
            .lease(Duration::from_millis(self.lock_lease_ms))
            .wait(Duration::from_millis(self.lock_wait_ms))
    }

    /// The configured Redis URL, trimmed; `None` when empty (the embedded
    /// [`crate::MemoryStore`] is meant).
    pub fn redis_url(&self) -> Option<&str> {
        Some(self.redis_url.trim()).filter(|u| !u.is_empty())
    }

    /// A [`RedisStore`] builder with every store setting (URL, pool, prefix, timeout,
    /// strategy, lock options and nodes, request coalescing, durability mode).
    pub fn redis_builder(&self) -> RedisStoreBuilder {
        let builder = RedisStore::builder(self.redis_url.trim())
            .pool_size(self.pool_size)
            .key_prefix(self.key_prefix.clone())
            .command_timeout(Duration::from_millis(self.command_timeout_ms))
            .strategy(self.strategy)
            .lock_options(self.lock_options())
            .lock_nodes(self.lock_nodes.iter().cloned())
            .coalescing(self.coalescing())
            .wait_replicas(self.wait_replicas)
            .wait_timeout(Duration::from_millis(self.wait_timeout_ms));
        match self.tls_ca_file.trim() {
            "" => builder,
            ca => builder.tls_ca_file(ca),
        }
    }
}

/// Engine tunables in config form (milliseconds); see [`EngineOptions`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct EngineConfig {
    /// [`EngineOptions::request_ttl`].
    pub request_ttl_ms: u64,
    /// [`EngineOptions::transfer_lease`].
    pub transfer_lease_ms: u64,
    /// [`EngineOptions::hint_ttl`].
    pub hint_ttl_ms: u64,
    /// [`EngineOptions::sold_out_ttl`] (default 1000; 0 = off).
    pub sold_out_ttl_ms: u64,
    /// [`EngineOptions::max_qty`].
    pub max_qty: u64,
    /// [`EngineOptions::per_user_limit`] (default 1; 0 = no limit).
    pub per_user_limit: u64,
    /// [`EngineOptions::guard_ttl`].
    pub guard_ttl_ms: u64,
    /// [`EngineOptions::guard_cap`].
    pub guard_cap: usize,
    /// [`EngineOptions::metric_skus`].
    pub metric_skus: Vec<String>,
    /// [`EngineOptions::metric_sku_cap`].
    pub metric_sku_cap: usize,
    /// [`EngineOptions::outbox`].
    pub outbox: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        let o = EngineOptions::default();
        let ms = |d: Duration| d.as_millis() as u64;
        Self {
            request_ttl_ms: ms(o.request_ttl),
            transfer_lease_ms: ms(o.transfer_lease),
            hint_ttl_ms: ms(o.hint_ttl),
            sold_out_ttl_ms: ms(o.sold_out_ttl),
            max_qty: o.max_qty,
            per_user_limit: o.per_user_limit,
            guard_ttl_ms: ms(o.guard_ttl),
            guard_cap: o.guard_cap,
            metric_skus: o.metric_skus,
            metric_sku_cap: o.metric_sku_cap,
            outbox: o.outbox,
        }
    }
}

impl EngineConfig {
    /// The options these settings stand for.
    pub fn options(&self) -> EngineOptions {
        let d = Duration::from_millis;
        EngineOptions {
            request_ttl: d(self.request_ttl_ms),
            transfer_lease: d(self.transfer_lease_ms),
            hint_ttl: d(self.hint_ttl_ms),
            sold_out_ttl: d(self.sold_out_ttl_ms),
            max_qty: self.max_qty,
            per_user_limit: self.per_user_limit,
            guard_ttl: d(self.guard_ttl_ms),
            guard_cap: self.guard_cap,
            metric_skus: self.metric_skus.clone(),
            metric_sku_cap: self.metric_sku_cap,
            outbox: self.outbox,
        }
    }
}

/// `shardstock serve`'s HTTP settings (see `shardstock::http::ApiOptions`, feature `http`).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ServeConfig {
    /// Address `serve` listens on (port 0: any free port). Default `127.0.0.1:8080`.
    pub listen: SocketAddr,
    /// Bearer token the admin routes (load, status, restock, audit) require; empty = none,
    /// which `serve` allows only on a loopback address. Prefer the environment
    /// (`SHARDSTOCK_SERVE__ADMIN_TOKEN`) to a file.
    pub admin_token: String,
    /// Bearer token the buyer routes (deduct, reservations, confirm, cancel) require; empty =
    /// open.
    pub buyer_token: String,
    /// Largest request body in bytes; larger ones answer 413.
    pub body_limit_bytes: usize,
    /// An engine call not answered after this long answers 503 with the request id to retry
    /// with (dropping an engine call is cancellation-safe and the retry exactly-once; see
    /// [`crate::http`]); 0 = no limit.
    pub request_timeout_ms: u64,
    /// How long `GET /readyz` waits for the store (every Redis master asked): a master that
    /// has not answered by then counts as unreachable, and a store none of whose servers
    /// answered makes readiness 503. 1..=60,000; keep it under the load balancer's probe
    /// timeout.
    pub ready_timeout_ms: u64,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_token: String::new(),
            buyer_token: String::new(),
            body_limit_bytes: 16 * 1024,
            request_timeout_ms: 10_000,
            ready_timeout_ms: 1_000,
        }
    }
}

#[cfg(feature = "http")]
impl ServeConfig {
    /// The API options these settings stand for (tokens, body limit, request timeout,
    /// readiness bound).
    pub fn api_options(&self) -> crate::http::ApiOptions {
        crate::http::ApiOptions::default()
            .admin_token(&self.admin_token)
            .buyer_token(&self.buyer_token)
            .body_limit(self.body_limit_bytes)
            .request_timeout(
                (self.request_timeout_ms > 0)
                    .then(|| Duration::from_millis(self.request_timeout_ms)),
            )
            .ready_timeout(Duration::from_millis(self.ready_timeout_ms))
    }
}

/// Tokens are never printed.
impl std::fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |t: &str| if t.trim().is_empty() { "" } else { "<set>" };
        f.debug_struct("ServeConfig")
            .field("listen", &self.listen)
            .field("admin_token", &set(&self.admin_token))
            .field("buyer_token", &set(&self.buyer_token))
            .field("body_limit_bytes", &self.body_limit_bytes)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("ready_timeout_ms", &self.ready_timeout_ms)
            .finish()
    }
}

/// Where the binary serves Prometheus metrics. The library itself never installs a recorder
/// (see [`crate::metrics`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct MetricsConfig {
    /// Serve `/metrics` on this address while `sim`, `serve` or `orders` runs (e.g.
    /// `127.0.0.1:9898`); unset: no metrics listener.
    pub addr: Option<SocketAddr>,
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// Store settings.
    pub store: StoreConfig,
    /// Engine settings.
    pub engine: EngineConfig,
    /// `serve` settings.
    pub serve: ServeConfig,
    /// Metrics settings of the binary.
    pub metrics: MetricsConfig,
}

impl Config {
    /// Connects the Redis store these settings describe ([`StoreConfig::redis_builder`]).
    /// A configuration without a Redis URL means the embedded store: build a
    /// [`crate::MemoryStore`] instead (the strategy must then be `lua`).
    ///
    /// # Errors
    /// [`Error::Config`] when no Redis URL is configured or the store options contradict each
    /// other; what [`RedisStoreBuilder::connect`] returns otherwise.
    pub async fn build_store(&self) -> Result<RedisStore> {
        if self.store.redis_url().is_none() {
            return Err(Error::Config(
                "store.redis_url is empty: the embedded store is meant (MemoryStore)".into(),
            ));
        }
        // A Config built in code (not through `load`) is checked here too: a zero command
        // timeout or an oversized pool must not reach fred.
        self.validate()?;
        self.store.redis_builder().connect().await
    }

    /// Reads defaults, then `file` (when given), then `SHARDSTOCK_*` environment variables,
    /// and validates the result. Feature `config`.
    ///
    /// # Errors
    /// [`Error::Config`] for an unreadable file, unknown keys (naming the closest known one),
    /// wrong types or contradictory values.
    #[cfg(feature = "config")]
    pub fn load(file: Option<&std::path::Path>) -> Result<Self> {
        use figment::Figment;
        use figment::providers::{Env, Format, Serialized, Toml};
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(f) = file {
            if !f.exists() {
                return Err(Error::Config(format!("{} does not exist", f.display())));
            }
            fig = fig.merge(Toml::file(f));
        }
        let cfg: Config = fig
            // Only SECTION__KEY variables are settings: SHARDSTOCK_CONFIG and the like, used
            // by wrappers, must not break loading. A typo in a sectioned name is an error.
            .merge(
                Env::prefixed(ENV_PREFIX)
                    .filter(|k| k.as_str().contains("__"))
                    .split("__"),
            )
            .extract()
            .map_err(load_error)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks values and combinations.
    ///
    /// # Errors
    /// [`Error::Config`] naming the offending setting.
    pub fn validate(&self) -> Result<()> {
        if let Some(url) = self.store.redis_url() {
            crate::store::redis::endpoint::check_scheme(url)?;
        }
        crate::ids::check_prefix(&self.store.key_prefix)
            .map_err(|e| Error::Config(format!("store.key_prefix: {e}")))?;
        self.store.lock_options().validate()?;
        if self.store.command_timeout_ms == 0 {
            return Err(Error::Config(
                "store.command_timeout_ms must be at least 1".into(),
            ));
        }
        if self.store.pool_size == 0 || self.store.pool_size > 256 {
            return Err(Error::Config("store.pool_size must be in 1..=256".into()));
        }
        if let Some(c) = self.store.coalescing() {
            c.validate()?;
        }
        if self.serve.body_limit_bytes == 0 {
            return Err(Error::Config(
                "serve.body_limit_bytes must be at least 1".into(),
            ));
        }
        if !(1..=60_000).contains(&self.serve.ready_timeout_ms) {
            return Err(Error::Config(format!(
                "serve.ready_timeout_ms must be in 1..=60000, got {}",
                self.serve.ready_timeout_ms
            )));
        }
        crate::store::redis::check_durability(
            self.store.wait_replicas,
            Duration::from_millis(self.store.wait_timeout_ms),
        )?;
        self.engine.options().validate()
    }
}

/// The prefix of every environment variable [`Config::load`] reads:
/// `SHARDSTOCK_<SECTION>__<KEY>`.
#[cfg(feature = "config")]
const ENV_PREFIX: &str = "SHARDSTOCK_";

/// A figment error as one message; an unknown key names the closest known one.
#[cfg(feature = "config")]
fn load_error(e: figment::Error) -> Error {
    let messages: Vec<String> = e
        .into_iter()
        .map(|e| match &e.kind {
            figment::error::Kind::UnknownField(field, expected) => {
                let mut path: Vec<&str> = e.path.iter().map(String::as_str).collect();
                // The path ends with the unknown key itself.
                if path.last() == Some(&field.as_str()) {
                    path.pop();
                }
                let setting = path
                    .iter()
                    .copied()
                    .chain([field.as_str()])
                    .collect::<Vec<_>>()
                    .join(".");
                let env = |key: &str| {
                    let section = path.iter().map(|p| format!("{p}__")).collect::<String>();
                    format!("{ENV_PREFIX}{section}{key}").to_ascii_uppercase()
                };
                let from_env = e
                    .metadata
                    .as_ref()
                    .is_some_and(|m| m.name.contains("environment"));
                let source = match &e.metadata {
                    _ if from_env => format!(" (environment variable {})", env(field)),
                    Some(m) => match &m.source {
                        Some(src) => format!(" ({} {src})", m.name),
                        None => format!(" ({})", m.name),
                    },
                    None => String::new(),
                };
                let hint = match did_you_mean(field, expected) {
                    Some(known) if from_env => format!("did you mean `{known}` ({})?", env(known)),
                    Some(known) => format!("did you mean `{known}`?"),
                    None => format!("known keys here: {}", expected.join(", ")),
                };
                format!("unknown setting `{setting}`{source}: {hint}")
            }
            _ => e.to_string(),
        })
        .collect();
    Error::Config(messages.join("; "))
}

/// The known name closest to `unknown` when it is close enough to be a typo: at most two
/// edits, or a third of the name.
#[cfg(feature = "config")]
fn did_you_mean<'a>(unknown: &str, known: &[&'a str]) -> Option<&'a str> {
    let unknown = unknown.to_ascii_lowercase();
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(&unknown, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closure signature, not ours
mod tests {
    use super::*;
    #[cfg(feature = "config")]
    use std::path::Path;

    #[cfg(feature = "config")]
    #[test]
    fn file_then_env_override() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "c.toml",
                "[store]\nredis_url = \"redis://127.0.0.1:1\"\n[engine]\nmax_qty = 7\n",
            )?;
            let c = Config::load(Some(Path::new("c.toml"))).unwrap();
            assert_eq!(c.store.redis_url, "redis://127.0.0.1:1");
            assert_eq!(c.engine.max_qty, 7);
            assert_eq!(c.store.pool_size, 4);
            jail.set_env("SHARDSTOCK_ENGINE__MAX_QTY", "9");
            jail.set_env("SHARDSTOCK_STORE__KEY_PREFIX", "flash");
            jail.set_env("SHARDSTOCK_CONFIG", "not-a-setting");
            let c = Config::load(Some(Path::new("c.toml"))).unwrap();
            assert_eq!(c.engine.max_qty, 9);
            assert_eq!(c.store.key_prefix, "flash");
            Ok(())
        });
    }

    #[cfg(feature = "config")]
    #[test]
    fn contradictions_and_typos_are_named() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("typo.toml", "[engine]\nmax_qtty = 1\n")?;
            let e = Config::load(Some(Path::new("typo.toml"))).unwrap_err();
            assert!(e.to_string().contains("max_qtty"), "{e}");
            jail.create_file(
                "bad.toml",
                "[engine]\nrequest_ttl_ms = 0\ntransfer_lease_ms = 100\n",
            )?;
            let e = Config::load(Some(Path::new("bad.toml"))).unwrap_err();
            assert!(e.to_string().contains("request_ttl"), "{e}");
            jail.create_file("prefix.toml", "[store]\nkey_prefix = \"a{b}\"\n")?;
            assert!(Config::load(Some(Path::new("prefix.toml"))).is_err());
            assert!(Config::load(Some(Path::new("missing.toml"))).is_err());
            jail.set_env("SHARDSTOCK_STORE__WAIT_REPLICAS", "17");
            let e = Config::load(None).unwrap_err();
            assert!(e.to_string().contains("store.wait_replicas"), "{e}");
            jail.set_env("SHARDSTOCK_STORE__WAIT_REPLICAS", "1");
            jail.set_env("SHARDSTOCK_STORE__WAIT_TIMEOUT_MS", "0");
            let e = Config::load(None).unwrap_err();
            assert!(e.to_string().contains("store.wait_timeout_ms"), "{e}");
            jail.set_env("SHARDSTOCK_STORE__WAIT_TIMEOUT_MS", "250");
            let c = Config::load(None).unwrap();
            assert_eq!((c.store.wait_replicas, c.store.wait_timeout_ms), (1, 250));
            jail.set_env("SHARDSTOCK_SERVE__ADMIN_TOKEN", "s3cret");
            jail.set_env("SHARDSTOCK_SERVE__REQUEST_TIMEOUT_MS", "250");
            let c = Config::load(None).unwrap();
            assert_eq!(
                (c.serve.admin_token.as_str(), c.serve.request_timeout_ms),
                ("s3cret", 250)
            );
            assert!(
                !format!("{c:?}").contains("s3cret"),
                "tokens are not printed"
            );
            jail.set_env("SHARDSTOCK_SERVE__BODY_LIMIT_BYTES", "0");
            let e = Config::load(None).unwrap_err();
            assert!(e.to_string().contains("serve.body_limit_bytes"), "{e}");
            jail.set_env("SHARDSTOCK_SERVE__BODY_LIMIT_BYTES", "100");
            for bad in ["0", "60001"] {
                jail.set_env("SHARDSTOCK_SERVE__READY_TIMEOUT_MS", bad);
                let e = Config::load(None).unwrap_err();
                assert!(e.to_string().contains("serve.ready_timeout_ms"), "{e}");
            }
            jail.set_env("SHARDSTOCK_SERVE__READY_TIMEOUT_MS", "250");
            assert_eq!(Config::load(None).unwrap().serve.ready_timeout_ms, 250);
            jail.set_env("SHARDSTOCK_ENGINE__MAX_QTTY", "3");
            let e = Config::load(None).unwrap_err();
            assert!(e.to_string().contains("max_qtty"), "{e}");
            Ok(())
        });
    }

    #[tokio::test]
    async fn no_redis_url_builds_no_redis_store() {
        let mut c = Config::default();
        c.store.redis_url = "  ".into();
        assert_eq!(c.store.redis_url(), None);
        assert!(matches!(c.build_store().await, Err(Error::Config(_))));
        c.store.redis_url = " redis://127.0.0.1:1 ".into();
        assert_eq!(c.store.redis_url(), Some("redis://127.0.0.1:1"));
        // Contradictions are named before any connection is tried.
        c.store.lock_nodes = vec!["redis://127.0.0.1:2".into()];
        let e = c.build_store().await.unwrap_err();
        assert!(e.to_string().contains("only used by the redlock"), "{e}");
    }

    #[cfg(feature = "config")]
    #[test]
    fn unknown_keys_name_the_closest_known_one() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("c.toml", "[store]\npool_sise = 8\n")?;
            let e = Config::load(Some(Path::new("c.toml"))).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains("`store.pool_sise`"), "{msg}");
            assert!(msg.contains("did you mean `pool_size`?"), "{msg}");
            assert!(msg.contains("c.toml"), "the file is named: {msg}");
            jail.create_file("s.toml", "[stor]\nredis_url = \"\"\n")?;
            let msg = Config::load(Some(Path::new("s.toml")))
                .unwrap_err()
                .to_string();
            assert!(msg.contains("did you mean `store`?"), "{msg}");
            jail.create_file("far.toml", "[engine]\nwhatever = 1\n")?;
            let msg = Config::load(Some(Path::new("far.toml")))
                .unwrap_err()
                .to_string();
            assert!(!msg.contains("did you mean"), "{msg}");
            assert!(msg.contains("max_qty"), "the known keys are listed: {msg}");
            jail.set_env("SHARDSTOCK_ENGINE__PER_USER_LIMT", "2");
            let msg = Config::load(None).unwrap_err().to_string();
            assert!(
                msg.contains("did you mean `per_user_limit` (SHARDSTOCK_ENGINE__PER_USER_LIMIT)?"),
                "{msg}"
            );
            assert!(
                msg.contains("SHARDSTOCK_ENGINE__PER_USER_LIMT"),
                "the variable is named: {msg}"
            );
            Ok(())
        });
    }

    #[cfg(feature = "config")]
    #[test]
    fn listen_and_metrics_addresses_are_settings() {
        figment::Jail::expect_with(|jail| {
            let c = Config::load(None).unwrap();
            assert_eq!(c.serve.listen, SocketAddr::from(([127, 0, 0, 1], 8080)));
            assert_eq!(c.metrics.addr, None);
            jail.set_env("SHARDSTOCK_SERVE__LISTEN", "127.0.0.1:0");
            jail.set_env("SHARDSTOCK_METRICS__ADDR", "127.0.0.1:9898");
            let c = Config::load(None).unwrap();
            assert_eq!(c.serve.listen, SocketAddr::from(([127, 0, 0, 1], 0)));
            assert_eq!(
                c.metrics.addr,
                Some(SocketAddr::from(([127, 0, 0, 1], 9898)))
            );
            jail.set_env("SHARDSTOCK_METRICS__ADDR", "nowhere");
            let msg = Config::load(None).unwrap_err().to_string();
            assert!(
                msg.contains("metrics.addr") || msg.contains("addr"),
                "{msg}"
            );
            Ok(())
        });
    }

    #[cfg(feature = "config")]
    #[test]
    fn shipped_config_parses() {
        // Inside a Jail: it holds the lock the other tests take to set `SHARDSTOCK_*`
        // variables, so their typos (on purpose) never leak into this load.
        figment::Jail::expect_with(|_jail| {
            let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/shardstock.toml");
            let c = Config::load(Some(&p)).unwrap();
            assert_eq!(c.engine, EngineConfig::default());
            assert_eq!(c.serve, ServeConfig::default());
            assert_eq!(c.metrics, MetricsConfig::default());
            Ok(())
        });
    }
}
