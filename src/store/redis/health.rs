//! [`Store::health`](crate::store::Store::health) for Redis: every master asked, within one
//! deadline, whether it answers and whether it would take a write now.
//!
//! Per master (the one server of a single Redis; every master of the slot map the client routes
//! by), all at once:
//! - on a cluster, `CLUSTER INFO`: a node whose `cluster_state` is not `ok` answers every
//!   command with a key `CLUSTERDOWN`;
//! - `ready.lua` by `EVALSHA` (`SCRIPT LOAD` on `NOSCRIPT`): a script that may write, sent with
//!   no key. Redis refuses such a script before running it wherever it refuses a sale's
//!   (`NOREPLICAS`, `OOM`, `MISCONF`, `READONLY`), and where it runs it writes nothing. So the
//!   probe needs no right beyond what a sale needs (`scripts/acl.sh`: `EVALSHA`, `SCRIPT LOAD`,
//!   `CLUSTER INFO`) and reports the very refusal a sale homed there would get.
//!
//! Each command is sent once (`max_attempts` 1), fails at once on a connection that is down
//! (`fail_fast`), and is bounded by what is left of the deadline. The slot map is not asked
//! for afresh (`sync_cluster`): measured on a cluster with a master hung, that made the client
//! rebuild its connections and stop reaching the healthy masters too, sales included, seconds
//! before the cluster itself failed. The client refreshes its map on its own (a `MOVED`, a
//! lost connection), and the map it routes sales by is the one whose masters matter here.

use crate::store::{ALL_SLOTS, ServerHealth, ServerState, StoreHealth};
use fred::prelude::{Client, ClientLike, ClusterInterface};
use fred::types::config::{Options, Server, ServerConfig};
use fred::types::{ClusterHash, CustomCommand, Value};
use std::sync::LazyLock;
use std::time::Duration;
use tokio::time::Instant;

/// `ready.lua` as sent.
const PROBE: &str = include_str!("../../scripts/ready.lua");

/// Its SHA1, computed once.
static PROBE_SHA: LazyLock<String> = LazyLock::new(|| {
    fred::types::scripts::Script::from_lua(PROBE)
        .sha1()
        .to_string()
});

/// The first words of the errors with which Redis refuses a script that may write.
const REFUSALS: [&str; 4] = ["NOREPLICAS", "OOM", "MISCONF", "READONLY"];

/// Every master `client` knows, asked by `deadline`.
pub(super) async fn check(client: &Client, deadline: Instant) -> StoreHealth {
    if !client.is_clustered() {
        let name = match client.client_config().server {
            ServerConfig::Centralized { server } => server.to_string(),
            _ => "redis".to_string(),
        };
        let state = ask(client, None, deadline).await;
        return StoreHealth::of(vec![ServerHealth {
            server: name,
            slots: vec![ALL_SLOTS],
            state,
        }]);
    }
    let Some(state) = client.cached_cluster_state() else {
        return StoreHealth::unknown("the cluster's slot map is not known: no node answered");
    };
    let mut masters: Vec<(Server, Vec<(u16, u16)>)> = Vec::new();
    for r in state.slots() {
        match masters.iter_mut().find(|(s, _)| *s == r.primary) {
            Some((_, slots)) => slots.push((r.start, r.end)),
            None => masters.push((r.primary.clone(), vec![(r.start, r.end)])),
        }
    }
    if masters.is_empty() {
        return StoreHealth::unknown("the cluster's slot map names no master");
    }
    masters.sort_by_key(|(s, _)| s.to_string());
    let asked = masters
        .iter()
        .map(|(server, _)| ask(client, Some(server.clone()), deadline));
    let states = futures::future::join_all(asked).await;
    StoreHealth::of(
        masters
            .into_iter()
            .zip(states)
            .map(|((server, slots), state)| ServerHealth {
                server: server.to_string(),
                slots,
                state,
            })
            .collect(),
    )
}

/// One server (`node`; `None`: the single Redis), by `deadline`.
async fn ask(client: &Client, node: Option<Server>, deadline: Instant) -> ServerState {
    let bound = deadline.saturating_duration_since(Instant::now());
    let clustered = node.is_some();
    let options = Options {
        cluster_node: node,
        timeout: Some(bound.max(Duration::from_millis(1))),
        max_attempts: Some(1),
        max_redirections: Some(0),
        fail_fast: true,
        ..Default::default()
    };
    let c = client.with_options(&options);
    let cmd = |name: &'static str| CustomCommand::new_static(name, ClusterHash::Random, false);
    let asked = async {
        if clustered {
            let info: String = c.custom(cmd("CLUSTER"), vec!["INFO"]).await?;
            let state = info
                .lines()
                .find_map(|l| l.trim().strip_prefix("cluster_state:"))
                .unwrap_or("unknown");
            if state != "ok" {
                return Ok(ServerState::ClusterDown(format!("cluster_state:{state}")));
            }
        }
        let sha = PROBE_SHA.as_str();
        let mut ran: Result<Value, fred::error::Error> =
            c.custom(cmd("EVALSHA"), vec![sha, "0"]).await;
        if matches!(&ran, Err(e) if e.details().starts_with("NOSCRIPT")) {
            let _: Value = c.custom(cmd("SCRIPT"), vec!["LOAD", PROBE]).await?;
            ran = c.custom(cmd("EVALSHA"), vec![sha, "0"]).await;
        }
        match ran {
            Ok(_) => Ok(ServerState::Ok),
            Err(e) if REFUSALS.iter().any(|r| e.details().starts_with(r)) => {
                Ok(ServerState::RefusesWrites(e.details().to_string()))
            }
            Err(e) => Err(e),
        }
    };
    let silent = || ServerState::Unreachable(format!("no answer within {} ms", bound.as_millis()));
    match tokio::time::timeout_at(deadline, asked).await {
        Ok(Ok(state)) => state,
        Ok(Err(e)) if *e.kind() == fred::error::ErrorKind::Timeout => silent(),
        Ok(Err(e)) => ServerState::Unreachable(e.to_string()),
        Err(_) => silent(),
    }
}
