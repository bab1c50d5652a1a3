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

pub mod consumer;
pub mod event;
mod handler;
#[cfg(feature = "postgres")]
pub mod postgres;

pub use consumer::{Lag, Orders, OrdersOptions, Polled};
pub use event::{EventKind, OrderEvent};
pub use handler::Handler;
