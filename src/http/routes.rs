//! The routes and their handlers: path, headers and body in, engine call, JSON out.

use super::body::{Body, need_request_id, request_id};
use super::{ApiError, Render};
use crate::{
    Deduct, Deduction, Engine, Error, LoadOptions, RequestId, ReservationEnd, ReservationId,
    Reserved, Sku, Store, UserId,
};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::Serialize;
use serde_json::json;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The API's routes over `engine`; `GET /metrics` renders `metrics` when given.
pub(super) fn router<S: Store>(engine: Engine<S>, metrics: Option<Render>) -> Router {
    Router::new()
        .route("/healthz", get(healthz::<S>))
        .route("/metrics", get(move || render_metrics(metrics)))
        .route("/skus/{sku}", put(load::<S>).get(status::<S>))
        .route("/skus/{sku}/restock", post(restock::<S>))
        .route("/skus/{sku}/deduct", post(deduct::<S>))
        .route("/skus/{sku}/audit", get(audit::<S>))
        .route("/skus/{sku}/reservations", post(reserve::<S>))
        .route("/reservations/{id}/confirm", post(confirm::<S>))
        .route("/reservations/{id}/cancel", post(cancel::<S>))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "no such route", None).into_response()
        })
        .with_state(engine)
}

type ApiResult = Result<Response, ApiError>;

fn ok<T: Serialize>(status: StatusCode, value: &T) -> ApiResult {
    Ok((status, axum::Json(value)).into_response())
}

/// A request id no other process or call makes: `<prefix>-<process id>-<nanoseconds>`.
fn fresh_request_id(prefix: &str) -> Result<RequestId, Error> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    RequestId::new(format!("{prefix}-{}-{nanos}", std::process::id()))
}

async fn healthz<S: Store>(State(engine): State<Engine<S>>) -> ApiResult {
    ok(
        StatusCode::OK,
        &json!({
            "status": "ok",
            "store": engine.store().name(),
            "strategy": engine.store().strategy().name(),
        }),
    )
}

async fn render_metrics(metrics: Option<Render>) -> Response {
    match metrics {
        Some(render) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            render(),
        )
            .into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "metrics recorder not installed",
            None,
        )
        .into_response(),
    }
}

async fn load<S: Store>(
    State(engine): State<Engine<S>>,
    Path(sku): Path<String>,
    bytes: Bytes,
) -> ApiResult {
    let body = Body::parse(
        &bytes,
        &["stock", "segments", "per_user_limit", "replace", "outbox"],
    )?;
    let sku = Sku::new(&sku)?;
    let stock = body.need_u64("stock")?;
    let segments = u32::try_from(body.need_u64("segments")?)
        .map_err(|_| ApiError::bad("segments", "too large"))?;
    let limit = body
        .u64("per_user_limit")?
        .unwrap_or(engine.options().per_user_limit);
    let replace = body.bool("replace")?.unwrap_or(false);
    let outbox = body.bool("outbox")?.unwrap_or(engine.options().outbox);
    let generation = engine
        .load(
            &sku,
            stock,
            LoadOptions::new(segments)
                .replace(replace)
                .per_user_limit(limit)
                .outbox(outbox),
        )
        .await?;
    ok(
        StatusCode::CREATED,
        &json!({
            "sku": sku.as_str(),
            "generation": generation,
            "stock": stock,
            "segments": segments,
            "per_user_limit": limit,
            "outbox": outbox,
        }),
    )
}

async fn restock<S: Store>(
    State(engine): State<Engine<S>>,
    Path(sku): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult {
    let body = Body::parse(&bytes, &["qty", "request_id"])?;
    let sku = Sku::new(&sku)?;
    let qty = body.need_u64("qty")?;
    let request_id = match request_id(&headers, &body)? {
        Some(r) => RequestId::new(r)?,
        None => fresh_request_id("restock")?,
    };
    let r = engine.restock(&sku, qty, &request_id).await?;
    ok(
        StatusCode::OK,
        &json!({
            "sku": sku.as_str(),
            "request_id": request_id.as_str(),
            "qty": qty,
            "added": r.added,
            "replayed": r.replayed,
        }),
    )
}

/// A deduct or reserve request from the path, headers and body.
fn purchase(sku: &str, headers: &HeaderMap, body: &Body) -> Result<Deduct, ApiError> {
    let sku = Sku::new(sku)?;
    let user = UserId::new(body.need_str("user")?)?;
    let qty = body.u64("qty")?.unwrap_or(1);
    let request_id = need_request_id(headers, body)?;
    Ok(Deduct {
        sku,
        user,
        qty,
        request_id,
    })
}

async fn deduct<S: Store>(
    State(engine): State<Engine<S>>,
    Path(sku): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult {
    let body = Body::parse(&bytes, &["user", "qty", "request_id"])?;
    let req = purchase(&sku, &headers, &body)?;
    let d: Deduction = engine.deduct(&req).await?;
    ok(StatusCode::OK, &d)
}

async fn status<S: Store>(State(engine): State<Engine<S>>, Path(sku): Path<String>) -> ApiResult {
    let sku = Sku::new(&sku)?;
    let r = engine.remaining(&sku).await?;
    ok(
        StatusCode::OK,
        &json!({
            "sku": sku.as_str(),
            "remaining": r.total,
            "segments": r.per_segment.len(),
            "per_segment": r.per_segment,
        }),
    )
}

async fn audit<S: Store>(State(engine): State<Engine<S>>, Path(sku): Path<String>) -> ApiResult {
    let sku = Sku::new(&sku)?;
    let a = engine.audit(&sku).await?;
    ok(StatusCode::OK, &a)
}

async fn reserve<S: Store>(
    State(engine): State<Engine<S>>,
    Path(sku): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult {
    let body = Body::parse(&bytes, &["user", "qty", "request_id", "ttl_ms"])?;
    let req = purchase(&sku, &headers, &body)?;
    let ttl = Duration::from_millis(body.need_u64("ttl_ms")?);
    match engine.reserve(&req, ttl).await {
        Ok(Reserved::Held { id, parts }) => ok(
            StatusCode::CREATED,
            &json!({ "outcome": "held", "id": id, "parts": parts }),
        ),
        Ok(Reserved::Replayed { id, parts }) => ok(
            StatusCode::OK,
            &json!({ "outcome": "replayed", "id": id, "parts": parts }),
        ),
        Ok(Reserved::NotHeld(d)) => ok(
            StatusCode::OK,
            &json!({ "outcome": "not_held", "reason": d.kind(), "deduction": d }),
        ),
        // `ttl` is the body's `ttl_ms`.
        Err(Error::InvalidInput {
            field: "ttl",
            reason,
        }) => Err(ApiError::bad("ttl_ms", reason)),
        Err(e) => Err(e.into()),
    }
}

/// The reply to a confirm or cancel of reservation `id`: 404 when there is no such reservation.
fn ended(id: String, r: ReservationEnd) -> ApiResult {
    if r.state.is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no reservation {id:?}"),
            Some("reservation"),
        ));
    }
    ok(
        StatusCode::OK,
        &json!({ "id": id, "state": r.state, "done": r.done }),
    )
}

async fn confirm<S: Store>(State(engine): State<Engine<S>>, Path(id): Path<String>) -> ApiResult {
    let r = engine.confirm(&id.parse::<ReservationId>()?).await?;
    ended(id, r)
}

async fn cancel<S: Store>(State(engine): State<Engine<S>>, Path(id): Path<String>) -> ApiResult {
    let r = engine.cancel(&id.parse::<ReservationId>()?).await?;
    ended(id, r)
}
