//! The routes and their handlers: path, headers and body in, engine call, JSON out. Each
//! handler's `#[utoipa::path]` is its entry in the OpenAPI document ([`super::openapi`], which
//! adds the error replies, security and engine-dependent bounds).

use super::body::{Body, need_request_id, request_id};
use super::messages::{
    DeductRequest, EndReply, HealthReply, LoadReply, LoadRequest, OrderEndReply, OrderHoldReply,
    OrderRequest, ReserveReply, ReserveRequest, RestockReply, RestockRequest, StatusReply, fields,
};
use super::options::{Render, Token};
use super::{ApiError, ApiOptions, ErrorCode, Json, json_errors};
use crate::cart::MAX_ITEMS;
use crate::{
    Audit, Cart, CartItem, Deduct, Deduction, Engine, Error, LoadOptions, OrderEnd, OrderHold,
    OrderId, Readiness, RequestId, ReservationEnd, ReservationId, Reserved, Sku, Store, UserId,
};
use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::Serialize;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What the handlers share: the engine, the per-call timeout and the readiness bound.
struct Api<S: Store> {
    engine: Engine<S>,
    timeout: Option<Duration>,
    ready_timeout: Duration,
}

impl<S: Store> Clone for Api<S> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            timeout: self.timeout,
            ready_timeout: self.ready_timeout,
        }
    }
}

impl<S: Store> Api<S> {
    /// Runs an engine call, dropping it after the timeout: the reply then names `id` (what to
    /// retry with). Dropping is safe: the engine's calls are cancellation-safe (docs/design.md, "What
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

/// The API's routes over `engine` with `options` (metrics, tokens, body limit, timeout),
/// serving `document` (the OpenAPI document of these routes) at `/openapi.json`.
pub(super) fn router<S: Store>(
    engine: Engine<S>,
    options: &ApiOptions,
    document: Arc<str>,
) -> Router {
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
            .route("/reservations/{id}/cancel", post(cancel::<S>))
            .route("/orders", post(hold_order::<S>))
            .route("/orders/{order_id}", get(order::<S>))
            .route("/orders/{order_id}/confirm", post(confirm_order::<S>))
            .route("/orders/{order_id}/cancel", post(cancel_order::<S>)),
        options.buyer_token.clone(),
        "buyer",
    );
    let api = Router::new()
        .route("/healthz", get(healthz::<S>))
        .route("/readyz", get(readyz::<S>))
        .route("/metrics", get(move || render_metrics(metrics)))
        .route("/openapi.json", get(move || openapi(document)))
        .merge(admin)
        .merge(buyer)
        // After routing (a route layer), so the matched route is known; the fallback counts
        // its own 404s.
        .route_layer(middleware::from_fn(super::meter::meter))
        .fallback(|method: axum::http::Method| async move {
            super::meter::unmatched(&method);
            ApiError::new(ErrorCode::NotFound, "no such route").into_response()
        })
        .layer(DefaultBodyLimit::max(options.body_limit))
        .with_state(Api {
            engine,
            timeout: options.request_timeout,
            ready_timeout: options.ready_timeout,
        });
    // Around the whole router, not each route: a 405's `Allow` header is set by the route's
    // method router after the route's layers have run.
    Router::new()
        .fallback_service(api)
        .layer(middleware::map_response(json_errors))
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

type ApiResult = Result<Response, ApiError>;

fn ok<T: Serialize>(status: StatusCode, value: &T) -> ApiResult {
    Ok((status, Json(value)).into_response())
}

/// A request id no other process or call makes: `<prefix>-<process id>-<nanoseconds>`.
fn fresh_request_id(prefix: &str) -> Result<RequestId, Error> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    RequestId::new(format!("{prefix}-{}-{nanos}", std::process::id()))
}

/// Liveness: is the process up? Asks nothing of the store.
///
/// 200 whenever the process serves HTTP, with Redis down too: restart the process when this
/// fails, never because the store is away (probe `/readyz` for that).
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "open",
    responses((status = 200, description = "The process answers", body = HealthReply)))]
