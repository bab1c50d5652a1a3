//! Embedding the engine in your own axum service: the whole shardstock API mounted under
//! `/api` next to a route of your own, one shared `Engine`, your own shutdown signal.
//!
//! Run: `cargo run --example embed_axum`, then
//! `curl -X POST localhost:3000/buy/phone/u1/r1` (your route; 10 units are loaded at start) or
//! `curl localhost:3000/api/skus/phone` (the mounted API; every route of `shardstock serve`).
//! Swap `MemoryStore::new()` for a `RedisStore` to share stock between instances.

use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use shardstock::http::ApiError;
use shardstock::{Deduct, Deduction, Engine, LoadOptions, MemoryStore, Sku};

type Shop = Engine<MemoryStore>;

/// Your own route. Sold out, replayed, limit reached ... are values, not errors; errors become
/// the same replies as the API's own routes (`ApiError`: 400/404/409/422/503 + `Retry-After`).
async fn buy(
    State(engine): State<Shop>,
    Path((sku, user, request_id)): Path<(String, String, String)>,
) -> Result<Json<Deduction>, ApiError> {
    let req = Deduct::new(&sku, &user, 1, &request_id)?;
    Ok(Json(engine.deduct(&req).await?))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::builder().build(MemoryStore::new())?;
    engine
        .load(&Sku::new("phone")?, 10, LoadOptions::new(2))
        .await?;
    // The mounted router starts no background task: the app owns its reservation sweeper.
    let _sweeper = engine.start_sweeper(std::time::Duration::from_secs(1));
    let app = Router::new()
        .route("/buy/{sku}/{user}/{request_id}", post(buy))
        .with_state(engine.clone())
        .nest("/api", shardstock::http::router(engine));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    // Your shutdown signal: in-flight requests finish, then `serve` returns.
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
