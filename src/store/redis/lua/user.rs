//! Calls of the per-user limit: `user_claim.lua`, `user_finish.lua`.

use super::{Call, Reply, Script, argv};
use crate::error::Result;
use crate::ids::{RequestId, Sku, UserId};
use crate::segments::Keyspace;
use crate::store::{self, ReqArgs, RequestKind, StaleEntry, UserFinish as How};
use fred::types::Value;

/// The user records of a SKU's generation (each in its own slot, tag `{<sku>@<user>}`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Users<'a> {
    pub(crate) keys: &'a Keyspace,
    pub(crate) sku: &'a Sku,
    pub(crate) generation: u64,
}

impl Users<'_> {
    /// `user`'s record.
    fn record(&self, user: &UserId) -> String {
        self.keys.user(self.sku, self.generation, user)
    }
}

/// `user_claim.lua`: counts `req.qty` units against `limit` for `req.user`.
pub(crate) struct UserClaim<'a> {
    pub(crate) users: Users<'a>,
    pub(crate) req: ReqArgs<'a>,
    pub(crate) limit: u64,
    pub(crate) claim_ttl_ms: u64,
}

impl Call for UserClaim<'_> {
    const SCRIPT: Script = Script::UserClaim;
    type Output = store::UserClaim;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let req = &self.req;
        let keys = vec![self.users.record(req.user)];
        let args = argv![
            req.request_id,
            req.qty,
            self.limit,
            self.claim_ttl_ms,
            req.ttl_ms,
            req.kind.code(),
            req.attempt,
        ];
        (keys, args)
    }

    fn decode(&self, reply: Value) -> Result<store::UserClaim> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        Ok(match r.tag() {
            "ok" => store::UserClaim::Ok,
            "dup" => store::UserClaim::Dup {
                sold: r.str(0)? == "S",
            },
            "mismatch" => store::UserClaim::Mismatch(r.field(0)?),
            "limit" => {
                let stale = r.str(1).unwrap_or_default();
                let mut stale = stale
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|e| {
                        // "<rid>:<qty>:<state>:<kind>"; a request id may itself hold ':'.
                        let mut it = e.rsplitn(4, ':');
                        let (Some(kind), Some(state), Some(q), Some(rid)) =
                            (it.next(), it.next(), it.next(), it.next())
                        else {
                            return Err(r.bad());
                        };
                        Ok(StaleEntry {
                            request_id: RequestId::new(rid).map_err(|_| r.bad())?,
                            qty: q.parse().map_err(|_| r.bad())?,
                            reserved: state == "R",
                            kind: RequestKind::from_code(kind).ok_or_else(|| r.bad())?,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                stale.sort();
                store::UserClaim::Limit {
                    used: r.u64(0)?,
                    final_used: r.u64(2)?,
                    fresh_pending: r.u64(3)?,
                    stale,
                }
            }
            _ => return Err(r.bad()),
        })
    }
}

/// `user_finish.lua`: marks `req`'s entry sold or reserved, or removes it.
pub(crate) struct UserFinish<'a> {
    pub(crate) users: Users<'a>,
    pub(crate) req: ReqArgs<'a>,
    pub(crate) how: How,
}

impl Call for UserFinish<'_> {
    const SCRIPT: Script = Script::UserFinish;
    type Output = ();

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let action = match self.how {
            How::Sold => "sold",
            How::Reserved => "reserved",
            How::Void => "void",
            How::Release => "release",
        };
        let req = &self.req;
        let keys = vec![self.users.record(req.user)];
        let args = argv![
            req.request_id,
            action,
            req.qty,
            req.kind.code(),
            req.ttl_ms,
            req.attempt
        ];
        (keys, args)
    }

    fn decode(&self, reply: Value) -> Result<()> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        match r.tag() {
            "ok" | "absent" | "kept" => Ok(()),
            _ => Err(r.bad()),
        }
    }
}
