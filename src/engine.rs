//! The engine: the public face. Loads SKUs, deducts with routing and fallback, restocks, audits.
//!
//! # How a deduction runs
//! Every request is decided by **one script at its home segment** (`sell.lua`): the request's
//! record (replay, or a conflict for another quantity or kind), the user's ledger against the
//! per-user limit, the stock, the record, the reservation hold and the outbox event, in one
//! atomic step and, in the common case, one round trip. The home is the user's segment (with
//! a per-user limit every request of the user lands where the user's ledger is) or, without a
//! limit, the (user, request id) pair's. Request ids are scoped per (SKU, user).
//!
//! When home is short, **units move, not requests**: a transfer debits units at a donor
//! (`transfer.lua`, idempotent by transfer id, recorded at the donor) and home credits them
//! exactly once in the same call that decides the request. Units moved home stay there,
//! sellable; a process that dies between debit and credit leaves them in transit until any
//! sweeper credits them. `sold out` and `insufficient` come only from a survey of every
//! segment, after expired reservations went back and units in transit were credited. The
//! steps are the pure state machine of `protocol.rs`, which the model checker explores.
//!
//! # Where each part lives
//! The engine's rooms (`engine/*.rs`, [`crate::reservation`], [`crate::audit`]) are listed,
//! one line each, in the crate's one Layout (the README's `## Layout`, which these docs
//! render), with a deduction's path through them.

mod background;
mod deduct;
mod layout;
mod layouts;
pub mod live_audit;
mod look;
mod options;
mod outcome;
pub mod protocol;
mod readiness;
mod request;
mod sold_out;
mod state;
mod stock;
mod sweeper;

pub use background::{Background, BackgroundOptions};
pub(crate) use layout::{Layout, seg_at};
pub use options::{EngineBuilder, EngineOptions, LoadOptions, MAX_DURATION, MAX_GUARD_CAP};
pub use outcome::{Deduction, Remaining, Restocked};
pub use readiness::{
    DEFAULT_READY_TIMEOUT, ProblemKind, Readiness, ReadyStatus, ServerProblem, SkuSegments,
};
pub use request::Deduct;
pub(crate) use request::{Attempt, Intent};
pub use state::Engine;
pub use sweeper::Sweeper;
