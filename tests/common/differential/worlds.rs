//! The three worlds of one case (memory, Redis, coalesced Redis) and their verdict: the first
//! broken promise, or the first line where the transcripts differ.

use super::edge_builder;
use super::world::World;
use crate::common::{RedisAt, env_knob, store_builder};
use shardstock::{Coalescing, MemoryStore, RedisStore};

/// The three worlds of one case.
pub struct Worlds {
    pub m: World<MemoryStore>,
    pub r: World<RedisStore>,
    pub c: World<RedisStore>,
    /// Violation tags to look past (besides `DIFF_IGNORE`).
    pub ignore: &'static [&'static str],
}

impl Worlds {
    /// The worlds of case `name`, the Redis ones on `srv` (a server or a cluster).
    pub async fn new(srv: &impl RedisAt, name: &str, cancellation: bool) -> Self {
        let b = edge_builder;
        let mem = MemoryStore::new();
        let m = [b().build(mem.clone()).unwrap(), b().build(mem).unwrap()];
        // The knobs' user and CA (`SHARDSTOCK_TEST_ACL`, `SHARDSTOCK_TEST_TLS`), 2 clients.
        let redis = || store_builder(srv, "t").connect();
        let r = [
            b().build(redis().await.unwrap()).unwrap(),
            b().build(redis().await.unwrap()).unwrap(),
        ];
        let coalesced = || async {
            store_builder(srv, "c")
                .coalescing(Some(Coalescing::default()))
                .connect()
                .await
                .unwrap()
        };
        let c = [
            b().build(coalesced().await).unwrap(),
            b().build(coalesced().await).unwrap(),
        ];
        Self {
            m: World::new("memory", m, name, cancellation),
            r: World::new("redis", r, name, cancellation),
            c: World::new("coalesced", c, name, cancellation),
            ignore: &[],
        }
    }

    pub async fn close(&self) {
        for e in self.r.engines.iter().chain(&self.c.engines) {
            e.store().quit().await;
        }
    }

    pub fn after_wait(&mut self) {
        self.m.m.after_wait();
        self.r.m.after_wait();
        self.c.m.after_wait();
    }

    pub fn push(&mut self, lines: [&str; 3]) {
        for (w, l) in [&mut self.m.log, &mut self.r.log, &mut self.c.log]
            .into_iter()
            .zip(lines)
        {
            w.push(l.to_string());
        }
    }

    /// The first world with a broken invariant, or the first differing line.
    pub fn verdict(&self, i: usize, act: &str, compare: bool) -> Option<String> {
        for (label, bad, log) in [
            (self.m.label, &self.m.bad, &self.m.log),
            (self.r.label, &self.r.bad, &self.r.log),
            (self.c.label, &self.c.bad, &self.c.log),
        ] {
            let bad: Vec<&String> = bad.iter().filter(|v| !ignored(v, self.ignore)).collect();
            if !bad.is_empty() {
                return Some(format!(
                    "step {i} ({act}) on {label}: {}\n--- {label} transcript ---\n{}",
                    bad.iter()
                        .map(|v| v.as_str())
                        .collect::<Vec<_>>()
                        .join("; "),
                    tail(log)
                ));
            }
        }
        if compare && (self.m.log != self.r.log || self.m.log != self.c.log) {
            return Some(format!(
                "step {i} ({act}): transcripts differ\n--- memory ---\n{}\n--- redis ---\n{}\n--- coalesced ---\n{}",
                tail(&self.m.log),
                tail(&self.r.log),
                tail(&self.c.log)
            ));
        }
        None
    }
}

/// A violation tagged `[tag]` with a tag listed in `DIFF_IGNORE` or `also` (to look past a
/// known one); `lockout/a+b` is ignored when `lockout/a` and `lockout/b` are listed.
fn ignored(violation: &str, also: &[&str]) -> bool {
    let Some((tag, _)) = violation.strip_prefix('[').and_then(|v| v.split_once(']')) else {
        return false;
    };
    let ignore = std::env::var("DIFF_IGNORE").unwrap_or_default();
    let listed = |t: &str| ignore.split(',').any(|i| i.trim() == t) || also.contains(&t);
    listed(tag)
        || tag
            .strip_prefix("lockout/")
            .is_some_and(|causes| causes.split('+').all(|c| listed(&format!("lockout/{c}"))))
}

fn tail(log: &[String]) -> String {
    let keep = env_knob("DIFF_TAIL").unwrap_or(24);
    let from = log.len().saturating_sub(keep);
    log[from..].join("\n")
}
