//! Evacuation: a cluster master's slots that hold this store's keys moved, keys and all, to
//! masters that can replicate — so a master that refuses writes (`min-replicas-to-write` after
//! its replica was promoted, or an operator draining it) stops freezing the stock and the
//! buyers homed on it.
//!
//! Why slots and not requests: a request is decided at its home segment, where its user's
//! ledger is; deciding it anywhere else would need the home fenced first, and a master that
//! refuses writes cannot be written to fence it. Redis Cluster already has a fence that needs
//! no write on the source: slot ownership. A slot claimed by another master with a newer
//! config epoch is dropped by the source as soon as it hears of it, and from then on every
//! command for it there answers `MOVED`. So the sale protocol stays as it is; only where a
//! segment lives changes, and the store already follows a moved slot (`moving`).
//!
//! Per slot, with the source's writes paused (`CLIENT PAUSE <ms> WRITE`, renewed as it runs):
//! 1. the target is told it imports the slot (`CLUSTER SETSLOT <slot> IMPORTING <source>`) and
//!    keeps no leftover copies of it from an evacuation that died half-way;
//! 2. every key of the slot is copied: `PEXPIRETIME` + `DUMP` at the source (reads, which a
//!    refusing master still serves), `ASKING` + `RESTORE … REPLACE ABSTTL` at the target;
//! 3. the copies are waited for (`WAIT`) on the target's replicas;
//! 4. if the source is still the slot's master and the pause held throughout, the target
//!    claims the slot (`CLUSTER SETSLOT <slot> NODE <target>`: it bumps its config epoch and
//!    tells every node at once);
//! 5. the source is asked until it names the target as the slot's owner (it has then deleted
//!    its own copies).
//!
//! Then the source's writes resume: a write it held back runs its command anew and gets
//! `MOVED` (the client sends it to the target), so nothing written at the source after its
//! keys were copied can exist. The pause is renewed whenever a third of it has passed, and a
//! slot is claimed only if no step outlasted it (a source stopped or slowed mid-copy could
//! have run a write after its key was read): otherwise the evacuation fails with the slot
//! still the source's.
//!
//! Writes resume between slots: each slot's copy pauses them again before its first read.
//!
//! Failures. One before step 4 undoes the target's importing mark and copies (best effort;
//! the next evacuation of the slot clears them too) and leaves the slot the source's. After
//! the claim the pause is kept until the source names the target, however long that takes,
//! unless the target turns out not to own the slot (the claim did not apply). A process dying
//! mid-slot leaves the pause to lapse: before the claim the slot is still the source's; after
//! it, the source heard of the claim when it was made if its cluster bus was up (the target
//! broadcasts it). Slots being resharded already are refused, and a target that does not name
//! the source as the owner does not claim.
//!
//! Run one evacuation of a master at a time (as with `redis-cli --cluster reshard`): two could
//! copy one slot to two targets that both claim it, and one's `CLIENT UNPAUSE` ends the
//! other's pause. One `--watch` per cluster, and no `--from` beside it.

