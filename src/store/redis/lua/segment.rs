//! Calls on a SKU's segments as a whole: loading (`load_begin.lua`, `load_segment.lua`,
//! `load_commit.lua`, `drop_segment.lua`), `restock.lua`, reservations (`reserve_end.lua`,
//! `reclaim.lua`) and the audit's read (`held.lua`).

use super::{Call, Reply, Script, SegmentKeys, argv, flag};
use crate::error::Result;
use crate::ids::{RequestId, Sku};
use crate::placement::Placement;
use crate::segments::Keyspace;
use crate::store::{
    self, HeldState, IfLoaded, LoadSpec, ReservationAction, RestockReply, ResvState, SegmentState,
};
use fred::types::Value;

/// `load_begin.lua`: starts a (re)load of `sku`, proposing `placement` (kept where the SKU
/// already has suffixes).
pub(crate) struct LoadBegin<'a> {
    pub(crate) keys: &'a Keyspace,
    pub(crate) sku: &'a Sku,
    pub(crate) spec: LoadSpec,
    pub(crate) placement: &'a Placement,
}

impl Call for LoadBegin<'_> {
    const SCRIPT: Script = Script::LoadBegin;
    type Output = store::LoadBegin;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let s = &self.spec;
        let args = argv![
            s.segments,
            s.total,
            flag(s.if_loaded == IfLoaded::Replace),
            s.user_limit,
            self.placement.encode(),
            flag(s.outbox),
        ];
        (vec![self.keys.meta(self.sku)], args)
    }

    fn decode(&self, reply: Value) -> Result<store::LoadBegin> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        match r.tag() {
            "exists" => Ok(store::LoadBegin::Exists {
                generation: r.u64(0)?,
            }),
            "started" => Ok(store::LoadBegin::Started {
                generation: r.u64(0)?,
                old_segments: r.u64(1)? as u32,
                old_generation: r.u64(3)?,
                placement: Placement::decode(&r.str(2)?).ok_or_else(|| r.bad())?,
            }),
            _ => Err(r.bad()),
        }
    }
}

/// `load_segment.lua`: writes a segment of a new generation; `false` when a newer one is there.
pub(crate) struct LoadSegment<'a> {
    pub(crate) at: SegmentKeys<'a>,
    /// The same segment in the generation the load replaces.
    pub(crate) old: SegmentKeys<'a>,
    pub(crate) units: u64,
    /// The selling scripts append outbox events for this segment.
    pub(crate) outbox: bool,
}

impl Call for LoadSegment<'_> {
    const SCRIPT: Script = Script::LoadSegment;
    type Output = bool;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let args = argv![
            self.at.generation(),
            self.units,
            flag(self.outbox),
            self.old.generation()
        ];
        let keys = vec![self.at.segment(), self.old.reservations(), self.at.outbox()];
        (keys, args)
    }

    fn decode(&self, reply: Value) -> Result<bool> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        match r.tag() {
            "ok" => Ok(true),
            "superseded" => Ok(false),
            _ => Err(r.bad()),
        }
    }
}

/// `load_commit.lua`: marks `generation` ready; `false` when another load superseded it.
pub(crate) struct LoadCommit<'a> {
    pub(crate) keys: &'a Keyspace,
    pub(crate) sku: &'a Sku,
    pub(crate) generation: u64,
}

impl Call for LoadCommit<'_> {
    const SCRIPT: Script = Script::LoadCommit;
    type Output = bool;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        (vec![self.keys.meta(self.sku)], argv![self.generation])
    }

    fn decode(&self, reply: Value) -> Result<bool> {
        Ok(Reply::parse(reply, Self::SCRIPT)?.tag() == "ok")
    }
}

/// `drop_segment.lua`: deletes a segment of an older generation.
pub(crate) struct DropSegment<'a> {
    pub(crate) at: SegmentKeys<'a>,
    /// The same segment in the generation the load replaces.
    pub(crate) old: SegmentKeys<'a>,
}

impl Call for DropSegment<'_> {
    const SCRIPT: Script = Script::DropSegment;
    type Output = ();

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let keys = vec![self.at.segment(), self.old.reservations(), self.at.outbox()];
        (keys, argv![self.at.generation(), self.old.generation()])
    }

    fn decode(&self, reply: Value) -> Result<()> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        match r.tag() {
            "ok" | "kept" => Ok(()),
            _ => Err(r.bad()),
        }
    }
}

