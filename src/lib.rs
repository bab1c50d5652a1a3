//! Flash-sale inventory: sells a SKU's stock fast from Redis (or from memory) and never
//! oversells.
//!
//! Each SKU's stock is split into **segments** (100 units as 10 × 10). Every request is decided
//! by **one atomic step at its home segment**: on Redis one Lua script that checks the request's
//! record (a replay or a conflict), the user's ledger against the per-user limit and the stock,
//! then takes the units and writes the record. When home runs short, units **move home** from
//! other segments by transfers that are credited at most once, so stock left anywhere stays
//! sellable. Every mutating call carries a **request id**: a retry, or a command re-sent after a
//! reconnect, never deducts twice. The audit checks that
//! `loaded + restocked = remaining + in transit + reserved + sold`, per segment and in total.
//!
//! # Example
//!
//! ```no_run
//! use shardstock::{BackgroundOptions, Coalescing, Deduct, Deduction, Engine, LoadOptions};
//! use shardstock::{RedisStore, Sku};
//!
//! # async fn demo() -> shardstock::Result<()> {
//! let store = RedisStore::builder("redis://127.0.0.1:6379")
//!     .coalescing(Some(Coalescing::default()))
//!     .connect()
//!     .await?;
//! let engine = Engine::builder().per_user_limit(1).build(store)?;
//! // Expired reservations go back to stock, conservation is audited as a metric; dropping the
//! // handle stops both.
//! let _background = engine.start_background(BackgroundOptions::default());
//!
//! let sku = Sku::new("phone")?;
//! let generation = engine.load(&sku, 100, LoadOptions::new(10)).await?;
//! println!("loaded generation {generation}");
//!
//! let req = Deduct::new("phone", "user-42", 1, "order-9f2c")?;
//! match engine.deduct(&req).await? {
//!     Deduction::Applied { segment, units } => println!("sold {units} from segment {segment}"),
//!     Deduction::Replayed { .. } => println!("this request id was sold before"),
//!     Deduction::SoldOut => println!("sold out"),
//!     other if other.is_final() => println!("never possible: {}", other.kind()),
//!     other => println!("not now: {}", other.kind()),
//! }
//! assert!(engine.audit(&sku).await?.ok);
//! # Ok(())
//! # }
//! ```
//!
//! [`MemoryStore::new`] instead of [`RedisStore`] keeps the stock in the process (one instance,
//! tests). An [`Engine`] is cheap to clone; share one per store.
//!
//! # Outcomes and errors
//!
//! Business answers are values: [`Deduction`] (applied, replayed, sold out, insufficient,
//! limit reached, user busy, over limit; [`Deduction::is_final`] tells "never" from "not now"),
//! [`Reserved`] and [`ReservationEnd`] for reservations, [`Restocked`]. [`Error`] is for invalid
//! input (naming the field), a request id reused with other parameters, an unknown SKU and
//! infrastructure failures; after an infrastructure failure the outcome is unknown and
//! retrying **with the same request id** is always safe ([`Error::is_retryable`],
//! [`Error::kind`]).
//!
//! # In a service
//!
//! - [`Engine::start_background`] starts what runs beside the engine: the reservation sweeper
//!   ([`Engine::start_sweeper`]) and the live audit, conservation as a metric
//!   ([`Engine::start_live_audit`]); the [`Background`] handle stops both when dropped.
//! - [`Engine::readiness`] tells a load balancer and an operator whether the store answers
//!   (every Redis master asked within a bound) and what of it does not serve: masters refusing
//!   writes with the segments on them, SKUs whose data vanished ([`Readiness`]); the HTTP API
//!   serves it as `GET /readyz`, next to `GET /healthz` (liveness).
//! - Metrics go through the `metrics` facade ([`mod@crate::metrics`] names them all); the
//!   library never installs a recorder, your service does.
//! - The HTTP/JSON API is the module `shardstock::http` (feature `http`, on by default): mount
//!   `shardstock::http::router(engine)` in an axum app, or run `shardstock::http::serve`. Its
//!   `/metrics` renders your recorder: `ApiOptions::metrics(move || handle.render())` with a
//!   `metrics-exporter-prometheus` handle (`examples/embed_axum.rs`).
//! - Orders leave through the outbox ([`orders`]): load a SKU with [`LoadOptions::outbox`] and
//!   consume the events with [`orders::Orders`] (PostgreSQL handler with feature `postgres`).
//!
//! # Features
//!
//! The default features are what a service embeds: the engine, both stores, the metrics facade
//! and `http`. `postgres` adds the PostgreSQL order handler, `config` adds `Config::load`
//! (a TOML file and `SHARDSTOCK_*` variables, read with figment), `cli` the `shardstock`
//! binary and everything it needs.
//!
//! # Layout
//!
//! | module | what lives there |
//! |---|---|
//! | [`engine`] | [`Engine`] and its builder and options: load, deduct, restock, status, audit, sweeper, background tasks, readiness |
//! | [`reservation`] | reserve, confirm, cancel: [`ReservationId`], [`Reserved`], [`ReservationEnd`] |
//! | [`store`] | the [`Store`] trait; [`store::redis`] ([`RedisStore`]: Lua scripts, coalescing, cluster redirections, durability mode) and [`store::memory`] ([`MemoryStore`], the reference semantics) |
//! | [`audit`], [`live_audit`] | the conservation check, once or every few seconds as metrics |
//! | [`orders`] | the outbox's consumer side: consumer groups, the handler contract |
//! | [`ids`], [`error`] | validated [`Sku`], [`UserId`], [`RequestId`] and bounds; the one [`Error`] |
//! | [`segments`], [`placement`] | pure maths: splitting stock, home segments, key names, hash-tag placement on a cluster |
//! | [`strategy`], [`lock`] | the deduction strategies ([`Strategy`]) and the distributed locks behind `lock` and `redlock` |
//! | [`config`] | the serde configuration (TOML and `SHARDSTOCK_*` variables with feature `config`) |
//! | [`mod@crate::metrics`] | every metric name, help text and unit |
//!
//! In the repository, `docs/` goes deeper: `design.md` (guarantees, what is atomic, the
//! strategies), `protocol.md` (the request protocol step by step), `http.md` (the HTTP API),
//! `operations.md` (CLI, configuration, metrics), `cluster.md`, `outbox.md`, `faults.md`,
//! `benchmarks.md`, `capacity.md` (sales per master core, masters per sale) and `layout.md`
//! (the rooms floor by floor, what each may import, every file).
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