async fn healthz<S: Store>(State(api): State<Api<S>>) -> ApiResult {
    ok(
        StatusCode::OK,
        &HealthReply {
            status: "ok",
            store: api.engine.store().name(),
            strategy: api.engine.store().strategy().name(),
        },
    )
}

/// Readiness: is the store there for this instance, and what of it is not?
///
/// Every server of the store is asked, within this server's readiness bound (1 s by default;
/// `serve.ready_timeout_ms` in `shardstock serve`), whether it answers and would take a write,
/// and the SKUs this instance has served are looked up. 503 `unavailable` when the store does not
/// answer (Redis down or out of reach, the cluster down): send buyers elsewhere. 200 `ready`,
/// or 200 `degraded` when it answers but a part does not serve: masters refusing writes
/// (`NOREPLICAS`, `OOM`, ...), out of reach or seeing the cluster down, with the segments of
/// the known SKUs on them; SKUs whose metadata vanished (Redis back empty). Buyers of the
/// other segments are served by this instance as by any other, so a load balancer keeps it;
/// an operator repairs what `problems` and `vanished_skus` name.
#[utoipa::path(get, path = "/readyz", operation_id = "readyz", tag = "open",
    responses(
        (status = 200, description = "The store answers: `ready` or `degraded`", body = Readiness),
        (status = 503, description = "The store does not answer: `unavailable`, with `reason`", body = Readiness)))]
async fn readyz<S: Store>(State(api): State<Api<S>>) -> Response {
    let r = api.engine.readiness(api.ready_timeout).await;
    let status = if r.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, [(header::CACHE_CONTROL, "no-store")], Json(r)).into_response()
}

/// The metrics in the Prometheus text format (404 `not_found` unless the server was given a
/// metrics renderer).
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "open",
    responses((status = 200, description = "Prometheus exposition", body = String,
        content_type = "text/plain")))]
async fn render_metrics(metrics: Option<Render>) -> Response {
    match metrics {
        Some(render) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            render(),
        )
            .into_response(),
        None => {
            ApiError::new(ErrorCode::NotFound, "metrics recorder not installed").into_response()
        }
    }
}

/// This document: the API as this server runs it (its bounds, its tokens).
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "open",
    responses((status = 200, description = "The OpenAPI 3.1 document", body = Object)))]
async fn openapi(document: Arc<str>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        document.to_string(),
    )
        .into_response()
}

/// Load a SKU: split `stock` over `segments` as a new generation.
#[utoipa::path(put, path = "/skus/{sku}", operation_id = "load", tag = "admin",
    params(("sku" = String, Path, description = "The SKU", pattern = "^[A-Za-z0-9_.-]{1,64}$", example = "phone")),
    request_body(content = LoadRequest, content_type = "application/json"),
    responses((status = 201, description = "Loaded", body = LoadReply, links(
        ("deduct" = (operation_id = "deduct", parameters(("sku" = "$response.body#/sku")))),
        ("reserve" = (operation_id = "reserve", parameters(("sku" = "$response.body#/sku")))),
        ("restock" = (operation_id = "restock", parameters(("sku" = "$response.body#/sku")))),
        ("status" = (operation_id = "status", parameters(("sku" = "$response.body#/sku")))),
        ("audit" = (operation_id = "audit", parameters(("sku" = "$response.body#/sku"))))))))]
async fn load<S: Store>(
    State(api): State<Api<S>>,
    Path(sku): Path<String>,
    body: Body,
) -> ApiResult {
    let req = LoadRequest::read(&body)?;
    let sku = Sku::new(&sku)?;
    let limit = req
        .per_user_limit
        .unwrap_or(api.engine.options().per_user_limit);
    let outbox = req.outbox.unwrap_or(api.engine.options().outbox);
    let options = LoadOptions::new(req.segments)
        .replace(req.replace.unwrap_or(false))
        .per_user_limit(limit)
        .outbox(outbox);
    let loading = api.engine.load(&sku, req.stock, options);
    let generation = api.call(Some(("sku", sku.as_str())), loading).await??;
    ok(
        StatusCode::CREATED,
        &LoadReply {
            sku: sku.as_str().to_string(),
            generation,
            stock: req.stock,
            segments: req.segments,
            per_user_limit: limit,
            outbox,
        },
    )
}

