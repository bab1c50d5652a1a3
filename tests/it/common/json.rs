//! Typed field access on the binary's `--json` output: a missing or mistyped field fails the
//! test with the whole object in the message.

use serde_json::Value;

/// A non-negative integer field; panics when missing or of another type.
pub fn u(v: &Value, field: &str) -> u64 {
    v.get(field)
        .unwrap_or_else(|| panic!("field {field:?} missing in {v}"))
        .as_u64()
        .unwrap_or_else(|| panic!("field {field:?} is not an unsigned integer in {v}"))
}

/// A number field.
pub fn f(v: &Value, field: &str) -> f64 {
    v.get(field)
        .unwrap_or_else(|| panic!("field {field:?} missing in {v}"))
        .as_f64()
        .unwrap_or_else(|| panic!("field {field:?} is not a number in {v}"))
}

/// A boolean field.
pub fn b(v: &Value, field: &str) -> bool {
    v.get(field)
        .unwrap_or_else(|| panic!("field {field:?} missing in {v}"))
        .as_bool()
        .unwrap_or_else(|| panic!("field {field:?} is not a boolean in {v}"))
}

/// A string field.
pub fn s<'a>(v: &'a Value, field: &str) -> &'a str {
    v.get(field)
        .unwrap_or_else(|| panic!("field {field:?} missing in {v}"))
        .as_str()
        .unwrap_or_else(|| panic!("field {field:?} is not a string in {v}"))
}
