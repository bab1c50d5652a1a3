//! An order's id: its user and its request id. The text form `<user>~<request id>` (with the
//! reservation ids' escapes: `!` → `!!`, `~` → `!t`, `%` → `!p`) is what the HTTP API and the
//! CLI show and take; the record's key and its items' request ids are made from it.

use crate::error::{Error, Result};
use crate::ids::{MAX_ID_LEN, RequestId, UserId, escape, unescape};

/// The most items one order may hold. Bounded so that an order's record, its hold and its
/// settlement stay small, and so that an item's request id (`<request id>#<n>`) fits the id
/// bound.
pub const MAX_ITEMS: usize = 32;

/// The longest request id an order may have: room for `#32` behind it in its items' ids.
pub const MAX_ORDER_REQUEST_ID_LEN: usize = MAX_ID_LEN - 3;

/// How many slots order records spread over (`{o<shard>}`), so that on a cluster the records
/// spread over the masters like the segments do.
pub const ORDER_SHARDS: u64 = 1024;

/// An order's id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OrderId {
    user: UserId,
    request_id: RequestId,
}

impl OrderId {
    /// The order `request_id` of `user`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (field `request_id`) when the request id is longer than
    /// [`MAX_ORDER_REQUEST_ID_LEN`].
    pub fn new(user: UserId, request_id: RequestId) -> Result<Self> {
        if request_id.as_str().len() > MAX_ORDER_REQUEST_ID_LEN {
            return Err(Error::invalid(
                "request_id",
                format!("an order's request id has at most {MAX_ORDER_REQUEST_ID_LEN} bytes"),
            ));
        }
        Ok(Self { user, request_id })
    }

    /// The user.
    pub fn user(&self) -> &UserId {
        &self.user
    }

    /// The order's request id.
    pub fn request_id(&self) -> &RequestId {
        &self.request_id
    }

    /// Item `n`'s request id (1-based): `<request id>#<n>`, at its SKU's home segment.
    pub fn item_request_id(&self, n: usize) -> RequestId {
        RequestId::new(format!("{}#{n}", self.request_id))
            .expect("bounded by MAX_ORDER_REQUEST_ID_LEN")
    }

    /// The order and item number an item's request id names (`None`: no order item's id).
    pub fn of_item(user: &UserId, item: &RequestId) -> Option<(Self, usize)> {
        let (rid, n) = item.as_str().rsplit_once('#')?;
        let n: usize = n.parse().ok().filter(|n| (1..=MAX_ITEMS).contains(n))?;
        if n.to_string() != item.as_str().rsplit_once('#')?.1 {
            return None;
        }
        let id = Self::new(user.clone(), RequestId::new(rid).ok()?).ok()?;
        Some((id, n))
    }

    /// The record's shard: `{o<shard>}` is its hash tag.
    pub fn shard(&self) -> u64 {
        crate::segments::fnv1a(self.to_string().as_bytes()) % ORDER_SHARDS
    }

    fn malformed() -> Error {
        Error::invalid("order", "expected <user>~<request id>")
    }
}

impl std::fmt::Display for OrderId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}~{}",
            escape(self.user.as_str()),
            escape(self.request_id.as_str())
        )
    }
}

impl std::str::FromStr for OrderId {
    type Err = Error;

    /// Parses the text form.
    ///
    /// # Errors
    /// [`Error::InvalidInput`]: field `user` or `request_id` for an invalid id in it, else
    /// field `order`.
    fn from_str(s: &str) -> Result<Self> {
        let mut it = s.split('~');
        let (Some(user), Some(rid), None) = (it.next(), it.next(), it.next()) else {
            return Err(Self::malformed());
        };
        let user = UserId::new(unescape(user).ok_or_else(Self::malformed)?)?;
        let rid = RequestId::new(unescape(rid).ok_or_else(Self::malformed)?)?;
        Self::new(user, rid)
    }
}

impl serde::Serialize for OrderId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for OrderId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_name_their_items() {
        let id: OrderId = "alice~cart-7".parse().unwrap();
        assert_eq!(id.user().as_str(), "alice");
        assert_eq!(id.to_string(), "alice~cart-7");
        let item = id.item_request_id(2);
        assert_eq!(item.as_str(), "cart-7#2");
        assert_eq!(OrderId::of_item(id.user(), &item), Some((id.clone(), 2)));
        for not_an_item in ["cart-7", "cart-7#0", "cart-7#33", "cart-7#02", "#1"] {
            let r = RequestId::new(not_an_item).unwrap();
            assert_eq!(OrderId::of_item(id.user(), &r), None, "{not_an_item}");
        }
        let odd =
            OrderId::new(UserId::new("a~b").unwrap(), RequestId::new("r!~").unwrap()).unwrap();
        assert_eq!(odd.to_string().parse::<OrderId>().unwrap(), odd);
        assert!("a~b~c".parse::<OrderId>().is_err());
        let long = RequestId::new("r".repeat(MAX_ORDER_REQUEST_ID_LEN + 1)).unwrap();
        assert!(OrderId::new(UserId::new("u").unwrap(), long).is_err());
        assert!(id.shard() < ORDER_SHARDS);
    }
}
