//! The integration tests: one test binary, one module per suite, so the world (fred, axum,
//! tokio-postgres, the harness) is compiled and linked once (only `tests/embed_example.rs`,
//! which installs a global metrics recorder, runs in a process of its own). A test's name starts with its
//! suite: `deduct::replayed_request_id_has_one_effect`. `cargo test --all-features --test it -- deduct::`
//! runs a suite; a filter is a substring (`cluster::` also picks `nemesis_cluster::`), so
//! `scripts/test.sh --acl-tls SUITE...` passes a suite's tests by exact name.
//!
//! What the suites share in this one process:
//! - [`common`]: the harness (servers on free ports, the process's TLS material, the binary);
//! - the global allocator, [`user_limit`]'s: it counts the bytes freed per thread (the guard's
//!   measurement drops an engine on its own thread), the other suites only pass through it;
//! - no global metrics recorder: a test that reads metrics sets a local one on its threads
//!   ([`serve`], [`cluster`], [`strategies`]), and the engines of the others record nothing.
//!
//! Suites that need a feature beyond the default (`http`) are compiled with it: those that run
//! the `shardstock` binary need `cli`, the PostgreSQL one `postgres` (`cargo test
//! --all-features` runs every suite).

mod common;

mod acl;
#[cfg(feature = "cli")]
mod alert_scenarios;
#[cfg(feature = "cli")]
mod alerts;
#[cfg(feature = "cli")]
mod balance;
#[cfg(feature = "cli")]
mod carts;
#[cfg(feature = "cli")]
mod cli_admin;
#[cfg(feature = "cli")]
mod cli_cart;
mod cli_mistakes;
#[cfg(feature = "cli")]
mod cli_processes;
#[cfg(feature = "cli")]
mod cli_sim;
mod cluster;
#[cfg(feature = "cli")]
mod cluster_placement;
mod coalescing;
mod deduct;
mod differential;
mod differential_carts;
mod durability;
mod edges_dropped_calls;
mod edges_generations;
mod edges_options;
mod edges_request_ids;
mod edges_reservations;
mod failover;
mod history;
#[cfg(feature = "cli")]
mod http_orders;
#[cfg(feature = "cli")]
mod metrics;
mod model;
mod model_orders;
mod nemesis;
mod nemesis_cluster;
mod nemesis_empty;
#[cfg(feature = "cli")]
mod nemesis_serve;
mod orders;
#[cfg(feature = "postgres")]
mod orders_postgres;
#[cfg(feature = "cli")]
mod orders_processes;
mod readiness;
mod reconnect;
mod redlock;
mod refusals;
mod reservations;
mod safety;
#[cfg(feature = "cli")]
mod serve;
#[cfg(feature = "cli")]
mod serve_inputs;
mod sold_out;
mod strategies;
mod tls;
mod user_limit;
