//! `sell.lua`: requests decided at their home segment — a lone request, or many coalesced into
//! one call (`batch`), with the transfers to credit first.

use super::{Call, Script, SegmentKeys, argv};
use crate::error::{Error, Result};
use crate::store::{Credit, SellArgs, SellReply};
use fred::types::Value;

/// One request of a [`Sell`] call: its line of the script's packed request argument.
pub(crate) struct SellItem {
    /// `<user> <request id> <qty> <resv_ttl_ms> <ttl_ms>\n` (ids never hold a space).
    line: String,
}

impl SellItem {
    /// `req`'s line.
    pub(crate) fn new(req: &SellArgs<'_>) -> Self {
        use std::fmt::Write;
        let (user, rid) = (req.user.as_str(), req.request_id.as_str());
        let mut line = String::with_capacity(user.len() + rid.len() + 32);
        // Writing into a String cannot fail.
        let _ = writeln!(
            line,
            "{user} {rid} {} {} {}",
            req.qty, req.resv_ttl_ms, req.ttl_ms
        );
        Self { line }
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
        let keys = vec![at.segment(), at.reservations(), at.credits(), at.outbox()];
        let mut args = Vec::with_capacity(7 + 3 * self.credits.len());
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
        // Every request in one argument: one string to send, one for the script to split.
        let mut packed = String::with_capacity(self.items.iter().map(|i| i.line.len()).sum());
        for it in &self.items {
            packed.push_str(&it.line);
        }
        args.push(packed);
        (keys, args)
    }

    fn decode(&self, reply: Value) -> Result<Vec<Result<SellReply>>> {
        let bad = || Error::Protocol(format!("sell: reply {reply:?}"));
        let text = match &reply {
            Value::String(s) => s.as_bytes(),
            Value::Bytes(b) => b,
            _ => return Err(bad()),
        };
        let text = std::str::from_utf8(text).map_err(|_| bad())?;
        let replies: Vec<Result<SellReply>> = text
            .split(' ')
            .map(|t| sell_reply(t).ok_or_else(bad)?)
            .collect();
        if replies.len() != self.items.len() {
            return Err(Error::Protocol(format!(
                "sell: {} replies for {} requests",
                replies.len(),
                self.items.len()
            )));
        }
        Ok(replies)
    }
}

/// One request's answer in the packed reply (see the script's header); `None`: not one.
fn sell_reply(t: &str) -> Option<Result<SellReply>> {
    let num = |s: &str| s.parse::<u64>().ok();
    if let Some(name) = t.strip_prefix('b') {
        // A request the script refused before anything was written for it.
        return Some(Err(super::bad_argument(&format!(
            "ERR shardstock bad argument: {name}"
        ))?));
    }
    let (tag, rest) = t.split_at(t.find(|c: char| !c.is_ascii_lowercase()).unwrap_or(t.len()));
    Some(Ok(match (tag, rest) {
        ("", n) => SellReply::Applied {
            stock_after: num(n)?,
        },
        ("p", "") => SellReply::Replay,
        ("s", n) => SellReply::Short { stock: num(n)? },
        ("l", r) => {
            let mut it = r.split('/').map(num);
            let (limit, held, sold) = (it.next()??, it.next()??, it.next()??);
            SellReply::LimitReached { limit, held, sold }
        }
        ("mq", "") => SellReply::Mismatch("qty"),
        ("mk", "") => SellReply::Mismatch("kind"),
        ("t", "") => SellReply::Stale,
        ("o", "") => SellReply::LockLost,
        _ => return None,
    }))
}
