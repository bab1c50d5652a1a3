//! The outbox consumer's scripts: `outbox_claim.lua`, `outbox_dead.lua`, `outbox_trim.lua`,
//! `outbox_lag.lua`, with the stream they run on ([`OutboxStream`]) and what they read
//! (entries, a group's lag).

use super::{Call, Reply, Script, argv};
use crate::error::{Error, Result};
use crate::ids::Sku;
use fred::types::Value;

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

/// `outbox_claim.lua`: idle entries claimed, each with its delivery count.
pub(crate) struct Claim<'a> {
    pub(crate) stream: &'a OutboxStream,
    pub(crate) group: &'a str,
    pub(crate) consumer: &'a str,
    pub(crate) min_idle_ms: u64,
    pub(crate) cursor: &'a str,
    pub(crate) count: u64,
}

impl Call for Claim<'_> {
    const SCRIPT: Script = Script::OutboxClaim;
    /// The next cursor, and the claimed entries with their delivery counts.
    type Output = (String, Vec<(Entry, u64)>);

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let args = argv![
            self.group,
            self.consumer,
            self.min_idle_ms,
            self.cursor,
            self.count
        ];
        (vec![self.stream.key.clone()], args)
    }

    fn decode(&self, reply: Value) -> Result<Self::Output> {
        let bad = || Error::Protocol("outbox_claim: malformed reply".into());
        let mut parts = reply.into_array().into_iter();
        let next = parts.next().and_then(|v| v.as_string()).ok_or_else(bad)?;
        let mut out = Vec::new();
        for item in parts.next().map(Value::into_array).unwrap_or_default() {
            let mut it = item.into_array().into_iter();
            let (Some(id), Some(fields), Some(n)) = (it.next(), it.next(), it.next()) else {
                return Err(bad());
            };
            let n = n.as_u64().ok_or_else(bad)?;
            let mut e = entries(Value::Array(vec![Value::Array(vec![id, fields])]))?;
            out.push((e.pop().ok_or_else(bad)?, n));
        }
        Ok((next, out))
    }
}

/// `outbox_dead.lua`: entry `id` to the dead letters, atomically with its ack.
pub(crate) struct Dead<'a> {
    pub(crate) stream: &'a OutboxStream,
    pub(crate) group: &'a str,
    pub(crate) consumer: &'a str,
    pub(crate) id: &'a str,
    /// The delivery count the caller saw (the entry must still have it, and be the caller's).
    pub(crate) seen: u64,
    /// Failed deliveries, for the record.
    pub(crate) failed: u64,
}

impl Call for Dead<'_> {
    const SCRIPT: Script = Script::OutboxDead;
    type Output = bool;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let s = self.stream;
        let keys = vec![s.key.clone(), s.dead.clone(), s.why.clone()];
        let args = argv![
            self.group,
            self.id,
            self.seen,
            "",
            self.consumer,
            self.failed
        ];
        (keys, args)
    }

    fn decode(&self, reply: Value) -> Result<bool> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        match r.tag() {
            "dead" => Ok(true),
            "gone" => Ok(false),
            _ => Err(r.bad()),
        }
    }
}

/// `outbox_trim.lua`: entries every group acknowledged go.
pub(crate) struct Trim<'a> {
    pub(crate) stream: &'a OutboxStream,
}

impl Call for Trim<'_> {
    const SCRIPT: Script = Script::OutboxTrim;
    type Output = u64;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        (vec![self.stream.key.clone()], Vec::new())
    }

    fn decode(&self, reply: Value) -> Result<u64> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        match r.tag() {
            "trimmed" => r.u64(0),
            "kept" => Ok(0),
            _ => Err(r.bad()),
        }
    }
}

/// `outbox_lag.lua`: one group's standing on one stream.
pub(crate) struct Lag<'a> {
    pub(crate) stream: &'a OutboxStream,
    pub(crate) group: &'a str,
}

impl Call for Lag<'_> {
    const SCRIPT: Script = Script::OutboxLag;
    type Output = StreamLag;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        (vec![self.stream.key.clone()], argv![self.group])
    }

    fn decode(&self, reply: Value) -> Result<StreamLag> {
        let bad = || crate::error::Error::Protocol(format!("outbox_lag: {reply:?}"));
        let v = reply.clone().into_array();
        let num = |i: usize| v.get(i).and_then(Value::as_i64);
        let oldest = v.get(2).and_then(Value::as_string).ok_or_else(bad)?;
        Ok(StreamLag {
            pending: num(0).ok_or_else(bad)?.max(0) as u64,
            undelivered: num(1).ok_or_else(bad).map(|n| u64::try_from(n).ok())?,
            oldest_pending: (!oldest.is_empty()).then_some(oldest),
            appended: num(3).ok_or_else(bad)?.max(0) as u64,
            length: num(4).ok_or_else(bad)?.max(0) as u64,
        })
    }
}