/// Add `qty` units, once per request id.
///
/// The request id is the body's `request_id` (absent: a fresh one, returned in the reply).
/// It may come in an `Idempotency-Key` header instead (visible ASCII only); sent in both, the
/// two must be the same id, else 400 `invalid_input` naming `request_id`.
#[utoipa::path(post, path = "/skus/{sku}/restock", operation_id = "restock", tag = "admin",
    params(("sku" = String, Path, description = "The SKU", pattern = "^[A-Za-z0-9_.-]{1,64}$", example = "phone"),),
    request_body(content = RestockRequest, content_type = "application/json"),
    responses((status = 200, description = "Restocked, or replayed", body = RestockReply)))]
async fn restock<S: Store>(
    State(api): State<Api<S>>,
    Path(sku): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    body.allow(fields::RESTOCK)?;
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
        &RestockReply {
            sku: sku.as_str().to_string(),
            request_id: request_id.as_str().to_string(),
            qty,
            added: r.added,
            replayed: r.replayed,
        },
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

/// Buy `qty` units, exactly once per (user, request id). Sold out, insufficient, limit reached,
/// user busy, over limit and replayed are outcomes (200), not errors.
///
/// The request id is the body's `request_id`. A client that sets an `Idempotency-Key` header
/// may send the id there instead (visible ASCII only) and leave `request_id` out; sent in
/// both, the two must be the same id, else 400 `invalid_input` naming `request_id`. The same
/// id with another `qty`, or the id of a reservation, is 409 `request_id_conflict` (also when
/// the new `qty` is above the per-user limit).
#[utoipa::path(post, path = "/skus/{sku}/deduct", operation_id = "deduct", tag = "buyer",
    params(("sku" = String, Path, description = "The SKU", pattern = "^[A-Za-z0-9_.-]{1,64}$", example = "phone"),),
    request_body(content = DeductRequest, content_type = "application/json"),
    responses((status = 200, description = "The outcome", body = Deduction)))]
async fn deduct<S: Store>(
    State(api): State<Api<S>>,
    Path(sku): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    body.allow(fields::DEDUCT)?;
    let req = purchase(&sku, &headers, &body)?;
    let id = Some(("request_id", req.request_id.as_str()));
    let d: Deduction = api.call(id, api.engine.deduct(&req)).await??;
    ok(StatusCode::OK, &d)
}

/// Units left, in total and per segment.
#[utoipa::path(get, path = "/skus/{sku}", operation_id = "status", tag = "admin",
    params(("sku" = String, Path, description = "The SKU", pattern = "^[A-Za-z0-9_.-]{1,64}$", example = "phone")),
    responses((status = 200, description = "Units left", body = StatusReply)))]
async fn status<S: Store>(State(api): State<Api<S>>, Path(sku): Path<String>) -> ApiResult {
    let sku = Sku::new(&sku)?;
    let r = api.call(None, api.engine.remaining(&sku)).await??;
    ok(
        StatusCode::OK,
        &StatusReply {
            sku: sku.as_str().to_string(),
            remaining: r.total,
            in_transit: r.in_transit,
            reserved: r.reserved,
            expired: r.expired,
            segments: r.per_segment.len() as u64,
            per_segment: r.per_segment,
        },
    )
}

/// The conservation check of the SKU. A failed check is `"ok": false`, still 200.
#[utoipa::path(get, path = "/skus/{sku}/audit", operation_id = "audit", tag = "admin",
    params(("sku" = String, Path, description = "The SKU", pattern = "^[A-Za-z0-9_.-]{1,64}$", example = "phone")),
    responses((status = 200, description = "The audit", body = Audit)))]