use crate::error::{Error, Result};
use fred::prelude::{Builder, Client, ClientLike, Config, ServerConfig};
use fred::types::config::Server;
use fred::types::{ClusterHash, CustomCommand, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

/// An evacuation that cannot go on: a cluster condition (kind `redis`, as the store's "slot
/// map not known yet"), not a SKU being loaded.
fn refused(msg: String) -> Error {
    Error::Redis(fred::error::Error::new(
        fred::error::ErrorKind::Cluster,
        format!("evacuation: {msg}"),
    ))
}

/// How an evacuation runs ([`super::RedisStore::evacuate`]).
#[derive(Debug, Clone)]
pub struct EvacuateOptions {
    /// How long the source's writes stay paused if this process dies mid-way (renewed while a
    /// slot moves; `CLIENT UNPAUSE` once it has moved). Bounds: 1 s ..= 300 s. Default 10 s.
    pub pause: Duration,
    /// Replicas of a target that must hold the copies (`WAIT`) before it claims a slot; a
    /// master with fewer replicas in sync is no target. Default: the store's
    /// `wait_replicas`, at least 1. 0 waits for none (a cluster without replicas).
    pub replicas: u32,
    /// How long step 3 waits for those replicas. Bounds: 10 ms ..= 9 s (below the dedicated
    /// connections' 10 s command timeout), and below half of `pause` (the claim needs the
    /// pause renewed within half of it). Default 2 s.
    pub wait_timeout: Duration,
    /// Keys copied per round trip. Bounds: 1 ..= 10,000. Default 256.
    pub batch: usize,
}

impl EvacuateOptions {
    /// The defaults for a store waiting for `wait_replicas` replicas (at least one is waited
    /// for: a copy that only the target holds would die with it).
    pub fn new(wait_replicas: u32) -> Self {
        Self {
            pause: Duration::from_secs(10),
            replicas: wait_replicas.max(1),
            wait_timeout: Duration::from_secs(2),
            batch: 256,
        }
    }

    /// Checks every bound; a bad option is [`Error::InvalidInput`].
    pub fn check(&self) -> Result<()> {
        let bad = |field, reason: &str| {
            Err(Error::InvalidInput {
                field,
                reason: reason.to_string(),
            })
        };
        if !(Duration::from_secs(1)..=Duration::from_secs(300)).contains(&self.pause) {
            return bad("pause", "must be 1 s ..= 300 s");
        }
        if self.replicas > 16 {
            return bad("replicas", "must be 0 ..= 16");
        }
        if !(Duration::from_millis(10)..=Duration::from_secs(9)).contains(&self.wait_timeout) {
            return bad("wait_timeout", "must be 10 ms ..= 9 s");
        }
        if self.wait_timeout >= self.pause / 2 {
            return bad("wait_timeout", "must be below half of pause");
        }
        if !(1..=10_000).contains(&self.batch) {
            return bad("batch", "must be 1 ..= 10000");
        }
        Ok(())
    }
}

/// One slot moved.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MovedSlot {
    /// The hash slot.
    pub slot: u16,
    /// The master that owns it now (`host:port`).
    pub to: String,
    /// Keys copied (every key of the slot, this store's and any other's).
    pub keys: usize,
}

/// What [`super::RedisStore::evacuate`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Evacuation {
    /// The master evacuated (`host:port`).
    pub from: String,
    /// The slots moved, in order.
    pub slots: Vec<MovedSlot>,
    /// Wall time of the whole evacuation, in milliseconds.
    pub took_ms: u64,
}

/// A master as `INFO replication` and `CONFIG GET min-replicas-to-write` describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Health {
    /// It is a master.
    pub(crate) master: bool,
    /// Replicas in sync (online, lag ≤ 2 s; `min_slaves_good_slaves` when Redis counts them).
    pub(crate) good: u32,
    /// Its `min-replicas-to-write` (0: off).
    pub(crate) required: u32,
}

impl Health {
    /// It refuses every write now (`NOREPLICAS`).
    pub(crate) fn refusing(&self) -> bool {
        self.master && self.good < self.required
    }

    /// It may take slots from an evacuation waiting for `replicas`.
    pub(crate) fn can_take(&self, replicas: u32) -> bool {
        self.master && !self.refusing() && self.good >= replicas
    }

    /// Parses `INFO replication` and the `min-replicas-to-write` setting.
    pub(crate) fn parse(info: &str, required: u32) -> Self {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
        };
        let master = field("role") == Some("master");
        let good = match field("min_slaves_good_slaves").and_then(|v| v.parse().ok()) {
            Some(g) => g,
            // Without min-replicas-to-write Redis does not count them: online replicas whose
            // last acknowledgement is at most 2 s old.
            None => info
                .lines()
                .filter(|l| {
                    let l = l.trim();
                    l.starts_with("slave")
                        && l.contains("state=online")
                        && l.split(',')
                            .find_map(|kv| kv.strip_prefix("lag="))
                            .and_then(|v| v.parse::<u64>().ok())
                            .is_some_and(|lag| lag <= 2)
                })
                .count() as u32,
        };
        Self {
            master,
            good,
            required,
        }
    }
}

