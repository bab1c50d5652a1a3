//! `sell.lua`: requests decided at their home segment — a lone request, or many coalesced into
//! one call (`batch`), with the transfers to credit first.

use super::{Call, Script, SegmentKeys, argv};
use crate::error::{Error, Result};
use crate::store::{Credit, SellArgs, SellReply};
use fred::types::Value;

/// One request of a [`Sell`] call: its three arguments (see the script's header).
pub(crate) struct SellItem {
    user: String,
    request_id: String,
    /// `<qty>:<resv_ttl_ms>:<ttl_ms>`.
    spec: String,
    qty: u64,
}

impl SellItem {
    /// `req`'s arguments.
    pub(crate) fn new(req: &SellArgs<'_>) -> Self {
        Self {
            user: req.user.to_string(),
            request_id: req.request_id.to_string(),
            spec: format!("{}:{}:{}", req.qty, req.resv_ttl_ms, req.ttl_ms),
            qty: req.qty,
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
        let keys = vec![
            at.segment(),
            at.reservations(),
            at.credits(),
            at.outbox(),
            at.limited_ledgers(),
        ];
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
        args.reserve(3 * n);
        // The items' strings are handed over, not copied.
        for it in &mut self.items {
            args.push(std::mem::take(&mut it.user));
            args.push(std::mem::take(&mut it.request_id));
            args.push(std::mem::take(&mut it.spec));
        }
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
        let mut tokens = text.split(' ');
        // The stock before the first request; each applied one takes its qty from it.
        let mut stock: u64 = tokens.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
        let mut replies = Vec::with_capacity(self.items.len());
        for (t, it) in tokens.zip(&self.items) {
            let r = match t {
                "a" => {
                    stock = stock.checked_sub(it.qty).ok_or_else(bad)?;
                    Ok(SellReply::Applied { stock_after: stock })
                }
                "s" => Ok(SellReply::Short { stock }),
                t => sell_reply(t).ok_or_else(bad)?,
            };
            replies.push(r);
        }
        if replies.len() != self.items.len() || text.split(' ').count() != self.items.len() + 1 {
            return Err(Error::Protocol(format!(
                "sell: {text:?} for {} requests",
                self.items.len()
            )));
        }
        Ok(replies)
    }
}

/// One request's answer other than applied or short (see the script's header); `None`: not
/// one.
fn sell_reply(t: &str) -> Option<Result<SellReply>> {
    let num = |s: &str| s.parse::<u64>().ok();
    if let Some(name) = t.strip_prefix('b') {
        // A request the script refused before anything was written for it.
        return Some(Err(super::bad_argument(&format!(
            "ERR shardstock bad argument: {name}"
        ))?));
    }
    Some(Ok(match t {
        "p" => SellReply::Replay,
        "mq" => SellReply::Mismatch("qty"),
        "mk" => SellReply::Mismatch("kind"),
        "t" => SellReply::Stale,
        "o" => SellReply::LockLost,
        t => {
            let mut it = t.strip_prefix('l')?.split('/').map(num);
            let (limit, held, sold) = (it.next()??, it.next()??, it.next()??);
            if it.next().is_some() {
                return None;
            }
            SellReply::LimitReached { limit, held, sold }
        }
    }))
}
