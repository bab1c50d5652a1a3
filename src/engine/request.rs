//! A request ([`Deduct`]), what a call does with it ([`Intent`]), and the context one attempt
//! of it shares between its steps ([`Attempt`]).

use super::deduct::Trace;
use super::{Engine, Layout};
use crate::error::{Error, Result};
use crate::ids::{RequestId, Sku, UserId};
use crate::segments::{Part, home};
use crate::store::{HomeRecord, RecordState, ReqArgs, RequestKind, SegAddr, Store};
use std::sync::Arc;

/// A deduction request: `qty` units of `sku` for `user`, idempotent by `request_id`.
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
    /// Finish an earlier call of this kind (recovery, verification, the end of a
    /// reservation): it takes no new units, it only settles or gives back what that call took.
    Finish(RequestKind),
}

impl Intent {
    /// The kind the request's records carry.
    pub(crate) fn kind(self) -> RequestKind {
        match self {
            Intent::Sale => RequestKind::Sale,
            Intent::Reserve { .. } => RequestKind::Reservation,
            Intent::Finish(kind) => kind,
        }
    }

    /// How long units taken now stay held before they go back by themselves (0: they are
    /// sold, or nothing is taken).
    pub(crate) fn hold_ms(self) -> u64 {
        match self {
            Intent::Reserve { ttl_ms } => ttl_ms,
            Intent::Sale | Intent::Finish(_) => 0,
        }
    }
}

/// One attempt of a request in one layout: what every step of a deduction needs, worked out
/// once (the home segment, the store's view of the request).
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
    /// The request as the store's scripts take it.
    pub(crate) args: ReqArgs<'a>,
    /// Where segment tries are counted for metrics (`None`: not measured, e.g. recovery).
    trace: Option<&'a Trace>,
}

impl<'a> Attempt<'a> {
    /// This attempt, with its segment tries counted in `trace`.
    pub(super) fn traced(self, trace: &'a Trace) -> Self {
        Self {
            trace: Some(trace),
            ..self
        }
    }

    /// This attempt, known to the per-user record as `token` ([`ReqArgs::attempt`]).
    pub(super) fn token(mut self, token: u64) -> Self {
        self.args.attempt = token;
        self
    }

    /// Counts a segment script that could take units (for metrics).
    pub(super) fn tried(&self) {
        if let Some(t) = self.trace {
            t.tried();
        }
    }

    /// Segment `index` of this attempt's layout.
    pub(crate) fn at(&self, index: u32) -> SegAddr<'a> {
        self.layout.seg(index)
    }

    /// The request's home segment, where its record and claim live.
    pub(crate) fn home_at(&self) -> SegAddr<'a> {
        self.at(self.home)
    }

    /// The request id is taken by another request (its `field` differs).
    pub(super) fn conflict(&self, field: &'static str) -> Error {
        Error::RequestIdConflict {
            request_id: self.req.request_id.to_string(),
            field,
        }
    }

    /// The request id was sealed: this request can never apply.
    pub(super) fn sealed(&self) -> Error {
        Error::Sealed(self.req.request_id.to_string())
    }

    /// What the request's home record (read with [`Store::record`]) says about this request.
    pub(super) fn recorded(&self, rec: HomeRecord) -> Recorded {
        let field = if rec.user != self.req.user.as_str() {
            "user"
        } else if rec.qty != self.req.qty {
            "qty"
        } else if rec.kind != self.intent.kind() {
            "kind"
        } else {
            return match rec.state {
                RecordState::Applied(parts) => Recorded::Applied(parts),
                RecordState::Pending { .. } => Recorded::Pending,
                RecordState::Sealed => Recorded::Sealed,
            };
        };
        Recorded::Other(field)
    }
}

/// What a home record says about the request that reads it.
pub(super) enum Recorded {
    /// The record is another request's (this `field` differs): a conflict.
    Other(&'static str),
    /// This request applied with these parts.
    Applied(Vec<Part>),
    /// This request's fallback claim is held.
    Pending,
    /// This request was sealed.
    Sealed,
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
            home: home(&req.request_id, l.segments),
            args: self.req_args(req, intent),
            trace: None,
        }
    }

    /// The store's view of `req` for a call that does `intent`.
    pub(crate) fn req_args<'a>(&self, req: &'a Deduct, intent: Intent) -> ReqArgs<'a> {
        let opts = &self.inner.opts;
        let hold_ms = intent.hold_ms();
        ReqArgs {
            request_id: &req.request_id,
            user: &req.user,
            qty: req.qty,
            // A reservation's records (its claim and home record too, not only the part that
            // holds the units) outlive the reservation by the request TTL.
            ttl_ms: opts.request_ttl.as_millis() as u64 + hold_ms,
            lease_ms: opts.claim_lease.as_millis() as u64,
            resv_ttl_ms: hold_ms,
            kind: intent.kind(),
            attempt: 0,
        }
    }
}
