//! Request coalescing's options ([`Coalescing`]) and figures ([`CoalesceStats`]): plain values,
//! apart from the lanes that act on them (`batch`), so the config and the store's interface
//! can name them without depending on the Redis store.

use crate::error::{Error, Result};
use std::time::Duration;

/// Tuning of request coalescing: concurrent `lua` sales bound for one home segment go to Redis
/// as one `sell.lua` call, each request keeping its own record, checks and reply.
///
/// Whatever arrives while a segment's call is out goes in its next call (group commit). A
/// segment's queue with nothing in flight sends at once when the store has no call out (an
/// idle store adds no latency) or when it holds as many requests as the calls out carry on
/// average; otherwise it waits for calls to come back, at most two rounds of them, so a busy
/// store sends fewer, fuller calls (docs/capacity.md).
///
/// ```
/// use shardstock::Coalescing;
/// let c = Coalescing::default().max_batch(128).max_in_flight(4);
/// assert!(c.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Coalescing {
    /// Most requests in one script call (1..=1000).
    pub max_batch: usize,
    /// How long a lane may wait for more requests before sending (zero = send at once; the
    /// batch is whatever queued while earlier calls were in flight). Below 1 ms the wait yields
    /// to the scheduler instead of sleeping (Tokio timers tick in milliseconds).
    pub window: Duration,
    /// Script calls a lane may have in flight at once (≥ 1; default 3). With fewer, one hot
    /// segment's calls leave Redis and the client idle in turn at moderate load; with more,
    /// a busy lane splits its batches into more calls. A further call goes only once
    /// `max_batch`/8 requests wait and they are as many as the calls out carry on average.
    /// Measured in docs/benchmarks.md ("Calls in flight per lane").
    pub max_in_flight: usize,
}

impl Default for Coalescing {
    fn default() -> Self {
        Self {
            max_batch: 64,
            window: Duration::ZERO,
            max_in_flight: 3,
        }
    }
}

impl Coalescing {
    /// Sets [`max_batch`](Self::max_batch).
    #[must_use]
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n;
        self
    }

    /// Sets [`window`](Self::window).
    #[must_use]
    pub fn window(mut self, d: Duration) -> Self {
        self.window = d;
        self
    }

    /// Sets [`max_in_flight`](Self::max_in_flight).
    #[must_use]
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }

    /// Checks the bounds.
    ///
    /// # Errors
    /// [`Error::Config`] naming the bad field.
    pub fn validate(&self) -> Result<()> {
        if !(1..=1000).contains(&self.max_batch) {
            return Err(Error::Config("coalesce max_batch must be 1..=1000".into()));
        }
        if self.max_in_flight == 0 || self.max_in_flight > 64 {
            return Err(Error::Config(
                "coalesce max_in_flight must be 1..=64".into(),
            ));
        }
        if self.window > Duration::from_millis(100) {
            return Err(Error::Config(
                "coalesce window must be at most 100 ms".into(),
            ));
        }
        Ok(())
    }
}

/// Request coalescing as configured, with what it did so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CoalesceStats {
    /// The options in force.
    pub options: Coalescing,
    /// Coalesced script calls sent.
    pub calls: u64,
    /// Requests they carried.
    pub requests: u64,
}
