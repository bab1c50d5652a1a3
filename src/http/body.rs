//! Request bodies: a JSON object read field by field (a key named twice refused), and the
//! request id from the body or the `Idempotency-Key` header. Every complaint names its field.

use super::ApiError;
use super::json::{json_bytes, unique_keys};
use crate::RequestId;
use axum::extract::{FromRequest, Request};
use axum::http::HeaderMap;
use serde_json::{Map, Value};

/// A JSON object body (`Content-Type: application/json`; no body at all is `{}`), read field
/// by field so every complaint names its field.
pub(super) struct Body(Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = json_bytes(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(Map::new()));
        }
        // serde_json keeps a repeated key's last value: `{"qty":1,"qty":5}` would sell 5.
        unique_keys(&bytes)?;
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::invalid("body", format!("not JSON: {e}")))?;
        let Value::Object(m) = v else {
            return Err(ApiError::invalid("body", "expected a JSON object"));
        };
        Ok(Self(m))
    }
}

impl Body {
    /// Refuses a field not in `allowed` (a typo is an error, not a silent default).
    pub(super) fn allow(&self, allowed: &[&str]) -> Result<&Self, ApiError> {
        match self.0.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(ApiError::invalid(
                k,
                format!("unknown field; expected one of {}", allowed.join(", ")),
            )),
            None => Ok(self),
        }
    }

    /// A non-negative integer; JSON writes integers as `2` or `2.0` alike (JSON Schema's
    /// `integer`), so an integral float is its integer, up to 2^53 where doubles stay exact.
    pub(super) fn u64(&self, field: &str) -> Result<Option<u64>, ApiError> {
        const EXACT: f64 = (1u64 << 53) as f64;
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
                (Some(u), _) => Ok(Some(u)),
                (None, Some(f)) if f >= 0.0 && f.fract() == 0.0 && f <= EXACT => Ok(Some(f as u64)),
                (None, Some(f)) if f > EXACT && f.fract() == 0.0 => {
                    Err(ApiError::invalid(field, "too large"))
                }
                _ => Err(ApiError::invalid(field, "expected a non-negative integer")),
            },
            Some(_) => Err(ApiError::invalid(field, "expected a non-negative integer")),
        }
    }

    pub(super) fn need_u64(&self, field: &str) -> Result<u64, ApiError> {
        self.u64(field)?
            .ok_or_else(|| ApiError::invalid(field, "required"))
    }

    pub(super) fn str(&self, field: &str) -> Result<Option<&str>, ApiError> {
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::invalid(field, "expected a string")),
        }
    }

    pub(super) fn need_str(&self, field: &str) -> Result<&str, ApiError> {
        self.str(field)?
            .ok_or_else(|| ApiError::invalid(field, "required"))
    }

    /// An array of JSON objects, each read as a body of its own (the caller names their
    /// fields `<field>[<index>].<name>` with [`ApiError::within`]); `None` when absent or
    /// `null`.
    pub(super) fn objects(&self, field: &str) -> Result<Option<Vec<Body>>, ApiError> {
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::Object(m) => Ok(Body(m.clone())),
                    _ => Err(ApiError::invalid(
                        &format!("{field}[{i}]"),
                        "expected a JSON object",
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(ApiError::invalid(field, "expected an array")),
        }
    }

    pub(super) fn bool(&self, field: &str) -> Result<Option<bool>, ApiError> {
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::invalid(field, "expected true or false")),
        }
    }
}

/// The request id from the body or the `Idempotency-Key` header (both: they must agree).
pub(super) fn request_id(headers: &HeaderMap, body: &Body) -> Result<Option<String>, ApiError> {
    let from_header = match headers.get("idempotency-key") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::invalid("Idempotency-Key", "not visible ASCII"))?
                .to_string(),
        ),
    };
    let from_body = body.str("request_id")?;
    match (from_body, from_header) {
        (Some(b), Some(h)) if b != h => Err(ApiError::invalid(
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
        ApiError::invalid(
            "request_id",
            "required (body field request_id or Idempotency-Key header)",
        )
    })?;
    Ok(RequestId::new(r)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qty(json: &str) -> Result<Option<u64>, u16> {
        let Value::Object(m) = serde_json::from_str(json).unwrap() else {
            panic!()
        };
        Body(m).u64("qty").map_err(|e| e.status().as_u16())
    }

    #[test]
    fn integers_may_be_written_as_integral_floats() {
        assert_eq!(qty(r#"{"qty": 2}"#), Ok(Some(2)));
        assert_eq!(qty(r#"{"qty": 2.0}"#), Ok(Some(2)));
        assert_eq!(qty(r#"{"qty": 0.0}"#), Ok(Some(0)));
        assert_eq!(qty(r#"{"qty": null}"#), Ok(None));
        assert_eq!(qty(r#"{}"#), Ok(None));
        for bad in [
            "2.5",
            "-1",
            "-1.0",
            "1e30",
            "\"2\"",
            "true",
            "18446744073709551616",
        ] {
            assert_eq!(qty(&format!(r#"{{"qty": {bad}}}"#)), Err(400), "{bad}");
        }
    }
}
