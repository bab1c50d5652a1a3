//! The routes and their handlers: path, headers and body in, engine call, JSON out.

use super::body::{Body, need_request_id, request_id};
use super::{ApiError, ApiOptions, Render, Token};
use crate::{
    Deduct, Deduction, Engine, Error, LoadOptions, RequestId, ReservationEnd, ReservationId,
    Reserved, Sku, Store, UserId,
};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::Serialize;
use serde_json::json;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What the handlers share: the engine and the per-call timeout.
struct Api<S: Store> {
    engine: Engine<S>,
    timeout: Option<Duration>,
}

impl<S: Store> Clone for Api<S> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            timeout: self.timeout,
        }
    }
}

impl<S: Store> Api<S> {
    /// Runs an engine call, dropping it after the timeout: the reply then names `id` (what to
    /// retry with). Dropping is safe: the engine's calls are cancellation-safe (README, "What
    /// is atomic"), and a retry with the same request id is exactly-once.
    async fn call<T>(
        &self,
        id: Option<(&'static str, &str)>,
        call: impl Future<Output = T>,
    ) -> Result<T, ApiError> {
        match self.timeout {
            None => Ok(call.await),
            Some(after) => match tokio::time::timeout(after, call).await {
                Ok(r) => Ok(r),
                Err(_) => {
                    tracing::warn!(
                        ?id,
                        ?after,
                        "request timed out; its engine call was dropped"
                    );
                    Err(ApiError::timed_out(after, id))
                }
            },
        }
    }
}

/// The API's routes over `engine` with `options` (metrics, tokens, body limit, timeout).
pub(super) fn router<S: Store>(engine: Engine<S>, options: &ApiOptions) -> Router {
    let metrics = options.metrics.clone();
    let admin = guarded(
        Router::new()
            .route("/skus/{sku}", put(load::<S>).get(status::<S>))
            .route("/skus/{sku}/restock", post(restock::<S>))
            .route("/skus/{sku}/audit", get(audit::<S>)),
        options.admin_token.clone(),
        "admin",
    );
    let buyer = guarded(
        Router::new()
            .route("/skus/{sku}/deduct", post(deduct::<S>))
            .route("/skus/{sku}/reservations", post(reserve::<S>))
            .route("/reservations/{id}/confirm", post(confirm::<S>))
            .route("/reservations/{id}/cancel", post(cancel::<S>)),
        options.buyer_token.clone(),
        "buyer",
    );
    Router::new()
        .route("/healthz", get(healthz::<S>))
        .route("/metrics", get(move || render_metrics(metrics)))
        .merge(admin)
        .merge(buyer)
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "no such route", None).into_response()
        })
        .layer(DefaultBodyLimit::max(options.body_limit))
        .layer(middleware::map_response(json_errors))
        .with_state(Api {
            engine,
            timeout: options.request_timeout,
        })
}

/// `routes` behind `Authorization: Bearer <token>` when there is a token.
fn guarded<S: Store>(
    routes: Router<Api<S>>,
    token: Option<Token>,
    role: &'static str,
) -> Router<Api<S>> {
    match token {
        None => routes,
        Some(token) => routes.route_layer(middleware::from_fn(move |req: Request, next: Next| {
            let token = token.clone();
            async move {
                match bearer(req.headers(), &token, role) {
                    Ok(()) => next.run(req).await,
                    Err(e) => e.into_response(),
                }
            }
        })),
    }
}

/// Checks the `Authorization` header against `token`.
fn bearer(headers: &HeaderMap, token: &Token, role: &str) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(ApiError::unauthorized(
            format!("missing Authorization header: this route needs `Bearer <{role} token>`"),
            false,
        ));
    };
    let value = value.as_bytes();
    let scheme = b"bearer ";
    if value.len() <= scheme.len() || !value[..scheme.len()].eq_ignore_ascii_case(scheme) {
        return Err(ApiError::unauthorized(
            format!("invalid Authorization: expected `Bearer <{role} token>`"),
            false,
        ));
    }
    let given = value[scheme.len()..].trim_ascii();
    if token.matches(given) {
        Ok(())
    } else {
        Err(ApiError::unauthorized(
            format!("invalid Authorization: not the {role} token"),
            true,
        ))
    }
}

