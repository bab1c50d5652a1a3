//! Error replies: the status and code of each [`ErrorKind`], and the JSON body every error
//! shares.

use crate::Error;
use crate::error::ErrorKind;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The HTTP status for an error of kind `kind`: 400 invalid input, 404 not loaded, 409 already
/// loaded / request id conflict, 422 config (the configured strategy cannot serve the
/// request), 503 for the retryable kinds ([`ErrorKind::is_retryable`]: Redis, lost lease, SKU
/// mid-reload, too few replicas acknowledged a write, PostgreSQL), 500 for a store reply this
/// version does not understand or a Redis user without the rights.
pub fn status(kind: ErrorKind) -> StatusCode {
    ErrorCode::from(kind).status()
}

/// The machine-readable `code` of an error reply: what a client branches on (the message may
/// change, the code does not). An engine error's code is its [`ErrorKind`]'s name
/// ([`ErrorKind::as_str`], also the `kind` label of the errors metric); the other codes are the
/// API's own (authorization, routing, media type, size, timeout). Each variant's doc gives its
/// status and what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// 400: a path, header, body or field failed validation (`field` names it); nothing was
    /// changed. Fix the input.
    InvalidInput,
    /// 401 + `WWW-Authenticate: Bearer`: the route needs `Authorization: Bearer <token>` and
    /// got none or another token.
    Unauthorized,
    /// 404: the SKU was never loaded (`field`: `sku`). Load it first.
    NotLoaded,
    /// 404: no such reservation (`field`: `reservation`).
    UnknownReservation,
    /// 404: no such order (`field`: `order`): never held, or forgotten a request TTL after it
    /// ended.
    UnknownOrder,
    /// 404: no such route (or `/metrics` without a metrics recorder).
    NotFound,
    /// 405 + `Allow`: the route exists but not with this method; the message and `Allow` list
    /// the methods it has.
    MethodNotAllowed,
    /// 409: `PUT /skus/{sku}` on a loaded SKU. Send `"replace": true` to start a new
    /// generation.
    AlreadyLoaded,
    /// 409: the request id was used by this user with another `qty` or kind (`field` says
    /// which). Use a fresh id for a new request.
    RequestIdConflict,
    /// 413: the body is larger than the limit.
    PayloadTooLarge,
    /// 415: the body is not declared `application/json` (a charset, if given, must be utf-8).
    UnsupportedMediaType,
    /// 422: the configured strategy cannot serve this (reservations with an unsafe baseline;
    /// `field`: `strategy`).
    Config,
    /// 503 + `Retry-After`: the SKU is being (re)loaded. Retry with the same request id.
    NotReady,
    /// 503 + `Retry-After`: a lock strategy lost its lease before writing; nothing was
    /// written. Retry with the same request id.
    LeaseLost,
    /// 503 + `Retry-After`: Redis failed; the outcome is unknown. Retry with the same request
    /// id.
    Redis,
    /// 503 + `Retry-After`: durability mode: too few replicas acknowledged the write. Retry
    /// with the same request id.
    NotDurable,
    /// 503 + `Retry-After`: durability: the segment's master refused the write before running
    /// it (too few replicas reachable); nothing was written. Retry with the same request id.
    NoReplicas,
    /// 503 + `Retry-After`: the orders database failed. Retry.
    Postgres,
    /// 503 + `Retry-After`: the engine call was cut by the request timeout; its outcome is
    /// unknown. Retry with the same request id (named in the reply).
    Timeout,
    /// 500: the Redis user lacks a command or key (ACL). An operator must grant it.
    Permission,
    /// 500: the store answered something this version does not understand.
    Protocol,
    /// 500: any other server-side failure.
    Internal,
}

