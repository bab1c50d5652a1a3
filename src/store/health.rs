//! What a store says of its servers when asked ([`Store::health`](super::Store::health)): each
//! one asked within a bound, whether it answers and whether it would take a write now. The
//! engine turns this into its readiness ([`Engine::readiness`](crate::Engine::readiness)).

/// Every hash slot: what a single Redis (or an in-process store) serves.
pub const ALL_SLOTS: (u16, u16) = (0, 16383);

/// [`Store::health`](super::Store::health)'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StoreHealth {
    /// The servers asked: every master of a Redis Cluster, the one server of a single Redis;
    /// none for an in-process store, which has nothing to ask and is always there.
    pub servers: Vec<ServerHealth>,
    /// Why the servers could not even be listed (a cluster whose slot map is unknown: no node
    /// answered), if so.
    pub error: Option<String>,
}

impl StoreHealth {
    /// An in-process store's health: no server to ask, always there.
    pub fn in_process() -> Self {
        Self::default()
    }

    /// The health of `servers`.
    pub fn of(servers: Vec<ServerHealth>) -> Self {
        Self {
            servers,
            error: None,
        }
    }

    /// Servers could not be listed: `error` says why.
    pub fn unknown(error: impl Into<String>) -> Self {
        Self {
            servers: Vec::new(),
            error: Some(error.into()),
        }
    }
}

/// One server as [`Store::health`](super::Store::health) found it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerHealth {
    /// `host:port`, as the cluster's slot map names it (what
    /// [`SegmentHome::master`](crate::cluster::placement::SegmentHome::master) says).
    pub server: String,
    /// The hash slot ranges it serves, inclusive ([`ALL_SLOTS`] for a single Redis).
    pub slots: Vec<(u16, u16)>,
    /// What it answered.
    pub state: ServerState,
}

impl ServerHealth {
    /// Whether it serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
    }
}

/// What one server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerState {
    /// It answers and would run a script that may write: sales homed here can run.
    Ok,
    /// It answers but refuses every script that may write, before running it, as it refuses
    /// every sale: Redis's refusal, e.g. `NOREPLICAS Not enough good replicas to write.`
    /// (fewer replicas in sync than its `min-replicas-to-write`), `OOM …` (over `maxmemory`),
    /// `MISCONF …` (a failed background save stops writes), `READONLY …` (a replica). Reads
    /// still work; nothing is written by the refused calls.
    RefusesWrites(String),
    /// A cluster node whose view of the cluster is not `ok` (`cluster_state:fail`): every
    /// command with a key answers `CLUSTERDOWN` until the cluster heals.
    ClusterDown(String),
    /// No answer within the bound, a broken connection or another error: why.
    Unreachable(String),
}

impl ServerState {
    /// It answers commands with keys (reads at least): [`ServerState::Ok`] or
    /// [`ServerState::RefusesWrites`].
    pub fn answers(&self) -> bool {
        matches!(self, ServerState::Ok | ServerState::RefusesWrites(_))
    }
}