/// `restock.lua`: adds `qty` units (of a restock of `total`) once per request id.
pub(crate) struct Restock<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) request_id: &'a RequestId,
    pub(crate) qty: u64,
    pub(crate) total: u64,
    pub(crate) ttl_ms: u64,
}

impl Call for Restock<'_> {
    const SCRIPT: Script = Script::Restock;
    type Output = RestockReply;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let keys = vec![self.at.segment(), self.at.restock(self.request_id)];
        let args = argv![self.at.generation(), self.qty, self.ttl_ms, self.total];
        (keys, args)
    }

    fn decode(&self, reply: Value) -> Result<RestockReply> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        Ok(match r.tag() {
            "restocked" => RestockReply::Restocked {
                stock_after: r.u64(0)?,
            },
            "replay" => RestockReply::Replay { stock: r.u64(0)? },
            "mismatch" => RestockReply::Mismatch,
            "stale" => RestockReply::Stale,
            _ => return Err(r.bad()),
        })
    }
}

/// `reserve_end.lua`: confirms, cancels or inspects the reservation on `request_id`'s record.
pub(crate) struct ReserveEnd<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) request_id: &'a RequestId,
    pub(crate) action: ReservationAction,
}

impl Call for ReserveEnd<'_> {
    const SCRIPT: Script = Script::ReserveEnd;
    type Output = store::ReserveEnd;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let action = match self.action {
            ReservationAction::Confirm => "confirm",
            ReservationAction::Cancel => "cancel",
            ReservationAction::Inspect => "peek",
        };
        let at = &self.at;
        let keys = vec![
            at.segment(),
            at.record(self.request_id),
            at.reservations(),
            at.outbox(),
        ];
        (keys, argv![at.generation(), action])
    }

    fn decode(&self, reply: Value) -> Result<store::ReserveEnd> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        // The record's `rs` letter (see the table in the module docs of `lua`).
        let state = |i: usize| -> Result<ResvState> {
            Ok(match r.str(i)?.as_str() {
                "R" => ResvState::Reserved,
                "C" => ResvState::Confirmed,
                "K" => ResvState::Cancelled,
                "X" => ResvState::Expired,
                _ => return Err(r.bad()),
            })
        };
        Ok(match r.tag() {
            "done" => store::ReserveEnd::Done {
                state: state(0)?,
                user: r.str(1)?,
                units: r.u64(2)?,
            },
            "ended" => store::ReserveEnd::Ended {
                state: state(0)?,
                user: r.str(1)?,
                units: r.u64(2)?,
            },
            "unknown" => store::ReserveEnd::Unknown,
            "stale" => store::ReserveEnd::Stale,
            _ => return Err(r.bad()),
        })
    }
}

/// `reclaim.lua`: returns expired reservations; (units returned, units still reserved).
pub(crate) struct Reclaim<'a> {
    pub(crate) at: SegmentKeys<'a>,
}

impl Call for Reclaim<'_> {
    const SCRIPT: Script = Script::Reclaim;
    type Output = (u64, u64);

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let keys = vec![self.at.segment(), self.at.reservations(), self.at.outbox()];
        (keys, argv![self.at.generation()])
    }

    fn decode(&self, reply: Value) -> Result<(u64, u64)> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        match r.tag() {
            "reclaimed" => Ok((r.u64(0)?, r.u64(1)?)),
            "stale" => Ok((0, 0)),
            _ => Err(r.bad()),
        }
    }
}

/// `held.lua`: the segment's counters and what its live reservations hold.
pub(crate) struct Held<'a> {
    pub(crate) at: SegmentKeys<'a>,
}

impl Call for Held<'_> {
    const SCRIPT: Script = Script::Held;
    type Output = Option<HeldState>;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let keys = vec![self.at.segment(), self.at.reservations()];
        (keys, argv![self.at.generation()])
    }

    fn decode(&self, reply: Value) -> Result<Option<HeldState>> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        match r.tag() {
            "held" => Ok(Some(HeldState {
                state: SegmentState {
                    stock: r.stock(0)?,
                    sold: r.stock(1)?,
                    loaded: r.u64(2)?,
                    restocked: r.u64(3)?,
                    reserved: r.stock(4)?,
                },
                held: r.u64(5)?,
                live: r.u64(6)?,
                orphans: r.u64(7)?,
            })),
            "stale" => Ok(None),
            _ => Err(r.bad()),
        }
    }
}
