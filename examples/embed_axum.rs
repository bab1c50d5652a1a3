//! Embedding the engine in your own axum service: the shardstock API under `/api` next to a
//! route of your own, its background tasks in one call, and `/api/metrics` rendered by the
//! Prometheus recorder your process installs (the library never installs one).
//!
//! Run: `cargo run --example embed_axum`, then `curl -X POST localhost:3000/buy/phone/u1/r1`
//! (your route; 10 units are loaded at start), `curl localhost:3000/api/skus/phone` (every
//! route of `shardstock serve`) and `curl localhost:3000/api/metrics`. Swap
//! `MemoryStore::new()` for a `RedisStore` to share stock between instances.

use axum::extract::{Path, State};
use axum::{Json, Router, routing::post};
use metrics_exporter_prometheus::PrometheusBuilder;
use shardstock::http::{ApiError, ApiOptions};
use shardstock::{BackgroundOptions, Deduct, Deduction, Engine, LoadOptions, MemoryStore, Sku};
use tokio::net::TcpListener;

type Shop = Engine<MemoryStore>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Your own route. Sold out, replayed, limit reached ... are values; errors answer as the
/// API's own routes do (`ApiError`: 400/404/409/422/503 + `Retry-After`).
async fn buy(
    State(engine): State<Shop>,
    Path((sku, user, request_id)): Path<(String, String, String)>,
) -> Result<Json<Deduction>, ApiError> {
    let req = Deduct::new(&sku, &user, 1, &request_id)?;
    Ok(Json(engine.deduct(&req).await?))
}

/// The service on `listener` until `shutdown` completes (in-flight requests finish first).
pub async fn service(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BoxError> {
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let engine = Engine::builder().build(MemoryStore::new())?;
    engine
        .load(&Sku::new("phone")?, 10, LoadOptions::new(2))
        .await?;
    // The reservation sweeper and the live audit; dropping the handle stops them.
    let _background = engine.start_background(BackgroundOptions::default());
    // Upkeep moves histogram samples into the exposition: here at each scrape.
    let api = ApiOptions::default().metrics(move || {
        prometheus.run_upkeep();
        prometheus.render()
    });
    let app = Router::new()
        .route("/buy/{sku}/{user}/{request_id}", post(buy))
        .with_state(engine.clone())
        .nest("/api", shardstock::http::router_with(engine, &api));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    service(listener, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}
