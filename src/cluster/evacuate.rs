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
//!
//! This file: the options ([`EvacuateOptions`]) and what an evacuation answers, the choice of
//! targets (masters that take writes with enough replicas in sync) and of slots (the source's
//! slots holding the store's keys), and the per-slot procedure above with its write pause. The
//! commands go through `node`, the replies are read by `slots` and `refusal`; it touches
//! `error`, fred, tokio and tracing. `RedisStore::evacuate` and `evacuate_refusing` call it with
//! the masters and the key prefix.

use super::node::Node;
use super::slots::{assign, owner};
use crate::error::{Error, Result};
use fred::prelude::Config;
use fred::types::config::Server;
use std::time::{Duration, Instant};

// Here too, so that `store::redis::evacuate` names everything an evacuation takes.
pub use super::refusal::RefusalWatch;

/// An evacuation that cannot go on: a cluster condition (kind `redis`, as the store's "slot
/// map not known yet"), not a SKU being loaded.
fn refused(msg: String) -> Error {
    Error::Redis(fred::error::Error::new(
        fred::error::ErrorKind::Cluster,
        format!("evacuation: {msg}"),
    ))
}

/// How an evacuation runs ([`RedisStore::evacuate`](crate::RedisStore::evacuate)).
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

/// What [`RedisStore::evacuate`](crate::RedisStore::evacuate) did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Evacuation {
    /// The master evacuated (`host:port`).
    pub from: String,
    /// The slots moved, in order.
    pub slots: Vec<MovedSlot>,
    /// Wall time of the whole evacuation, in milliseconds.
    pub took_ms: u64,
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

/// Deletes `dst`'s copies of `slot` (needs its importing mark: `ASKING` + `DEL`).
async fn clear_copies(dst: &Node, slot: u16, batch: usize) -> Result<()> {
    let stale = dst.keys_in_slot(slot).await?;
    for chunk in stale.chunks(batch) {
        let mut c = Vec::with_capacity(chunk.len() * 2);
        for k in chunk {
            c.push(("ASKING", vec![]));
            c.push(("DEL", vec![k.clone()]));
        }
        dst.pipeline(c).await?;
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
        let got = src.pipeline(reads).await?;
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
        dst.pipeline(writes).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