async fn audit<S: Store>(State(api): State<Api<S>>, Path(sku): Path<String>) -> ApiResult {
    let sku = Sku::new(&sku)?;
    let a = api.call(None, api.engine.audit(&sku)).await??;
    ok(StatusCode::OK, &a)
}

/// Hold `qty` units for `ttl_ms`, exactly once per (user, request id); confirm or cancel it
/// with the id of the reply.
///
/// The request id is the body's `request_id`, or an `Idempotency-Key` header, as for a sale.
#[utoipa::path(post, path = "/skus/{sku}/reservations", operation_id = "reserve", tag = "buyer",
    params(("sku" = String, Path, description = "The SKU", pattern = "^[A-Za-z0-9_.-]{1,64}$", example = "phone"),),
    request_body(content = ReserveRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Held (`outcome`: `held`)", body = ReserveReply, links(
            ("confirm" = (operation_id = "confirm", parameters(("id" = "$response.body#/id")))),
            ("cancel" = (operation_id = "cancel", parameters(("id" = "$response.body#/id")))))),
        (status = 200, description = "Replayed or not held (`outcome`: `replayed`, `not_held`)", body = ReserveReply)))]
async fn reserve<S: Store>(
    State(api): State<Api<S>>,
    Path(sku): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    body.allow(fields::RESERVE)?;
    let req = purchase(&sku, &headers, &body)?;
    let ttl = Duration::from_millis(body.need_u64("ttl_ms")?);
    let id = Some(("request_id", req.request_id.as_str()));
    match api.call(id, api.engine.reserve(&req, ttl)).await? {
        Ok(Reserved::Held { id, segment, units }) => ok(
            StatusCode::CREATED,
            &ReserveReply::Held { id, segment, units },
        ),
        Ok(Reserved::Replayed { id, segment, units }) => ok(
            StatusCode::OK,
            &ReserveReply::Replayed { id, segment, units },
        ),
        Ok(Reserved::NotHeld(d)) => ok(
            StatusCode::OK,
            &ReserveReply::NotHeld {
                reason: d.kind(),
                deduction: d,
            },
        ),
        // `ttl` is the body's `ttl_ms`.
        Err(Error::InvalidInput {
            field: "ttl",
            reason,
        }) => Err(ApiError::invalid("ttl_ms", reason)),
        Err(e) => Err(e.into()),
    }
}

/// The reply to a confirm or cancel of reservation `id`: 404 when there is no such reservation.
fn ended(id: String, r: ReservationEnd) -> ApiResult {
    let Some(state) = r.state else {
        return Err(ApiError::new(
            ErrorCode::UnknownReservation,
            format!("no reservation {id:?}"),
        )
        .with_field("reservation"));
    };
    ok(
        StatusCode::OK,
        &EndReply {
            id,
            state,
            done: r.done,
        },
    )
}

/// Confirm a reservation: its units are sold (unless it had ended otherwise: `done` false).
#[utoipa::path(post, path = "/reservations/{id}/confirm", operation_id = "confirm", tag = "buyer",
    params(("id" = String, Path, description = "The reservation id, as the reservation reply gave it",
        pattern = "^[A-Za-z0-9_.-]{1,64}~(0|[1-9][0-9]{0,14})~([0-9]|[1-9][0-9]{1,2}|10[01][0-9]|102[0-3])~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}$")),
    responses((status = 200, description = "The reservation's state", body = EndReply)))]
async fn confirm<S: Store>(State(api): State<Api<S>>, Path(id): Path<String>) -> ApiResult {
    let rid = id.parse::<ReservationId>()?;
    let r = api
        .call(Some(("reservation", &id)), api.engine.confirm(&rid))
        .await??;
    ended(id, r)
}

