//! The consumer: reads segment streams through a consumer group, hands events to a
//! [`Handler`](super::Handler), acknowledges, claims what dead consumers left, dead-letters
//! poison events and trims what every group has acknowledged.

use std::time::Duration;

/// Options of an [`Orders`] consumer.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OrdersOptions {
    /// Consumer group name (every instance of one order service shares it).
    pub group: String,
    /// This consumer's name within the group (unique per process).
    pub consumer: String,
    /// SKUs served; empty = every SKU with an outbox.
    pub skus: Vec<crate::ids::Sku>,
    /// Most entries read per stream per call.
    pub batch: usize,
    /// An entry pending this long (its consumer died, or its handler failed) is claimed.
    pub min_idle: Duration,
    /// Deliveries after which a failing event moves to the dead-letter stream.
    pub max_deliveries: u64,
    /// How often streams and SKUs are discovered again.
    pub discover_every: Duration,
    /// Longest sleep when every stream is empty.
    pub idle_sleep: Duration,
}

/// A running outbox consumer (see the [module docs](super)).
#[derive(Debug)]
pub struct Orders {
    _private: (),
}
