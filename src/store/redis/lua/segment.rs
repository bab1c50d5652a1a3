//! Calls on a SKU's segments: loading (`load_begin.lua`, `load_segment.lua`,
//! `load_commit.lua`, `drop_segment.lua`), `restock.lua`, reservations (`reserve_end.lua`),
//! the audit's and sweeper's look (`survey.lua`) and the record read (`record.lua`).

use super::{Call, Reply, Script, SegmentKeys, argv, flag};
use crate::cluster::placement::Placement;
use crate::error::Result;
use crate::ids::{RequestId, Sku, UserId};
use crate::segments::Keyspace;
use crate::store::{
    self, HomeRecord, IfLoaded, ItemState, LoadSpec, RecordState, RequestKind, ReservationAction,
    RestockReply, ResvState, SegmentState, Survey,
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

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let s = &self.spec;
        let args = argv![
            s.segments,
            s.total,
            flag(s.if_loaded == IfLoaded::Replace),
            s.user_limit,
            self.placement.encode(),
            flag(s.outbox),
            crate::segments::HOME_FN,
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

/// `load_segment.lua`: writes a segment of a new generation; `None` when a newer one is
/// there, else the generation it replaced (0: none, or this very one).
pub(crate) struct LoadSegment<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) units: u64,
    /// The selling scripts append outbox events for this segment.
    pub(crate) outbox: bool,
    /// Units one user may hold at this segment (0: no limit).
    pub(crate) user_limit: u64,
}

impl Call for LoadSegment<'_> {
    const SCRIPT: Script = Script::LoadSegment;
    type Output = Option<u64>;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let args = argv![
            self.at.generation(),
            self.units,
            flag(self.outbox),
            self.user_limit,
            crate::segments::HOME_FN,
        ];
        (
            vec![
                self.at.segment(),
                self.at.outbox(),
                self.at.limited_ledgers(),
            ],
            args,
        )
    }

    fn decode(&self, reply: Value) -> Result<Option<u64>> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        match r.tag() {
            "ok" => Ok(Some(r.u64(0)?)),
            "superseded" => Ok(None),
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

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        (vec![self.keys.meta(self.sku)], argv![self.generation])
    }

    fn decode(&self, reply: Value) -> Result<bool> {
        Ok(Reply::parse(reply, Self::SCRIPT)?.tag() == "ok")
    }
}

/// `drop_segment.lua`: deletes a segment of an older generation; the generation it dropped
/// (0: none, or a newer one is there and stays).
pub(crate) struct DropSegment<'a> {
    pub(crate) at: SegmentKeys<'a>,
}

impl Call for DropSegment<'_> {
    const SCRIPT: Script = Script::DropSegment;
    type Output = u64;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let keys = vec![self.at.segment(), self.at.outbox()];
        (keys, argv![self.at.generation()])
    }

    fn decode(&self, reply: Value) -> Result<u64> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        match r.tag() {
            "ok" => r.u64(0),
            "kept" => Ok(0),
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

    fn encode(&self) -> (Vec<String>, Vec<String>) {
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

/// A record's state letter (see the table in the module docs of `lua`).
fn resv_state(letter: &str) -> Option<ResvState> {
    Some(match letter {
        "R" => ResvState::Reserved,
        "C" => ResvState::Confirmed,
        "K" => ResvState::Cancelled,
        "X" => ResvState::Expired,
        _ => return None,
    })
}

/// `reserve_end.lua`: confirms, cancels or inspects `user`'s reservation `request_id`.
pub(crate) struct ReserveEnd<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) user: &'a UserId,
    pub(crate) request_id: &'a RequestId,
    pub(crate) action: ReservationAction,
}

impl Call for ReserveEnd<'_> {
    const SCRIPT: Script = Script::ReserveEnd;
    type Output = store::ReserveEnd;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let action = match self.action {
            ReservationAction::Confirm => "confirm",
            ReservationAction::Cancel => "cancel",
            ReservationAction::Inspect => "inspect",
        };
        let at = &self.at;
        let keys = vec![
            at.segment(),
            at.reservations(),
            at.outbox(),
            at.limited_ledgers(),
        ];
        (
            keys,
            argv![at.generation(), self.user, self.request_id, action],
        )
    }

    fn decode(&self, reply: Value) -> Result<store::ReserveEnd> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        let state = |i: usize| resv_state(&r.str(i)?).ok_or_else(|| r.bad());
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

/// `survey.lua`: returns expired reservations, then the counters and what live reservations
/// hold; `None` when the segment is missing or of another generation.
pub(crate) struct SurveyCall<'a> {
    pub(crate) at: SegmentKeys<'a>,
    /// Look at every live reservation (`held`, `live`, `orphans`).
    pub(crate) detail: bool,
}

