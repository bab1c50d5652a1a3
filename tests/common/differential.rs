//! The machinery of the differential tests (`tests/differential.rs`: the properties and their
//! shrunk failures): the same ops run on `MemoryStore` (the oracle) and on `RedisStore`, plain
//! and with request coalescing.
//!
//! # Layout
//! - [`plain`]: load / deduct / restock / replay sequences on one engine, as transcripts;
//! - [`act`]: the ops at the edges ([`act::Act`]) and their generators (`DIFF_SKIP`);
//! - [`model`]: what each answer promised, folded into one model per store kind;
//! - [`world`]: one store kind (two engines sharing one store): its calls, simulated crashes,
//!   and the checks after every step ([`world::World::check`]);
//! - [`worlds`]: the three worlds of a case and their verdict (`DIFF_IGNORE`, `DIFF_TAIL`);
//! - [`run`]: a case run in lockstep on the three worlds, as a property or a fixed regression
//!   (`DIFF_CASES`, `DIFF_SHRINK_SECS`).
//!
//! Checked after every step (at the edges, with and without cancellation): audit ok; `loaded +
//! restocked = remaining + reserved + sold`; `reserved` covers the live reservations (equals
//! them after expire + sweep); `sold` lies between the units answered sold and that plus
//! abandoned or dropped calls (after expire + sweep: abandoned claims repaired, dropped calls
//! all in or all out); per user, units sold + reserved ≤ limit; no request id applied twice or
//! as both kinds; no `limit_reached` for a user whose sold + live reserved + asked units fit the
//! limit; no lasting `user_busy`; no protocol error. Every case ends with an expire and a
//! purchase probe for every user on both engines.
//!
//! Timing: every timer the ops create (reservation TTLs 60..100 ms, claim lease 100 ms, per-user
//! claim TTL 120 ms) is kept out of races: the runner notes when the first live timer was
//! created and, 35 ms later, waits 150 ms (past all of them) before the next op; an op that
//! straddles a timer anyway makes the case be run again (differential mode).
#![allow(dead_code)]

use shardstock::{Engine, EngineBuilder};
use std::time::Duration;

pub mod act;
pub mod model;
pub mod plain;
pub mod run;
pub mod world;
pub mod worlds;

/// Sleep of a `Wait` / `Expire`: past every timer below.
const WAIT: Duration = Duration::from_millis(150);
/// The sweeper takes over an abandoned claim one claim lease (100 ms here) after its lease.
const SWEEP_GRACE: Duration = Duration::from_millis(100);
/// Shortest timer an op can start (the shortest reservation TTL).
const SHORTEST_TIMER: Duration = Duration::from_millis(60);
/// A live timer this old makes the runner wait before the next op.
const AUTO_WAIT_AFTER: Duration = Duration::from_millis(35);
/// An op that ends this close to the shortest timer may have raced it.
const TIMER_MARGIN: Duration = Duration::from_millis(5);
/// TTL of a reservation left by a simulated crash.
const CRASH_RESV_TTL_MS: u64 = 80;
/// How long a `UserBusy` is retried when nothing is in flight (the promised cleanup bound).
const BUSY_POLL: Duration = Duration::from_secs(1);

fn edge_builder() -> EngineBuilder {
    Engine::builder()
        .per_user_limit(0)
        .hint_ttl(Duration::from_secs(3600))
        .max_qty(5)
        .claim_lease(Duration::from_millis(100))
        .user_claim_ttl(Duration::from_millis(120))
        // A retry of a claimed request answers InFlight at once instead of waiting out the
        // lease: its outcome then never depends on timing.
        .pending_wait(Duration::from_millis(5))
}
