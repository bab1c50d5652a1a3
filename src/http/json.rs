//! JSON in and out: the [`Json`] extractor (its rejection is an [`ApiError`]) and the
//! `Content-Type` rule every route with a body shares.

use super::{ApiError, ErrorCode};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::{
    DeserializeOwned, DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor,
};
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

/// A JSON body in, or a JSON reply out, with the API's error replies: axum's own `Json` with
/// [`ApiError`] as its rejection, so a service's routes refuse bad bodies exactly as the API's
/// routes do:
///
/// - a `Content-Type` other than `application/json` (a charset, if given, must be `utf-8`), or
///   none: 415 [`ErrorCode::UnsupportedMediaType`] (`"field": "Content-Type"`);
/// - a body above the router's `DefaultBodyLimit`: 413 [`ErrorCode::PayloadTooLarge`];
/// - a body that is not JSON or not a `T`: 400 [`ErrorCode::InvalidInput`] (`"field":
///   "body"`, serde's message);
/// - a body in which an object, at any depth, names a key twice (`{"qty":1,"qty":5}`): 400
///   [`ErrorCode::InvalidInput`] naming the key (`"field": "qty"`, nested as `"a.b"` or
///   `"a[0].b"`). serde_json would keep the last value, and whatever checked the first one
///   (a proxy, a signature, a log) would have seen another request.
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
        unique_keys(&bytes)?;
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

/// Refuses a JSON text in which an object names a key twice, at any depth (keys compared as
/// decoded, so `"q\u0074y"` repeats `"qty"`): a 400 naming the key's path. Text that is not
/// JSON passes: the parse that follows says what is wrong with it. serde's visitors walk
/// serde_json's parser; no value is built.
pub(super) fn unique_keys(bytes: &[u8]) -> Result<(), ApiError> {
    let repeated = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let walk = KeysOnce {
        at: "",
        repeated: &repeated,
    };
    if walk.deserialize(&mut de).is_err()
        && let Some(at) = repeated.into_inner()
    {
        return Err(ApiError::invalid(
            &at,
            format!("key {at:?} is repeated; send each field once"),
        ));
    }
    Ok(())
}

/// One JSON value walked by [`unique_keys`]: `at` is its path (`""` at the top), `repeated`
/// the path of the first key found twice.
struct KeysOnce<'a> {
    at: &'a str,
    repeated: &'a RefCell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for KeysOnce<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeysOnce<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0usize;
        loop {
            let at = format!("{}[{i}]", self.at);
            let item = KeysOnce {
                at: &at,
                repeated: self.repeated,
            };
            if seq.next_element_seed(item)?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let at = if self.at.is_empty() {
                key.clone()
            } else {
                format!("{}.{key}", self.at)
            };
            if !seen.insert(key) {
                *self.repeated.borrow_mut() = Some(at);
                return Err(A::Error::custom("repeated key"));
            }
            map.next_value_seed(KeysOnce {
                at: &at,
                repeated: self.repeated,
            })?;
        }
        Ok(())
    }
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

    /// The field a body's repeated key is blamed on (`invalid <field>: key "<field>" is
    /// repeated; ...`), `None` when no key repeats.
    fn repeated(body: &str) -> Option<String> {
        unique_keys(body.as_bytes()).err().map(|e| {
            assert_eq!(e.status(), StatusCode::BAD_REQUEST);
            assert_eq!(e.code(), ErrorCode::InvalidInput);
            let m = e.message();
            let (field, rest) = m
                .strip_prefix("invalid ")
                .and_then(|m| m.split_once(": "))
                .unwrap_or_else(|| panic!("{m}"));
            assert!(
                rest.starts_with(&format!("key {field:?} is repeated")),
                "{m}"
            );
            field.to_string()
        })
    }

    #[test]
    fn a_key_named_twice_is_refused_at_any_depth() {
        assert_eq!(repeated(r#"{"qty":1,"qty":5}"#).as_deref(), Some("qty"));
        assert_eq!(
            repeated(r#"{"user":"u","request_id":"a9","request_id":"a8"}"#).as_deref(),
            Some("request_id")
        );
        assert_eq!(
            repeated(r#"{"qty":1,"q\u0074y":5}"#).as_deref(),
            Some("qty")
        );
        assert_eq!(repeated(r#"{"a":{"b":1,"b":2}}"#).as_deref(), Some("a.b"));
        assert_eq!(
            repeated(r#"{"a":[{"b":1},{"c":1,"c":{}}]}"#).as_deref(),
            Some("a[1].c")
        );
        assert_eq!(repeated(r#"[{"x":1,"x":1}]"#).as_deref(), Some("[0].x"));
        for fine in [
            r#"{"qty":1,"user":"u","request_id":"r"}"#,
            r#"{"a":{"b":1},"b":{"a":1},"c":[{"a":1},{"a":2}]}"#,
            r#"{"qty":1e30,"big":18446744073709551616,"n":-3,"t":true,"z":null}"#,
            "[]",
            "5",
            // Not JSON: the parse after the check names the problem.
            "buy 1 please",
            r#"{"qty":1,"#,
        ] {
            assert_eq!(repeated(fine), None, "{fine}");
        }
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
