//! `shardstock serve`: the engine behind an HTTP/JSON API (axum).
//!
//! Routes (see the README's "HTTP API" section for bodies and replies):
//! `PUT /skus/{sku}` load · `POST /skus/{sku}/restock` · `POST /skus/{sku}/deduct` ·
//! `GET /skus/{sku}` status · `GET /skus/{sku}/audit` · `POST /skus/{sku}/reservations` ·
//! `POST /reservations/{id}/confirm` · `POST /reservations/{id}/cancel` · `GET /healthz` ·
//! `GET /metrics`.
//!
//! Errors are JSON `{"error": "...", "field": "..."?}`: 400 invalid input (naming the field),
//! 404 unknown SKU or reservation, 409 conflicts (already loaded, request id reused with other
//! parameters, sealed request id), 422 a request the configured strategy cannot serve, 503
//! with `Retry-After` for infrastructure failures (Redis, lost lock lease, SKU mid-reload).
//! Business outcomes (sold out, limit reached, ...) are 200 with an `outcome`.

use crate::{Failure, unique_stem};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use clap::Args;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;
use serde_json::{Map, Value, json};
use shardstock::{Deduct, Deduction, Engine, Error, RequestId, Reserved, Sku, Store};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

/// Arguments of `serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on (port 0: any free port; the bound address is printed on stdout
    /// as `listening on http://ADDR`).
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:8080",
        env = "SHARDSTOCK_LISTEN"
    )]
    listen: SocketAddr,
    /// How often the sweeper returns expired reservations, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    sweep_ms: u64,
}

/// The recorder's handle, rendered by `GET /metrics`.
static METRICS: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the metrics recorder for `serve` (before the engine is built): `/metrics` on the
/// API address always, and on `--metrics-addr` too when given.
pub(crate) async fn install_metrics(
    metrics_addr: Option<SocketAddr>,
    strategy: shardstock::Strategy,
) -> Result<(), Failure> {
    let handle = crate::exporter::install_handle(strategy)?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    if let Some(addr) = metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Failure::new(format!("cannot serve metrics on {addr}: {e}")))?;
        let app = Router::new().fallback(metrics);
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "metrics listener stopped");
            }
        });
    }
    let _ = METRICS.set(handle);
    Ok(())
}

/// Runs the service until SIGTERM or ctrl-c; in-flight requests finish first.
pub(crate) async fn run_serve<S: Store>(
    engine: Engine<S>,
    a: ServeArgs,
) -> Result<ExitCode, Failure> {
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .map_err(|e| Failure::new(format!("cannot listen on {}: {e}", a.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::new(format!("cannot listen on {}: {e}", a.listen)))?;
    let sweeper = engine.start_sweeper(Duration::from_millis(a.sweep_ms.max(1)));
    let app = router(engine);
    println!("listening on http://{addr}");
    tracing::info!(%addr, "serving");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| Failure::new(format!("server error: {e}")))?;
    sweeper.stop();
    eprintln!("shardstock serve: shut down");
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// The API's routes over `engine`.
pub(crate) fn router<S: Store>(engine: Engine<S>) -> Router {
    Router::new()
        .route("/healthz", get(healthz::<S>))
        .route("/metrics", get(metrics))
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

/// An error reply: status, message, and the offending field when there is one.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    error: String,
    field: Option<String>,
    retry_after: bool,
}

impl ApiError {
    fn new(status: StatusCode, error: impl Into<String>, field: Option<&str>) -> Self {
        Self {
            status,
            error: error.into(),
            field: field.map(str::to_string),
            retry_after: false,
        }
    }

    fn bad(field: &str, error: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            format!("invalid {field}: {}", error.into()),
            Some(field),
        )
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let msg = e.to_string();
        let (status, field, retry) = match &e {
            Error::InvalidInput { field, .. } => (StatusCode::BAD_REQUEST, Some(*field), false),
            Error::NotLoaded(_) => (StatusCode::NOT_FOUND, Some("sku"), false),
            Error::AlreadyLoaded { .. } => (StatusCode::CONFLICT, Some("sku"), false),
            Error::RequestIdConflict { field, .. } => (StatusCode::CONFLICT, Some(*field), false),
            Error::Sealed(_) => (StatusCode::CONFLICT, Some("request_id"), false),
            Error::NotReady(_) | Error::LeaseLost(_) | Error::Redis(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, None, true)
            }
            Error::Config(_) => (StatusCode::UNPROCESSABLE_ENTITY, Some("strategy"), false),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, None, false),
        };
        if status.is_server_error() {
            tracing::warn!(error = %e, "request failed");
        }
        let mut a = ApiError::new(status, msg, field);
        a.retry_after = retry;
        a
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.error });
        if let Some(f) = self.field {
            body["field"] = Value::String(f);
        }
        let mut r = (self.status, axum::Json(body)).into_response();
        if self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

