//! Calls that take stock: `deduct.lua`, `deduct_batch.lua`, `take.lua`, `refund.lua`; and
//! `record.lua`, the read of one request record (full or compact).

use super::{Call, Reply, Script, SegmentKeys, argv, flag};
use crate::error::{Error, Result};
use crate::ids::RequestId;
use crate::store::{HomeReply, OnShort, ReqArgs, SegmentRole, TakeReply};
use fred::types::Value;

/// How `deduct.lua` / `take.lua` decide (their `mode` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// `lua`: check the stock here and take it (the atomic strategy).
    Stock,
    /// `claim` (deduct.lua only): the caller saw the segment short; only check the record
    /// and claim.
    RecordOnly,
    /// `fenced`: lock strategies — the caller decided under the segment's lock; apply only
    /// while the segment's fence token is still `token`.
    Fenced {
        /// The token the caller's lock acquisition got (`fence_read.lua`).
        token: u64,
    },
    /// `decr`: decr-compensate — the caller already took the units off the stock with
    /// `HINCRBY`; they are given back once (one-time key `<segment>:dt:<nonce>`) and the
    /// request decided as `Stock`.
    Decremented {
        /// Names the decrement's one-time key.
        nonce: u64,
    },
}

impl Check {
    /// [`Check::Decremented`] with a fresh nonce.
    pub(crate) fn decremented() -> Self {
        Check::Decremented {
            nonce: fastrand::u64(1..1_000_000_000_000_000),
        }
    }

    fn mode(self) -> &'static str {
        match self {
            Check::Stock => "lua",
            Check::RecordOnly => "claim",
            Check::Fenced { .. } => "fenced",
            Check::Decremented { .. } => "decr",
        }
    }

    /// The `fence` argument: the fence token, or the decrement's nonce.
    fn number(self) -> u64 {
        match self {
            Check::Fenced { token } => token,
            Check::Decremented { nonce } => nonce,
            Check::Stock | Check::RecordOnly => 0,
        }
    }

    /// The decrement's one-time key, the last KEYS entry in mode `decr`.
    fn push_token(self, at: &SegmentKeys<'_>, keys: &mut Vec<String>) {
        if let Check::Decremented { nonce } = self {
            keys.push(at.decr_token(nonce));
        }
    }
}

/// `deduct.lua`: the whole request at its home segment.
pub(crate) struct Deduct<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) req: ReqArgs<'a>,
    pub(crate) on_short: OnShort,
    pub(crate) check: Check,
}

impl Call for Deduct<'_> {
    const SCRIPT: Script = Script::Deduct;
    type Output = HomeReply;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let (at, req) = (&self.at, &self.req);
        let mut keys = vec![
            at.segment(),
            at.record(req.request_id),
            at.reservations(),
            at.claims(),
            at.outbox(),
        ];
        self.check.push_token(at, &mut keys);
        let args = argv![
            at.generation(),
            req.user,
            req.qty,
            at.seg.index,
            req.ttl_ms,
            req.lease_ms,
            flag(self.on_short == OnShort::Claim),
            self.check.mode(),
            self.check.number(),
            req.resv_ttl_ms,
        ];
        (keys, args)
    }

    fn decode(&self, reply: Value) -> Result<HomeReply> {
        home_reply(Reply::parse(reply, Self::SCRIPT)?, &self.at)
    }
}

/// A `deduct.lua` reply (also one element of a `deduct_batch.lua` reply).
fn home_reply(r: Reply, at: &SegmentKeys<'_>) -> Result<HomeReply> {
    Ok(match r.tag() {
        "applied" => HomeReply::Applied {
            stock_after: r.stock(0)?,
        },
        "short" => HomeReply::Short {
            stock: r.stock(0)?,
            claimed: Some(r.u64(1)?).filter(|&epoch| epoch > 0),
        },
        "replay" => HomeReply::Replay(r.parts(0)?),
        "pending" => HomeReply::Pending {
            epoch: r.u64(0)?,
            lease_left_ms: r.u64(1)?,
        },
        "mismatch" => HomeReply::Mismatch(r.field(0)?),
        "stale" => HomeReply::Stale,
        "sealed" => HomeReply::Sealed,
        "lock_lost" => return Err(Error::LeaseLost(at.lock())),
        "bad" => return Err(r.bad_argument()),
        _ => return Err(r.bad()),
    })
}

/// One request of a [`DeductBatch`], decided as `deduct.lua` in mode `lua` would.
pub(crate) struct BatchItem {
    /// Its request record key.
    pub(crate) record: String,
    pub(crate) user: String,
    pub(crate) qty: u64,
    pub(crate) on_short: OnShort,
    pub(crate) resv_ttl_ms: u64,
}

/// `deduct_batch.lua`: `items`, all bound for one segment with one record TTL and claim lease.
pub(crate) struct DeductBatch<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) ttl_ms: u64,
    pub(crate) lease_ms: u64,
    pub(crate) items: Vec<BatchItem>,
}