/// Cancel a reservation: its units go back (unless it had ended otherwise: `done` false).
#[utoipa::path(post, path = "/reservations/{id}/cancel", operation_id = "cancel", tag = "buyer",
    params(("id" = String, Path, description = "The reservation id, as the reservation reply gave it",
        pattern = "^[A-Za-z0-9_.-]{1,64}~(0|[1-9][0-9]{0,14})~([0-9]|[1-9][0-9]{1,2}|10[01][0-9]|102[0-3])~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}$")),
    responses((status = 200, description = "The reservation's state", body = EndReply)))]
async fn cancel<S: Store>(State(api): State<Api<S>>, Path(id): Path<String>) -> ApiResult {
    let rid = id.parse::<ReservationId>()?;
    let r = api
        .call(Some(("reservation", &id)), api.engine.cancel(&rid))
        .await??;
    ended(id, r)
}

/// An order from the headers and body, every field checked here (an item's complaints name it
/// as `items[<index>].<field>`, 0-based), so a refused body reaches no engine call.
fn cart(headers: &HeaderMap, body: &Body, max_qty: u64) -> Result<Cart, ApiError> {
    body.allow(fields::ORDER)?;
    let user = UserId::new(body.need_str("user")?)?;
    let request_id = need_request_id(headers, body)?;
    let items = body
        .objects("items")?
        .ok_or_else(|| ApiError::invalid("items", "required"))?;
    if items.is_empty() || items.len() > MAX_ITEMS {
        return Err(ApiError::invalid(
            "items",
            format!("an order holds 1 to {MAX_ITEMS} items"),
        ));
    }
    let item = |item: &Body| -> Result<CartItem, ApiError> {
        item.allow(fields::ORDER_ITEM)?;
        let sku = Sku::new(item.need_str("sku")?)?;
        let qty = item.need_u64("qty")?;
        crate::ids::check_qty("qty", qty, max_qty)?;
        Ok(CartItem { sku, qty })
    };
    let items = items
        .iter()
        .enumerate()
        .map(|(i, it)| item(it).map_err(|e| e.within(&format!("items[{i}]"))))
        .collect::<Result<Vec<_>, _>>()?;
    let hold = Duration::from_millis(body.need_u64("hold_ms")?);
    Ok(Cart {
        user,
        request_id,
        items,
        hold,
    })
}

/// Hold every item of an order until `hold_ms` passes, or none; exactly once per (user,
/// request id). Confirm or cancel it with the reply's `order_id`.
///
/// Each item is held at its SKU's home segment as a reservation is. `held`: every item is
/// held (now, or by an earlier call with this request id: a retry after a lost reply answers
/// the same order). `refused`: item `item` (1-based) could not be held (`reason` as a
/// deduction answers it), and nothing is held anywhere once this answers. `ended`: the order
/// was decided before (a retry after a confirm, cancel, expiry; a cancel that came first).
/// The request id is the body's `request_id`, or an `Idempotency-Key` header, as for a sale;
/// the same id with other items is 409 `request_id_conflict` naming `items`. A 404
/// `not_loaded` names the item whose SKU is not loaded (`items[<index>].sku`); a 503 leaves
/// the outcome unknown: retry with the same request id, or cancel the order.
#[utoipa::path(post, path = "/orders", operation_id = "hold_order", tag = "buyer",
    request_body(content = OrderRequest, content_type = "application/json"),
    responses((status = 200, description = "The outcome (`held`, `refused`, `ended`)", body = OrderHoldReply, links(
        ("order" = (operation_id = "order", parameters(("order_id" = "$response.body#/order_id")))),
        ("confirm_order" = (operation_id = "confirm_order", parameters(("order_id" = "$response.body#/order_id")))),
        ("cancel_order" = (operation_id = "cancel_order", parameters(("order_id" = "$response.body#/order_id"))))))))]
