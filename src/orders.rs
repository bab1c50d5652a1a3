//! Orders that cannot be lost: the outbox and its consumer.
//!
//! When a SKU is loaded with the outbox on ([`LoadOptions::outbox`](crate::LoadOptions::outbox)),
//! the very script that sells (or reserves, confirms, cancels, expires) appends an event to a
//! Redis stream kept beside the segment, in the segment's slot, in the same atomic step: no sale
//! without its event, no event without its sale, on one Redis and on a cluster. A replay appends
//! nothing.
//!
//! [`Orders`] reads every segment stream of the SKUs it serves through a
//! consumer group and hands the events to a [`Handler`]. The contract a handler keeps is
//! **idempotent by request id**: an event can be delivered more than once (a consumer that died
//! after handling and before acknowledging), never zero times. The PostgreSQL handler
//! (module `postgres`, feature `postgres`) inserts one row per request id, so redelivery
//! inserts nothing twice.

use std::future::Future;

pub mod consumer;
pub mod event;
#[cfg(feature = "postgres")]
pub mod postgres;

pub use consumer::{Lag, Orders, OrdersOptions, Polled};
pub use event::{EventKind, OrderEvent};

/// What an order service does with outbox events.
///
/// `handle` gets a batch of events (from one segment stream, in stream order) and answers one
/// result per event, in the same order: `Ok` acknowledges the event, `Err(reason)` leaves it
/// pending, to be delivered again (to this or another consumer) after
/// [`OrdersOptions::min_idle`]; after [`OrdersOptions::max_deliveries`] deliveries it moves to
/// the dead-letter stream with the last reason.
///
/// Handlers must be idempotent by [`OrderEvent::request_id`]: the same event may arrive twice,
/// and events of one request (a reservation, then its confirmation or expiry) may sit in
/// different segment streams and arrive in either order.
pub trait Handler: Send + Sync + 'static {
    /// Handles `events`; one result per event, in order.
    fn handle(
        &self,
        events: &[OrderEvent],
    ) -> impl Future<Output = Vec<std::result::Result<(), String>>> + Send;
}
