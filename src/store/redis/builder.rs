//! [`RedisStoreBuilder`]: connection, strategy and request coalescing of a [`RedisStore`].

use super::conn::Conn;
use super::strategies::Runner;
use super::{Coalescing, RedisStore, endpoint, lua};
use crate::cluster::wait;
use crate::error::{Error, Result};
use crate::segments::Keyspace;
use crate::store::redis::lock::LockOptions;
use crate::strategy::Strategy;
use fred::prelude::{Builder, ClientLike, ReconnectPolicy, ServerConfig};
use fred::types::config::ClusterDiscoveryPolicy;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Builds a [`RedisStore`]:
///
/// ```no_run
/// # async fn demo() -> shardstock::Result<()> {
/// use shardstock::{Coalescing, RedisStore};
/// let store = RedisStore::builder("redis://127.0.0.1:6379")
///     .pool_size(4)
///     .key_prefix("shop")
///     .coalescing(Some(Coalescing::default()))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
///
/// Defaults: 4 clients, key prefix `ss`, a 5 s command timeout, strategy `lua`, no request
/// coalescing (one script call per request), durability mode off. [`crate::Config::build_store`]
/// builds the store a configuration describes.
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    url: String,
    pool_size: usize,
    key_prefix: String,
    command_timeout: Duration,
    strategy: Strategy,
    lock_options: LockOptions,
    lock_nodes: Vec<String>,
    coalescing: Option<Coalescing>,
    wait_replicas: u32,
    wait_timeout: Duration,
    tls_ca_file: Option<PathBuf>,
}

