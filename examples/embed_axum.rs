//! Embedding the engine in your own axum service: the shardstock API under `/api` next to a
//! route of your own, its background tasks in one call, `/api/metrics` rendered by the
//! Prometheus recorder your process installs (the library never installs one), a log
//! subscriber, and a graceful stop on SIGTERM or ctrl-c.
//!
//! Dependencies (the versions this repository's Cargo.lock resolves): `axum = "0.8"` (0.8.9),
//! `tokio = { version = "1", features = ["full"] }` (1.54), `metrics-exporter-prometheus = {
//! version = "0.18", default-features = false }` (0.18.3), `tracing-subscriber = { version =
//! "0.3", features = ["env-filter"] }` (0.3.23), `serde = { version = "1", features =
//! ["derive"] }`.
//!
//! Run: `cargo run --example embed_axum` (the embedded store; `REDIS_URL=redis://127.0.0.1:6379`
//! for Redis, shared by every instance; `LISTEN=ADDR`, default 127.0.0.1:3000; `RUST_LOG`,
//! default `info`), then `curl -X POST localhost:3000/buy/phone -H 'content-type:
//! application/json' -d '{"user":"u1","request_id":"r1"}'` (your route; 10 units are loaded at
//! start), `curl localhost:3000/api/skus/phone` (every route of `shardstock serve`),
//! `curl localhost:3000/api/readyz` and `curl localhost:3000/api/metrics`.

use axum::extract::{Path, State};
use axum::{Router, routing::post};
use metrics_exporter_prometheus::PrometheusBuilder;
use shardstock::http::{ApiError, ApiOptions, Json};
use shardstock::{
    BackgroundOptions, Deduct, Deduction, Engine, Error, LoadOptions, MemoryStore, RedisStore, Sku,
    Store,
};
use std::future::Future;
use tokio::net::TcpListener;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of your route, read with `shardstock::http::Json`: a body that is not JSON, not
/// this shape or not sent as `application/json` answers 400 / 415 in the API's error shape.
#[derive(serde::Deserialize)]
struct Order {
    user: String,
    request_id: String,
}

/// Your own route. Sold out, replayed, limit reached ... are values; errors answer as the
/// API's own routes do (`ApiError`: 400/404/409/422/503 + `Retry-After`).
async fn buy<S: Store>(
    State(engine): State<Engine<S>>,
    Path(sku): Path<String>,
    Json(order): Json<Order>,
) -> Result<Json<Deduction>, ApiError> {
    let req = Deduct::new(&sku, &order.user, 1, &order.request_id)?;
    Ok(Json(engine.deduct(&req).await?))
}

/// The service over `engine` on `listener` until `shutdown` completes (in-flight requests
/// finish first).
pub async fn service<S: Store>(
    engine: Engine<S>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BoxError> {
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    // The stock to sell, unless another instance (or an earlier run, on Redis) loaded it.
    match engine
        .load(&Sku::new("phone")?, 10, LoadOptions::new(2))
        .await
    {
        Ok(_) | Err(Error::AlreadyLoaded { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    // The reservation sweeper and the live audit; dropping the handle stops them.
    let _background = engine.start_background(BackgroundOptions::default());
    // Upkeep moves histogram samples into the exposition: here at each scrape.
    let api = ApiOptions::default().metrics(move || {
        prometheus.run_upkeep();
        prometheus.render()
    });
    let app = Router::new()
        .route("/buy/{sku}", post(buy::<S>))
        .with_state(engine.clone())
        // axum's own refusals on your routes (405, a path that does not decode) as JSON too.
        .layer(axum::middleware::map_response(
            shardstock::http::json_errors,
        ))
        // `/api/healthz` (liveness) and `/api/readyz` (readiness) come with the routes.
        .nest("/api", shardstock::http::router_with(engine, &api));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    tracing::info!("stopped");
    Ok(())
}

/// Completes on SIGTERM (what systemd, Docker and Kubernetes send to stop a service) or
/// ctrl-c. The SIGTERM handler is installed now, before anything is served.
fn stop_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    Ok(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => tracing::info!("ctrl-c: stopping"),
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// `pub`: `tests/embed_example.rs` runs it, in a process of its own.
#[tokio::main]
pub async fn main() -> Result<(), BoxError> {
    // The library logs through `tracing` (a Redis outage: failing sweeps, requests answered
    // 503, readiness changes); without a subscriber those lines go nowhere.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let stop = stop_signal()?;
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_string());
    let listener = TcpListener::bind(&listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            let store = RedisStore::builder(url).connect().await?;
            service(Engine::builder().build(store)?, listener, stop).await
        }
        Err(_) => service(Engine::builder().build(MemoryStore::new())?, listener, stop).await,
    }
}