impl ErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 22] = [
        ErrorCode::InvalidInput,
        ErrorCode::Unauthorized,
        ErrorCode::NotLoaded,
        ErrorCode::UnknownReservation,
        ErrorCode::UnknownOrder,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::AlreadyLoaded,
        ErrorCode::RequestIdConflict,
        ErrorCode::PayloadTooLarge,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::Config,
        ErrorCode::NotReady,
        ErrorCode::LeaseLost,
        ErrorCode::Redis,
        ErrorCode::NotDurable,
        ErrorCode::NoReplicas,
        ErrorCode::Postgres,
        ErrorCode::Timeout,
        ErrorCode::Permission,
        ErrorCode::Protocol,
        ErrorCode::Internal,
    ];

    /// The code as it appears in the JSON reply.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidInput => ErrorKind::InvalidInput.as_str(),
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::NotLoaded => ErrorKind::NotLoaded.as_str(),
            ErrorCode::UnknownReservation => "unknown_reservation",
            ErrorCode::UnknownOrder => "unknown_order",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::AlreadyLoaded => ErrorKind::AlreadyLoaded.as_str(),
            ErrorCode::RequestIdConflict => ErrorKind::RequestIdConflict.as_str(),
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::Config => ErrorKind::Config.as_str(),
            ErrorCode::NotReady => ErrorKind::NotReady.as_str(),
            ErrorCode::LeaseLost => ErrorKind::LeaseLost.as_str(),
            ErrorCode::Redis => ErrorKind::Redis.as_str(),
            ErrorCode::NotDurable => ErrorKind::NotDurable.as_str(),
            ErrorCode::NoReplicas => ErrorKind::NoReplicas.as_str(),
            ErrorCode::Postgres => ErrorKind::Postgres.as_str(),
            ErrorCode::Timeout => "timeout",
            ErrorCode::Permission => ErrorKind::Permission.as_str(),
            ErrorCode::Protocol => ErrorKind::Protocol.as_str(),
            ErrorCode::Internal => "internal",
        }
    }

    /// The status every reply with this code has.
    pub const fn status(self) -> StatusCode {
        match self {
            ErrorCode::InvalidInput => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::NotLoaded
            | ErrorCode::UnknownReservation
            | ErrorCode::UnknownOrder
            | ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::AlreadyLoaded | ErrorCode::RequestIdConflict => StatusCode::CONFLICT,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::Config => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::NotReady
            | ErrorCode::LeaseLost
            | ErrorCode::Redis
            | ErrorCode::NotDurable
            | ErrorCode::NoReplicas
            | ErrorCode::Postgres
            | ErrorCode::Timeout => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Permission | ErrorCode::Protocol | ErrorCode::Internal => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// True for the codes whose replies carry `Retry-After`: a retry with the same request id
    /// is safe and may succeed.
    pub const fn is_retryable(self) -> bool {
        matches!(self.status(), StatusCode::SERVICE_UNAVAILABLE)
    }
}

impl From<ErrorKind> for ErrorCode {
    fn from(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::InvalidInput => ErrorCode::InvalidInput,
            ErrorKind::NotLoaded => ErrorCode::NotLoaded,
            ErrorKind::AlreadyLoaded => ErrorCode::AlreadyLoaded,
            ErrorKind::NotReady => ErrorCode::NotReady,
            ErrorKind::RequestIdConflict => ErrorCode::RequestIdConflict,
            ErrorKind::LeaseLost => ErrorCode::LeaseLost,
            ErrorKind::Config => ErrorCode::Config,
            ErrorKind::Redis => ErrorCode::Redis,
            ErrorKind::Permission => ErrorCode::Permission,
            ErrorKind::NotDurable => ErrorCode::NotDurable,
            ErrorKind::NoReplicas => ErrorCode::NoReplicas,
            ErrorKind::Protocol => ErrorCode::Protocol,
            ErrorKind::Postgres => ErrorCode::Postgres,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error reply: a status, a machine-readable [`ErrorCode`], a message, the offending field
/// when there is one, and `Retry-After: 1` when a retry with the same request id may succeed.
/// Its JSON body is `{"error": "...", "code": "...", "field": "..."?}`. Return it from your own
/// handlers (it is `From<`[`Error`]`>`), and take bodies with [`Json`](super::Json) (whose
/// rejection it is), so your routes answer exactly as the API's routes do.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: ErrorCode,
    error: String,
    field: Option<String>,
    /// One more member of the JSON body (`request_id` / `reservation` / `order` / `sku` of a
    /// timed-out call).
    extra: Option<(&'static str, String)>,
    /// `WWW-Authenticate` (a 401).
    authenticate: Option<&'static str>,
    /// Headers of a reply axum made (e.g. `Allow` on a 405), kept on the JSON one.
    headers: Option<Box<axum::http::HeaderMap>>,
}

/// The JSON body of every error reply.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(super) struct ErrorBody {
    /// What went wrong and what to do, in words (may change between versions; branch on
    /// `code`).
    error: String,
    /// What went wrong, for machines (stable).
    code: ErrorCode,
    /// The input to blame: a body field (`qty`, `user`, ...; an order item's as
    /// `items[0].qty`), `body`, `sku`, `reservation`, `order`, `request_id`, a header
    /// (`Idempotency-Key`, `Authorization`, `Content-Type`), `method`, `path` or `strategy`.
    /// Absent when no input is to blame.
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<String>,
    /// The request id to retry with (a restock, deduct, reservation or order cut by the
    /// timeout).
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<String>,
    /// The reservation to retry (a confirm or cancel cut by the timeout).
    #[serde(skip_serializing_if = "Option::is_none")]
    reservation: Option<String>,
    /// The order to retry (an order's confirm, cancel or read cut by the timeout).
    #[serde(skip_serializing_if = "Option::is_none")]
    order: Option<String>,
    /// The SKU whose load to retry (a load cut by the timeout).
    #[serde(skip_serializing_if = "Option::is_none")]
    sku: Option<String>,
}

impl ApiError {
    /// An error with `code` (its status is [`ErrorCode::status`]) and message `error`.
    pub fn new(code: ErrorCode, error: impl Into<String>) -> Self {
        Self {
            status: code.status(),
            code,
            error: error.into(),
            field: None,
            extra: None,
            authenticate: None,
            headers: None,
        }
    }

    /// A 400 [`ErrorCode::InvalidInput`] blaming `field`: `invalid <field>: <reason>`.
    pub fn invalid(field: &str, reason: impl Into<String>) -> Self {
        Self::new(
            ErrorCode::InvalidInput,
            format!("invalid {field}: {}", reason.into()),
        )
        .with_field(field)
    }

    /// The same error, blaming `field`.
    pub fn with_field(mut self, field: &str) -> Self {
        self.field = Some(field.to_string());
        self
    }

    /// The same error about a field of the object at `at` (`items[0]`): its field becomes
    /// `<at>.<field>` (`items[0].qty`), in the message too; an error without a field blames `at`.
    pub(super) fn within(mut self, at: &str) -> Self {
        match self.field.take() {
            Some(f) => {
                let path = format!("{at}.{f}");
                if let Some(rest) = self.error.strip_prefix(&format!("invalid {f}:")) {
                    self.error = format!("invalid {path}:{rest}");
                }
                self.field = Some(path);
            }
            None => self.field = Some(at.to_string()),
        }
        self
    }

    /// A 401 for the `Authorization` header; `wrong`: a token was given but is not the one.
    pub(super) fn unauthorized(error: impl Into<String>, wrong: bool) -> Self {
        let mut a = Self::new(ErrorCode::Unauthorized, error).with_field("Authorization");
        a.authenticate = Some(if wrong {
            "Bearer error=\"invalid_token\""
        } else {
            "Bearer"
        });
        a
    }

    /// A 503 for an engine call cut after `after`: retry with the same id (`what` = `id`).
    pub(super) fn timed_out(after: std::time::Duration, id: Option<(&'static str, &str)>) -> Self {
        let retry = match id {
            Some((what, id)) => format!("retry with the same {what} {id:?}"),
            None => "retry".to_string(),
        };
        let mut a = Self::new(
            ErrorCode::Timeout,
            format!(
                "timed out after {} ms and was dropped; its outcome is unknown: {retry} \
                 (a retry gets the one outcome, never a second effect)",
                after.as_millis()
            ),
        );
        a.extra = id.map(|(what, id)| (what, id.to_string()));
        a
    }

    /// The reply's status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The reply's code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.error
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.error)
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let kind = e.kind();
        // Over the API, a configuration error is the configured strategy refusing the request
        // (reservations need an exactly-once strategy).
        let field = e
            .field()
            .or((kind == ErrorKind::Config).then_some("strategy"));
        let code = ErrorCode::from(kind);
        if code.status().is_server_error() {
            tracing::warn!(error = %e, "request failed");
        }
        let message = match &e {
            // What to send over HTTP, not the Rust call.
            Error::AlreadyLoaded { sku, generation } => format!(
                "sku {sku:?} is already loaded (generation {generation}); send \"replace\": true \
                 in the load body to start a new generation"
            ),
            e => e.to_string(),
        };
        let a = ApiError::new(code, message);
        match field {
            Some(f) => a.with_field(f),
            None => a,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = ErrorBody {
            error: self.error,
            code: self.code,
            field: self.field,
            request_id: None,
            reservation: None,
            order: None,
            sku: None,
        };
        if let Some((what, id)) = self.extra {
            match what {
                "request_id" => body.request_id = Some(id),
                "reservation" => body.reservation = Some(id),
                "order" => body.order = Some(id),
                _ => body.sku = Some(id),
            }
        }
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(headers) = self.headers {
            for (k, v) in headers.iter() {
                if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
                    r.headers_mut().insert(k.clone(), v.clone());
                }
            }
        }
        if self.code.is_retryable() {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let Some(a) = self.authenticate {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(a));
        }
        r
    }
}

/// Middleware turning the error replies axum makes itself (a body over the limit, a path that
/// does not decode, a method the route lacks, an unknown route) into the API's JSON error shape
/// with its code, keeping their headers (`Allow` on a 405). The API's router runs it; mount it
/// on your own routes with `axum::middleware::map_response(shardstock::http::json_errors)`.
pub async fn json_errors(r: Response) -> Response {
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
    let text = text.trim();
    let mut a = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            let allow = parts
                .headers
                .get(header::ALLOW)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                format!("method not allowed: this route allows {allow}"),
            )
            .with_field("method")
        }
        StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::invalid("body", text).code_as(ErrorCode::PayloadTooLarge)
        }
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            ApiError::invalid("Content-Type", text).code_as(ErrorCode::UnsupportedMediaType)
        }
        StatusCode::NOT_FOUND => ApiError::new(ErrorCode::NotFound, format!("not found: {text}")),
        s if s.is_client_error() => ApiError::invalid("path", text),
        _ => ApiError::new(ErrorCode::Internal, text.to_string()),
    };
    a.status = status;
    a.headers = Some(Box::new(parts.headers));
    a.into_response()
}

