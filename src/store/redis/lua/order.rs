//! Calls of the order (cart) protocol: `order.lua` on an order's record, `settle.lua` and
//! `holds_due.lua` at an item's home segment (see `crate::cart`).

use super::{Call, Reply, Script, SegmentKeys, argv};
use crate::cart::{OrderId, OrderReply, OrderState, OrderStep};
use crate::error::{Error, Result};
use crate::ids::{RequestId, UserId};
use crate::segments::Keyspace;
use crate::store::{DueHold, ItemState, SettleReply};
use fred::types::Value;

/// `settle.lua`: the order's decision brought to one item.
pub(crate) struct Settle<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) user: &'a UserId,
    pub(crate) request_id: &'a RequestId,
    pub(crate) qty: u64,
    pub(crate) post: bool,
    pub(crate) ttl_ms: u64,
}

impl Call for Settle<'_> {
    const SCRIPT: Script = Script::Settle;
    type Output = SettleReply;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let at = &self.at;
        let keys = vec![
            at.segment(),
            at.reservations(),
            at.outbox(),
            at.limited_ledgers(),
            at.holds(),
        ];
        let action = if self.post { "post" } else { "void" };
        (
            keys,
            argv![
                at.generation(),
                self.user,
                self.request_id,
                self.qty,
                action,
                self.ttl_ms
            ],
        )
    }

    fn decode(&self, reply: Value) -> Result<SettleReply> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        let state = || ItemState::from_letter(&r.str(0)?).ok_or_else(|| r.bad());
        Ok(match r.tag() {
            "done" => SettleReply::Done(state()?),
            "ended" => SettleReply::Ended(state()?),
            "unknown" => SettleReply::Unknown,
            "mismatch" => SettleReply::Mismatch,
            "stale" => SettleReply::Stale,
            _ => return Err(r.bad()),
        })
    }
}

/// `holds_due.lua`: items held past their hint (read only).
pub(crate) struct HoldsDue<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) max: usize,
}

impl Call for HoldsDue<'_> {
    const SCRIPT: Script = Script::HoldsDue;
    type Output = Vec<DueHold>;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        (
            vec![self.at.segment(), self.at.holds()],
            argv![self.at.generation(), self.max.min(1_000_000)],
        )
    }

    fn decode(&self, reply: Value) -> Result<Vec<DueHold>> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        match r.tag() {
            "stale" => return Ok(Vec::new()),
            "due" => {}
            _ => return Err(r.bad()),
        }
        let mut out = Vec::new();
        let mut i = 0;
        while let Ok(user) = r.str(i) {
            out.push(DueHold {
                user: UserId::new(user).map_err(|_| r.bad())?,
                request_id: RequestId::new(r.str(i + 1)?).map_err(|_| r.bad())?,
                qty: r.u64(i + 2)?,
            });
            i += 3;
        }
        Ok(out)
    }

    fn waits(&self, _: &Vec<DueHold>) -> bool {
        false
    }
}

/// `order.lua`: one step on an order's record.
pub(crate) struct Order<'a> {
    pub(crate) keys: &'a Keyspace,
    pub(crate) id: &'a OrderId,
    pub(crate) step: OrderStep<'a>,
    pub(crate) ttl_ms: u64,
}

impl Call for Order<'_> {
    const SCRIPT: Script = Script::Order;
    type Output = OrderReply;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let key = self.keys.order(self.id.shard(), &self.id.to_string());
        let (step, hold, items, why) = match self.step {
            OrderStep::Open { hold_ms, items } => ("open", hold_ms, items, ""),
            OrderStep::Held => ("held", 0, "", ""),
            OrderStep::Refuse { why } => ("refuse", 0, "", why),
            OrderStep::Confirm => ("confirm", 0, "", ""),
            OrderStep::Cancel => ("cancel", 0, "", ""),
            OrderStep::Expire => ("expire", 0, "", ""),
            OrderStep::Read => ("read", 0, "", ""),
        };
        (vec![key], argv![step, hold, items, why, self.ttl_ms])
    }

    fn decode(&self, reply: Value) -> Result<OrderReply> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        if r.tag() == "none" {
            return Ok(OrderReply {
                state: None,
                changed: false,
                left_ms: 0,
                conflict: false,
                why: String::new(),
                items: String::new(),
            });
        }
        let state = OrderState::from_letter(r.tag()).ok_or_else(|| r.bad())?;
        let flag = |i: usize| -> Result<bool> {
            match r.u64(i)? {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err(r.bad()),
            }
        };
        Ok(OrderReply {
            state: Some(state),
            changed: flag(0)?,
            left_ms: r.u64(1)?,
            items: r.str(2).or_else(|_| Ok::<_, Error>(String::new()))?,
            why: r.str(3).or_else(|_| Ok::<_, Error>(String::new()))?,
            conflict: flag(4)?,
        })
    }

    /// A read writes nothing: no wait.
    fn waits(&self, _: &OrderReply) -> bool {
        self.step != OrderStep::Read
    }
}
