//! Readiness: is the store there for this instance, and what of it is not? What a load
//! balancer probes (`GET /readyz`) and an operator reads.
//!
//! One look, bounded by a timeout: the store's servers ([`Store::health`]: each master asked
//! whether it answers and would take a write) and, at the same time, the metadata of every SKU
//! this engine has served. From them:
//! - **unavailable** when the store does not answer at all (a single Redis down or out of
//!   reach, no cluster master answering or every one reporting the cluster down): nothing this
//!   instance could do would work, so a load balancer should send its buyers elsewhere;
//! - **degraded** when it answers but a part of it does not serve: masters that refuse writes
//!   (a sale homed there fails with nothing written, `NOREPLICAS`), are out of reach or see the
//!   cluster down, each with the segments of the known SKUs that live there; or SKUs this
//!   engine served whose metadata is gone (Redis came back empty: they answer `not_loaded`
//!   until reloaded). Buyers of the other segments and SKUs are served, here as on any other
//!   instance, so this is no reason to take the instance out of a load balancer, but one to
//!   page: it names what to repair;
//! - **ready** otherwise (an in-process store always is).
//!
//! Each change of state is logged once (a warning, or `info` when ready again).

use super::Engine;
use crate::ids::Sku;
use crate::store::{ServerState, Store};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// Default bound of a readiness look (`shardstock::http::ApiOptions::ready_timeout`).
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(1);

/// The readiness of an engine's store ([`Engine::readiness`]); as JSON, the body of `GET
/// /readyz`.
///
/// - **unavailable** when the store does not answer at all (a single Redis down or out of
///   reach, no cluster master answering or every one that answers seeing the cluster down);
/// - **degraded** when it answers but a part of it does not serve: masters that refuse writes,
///   are out of reach or see the cluster down, each with the segments of the known SKUs on
///   it; or SKUs this engine served whose metadata is gone;
/// - **ready** otherwise (an in-process store always is).
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Readiness {
    /// `ready`, `degraded` (the store answers, a part of it does not serve: see `problems`
    /// and `vanished_skus`) or `unavailable` (the store does not answer: see `reason`).
    pub status: ReadyStatus,
    /// `redis` or `memory`.
    #[cfg_attr(feature = "http", schema(example = "redis"))]
    pub store: &'static str,
    /// Why the store is unavailable, in words (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The servers that do not serve fully, each with what is wrong and the segments of the
    /// SKUs this engine knows that live there.
    pub problems: Vec<ServerProblem>,
    /// SKUs this engine has served whose metadata is gone from the store (Redis restarted
    /// empty, or flushed): they answer `not_loaded` until loaded again.
    pub vanished_skus: Vec<String>,
    /// How long the look took, in milliseconds.
    pub took_ms: u64,
    /// Its bound: a server that had not answered by then counts as unreachable.
    pub timeout_ms: u64,
}

impl Readiness {
    /// Whether the store answers ([`ReadyStatus::Ready`] or [`ReadyStatus::Degraded`]): what a
    /// load balancer's readiness probe should check.
    pub fn is_ready(&self) -> bool {
        self.status != ReadyStatus::Unavailable
    }
}

/// [`Readiness::status`].
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReadyStatus {
    /// Every server answers and takes writes; every SKU served is there.
    Ready,
    /// The store answers, but some servers do not serve or some SKUs vanished.
    Degraded,
    /// The store does not answer.
    Unavailable,
}

impl ReadyStatus {
    /// `ready`, `degraded`, `unavailable`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadyStatus::Ready => "ready",
            ReadyStatus::Degraded => "degraded",
            ReadyStatus::Unavailable => "unavailable",
        }
    }

    fn code(self) -> u8 {
        self as u8 + 1
    }
}

/// One server that does not serve fully ([`Readiness::problems`]).
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ServerProblem {
    /// `host:port`, as the cluster's slot map names it (the `master` of `shardstock status`'s
    /// placement).
    #[cfg_attr(feature = "http", schema(example = "127.0.0.1:7001"))]
    pub server: String,
    /// What is wrong.
    pub problem: ProblemKind,
    /// In words: Redis's own refusal (`NOREPLICAS Not enough good replicas to write.`), the
    /// cluster state, or why it did not answer.
    pub detail: String,
    /// The segments of the SKUs this engine knows that live on it (by index), per SKU.
    pub skus: Vec<SkuSegments>,
}

/// [`ServerProblem::problem`].
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProblemKind {
    /// It answers but refuses every write (`NOREPLICAS`, `OOM`, `MISCONF`, `READONLY`): sales
    /// homed on its segments fail with nothing written; reads work.
    RefusesWrites,
    /// It sees the cluster down: commands with keys answer `CLUSTERDOWN`.
    ClusterDown,
    /// No answer within the bound, or the connection failed.
    Unreachable,
}

/// Segments of one SKU ([`ServerProblem::skus`]).
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SkuSegments {
    /// The SKU.
    pub sku: String,
    /// Its segments there, by index.
    pub segments: Vec<u32>,
}

impl<S: Store> Engine<S> {
    /// Notes that this engine serves `sku`, in `generation` (its readiness and the live audit
    /// check the SKU is still there).
    pub(super) fn saw(&self, sku: &Sku, generation: u64) {
        match self.inner.seen.get_mut(sku) {
            Some(mut g) if *g != generation => *g = generation,
            Some(_) => {}
            None => {
                self.inner.seen.insert(sku.clone(), generation);
            }
        }
    }