impl ApiError {
    /// The same message and field under another code (and its status).
    fn code_as(mut self, code: ErrorCode) -> Self {
        self.code = code;
        self.status = code.status();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mapping `shardstock serve` had before kinds existed, variant by variant.
    #[test]
    fn statuses_codes_fields_and_retry_hints_are_the_reference_ones() {
        let cases: [(Error, u16, &str, Option<&str>, bool); 9] = [
            (
                Error::invalid("user", "bad"),
                400,
                "invalid_input",
                Some("user"),
                false,
            ),
            (
                Error::NotLoaded("s".into()),
                404,
                "not_loaded",
                Some("sku"),
                false,
            ),
            (
                Error::AlreadyLoaded {
                    sku: "s".into(),
                    generation: 1,
                },
                409,
                "already_loaded",
                Some("sku"),
                false,
            ),
            (
                Error::RequestIdConflict {
                    request_id: "r".into(),
                    field: "qty",
                },
                409,
                "request_id_conflict",
                Some("qty"),
                false,
            ),
            (Error::NotReady("s".into()), 503, "not_ready", None, true),
            (Error::LeaseLost("s".into()), 503, "lease_lost", None, true),
            (
                Error::Redis(fred::error::Error::new(fred::error::ErrorKind::IO, "down")),
                503,
                "redis",
                None,
                true,
            ),
            (
                Error::Config("x".into()),
                422,
                "config",
                Some("strategy"),
                false,
            ),
            (Error::Protocol("x".into()), 500, "protocol", None, false),
        ];
        for (e, status, code, field, retry) in cases {
            let shown = e.to_string();
            let a = ApiError::from(e);
            assert_eq!(
                (
                    a.status.as_u16(),
                    a.code.as_str(),
                    a.field.as_deref(),
                    a.code.is_retryable()
                ),
                (status, code, field, retry),
                "{shown}"
            );
        }
    }

    #[test]
    fn every_kind_has_the_code_of_its_name_and_the_status_of_status() {
        for kind in ErrorKind::ALL {
            let code = ErrorCode::from(kind);
            assert_eq!(code.as_str(), kind.as_str());
            assert_eq!(code.status(), status(kind));
            assert_eq!(code.is_retryable(), kind.is_retryable(), "{kind}");
        }
        let mut names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        for (c, name) in ErrorCode::ALL.iter().zip(&names) {
            assert_eq!(serde_json::to_value(c).unwrap(), *name);
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
    }

    #[test]
    fn an_existing_sku_is_told_what_to_send_over_http() {
        let a = ApiError::from(Error::AlreadyLoaded {
            sku: "s".into(),
            generation: 7,
        });
        assert!(a.error.contains("\"replace\": true"), "{}", a.error);
        assert!(!a.error.contains("LoadOptions"), "{}", a.error);
    }
}
