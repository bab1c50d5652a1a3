//! The engine behind an HTTP/JSON API (axum), as a library module (cargo feature `http`, on by
//! default): mount [`router`] in your own axum app, or run the whole service with [`serve`].
//! `shardstock serve` is [`serve_with`] plus configuration, a metrics recorder and signals.
//!
//! Routes (docs/http.md has the bodies and replies; `GET /openapi.json` the contract):
//! `PUT /skus/{sku}` load · `POST /skus/{sku}/restock` · `POST /skus/{sku}/deduct` ·
//! `GET /skus/{sku}` status · `GET /skus/{sku}/audit` · `POST /skus/{sku}/reservations` ·
//! `POST /reservations/{id}/confirm` · `POST /reservations/{id}/cancel` · `POST /orders` ·
//! `GET /orders/{order_id}` · `POST /orders/{order_id}/confirm` ·
//! `POST /orders/{order_id}/cancel` (carts: [`crate::cart`]) · `GET /healthz`
//! (liveness: the process answers; the store is not asked) · `GET /readyz` (readiness:
//! [`Engine::readiness`] within [`ApiOptions::ready_timeout`]; 200 `ready` or `degraded`, 503
//! `unavailable` when the store does not answer) · `GET /openapi.json` · `GET /metrics` (when
//! [`ApiOptions::metrics`] gives it something to render: the library never installs a metrics
//! recorder; the service passes the renderer of the one it installed, e.g. a
//! `metrics-exporter-prometheus` handle, as `examples/embed_axum.rs` shows).
//!
//! **Tokens, limits, timeouts** ([`ApiOptions`]). The admin routes (load, status, restock,
//! audit) require `Authorization: Bearer <admin token>` when [`ApiOptions::admin_token`] is set,
//! the buyer routes (deduct, reservations, orders, confirm, cancel) `Bearer <buyer token>` when
//! [`ApiOptions::buyer_token`] is set; `/healthz`, `/readyz` and `/metrics` stay open. A
//! missing or wrong token answers 401 with `WWW-Authenticate: Bearer` (tokens compared in
//! constant time).
//! [`serve_with`] refuses a listener on a non-loopback address without an admin token
//! ([`ApiOptions::check_listen`]). Bodies above [`ApiOptions::body_limit`] (16 KiB) answer 413.
//! An engine call that has not answered after [`ApiOptions::request_timeout`] (10 s) is dropped
//! and answers 503 + `Retry-After` naming the request id. Why this is safe: dropping an engine
//! call is cancellation-safe (docs/design.md, "What is atomic": each Redis step is one script that ran
//! whole or not at all, a dropped transfer leaves units in transit that the sweeper credits, a
//! dropped load leaves the SKU "not ready" until the load is retried), and the request id makes
//! the retry exactly-once: the client retries with the same id and gets the one outcome.
//!
//! A write's request id is the body's `request_id` (the one carrier the OpenAPI document
//! declares); an `Idempotency-Key` header may carry it instead (the same id when both are
//! sent). A body must be sent as `Content-Type: application/json` (a charset, if given,
//! `utf-8`); another type answers 415. Errors are JSON `{"error": "...", "code": "...",
//! "field": "..."?}`: `code` is an [`ErrorCode`], stable and machine-readable (an engine
//! error's code is its [`ErrorKind`](crate::error::ErrorKind)'s name), and the status is the
//! code's: 400 invalid input (naming the field), 401, 404 unknown SKU, reservation, order or route,
//! 405 a method the route lacks (naming the ones it has), 409 conflicts (already loaded, request
//! id reused with other parameters), 413, 415, 422 a request the configured strategy cannot
//! serve, 503 with `Retry-After` for failures a retry with the same request id may get past
//! (Redis, lost lock lease, SKU mid-reload, the request timeout). Business outcomes (sold out,
//! limit reached, ...) are 200 with an `outcome`. Your own routes answer the same way when they
//! take bodies with [`Json`] and return [`ApiError`].
//!
//! `GET /openapi.json` serves the OpenAPI 3.1 document of the API as the server runs it
//! ([`openapi`]: its bounds, its tokens); `docs/openapi.json` is the one of `shardstock serve`
//! with default options and both tokens set.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use shardstock::{Engine, MemoryStore};
//! let engine = Engine::builder().build(MemoryStore::new())?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! let shutdown = async {
//!     let _ = tokio::signal::ctrl_c().await;
//! };
//! shardstock::http::serve(listener, engine, shutdown).await?;
//! # Ok(())
//! # }
//! ```

