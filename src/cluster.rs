//! Redis Cluster operations: where a SKU's segments go over the masters, and what happens to
//! them when their slots move or their master stops taking writes. Reading this room answers
//! "what happens to my segments when a master dies": placement spreads them (a hint only),
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
//! Durability waits (`WAIT` after a write, `store/redis/wait.rs`) are not in this room: they
//! count their shortfalls in `metrics`, which this room does not import. They read the
//! masters' `min-replicas-*` settings with [`refusal::setting`].
//!
//! The room is private; its public parts are re-exported at their public paths:
//! `shardstock::placement` and `shardstock::store::redis::{evacuate, EvacuateOptions,
//! Evacuation, MovedSlot, RefusalWatch}`.
//!
//! # What this room may import
//! [`crate::error`], [`crate::ids`], [`crate::segments`] and external crates. Never `store`,
//! `engine`, `metrics` or anything above them: the store calls in here, never the other way
//! (the `imports` test below reads every file of the room to hold it to that).

pub mod evacuate;
pub(crate) mod moving;
pub(crate) mod node;
pub mod placement;
pub(crate) mod refusal;
mod slots;

#[cfg(test)]
mod imports {
    use std::path::Path;

    /// The crate's modules this room may name in code (comments and docs may link anywhere).
    const ALLOWED: [&str; 4] = ["cluster", "error", "ids", "segments"];

    /// Every `crate::<module>` named outside comments in the room's files is one of
    /// [`ALLOWED`], and no file climbs out of the room with `super` (this file's own tests
    /// apart: they name what they look for).
    #[test]
    fn the_room_imports_only_error_ids_segments() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![src.join("cluster.rs")];
        for entry in std::fs::read_dir(src.join("cluster")).unwrap() {
            files.push(entry.unwrap().path());
        }
        let mut bad = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            let top = file.ends_with("cluster.rs");
            let text = match text.find("#[cfg(test)]") {
                Some(tests) if top => &text[..tests],
                _ => &text[..],
            };
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                let above = code.split("crate::").skip(1).any(|rest| {
                    let module = rest
                        .split(|c: char| !c.is_alphanumeric() && c != '_')
                        .next();
                    !ALLOWED.contains(&module.unwrap_or(""))
                });
                let climbs = code.contains("super::super") || (top && code.contains("super::"));
                if above || climbs {
                    bad.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
        assert!(files.len() > 1, "no file under src/cluster/");
        assert!(
            bad.is_empty(),
            "the cluster room reaches out:\n{}",
            bad.join("\n")
        );
    }
}
