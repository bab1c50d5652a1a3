//! A request ([`Deduct`]), what a call does with it ([`Intent`]), and the context one attempt
//! of it shares between its steps ([`Attempt`]).

use super::{Deduction, Engine, Layout};
use crate::error::{Error, Result};
use crate::ids::{RequestId, Sku, UserId};
use crate::segments::home;
use crate::store::{Credit, RequestKind, SegAddr, SellArgs, Store};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Instant;

/// A deduction request: `qty` units of `sku` for `user`, idempotent by `request_id`.
///
/// Request ids are scoped per (SKU, user), as idempotency keys are per account: the same id
/// sent for another user is another request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deduct {
    /// The SKU.
    pub sku: Sku,
    /// The buyer.
    pub user: UserId,
    /// Units wanted (1..=`max_qty`).
    pub qty: u64,
    /// Idempotency key: resend the same request with the same id.
    pub request_id: RequestId,
}

impl Deduct {
    /// Builds a request from raw text, validating the ids (the quantity is checked by the
    /// engine against its `max_qty`).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the first invalid field.
    pub fn new(sku: &str, user: &str, qty: u64, request_id: &str) -> Result<Self> {
        Ok(Self {
            sku: Sku::new(sku)?,
            user: UserId::new(user)?,
            qty,
            request_id: RequestId::new(request_id)?,
        })
    }
}

/// What a call does with its request's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Intent {
    /// Sell them.
    Sale,
    /// Hold them for `ttl_ms`; they go back by themselves unless confirmed.
    Reserve {
        /// The reservation's lifetime (> 0).
        ttl_ms: u64,
    },
    /// Hold them for an order whose deadline is about `hint_ms` away; they end only as the
    /// order's decision settles them.
    Hold {
        /// The sweeper's hint: when to ask the order (> 0).
        hint_ms: u64,
    },
}

impl Intent {
    /// The kind the request's record carries.
    pub(crate) fn kind(self) -> RequestKind {
        match self {
            Intent::Sale => RequestKind::Sale,
            Intent::Reserve { .. } => RequestKind::Reservation,
            Intent::Hold { .. } => RequestKind::OrderItem,
        }
    }

    /// How long units taken now stay held before they go back by themselves (0: sold).
    pub(crate) fn hold_ms(self) -> u64 {
        match self {
            Intent::Reserve { ttl_ms } => ttl_ms,
            Intent::Hold { hint_ms } => hint_ms,
            Intent::Sale => 0,
        }
    }
}

/// One attempt of a request in one layout: what every step of a deduction needs, worked out
/// once (the home segment, the record TTL).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attempt<'a> {
    /// The request.
    pub(crate) req: &'a Deduct,
    /// The SKU's layout this attempt runs in (a reload makes it `Stale`).
    pub(crate) layout: &'a Arc<Layout>,
    /// What the call does with the units.
    pub(crate) intent: Intent,
    /// The request's home segment in this layout.
    pub(crate) home: u32,
    /// How long the request's record is remembered without a per-user limit (ms).
    ttl_ms: u64,
    /// Where segment calls are counted for metrics (`None`: not measured).
    trace: Option<&'a Trace>,
}

impl<'a> Attempt<'a> {
    /// This attempt, with its segment calls counted in `trace`.
    pub(super) fn traced(self, trace: &'a Trace) -> Self {
        Self {
            trace: Some(trace),
            ..self
        }
    }

    /// The call's start (see [`Trace::start`]), or now when it is not traced.
    pub(super) fn now(&self) -> std::time::Instant {
        self.trace.map_or_else(std::time::Instant::now, |t| t.start)
    }

    /// Counts a segment script that could take or move units (for metrics).
    pub(super) fn tried(&self) {
        if let Some(t) = self.trace {
            t.tried();
        }
    }

    /// Segment `index` of this attempt's layout.
    pub(crate) fn at(&self, index: u32) -> SegAddr<'a> {
        self.layout.seg(index)
    }

    /// The request's home segment, where its record and its user's ledger live.
    pub(crate) fn home_at(&self) -> SegAddr<'a> {
        self.at(self.home)
    }

    /// The request as `sell` takes it, crediting `credits` first.
    pub(crate) fn sell_args<'c>(&self, credits: &'c [Credit]) -> SellArgs<'c>
    where
        'a: 'c,
    {
        SellArgs {
            request_id: &self.req.request_id,
            user: &self.req.user,
            qty: self.req.qty,
            resv_ttl_ms: self.intent.hold_ms(),
            order_item: matches!(self.intent, Intent::Hold { .. }),
            ttl_ms: self.ttl_ms,
            credits,
            fence: 0,
        }
    }

    /// An applied request's answer: all its units at home.
    pub(crate) fn applied(&self) -> Deduction {
        Deduction::Applied {
            segment: self.home,
            units: self.req.qty,
        }
    }

    /// A replayed request's answer: all its units at home, back then.
    pub(crate) fn replayed(&self) -> Deduction {
        Deduction::Replayed {
            segment: self.home,
            units: self.req.qty,
        }
    }

    /// The key sold out from memory remembers this request by.
    pub(super) fn sold_out_key(&self) -> (&'a UserId, &'a RequestId) {
        (&self.req.user, &self.req.request_id)
    }

    /// The request id is taken by another request (its `field` differs).
    pub(super) fn conflict(&self, field: &'static str) -> Error {
        Error::RequestIdConflict {
            request_id: self.req.request_id.to_string(),
            field,
        }
    }
}

/// Metrics bookkeeping of one call (an atomic so the futures stay `Send`).
#[derive(Debug)]
pub(super) struct Trace {
    /// When the call began: its latency's start, and the time the guard, the hints and the
    /// gauges stamp it with (one clock read per call instead of one per stamp; none of them
    /// needs finer than the call's own length).
    pub(super) start: Instant,
    /// Segment scripts sent that could take or move units.
    pub(super) tries: AtomicU32,
}

impl Trace {
    /// A call beginning now.
    pub(super) fn begin() -> Self {
        Self {
            start: Instant::now(),
            tries: AtomicU32::new(0),
        }
    }

    /// Counts one segment script that could take or move units.
    pub(super) fn tried(&self) {
        self.tries.fetch_add(1, Relaxed);
    }
}

impl<S: Store> Engine<S> {
    /// `req`'s attempt in layout `l`, for a call that does `intent`.
    pub(crate) fn attempt<'a>(
        &self,
        l: &'a Arc<Layout>,
        req: &'a Deduct,
        intent: Intent,
    ) -> Attempt<'a> {
        Attempt {
            req,
            layout: l,
            intent,
            home: home(&req.user, &req.request_id, l.segments, l.user_limit > 0),
            ttl_ms: self.inner.opts.request_ttl.as_millis() as u64,
            trace: None,
        }
    }
}
