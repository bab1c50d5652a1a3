//! The request and reply bodies of the routes, as types: the handlers read and answer these,
//! and their schemas are the OpenAPI document's ([`super::openapi`]). Bounds that depend on the
//! engine's options (`qty` up to `max_qty`, `ttl_ms` up to the request TTL) are written for the
//! defaults here and set from the engine when the document is made. The id patterns below are
//! the ones the attributes spell out; the tests check them against the ids' own validation.

use super::ApiError;
use super::body::Body;
use crate::Deduction;
use crate::cart::{HeldItem, OrderState};
use crate::store::ResvState;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A SKU: ASCII letters, digits and `_ . -`, 1 to [`MAX_SKU_LEN`](crate::ids::MAX_SKU_LEN)
/// bytes.
#[cfg(test)]
pub(super) const SKU_PATTERN: &str = "^[A-Za-z0-9_.-]{1,64}$";
/// A user or request id: no brace, whitespace or control character, 1 to
/// [`MAX_ID_LEN`](crate::ids::MAX_ID_LEN) characters — and bytes of UTF-8, which a pattern
/// cannot say (the descriptions do).
#[cfg(test)]
pub(super) const ID_PATTERN: &str = "^[^{}\\s\\x00-\\x1f\\x7f-\\x9f]{1,128}$";
/// A reservation id: `<sku>~<generation>~<segment>~<user>~<request id>`, the segment below
/// [`MAX_SEGMENTS`](crate::ids::MAX_SEGMENTS), `!`, `~` and `%` in the ids escaped (`!!`,
/// `!t`, `!p`).
#[cfg(test)]
pub(super) const RESERVATION_PATTERN: &str = "^[A-Za-z0-9_.-]{1,64}~(0|[1-9][0-9]{0,14})~([0-9]|[1-9][0-9]{1,2}|10[01][0-9]|102[0-3])~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}$";
/// An order's request id: a request id of at most
/// [`MAX_ORDER_REQUEST_ID_LEN`](crate::cart::MAX_ORDER_REQUEST_ID_LEN) bytes (room for its
/// items' `#<n>`).
#[cfg(test)]
pub(super) const ORDER_REQUEST_ID_PATTERN: &str = "^[^{}\\s\\x00-\\x1f\\x7f-\\x9f]{1,125}$";
/// An order id: `<user>~<request id>`, `!`, `~` and `%` in the ids escaped as in a
/// reservation id.
#[cfg(test)]
pub(super) const ORDER_PATTERN: &str = "^(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,125}$";

/// `PUT /skus/{sku}`: load a SKU (a new generation). `null` is the same as an absent field.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LoadRequest {
    /// Units to sell.
    #[schema(minimum = 0, maximum = 999_999_999_999_i64)]
    pub stock: u64,
    /// Segments to split the stock over.
    #[schema(minimum = 1, maximum = 1024)]
    pub segments: u32,
    /// Units one user may hold (sold or reserved); 0: no limit. Absent or `null`: the
    /// engine's default (`engine.per_user_limit`, 1).
    #[schema(minimum = 0, maximum = 999_999_999_999_i64)]
    pub per_user_limit: Option<u64>,
    /// `true` reloads a SKU that is already loaded (a new generation; its sales, reservations
    /// and request ids start over); absent, `null` or `false`: a loaded SKU answers 409
    /// `already_loaded`.
    pub replace: Option<bool>,
    /// Append an order event per sale to the SKU's outbox streams. Absent or `null`: the
    /// engine's default (`engine.outbox`, false).
    pub outbox: Option<bool>,
}

/// `POST /skus/{sku}/restock`: add units. `null` is the same as an absent field.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // The schema of the body the handler reads field by field.
pub(super) struct RestockRequest {
    /// Units to add.
    #[schema(minimum = 1, maximum = 999_999_999_999_i64)]
    pub qty: u64,
    /// Makes the restock exactly-once: a re-send with the same id answers `"replayed": true`
    /// and adds nothing. Absent or `null`: a fresh id, returned in the reply (such a restock
    /// is not safe to retry).
    #[schema(pattern = "^[^{}\\s\\x00-\\x1f\\x7f-\\x9f]{1,128}$")]
    pub request_id: Option<String>,
}