async fn hold_order<S: Store>(
    State(api): State<Api<S>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let cart = cart(&headers, &body, api.engine.options().max_qty)?;
    let id = Some(("request_id", cart.request_id.as_str()));
    let held = match api.call(id, api.engine.hold_order(&cart)).await? {
        Ok(h) => h,
        // Which item: the first of the SKU.
        Err(Error::NotLoaded(sku)) => {
            let at = cart
                .items
                .iter()
                .position(|it| it.sku.as_str() == sku)
                .map_or_else(|| "items".to_string(), |i| format!("items[{i}].sku"));
            return Err(ApiError::from(Error::NotLoaded(sku)).with_field(&at));
        }
        Err(e) => return Err(e.into()),
    };
    let reply = match held {
        OrderHold::Held {
            order_id,
            items,
            left_ms,
        } => OrderHoldReply::Held {
            order_id,
            items,
            left_ms,
        },
        OrderHold::Refused {
            order_id,
            item,
            sku,
            reason,
        } => OrderHoldReply::Refused {
            order_id,
            item,
            sku,
            reason,
        },
        OrderHold::Ended { order_id, state } => OrderHoldReply::Ended { order_id, state },
    };
    ok(StatusCode::OK, &reply)
}

/// The reply about order `id`: 404 when there is no such order.
fn order_end(id: &str, r: Option<OrderEnd>) -> ApiResult {
    let Some(r) = r else {
        return Err(
            ApiError::new(ErrorCode::UnknownOrder, format!("no order {id:?}")).with_field("order"),
        );
    };
    ok(
        StatusCode::OK,
        &OrderEndReply {
            order_id: r.order_id.to_string(),
            state: r.state,
            done: r.done,
            left_ms: r.left_ms,
            reloaded: r.reloaded,
        },
    )
}

/// Confirm an order: every item is sold, before the deadline on the clock of the order's
/// record. After it the order is `expired` (`done` false, nothing sold, every item given
/// back); a cancelled or refused order stays so (`done` false); an order still `holding` (its
/// hold has not answered) stays open (`done` false: confirm again once it is held).
#[utoipa::path(post, path = "/orders/{order_id}/confirm", operation_id = "confirm_order", tag = "buyer",
    params(("order_id" = String, Path, description = "The order id, `<user>~<request id>`, as the order reply gave it",
        pattern = "^(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,125}$")),
    responses((status = 200, description = "The order's state", body = OrderEndReply)))]
async fn confirm_order<S: Store>(State(api): State<Api<S>>, Path(id): Path<String>) -> ApiResult {
    let oid = id.parse::<OrderId>()?;
    let r = api
        .call(Some(("order", &id)), api.engine.confirm_order(&oid))
        .await??;
    order_end(&id, r)
}

/// Cancel an order: every item goes back (a confirmed order stays confirmed: `done` false). An
/// order not held yet, or unknown, is remembered as cancelled (200 `cancelled`, never 404), so
/// its hold, if it comes later, holds nothing.
#[utoipa::path(post, path = "/orders/{order_id}/cancel", operation_id = "cancel_order", tag = "buyer",
    params(("order_id" = String, Path, description = "The order id, `<user>~<request id>`, as the order reply gave it",
        pattern = "^(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,125}$")),
    responses((status = 200, description = "The order's state", body = OrderEndReply)))]
async fn cancel_order<S: Store>(State(api): State<Api<S>>, Path(id): Path<String>) -> ApiResult {
    let oid = id.parse::<OrderId>()?;
    let r = api
        .call(Some(("order", &id)), api.engine.cancel_order(&oid))
        .await??;
    order_end(&id, r)
}

/// An order's state, read without writing (an open order past its deadline reads `expired`;
/// `done` is false and `reloaded` empty).
#[utoipa::path(get, path = "/orders/{order_id}", operation_id = "order", tag = "buyer",
    params(("order_id" = String, Path, description = "The order id, `<user>~<request id>`, as the order reply gave it",
        pattern = "^(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,125}$")),
    responses((status = 200, description = "The order's state", body = OrderEndReply)))]
async fn order<S: Store>(State(api): State<Api<S>>, Path(id): Path<String>) -> ApiResult {
    let oid = id.parse::<OrderId>()?;
    let r = api
        .call(Some(("order", &id)), api.engine.order(&oid))
        .await??;
    order_end(&id, r)
}
