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
mod options;
mod routes;

pub use error::{ApiError, ErrorCode, json_errors, status};
pub use json::Json;
pub use options::{ApiOptions, DEFAULT_BODY_LIMIT, DEFAULT_READY_TIMEOUT, DEFAULT_REQUEST_TIMEOUT};

use crate::engine::EngineOptions;
use crate::{Engine, Store};
use axum::Router;
use std::future::Future;

/// The API's routes over `engine`, to mount in an axum app (`Router::merge` or `nest`).
/// Unknown paths answer a JSON 404, other methods on a route a JSON 405.
pub fn router<S: Store>(engine: Engine<S>) -> Router {
    router_with(engine, &ApiOptions::default())
}

/// [`router`] with options (the `/metrics` renderer, tokens, body limit, request timeout).
pub fn router_with<S: Store>(engine: Engine<S>, options: &ApiOptions) -> Router {
    let document = openapi::document(engine.options(), options).into();
    routes::router(engine, options, document)
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