/// Replies axum makes itself (a body over the limit, a path that does not decode, a method the
/// route lacks) in the API's JSON error shape, naming what was wrong.
async fn json_errors(r: Response) -> Response {
    let status = r.status();
    let is_json = r
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return r;
    }
    let (parts, body) = r.into_parts();
    let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let field = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "body",
        StatusCode::METHOD_NOT_ALLOWED => "method",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "Content-Type",
        _ => "path",
    };
    let mut a = ApiError::new(
        status,
        format!("invalid {field}: {}", text.trim()),
        Some(field),
    )
    .into_response();
    // Keep what axum said besides the body (e.g. `Allow` on a 405).
    for (k, v) in parts.headers.iter() {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            a.headers_mut().insert(k.clone(), v.clone());
        }
    }
    a
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

async fn healthz<S: Store>(State(api): State<Api<S>>) -> ApiResult {
    ok(
        StatusCode::OK,
        &json!({
            "status": "ok",
            "store": api.engine.store().name(),
            "strategy": api.engine.store().strategy().name(),
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
    State(api): State<Api<S>>,
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
        .unwrap_or(api.engine.options().per_user_limit);
    let replace = body.bool("replace")?.unwrap_or(false);
    let outbox = body.bool("outbox")?.unwrap_or(api.engine.options().outbox);
    let options = LoadOptions::new(segments)
        .replace(replace)
        .per_user_limit(limit)
        .outbox(outbox);
    let loading = api.engine.load(&sku, stock, options);
    let generation = api.call(Some(("sku", sku.as_str())), loading).await??;
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
    State(api): State<Api<S>>,
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
    let id = Some(("request_id", request_id.as_str()));
    let r = api
        .call(id, api.engine.restock(&sku, qty, &request_id))
        .await??;
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
    State(api): State<Api<S>>,
    Path(sku): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult {
    let body = Body::parse(&bytes, &["user", "qty", "request_id"])?;
    let req = purchase(&sku, &headers, &body)?;
    let id = Some(("request_id", req.request_id.as_str()));
    let d: Deduction = api.call(id, api.engine.deduct(&req)).await??;
    ok(StatusCode::OK, &d)
}

async fn status<S: Store>(State(api): State<Api<S>>, Path(sku): Path<String>) -> ApiResult {
    let sku = Sku::new(&sku)?;
    let r = api.call(None, api.engine.remaining(&sku)).await??;
    ok(
        StatusCode::OK,
        &json!({
            "sku": sku.as_str(),
            "remaining": r.total,
            "in_transit": r.in_transit,
            "segments": r.per_segment.len(),
            "per_segment": r.per_segment,
        }),
    )
}

async fn audit<S: Store>(State(api): State<Api<S>>, Path(sku): Path<String>) -> ApiResult {
    let sku = Sku::new(&sku)?;
    let a = api.call(None, api.engine.audit(&sku)).await??;
    ok(StatusCode::OK, &a)
}

async fn reserve<S: Store>(
    State(api): State<Api<S>>,
    Path(sku): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult {
    let body = Body::parse(&bytes, &["user", "qty", "request_id", "ttl_ms"])?;
    let req = purchase(&sku, &headers, &body)?;
    let ttl = Duration::from_millis(body.need_u64("ttl_ms")?);
    let id = Some(("request_id", req.request_id.as_str()));
    match api.call(id, api.engine.reserve(&req, ttl)).await? {
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

async fn confirm<S: Store>(State(api): State<Api<S>>, Path(id): Path<String>) -> ApiResult {
    let rid = id.parse::<ReservationId>()?;
    let r = api
        .call(Some(("reservation", &id)), api.engine.confirm(&rid))
        .await??;
    ended(id, r)
}

async fn cancel<S: Store>(State(api): State<Api<S>>, Path(id): Path<String>) -> ApiResult {
    let rid = id.parse::<ReservationId>()?;
    let r = api
        .call(Some(("reservation", &id)), api.engine.cancel(&rid))
        .await??;
    ended(id, r)
}