impl Call for DeductBatch<'_> {
    const SCRIPT: Script = Script::DeductBatch;
    /// One reply per item, in order.
    type Output = Vec<Result<HomeReply>>;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let n = self.items.len();
        let mut keys = Vec::with_capacity(n + 4);
        keys.extend([
            self.at.segment(),
            self.at.reservations(),
            self.at.claims(),
            self.at.outbox(),
        ]);
        let mut args = Vec::with_capacity(5 + 4 * n);
        args.extend(argv![
            self.at.generation(),
            self.at.seg.index,
            self.ttl_ms,
            self.lease_ms,
            n,
        ]);
        // The items' key and user strings are handed over, not copied.
        for it in &mut self.items {
            keys.push(std::mem::take(&mut it.record));
            args.push(std::mem::take(&mut it.user));
            args.push(it.qty.to_string());
            args.push(flag(it.on_short == OnShort::Claim).to_string());
            args.push(it.resv_ttl_ms.to_string());
        }
        (keys, args)
    }

    fn decode(&self, reply: Value) -> Result<Vec<Result<HomeReply>>> {
        let Value::Array(replies) = reply else {
            return Err(Error::Protocol(format!("deduct_batch: reply {reply:?}")));
        };
        if replies.len() != self.items.len() {
            return Err(Error::Protocol(format!(
                "deduct_batch: {} replies for {} requests",
                replies.len(),
                self.items.len()
            )));
        }
        Ok(replies
            .into_iter()
            .map(|r| match r {
                // An applied request: the stock after it, as a bare integer.
                Value::Integer(stock_after) => Ok(HomeReply::Applied {
                    stock_after: stock_after.max(0) as u64,
                }),
                r => Reply::parse(r, Self::SCRIPT).and_then(|r| home_reply(r, &self.at)),
            })
            .collect())
    }
}

/// `take.lua`: `part` units of a claimed request at one segment.
pub(crate) struct Take<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) req: ReqArgs<'a>,
    pub(crate) part: u64,
    /// The caller's claim epoch.
    pub(crate) epoch: u64,
    pub(crate) role: SegmentRole,
    /// Not [`Check::RecordOnly`].
    pub(crate) check: Check,
}

impl Call for Take<'_> {
    const SCRIPT: Script = Script::Take;
    type Output = TakeReply;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let (at, req) = (&self.at, &self.req);
        let mut keys = vec![
            at.segment(),
            at.record(req.request_id),
            at.reservations(),
            at.outbox(),
        ];
        self.check.push_token(at, &mut keys);
        let args = argv![
            at.generation(),
            req.user,
            req.qty,
            self.part,
            self.epoch,
            req.ttl_ms,
            flag(self.role == SegmentRole::Home),
            self.check.mode(),
            self.check.number(),
            req.resv_ttl_ms,
        ];
        (keys, args)
    }

    fn decode(&self, reply: Value) -> Result<TakeReply> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        Ok(match r.tag() {
            "taken" => TakeReply::Taken {
                stock_after: r.stock(0)?,
                part: r.u64(1)?,
            },
            "short" => TakeReply::Short { stock: r.stock(0)? },
            "superseded" => TakeReply::Superseded,
            "mismatch" => TakeReply::Mismatch(r.field(0)?),
            "stale" => TakeReply::Stale,
            "lock_lost" => return Err(Error::LeaseLost(self.at.lock())),
            _ => return Err(r.bad()),
        })
    }
}

/// `refund.lua`: gives back the part `rid` took here by `epoch` or older; the units refunded.
pub(crate) struct Refund<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) request_id: &'a RequestId,
    pub(crate) epoch: u64,
    pub(crate) role: SegmentRole,
}

impl Call for Refund<'_> {
    const SCRIPT: Script = Script::Refund;
    type Output = u64;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let at = &self.at;
        let keys = vec![at.segment(), at.record(self.request_id), at.reservations()];
        let args = argv![
            at.generation(),
            self.epoch,
            flag(self.role == SegmentRole::Home)
        ];
        (keys, args)
    }

    fn decode(&self, reply: Value) -> Result<u64> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        match r.tag() {
            "refunded" => r.u64(0),
            "stale" => Ok(0),
            _ => Err(r.bad()),
        }
    }
}

/// `record.lua`: one request record's fields (empty when there is none), whether it is kept as
/// a key of its own or as a compact entry of its segment's windows.
pub(crate) struct RecordRead {
    /// The record key (`SegmentKeys::record`).
    pub(crate) key: String,
    /// The segment hash (`SegmentKeys::segment`): declared for slot moves (see record.lua).
    pub(crate) segment: String,
}

impl Call for RecordRead {
    const SCRIPT: Script = Script::Record;
    type Output = std::collections::HashMap<String, String>;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        (
            vec![
                std::mem::take(&mut self.key),
                std::mem::take(&mut self.segment),
            ],
            Vec::new(),
        )
    }

    fn decode(&self, reply: Value) -> Result<Self::Output> {
        reply
            .convert()
            .map_err(|e| Error::Protocol(format!("record.lua reply: {e}")))
    }
}
