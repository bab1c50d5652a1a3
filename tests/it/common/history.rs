//! History checking: operations recorded as invoke → ok / fail / unknown, store facts read
//! from Redis at the end, and the history checks.
//!
//! Pure logic apart from [`workload`]: the workload records [`Op`]s and reads [`Facts`]; [`check`]
//! turns them into [`Violation`]s and [`report`] prints each with the operations of the
//! request ids and users involved (the shrunk description of a failure).
//!
//! # Layout
//! - [`record`]: what is recorded of each operation ([`Op`]: kind, request, invoke / return
//!   times, outcome);
//! - [`facts`]: what the store holds at the end ([`Facts`]) and its verdict per request id
//!   ([`rid_facts`]);
//! - [`mod@check`]: the checks, one file per promise under `check/`;
//! - [`mod@report`]: violations printed with the operations and records involved; run summaries;
//! - [`workload`]: the randomized workload over several targets, with a fault hook (the nemesis
//!   suite's), that records the history, reads the facts and runs the checks;
//! - [`http_target`]: a `shardstock serve` process as a workload target (HTTP answers mapped
//!   to the same outcomes).
#![allow(dead_code)]

mod check;
mod facts;
pub mod http_target;
mod record;
mod report;
pub mod workload;

pub use check::*;
pub use facts::*;
pub use record::*;
pub use report::*;
