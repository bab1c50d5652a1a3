//! The outbox streams as a consumer group sees them: discovery, reads, claims, acks, dead
//! letters, trimming and lag (used by [`crate::orders::Orders`]).
//!
//! Every key of one stream (the stream, its dead letters, its failure reasons) shares the
//! segment's hash tag, so each call here goes to one node, and the two scripts that change
//! more than one key (`outbox_dead.lua`, `outbox_trim.lua`) are atomic on a cluster too.
//! Slots in motion are waited out like every other call (see `cluster::moving`).

use super::{RedisStore, lua};
use crate::cluster::moving;
use crate::error::{Error, Result};
use crate::ids::Sku;
use fred::interfaces::{HashesInterface, SetsInterface, StreamsInterface};
use fred::types::Value;
use fred::types::streams::XID;

/// One segment's outbox stream and the keys beside it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct OutboxStream {
    /// The SKU.
    pub(crate) sku: Sku,
    /// The segment index.
    pub(crate) segment: u32,
    /// The stream.
    pub(crate) key: String,
    /// Its dead-letter stream.
    pub(crate) dead: String,
    /// Its failure reasons (hash: entry id → reason).
    pub(crate) why: String,
}

/// A stream entry: id and field/value pairs.
pub(crate) type Entry = (String, Vec<(String, String)>);

/// One group's standing on one stream (`outbox_lag.lua`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StreamLag {
    /// Delivered, not acknowledged.
    pub(crate) pending: u64,
    /// Not delivered to the group yet (`None`: Redis could not tell).
    pub(crate) undelivered: Option<u64>,
    /// The oldest pending entry's id.
    pub(crate) oldest_pending: Option<String>,
    /// Entries ever appended.
    pub(crate) appended: u64,
    /// Entries in the stream now.
    pub(crate) length: u64,
}

fn text(v: &Value) -> Option<String> {
    v.as_string()
}

/// `[id, [field, value, ...]]` entries; a `Null` entry (deleted while pending) is skipped.
pub(crate) fn entries(v: Value) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    for e in v.into_array() {
        if e.is_null() {
            continue;
        }
        let mut e = e.into_array().into_iter();
        let (Some(id), Some(fields)) = (e.next(), e.next()) else {
            return Err(Error::Protocol("outbox: malformed stream entry".into()));
        };
        let id = text(&id).ok_or_else(|| Error::Protocol("outbox: entry id".into()))?;
        let flat: Vec<String> = match fields {
            Value::Map(m) => m
                .inner()
                .into_iter()
                .flat_map(|(k, v)| {
                    [
                        k.into_string().unwrap_or_default(),
                        v.as_string().unwrap_or_default(),
                    ]
                })
                .collect(),
            other => other.into_array().iter().filter_map(text).collect(),
        };
        let pairs = flat
            .chunks_exact(2)
            .map(|c| (c[0].clone(), c[1].clone()))
            .collect();
        out.push((id, pairs));
    }
    Ok(out)
}

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