/// The owner of each slot range, as one node's `CLUSTER SLOTS` answers it: (start, end,
/// owner's node id).
pub(crate) fn parse_slots(v: &Value) -> Result<Vec<(u16, u16, String)>> {
    let bad = || Error::Protocol(format!("CLUSTER SLOTS answered {v:?}"));
    let Value::Array(ranges) = v else {
        return Err(bad());
    };
    let mut out = Vec::with_capacity(ranges.len());
    for r in ranges {
        let Value::Array(r) = r else {
            return Err(bad());
        };
        let (Some(start), Some(end), Some(Value::Array(owner))) = (
            r.first().and_then(Value::as_u64),
            r.get(1).and_then(Value::as_u64),
            r.get(2),
        ) else {
            return Err(bad());
        };
        let id = owner.get(2).and_then(Value::as_string).ok_or_else(bad)?;
        let (Ok(start), Ok(end)) = (u16::try_from(start), u16::try_from(end)) else {
            return Err(bad());
        };
        out.push((start, end, id));
    }
    Ok(out)
}

/// The owner's id of `slot` in `ranges`.
fn owner(ranges: &[(u16, u16, String)], slot: u16) -> Option<&str> {
    ranges
        .iter()
        .find(|(s, e, _)| (*s..=*e).contains(&slot))
        .map(|(_, _, id)| id.as_str())
}

/// The targets of `slots`, spread over `targets` in turn: (slot, target index).
pub(crate) fn assign(slots: &[u16], targets: usize) -> Vec<(u16, usize)> {
    slots
        .iter()
        .enumerate()
        .map(|(i, &s)| (s, i % targets.max(1)))
        .collect()
}

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

    async fn call<R: fred::types::FromValue>(
        &self,
        name: &'static str,
        args: Vec<Value>,
    ) -> Result<R> {
        Ok(self.client.custom(cmd(name), args).await?)
    }

    async fn id(&self) -> Result<String> {
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
            super::wait::setting(&cfg, key).map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX))
        };
        // `min-replicas-max-lag 0` turns the refusal off.
        let required = if setting("min-replicas-max-lag") == 0 {
            0
        } else {
            setting("min-replicas-to-write")
        };
        Ok(Health::parse(&info, required))
    }

    async fn slots(&self) -> Result<Vec<(u16, u16, String)>> {
        let v: Value = self.call("CLUSTER", vec!["SLOTS".into()]).await?;
        parse_slots(&v)
    }

    /// The slots this node has open ([`open_slots`] of its `CLUSTER NODES`).
    async fn open_slots(&self) -> Result<Vec<(u16, String, bool)>> {
        let nodes: String = self.call("CLUSTER", vec!["NODES".into()]).await?;
        Ok(open_slots(&nodes))
    }

    /// This node imports `slot` from node `from` (a claim clears the mark); false when it
    /// cannot tell.
    async fn imports(&self, slot: u16, from: &str) -> bool {
        self.open_slots()
            .await
            .is_ok_and(|o| o.iter().any(|(s, p, imp)| *s == slot && *imp && p == from))
    }

    async fn keys_in_slot(&self, slot: u16) -> Result<Vec<Value>> {
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
    async fn slots_with(&self, prefix: &str) -> Result<BTreeSet<u16>> {
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

    async fn pause_writes(&self, pause: Duration) -> Result<()> {
        let ms = i64::try_from(pause.as_millis()).unwrap_or(i64::MAX);
        self.call::<()>("CLIENT", vec!["PAUSE".into(), ms.into(), "WRITE".into()])
            .await
    }

    async fn unpause(&self) -> Result<()> {
        self.call::<()>("CLIENT", vec!["UNPAUSE".into()]).await
    }

    pub(crate) async fn quit(self) {
        let _ = self.client.quit().await;
    }
}

/// The source's write pause for one slot: renewed before it can lapse, and known to have
/// held without a gap — a copy is claimed only if no write could have run at the source since
/// it was read.
struct Pause<'a> {
    node: &'a Node,
    len: Duration,
    /// When the last renewal was sent: the pause it set lasts at least `len` from then.
    sent: Instant,
    /// Set by this slot (`CLIENT UNPAUSE` is then owed to the source).
    on: bool,
    /// The pause may have lapsed since the slot's copy began.
    gap: bool,
    /// A claim was sent and the source has not yet named its new owner: the pause must not be
    /// lifted (the source would take writes the target's claim then wipes).
    claim_unconfirmed: bool,
}

impl<'a> Pause<'a> {
    fn new(node: &'a Node, len: Duration) -> Self {
        Self {
            node,
            len,
            sent: Instant::now(),
            on: false,
            gap: false,
            claim_unconfirmed: false,
        }
    }

