//! Error replies: the status of each [`ErrorKind`] and the JSON body every error shares.

use crate::Error;
use crate::error::ErrorKind;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// The HTTP status for an error of kind `kind`: 400 invalid input, 404 not loaded, 409 already
/// loaded / request id conflict, 422 config (the configured strategy cannot serve the
/// request), 503 for the retryable kinds ([`ErrorKind::is_retryable`]: Redis, lost lease, SKU
/// mid-reload, too few replicas acknowledged a write, PostgreSQL), 500 for a store reply this version does not understand or a Redis user without the rights.
pub fn status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
        ErrorKind::NotLoaded => StatusCode::NOT_FOUND,
        ErrorKind::AlreadyLoaded | ErrorKind::RequestIdConflict => StatusCode::CONFLICT,
        ErrorKind::NotReady
        | ErrorKind::LeaseLost
        | ErrorKind::Redis
        | ErrorKind::NotDurable
        | ErrorKind::Postgres => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Config => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::Protocol | ErrorKind::Permission => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// An error reply: status, message, the offending field when there is one, and `Retry-After: 1`
/// when a retry with the same request id may succeed. Return it from your own handlers (it is
/// `From<`[`Error`]`>`) so they answer exactly as the API's routes do.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    error: String,
    field: Option<String>,
    retry_after: bool,
    /// One more member of the JSON body (`request_id` / `reservation` of a timed-out call).
    extra: Option<(&'static str, String)>,
    /// `WWW-Authenticate` (a 401).
    authenticate: Option<&'static str>,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, error: impl Into<String>, field: Option<&str>) -> Self {
        Self {
            status,
            error: error.into(),
            field: field.map(str::to_string),
            retry_after: false,
            extra: None,
            authenticate: None,
        }
    }

    /// A 401 for the `Authorization` header; `wrong`: a token was given but is not the one.
    pub(super) fn unauthorized(error: impl Into<String>, wrong: bool) -> Self {
        let mut a = Self::new(StatusCode::UNAUTHORIZED, error, Some("Authorization"));
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
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "timed out after {} ms and was dropped; its outcome is unknown: {retry} \
                 (a retry gets the one outcome, never a second effect)",
                after.as_millis()
            ),
            None,
        );
        a.retry_after = true;
        a.extra = id.map(|(what, id)| (what, id.to_string()));
        a
    }

    /// A 400 blaming `field`.
    pub(super) fn bad(field: &str, error: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            format!("invalid {field}: {}", error.into()),
            Some(field),
        )
    }

    /// The reply's status.
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let kind = e.kind();
        let status = status(kind);
        // Over the API, a configuration error is the configured strategy refusing the request
        // (reservations need an exactly-once strategy).
        let field = e
            .field()
            .or((kind == ErrorKind::Config).then_some("strategy"));
        if status.is_server_error() {
            tracing::warn!(error = %e, "request failed");
        }
        let mut a = ApiError::new(status, e.to_string(), field);
        a.retry_after = kind.is_retryable();
        a
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.error });
        if let Some(f) = self.field {
            body["field"] = Value::String(f);
        }
        if let Some((k, v)) = self.extra {
            body[k] = Value::String(v);
        }
        let mut r = (self.status, axum::Json(body)).into_response();
        if self.retry_after {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The mapping `shardstock serve` had before kinds existed, variant by variant.
    #[test]
    fn statuses_fields_and_retry_hints_are_the_reference_ones() {
        let cases: [(Error, u16, Option<&str>, bool); 9] = [
            (Error::invalid("user", "bad"), 400, Some("user"), false),
            (Error::NotLoaded("s".into()), 404, Some("sku"), false),
            (
                Error::AlreadyLoaded {
                    sku: "s".into(),
                    generation: 1,
                },
                409,
                Some("sku"),
                false,
            ),
            (
                Error::RequestIdConflict {
                    request_id: "r".into(),
                    field: "qty",
                },
                409,
                Some("qty"),
                false,
            ),
            (Error::NotReady("s".into()), 503, None, true),
            (Error::LeaseLost("s".into()), 503, None, true),
            (
                Error::Redis(fred::error::Error::new(fred::error::ErrorKind::IO, "down")),
                503,
                None,
                true,
            ),
            (Error::Config("x".into()), 422, Some("strategy"), false),
            (Error::Protocol("x".into()), 500, None, false),
        ];
        for (e, code, field, retry) in cases {
            let shown = e.to_string();
            let a = ApiError::from(e);
            assert_eq!(
                (a.status.as_u16(), a.field.as_deref(), a.retry_after),
                (code, field, retry),
                "{shown}"
            );
        }
    }
}
