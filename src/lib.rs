#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

pub mod audit;
pub mod config;
pub mod engine;
pub mod error;
#[cfg(feature = "http")]
pub mod http;
pub mod ids;
pub mod live_audit;
pub mod lock;
pub mod metrics;
pub mod orders;
pub mod placement;
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

#[cfg(test)]
mod layout {
    use std::path::{Path, PathBuf};

    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files(&path, out);
            } else {
                out.push(path);
            }
        }
    }

    /// The README's `## Layout` is the crate's one layout (the crate docs are the README): every
    /// Rust file under `src/`, `tests/`, `benches/` and `examples/` is named there, so the map
    /// cannot silently fall behind the territory.
    #[test]
    fn readme_layout_names_every_file() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let layout = readme
            .split("\n## Layout\n")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("README has a ## Layout section");
        let mut all = Vec::new();
        for dir in ["src", "tests", "benches", "examples"] {
            files(&root.join(dir), &mut all);
        }
        let missing: Vec<String> = all
            .iter()
            .map(|p| {
                p.strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/")
            })
            .filter(|p| p.ends_with(".rs"))
            .filter(|p| !layout.contains(p.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "not in the README's ## Layout: {missing:?}"
        );
        assert!(layout.contains("src/scripts/*.lua"));
    }
}
