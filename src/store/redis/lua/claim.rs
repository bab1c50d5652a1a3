//! Calls on fallback claims: `settle.lua`, `shut_out.lua`, `takeover.lua`, `seal.lua`,
//! `claims_due.lua`.

use super::{Call, Reply, Script, SegmentKeys, argv};
use crate::error::{Error, Result};
use crate::ids::{RequestId, UserId};
use crate::segments::encode_parts;
use crate::store::{
    DueClaim, ReqArgs, RequestKind, SealReply, SettleAs, SettleReply, ShutOutReply, TakeoverReply,
};
use fred::types::Value;

/// `settle.lua`: ends the claim of epoch `epoch` at the home segment.
pub(crate) struct Settle<'a> {
    pub(crate) home: SegmentKeys<'a>,
    pub(crate) req: ReqArgs<'a>,
    pub(crate) epoch: u64,
    pub(crate) how: SettleAs<'a>,
}

impl Call for Settle<'_> {
    const SCRIPT: Script = Script::Settle;
    type Output = SettleReply;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let (outcome, parts) = match self.how {
            SettleAs::Applied(p) => ("applied", encode_parts(p)),
            SettleAs::Release => ("release", String::new()),
            SettleAs::Seal => ("seal", String::new()),
        };
        let keys = vec![
            self.home.record(self.req.request_id),
            self.home.claims(),
            self.home.segment(),
            self.home.outbox(),
        ];
        (keys, argv![self.epoch, outcome, parts, self.req.ttl_ms])
    }

    fn decode(&self, reply: Value) -> Result<SettleReply> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        Ok(match r.tag() {
            "ok" => SettleReply::Ok,
            "gone" => SettleReply::Gone,
            "superseded" if r.str(0)? == "A" => SettleReply::Applied(r.parts(1)?),
            "superseded" => SettleReply::Superseded,
            _ => return Err(r.bad()),
        })
    }
}

/// `shut_out.lua`: shuts claim epochs older than `epoch` out of a fallback segment.
pub(crate) struct ShutOut<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) req: ReqArgs<'a>,
    pub(crate) epoch: u64,
}

impl Call for ShutOut<'_> {
    const SCRIPT: Script = Script::ShutOut;
    type Output = ShutOutReply;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let req = &self.req;
        // The segment hash too: see record.lua (slot moves).
        let keys = vec![self.at.record(req.request_id), self.at.segment()];
        let args = argv![self.epoch, req.user, req.qty, req.ttl_ms, req.kind.code()];
        (keys, args)
    }

    fn decode(&self, reply: Value) -> Result<ShutOutReply> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        Ok(match r.tag() {
            "clear" => ShutOutReply::Clear,
            "applied" => ShutOutReply::Applied { part: r.u64(0)? },
            "superseded" => ShutOutReply::Superseded,
            "mismatch" => ShutOutReply::Mismatch(r.field(0)?),
            _ => return Err(r.bad()),
        })
    }
}

/// `takeover.lua`: takes over a claim whose lease ran out.
pub(crate) struct Takeover<'a> {
    pub(crate) home: SegmentKeys<'a>,
    pub(crate) req: ReqArgs<'a>,
}

impl Call for Takeover<'_> {
    const SCRIPT: Script = Script::Takeover;
    type Output = TakeoverReply;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let req = &self.req;
        let keys = vec![self.home.record(req.request_id), self.home.claims()];
        let args = argv![req.user, req.qty, req.lease_ms, req.kind.code()];
        (keys, args)
    }

    fn decode(&self, reply: Value) -> Result<TakeoverReply> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        Ok(match r.tag() {
            "won" => TakeoverReply::Won {
                epoch: r.u64(0)?,
                home_part: r.u64(1)?,
            },
            "pending" => TakeoverReply::Pending {
                epoch: r.u64(0)?,
                lease_left_ms: r.u64(1)?,
            },
            "replay" => TakeoverReply::Replay(r.parts(0)?),
            "gone" => TakeoverReply::Gone,
            "sealed" => TakeoverReply::Sealed,
            "mismatch" => TakeoverReply::Mismatch(r.field(0)?),
            _ => return Err(r.bad()),
        })
    }
}

/// `seal.lua`: at the home segment, tells whether a request applied, else seals it.
pub(crate) struct Seal<'a> {
    pub(crate) home: SegmentKeys<'a>,
    pub(crate) req: ReqArgs<'a>,
}

impl Call for Seal<'_> {
    const SCRIPT: Script = Script::Seal;
    type Output = SealReply;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let req = &self.req;
        // The segment hash too: see record.lua (slot moves).
        let keys = vec![self.home.record(req.request_id), self.home.segment()];
        let args = argv![req.user, req.qty, req.ttl_ms, req.kind.code()];
        (keys, args)
    }

    fn decode(&self, reply: Value) -> Result<SealReply> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        Ok(match r.tag() {
            "sealed" => SealReply::Sealed,
            "applied" => SealReply::Applied,
            "pending" => SealReply::Pending {
                lease_left_ms: r.u64(0)?,
            },
            "mismatch" => SealReply::Mismatch(r.field(0)?),
            _ => return Err(r.bad()),
        })
    }
}

/// `claims_due.lua`: up to `max` claims at their home segment whose lease ran out more than
/// `grace_ms` ago.
pub(crate) struct ClaimsDue<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) max: usize,
    pub(crate) grace_ms: u64,
}

impl Call for ClaimsDue<'_> {
    const SCRIPT: Script = Script::ClaimsDue;
    type Output = Vec<DueClaim>;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let keys = vec![self.at.claims()];
        (keys, argv![self.max.clamp(1, 1000), self.grace_ms])
    }

    /// A flat array of `request id, user, qty, kind` per claim.
    fn decode(&self, reply: Value) -> Result<Vec<DueClaim>> {
        let bad = || Error::Protocol(format!("claims_due: reply {reply:?}"));
        let items: Vec<String> = match &reply {
            Value::Array(a) => a
                .iter()
                .map(|x| x.as_string().ok_or_else(bad))
                .collect::<Result<_>>()?,
            Value::Null => Vec::new(),
            _ => return Err(bad()),
        };
        items
            .chunks(4)
            .map(|c| match c {
                [rid, user, qty, kind] => Ok(DueClaim {
                    request_id: RequestId::new(rid.as_str()).map_err(|_| bad())?,
                    user: UserId::new(user.as_str()).map_err(|_| bad())?,
                    qty: qty.parse().map_err(|_| bad())?,
                    kind: RequestKind::from_code(kind).ok_or_else(bad)?,
                }),
                _ => Err(bad()),
            })
            .collect()
    }
}
