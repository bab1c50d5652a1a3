//! Redis Cluster operations: where a SKU's segments go over the masters, and what happens to
//! them when their slots move or their master stops taking writes.
//!
//! # Files
//! - `placement`: pure maths: each segment's hash tag suffix, so a SKU spreads over the
//!   masters (public as [`crate::placement`]).
//! - `moving`: slots in motion: commands answered `MOVED` / `ASK` / `TRYAGAIN` sent again until
//!   their slot settles (fred 10.1 mishandles `ASK`).
//!
//! # What this room may import
//! [`crate::error`], [`crate::ids`], [`crate::segments`] and external crates. Never `store`,
//! `engine`, `metrics` or anything above them: the store calls in here, never the other way.

pub(crate) mod moving;
pub mod placement;
