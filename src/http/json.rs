//! JSON in and out: the [`Json`] extractor (its rejection is an [`ApiError`]) and the
//! `Content-Type` rule every route with a body shares.

use super::{ApiError, ErrorCode};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A JSON body in, or a JSON reply out, with the API's error replies: axum's own `Json` with
/// [`ApiError`] as its rejection, so a service's routes refuse bad bodies exactly as the API's
/// routes do:
///
/// - a `Content-Type` other than `application/json` (a charset, if given, must be `utf-8`), or
///   none: 415 [`ErrorCode::UnsupportedMediaType`] (`"field": "Content-Type"`);
/// - a body above the router's `DefaultBodyLimit`: 413 [`ErrorCode::PayloadTooLarge`];
/// - a body that is not JSON or not a `T`: 400 [`ErrorCode::InvalidInput`] (`"field":
///   "body"`, serde's message).
///
/// ```
/// use shardstock::http::{ApiError, Json};
///
/// #[derive(serde::Deserialize)]
/// struct Order {
///     user: String,
///     request_id: String,
/// }
///
/// async fn order(Json(order): Json<Order>) -> Result<Json<serde_json::Value>, ApiError> {
///     let user = shardstock::UserId::new(order.user)?;
///     Ok(Json(serde_json::json!({ "user": user.as_str(), "request_id": order.request_id })))
/// }
/// let app: axum::Router = axum::Router::new().route("/order", axum::routing::post(order));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Json<T>(pub T);

impl<T, S> FromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        require_json(req.headers(), false)?;
        let bytes = Bytes::from_request(req, state).await.map_err(unreadable)?;
        serde_json::from_slice(&bytes)
            .map(Json)
            .map_err(|e| ApiError::invalid("body", format!("not a valid JSON body: {e}")))
    }
}

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// The bytes of a body that `Content-Type` declares JSON; a request without `Content-Type` may
/// come without a body (the API's routes read an absent body as `{}`).
pub(super) async fn json_bytes<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    let declared = require_json(req.headers(), true)?;
    let bytes = Bytes::from_request(req, state).await.map_err(unreadable)?;
    if !declared && !bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(not_json("none"));
    }
    Ok(bytes)
}

/// Checks `Content-Type`: `Ok(true)` for `application/json` (parameters allowed, a charset
/// only if `utf-8`), `Ok(false)` for no header when `absent_ok`, else a 415.
fn require_json(headers: &HeaderMap, absent_ok: bool) -> Result<bool, ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return if absent_ok {
            Ok(false)
        } else {
            Err(not_json("none"))
        };
    };
    let text = value.to_str().unwrap_or("");
    let mut parts = text.split(';');
    let essence = parts.next().unwrap_or("").trim();
    let charset_ok = parts.all(|p| match p.split_once('=') {
        Some((k, v)) if k.trim().eq_ignore_ascii_case("charset") => {
            v.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        Some(_) => true,
        None => p.trim().is_empty(),
    });
    if essence.eq_ignore_ascii_case("application/json") && charset_ok {
        Ok(true)
    } else {
        Err(not_json(&format!("{text:?}")))
    }
}

fn not_json(given: &str) -> ApiError {
    ApiError::new(
        ErrorCode::UnsupportedMediaType,
        format!(
            "unsupported Content-Type {given}: send the body as application/json \
             (optionally ; charset=utf-8)"
        ),
    )
    .with_field("Content-Type")
}

/// A body that could not be read: over the limit (413) or broken off (400).
fn unreadable(e: BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("invalid body: {}", e.body_text()),
        )
        .with_field("body")
    } else {
        ApiError::invalid("body", e.body_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn check(content_type: Option<&str>) -> Result<bool, u16> {
        let mut h = HeaderMap::new();
        if let Some(v) = content_type {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_str(v).unwrap());
        }
        require_json(&h, true).map_err(|e| e.status().as_u16())
    }

    #[test]
    fn only_json_in_utf8_is_json() {
        assert_eq!(check(None), Ok(false));
        for ok in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/json;charset=\"UTF-8\"",
        ] {
            assert_eq!(check(Some(ok)), Ok(true), "{ok}");
        }
        for no in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/json; charset=latin1",
            "application/jsonx",
            "application/problem+json",
            "",
        ] {
            assert_eq!(check(Some(no)), Err(415), "{no}");
        }
    }
}
