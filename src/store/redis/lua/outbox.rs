//! The outbox consumer's scripts: `outbox_dead.lua`, `outbox_trim.lua`, `outbox_lag.lua`.

use super::{Call, Reply, Script, argv};
use crate::error::Result;
use crate::store::redis::outbox::{OutboxStream, StreamLag};
use fred::types::Value;

/// `outbox_dead.lua`: entry `id` to the dead letters, atomically with its ack.
pub(crate) struct Dead<'a> {
    pub(crate) stream: &'a OutboxStream,
    pub(crate) group: &'a str,
    pub(crate) id: &'a str,
    pub(crate) deliveries: u64,
}

impl Call for Dead<'_> {
    const SCRIPT: Script = Script::OutboxDead;
    type Output = bool;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let s = self.stream;
        let keys = vec![s.key.clone(), s.dead.clone(), s.why.clone()];
        (keys, argv![self.group, self.id, self.deliveries, ""])
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

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
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

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
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