impl RedisStoreBuilder {
    pub(super) fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            pool_size: 4,
            key_prefix: "ss".into(),
            command_timeout: Duration::from_secs(5),
            strategy: Strategy::Lua,
            lock_options: LockOptions::default(),
            lock_nodes: Vec::new(),
            coalescing: None,
            wait_replicas: 0,
            wait_timeout: Duration::from_secs(1),
            tls_ca_file: None,
        }
    }

    /// fred clients in the pool (each one connection; fred pipelines across tasks). At
    /// least 1.
    pub fn pool_size(mut self, n: usize) -> Self {
        self.pool_size = n;
        self
    }

    /// Namespace in front of every key.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// A command that cannot complete within this time fails with [`Error::Redis`]: its
    /// outcome is then unknown and the caller retries with the same request id.
    pub fn command_timeout(mut self, d: Duration) -> Self {
        self.command_timeout = d;
        self
    }

    /// The selling strategy (default `lua`).
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Lock tunables of the `lock` and `redlock` strategies.
    pub fn lock_options(mut self, opts: LockOptions) -> Self {
        self.lock_options = opts;
        self
    }

    /// The independent nodes of the `redlock` strategy (3 or 5 `redis://` URLs); `lock` uses
    /// the store's own Redis and no nodes.
    pub fn lock_nodes(mut self, urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.lock_nodes = urls.into_iter().map(Into::into).collect();
        self
    }

    /// Request coalescing of `lua` sales (`None`: one script call per request). See
    /// [`Coalescing`].
    pub fn coalescing(mut self, opts: Option<Coalescing>) -> Self {
        self.coalescing = opts;
        self
    }

    /// Durability mode: every mutating script call (a coalesced batch is one call) answers
    /// only after `n` replicas of its master acknowledged its writes (`WAIT n <timeout>` on
    /// the same connection), so an acknowledged sale survives a failover to one of them. 0
    /// (the default) = off; at most 16. A call that gets fewer acknowledgements within
    /// [`wait_timeout`](Self::wait_timeout) fails with [`Error::NotDurable`] (retry with the
    /// same request id). Each mutating call costs a replication round trip more.
    pub fn wait_replicas(mut self, n: u32) -> Self {
        self.wait_replicas = n;
        self
    }

    /// How long a durability-mode `WAIT` waits for the replicas (1 ms ..= 60 s, whole
    /// milliseconds; default 1 s).
    pub fn wait_timeout(mut self, d: Duration) -> Self {
        self.wait_timeout = d;
        self
    }

    /// TLS (`rediss://` URLs): trust the CA certificates of this PEM file instead of the
    /// system's roots — for a Redis whose certificate a private CA signed. The server's name
    /// in the URL (host name or IP address) must be in its certificate. Without a `rediss://`
    /// URL this is a configuration error.
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_ca_file = Some(path.into());
        self
    }

    /// Checks the options, connects and loads the scripts.
    ///
    /// Connections that drop are re-established forever with exponential backoff (10 ms to
    /// 1 s), and fred re-sends commands that were in flight (at most 3 attempts each).
    ///
    /// # Errors
    /// [`Error::Config`] for bad lock, coalescing or durability options, or lock nodes that do not fit the
    /// strategy, and for TLS: a CA file that cannot be read or holds no certificate, a CA file
    /// without a `rediss://` URL, a server certificate the CA does not vouch for;
    /// [`Error::Config`] too for a URL without a scheme (`127.0.0.1:6379`) or with one that is
    /// not Redis's (`http://`), or that fred cannot read (no host, a bad port);
    /// [`Error::InvalidInput`] for a bad key prefix; [`Error::Redis`] when Redis is
    /// unreachable, or the port answers but does not speak the Redis protocol (the message
    /// says what it did: answered `HTTP/1.1 400 ...`, closed the connection, said nothing); [`Error::Permission`] when the Redis user may not run what
    /// shardstock needs (`scripts/acl.sh`).
    pub async fn connect(self) -> Result<RedisStore> {
        crate::ids::check_prefix(&self.key_prefix)?;
        self.check()?;
        let mut config = endpoint::parse(&self.url)?;
        // On a cluster, rediscover the slot map from every node of the last known map, not
        // only from the seeds named in the URL: a dead seed must not stall the client once the
        // cluster has failed over (fred's default asks the configured endpoints only).
        if let Some(ca) = &self.tls_ca_file {
            if !config.uses_tls() {
                return Err(Error::Config(format!(
                    "store.tls_ca_file ({}) is set but the Redis URL is not rediss:// (TLS)",
                    ca.display()
                )));
            }
            config.tls = Some(tls_connector(ca)?.into());
        }
        let tls = config.uses_tls();
        let probe = endpoint::NotRedis::of(&config);
        let clustered = matches!(config.server, ServerConfig::Clustered { .. });
        if let ServerConfig::Clustered { policy, .. } = &mut config.server {
            *policy = ClusterDiscoveryPolicy::UseCache;
        }
        let pool = Builder::from_config(config)
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_secs(5);
                c.max_command_attempts = 3;
                // fred 10.1 mishandles ASK (replies go to the wrong callers): on a cluster the
                // store follows redirections itself (`cluster::moving`), fred none.
                if clustered {
                    c.max_redirections = 0;
                }
            })
            .with_performance_config(|p| {
                p.default_command_timeout = self.command_timeout;
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 10, 1000, 2))
            .build_pool(self.pool_size.max(1))?;
        let started = match pool.init().await {
            Ok(_) => lua::load(pool.next(), lua::Script::ALL).await,
            // A refused certificate is no outage: say what to fix instead of "retry".
            Err(e) if tls && e.details().to_ascii_lowercase().contains("certificate") => {
                return Err(Error::Config(format!(
                    "TLS to Redis: the server's certificate was refused ({e}); check store.tls_ca_file \
                     (the CA that signed it) and that the URL's host is in the certificate"
                )));
            }
            Err(e) => Err(e.into()),
        };
        if let Err(e) = started {
            // A port that answers but is no Redis fails as a decoding error, a closed
            // connection or a reply fred cannot read (at the handshake or the first command):
            // say what the port is instead.
            if let (Error::Redis(_), Some(p)) = (&e, &probe)
                && let Some(why) = p.probe().await
            {
                return Err(Error::Redis(fred::error::Error::new(
                    fred::error::ErrorKind::Protocol,
                    why,
                )));
            }
            return Err(e);
        }
        if self.wait_replicas > 0 {
            for w in wait::setup_warnings(pool.next(), self.wait_replicas).await {
                tracing::warn!("{w}");
            }
        }
        let runner = Runner::new(
            self.strategy,
            &pool,
            self.lock_options,
            &self.lock_nodes,
            self.coalescing,
        )
        .await?;
        // Stock notifications for the engine's sold-out flags: one subscriber connection (the
        // lua strategy only, and not on a cluster: elsewhere flags stay off).
        let subscriber = if clustered || self.strategy != Strategy::Lua {
            None
        } else {
            let s = super::invalidate::start(pool.next(), &self.key_prefix).await;
            Some(Arc::new(s))
        };
        Ok(RedisStore {
            subscriber,
            conn: Conn {
                pool,
                keys: Keyspace::new(self.key_prefix),
                durable: wait::Durable::new(
                    self.wait_replicas,
                    self.wait_timeout,
                    self.command_timeout,
                ),
            },
            runner: Arc::new(runner),
        })
    }

    /// Option checks that need no connection.
    fn check(&self) -> Result<()> {
        self.lock_options.validate()?;
        if self.strategy == Strategy::Redlock && self.lock_nodes.is_empty() {
            return Err(Error::Config(
                "the redlock strategy needs lock nodes (--lock-nodes URL,URL,URL)".into(),
            ));
        }
        if self.strategy == Strategy::Redlock {
            crate::store::redis::lock::redlock::RedLock::check_nodes(&self.lock_nodes)?;
        }
        if self.strategy != Strategy::Redlock && !self.lock_nodes.is_empty() {
            return Err(Error::Config(
                "lock nodes are only used by the redlock strategy".into(),
            ));
        }
        if let Some(c) = &self.coalescing {
            c.validate()?;
        }
        wait::check(self.wait_replicas, self.wait_timeout)?;
        if self.wait_replicas > 0 {
            // A WAIT blocks its connection: every call behind it waits that long too, so a
            // WAIT as long as a command's timeout would time out everything on the node.
            if self.wait_timeout * 2 > self.command_timeout {
                return Err(Error::Config(format!(
                    "store.wait_timeout_ms ({} ms) must be at most half the command timeout ({} ms)",
                    self.wait_timeout.as_millis(),
                    self.command_timeout.as_millis()
                )));
            }
            if !self.strategy.exactly_once() {
                return Err(Error::Config(format!(
                    "durability mode (store.wait_replicas) waits after scripts; the {} baseline writes without them",
                    self.strategy
                )));
            }
        }
        Ok(())
    }
}

/// A rustls connector trusting only the CA certificates of the PEM file `ca`.
fn tls_connector(ca: &Path) -> Result<fred::types::config::TlsConnector> {
    use fred::rustls::pki_types::CertificateDer;
    use fred::rustls::pki_types::pem::PemObject;
    use fred::rustls::{ClientConfig, RootCertStore};
    let bad = |why: String| Error::Config(format!("store.tls_ca_file {}: {why}", ca.display()));
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| bad(e.to_string()))? {
        roots
            .add(cert.map_err(|e| bad(e.to_string()))?)
            .map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("no CA certificate in it".into()));
    }
    // The ring provider by name: the process-wide default is ambiguous when another crate
    // enables a second rustls provider.
    let provider = Arc::new(fred::rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config.into())
}
