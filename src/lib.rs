#![doc = include_str!("../README.md")]
//!
//! # Layout
//! - [`engine`]: [`Engine`] and its builder — load, deduct (routing, fallback, claims),
//!   restock, remaining, audit.
//! - [`store`]: the backend trait; [`RedisStore`] (fred + Lua in `src/scripts/`) and
//!   [`MemoryStore`] (embedded, and the oracle of the differential tests).
//! - [`segments`]: pure maths — splitting stock, home segments, key names and hash tags.
//! - `router` (crate-private): fallback order and "known short" hints.
//! - [`ids`]: validated SKU / user / request ids and bounds.
//! - [`config`]: TOML + environment configuration.
//! - [`error`]: the one error enum.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

pub mod audit;
pub mod config;
pub mod engine;
pub mod error;
#[cfg(feature = "http")]
pub mod http;
pub mod ids;
pub mod lock;
pub mod metrics;
pub mod reservation;
pub mod segments;
pub mod store;
pub mod strategy;

// Internal: the engine's helpers, not part of the API.
mod guard;
mod router;
mod shared_read;

pub use audit::{Audit, SegmentAudit};
pub use config::Config;
pub use engine::{
    Deduct, Deduction, Engine, EngineBuilder, EngineOptions, LoadOptions, Remaining, Restocked,
    Sweeper,
};
pub use error::{Error, ErrorKind, Result};
pub use ids::{RequestId, Sku, UserId};
pub use reservation::{ReservationEnd, ReservationId, Reserved};
pub use segments::Part;
pub use store::Store;
pub use store::memory::MemoryStore;
pub use store::redis::{CoalesceStats, Coalescing, RedisStore};
pub use strategy::Strategy;
