//! The engine behind an HTTP/JSON API (axum), as a library module (cargo feature `http`, on by
//! default): mount [`router`] in your own axum app, or run the whole service with [`serve`].
//! `shardstock serve` is [`serve_with`] plus configuration, a metrics recorder and signals.
//!
//! Routes (see the README's "HTTP API" section for bodies and replies):
//! `PUT /skus/{sku}` load · `POST /skus/{sku}/restock` · `POST /skus/{sku}/deduct` ·
//! `GET /skus/{sku}` status · `GET /skus/{sku}/audit` · `POST /skus/{sku}/reservations` ·
//! `POST /reservations/{id}/confirm` · `POST /reservations/{id}/cancel` · `GET /healthz` ·
//! `GET /metrics` (when [`ApiOptions::metrics`] gives it something to render).
//!
//! Requests may carry their request id in an `Idempotency-Key` header instead of the body's
//! `request_id`. Errors are JSON `{"error": "...", "field": "..."?}` with the status
//! [`status`] gives the error's [`ErrorKind`](crate::error::ErrorKind): 400 invalid input
//! (naming the field), 404 unknown SKU or reservation, 409 conflicts (already loaded, request id
//! reused with other parameters, sealed request id), 422 a request the configured strategy cannot
//! serve, 503 with `Retry-After` for failures a retry with the same request id may get past
//! (Redis, lost lock lease, SKU mid-reload). Business outcomes (sold out, limit reached, ...) are
//! 200 with an `outcome`.
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
mod routes;

pub use error::{ApiError, status};

use crate::{Engine, Store};
use axum::Router;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Renders the metrics exposition for `GET /metrics` (Prometheus text format).
type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// How the API is set up beyond its routes. `Default`: no `/metrics` route content (it answers
/// 404), the reservation sweeper every second under [`serve_with`].
#[derive(Clone)]
#[non_exhaustive]
pub struct ApiOptions {
    metrics: Option<Render>,
    sweep_every: Option<Duration>,
}

impl Default for ApiOptions {
    fn default() -> Self {
        Self {
            metrics: None,
            sweep_every: Some(Duration::from_secs(1)),
        }
    }
}

impl std::fmt::Debug for ApiOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiOptions")
            .field("metrics", &self.metrics.is_some())
            .field("sweep_every", &self.sweep_every)
            .finish()
    }
}

impl ApiOptions {
    /// `GET /metrics` answers `render()` as Prometheus text. The library never installs a
    /// metrics recorder (see [`crate::metrics`]); whoever installs one passes its renderer here,
    /// e.g. `move || handle.render()` for a `metrics-exporter-prometheus` handle.
    pub fn metrics(mut self, render: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.metrics = Some(Arc::new(render));
        self
    }

    /// How often [`serve_with`] runs the reservation sweeper, which returns the units of expired
    /// reservations ([`Engine::start_sweeper`]); `None` runs none (sweep elsewhere, e.g. in
    /// one instance of many). Default: every second. [`router`] never starts one: an app that
    /// mounts the routes owns its sweeper.
    pub fn sweep_every(mut self, every: Option<Duration>) -> Self {
        self.sweep_every = every;
        self
    }
}

/// The API's routes over `engine`, to mount in an axum app (`Router::merge` or `nest`).
/// Unknown paths answer a JSON 404.
pub fn router<S: Store>(engine: Engine<S>) -> Router {
    router_with(engine, &ApiOptions::default())
}

/// [`router`] with options (the `/metrics` renderer).
pub fn router_with<S: Store>(engine: Engine<S>, options: &ApiOptions) -> Router {
    routes::router(engine, options.metrics.clone())
}

/// Serves the API on `listener` until `shutdown` completes, then stops accepting connections and
/// returns once in-flight requests have finished. Runs the reservation sweeper meanwhile.
///
/// # Errors
/// An I/O error of the listener.
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
/// An I/O error of the listener.
pub async fn serve_with<S: Store>(
    listener: tokio::net::TcpListener,
    engine: Engine<S>,
    options: ApiOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
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
