//! The outbox streams as a consumer group sees them: discovery, reads, claims, acks, dead
//! letters, trimming and lag (used by [`crate::orders::Orders`]).
//!
//! Every key of one stream (the stream, its dead letters, its failure reasons) shares the
//! segment's hash tag, so each call here goes to one node, and the two scripts that change
//! more than one key (`outbox_dead.lua`, `outbox_trim.lua`) are atomic on a cluster too.
//! Slots in motion are waited out like every other call (see `cluster::moving`).

pub(crate) use super::lua::outbox::{Entry, OutboxStream, StreamLag, entries};
use super::{RedisStore, lua};
use crate::cluster::moving;
use crate::error::Result;
use crate::ids::Sku;
use fred::interfaces::{HashesInterface, SetsInterface, StreamsInterface};
use fred::types::Value;
use fred::types::streams::XID;

impl RedisStore {
    /// SKUs ever loaded with the outbox on.
    pub(crate) async fn outbox_skus(&self) -> Result<Vec<Sku>> {
        let client = self.conn.pool.next();
        let key = self.conn.keys.outbox_skus();
        let names: Vec<String> = moving::follow(|| client.smembers(&key)).await?;
        // Only names that are valid SKUs were ever added (the engine validates first).
        Ok(names.into_iter().filter_map(|s| Sku::new(s).ok()).collect())
    }

    /// The outbox streams of `sku`: one per segment index any generation had with the
    /// outbox on (events outlive a reload that shrinks the SKU).
    pub(crate) async fn outbox_streams(&self, sku: &Sku) -> Result<Vec<OutboxStream>> {
        use crate::store::Store;
        let Some(meta) = self.meta(sku).await? else {
            return Ok(Vec::new());
        };
        let keys = &self.conn.keys;
        Ok((0..meta.outbox_segments)
            .map(|i| {
                let tag = meta.placement.tag(sku, i);
                OutboxStream {
                    sku: sku.clone(),
                    segment: i,
                    key: keys.outbox(&tag),
                    dead: keys.dead_letters(&tag),
                    why: keys.failures(&tag),
                }
            })
            .collect())
    }

    /// Creates `group` on the stream (from its first entry; the stream too when missing).
    /// An existing group is left as it is.
    pub(crate) async fn outbox_group(&self, s: &OutboxStream, group: &str) -> Result<()> {
        let client = self.conn.pool.next();
        let r: std::result::Result<Value, _> =
            moving::follow(|| client.xgroup_create(&s.key, group, XID::Manual("0".into()), true))
                .await;
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.details().contains("BUSYGROUP") => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Up to `count` entries never delivered to `group`, now delivered to `consumer`.
    pub(crate) async fn outbox_read(
        &self,
        s: &OutboxStream,
        group: &str,
        consumer: &str,
        count: u64,
    ) -> Result<Vec<Entry>> {
        let client = self.conn.pool.next();
        let v: Value = moving::follow(|| {
            client.xreadgroup(
                group,
                consumer,
                Some(count),
                None,
                false,
                s.key.as_str(),
                XID::NewInGroup,
            )
        })
        .await?;
        // RESP2: [[key, entries]]; RESP3: {key: entries}; nothing new: nil.
        let streams = match v {
            Value::Null => return Ok(Vec::new()),
            Value::Map(m) => m.inner().into_values().collect::<Vec<_>>(),
            other => other
                .into_array()
                .into_iter()
                .filter_map(|kv| kv.into_array().into_iter().nth(1))
                .collect(),
        };
        let mut out = Vec::new();
        for v in streams {
            out.extend(entries(v)?);
        }
        Ok(out)
    }

    /// `outbox_claim.lua`: entries pending in `group` for at least `min_idle_ms` (their
    /// consumer died, or their handler failed), now `consumer`'s, each with its delivery count
    /// (this delivery included); and the cursor to continue from (`0-0`: scanned through).
    pub(crate) async fn outbox_claim(
        &self,
        s: &OutboxStream,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
        cursor: &str,
        count: u64,
    ) -> Result<(String, Vec<(Entry, u64)>)> {
        let call = lua::outbox::Claim {
            stream: s,
            group,
            consumer,
            min_idle_ms,
            cursor,
            count,
        };
        self.conn.run(call).await
    }

    /// Acknowledges `ids` in `group`; forgets failure reasons of redelivered ones.
    pub(crate) async fn outbox_ack(
        &self,
        s: &OutboxStream,
        group: &str,
        ids: &[String],
        redelivered: &[String],
    ) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let client = self.conn.pool.next();
        let ids: Vec<XID> = ids.iter().map(|i| XID::Manual(i.clone().into())).collect();
        let _: u64 = moving::follow(|| client.xack(&s.key, group, ids.clone())).await?;
        if !redelivered.is_empty() {
            let _: u64 = moving::follow(|| client.hdel(&s.why, redelivered.to_vec())).await?;
        }
        Ok(())
    }

    /// Remembers why the handler refused entry `id` (named in its dead letter).
    pub(crate) async fn outbox_failed(
        &self,
        s: &OutboxStream,
        id: &str,
        reason: &str,
    ) -> Result<()> {
        let client = self.conn.pool.next();
        // Reasons are for people: bounded, so a handler's huge error cannot fill Redis.
        let reason: String = reason.chars().take(512).collect();
        let _: u64 = moving::follow(|| client.hset(&s.why, (id, reason.as_str()))).await?;
        Ok(())
    }

    /// `outbox_dead.lua`: moves entry `id` (pending for `consumer` with delivery count
    /// `seen`) to the dead letters, recording `failed` deliveries; false when it is no longer
    /// that (acknowledged, or claimed by another consumer since): nothing changed.
    pub(crate) async fn outbox_dead(
        &self,
        s: &OutboxStream,
        group: &str,
        consumer: &str,
        id: &str,
        seen: u64,
        failed: u64,
    ) -> Result<bool> {
        let call = lua::outbox::Dead {
            stream: s,
            group,
            consumer,
            id,
            seen,
            failed,
        };
        self.conn.run(call).await
    }

    /// `outbox_trim.lua`: drops what every group acknowledged; the number of entries removed.
    pub(crate) async fn outbox_trim(&self, s: &OutboxStream) -> Result<u64> {
        self.conn.run(lua::outbox::Trim { stream: s }).await
    }

    /// `outbox_lag.lua`: `group`'s standing on the stream.
    pub(crate) async fn outbox_lag(&self, s: &OutboxStream, group: &str) -> Result<StreamLag> {
        self.conn.run(lua::outbox::Lag { stream: s, group }).await
    }
}