mod body;
mod error;
mod json;
mod messages;
mod meter;
mod openapi;
mod routes;

pub use error::{ApiError, ErrorCode, json_errors, status};
pub use json::Json;

use crate::engine::EngineOptions;
use crate::{Engine, Store};
use axum::Router;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Renders the metrics exposition for `GET /metrics` (Prometheus text format).
type Render = Arc<dyn Fn() -> String + Send + Sync>;

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
/// 404), the reservation sweeper every second under [`serve_with`], no tokens (loopback
/// listeners only, see [`ApiOptions::check_listen`]), bodies up to [`DEFAULT_BODY_LIMIT`],
/// engine calls cut after [`DEFAULT_REQUEST_TIMEOUT`], readiness looks bounded by
/// [`DEFAULT_READY_TIMEOUT`].
#[derive(Clone)]
#[non_exhaustive]
pub struct ApiOptions {
    metrics: Option<Render>,
    sweep_every: Option<Duration>,
    admin_token: Option<Token>,
    buyer_token: Option<Token>,
    body_limit: usize,
    request_timeout: Option<Duration>,
    ready_timeout: Duration,
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

    /// How often [`serve_with`] runs the reservation sweeper, which returns the units of expired
    /// reservations ([`Engine::start_sweeper`]); `None` runs none (sweep elsewhere, e.g. in
    /// one instance of many). Default: every second. [`router`] never starts one: an app that
    /// mounts the routes starts it with [`Engine::start_background`].
    pub fn sweep_every(mut self, every: Option<Duration>) -> Self {
        self.sweep_every = every;
        self
    }

    /// The admin routes (`PUT /skus/{sku}` load, `GET /skus/{sku}` status, `POST
    /// /skus/{sku}/restock`, `GET /skus/{sku}/audit`) require `Authorization: Bearer <token>`.
    /// An empty token means none: the admin routes are then open, which [`serve_with`] allows
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

    /// How long `GET /readyz` waits for the store ([`Engine::readiness`]): a server that has
    /// not answered by then counts as unreachable, and a store none of whose servers answered
    /// makes it 503. Default [`DEFAULT_READY_TIMEOUT`] (1 s); below 1 ms counts as 1 ms. Keep
    /// it under the load balancer's probe timeout, so the probe gets the JSON reason rather
    /// than a timeout.
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Refuses to expose the admin routes without a token: `Err` when `addr` is not a loopback
    /// address and no [`ApiOptions::admin_token`] is set. [`serve_with`] checks its listener;
    /// an app mounting [`router_with`] on its own listener should call this.
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

/// The API's routes over `engine`, to mount in an axum app (`Router::merge` or `nest`).
/// Unknown paths answer a JSON 404, other methods on a route a JSON 405.
pub fn router<S: Store>(engine: Engine<S>) -> Router {
    router_with(engine, &ApiOptions::default())
}

/// [`router`] with options (the `/metrics` renderer, tokens, body limit, request timeout).
pub fn router_with<S: Store>(engine: Engine<S>, options: &ApiOptions) -> Router {
    routes::router(engine, options)
}

/// The OpenAPI 3.1 document (JSON text) of the API over an engine with `engine` options served
/// with `options`: what [`router_with`] serves at `GET /openapi.json`. The bounds that depend on
/// the engine (`qty` up to [`EngineOptions::max_qty`], `ttl_ms` up to
/// [`EngineOptions::request_ttl`]) and the bearer tokens are this server's.
pub fn openapi(engine: &EngineOptions, options: &ApiOptions) -> String {
    openapi::document(engine, options)
}

/// Serves the API on `listener` until `shutdown` completes, then stops accepting connections and
/// returns once in-flight requests have finished. Runs the reservation sweeper meanwhile.
///
/// # Errors
/// An I/O error of the listener; [`ApiOptions::check_listen`]'s refusal.
pub async fn serve<S: Store>(
    listener: tokio::net::TcpListener,
    engine: Engine<S>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, engine, ApiOptions::default(), shutdown).await
}

/// [`serve`] with options.
///
/// # Errors
/// An I/O error of the listener; [`ApiOptions::check_listen`]'s refusal of a non-loopback
/// listener without an admin token (before serving anything).
pub async fn serve_with<S: Store>(
    listener: tokio::net::TcpListener,
    engine: Engine<S>,
    options: ApiOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    options.check_listen(listener.local_addr()?)?;
    let sweeper = options.sweep_every.map(|every| engine.start_sweeper(every));
    let app = router_with(engine, &options);
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    if let Some(sweeper) = sweeper {
        sweeper.stop();
    }
    served
}