/// `POST /skus/{sku}/deduct`: buy. `null` is the same as an absent field.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // The schema of the body the handler reads field by field.
pub(super) struct DeductRequest {
    /// The buyer.
    #[schema(pattern = "^[^{}\\s\\x00-\\x1f\\x7f-\\x9f]{1,128}$")]
    pub user: String,
    /// Units to buy, at most the engine's `max_qty`. Absent or `null`: 1.
    #[schema(minimum = 1, maximum = 10_000)]
    pub qty: Option<u64>,
    /// The request id that makes the sale exactly-once, scoped per (SKU, user): a retry with
    /// the same id answers `replayed`; the same id with another `qty` (or the id of a
    /// reservation) answers 409 `request_id_conflict`. 1 to 128 bytes of UTF-8.
    #[schema(pattern = "^[^{}\\s\\x00-\\x1f\\x7f-\\x9f]{1,128}$")]
    pub request_id: String,
}

/// `POST /skus/{sku}/reservations`: hold units for a while. `null` is the same as an absent
/// field.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // The schema of the body the handler reads field by field.
pub(super) struct ReserveRequest {
    /// The buyer.
    #[schema(pattern = "^[^{}\\s\\x00-\\x1f\\x7f-\\x9f]{1,128}$")]
    pub user: String,
    /// Units to hold, at most the engine's `max_qty`. Absent or `null`: 1.
    #[schema(minimum = 1, maximum = 10_000)]
    pub qty: Option<u64>,
    /// The request id that makes the reservation exactly-once, as for a sale: a retry with
    /// the same id answers `replayed`, another `qty` (or the id of a sale) 409.
    #[schema(pattern = "^[^{}\\s\\x00-\\x1f\\x7f-\\x9f]{1,128}$")]
    pub request_id: String,
    /// How long the units are held, in milliseconds on the Redis clock: at least 1 and at most
    /// the engine's request TTL (`engine.request_ttl_ms`).
    #[schema(minimum = 1, maximum = 86_400_000)]
    pub ttl_ms: u64,
}

/// `POST /orders`: hold every item of an order, or none. `null` is the same as an absent
/// field.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // The schema of the body the handler reads field by field.
pub(super) struct OrderRequest {
    /// The buyer.
    #[schema(pattern = "^[^{}\\s\\x00-\\x1f\\x7f-\\x9f]{1,128}$")]
    pub user: String,
    /// The order's request id, exactly-once per user: a retry with the same id and the same
    /// items answers the same order; the same id with other items answers 409
    /// `request_id_conflict` (`field`: `items`). 1 to 125 bytes of UTF-8 (the items' ids are
    /// `<request id>#<n>`).
    #[schema(pattern = "^[^{}\\s\\x00-\\x1f\\x7f-\\x9f]{1,125}$")]
    pub request_id: String,
    /// The items, 1 to 32; a SKU may appear more than once.
    #[schema(min_items = 1, max_items = 32)]
    pub items: Vec<OrderItemRequest>,
    /// How long the items are held before the order expires unconfirmed, in milliseconds on
    /// the clock of the order's record: at least 1 and at most the engine's request TTL
    /// (`engine.request_ttl_ms`).
    #[schema(minimum = 1, maximum = 86_400_000)]
    pub hold_ms: u64,
}

/// One item of `POST /orders`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // The schema of the body the handler reads field by field.
pub(super) struct OrderItemRequest {
    /// The SKU.
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$", example = "phone")]
    pub sku: String,
    /// Units to hold, at most the engine's `max_qty`.
    #[schema(minimum = 1, maximum = 10_000)]
    pub qty: u64,
}