    /// Sends a renewal. The previous pause held until at least `sent + len`; the new one
    /// starts when Redis runs it, at the latest when its reply is back: if that can be after
    /// the previous one ended, writes may have run in between (a gap). A tenth of the pause
    /// is kept as margin for the two clocks.
    async fn renew(&mut self) -> Result<()> {
        let sent = Instant::now();
        self.node.pause_writes(self.len).await?;
        if self.on && self.sent.elapsed() >= self.len - self.len / 10 {
            self.gap = true;
        }
        self.sent = sent;
        self.on = true;
        Ok(())
    }

    /// Renews the pause once a third of it has passed.
    async fn keep(&mut self) -> Result<()> {
        if self.sent.elapsed() >= self.len / 3 {
            self.renew().await?;
        }
        Ok(())
    }

    /// A slot's copy begins: paused from now on, no gap so far (writes before this renewal
    /// are in what the copy reads).
    async fn fresh(&mut self) -> Result<()> {
        self.renew().await?;
        self.gap = false;
        Ok(())
    }

    /// Lifts the pause if this slot set it and no claim is unconfirmed.
    async fn lift(&mut self) -> Result<()> {
        if self.on && !self.claim_unconfirmed {
            self.on = false;
            self.node.unpause().await?;
        }
        Ok(())
    }
}

