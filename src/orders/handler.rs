//! The contract between the outbox's consumer and an order service: a [`Handler`] takes
//! delivered events and answers, per event, whether it is done.

use super::event::OrderEvent;
use std::future::Future;

/// What an order service does with outbox events.
///
/// `handle` gets a batch of events (from one segment stream, in stream order) and answers one
/// result per event, in the same order: `Ok` acknowledges the event, `Err(reason)` leaves it
/// pending, to be delivered again (to this or another consumer) after
/// [`OrdersOptions::min_idle`](super::OrdersOptions::min_idle); after [`OrdersOptions::max_deliveries`](super::OrdersOptions::max_deliveries) deliveries it moves to
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
