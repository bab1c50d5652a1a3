//! Property-based differential tests (the machinery: `tests/common/differential/`).
//!
//! 1. `memory_and_redis_agree`: random sequences of load / deduct / restock / replay run on
//!    `MemoryStore` and on `RedisStore` (a real redis-server, with and without coalescing) must
//!    give identical outcomes and identical per-segment stock after every step, and both must
//!    conserve stock.
//! 2. `memory_and_redis_agree_at_the_edges`: the same in lockstep over three worlds (memory,
//!    Redis, coalesced Redis), each with **two engines sharing one store**, with per-user limits,
//!    reservations (reserve / confirm / cancel / expiry), request ids reused across users and
//!    kinds, simulated crashes (store-level calls, then nothing) that later calls verify, seal or
//!    take over, and explicit waits past every lease and TTL. Besides identical transcripts, a
//!    model of what each answer promised is checked after every step (see `World::check`).
//! 3. `cancellation_keeps_invariants`: the same worlds and ops plus calls dropped at random
//!    points (`tokio::time::timeout` of a few µs); outcomes are timing-dependent, so only the
//!    invariants are checked, and at the end every dropped call is resolved by a retry.
//! 4. `memory_and_cluster_agree`: 1 and 2 again with the Redis worlds on a 3-master Redis
//!    Cluster (fewer cases).
//! 5. `regressions::*`: shrunk failures of 2 and 3 as fixed op lists, each naming what it found.
//!
//! What is checked after every step, and how timers are kept out of races: see
//! `tests/common/differential.rs`.
//!
//! Environment: `DIFF_CASES` (cases per property), `DIFF_SKIP` (comma-separated op families
//! left out of generation: load, deduct, reserve, confirm, cancel, replay, conflict, other-user,
//! other-kind, restock, crash-claim, crash-sold, crash-resv, crash-fallback, wait, expire, drop,
//! limits, two-engines), `DIFF_IGNORE` (comma-separated violation tags to look past, e.g.
//! `kind,lockout/expired`; every violation message starts with its `[tag]`),
//! `DIFF_SHRINK_SECS` (shrink time budget).

mod common;
/// Parts of `tests/common/` that only the differential tests compile (mounted here rather than
/// in `common/mod.rs`, so the other test binaries do not build them).
#[path = "common"]
mod support {
    pub mod differential;
}

use common::*;
use proptest::prelude::*;
use shardstock::*;
use std::time::Duration;
use support::differential::plain::{Op, op, run};
use support::differential::run::{edge_property, edge_property_on};

#[test]
fn memory_and_redis_agree() {
    agree_on(&RedisServer::start(), 48);
}

/// Property 1 with the Redis stores on `srv` (a server or a cluster); `DIFF_CASES` or
/// `default_cases` cases.
fn agree_on(srv: &impl RedisAt, default_cases: u32) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Long hints so routing depends only on the sequence, never on timing.
    let builder = || {
        Engine::builder()
            .per_user_limit(0)
            .hint_ttl(Duration::from_secs(3600))
            .max_qty(5)
    };
    let redis = rt.block_on(redis_engine(srv, builder()));
    // The same again with request coalescing on (own key prefix on the same server).
    let coalesced = rt.block_on(coalesced_engine(srv, builder(), Coalescing::default(), "c"));
    let cases = env_knob("DIFF_CASES").unwrap_or(default_cases);
    let n = std::sync::atomic::AtomicU32::new(0);
    proptest!(ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() },
        |(first in (1u64..40, 1u32..8), ops in proptest::collection::vec(op(), 1..60))| {
        let name = format!("diff-{}", n.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let mut all = vec![Op::Load { total: first.0, segments: first.1 }];
        all.extend(ops);
        // A fresh memory engine per case; a fresh SKU name on the shared Redis server.
        let memory = memory_engine(builder());
        let a = rt.block_on(run(&memory, &name, &all));
        let b = rt.block_on(run(&redis, &name, &all));
        let c = rt.block_on(run(&coalesced, &name, &all));
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(a, c);
    });
}

#[test]
fn memory_and_redis_agree_at_the_edges() {
    edge_property(false, 48, 40);
}

#[test]
fn cancellation_keeps_invariants() {
    edge_property(true, 32, 30);
}

/// Properties 1 and 2 with the Redis worlds on a 3-master cluster (one cluster for both; fewer
/// cases by default: the single-node runs above cover the op space, these the placement).
#[test]
fn memory_and_cluster_agree() {
    let cluster = common::cluster::RedisCluster::start(3, 0);
    agree_on(&cluster, 16);
    edge_property_on(&cluster, false, 16, 40);
}