    /// Is the store there for this engine, and what of it is not? One look bounded by
    /// `timeout`: every server of the store asked ([`Store::health`]) and the metadata of
    /// every SKU this engine has loaded or served read, at the same time (what makes it
    /// ready, degraded or unavailable: [`Readiness`]). Never an error: a failure is what it
    /// reports. A change of state since the last look is logged.
    pub async fn readiness(&self, timeout: Duration) -> Readiness {
        let start = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let store = &self.inner.store;
        let mut known: Vec<Sku> = self.inner.seen.iter().map(|e| e.key().clone()).collect();
        known.sort();
        let metas = futures::future::join_all(
            known
                .iter()
                .map(|sku| tokio::time::timeout_at(deadline, store.meta(sku))),
        );
        let (health, metas) = futures::join!(store.health(timeout), metas);
        // Only a definite answer says a SKU vanished. Where each segment lives: the metadata
        // read now, or, when it could not be read (its master does not answer), the cached
        // layout's.
        let mut vanished_skus = Vec::new();
        let mut layouts: Vec<(&Sku, u32, crate::cluster::placement::Placement)> = Vec::new();
        for (sku, m) in known.iter().zip(metas) {
            match m {
                Ok(Ok(Some(m))) => layouts.push((sku, m.segments, m.placement)),
                Ok(Ok(None)) => vanished_skus.push(sku.to_string()),
                _ => {
                    if let Some(l) = self.inner.layouts.get(sku) {
                        layouts.push((sku, l.segments, l.placement.clone()));
                    }
                }
            }
        }
        let mut problems: Vec<ServerProblem> = health
            .servers
            .iter()
            .filter_map(|s| {
                let (problem, detail) = match &s.state {
                    ServerState::Ok => return None,
                    ServerState::RefusesWrites(d) => (ProblemKind::RefusesWrites, d),
                    ServerState::ClusterDown(d) => (ProblemKind::ClusterDown, d),
                    ServerState::Unreachable(d) => (ProblemKind::Unreachable, d),
                };
                Some(ServerProblem {
                    server: s.server.clone(),
                    problem,
                    detail: detail.clone(),
                    skus: Vec::new(),
                })
            })
            .collect();
        // Which segments of the known SKUs live on each server in trouble.
        for (sku, segments, placement) in &layouts {
            for index in 0..*segments {
                let slot = crate::cluster::placement::slot_of_tag(&placement.tag(sku, index));
                let Some(at) = health.servers.iter().position(|s| s.serves(slot)) else {
                    continue;
                };
                let Some(p) = problems
                    .iter_mut()
                    .find(|p| p.server == health.servers[at].server)
                else {
                    continue;
                };
                match p.skus.last_mut() {
                    Some(last) if last.sku == sku.as_str() => last.segments.push(index),
                    _ => p.skus.push(SkuSegments {
                        sku: sku.to_string(),
                        segments: vec![index],
                    }),
                }
            }
        }
        let answering = health.servers.iter().any(|s| s.state.answers());
        let reason = if health.servers.is_empty() {
            health.error.clone()
        } else if !answering {
            Some(unavailable(&problems))
        } else {
            None
        };
        let status = if reason.is_some() {
            ReadyStatus::Unavailable
        } else if problems.is_empty() && vanished_skus.is_empty() {
            ReadyStatus::Ready
        } else {
            ReadyStatus::Degraded
        };
        let r = Readiness {
            status,
            store: store.name(),
            reason,
            problems,
            vanished_skus,
            took_ms: start.elapsed().as_millis() as u64,
            timeout_ms: timeout.as_millis() as u64,
        };
        self.log_change(&r);
        r
    }

    /// Logs `r` when its state differs from the last look's.
    fn log_change(&self, r: &Readiness) {
        let before = self.inner.last_ready.swap(r.status.code(), Relaxed);
        if before == r.status.code() {
            return;
        }
        match r.status {
            ReadyStatus::Ready if before != 0 => tracing::info!("store ready again"),
            ReadyStatus::Ready => {}
            ReadyStatus::Degraded => {
                let problems: Vec<String> = r
                    .problems
                    .iter()
                    .map(|p| format!("{} {:?}: {}", p.server, p.problem, p.detail))
                    .collect();
                tracing::warn!(?problems, vanished_skus = ?r.vanished_skus,
                    "store degraded: a part of it does not serve");
            }
            ReadyStatus::Unavailable => tracing::warn!(
                reason = r.reason.as_deref().unwrap_or(""),
                "store unavailable: readiness fails"
            ),
        }
    }
}

/// Why a store none of whose servers answers is unavailable, in words.
fn unavailable(problems: &[ServerProblem]) -> String {
    let what = if problems
        .iter()
        .any(|p| p.problem == ProblemKind::ClusterDown)
    {
        "redis cluster down"
    } else if problems.len() > 1 {
        "no redis master answers"
    } else {
        "redis unreachable"
    };
    let each: Vec<String> = problems
        .iter()
        .map(|p| format!("{}: {}", p.server, p.detail))
        .collect();
    format!("{what} ({})", each.join("; "))
}
