//! Validated identifiers and quantities.
//!
//! SKU, user and request ids end up inside Redis key names, and the SKU inside a Redis Cluster
//! hash tag. Only the text between the first `{` and the next `}` is hashed, so a SKU such as
//! `a}x{b` would land in SKU `a`'s slot and `{}` would make keys hash whole (CROSSSLOT errors).
//!
//! - **SKUs** are whitelisted: ASCII letters, digits and `_ . -`. A SKU names keys, hash tags,
//!   metric labels and notification messages, where `#`, `@`, `:` and `~` are separators.
//! - **User and request ids** are the ids services already have — e-mail addresses, UUIDs,
//!   ULIDs, `+`, `/`, `@`, `:`, `~`, `%`, non-ASCII letters — up to [`MAX_ID_LEN`] bytes of
//!   UTF-8. Refused are only what would change a key or a stored text's meaning: `{` and `}`
//!   (hash tags), whitespace (the stores' field separator) and control characters. They never
//!   name a hash tag (a user's keys take the segment's tag), and a
//!   [`ReservationId`](crate::ReservationId) escapes `!`, `~` and `%` in them.
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
    check_len(field, s, max)?;
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

fn check_len(field: &'static str, s: &str, max: usize) -> Result<()> {
    if s.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if s.len() > max {
        return Err(Error::invalid(field, format!("longer than {max} bytes")));
    }
    Ok(())
}

/// A user or request id: any UTF-8 text of 1..=`max` bytes without braces, whitespace or
/// control characters (see the module docs).
fn check_external(field: &'static str, s: &str, max: usize, _: &[u8]) -> Result<()> {
    check_len(field, s, max)?;
    // The common case, printable ASCII, byte by byte: every ASCII whitespace or control
    // character is below `!` or DEL (the character test below says the same of them).
    if s.bytes()
        .all(|b| (b'!'..0x7f).contains(&b) && b != b'{' && b != b'}')
    {
        return Ok(());
    }
    if let Some(c) = s
        .chars()
        .find(|&c| c == '{' || c == '}' || c.is_whitespace() || c.is_control())
    {
        return Err(Error::invalid(
            field,
            format!("contains {c:?}; braces, whitespace and control characters are not allowed"),
        ));
    }
    Ok(())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $field:literal, $check:ident, $max:expr, $extra:expr) => {
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
            /// character the type does not allow (see the type's docs).
            pub fn new(s: impl AsRef<str>) -> Result<Self> {
                let s = s.as_ref();
                $check($field, s, $max, $extra)?;
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

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            /// Validates as [`new`](Self::new) does.
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Self::new(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

id_type!(
    /// A SKU id: `[A-Za-z0-9_.-]{1,64}`.
    Sku, "sku", check, MAX_SKU_LEN, b"_.-"
);
id_type!(
    /// A user id: 1..=128 bytes of UTF-8 without `{`, `}`, whitespace or control characters
    /// (`alice@example.com`, `0b7e…-uuid`, `Zoë`, `tenant/42`).
    UserId, "user", check_external, MAX_ID_LEN, b""
);
id_type!(
    /// A request id (idempotency key): 1..=128 bytes of UTF-8 without `{`, `}`, whitespace
    /// or control characters (UUIDs, ULIDs, `order+1/2`).
    RequestId, "request_id", check_external, MAX_ID_LEN, b""
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

/// A user or request id inside a composite id (a [`ReservationId`](crate::ReservationId), an
/// [`OrderId`](crate::OrderId)): `!` as `!!`, `~` (the separator) as `!t` and
/// `%` as `!p`, so the five parts split back whatever the ids hold, and the id has no `%`
/// (percent-encoding it for a URL path, as for any path segment, never meets an escape of
/// ours; ids holding `/`, `?` or `#` must be percent-encoded there).
pub(crate) fn escape(id: &str) -> std::borrow::Cow<'_, str> {
    if !id.contains(['!', '~', '%']) {
        return id.into();
    }
    let mut out = String::with_capacity(id.len() + 8);
    for c in id.chars() {
        match c {
            '!' => out.push_str("!!"),
            '~' => out.push_str("!t"),
            '%' => out.push_str("!p"),
            c => out.push(c),
        }
    }
    out.into()
}

/// [`escape`] undone; `None` for a `!` not followed by `!`, `t` or `p`, or a `%`.
pub(crate) fn unescape(part: &str) -> Option<std::borrow::Cow<'_, str>> {
    if part.contains('%') {
        return None;
    }
    if !part.contains('!') {
        return Some(part.into());
    }
    let mut out = String::with_capacity(part.len());
    let mut chars = part.chars();
    while let Some(c) = chars.next() {
        out.push(match c {
            '!' => match chars.next()? {
                '!' => '!',
                't' => '~',
                'p' => '%',
                _ => return None,
            },
            c => c,
        });
    }
    Some(out.into())
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
        for good in [
            "alice@example.com",
            "0b7e9a1c-5d2f-4e8a-9b3c-7f1e2d3c4b5a",
            "01J9Z8K3M4N5P6Q7R8S9T0V1W2",
            "order+1/2",
            "tenant/42#7",
            "Zoë-東京",
            "a~b%7E",
        ] {
            assert!(UserId::new(good).is_ok(), "{good:?}");
            assert!(RequestId::new(good).is_ok(), "{good:?}");
        }
        // A byte bound, not a character one: 42 three-byte characters fit, 43 do not.
        assert!(UserId::new("東".repeat(42)).is_ok());
        assert!(UserId::new("東".repeat(43)).is_err());
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
        for bad in [
            "",
            "u{1}",
            "u}",
            "u 1",
            "u\t",
            "u\r\n",
            "u\0",
            "u\u{7f}",
            "u\u{85}",
            "u\u{a0}",
            "u\u{2028}",
            "u\u{3000}",
        ] {
            assert!(
                matches!(
                    UserId::new(bad),
                    Err(Error::InvalidInput { field: "user", .. })
                ),
                "{bad:?}"
            );
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

    /// The ASCII fast path answers every character as the character rule does, alone and
    /// beside a non-ASCII one (which takes the character path).
    #[test]
    fn every_ascii_character_is_judged_by_the_rule() {
        for b in 0u8..0x80 {
            let c = char::from(b);
            let allowed = !(c == '{' || c == '}' || c.is_whitespace() || c.is_control());
            for id in [format!("a{c}b"), format!("é{c}")] {
                assert_eq!(UserId::new(&id).is_ok(), allowed, "{id:?}");
                assert_eq!(RequestId::new(&id).is_ok(), allowed, "{id:?}");
            }
        }
    }

    #[test]
    fn quantities_are_bounded() {
        assert!(check_qty("qty", 0, 10).is_err());
        assert!(check_qty("qty", 11, 10).is_err());
        assert!(check_qty("qty", 10, 10).is_ok());
    }
}