impl Call for SurveyCall<'_> {
    const SCRIPT: Script = Script::Survey;
    type Output = Option<Survey>;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let keys = vec![
            self.at.segment(),
            self.at.reservations(),
            self.at.outbox(),
            self.at.limited_ledgers(),
        ];
        (keys, argv![self.at.generation(), flag(self.detail)])
    }

    fn decode(&self, reply: Value) -> Result<Option<Survey>> {
        let look = decode_look(reply, Self::SCRIPT, "survey")?;
        Ok(look.map(|(s, reclaimed)| Survey { reclaimed, ..s }))
    }

    /// Durability mode: only a survey that returned units wrote anything.
    fn waits(&self, out: &Option<Survey>) -> bool {
        out.is_some_and(|s| s.reclaimed > 0)
    }
}

/// `peek.lua`: the survey's read without the reclaim; writes nothing (`no-writes`), so a
/// master that refuses writes answers it.
pub(crate) struct PeekCall<'a> {
    pub(crate) at: SegmentKeys<'a>,
    /// Look at every reservation (`held`, `live`, `orphans`).
    pub(crate) detail: bool,
}

impl Call for PeekCall<'_> {
    const SCRIPT: Script = Script::Peek;
    type Output = Option<Survey>;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let keys = vec![
            self.at.segment(),
            self.at.reservations(),
            self.at.limited_ledgers(),
        ];
        (keys, argv![self.at.generation(), flag(self.detail)])
    }

    fn decode(&self, reply: Value) -> Result<Option<Survey>> {
        let look = decode_look(reply, Self::SCRIPT, "peek")?;
        Ok(look.map(|(s, expired)| Survey { expired, ..s }))
    }
}

/// The reply `survey.lua` and `peek.lua` share (tagged `tag`): the counters, what the
/// reservations hold, and one last figure, returned apart (the units a survey reclaimed, or
/// the expired units a peek counted); `None` for `stale`.
fn decode_look(reply: Value, script: Script, tag: &str) -> Result<Option<(Survey, u64)>> {
    let r = Reply::parse(reply, script)?;
    if r.tag() == "stale" {
        return Ok(None);
    }
    if r.tag() != tag {
        return Err(r.bad());
    }
    let survey = Survey {
        state: SegmentState {
            stock: r.stock(0)?,
            sold: r.stock(1)?,
            loaded: r.u64(2)?,
            restocked: r.u64(3)?,
            reserved: r.stock(4)?,
            moved_in: r.u64(5)?,
            moved_out: r.u64(6)?,
        },
        held: r.u64(7)?,
        live: r.u64(8)?,
        orphans: r.u64(9)?,
        reclaimed: 0,
        expired: 0,
    };
    Ok(Some((survey, r.u64(10)?)))
}

/// `record.lua`: `user`'s record of `request_id` (read only).
pub(crate) struct RecordRead<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) user: &'a UserId,
    pub(crate) request_id: &'a RequestId,
}

impl Call for RecordRead<'_> {
    const SCRIPT: Script = Script::Record;
    type Output = Option<HomeRecord>;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let keys = vec![self.at.segment()];
        (
            keys,
            argv![self.at.generation(), self.user, self.request_id],
        )
    }

    fn decode(&self, reply: Value) -> Result<Option<HomeRecord>> {
        let bad = || crate::error::Error::Protocol(format!("record: reply {reply:?}"));
        let v = match &reply {
            Value::Array(v) => v,
            Value::Null => return Ok(None),
            _ => return Err(bad()),
        };
        if v.is_empty() {
            return Ok(None);
        }
        let letter = v.first().and_then(Value::as_string).ok_or_else(bad)?;
        let qty = v.get(1).and_then(Value::as_u64).ok_or_else(bad)?;
        let (kind, state) = match letter.as_str() {
            "A" => (RequestKind::Sale, RecordState::Sold),
            l if ItemState::from_letter(l).is_some() => (
                RequestKind::OrderItem,
                RecordState::Item(ItemState::from_letter(l).ok_or_else(bad)?),
            ),
            l => (
                RequestKind::Reservation,
                RecordState::Reservation(resv_state(l).ok_or_else(bad)?),
            ),
        };
        Ok(Some(HomeRecord { qty, kind, state }))
    }

    /// Durability mode: a record found is waited for like a write. The engine answers replays
    /// from it, and the write it replays may not have reached a replica yet (its own `WAIT`
    /// fell short). On Redis 7.0 any command moves the connection's replication mark to the
    /// master's current offset, so the `WAIT` after this read covers the earlier write.
    fn waits(&self, out: &Option<HomeRecord>) -> bool {
        out.is_some()
    }
}
