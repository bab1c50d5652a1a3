//! Redis Cluster operations: where a SKU's segments go over the masters, and what happens to
//! them when their slots move or their master stops taking writes. Reading this room answers
//! "what happens to my segments when a master dies": placement spreads them (a hint only),
//! durability waits make a write survive the master's death (`WAIT` on its replicas),
//! `moving` follows them when their slot moves (failover, resharding, evacuation), and an
//! evacuation moves them off a master that refuses writes.
//!
//! # Files
//! - `placement`: pure maths: each segment's hash tag suffix, so a SKU spreads over the
//!   masters (public as [`crate::placement`]).
//! - `moving`: slots in motion: commands answered `MOVED` / `ASK` / `TRYAGAIN` sent again until
//!   their slot settles (fred 10.1 mishandles `ASK`).
//! - `slots`: pure readers of `CLUSTER SLOTS` / `CLUSTER NODES` (owner, open slots) and the
//!   spread of moved slots over targets.
//! - `node`: one node on a connection of its own, and the commands an evacuation sends it.
//! - `refusal`: pure: whether a master refuses writes or can take slots (`Health`), and the
//!   watch that evacuates each refusal once (`RefusalWatch`).
//! - `evacuate`: a master's slots moved, keys and all, under its write pause: options, targets,
//!   the per-slot procedure (public as `store::redis::evacuate`).
//!
//! - `wait`: durability mode: a mutating script call answers once `WAIT` confirmed its
//!   replicas hold its writes, grouped per connection like a group commit.
//!
//! The room is private; its public parts are re-exported at their public paths:
//! `shardstock::placement` and `shardstock::store::redis::{evacuate, EvacuateOptions,
//! Evacuation, MovedSlot, RefusalWatch}`.
//!
//! # What this room may import
//! [`crate::error`], [`crate::ids`], [`crate::segments`], [`crate::metrics`] (a wait's
//! shortfall is counted) and external crates. Never `store`, `engine` or anything above them:
//! the store calls in here, never the other way (`docs/layout.md` states it; the crate's layout
//! check reads every import to hold it).

pub mod evacuate;
pub(crate) mod moving;
pub(crate) mod node;
pub mod placement;
pub(crate) mod refusal;
mod slots;
pub(crate) mod wait;
