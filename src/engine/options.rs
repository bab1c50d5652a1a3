//! Tunables ([`EngineOptions`], checked as a whole by [`EngineOptions::validate`]) and the
//! [`EngineBuilder`] that applies them.

use crate::error::{Error, Result};
use crate::ids::MAX_UNITS;
use std::time::Duration;

/// Tunables, with the defaults a flash sale wants.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineOptions {
    /// How long a request id's outcome is remembered when the SKU has no per-user limit, and
    /// after a reservation ended (default 24 h). With a per-user limit, a sale's record lives
    /// as long as the load generation (the user's ledger needs it).
    pub request_ttl: Duration,
    /// How long units debited by a transfer may stay in transit before any sweeper credits
    /// them home (default 5 s): the engine that moved them normally credits them within a
    /// round trip; the lease covers one that died in between.
    pub transfer_lease: Duration,
    /// How long a "segment is short" hint is trusted for skipping (default 200 ms; 0 = off).
    pub hint_ttl: Duration,
    /// How long a proven sell-out is answered from memory at most (default 1 s; 0 = off): a
    /// notification (restock, cancel, refund, expiry, reload) ends it sooner; the TTL bounds
    /// staleness when one is lost silently. Only on stores with notifications (Redis, `lua`
    /// strategy, not on a cluster); see the engine's `sold_out` module.
    pub sold_out_ttl: Duration,
    /// Largest quantity one deduction may ask for (default 10 000).
    pub max_qty: u64,
    /// Per-user limit for SKUs loaded without one of their own (default 1 = one unit per
    /// user; 0 = no limit); see [`LoadOptions::per_user_limit`].
    pub per_user_limit: u64,
    /// Lifetime of the in-process guard's entries (default 60 s).
    pub guard_ttl: Duration,
    /// Most entries the in-process guard holds (default 100 000).
    pub guard_cap: usize,
    /// SKUs that get their own `sku` label on the remaining-units gauges.
    pub metric_skus: Vec<String>,
    /// Besides `metric_skus`, how many SKUs get a label on first sight (default 16); the
    /// rest are not exported per SKU, which keeps label cardinality bounded.
    pub metric_sku_cap: usize,
    /// The outbox for SKUs loaded without saying (default false); see
    /// [`LoadOptions::outbox`].
    pub outbox: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            request_ttl: Duration::from_secs(24 * 3600),
            transfer_lease: Duration::from_secs(5),
            hint_ttl: Duration::from_millis(200),
            sold_out_ttl: Duration::from_secs(1),
            max_qty: 10_000,
            per_user_limit: 1,
            guard_ttl: Duration::from_secs(60),
            guard_cap: 100_000,
            metric_skus: Vec::new(),
            metric_sku_cap: 16,
            outbox: false,
        }
    }
}

impl EngineOptions {
    /// Checks the options for values that cannot work together.
    ///
    /// # Errors
    /// [`Error::Config`] naming the option.
    pub fn validate(&self) -> Result<()> {
        // Every duration ends up as milliseconds added to the server clock inside a script;
        // a year bounds them far below what a Lua double holds exactly.
        let durations = [
            ("request_ttl", self.request_ttl),
            ("transfer_lease", self.transfer_lease),
            ("hint_ttl", self.hint_ttl),
            ("sold_out_ttl", self.sold_out_ttl),
            ("guard_ttl", self.guard_ttl),
        ];
        for (name, d) in durations {
            if d > MAX_DURATION {
                return Err(Error::Config(format!(
                    "{name} must be at most {} days",
                    MAX_DURATION.as_secs() / 86_400
                )));
            }
        }
        let ms = |d: Duration| d.as_millis();
        if ms(self.request_ttl) == 0 || ms(self.transfer_lease) == 0 {
            return Err(Error::Config(
                "request_ttl and transfer_lease must be at least 1 ms".into(),
            ));
        }
        if self.max_qty == 0 || self.max_qty > MAX_UNITS {
            return Err(Error::Config(format!("max_qty must be in 1..={MAX_UNITS}")));
        }
        if self.per_user_limit > MAX_UNITS {
            return Err(Error::Config(format!(
                "per_user_limit must be at most {MAX_UNITS}"
            )));
        }
        if ms(self.guard_ttl) == 0 || self.guard_cap == 0 {
            return Err(Error::Config(
                "guard_ttl and guard_cap must be positive".into(),
            ));
        }
        if self.guard_cap > MAX_GUARD_CAP {
            return Err(Error::Config(format!(
                "guard_cap must be at most {MAX_GUARD_CAP}"
            )));
        }
        if self.metric_sku_cap > 10_000 || self.metric_skus.len() > 10_000 {
            return Err(Error::Config(
                "metric_sku_cap and metric_skus allow at most 10000 labelled SKUs".into(),
            ));
        }
        Ok(())
    }
}