/// The fields each request body may have (anything else is a 400 naming the field).
pub(super) mod fields {
    pub(in crate::http) const LOAD: &[&str] =
        &["stock", "segments", "per_user_limit", "replace", "outbox"];
    pub(in crate::http) const RESTOCK: &[&str] = &["qty", "request_id"];
    pub(in crate::http) const DEDUCT: &[&str] = &["user", "qty", "request_id"];
    pub(in crate::http) const RESERVE: &[&str] = &["user", "qty", "request_id", "ttl_ms"];
    pub(in crate::http) const ORDER: &[&str] = &["user", "request_id", "items", "hold_ms"];
    pub(in crate::http) const ORDER_ITEM: &[&str] = &["sku", "qty"];
}

impl LoadRequest {
    /// Reads the body field by field; `segments` must fit a `u32`.
    pub(super) fn read(body: &Body) -> Result<Self, ApiError> {
        body.allow(fields::LOAD)?;
        Ok(Self {
            stock: body.need_u64("stock")?,
            segments: u32::try_from(body.need_u64("segments")?)
                .map_err(|_| ApiError::invalid("segments", "too large"))?,
            per_user_limit: body.u64("per_user_limit")?,
            replace: body.bool("replace")?,
            outbox: body.bool("outbox")?,
        })
    }
}

/// 201 to `PUT /skus/{sku}`: what was loaded.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct LoadReply {
    /// The SKU.
    pub sku: String,
    /// The new load generation (the Redis clock in milliseconds at the load).
    pub generation: u64,
    /// Units loaded.
    pub stock: u64,
    /// Segments.
    pub segments: u32,
    /// The per-user limit in force (0: none).
    pub per_user_limit: u64,
    /// Whether sales append order events to the outbox.
    pub outbox: bool,
}

/// 200 to `POST /skus/{sku}/restock`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct RestockReply {
    /// The SKU.
    pub sku: String,
    /// The request id used (the one sent, or a fresh one).
    pub request_id: String,
    /// Units asked for.
    pub qty: u64,
    /// Units added by this call (0 when it replayed).
    pub added: u64,
    /// True when this request id had restocked before: nothing was added.
    pub replayed: bool,
}

/// 200 to `GET /skus/{sku}`: units left.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct StatusReply {
    /// The SKU.
    pub sku: String,
    /// Units a buyer can be sold now over all segments (the units of reservations past their
    /// expiry included: a sale returns those first). One read that writes nothing, so it
    /// answers while a master refuses writes.
    pub remaining: u64,
    /// Units moving between segments: not in `remaining`, sellable once credited.
    pub in_transit: u64,
    /// Units held by live reservations: not in `remaining`.
    pub reserved: u64,
    /// Of `remaining`, units of reservations past their expiry, on their way back to stock.
    pub expired: u64,
    /// Segments.
    pub segments: u64,
    /// Units a buyer can be sold now per segment, by index.
    pub per_segment: Vec<u64>,
}

/// Why a reservation held nothing: the `outcome` of the deduction it would have been.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)] // The schema of `ReserveReply::NotHeld::reason` (a `Deduction::kind`).
pub(super) enum NotHeldReason {
    /// No units left.
    SoldOut,
    /// Fewer units left than asked for.
    Insufficient,
    /// The user holds the per-user limit.
    LimitReached,
    /// The user has another attempt running in this process.
    UserBusy,
    /// The quantity alone is above the per-user limit (final).
    OverLimit,
}

