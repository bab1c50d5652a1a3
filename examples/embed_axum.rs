//! Embedding the engine in your own axum service: one shared `Engine` in the router state,
//! business outcomes returned as JSON, errors mapped to status codes.
//!
//! Run: `cargo run --example embed_axum`, then
//! `curl -X POST localhost:3000/buy/phone/u1/r1` (10 units are loaded at start).
//! Swap `MemoryStore::new()` for `RedisStore::connect(url, 4, "shop").await?` to share stock
//! between instances.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use shardstock::{Deduct, Deduction, Engine, Error, MemoryStore, Sku};

type Shop = Engine<MemoryStore>;

async fn buy(
    State(engine): State<Shop>,
    Path((sku, user, request_id)): Path<(String, String, String)>,
) -> Result<Json<Deduction>, (StatusCode, String)> {
    let req = Deduct::new(&sku, &user, 1, &request_id).map_err(reject)?;
    // Sold out, replayed, limit reached ... are values, not errors.
    engine.deduct(&req).await.map(Json).map_err(reject)
}

fn reject(e: Error) -> (StatusCode, String) {
    let status = match e {
        Error::InvalidInput { .. } => StatusCode::BAD_REQUEST,
        Error::NotLoaded(_) => StatusCode::NOT_FOUND,
        Error::RequestIdConflict { .. } => StatusCode::CONFLICT,
        // Redis trouble: the outcome is unknown, a retry with the same request id is safe.
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, e.to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::builder().build(MemoryStore::new())?;
    engine
        .load(&Sku::new("phone")?, 10, shardstock::LoadOptions::new(2))
        .await?;
    let _sweeper = engine.start_sweeper(std::time::Duration::from_secs(1));
    let app = Router::new()
        .route("/buy/{sku}/{user}/{request_id}", post(buy))
        .with_state(engine);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
