//! One cluster node on a connection of its own ([`Node`], which says why), and the commands an
//! evacuation and the refusal watch send it: its id, its slots and open slots, the keys of a
//! slot, a `SCAN` for the slots holding a prefix, its health, `CLIENT PAUSE WRITE` and
//! `UNPAUSE`, pipelines.
//!
//! The replies are read by the pure functions of [`super::slots`] and [`super::refusal`]; what
//! the commands are for is [`super::evacuate`]'s. Touches `error` and fred.

use super::refusal::Health;
use super::slots::{open_slots, parse_slots};
use crate::error::Result;
use fred::prelude::{Builder, Client, ClientLike, Config, ServerConfig};
use fred::types::config::Server;
use fred::types::{ClusterHash, CustomCommand, Value};
use std::collections::BTreeSet;
use std::time::Duration;

/// A connection of its own to one node: `ASKING` must be the command right before its
/// `RESTORE` on a connection, which a pool shared with sales cannot promise.
pub(crate) struct Node {
    pub(crate) server: Server,
    client: Client,
}

fn cmd(name: &'static str) -> CustomCommand {
    CustomCommand::new_static(name, ClusterHash::FirstKey, false)
}

impl Node {
    pub(crate) async fn open(base: &Config, server: &Server) -> Result<Self> {
        let mut config = base.clone();
        config.server = ServerConfig::Centralized {
            server: server.clone(),
        };
        let client = Builder::from_config(config)
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_secs(5);
                c.max_command_attempts = 1;
                c.max_redirections = 0;
            })
            .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(10))
            .build()?;
        client.init().await?;
        Ok(Self {
            server: server.clone(),
            client,
        })
    }

    pub(crate) fn name(&self) -> String {
        format!("{}:{}", self.server.host, self.server.port)
    }

    pub(super) async fn call<R: fred::types::FromValue>(
        &self,
        name: &'static str,
        args: Vec<Value>,
    ) -> Result<R> {
        Ok(self.client.custom(cmd(name), args).await?)
    }

    pub(super) async fn id(&self) -> Result<String> {
        self.call("CLUSTER", vec!["MYID".into()]).await
    }

    pub(crate) async fn health(&self) -> Result<Health> {
        let info: String = self.call("INFO", vec!["replication".into()]).await?;
        let cfg: Vec<String> = self
            .call(
                "CONFIG",
                vec![
                    "GET".into(),
                    "min-replicas-to-write".into(),
                    "min-replicas-max-lag".into(),
                ],
            )
            .await?;
        let setting = |key| {
            super::refusal::setting(&cfg, key).map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX))
        };
        // `min-replicas-max-lag 0` turns the refusal off.
        let required = if setting("min-replicas-max-lag") == 0 {
            0
        } else {
            setting("min-replicas-to-write")
        };
        Ok(Health::parse(&info, required))
    }

    pub(super) async fn slots(&self) -> Result<Vec<(u16, u16, String)>> {
        let v: Value = self.call("CLUSTER", vec!["SLOTS".into()]).await?;
        parse_slots(&v)
    }

    /// The slots this node has open ([`open_slots`] of its `CLUSTER NODES`).
    pub(super) async fn open_slots(&self) -> Result<Vec<(u16, String, bool)>> {
        let nodes: String = self.call("CLUSTER", vec!["NODES".into()]).await?;
        Ok(open_slots(&nodes))
    }

    /// This node imports `slot` from node `from` (a claim clears the mark); false when it
    /// cannot tell.
    pub(super) async fn imports(&self, slot: u16, from: &str) -> bool {
        self.open_slots()
            .await
            .is_ok_and(|o| o.iter().any(|(s, p, imp)| *s == slot && *imp && p == from))
    }

    pub(super) async fn keys_in_slot(&self, slot: u16) -> Result<Vec<Value>> {
        let n: u64 = self
            .call("CLUSTER", vec!["COUNTKEYSINSLOT".into(), slot.into()])
            .await?;
        if n == 0 {
            return Ok(Vec::new());
        }
        self.call(
            "CLUSTER",
            vec!["GETKEYSINSLOT".into(), slot.into(), (n as i64).into()],
        )
        .await
    }

    /// The slots holding keys under `prefix` (a `SCAN` of this node: it holds its own slots'
    /// keys only).
    pub(super) async fn slots_with(&self, prefix: &str) -> Result<BTreeSet<u16>> {
        let pattern = format!("{prefix}:*");
        let mut cursor = "0".to_string();
        let mut slots = BTreeSet::new();
        loop {
            let (next, keys): (String, Vec<Value>) = self
                .call(
                    "SCAN",
                    vec![
                        cursor.as_str().into(),
                        "MATCH".into(),
                        pattern.as_str().into(),
                        "COUNT".into(),
                        1000.into(),
                    ],
                )
                .await?;
            for k in keys {
                if let Some(b) = k.as_bytes() {
                    slots.insert(fred::types::cluster::ClusterRouting::hash_key(b));
                }
            }
            if next == "0" {
                return Ok(slots);
            }
            cursor = next;
        }
    }

    pub(super) async fn pause_writes(&self, pause: Duration) -> Result<()> {
        let ms = i64::try_from(pause.as_millis()).unwrap_or(i64::MAX);
        self.call::<()>("CLIENT", vec!["PAUSE".into(), ms.into(), "WRITE".into()])
            .await
    }

    pub(super) async fn unpause(&self) -> Result<()> {
        self.call::<()>("CLIENT", vec!["UNPAUSE".into()]).await
    }

    pub(crate) async fn quit(self) {
        let _ = self.client.quit().await;
    }

    /// Sends `commands` as one pipeline and fails on the first error.
    pub(super) async fn pipeline(
        &self,
        commands: Vec<(&'static str, Vec<Value>)>,
    ) -> Result<Vec<Value>> {
        let p = self.client.pipeline();
        for (name, args) in commands {
            let _: () = p.custom(cmd(name), args).await?;
        }
        let mut out = Vec::new();
        for r in p.try_all::<Value>().await {
            out.push(r?);
        }
        Ok(out)
    }
}
