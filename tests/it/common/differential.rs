//! The machinery of the differential tests (`tests/it/differential.rs`): the same steps run on
//! `MemoryStore` (the oracle: [`shardstock::store::memory::Segment`], the pure reference
//! semantics) and on `RedisStore` (the Lua scripts), plain and with request coalescing, and
//! must give the same answers and leave the same state.
//!
//! # Layout
//! - [`op`]: the store steps a case is made of ([`op::Op`]) and their generators;
//! - [`world`]: one store of a case: what it was told (generations, requests, transfers), one
//!   step as a transcript line, the state read after it, and the invariants checked on it;
//! - [`run`]: a case run in lockstep on the three stores (memory, Redis, coalesced Redis), as
//!   a property or as a fixed list, and its verdict;
//! - [`engines`]: the same idea one level up: random request sequences through an `Engine` on
//!   each store, transcripts of outcomes and audits compared;
//! - [`scenario`]: the helpers of the named scenarios (three stores, a load, a sale, an order
//!   item's hold and settle).
//!
//! # Time
//! Both stores keep real time (the memory store: ms since it was created; Redis: `TIME`), so
//! every timer a step starts (reservation TTL, record TTL, transfer lease, restock record, the
//! hint after which `holds_due` lists an order item, an order's hold and its record's TTL) is
//! either **long** ([`LONG_MS`], never reached within a case) or **short** ([`SHORT_MS`]). A
//! case never looks at a short timer near its end: the runner notes when the first short timer
//! since the last advance started and, once [`AUTO_ADVANCE_AFTER`] passed, sleeps [`ADVANCE`]
//! (past every short timer, record TTLs after reservation expiries included) before the next
//! step; a step that still ends within [`MARGIN`] of the shortest timer taints the case, which
//! is run again (at most 3 times). A step that reads time-dependent values is normalised: a
//! transfer's lease left to `due` (0) or `leased`, an order's time left to `open` or `-`.
#![allow(dead_code)]

use std::ops::RangeInclusive;
use std::time::Duration;

pub mod engines;
pub mod op;
pub mod run;
pub mod scenario;
pub mod world;

/// A short timer's length (ms): reservations, record TTLs, leases and restock records.
pub const SHORT_MS: RangeInclusive<u64> = 60..=80;
/// A long timer (ms): never reached within a case.
pub const LONG_MS: u64 = 600_000;
/// Sleep of an advance: past a short reservation plus a short record TTL after it.
pub const ADVANCE: Duration = Duration::from_millis(2 * 80 + 40);
/// A short timer this old makes the runner advance before the next step.
pub const AUTO_ADVANCE_AFTER: Duration = Duration::from_millis(25);
/// A step that ends this close to the shortest timer may have raced it: the case is tainted.
pub const MARGIN: Duration = Duration::from_millis(12);
