//! Request bodies: a JSON object read field by field, and the request id from the body or the
//! `Idempotency-Key` header. Every complaint names its field.

use super::ApiError;
use crate::RequestId;
use axum::body::Bytes;
use axum::http::HeaderMap;
use serde_json::{Map, Value};

/// A JSON object body, read field by field so every complaint names its field.
pub(super) struct Body(Map<String, Value>);

impl Body {
    /// Parses `bytes` as a JSON object (an empty body is `{}`), refusing unknown fields.
    pub(super) fn parse(bytes: &Bytes, allowed: &[&str]) -> Result<Self, ApiError> {
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

    pub(super) fn u64(&self, field: &str) -> Result<Option<u64>, ApiError> {
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| ApiError::bad(field, "expected a non-negative integer")),
        }
    }

    pub(super) fn need_u64(&self, field: &str) -> Result<u64, ApiError> {
        self.u64(field)?
            .ok_or_else(|| ApiError::bad(field, "required"))
    }

    pub(super) fn str(&self, field: &str) -> Result<Option<&str>, ApiError> {
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::bad(field, "expected a string")),
        }
    }

    pub(super) fn need_str(&self, field: &str) -> Result<&str, ApiError> {
        self.str(field)?
            .ok_or_else(|| ApiError::bad(field, "required"))
    }

    pub(super) fn bool(&self, field: &str) -> Result<Option<bool>, ApiError> {
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::bad(field, "expected true or false")),
        }
    }
}

/// The request id from the body or the `Idempotency-Key` header (both: they must agree).
pub(super) fn request_id(headers: &HeaderMap, body: &Body) -> Result<Option<String>, ApiError> {
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

/// [`request_id`], required.
pub(super) fn need_request_id(headers: &HeaderMap, body: &Body) -> Result<RequestId, ApiError> {
    let r = request_id(headers, body)?.ok_or_else(|| {
        ApiError::bad(
            "request_id",
            "required (body field request_id or Idempotency-Key header)",
        )
    })?;
    Ok(RequestId::new(r)?)
}