/// 201 (`held`) or 200 (`replayed`, `not_held`) to `POST /skus/{sku}/reservations`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(super) enum ReserveReply {
    /// 201: held now; confirm or cancel it with `id` before `ttl_ms` runs out.
    Held {
        /// The reservation's id, `<sku>~<generation>~<segment>~<user>~<request id>`.
        #[schema(value_type = String, pattern = "^[A-Za-z0-9_.-]{1,64}~(0|[1-9][0-9]{0,14})~([0-9]|[1-9][0-9]{1,2}|10[01][0-9]|102[0-3])~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}$")]
        id: crate::ReservationId,
        /// The segment the units are held at (the request's home; also in `id`).
        segment: u32,
        /// Units held.
        units: u64,
    },
    /// 200: this request id reserved before; the same reservation.
    Replayed {
        /// The reservation's id.
        #[schema(value_type = String, pattern = "^[A-Za-z0-9_.-]{1,64}~(0|[1-9][0-9]{0,14})~([0-9]|[1-9][0-9]{1,2}|10[01][0-9]|102[0-3])~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}$")]
        id: crate::ReservationId,
        /// The segment the units are held at.
        segment: u32,
        /// Units held.
        units: u64,
    },
    /// 200: nothing held.
    NotHeld {
        /// Why (the deduction's `outcome`).
        #[schema(value_type = NotHeldReason)]
        reason: &'static str,
        /// The refusal, as a deduction would answer it.
        deduction: Deduction,
    },
}

/// 200 to `POST /reservations/{id}/confirm` and `/cancel`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct EndReply {
    /// The reservation's id.
    pub id: String,
    /// Its state now.
    pub state: ResvState,
    /// True when this call (or an earlier one with the same intent) brought it there; false
    /// when it had ended otherwise (e.g. confirming an expired reservation: nothing sold).
    pub done: bool,
}

/// 200 to `POST /orders`: `held`, `refused` or `ended`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(super) enum OrderHoldReply {
    /// Every item is held (by this call, or by an earlier one with this request id) until the
    /// deadline: confirm or cancel the order with `order_id`.
    Held {
        /// The order's id, `<user>~<request id>`.
        #[schema(value_type = String, pattern = "^(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,125}$")]
        order_id: crate::OrderId,
        /// The items as held, in the request's order.
        items: Vec<HeldItem>,
        /// Milliseconds left to the deadline (on the clock of the order's record).
        left_ms: u64,
    },
    /// An item could not be held: the order is refused, and nothing is held anywhere (every
    /// item it had held was given back before this answer).
    Refused {
        /// The order's id.
        #[schema(value_type = String, pattern = "^(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,125}$")]
        order_id: crate::OrderId,
        /// The first item refused, 1-based (`items[item - 1]` of the request).
        #[schema(minimum = 1, maximum = 32)]
        item: usize,
        /// Its SKU.
        #[schema(value_type = String)]
        sku: crate::Sku,
        /// Why, as a deduction would answer it (`sold_out`, `insufficient`, `limit_reached`,
        /// `over_limit`, `user_busy`).
        reason: Deduction,
    },
    /// This request id's order was decided before (confirmed, cancelled, expired; or
    /// cancelled before it was ever held): nothing was held by this call.
    Ended {
        /// The order's id.
        #[schema(value_type = String, pattern = "^(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,128}~(?:[^{}\\s\\x00-\\x1f\\x7f-\\x9f~%!]|!!|!t|!p){1,125}$")]
        order_id: crate::OrderId,
        /// Its state.
        state: OrderState,
    },
}

/// 200 to `POST /orders/{order_id}/confirm`, `/cancel` and `GET /orders/{order_id}`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct OrderEndReply {
    /// The order's id.
    pub order_id: String,
    /// Its one state, for all its items (a `GET` of an open order past its deadline reads
    /// `expired`).
    pub state: OrderState,
    /// True when this call (or an earlier one with the same intent) brought it there; false
    /// when it had ended otherwise (e.g. confirming after the deadline: `expired`, nothing
    /// sold), and always false for a `GET`.
    pub done: bool,
    /// Open (`holding`, `held`): milliseconds left to the deadline; else 0.
    pub left_ms: u64,
    /// Items (1-based) whose SKU was reloaded since they were held: a reload ends every hold
    /// of the generation it replaces, so the decision did not reach them. Empty in the normal
    /// case (always for a `GET`).
    pub reloaded: Vec<usize>,
}

