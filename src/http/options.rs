//! How the API serves: [`ApiOptions`] (the `/metrics` renderer, the bearer tokens, the body
//! limit, the request timeout) and the checks [`serve`](super::serve) makes before it listens.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Renders the metrics exposition for `GET /metrics` (Prometheus text format).
pub(super) type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// A bearer token, compared in constant time (`subtle`); never printed.
#[derive(Clone)]
pub(crate) struct Token(Arc<[u8]>);

impl Token {
    /// `None` for an empty (or all-blank) token: no token.
    fn new(token: &str) -> Option<Self> {
        let t = token.trim();
        (!t.is_empty()).then(|| Self(t.as_bytes().into()))
    }

    /// Whether `given` is this token. Constant time in the contents; the length is not a secret.
    pub(crate) fn matches(&self, given: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        self.0.as_ref().ct_eq(given).into()
    }
}

/// Default [`ApiOptions::body_limit`]: 16 KiB, far above any valid body.
pub const DEFAULT_BODY_LIMIT: usize = 16 * 1024;

/// Default [`ApiOptions::request_timeout`]: 10 s.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Default [`ApiOptions::ready_timeout`]: 1 s.
pub const DEFAULT_READY_TIMEOUT: Duration = crate::engine::DEFAULT_READY_TIMEOUT;

/// How the API is set up beyond its routes. `Default`: no `/metrics` route content (it answers
/// 404), the reservation sweeper every second under [`serve_with`](super::serve_with), no tokens (loopback
/// listeners only, see [`ApiOptions::check_listen`]), bodies up to [`DEFAULT_BODY_LIMIT`],
/// engine calls cut after [`DEFAULT_REQUEST_TIMEOUT`], readiness looks bounded by
/// [`DEFAULT_READY_TIMEOUT`].
#[derive(Clone)]
#[non_exhaustive]
pub struct ApiOptions {
    pub(super) metrics: Option<Render>,
    pub(super) sweep_every: Option<Duration>,
    pub(super) admin_token: Option<Token>,
    pub(super) buyer_token: Option<Token>,
    pub(super) body_limit: usize,
    pub(super) request_timeout: Option<Duration>,
    pub(super) ready_timeout: Duration,
}

impl Default for ApiOptions {
    fn default() -> Self {
        Self {
            metrics: None,
            sweep_every: Some(Duration::from_secs(1)),
            admin_token: None,
            buyer_token: None,
            body_limit: DEFAULT_BODY_LIMIT,
            request_timeout: Some(DEFAULT_REQUEST_TIMEOUT),
            ready_timeout: DEFAULT_READY_TIMEOUT,
        }
    }
}

impl std::fmt::Debug for ApiOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiOptions")
            .field("metrics", &self.metrics.is_some())
            .field("sweep_every", &self.sweep_every)
            .field("admin_token", &self.admin_token.is_some())
            .field("buyer_token", &self.buyer_token.is_some())
            .field("body_limit", &self.body_limit)
            .field("request_timeout", &self.request_timeout)
            .field("ready_timeout", &self.ready_timeout)
            .finish()
    }
}

impl ApiOptions {
    /// `GET /metrics` answers `render()` as Prometheus text. The library never installs a
    /// metrics recorder (see [`crate::metrics`]); whoever installs one passes its renderer here,
    /// e.g. for the handle of `metrics_exporter_prometheus::PrometheusBuilder::install_recorder`
    /// (which starts no upkeep task) `move || { handle.run_upkeep(); handle.render() }`, as
    /// `examples/embed_axum.rs` does.
    pub fn metrics(mut self, render: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.metrics = Some(Arc::new(render));
        self
    }

    /// How often [`serve_with`](super::serve_with) runs the reservation sweeper, which returns the units of expired
    /// reservations ([`Engine::start_sweeper`](crate::Engine::start_sweeper)); `None` runs none (sweep elsewhere, e.g. in
    /// one instance of many). Default: every second. [`router`](super::router) never starts one: an app that
    /// mounts the routes starts it with [`Engine::start_background`](crate::Engine::start_background).
    pub fn sweep_every(mut self, every: Option<Duration>) -> Self {
        self.sweep_every = every;
        self
    }

    /// The admin routes (`PUT /skus/{sku}` load, `GET /skus/{sku}` status, `POST
    /// /skus/{sku}/restock`, `GET /skus/{sku}/audit`) require `Authorization: Bearer <token>`.
    /// An empty token means none: the admin routes are then open, which [`serve_with`](super::serve_with) allows
    /// only on a loopback address.
    pub fn admin_token(mut self, token: &str) -> Self {
        self.admin_token = Token::new(token);
        self
    }

    /// The buyer routes (`POST /skus/{sku}/deduct`, `POST /skus/{sku}/reservations`, `POST
    /// /reservations/{id}/confirm` and `/cancel`) require `Authorization: Bearer <token>`.
    /// Empty: open (the default).
    pub fn buyer_token(mut self, token: &str) -> Self {
        self.buyer_token = Token::new(token);
        self
    }

    /// Largest request body in bytes (default [`DEFAULT_BODY_LIMIT`]); larger ones answer 413.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// How long an engine call may take before the request answers 503 (with `Retry-After` and
    /// the request id to retry with); `None`: no limit. Default [`DEFAULT_REQUEST_TIMEOUT`].
    pub fn request_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long `GET /readyz` waits for the store ([`Engine::readiness`](crate::Engine::readiness)): a server that has
    /// not answered by then counts as unreachable, and a store none of whose servers answered
    /// makes it 503. Default [`DEFAULT_READY_TIMEOUT`] (1 s); below 1 ms counts as 1 ms. Keep
    /// it under the load balancer's probe timeout, so the probe gets the JSON reason rather
    /// than a timeout.
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Refuses to expose the admin routes without a token: `Err` when `addr` is not a loopback
    /// address and no [`ApiOptions::admin_token`] is set. [`serve_with`](super::serve_with) checks its listener;
    /// an app mounting [`router_with`](super::router_with) on its own listener should call this.
    ///
    /// # Errors
    /// [`std::io::ErrorKind::PermissionDenied`] naming the address and how to set a token.
    pub fn check_listen(&self, addr: SocketAddr) -> std::io::Result<()> {
        if self.admin_token.is_some() || addr.ip().is_loopback() {
            return Ok(());
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "refusing to serve the admin routes (load, restock, status, audit) on {addr}, \
                 which is not a loopback address, without an admin token: set serve.admin_token \
                 (SHARDSTOCK_SERVE__ADMIN_TOKEN) or listen on 127.0.0.1"
            ),
        ))
    }
}