type ApiResult = Result<Response, ApiError>;

fn ok<T: Serialize>(status: StatusCode, value: &T) -> ApiResult {
    Ok((status, axum::Json(value)).into_response())
}

/// A JSON object body, read field by field so every complaint names its field.
struct Body(Map<String, Value>);

impl Body {
    /// Parses `bytes` as a JSON object (an empty body is `{}`), refusing unknown fields.
    fn parse(bytes: &Bytes, allowed: &[&str]) -> Result<Self, ApiError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(Map::new()));
        }
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad("body", format!("not JSON: {e}")))?;
        let Value::Object(m) = v else {
            return Err(ApiError::bad("body", "expected a JSON object"));
        };
        if let Some(k) = m.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(ApiError::bad(
                k,
                format!("unknown field; expected one of {}", allowed.join(", ")),
            ));
        }
        Ok(Self(m))
    }

    fn u64(&self, field: &str) -> Result<Option<u64>, ApiError> {
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| ApiError::bad(field, "expected a non-negative integer")),
        }
    }

    fn need_u64(&self, field: &str) -> Result<u64, ApiError> {
        self.u64(field)?
            .ok_or_else(|| ApiError::bad(field, "required"))
    }

    fn str(&self, field: &str) -> Result<Option<&str>, ApiError> {
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::bad(field, "expected a string")),
        }
    }

    fn need_str(&self, field: &str) -> Result<&str, ApiError> {
        self.str(field)?
            .ok_or_else(|| ApiError::bad(field, "required"))
    }

    fn bool(&self, field: &str) -> Result<Option<bool>, ApiError> {
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::bad(field, "expected true or false")),
        }
    }
}

/// The request id from the body or the `Idempotency-Key` header (both: they must agree).
fn request_id(headers: &HeaderMap, body: &Body) -> Result<Option<String>, ApiError> {
    let from_header = match headers.get("idempotency-key") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::bad("Idempotency-Key", "not visible ASCII"))?
                .to_string(),
        ),
    };
    let from_body = body.str("request_id")?;
    match (from_body, from_header) {
        (Some(b), Some(h)) if b != h => Err(ApiError::bad(
            "request_id",
            "differs from the Idempotency-Key header; send one, or the same in both",
        )),
        (Some(b), _) => Ok(Some(b.to_string())),
        (None, h) => Ok(h),
    }
}

fn need_request_id(headers: &HeaderMap, body: &Body) -> Result<RequestId, ApiError> {
    let r = request_id(headers, body)?.ok_or_else(|| {
        ApiError::bad(
            "request_id",
            "required (body field request_id or Idempotency-Key header)",
        )
    })?;
    Ok(RequestId::new(r)?)
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

async fn metrics() -> Response {
    match METRICS.get() {
        Some(h) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            h.render(),
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
    let body = Body::parse(&bytes, &["stock", "segments", "per_user_limit", "replace"])?;
    let sku = Sku::new(&sku)?;
    let stock = body.need_u64("stock")?;
    let segments = u32::try_from(body.need_u64("segments")?)
        .map_err(|_| ApiError::bad("segments", "too large"))?;
    let limit = body
        .u64("per_user_limit")?
        .unwrap_or(engine.options().per_user_limit);
    let replace = body.bool("replace")?.unwrap_or(false);
    let generation = engine
        .load(
            &sku,
            stock,
            shardstock::LoadOptions::new(segments)
                .replace(replace)
                .per_user_limit(limit),
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
        None => RequestId::new(format!("restock-{}", unique_stem()))?,
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
    let user = shardstock::UserId::new(body.need_str("user")?)?;
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
        Ok(other) => ok(StatusCode::OK, &other),
        // `ttl` is the body's `ttl_ms`.
        Err(Error::InvalidInput {
            field: "ttl",
            reason,
        }) => Err(ApiError::bad("ttl_ms", reason)),
        Err(e) => Err(e.into()),
    }
}

async fn end_reservation<S: Store>(engine: Engine<S>, id: String, confirm: bool) -> ApiResult {
    let rid: shardstock::ReservationId = id.parse()?;
    let r = if confirm {
        engine.confirm(&rid).await?
    } else {
        engine.cancel(&rid).await?
    };
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
    end_reservation(engine, id, true).await
}

async fn cancel<S: Store>(State(engine): State<Engine<S>>, Path(id): Path<String>) -> ApiResult {
    end_reservation(engine, id, false).await
}
