//! `transfer.lua` at a donor segment: the debit of a transfer, marking it done, and the list of
//! transfers due to the sweeper.

use super::{Call, Reply, Script, SegmentKeys, argv};
use crate::error::{Error, Result};
use crate::store::{DueTransfer, TransferArgs, TransferId, TransferReply};
use fred::types::Value;

/// The keys every op names.
fn keys(at: &SegmentKeys<'_>) -> Vec<String> {
    vec![
        at.segment(),
        at.reservations(),
        at.transfers(),
        at.transfers_due(),
        at.outbox(),
        at.limited_ledgers(),
    ]
}

/// `transfer.lua` op `debit`.
pub(crate) struct Debit<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) t: TransferArgs,
}

impl Call for Debit<'_> {
    const SCRIPT: Script = Script::Transfer;
    type Output = TransferReply;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let t = &self.t;
        let args = argv![
            "debit",
            self.at.generation(),
            t.id,
            t.dest,
            t.want,
            t.floor,
            t.lease_ms
        ];
        (keys(&self.at), args)
    }

    fn decode(&self, reply: Value) -> Result<TransferReply> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        Ok(match r.tag() {
            "debited" => TransferReply::Debited {
                units: r.u64(0)?,
                stock_after: r.stock(1)?,
            },
            "short" => TransferReply::Short { stock: r.stock(0)? },
            "stale" => TransferReply::Stale,
            _ => return Err(r.bad()),
        })
    }
}

/// `transfer.lua` op `done`.
pub(crate) struct Done<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) id: TransferId,
}

impl Call for Done<'_> {
    const SCRIPT: Script = Script::Transfer;
    type Output = ();

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        (keys(&self.at), argv!["done", self.at.generation(), self.id])
    }

    fn decode(&self, reply: Value) -> Result<()> {
        let r = Reply::parse(reply, Self::SCRIPT)?;
        match r.tag() {
            "ok" | "stale" => Ok(()),
            _ => Err(r.bad()),
        }
    }
}

/// `transfer.lua` op `due` (read only): up to `max` (> 0) transfers not done, by lease end,
/// each with its lease left.
pub(crate) struct Due<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) max: u64,
}

impl Call for Due<'_> {
    const SCRIPT: Script = Script::Transfer;
    type Output = Vec<DueTransfer>;

    fn encode(&self) -> (Vec<String>, Vec<String>) {
        (keys(&self.at), argv!["due", self.at.generation(), self.max])
    }

    fn decode(&self, reply: Value) -> Result<Vec<DueTransfer>> {
        let bad = || Error::Protocol(format!("transfer due: reply {reply:?}"));
        let Value::Array(items) = &reply else {
            return Err(bad());
        };
        // {"stale"}: the segment is of another generation, nothing is due here.
        if items.first().and_then(Value::as_str).as_deref() == Some("stale") {
            return Ok(Vec::new());
        }
        items
            .iter()
            .map(|item| {
                let Value::Array(f) = item else {
                    return Err(bad());
                };
                let id = f
                    .first()
                    .and_then(Value::as_str)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(bad)?;
                let dest = f.get(1).and_then(Value::as_u64).ok_or_else(bad)?;
                let units = f.get(2).and_then(Value::as_u64).ok_or_else(bad)?;
                let lease_left_ms = f.get(3).and_then(Value::as_u64).ok_or_else(bad)?;
                Ok(DueTransfer {
                    id,
                    dest: u32::try_from(dest).map_err(|_| bad())?,
                    units,
                    lease_left_ms,
                })
            })
            .collect()
    }

    /// Read only.
    fn waits(&self, _: &Vec<DueTransfer>) -> bool {
        false
    }
}