/// 200 to `GET /healthz` (liveness).
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct HealthReply {
    /// Always `ok`: the process answers (the store is not asked: `GET /readyz` does).
    #[schema(example = "ok")]
    pub status: &'static str,
    /// `redis` or `memory`.
    #[schema(example = "redis")]
    pub store: &'static str,
    /// The deduction strategy (`lua`, `lock`, `redlock`, ...).
    #[schema(example = "lua")]
    pub strategy: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cart::MAX_ORDER_REQUEST_ID_LEN;
    use crate::ids::{MAX_ID_LEN, MAX_SEGMENTS, MAX_SKU_LEN};
    use crate::{OrderId, RequestId, Sku, UserId};

    /// Whether `c` is in ID_PATTERN's class as a JSON Schema validator (and schemathesis,
    /// through Python's `re`) reads it: `\s` is Unicode whitespace there.
    fn in_id_class(c: char) -> bool {
        let ws = matches!(
            c,
            '\t'..='\r' | ' ' | '\u{1c}'..='\u{1f}' | '\u{85}' | '\u{a0}' | '\u{1680}'
                | '\u{2000}'..='\u{200a}' | '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}'
                | '\u{3000}'
        );
        !(c == '{' || c == '}' || ws || c <= '\u{1f}' || ('\u{7f}'..='\u{9f}').contains(&c))
    }

    #[test]
    fn id_patterns_are_what_the_ids_accept() {
        assert_eq!(ID_PATTERN, "^[^{}\\s\\x00-\\x1f\\x7f-\\x9f]{1,128}$");
        for c in (0u32..0x3100).filter_map(char::from_u32) {
            let s = c.to_string();
            let sku = c.is_ascii_alphanumeric() || "_.-".contains(c);
            assert_eq!(Sku::new(&s).is_ok(), sku, "sku {s:?}");
            assert_eq!(UserId::new(&s).is_ok(), in_id_class(c), "user {s:?}");
            assert_eq!(RequestId::new(&s).is_ok(), in_id_class(c), "{s:?}");
        }
        assert!(SKU_PATTERN.ends_with(&format!("{{1,{MAX_SKU_LEN}}}$")));
        assert!(ID_PATTERN.ends_with(&format!("{{1,{MAX_ID_LEN}}}$")));
        assert_eq!(
            MAX_SEGMENTS, 1024,
            "RESERVATION_PATTERN's segment is 0..=1023"
        );
        let part = format!(
            "(?:{}~%!]|!!|!t|!p){{1,{MAX_ID_LEN}}}",
            &ID_PATTERN[1..ID_PATTERN.find(']').unwrap()]
        );
        let parts = [
            &SKU_PATTERN[1..SKU_PATTERN.len() - 1],
            "(0|[1-9][0-9]{0,14})",
            "([0-9]|[1-9][0-9]{1,2}|10[01][0-9]|102[0-3])",
            &part,
            &part,
        ];
        assert_eq!(RESERVATION_PATTERN, format!("^{}$", parts.join("~")));
        // An order's: the request id shorter by room for `#<item>`.
        let short = MAX_ORDER_REQUEST_ID_LEN;
        assert_eq!(
            ORDER_REQUEST_ID_PATTERN,
            ID_PATTERN.replace(&format!("{{1,{MAX_ID_LEN}}}"), &format!("{{1,{short}}}"))
        );
        let order_rid = part.replace(&format!("{{1,{MAX_ID_LEN}}}"), &format!("{{1,{short}}}"));
        assert_eq!(ORDER_PATTERN, format!("^{part}~{order_rid}$"));
        let longest = OrderId::new(
            UserId::new("u".repeat(MAX_ID_LEN)).unwrap(),
            RequestId::new("r".repeat(short)).unwrap(),
        )
        .unwrap();
        assert!(longest.to_string().parse::<OrderId>().is_ok());
        assert!(
            OrderId::new(
                UserId::new("u").unwrap(),
                RequestId::new("r".repeat(short + 1)).unwrap()
            )
            .is_err()
        );
    }
}
