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
    /// The event in stream entry `entry_id` of `stream`, from its fields; `Err` names what is
    /// missing or malformed (such an entry is a poison message: it goes to the dead letters).
    pub fn from_fields(
        stream: &str,
        entry_id: &str,
        fields: &[(String, String)],
        deliveries: u64,
    ) -> Result<Self, String> {
        let get = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
                .ok_or_else(|| format!("malformed event {entry_id}: no field {name}"))
        };
        let num = |name: &str| -> Result<u64, String> {
            get(name)?
                .parse()
                .map_err(|_| format!("malformed event {entry_id}: field {name} is not a number"))
        };
        let kind = get("kind")?;
        let kind = EventKind::parse(kind)
            .ok_or_else(|| format!("malformed event {entry_id}: unknown kind {kind:?}"))?;
        let parts = crate::segments::decode_parts(get("parts")?)
            .ok_or_else(|| format!("malformed event {entry_id}: field parts"))?;
        let at_ms = entry_id
            .split_once('-')
            .and_then(|(ms, _)| ms.parse().ok())
            .ok_or_else(|| format!("malformed entry id {entry_id}"))?;
        Ok(OrderEvent {
            stream: stream.to_string(),
            entry_id: entry_id.to_string(),
            kind,
            request_id: get("rid")?.to_string(),
            sku: get("sku")?.to_string(),
            user: get("user")?.to_string(),
            units: num("units")?,
            parts,
            generation: num("gen")?,
            at_ms,
            deliveries,
        })
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(kind: &str) -> Vec<(String, String)> {
        [
            ("kind", kind),
            ("rid", "r-1"),
            ("sku", "phone"),
            ("user", "u-7"),
            ("units", "2"),
            ("parts", "3:1,5:1"),
            ("gen", "17"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    #[test]
    fn parses_what_the_scripts_write() {
        let e = OrderEvent::from_fields("s", "1700000000123-4", &fields("sold"), 2).unwrap();
        assert_eq!(e.kind, EventKind::Sold);
        assert_eq!(
            (e.units, e.generation, e.at_ms, e.deliveries),
            (2, 17, 1_700_000_000_123, 2)
        );
        assert_eq!(e.parts.len(), 2);
        for k in ["sold", "reserved", "confirmed", "cancelled", "expired"] {
            let e = OrderEvent::from_fields("s", "1-0", &fields(k), 1).unwrap();
            assert_eq!(e.kind.as_str(), k);
        }
    }

    #[test]
    fn a_malformed_event_says_what_is_wrong() {
        let err = OrderEvent::from_fields("s", "1-0", &fields("refunded"), 1).unwrap_err();
        assert!(err.contains("unknown kind"), "{err}");
        let mut f = fields("sold");
        f.retain(|(k, _)| k != "rid");
        assert!(
            OrderEvent::from_fields("s", "1-0", &f, 1)
                .unwrap_err()
                .contains("rid")
        );
        let mut f = fields("sold");
        f[4].1 = "x".into();
        assert!(
            OrderEvent::from_fields("s", "1-0", &f, 1)
                .unwrap_err()
                .contains("units")
        );
    }
}