/// Longest duration any option may have (one year).
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Most entries the in-process guard may be configured to hold.
pub const MAX_GUARD_CAP: usize = 100_000_000;

/// Builds an [`Engine`](crate::Engine).
#[derive(Debug, Clone, Default)]
pub struct EngineBuilder {
    pub(super) opts: EngineOptions,
}

impl EngineBuilder {
    /// Starts from given options (e.g. from [`crate::config::Config`]).
    pub fn with_options(opts: EngineOptions) -> Self {
        Self { opts }
    }
    /// See [`EngineOptions::request_ttl`].
    pub fn request_ttl(mut self, d: Duration) -> Self {
        self.opts.request_ttl = d;
        self
    }
    /// See [`EngineOptions::transfer_lease`].
    pub fn transfer_lease(mut self, d: Duration) -> Self {
        self.opts.transfer_lease = d;
        self
    }
    /// See [`EngineOptions::hint_ttl`].
    pub fn hint_ttl(mut self, d: Duration) -> Self {
        self.opts.hint_ttl = d;
        self
    }
    /// See [`EngineOptions::sold_out_ttl`].
    pub fn sold_out_ttl(mut self, d: Duration) -> Self {
        self.opts.sold_out_ttl = d;
        self
    }
    /// See [`EngineOptions::max_qty`].
    pub fn max_qty(mut self, n: u64) -> Self {
        self.opts.max_qty = n;
        self
    }

    /// See [`EngineOptions::per_user_limit`].
    pub fn per_user_limit(mut self, n: u64) -> Self {
        self.opts.per_user_limit = n;
        self
    }
    /// See [`EngineOptions::guard_ttl`] and [`EngineOptions::guard_cap`].
    pub fn guard(mut self, ttl: Duration, cap: usize) -> Self {
        self.opts.guard_ttl = ttl;
        self.opts.guard_cap = cap;
        self
    }
}

/// How [`Engine::load`](crate::Engine::load) loads a SKU: `LoadOptions::new(8).replace(true).per_user_limit(2)`.
///
/// There is no `Default`: the segment count is the one choice every load must make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadOptions {
    /// Segments the stock is split over (1..=[`MAX_SEGMENTS`](crate::ids::MAX_SEGMENTS)).
    pub segments: u32,
    /// Replace a SKU that is loaded already, starting a new generation (default false: an
    /// existing SKU is refused with [`Error::AlreadyLoaded`]).
    pub replace: bool,
    /// Units one user may hold (sold or reserved) at most; 0 = no limit. `None` (default):
    /// the engine's [`EngineOptions::per_user_limit`].
    pub per_user_limit: Option<u64>,
    /// Every script that sells, reserves, confirms, cancels or expires units of this SKU also
    /// appends an event to the segment's outbox stream, in the same atomic step (see
    /// [`crate::orders`]); `None` (default): the engine's [`EngineOptions::outbox`]. Stored
    /// with the generation, so every instance appends or none does. Redis stores only.
    pub outbox: Option<bool>,
}

impl LoadOptions {
    /// `segments` segments, no replace, the engine's per-user limit.
    pub fn new(segments: u32) -> Self {
        Self {
            segments,
            replace: false,
            per_user_limit: None,
            outbox: None,
        }
    }

    /// See [`LoadOptions::replace`](#structfield.replace).
    pub fn replace(mut self, replace: bool) -> Self {
        self.replace = replace;
        self
    }

    /// See [`LoadOptions::per_user_limit`](#structfield.per_user_limit).
    pub fn per_user_limit(mut self, limit: u64) -> Self {
        self.per_user_limit = Some(limit);
        self
    }

    /// See [`LoadOptions::outbox`](#structfield.outbox).
    pub fn outbox(mut self, on: bool) -> Self {
        self.outbox = Some(on);
        self
    }
}
