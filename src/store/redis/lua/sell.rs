//! `sell.lua`: requests decided at their home segment — a lone request, or many coalesced into
//! one call (`batch`), with the transfers to credit first.

use super::{Call, Script, SegmentKeys, argv};
use crate::error::{Error, Result};
use crate::ids::{RequestId, UserId};
use crate::store::{Credit, SellArgs, SellReply};
use fred::bytes::BytesMut;
use fred::types::{Key, Value};

/// One request of a [`Sell`] call: its user and request id, and its spec (see the script's
/// header: consecutive requests of one spec are sent as one run), encoded with the call's
/// others into one buffer when the call is sent.
pub(crate) struct SellItem {
    user: UserId,
    request_id: RequestId,
    qty: u64,
    resv_ttl_ms: u64,
    ttl_ms: u64,
    /// An order's item: the spec ends `:o`.
    order_item: bool,
}

impl SellItem {
    /// `req`'s arguments (the ids are shared, not copied).
    pub(crate) fn new(req: &SellArgs<'_>) -> Self {
        Self {
            user: req.user.clone(),
            request_id: req.request_id.clone(),
            qty: req.qty,
            resv_ttl_ms: req.resv_ttl_ms,
            ttl_ms: req.ttl_ms,
            order_item: req.order_item,
        }
    }

    fn spec(&self) -> (u64, u64, u64, bool) {
        (self.qty, self.resv_ttl_ms, self.ttl_ms, self.order_item)
    }
}

/// What every `sell.lua` call at one segment sends alike: its six keys, its generation and
/// its index, made once (a coalescing lane keeps one) and cloned by a count per call instead
/// of formatted again.
pub(crate) struct SellHead {
    keys: Vec<Key>,
    generation: Value,
    home_fn: Value,
    index: Value,
}

impl SellHead {
    /// The head of calls at `at`.
    pub(crate) fn new(at: &SegmentKeys<'_>) -> Self {
        Self {
            keys: [
                at.segment(),
                at.reservations(),
                at.credits(),
                at.outbox(),
                at.limited_ledgers(),
                at.holds(),
            ]
            .into_iter()
            .map(Key::from)
            .collect(),
            generation: Value::from(at.generation()),
            home_fn: Value::from(crate::segments::HOME_FN.to_string()),
            index: Value::from(at.seg.index.to_string()),
        }
    }
}

/// `sell.lua`: credits `credits`, returns expired reservations, then decides `items` in order
/// (see the script's header). `fence` 0: no fence (the `lua` strategy).
pub(crate) struct Sell<'a> {
    /// The segment's keys and head arguments (a coalescing lane's, or made for this call).
    pub(crate) head: &'a SellHead,
    pub(crate) fence: u64,
    pub(crate) credits: &'a [Credit],
    pub(crate) items: Vec<SellItem>,
}

impl Call for Sell<'_> {
    const SCRIPT: Script = Script::Sell;
    /// One reply per item, in order.
    type Output = Vec<Result<SellReply>>;

    /// [`encode_values`](Call::encode_values)'s arguments as strings (what is sent is those
    /// byte slices).
    fn encode(&self) -> (Vec<String>, Vec<String>) {
        let (keys, args) = self.encode_values();
        let keys = keys
            .iter()
            .map(|k| k.as_str().unwrap_or_default().to_owned())
            .collect();
        let args = args
            .into_iter()
            .map(|v| v.as_string().unwrap_or_default())
            .collect();
        (keys, args)
    }

    /// The requests' arguments are written into one buffer and sent as slices of it: no
    /// allocation per argument, and a spec shared by consecutive requests is sent once, as
    /// the head of their run.
    fn encode_values(&self) -> (Vec<Key>, Vec<Value>) {
        let n = self.items.len();
        let head = self.head;
        let keys = head.keys.clone();
        let mut args: Vec<Value> = Vec::with_capacity(6 + 3 * self.credits.len() + 2 * n + 2);
        args.push(head.generation.clone());
        args.push(head.home_fn.clone());
        args.push(head.index.clone());
        args.push(if self.fence == 0 {
            Value::from_static_str("0")
        } else {
            Value::from(self.fence.to_string())
        });
        args.push(if self.credits.is_empty() {
            Value::from_static_str("0")
        } else {
            Value::from(self.credits.len().to_string())
        });
        for c in self.credits {
            args.extend(argv![c.id, c.donor, c.units].into_iter().map(Value::from));
        }
        args.push(Value::from(n.to_string()));
        let size: usize = self
            .items
            .iter()
            .map(|it| it.user.as_str().len() + it.request_id.as_str().len() + 3 * 20 + 2 + 4)
            .sum();
        let mut buf = BytesMut::with_capacity(size);
        // (start, end) in `buf` of each argument, in order.
        let mut spans: Vec<(usize, usize)> = Vec::with_capacity(2 * n + 2);
        let mut num = itoa::Buffer::new();
        let mut i = 0;
        while i < n {
            // A run: the requests from i on that share i's spec.
            let spec = self.items[i].spec();
            let m = self.items[i..]
                .iter()
                .take_while(|it| it.spec() == spec)
                .count();
            let start = buf.len();
            let (qty, resv, ttl, item) = spec;
            buf.extend_from_slice(num.format(qty).as_bytes());
            buf.extend_from_slice(b":");
            buf.extend_from_slice(num.format(resv).as_bytes());
            buf.extend_from_slice(b":");
            buf.extend_from_slice(num.format(ttl).as_bytes());
            if item {
                buf.extend_from_slice(b":o");
            }
            spans.push((start, buf.len()));
            let start = buf.len();
            buf.extend_from_slice(num.format(m).as_bytes());
            spans.push((start, buf.len()));
            // Its users, then their request ids.
            let run = &self.items[i..i + m];
            for id in run
                .iter()
                .map(|it| it.user.as_str())
                .chain(run.iter().map(|it| it.request_id.as_str()))
            {
                let start = buf.len();
                buf.extend_from_slice(id.as_bytes());
                spans.push((start, buf.len()));
            }
            i += m;
        }
        let buf = buf.freeze();
        args.extend(
            spans
                .into_iter()
                .map(|(a, b)| Value::Bytes(buf.slice(a..b))),
        );
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
