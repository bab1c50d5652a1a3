//! One outbox event, as the scripts write it to a segment stream and a handler receives it.
//!
//! Stream entry fields (written by the scripts; `src/store/redis/lua.rs` has the table):
//! `kind` (`sold`, `reserved`, `confirmed`, `cancelled`, `expired`), `rid` (request id), `sku`,
//! `user`, `units`, `parts` (`<segment>:<units>[,...]`, where the units are), `gen` (load
//! generation). The entry id's milliseconds are the Redis clock at the moment of the change.

use crate::segments::Part;

/// What happened to the units of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// Units sold (a sale applied, at home or through the fallback).
    Sold,
    /// Units reserved: they become sold on `Confirmed`, or return on `Cancelled`/`Expired`.
    Reserved,
    /// A reservation confirmed: its units are sold.
    Confirmed,
    /// A reservation cancelled: its units went back to the stock.
    Cancelled,
    /// A reservation expired unconfirmed: its units went back to the stock.
    Expired,
}

impl EventKind {
    /// The `kind` field's text.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Sold => "sold",
            EventKind::Reserved => "reserved",
            EventKind::Confirmed => "confirmed",
            EventKind::Cancelled => "cancelled",
            EventKind::Expired => "expired",
        }
    }

    /// Parses the `kind` field.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "sold" => EventKind::Sold,
            "reserved" => EventKind::Reserved,
            "confirmed" => EventKind::Confirmed,
            "cancelled" => EventKind::Cancelled,
            "expired" => EventKind::Expired,
            _ => return None,
        })
    }

    /// Whether the event ends the request's story (every kind but `Reserved`).
    pub fn is_final(self) -> bool {
        !matches!(self, EventKind::Reserved)
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event read from a segment stream.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OrderEvent {
    /// The stream the event is in.
    pub stream: String,
    /// The stream entry id (`<ms>-<seq>`).
    pub entry_id: String,
    /// What happened.
    pub kind: EventKind,
    /// The request (idempotency key) the event belongs to.
    pub request_id: String,
    /// The SKU.
    pub sku: String,
    /// The buyer.
    pub user: String,
    /// Units concerned.
    pub units: u64,
    /// Where the units are (segment, units).
    pub parts: Vec<Part>,
    /// The load generation.
    pub generation: u64,
    /// Redis clock at the change, in ms since the epoch (the entry id's time part).
    pub at_ms: u64,
    /// How many times the event has been delivered, this delivery included (1 = first).
    pub deliveries: u64,
}

impl OrderEvent {
    /// An event of `kind` for `units` of request `request_id` (SKU `sku`, buyer `user`), as a
    /// handler's tests build one: no stream or entry yet (`""`, `"0-0"`), no parts, generation
    /// 0, clock 0, first delivery. Set the public fields for the rest.
    pub fn new(
        kind: EventKind,
        request_id: impl Into<String>,
        sku: impl Into<String>,
        user: impl Into<String>,
        units: u64,
    ) -> Self {
        Self {
            stream: String::new(),
            entry_id: "0-0".into(),
            kind,
            request_id: request_id.into(),
            sku: sku.into(),
            user: user.into(),
            units,
            parts: Vec::new(),
            generation: 0,
            at_ms: 0,
            deliveries: 1,
        }
    }
}
