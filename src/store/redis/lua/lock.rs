//! Calls of the lock strategies: `fence_read.lua` (on the store's Redis) and the lock scripts
//! `lock_renew.lua`, `lock_release.lua`, `redlock_acquire.lua` (on the store's Redis or on
//! each RedLock node).

use super::{Call, Reply, Script, SegmentKeys, argv};
use crate::error::{Error, Result};
use fred::types::Value;
use std::time::Duration;

/// `fence_read.lua`: bumps the segment's fence token and reads it; `None` when the segment is
/// missing or of another generation.
pub(crate) struct FenceRead<'a> {
    pub(crate) at: SegmentKeys<'a>,
}

/// What [`FenceRead`] saw.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fenced {
    /// The caller's fence token: its write applies only while the segment still holds it.
    pub(crate) token: u64,
}

impl Call for FenceRead<'_> {
    const SCRIPT: Script = Script::FenceRead;
    type Output = Option<Fenced>;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        (vec![self.at.segment()], vec![])
    }

    /// `{token, gen, stock}` (gen and stock false when the segment is missing).
    fn decode(&self, reply: Value) -> Result<Option<Fenced>> {
        let bad = || Error::Protocol(format!("fence_read: reply {reply:?}"));
        let Value::Array(a) = &reply else {
            return Err(bad());
        };
        let token = a.first().and_then(Value::as_u64).ok_or_else(bad)?;
        let num = |i: usize| a.get(i).and_then(Value::as_i64);
        Ok(match num(1) {
            Some(g) if g == self.at.seg.generation as i64 => Some(Fenced { token }),
            _ => None,
        })
    }
}

/// A lock's `0`/`1` reply.
fn held(script: Script, reply: &Value) -> Result<bool> {
    match reply {
        Value::Integer(n) => Ok(*n == 1),
        other => Err(Error::Protocol(format!(
            "{}: reply {other:?}",
            script.name()
        ))),
    }
}

/// `lock_renew.lua`: extends the lease of `key` while `token` owns it; `true` when renewed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LockRenew<'a> {
    pub(crate) key: &'a str,
    pub(crate) token: &'a str,
    pub(crate) lease: Duration,
}

impl Call for LockRenew<'_> {
    const SCRIPT: Script = Script::LockRenew;
    type Output = bool;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let lease_ms = self.lease.as_millis().max(1);
        (vec![self.key.to_string()], argv![self.token, lease_ms])
    }

    fn decode(&self, reply: Value) -> Result<bool> {
        held(Self::SCRIPT, &reply)
    }
}

/// `lock_release.lua`: deletes `key` while `token` owns it; `true` when released.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LockRelease<'a> {
    pub(crate) key: &'a str,
    pub(crate) token: &'a str,
}

impl Call for LockRelease<'_> {
    const SCRIPT: Script = Script::LockRelease;
    type Output = bool;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        (vec![self.key.to_string()], argv![self.token])
    }

    fn decode(&self, reply: Value) -> Result<bool> {
        held(Self::SCRIPT, &reply)
    }
}

/// `redlock_acquire.lua`: one node's vote for `token` on `key`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RedlockAcquire<'a> {
    pub(crate) key: &'a str,
    /// The node's quarantine marker key.
    pub(crate) marker: &'a str,
    pub(crate) token: &'a str,
    pub(crate) lease_ms: u128,
    /// Quarantine started when the marker is missing.
    pub(crate) quarantine_ms: u128,
}

/// A node's vote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vote {
    /// Granted: the key holds the token with a fresh lease.
    Granted,
    /// Held by another token.
    Taken,
    /// The node is in quarantine (new or restarted empty) for this much longer.
    Quarantined {
        /// Quarantine left, node clock.
        ms_left: u64,
    },
}

impl Call for RedlockAcquire<'_> {
    const SCRIPT: Script = Script::RedlockAcquire;
    type Output = Vote;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let keys = vec![self.key.to_string(), self.marker.to_string()];
        (keys, argv![self.token, self.lease_ms, self.quarantine_ms])
    }

    fn decode(&self, reply: Value) -> Result<Vote> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        Ok(match r.tag() {
            "ok" => Vote::Granted,
            "taken" => Vote::Taken,
            "quarantine" => Vote::Quarantined { ms_left: r.u64(0)? },
            _ => return Err(r.bad()),
        })
    }
}