// ---------------------------------------------------------------------------------------------
// Shrunk failures, kept as regression tests (found on the code before issue 11's fixes; each
// names what it found). `use Act::*` lists are the proptest output, trimmed after the failing
// step; the runner adds a final expire + probe of every user on both engines.
// ---------------------------------------------------------------------------------------------
#[rustfmt::skip]
mod regressions {
    use super::support::differential::act::Act;
    use super::support::differential::run::{regression, regression_past};

    /// Issue 11 #1: a sale's request id sent again as a reservation answers `Replayed` (the record
    /// has no kind); the user's entry is rewritten from sold to reserved.
    #[test]
    fn edge_sale_id_reused_for_a_reservation() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 6, segments: 1, limit: 0 },
                Deduct { e: 0, user: 0, qty: 1, rid: 0 },
                OtherKind { e: 0, nth: 0, ttl_ms: 60 },
            ],
            false,
        );
    }

    /// Issue 11 #1, the other way round: a reservation's id sent as a sale answers `Replayed`
    /// (a "sale" whose unit goes back to stock when the reservation expires).
    #[test]
    fn edge_reservation_id_reused_for_a_sale() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 6, segments: 1, limit: 0 },
                Reserve { e: 0, user: 0, qty: 1, rid: 0, ttl_ms: 60 },
                OtherKind { e: 0, nth: 0, ttl_ms: 60 },
            ],
            false,
        );
    }

    /// Issue 11 #1, its consequence on the limit (looking past the replay itself): the sale's
    /// entry rewritten as a reservation is verified void, and the user (limit 1) gets a second
    /// unit.
    #[test]
    fn edge_kind_reuse_passes_the_limit() {
        use Act::*;
        regression_past(
            vec![
                Load { e: 0, total: 1, segments: 2, limit: 1 },
                Deduct { e: 0, user: 1, qty: 1, rid: 8 },
                OtherKind { e: 0, nth: 0, ttl_ms: 60 },
                Reserve { e: 1, user: 1, qty: 1, rid: 0, ttl_ms: 60 },
                Restock { e: 0, qty: 1, rid: 0 },
                CrashFallback { e: 0, user: 1, qty: 1, rid: 0, part: 1 },
            ],
            false,
            &["kind"],
        );
    }

    /// Issue 11 #3: Bob sends Alice's request id (conflict, 409); his pending claim stays and he,
    /// who bought nothing, is refused with limit_reached.
    #[test]
    fn edge_other_users_request_id_locks_out() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 3, segments: 1, limit: 1 },
                Deduct { e: 0, user: 0, qty: 1, rid: 0 },
                OtherUser { e: 0, nth: 0, user: 1 },
            ],
            false,
        );
    }

    /// Issue 11 #3 (seal path): a crash leaves u0's pending claim of request id r0, which u1 then
    /// buys with; verifying u0's entry answers mismatch forever, and u0 (3 of 3 free) is refused.
    #[test]
    fn edge_stale_claim_of_an_id_another_user_bought_with() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 5, segments: 1, limit: 3 },
                CrashClaim { e: 0, user: 0, qty: 2, rid: 0 },
                OtherUser { e: 0, nth: 0, user: 1 },
            ],
            false,
        );
    }

    /// Issue 11 #4 (and the plan's "LimitReached only when sold + live reserved + qty > limit"):
    /// a pending claim of another request id that has not expired answers limit_reached (should
    /// be user_busy) although the user holds nothing.
    #[test]
    fn edge_pending_claim_answers_limit_reached() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 0, segments: 1, limit: 2 },
                CrashClaim { e: 0, user: 0, qty: 1, rid: 0 },
                Deduct { e: 0, user: 0, qty: 2, rid: 1 },
            ],
            false,
        );
    }

    /// Issue 11 #5: a fallback abandoned after taking 1 of 2 units (crash between `take`s): after
    /// the lease and a sweep, the unit is still taken (sold 1, nothing sold).
    #[test]
    fn edge_abandoned_fallback_is_not_repaired() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 1, segments: 2, limit: 0 },
                CrashFallback { e: 0, user: 0, qty: 2, rid: 1, part: 1 },
                Expire,
            ],
            false,
        );
    }

    /// Issue 11 #6: a reservation whose per-user entry stayed pending (crash before
    /// `user_finish`) is verified as sold after it expired: u0 (1 of 2 held) is refused.
    #[test]
    fn edge_expired_crash_reservation_counts_as_sold() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 5, segments: 1, limit: 2 },
                CrashResv { e: 0, user: 0, qty: 1, rid: 0 },
            ],
            false,
        );
    }

    /// Issue 11 #7: a sealed request id read on the "home looks short" path is
    /// `Error::Protocol` on Redis (the record parser knows A and P only), a conflict on memory.
    #[test]
    fn edge_sealed_record_is_a_protocol_error_on_redis() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 1, segments: 3, limit: 3 },
                CrashClaim { e: 0, user: 0, qty: 2, rid: 0 },
                Restock { e: 1, qty: 3, rid: 0 },
                CrashClaim { e: 0, user: 0, qty: 1, rid: 0 },
                Wait,
                Deduct { e: 0, user: 0, qty: 2, rid: 1 },
                Deduct { e: 0, user: 0, qty: 1, rid: 0 },
                OtherUser { e: 1, nth: 3, user: 0 },
            ],
            false,
        );
    }

    /// Not in issue 11: the in-process guard keeps counting a reservation after it expired; the
    /// engine that made it answers limit_reached (for `guard_ttl`, 60 s) to a user holding nothing.
    #[test]
    fn edge_guard_counts_an_expired_reservation() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 2, segments: 1, limit: 1 },
                Reserve { e: 0, user: 0, qty: 1, rid: 0, ttl_ms: 60 },
            ],
            false,
        );
    }

    /// Not in issue 11: a reservation cancelled through another engine (instance) is not
    /// forgotten by the guard of the engine that made it: limit_reached for a user holding nothing.
    #[test]
    fn edge_guard_counts_a_reservation_cancelled_elsewhere() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 4, segments: 1, limit: 1 },
                Reserve { e: 0, user: 0, qty: 1, rid: 0, ttl_ms: 60 },
                Cancel { e: 1, nth: 0 },
                Deduct { e: 0, user: 0, qty: 1, rid: 1 },
            ],
            false,
        );
    }

    /// Not in issue 11: asking for more than is left of the limit (1 bought through the other
    /// engine, limit 2, asks 2: rightly refused by the store) saturates the guard at the limit; the
    /// same user asking for the 1 unit left is refused too.
    #[test]
    fn edge_guard_saturates_on_an_oversized_ask() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 5, segments: 1, limit: 2 },
                Deduct { e: 1, user: 0, qty: 1, rid: 2 },
                Deduct { e: 0, user: 0, qty: 2, rid: 0 },
                Deduct { e: 0, user: 0, qty: 1, rid: 1 },
            ],
            false,
        );
    }

    /// Not in issue 11: the guard is not scoped by generation: after a reload (a new ledger) a
    /// user who bought in the old generation is refused by the engine that saw it.
    #[test]
    fn edge_guard_survives_a_reload() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 1, segments: 1, limit: 1 },
                Deduct { e: 0, user: 0, qty: 1, rid: 0 },
                Load { e: 0, total: 1, segments: 1, limit: 1 },
                Deduct { e: 0, user: 0, qty: 1, rid: 0 },
            ],
            false,
        );
    }

    /// Issue 11 #10 without a data loss: after another engine reloads the SKU without a limit,
    /// an engine with the cached layout answers limit_reached {limit: 1} from its guard / the old
    /// generation's user record, without any call that would notice the new generation.
    #[test]
    fn edge_stale_layout_keeps_the_old_limit() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 1, segments: 1, limit: 1 },
                Deduct { e: 0, user: 0, qty: 1, rid: 0 },
                Load { e: 1, total: 1, segments: 1, limit: 0 },
                Deduct { e: 0, user: 0, qty: 1, rid: 0 },
            ],
            false,
        );
    }

    /// Not in issue 11: memory and Redis differ on the previous generation's records after a
    /// reload (memory's `load_segment` wipes them, Redis keeps them under `g<old>`); an engine
    /// with the stale layout verifies an expired entry there: memory seals (then sells on the new
    /// generation: sold_out), Redis finds the old sale (limit_reached {limit: 2} on an unlimited
    /// SKU). (Looks past the stale limit itself, see `edge_stale_layout_keeps_the_old_limit`.)
    #[test]
    fn edge_old_generation_records_differ_after_reload() {
        use Act::*;
        regression_past(
            vec![
                Load { e: 0, total: 1, segments: 1, limit: 0 },
                Deduct { e: 0, user: 1, qty: 1, rid: 0 },
                Load { e: 0, total: 2, segments: 1, limit: 2 },
                Deduct { e: 0, user: 0, qty: 3, rid: 0 },
                CrashFallback { e: 0, user: 1, qty: 2, rid: 0, part: 1 },
                Load { e: 1, total: 0, segments: 1, limit: 0 },
                Deduct { e: 0, user: 0, qty: 3, rid: 0 },
                Deduct { e: 0, user: 0, qty: 3, rid: 0 },
                Wait,
                Replay { e: 0, nth: 54 },
            ],
            false,
            &["lockout/stale-layout"],
        );
    }

    /// Issue 11 #4: a deduct dropped after the guard marked the user busy (Redis: at its first
    /// round trip) leaves the user busy on that engine for good (every busy answer refreshes
    /// it). (Shrunk to the first drop; a few more delays make a hit certain under load.)
    #[test]
    fn edge_dropped_deduct_leaves_user_busy() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 5, segments: 1, limit: 1 },
                Deduct { e: 0, user: 1, qty: 1, rid: 0 },
                Drop { e: 0, user: 0, qty: 1, us: 0, resv: false },
                Drop { e: 0, user: 0, qty: 1, us: 50, resv: false },
                Drop { e: 0, user: 0, qty: 1, us: 200, resv: true },
                Drop { e: 0, user: 0, qty: 1, us: 500, resv: false },
            ],
            true,
        );
    }

    /// Issue 11 #5 through cancellation: a deduct of 2 units over 4 segments of 1 unit, dropped at
    /// various points; one dropped mid-way through its multi-segment take leaves units taken for
    /// good (found with the drop at 2.2 ms; the spread of delays makes a hit likely anywhere).
    #[test]
    fn edge_dropped_fallback_is_not_repaired() {
        use Act::*;
        let mut acts = Vec::new();
        for us in (100..4000).step_by(150) {
            acts.push(Load { e: 0, total: 2, segments: 4, limit: 0 });
            acts.push(Deduct { e: 1, user: 1, qty: 1, rid: 0 });
            acts.push(Restock { e: 1, qty: 1, rid: 0 });
            acts.push(Drop {
                e: 1,
                user: 0,
                qty: 2,
                us,
                resv: false,
            });
            acts.push(Expire);
        }
        regression(acts, true);
    }

    /// Found once on the coalesced world (at b1d24ab; fails on 39a8ea2 too): u2 (limit 2)
    /// reserves 2 and cancels; two reservations of 2 of u2 were dropped before; at the end both
    /// are resolved, each answered `Held`, and the checker counts 4 units live for u2 (the store:
    /// reserved 2). A checker artefact, not an engine bug: the second resolve was refused
    /// (limit_reached) and retried until the first had expired on the store's clock (80 ms), while
    /// the model, aged only by waits, still held it live. `finish` now waits and ages the model
    /// like the runner does between ops.
    #[test]
    fn edge_resolved_dropped_reservations_pass_the_limit() {
        use Act::*;
        regression(
            vec![
                Load { e: 0, total: 9, segments: 1, limit: 2 },
                Reserve { e: 0, user: 2, qty: 2, rid: 15, ttl_ms: 85 },
                Drop { e: 0, user: 1, qty: 2, us: 1899, resv: false },
                Deduct { e: 0, user: 2, qty: 3, rid: 12 },
                Drop { e: 1, user: 2, qty: 2, us: 2579, resv: true },
                Deduct { e: 0, user: 2, qty: 3, rid: 14 },
                CrashFallback { e: 1, user: 2, qty: 3, rid: 5, part: 3 },
                Drop { e: 0, user: 2, qty: 2, us: 857, resv: true },
                OtherKind { e: 1, nth: 43, ttl_ms: 75 },
                Cancel { e: 1, nth: 12 },
            ],
            true,
        );
    }

    /// The same, reduced to its cause (the shrunk case above needs two drops that land between
    /// the user claim and the reservation, which depends on build and load): reservations of 2
    /// by u2 (limit 2) dropped at a spread of delays; at the end the first one not applied is
    /// resolved held, the next refused until that one expired on the store's clock, then held.
    #[test]
    fn edge_resolve_retried_past_a_resolved_reservations_ttl() {
        use Act::*;
        let mut acts = vec![Load { e: 0, total: 60, segments: 1, limit: 2 }];
        for (i, us) in (0..3000).step_by(150).enumerate() {
            acts.push(Drop { e: (i % 2) as u8, user: 2, qty: 2, us, resv: true });
        }
        regression(acts, true);
    }
}