pub mod audit;
pub mod cart;
pub mod config;
pub mod engine;
pub mod error;
#[cfg(feature = "http")]
pub mod http;
pub mod ids;
pub mod metrics;
pub mod orders;
pub mod reservation;
pub mod segments;
pub mod store;
pub mod strategy;

// Redis Cluster operations (placement, durability waits, slots in motion, evacuation): one
// room, not public as a whole; its public parts keep their public paths (`placement` here,
// evacuation under `store::redis`).
mod cluster;

// Rooms inside another room, at the public paths they always had.
#[doc(inline)]
pub use cluster::placement;
#[doc(inline)]
pub use engine::live_audit;
#[doc(inline)]
pub use store::redis::lock;

// Internal: the engine's helpers, not part of the API.
mod guard;
mod router;
mod shared_read;

pub use audit::{Audit, SegmentAudit};
pub use cart::{Cart, CartItem, OrderEnd, OrderHold, OrderId, OrderState};
pub use config::Config;
pub use engine::{
    Background, BackgroundOptions, Deduct, Deduction, Engine, EngineBuilder, EngineOptions,
    LoadOptions, Readiness, ReadyStatus, Remaining, Restocked, Sweeper,
};
pub use error::{Error, ErrorKind, Result};
pub use ids::{RequestId, Sku, UserId};
pub use reservation::{ReservationEnd, ReservationId, Reserved};
pub use segments::Part;
pub use store::Store;
pub use store::memory::MemoryStore;
pub use store::redis::{CoalesceStats, Coalescing, RedisStore};
pub use strategy::Strategy;

/// The README's Rust examples, compiled by `cargo test --doc` (the README is not the crate docs).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// `docs/carts.md`'s example, compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../docs/carts.md")]
pub struct CartsDoctests;

#[cfg(test)]
mod layout_check;
