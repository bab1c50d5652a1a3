//! Validated identifiers and quantities.
//!
//! SKU, user and request ids end up inside Redis key names, and the SKU inside a Redis Cluster
//! hash tag. Only the text between the first `{` and the next `}` is hashed, so a SKU such as
//! `a}x{b` would land in SKU `a`'s slot and `{}` would make keys hash whole (CROSSSLOT errors).
//! Rather than escaping, ids are whitelisted: ASCII letters, digits and `_ . : -` (SKUs also
//! exclude `:`). Anything else — braces, spaces, control characters, non-ASCII, empty or
//! over-long ids — is rejected before any I/O; so `#` and `@` (hash-tag separators in key
//! names, see [`crate::segments`]) and `~` (the separator of a
//! [`ReservationId`](crate::ReservationId)) never occur in an id.

use crate::error::{Error, Result};
use std::fmt;

/// Longest SKU id, in bytes.
pub const MAX_SKU_LEN: usize = 64;
/// Longest user or request id, in bytes (the Lua scripts enforce the same bound).
pub const MAX_ID_LEN: usize = 128;
/// Upper bound for any stock figure (load, restock, a segment). Keeps every sum exact in a Lua
/// double (< 2^53) and in `i64`.
pub const MAX_UNITS: u64 = 999_999_999_999;
/// Largest number of segments a SKU may be split into.
pub const MAX_SEGMENTS: u32 = 1024;

fn check(field: &'static str, s: &str, max: usize, extra: &[u8]) -> Result<()> {
    if s.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if s.len() > max {
        return Err(Error::invalid(field, format!("longer than {max} bytes")));
    }
    if let Some(c) = s
        .bytes()
        .find(|b| !(b.is_ascii_alphanumeric() || extra.contains(b)))
    {
        let shown = if c.is_ascii_graphic() {
            format!("{:?}", c as char)
        } else {
            format!("byte 0x{c:02x}")
        };
        let allowed = String::from_utf8_lossy(extra);
        return Err(Error::invalid(
            field,
            format!("contains {shown}; allowed are ASCII letters, digits and {allowed}"),
        ));
    }
    Ok(())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $field:literal, $max:expr, $extra:expr) => {
        $(#[$doc])*
        ///
        /// Cloning is cheap (a shared, reference-counted string): the engine and the
        /// embedded store keep copies of ids in records and indexes without copying the text.
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(std::sync::Arc<str>);

        impl $name {
            /// Validates `s`.
            ///
            /// # Errors
            /// [`Error::InvalidInput`] naming the field when `s` is empty, too long or has a
            /// character outside the whitelist.
            pub fn new(s: impl AsRef<str>) -> Result<Self> {
                let s = s.as_ref();
                check($field, s, $max, $extra)?;
                Ok(Self(s.into()))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self> {
                Self::new(s)
            }
        }
    };
}

id_type!(
    /// A SKU id: `[A-Za-z0-9_.-]{1,64}`.
    Sku, "sku", MAX_SKU_LEN, b"_.-"
);
id_type!(
    /// A user id: `[A-Za-z0-9_.:-]{1,128}`.
    UserId, "user", MAX_ID_LEN, b"_.:-"
);
id_type!(
    /// A request id (idempotency key): `[A-Za-z0-9_.:-]{1,128}`.
    RequestId, "request_id", MAX_ID_LEN, b"_.:-"
);

/// Validates a key prefix (namespace): same charset as user ids, at most 32 bytes.
pub(crate) fn check_prefix(p: &str) -> Result<()> {
    check("key_prefix", p, 32, b"_.:-")
}

/// Checks a unit count: `1..=max`.
pub(crate) fn check_qty(field: &'static str, qty: u64, max: u64) -> Result<()> {
    if qty == 0 {
        return Err(Error::invalid(field, "must be greater than zero"));
    }
    if qty > max {
        return Err(Error::invalid(field, format!("must be at most {max}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_whitelist() {
        assert!(Sku::new("iphone-17_pro.256").is_ok());
        assert!(UserId::new("user:42").is_ok());
        assert!(RequestId::new("0b7e-12:ab_CD.9").is_ok());
        assert!(Sku::new("a".repeat(MAX_SKU_LEN)).is_ok());
        assert!(RequestId::new("r".repeat(MAX_ID_LEN)).is_ok());
    }

    #[test]
    fn rejects_what_breaks_keys_or_logs() {
        for bad in [
            "", "a}x{b", "{}", "{a}", "a b", "a\nb", "a\0", "é", "a#1", "a:1", "a/b", "a*",
        ] {
            let e = Sku::new(bad).unwrap_err();
            assert!(
                matches!(e, Error::InvalidInput { field: "sku", .. }),
                "{bad:?}"
            );
        }
        for bad in ["", "u{1}", "u}", "u 1", "u\t", "ü", "u\r\n"] {
            assert!(matches!(
                UserId::new(bad),
                Err(Error::InvalidInput { field: "user", .. })
            ));
            assert!(matches!(
                RequestId::new(bad),
                Err(Error::InvalidInput {
                    field: "request_id",
                    ..
                })
            ));
        }
        assert!(Sku::new("a".repeat(MAX_SKU_LEN + 1)).is_err());
        assert!(UserId::new("u".repeat(MAX_ID_LEN + 1)).is_err());
    }

    #[test]
    fn quantities_are_bounded() {
        assert!(check_qty("qty", 0, 10).is_err());
        assert!(check_qty("qty", 11, 10).is_err());
        assert!(check_qty("qty", 10, 10).is_ok());
    }
}
