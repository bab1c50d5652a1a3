//! `sell.lua`: requests decided at their home segment — a lone request, or many coalesced into
//! one call (`batch`), with the transfers to credit first.

use super::{Call, Reply, Script, SegmentKeys, argv};
use crate::error::{Error, Result};
use crate::store::{Credit, SellArgs, SellReply};
use fred::types::Value;

/// One request of a [`Sell`] call.
pub(crate) struct SellItem {
    /// The user's ledger key at the home segment.
    pub(crate) ledger: String,
    pub(crate) user: String,
    pub(crate) request_id: String,
    pub(crate) qty: u64,
    pub(crate) resv_ttl_ms: u64,
    pub(crate) ttl_ms: u64,
}

impl SellItem {
    /// `req` at the segment `at`.
    pub(crate) fn new(at: &SegmentKeys<'_>, req: &SellArgs<'_>) -> Self {
        Self {
            ledger: at.ledger(req.user),
            user: req.user.to_string(),
            request_id: req.request_id.to_string(),
            qty: req.qty,
            resv_ttl_ms: req.resv_ttl_ms,
            ttl_ms: req.ttl_ms,
        }
    }
}

/// `sell.lua`: credits `credits`, returns expired reservations, then decides `items` in order
/// (see the script's header). `fence` 0: no fence (the `lua` strategy).
pub(crate) struct Sell<'a> {
    pub(crate) at: SegmentKeys<'a>,
    pub(crate) fence: u64,
    pub(crate) credits: &'a [Credit],
    pub(crate) items: Vec<SellItem>,
}

impl Call for Sell<'_> {
    const SCRIPT: Script = Script::Sell;
    /// One reply per item, in order.
    type Output = Vec<Result<SellReply>>;

    fn encode(&mut self) -> (Vec<String>, Vec<String>) {
        let n = self.items.len();
        let at = &self.at;
        let mut keys = Vec::with_capacity(n + 4);
        keys.extend([at.segment(), at.reservations(), at.credits(), at.outbox()]);
        let mut args = Vec::with_capacity(6 + 3 * self.credits.len() + 5 * n);
        args.extend(argv![
            at.generation(),
            crate::segments::HOME_FN,
            at.seg.index,
            self.fence,
            self.credits.len(),
        ]);
        for c in self.credits {
            args.extend(argv![c.id, c.donor, c.units]);
        }
        args.push(n.to_string());
        // The items' strings are handed over, not copied.
        for it in &mut self.items {
            keys.push(std::mem::take(&mut it.ledger));
            args.push(std::mem::take(&mut it.user));
            args.push(std::mem::take(&mut it.request_id));
            args.push(it.qty.to_string());
            args.push(it.resv_ttl_ms.to_string());
            args.push(it.ttl_ms.to_string());
        }
        (keys, args)
    }

    fn decode(&self, reply: Value) -> Result<Vec<Result<SellReply>>> {
        let Value::Array(replies) = reply else {
            return Err(Error::Protocol(format!("sell: reply {reply:?}")));
        };
        if replies.len() != self.items.len() {
            return Err(Error::Protocol(format!(
                "sell: {} replies for {} requests",
                replies.len(),
                self.items.len()
            )));
        }
        Ok(replies
            .into_iter()
            .map(|r| match r {
                // An applied request: the stock after it, as a bare integer.
                Value::Integer(stock_after) => Ok(SellReply::Applied {
                    stock_after: stock_after.max(0) as u64,
                }),
                r => Reply::parse(r, Self::SCRIPT).and_then(|r| sell_reply(&r)),
            })
            .collect())
    }
}

/// One request's tagged reply.
fn sell_reply(r: &Reply) -> Result<SellReply> {
    Ok(match r.tag() {
        "replay" => SellReply::Replay,
        "short" => SellReply::Short { stock: r.stock(0)? },
        "limit" => SellReply::LimitReached {
            limit: r.u64(0)?,
            held: r.u64(1)?,
            sold: r.u64(2)?,
        },
        "mismatch" => SellReply::Mismatch(r.field(0)?),
        "stale" => SellReply::Stale,
        "lock_lost" => SellReply::LockLost,
        "bad" => return Err(r.bad_argument()),
        _ => return Err(r.bad()),
    })
}