/// Sends `commands` as one pipeline and fails on the first error.
async fn pipeline(
    client: &Client,
    commands: Vec<(&'static str, Vec<Value>)>,
) -> Result<Vec<Value>> {
    let p = client.pipeline();
    for (name, args) in commands {
        let _: () = p.custom(cmd(name), args).await?;
    }
    let mut out = Vec::new();
    for r in p.try_all::<Value>().await {
        out.push(r?);
    }
    Ok(out)
}

/// The slots a node has open (`CLUSTER NODES`, its own line): `[<slot>->-<id>]` migrating to
/// `<id>`, `[<slot>-<-<id>]` importing from it. (slot, peer id, importing).
pub(crate) fn open_slots(nodes: &str) -> Vec<(u16, String, bool)> {
    let Some(me) = nodes.lines().find(|l| {
        l.split_whitespace()
            .nth(2)
            .is_some_and(|f| f.split(',').any(|x| x == "myself"))
    }) else {
        return Vec::new();
    };
    me.split_whitespace()
        .filter_map(|f| f.strip_prefix('[')?.strip_suffix(']'))
        .filter_map(|f| {
            let (slot, importing, peer) = if let Some((s, p)) = f.split_once("->-") {
                (s, false, p)
            } else {
                let (s, p) = f.split_once("-<-")?;
                (s, true, p)
            };
            Some((slot.parse().ok()?, peer.to_string(), importing))
        })
        .collect()
}

/// Deletes `dst`'s copies of `slot` (needs its importing mark: `ASKING` + `DEL`).
async fn clear_copies(dst: &Node, slot: u16, batch: usize) -> Result<()> {
    let stale = dst.keys_in_slot(slot).await?;
    for chunk in stale.chunks(batch) {
        let mut c = Vec::with_capacity(chunk.len() * 2);
        for k in chunk {
            c.push(("ASKING", vec![]));
            c.push(("DEL", vec![k.clone()]));
        }
        pipeline(&dst.client, c).await?;
    }
    Ok(())
}

/// Moves `slot` from `src` to `dst` (module docs, steps 1–5) under `pause`.
async fn move_slot(
    src: &Node,
    pause: &mut Pause<'_>,
    src_id: &str,
    dst: &Node,
    dst_id: &str,
    slot: u16,
    opts: &EvacuateOptions,
) -> Result<usize> {
    let setslot = |what: &'static str, id: &str| {
        vec![
            "SETSLOT".into(),
            slot.into(),
            what.into(),
            id.to_string().into(),
        ]
    };
    // 1. Importing, without leftovers of an evacuation that died before its claim.
    let _: () = dst.call("CLUSTER", setslot("IMPORTING", src_id)).await?;
    clear_copies(dst, slot, opts.batch).await?;
    // 2. Every key copied, with its absolute expiry.
    pause.fresh().await?;
    let keys = src.keys_in_slot(slot).await?;
    let mut copied = 0;
    for chunk in keys.chunks(opts.batch) {
        pause.keep().await?;
        let mut reads = Vec::with_capacity(chunk.len() * 2);
        for k in chunk {
            reads.push(("PEXPIRETIME", vec![k.clone()]));
            reads.push(("DUMP", vec![k.clone()]));
        }
        let got = pipeline(&src.client, reads).await?;
        let mut writes = Vec::with_capacity(chunk.len() * 2);
        for (k, pair) in chunk.iter().zip(got.chunks(2)) {
            let at = pair[0]
                .as_i64()
                .ok_or_else(|| Error::Protocol(format!("PEXPIRETIME answered {:?}", pair[0])))?;
            if at == -2 || pair[1].is_null() {
                continue; // gone since it was listed
            }
            writes.push(("ASKING", vec![]));
            let mut args = vec![
                k.clone(),
                at.max(0).into(),
                pair[1].clone(),
                "REPLACE".into(),
            ];
            if at > 0 {
                args.push("ABSTTL".into());
            }
            writes.push(("RESTORE", args));
            copied += 1;
        }
        pipeline(&dst.client, writes).await?;
    }
    // 3. The copies on the target's replicas.
    if opts.replicas > 0 {
        let ms = i64::try_from(opts.wait_timeout.as_millis()).unwrap_or(i64::MAX);
        let acked: i64 = dst
            .call("WAIT", vec![opts.replicas.into(), ms.into()])
            .await?;
        if acked < i64::from(opts.replicas) {
            return Err(refused(format!(
                "evacuating slot {slot}: {acked} of {} replicas of {} took the copies within {} ms; \
                 the slot stays on {}",
                opts.replicas,
                dst.name(),
                ms,
                src.name()
            )));
        }
    }
    // 4. The claim, only if the source still is the slot's master (a failover of it would have
    // a new master writing unpaused) and the pause held from the first read to now: renewed
    // last, right before the claim is sent.
    // The target too must name the source as the owner: a claim an earlier evacuation made
    // elsewhere, which the source has not heard of yet, must not be overtaken.
    if !src.health().await?.master
        || owner(&src.slots().await?, slot) != Some(src_id)
        || owner(&dst.slots().await?, slot) != Some(src_id)
    {
        return Err(refused(format!(
            "evacuating slot {slot}: {} is no longer its owner (as it or {} sees it); the slot \
             stays where it is",
            src.name(),
            dst.name()
        )));
    }
    pause.renew().await?;
    if pause.gap || pause.sent.elapsed() >= pause.len / 2 {
        return Err(refused(format!(
            "evacuating slot {slot}: copying it outlasted the write pause ({} ms), so a write \
             may have run at {} after its key was read; the slot stays there (raise the pause)",
            opts.pause.as_millis(),
            src.name()
        )));
    }
    pause.claim_unconfirmed = true;
    if let Err(e) = dst.call::<()>("CLUSTER", setslot("NODE", dst_id)).await {
        // Not applied for sure only if the target still imports the slot (a claim clears the
        // mark): then the slot stays the source's. Otherwise it may have been applied.
        if dst.imports(slot, src_id).await {
            pause.claim_unconfirmed = false;
            return Err(e);
        }
        tracing::warn!(
            "evacuation: the claim of slot {slot} by {} answered {e}; waiting for {} to name \
             its owner",
            dst.name(),
            src.name()
        );
    }
    // 5. The source has heard of it (and dropped its copies) before its writes resume. Until
    // then the pause is renewed, also on error: lifting it could let writes run that the claim
    // then wipes.
    let start = Instant::now();
    let mut warned = start;
    loop {
        if let Ok(r) = src.slots().await
            && owner(&r, slot) == Some(dst_id)
        {
            pause.claim_unconfirmed = false;
            if pause.gap {
                tracing::error!(
                    "evacuation: slot {slot} moved to {}, but the write pause on {} may have \
                     lapsed before it heard of the claim: writes it ran in between are gone \
                     (audit the SKUs on that slot)",
                    dst.name(),
                    src.name()
                );
            }
            return Ok(copied);
        }
        if let Err(e) = pause.keep().await {
            tracing::warn!("evacuation: renewing the pause on {}: {e}", src.name());
        }
        // The pause is kept for as long as it takes: lifting it while the target owns the slot
        // and the source does not know could let writes run there that the claim then wipes.
        // Only a target that does not own the slot (the claim did not apply) ends the wait.
        if start.elapsed() > Duration::from_secs(10) {
            if let Ok(r) = dst.slots().await
                && owner(&r, slot) != Some(dst_id)
            {
                pause.claim_unconfirmed = false;
                return Err(refused(format!(
                    "slot {slot}: the claim by {} did not apply; the slot stays on {}",
                    dst.name(),
                    src.name()
                )));
            }
            if warned.elapsed() > Duration::from_secs(60) {
                warned = Instant::now();
                tracing::warn!(
                    "evacuation: {} has not named {} the owner of slot {slot} yet; its writes \
                     stay paused until it does (check its cluster bus: CLUSTER NODES)",
                    src.name(),
                    dst.name()
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Undoes what a failed [`move_slot`] left on the target before its claim: the importing mark
/// and the copies (best effort: an evacuation of the slot later clears them too). Only while
/// the target still imports the slot from the source: a target that owns it keeps its keys.
async fn abandon(dst: &Node, src_id: &str, slot: u16, batch: usize) {
    if !dst.imports(slot, src_id).await {
        return;
    }
    if let Err(e) = clear_copies(dst, slot, batch).await {
        // Left importing, so no tool takes the copies for the slot's keys.
        tracing::warn!(
            "evacuation: copies of slot {slot} left on {} (still importing): {e}",
            dst.name()
        );
        return;
    }
    let r: Result<()> = dst
        .call(
            "CLUSTER",
            vec!["SETSLOT".into(), slot.into(), "STABLE".into()],
        )
        .await;
    if let Err(e) = r {
        tracing::warn!(
            "evacuation: slot {slot} left importing on {}: {e}",
            dst.name()
        );
    }
}

/// The evacuation of `from` (module docs): every slot of it holding keys under `prefix`, to
/// the masters in `masters` that can take them.
pub(crate) async fn evacuate(
    base: &Config,
    masters: &[Server],
    from: &str,
    prefix: &str,
    opts: &EvacuateOptions,
) -> Result<Evacuation> {
    opts.check()?;
    let start = Instant::now();
    let name = |s: &Server| format!("{}:{}", s.host, s.port);
    let src_server =
        masters
            .iter()
            .find(|s| name(s) == from)
            .ok_or_else(|| Error::InvalidInput {
                field: "from",
                reason: format!(
                    "{from} is not a master of the cluster (masters: {})",
                    masters.iter().map(name).collect::<Vec<_>>().join(", ")
                ),
            })?;
    let src = Node::open(base, src_server).await?;
    let mut targets: Vec<(Node, String)> = Vec::new();
    let mut pause = Pause::new(&src, opts.pause);
    let result = async {
        let src_id = src.id().await?;
        for s in masters.iter().filter(|s| name(s) != from) {
            match Node::open(base, s).await {
                Ok(n) => match n.health().await {
                    Ok(h) if h.can_take(opts.replicas) => match n.id().await {
                        Ok(id) => targets.push((n, id)),
                        Err(e) => {
                            tracing::warn!("evacuation: {} not a target: {e}", name(s));
                            n.quit().await
                        }
                    },
                    Ok(h) => {
                        tracing::info!("evacuation: {} not a target: {h:?}", name(s));
                        n.quit().await
                    }
                    Err(e) => {
                        tracing::warn!("evacuation: {} not a target: {e}", name(s));
                        n.quit().await
                    }
                },
                Err(e) => tracing::warn!("evacuation: {} not a target: {e}", name(s)),
            }
        }
        if targets.is_empty() {
            return Err(refused(format!(
                "no master but {from} can take its slots (each needs {} replica(s) in sync and \
                 must accept writes)",
                opts.replicas
            )));
        }
        let owned = src.slots().await?;
        let slots: Vec<u16> = src
            .slots_with(prefix)
            .await?
            .into_iter()
            .filter(|&s| owner(&owned, s) == Some(src_id.as_str()))
            .collect();
        // A slot being resharded already is left to the reshard: its keys may be split
        // between the source and another node.
        let open = src.open_slots().await?;
        if let Some((slot, peer, _)) = open.iter().find(|(s, _, _)| slots.contains(s)) {
            return Err(refused(format!(
                "slot {slot} of {from} is being migrated (to node {peer}): finish or undo that \
                 reshard first (redis-cli --cluster fix)"
            )));
        }
        let mut moved = Vec::with_capacity(slots.len());
        for (slot, t) in assign(&slots, targets.len()) {
            let (dst, dst_id) = &targets[t];
            if let Some((_, peer, _)) = dst
                .open_slots()
                .await?
                .into_iter()
                .find(|(s, p, importing)| *s == slot && !(*importing && p == &src_id))
            {
                return Err(refused(format!(
                    "slot {slot} is open on {} (with node {peer}): finish or undo that reshard \
                     first (redis-cli --cluster fix)",
                    dst.name()
                )));
            }
            let keys = match move_slot(&src, &mut pause, &src_id, dst, dst_id, slot, opts).await {
                Ok(k) => k,
                Err(e) => {
                    if !pause.claim_unconfirmed {
                        // Before a claim the source may write again at once.
                        let _ = pause.lift().await;
                        abandon(dst, &src_id, slot, opts.batch).await;
                    }
                    return Err(e);
                }
            };
            // Writes resume between slots: the next slot's copy pauses them again first.
            pause.lift().await?;
            tracing::warn!(
                "evacuation: slot {slot} ({keys} keys) moved from {from} to {}",
                dst.name()
            );
            moved.push(MovedSlot {
                slot,
                to: dst.name(),
                keys,
            });
        }
        Ok(moved)
    }
    .await;
    // Writes resume unless a claim is unconfirmed (then the pause lapses by itself, after
    // `opts.pause`, and the error says so): a slot not claimed stays the source's.
    let lifted = pause.lift().await;
    for (t, _) in targets {
        t.quit().await;
    }
    src.quit().await;
    let slots = result?;
    lifted?;
    Ok(Evacuation {
        from: from.to_string(),
        slots,
        took_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
    })
}

/// Evacuates masters that keep refusing writes ([`super::RedisStore::evacuate_refusing`]):
/// remembers since when each master has refused, and which were evacuated during their
/// refusal (nothing of the store can come back to a master that refuses writes, so one
/// evacuation per refusal is enough).
#[derive(Debug, Default)]
pub struct RefusalWatch {
    since: HashMap<String, Instant>,
    evacuated: HashSet<String>,
}

impl RefusalWatch {
    /// A watch that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records what `health` says of each master (absent: not reachable, forgotten) and
    /// answers the ones refusing for at least `grace` and not yet evacuated.
    pub(crate) fn due(
        &mut self,
        health: &BTreeMap<String, Health>,
        grace: Duration,
    ) -> Vec<String> {
        let now = Instant::now();
        let refusing = |m: &String| health.get(m).is_some_and(Health::refusing);
        self.since.retain(|m, _| refusing(m));
        self.evacuated.retain(|m| refusing(m));
        let mut due = Vec::new();
        for (m, h) in health {
            if h.refusing() {
                let t = *self.since.entry(m.clone()).or_insert(now);
                if now.duration_since(t) >= grace && !self.evacuated.contains(m) {
                    due.push(m.clone());
                }
            }
        }
        due
    }

    /// Records that `master` was evacuated: not again until it has written in between.
    pub(crate) fn evacuated(&mut self, master: &str) {
        self.evacuated.insert(master.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO_REFUSING: &str = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\
        min_slaves_good_slaves:0\r\nmaster_failover_state:no-failover\r\n";
    const INFO_HEALTHY: &str = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n\
        slave0:ip=127.0.0.1,port=7104,state=online,offset=1190,lag=0\r\n";

    #[test]
    fn a_master_below_its_setting_refuses() {
        let h = Health::parse(INFO_REFUSING, 1);
        assert_eq!(
            h,
            Health {
                master: true,
                good: 0,
                required: 1
            }
        );
        assert!(h.refusing());
        assert!(!h.can_take(1));
        assert!(
            !Health::parse(INFO_REFUSING, 0).refusing(),
            "no setting, no refusal"
        );
    }

    #[test]
    fn online_replicas_count_without_the_setting() {
        let h = Health::parse(INFO_HEALTHY, 0);
        assert_eq!(h.good, 1);
        assert!(h.can_take(1));
        assert!(!h.can_take(2));
        let lagging = INFO_HEALTHY.replace("lag=0", "lag=7");
        assert_eq!(
            Health::parse(&lagging, 0).good,
            0,
            "a replica 7 s behind is not in sync"
        );
        let replica = "role:slave\r\nmaster_host:127.0.0.1\r\n";
        assert!(
            !Health::parse(replica, 1).refusing(),
            "a replica is no master"
        );
        assert!(!Health::parse(replica, 0).can_take(0));
    }

    #[test]
    fn slots_parse_and_owner() {
        let node = |id: &str| Value::Array(vec!["127.0.0.1".into(), 7101.into(), id.into()]);
        let v = Value::Array(vec![
            Value::Array(vec![0.into(), 99.into(), node("a"), node("ra")]),
            Value::Array(vec![100.into(), 16383.into(), node("b")]),
        ]);
        let r = parse_slots(&v).unwrap();
        assert_eq!(owner(&r, 0), Some("a"));
        assert_eq!(owner(&r, 99), Some("a"));
        assert_eq!(owner(&r, 100), Some("b"));
        assert!(parse_slots(&Value::from("x")).is_err());
        assert!(parse_slots(&Value::Array(vec![Value::Array(vec![0.into()])])).is_err());
    }

    #[test]
    fn open_slots_are_read_from_the_nodes_own_line() {
        let nodes = "a1 127.0.0.1:7101@17101 myself,master - 0 0 1 connected 0-5460 \
                     [77->-b2] [93-<-c3]\n\
                     b2 127.0.0.1:7102@17102 master - 0 0 2 connected 5461-10922 [5-<-a1]\n";
        assert_eq!(
            open_slots(nodes),
            vec![(77, "b2".to_string(), false), (93, "c3".to_string(), true)]
        );
        assert!(
            open_slots("a1 127.0.0.1:7101@17101 myself,master - 0 0 1 connected 0-16383\n")
                .is_empty()
        );
        assert!(open_slots("").is_empty());
    }

    #[test]
    fn slots_spread_over_targets_in_turn() {
        assert_eq!(assign(&[5, 6, 7], 2), vec![(5, 0), (6, 1), (7, 0)]);
        assert!(assign(&[], 3).is_empty());
    }

    #[test]
    fn options_are_bounded() {
        assert!(EvacuateOptions::new(0).check().is_ok());
        assert_eq!(EvacuateOptions::new(0).replicas, 1);
        let with = |f: fn(&mut EvacuateOptions)| {
            let mut o = EvacuateOptions::new(1);
            f(&mut o);
            o.check()
        };
        assert!(with(|o| o.pause = Duration::from_millis(999)).is_err());
        assert!(with(|o| o.pause = Duration::from_secs(301)).is_err());
        assert!(with(|o| o.replicas = 17).is_err());
        assert!(with(|o| o.replicas = 0).is_ok());
        assert!(with(|o| o.wait_timeout = Duration::from_millis(9)).is_err());
        assert!(with(|o| o.wait_timeout = Duration::from_millis(9_001)).is_err());
        assert!(
            with(|o| {
                o.pause = Duration::from_secs(2);
                o.wait_timeout = Duration::from_secs(1);
            })
            .is_err(),
            "a WAIT as long as half the pause"
        );
        assert!(with(|o| o.batch = 0).is_err());
        assert!(with(|o| o.batch = 10_001).is_err());
    }

    #[test]
    fn a_master_is_due_after_refusing_for_the_grace_once_per_refusal() {
        let mut w = RefusalWatch::new();
        let refusing = Health::parse(INFO_REFUSING, 1);
        let healthy = Health::parse(INFO_HEALTHY, 1);
        let mut h = BTreeMap::from([("a:1".to_string(), refusing), ("b:2".to_string(), healthy)]);
        assert!(w.due(&h, Duration::from_secs(60)).is_empty(), "not yet");
        assert_eq!(w.due(&h, Duration::ZERO), vec!["a:1".to_string()]);
        w.evacuated("a:1");
        assert!(
            w.due(&h, Duration::ZERO).is_empty(),
            "evacuated during this refusal"
        );
        // Writable again: the clock starts over, and a new refusal is due again.
        h.insert("a:1".to_string(), healthy);
        assert!(w.due(&h, Duration::ZERO).is_empty());
        assert!(w.since.is_empty() && w.evacuated.is_empty());
        h.insert("a:1".to_string(), refusing);
        assert_eq!(w.due(&h, Duration::ZERO).len(), 1);
        // Unreachable: forgotten.
        h.remove("a:1");
        assert!(w.due(&h, Duration::ZERO).is_empty());
        assert!(w.since.is_empty());
    }
}
