//! A `shardstock serve` process as a [`Target`] of the checked workload: each operation is one
//! HTTP/1.1 request (a fresh connection, `Connection: close`) over tokio, so dropping the call
//! closes the connection at any point — the same cancellation the workload applies to an
//! in-process engine's future. (A hand-written request rather than `ureq`, the tests' blocking
//! client: a blocking call in `spawn_blocking` cannot be dropped half-way.)
//!
//! Answers map to the outcomes the engine gives in process ([`super::workload::classify`]):
//! a 2xx body parsed back into [`Deduction`] / [`Reserved`] / [`ReservationEnd`] /
//! [`Restocked`]; 400 (invalid input), 409 (request id conflict) and a 503 saying nothing was
//! written (a lock lost or not got in time) are typed "nothing happened" → fail; a confirm or cancel answered 404 naming the reservation is the engine's
//! "no such reservation" (`state: None`); 503 (Redis error, lost lock lease, request timeout),
//! a connection error or no answer within 10 s → unknown; any other status (500: a store reply
//! not understood, 404 unknown SKU, 422, ...) → unknown marked "unexpected", as the engine's
//! other errors are in process (the history's check 0 flags them). A 2xx body that does not
//! parse panics (a protocol bug, never an outcome).
//!
//! The target also remembers which requests it sent and when, which are open right now, and
//! how many, so a fault can tell what the process it pauses or partitions was serving.

use super::workload::{Target, now_us};
use super::*;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use shardstock::store::ResvState;
use shardstock::*;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one request may take before its outcome is unknown.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A `serve` process reached at `addr` (`127.0.0.1:PORT`).
pub struct HttpTarget {
    addr: String,
    /// Request id → when it was last sent here (µs since the epoch).
    sent: Mutex<HashMap<String, u64>>,
    /// Requests sent and not yet answered (or dropped).
    open: AtomicUsize,
    /// The users of the deductions and reservations open right now (one entry per request).
    open_users: Mutex<Vec<String>>,
}

/// Counts a request as open while it lives (dropped with the call).
struct Open<'a>(&'a AtomicUsize);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Lists a request's user as open while the request lives (dropped with the call).
struct OpenUser<'a>(&'a Mutex<Vec<String>>, String);

impl Drop for OpenUser<'_> {
    fn drop(&mut self) {
        let mut v = self.0.lock().unwrap();
        if let Some(i) = v.iter().position(|u| *u == self.1) {
            v.swap_remove(i);
        }
    }
}

/// An HTTP answer: status and body.
type Answer = Result<(u16, String), String>;

impl HttpTarget {
    /// A target for the serve process listening on `addr` (`127.0.0.1:PORT`, or its
    /// `http://` base URL).
    pub fn new(addr: &str) -> Self {
        Self {
            addr: addr.trim_start_matches("http://").to_string(),
            sent: Mutex::new(HashMap::new()),
            open: AtomicUsize::new(0),
            open_users: Mutex::new(Vec::new()),
        }
    }

    /// The users with a deduction or reservation open here right now.
    pub fn open_users(&self) -> Vec<String> {
        self.open_users.lock().unwrap().clone()
    }

    /// Lists `user` as open until the returned guard drops.
    fn user_open(&self, user: &str) -> OpenUser<'_> {
        self.open_users.lock().unwrap().push(user.to_string());
        OpenUser(&self.open_users, user.to_string())
    }

    /// Whether request id `rid` was sent here within the last `within`.
    pub fn sent_within(&self, rid: &str, within: Duration) -> bool {
        let since = now_us().saturating_sub(within.as_micros() as u64);
        self.sent
            .lock()
            .unwrap()
            .get(rid)
            .is_some_and(|&t| t >= since)
    }

    /// Requests open right now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// `POST path` with a JSON `body`; the answer, or why none came.
    pub async fn post(&self, path: &str, rid: Option<&str>, body: &Value) -> Answer {
        if let Some(rid) = rid {
            let now = now_us();
            self.sent.lock().unwrap().insert(rid.to_string(), now);
        }
        self.open.fetch_add(1, Ordering::SeqCst);
        let _open = Open(&self.open);
        let body = body.to_string();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        let call = async {
            let mut s = tokio::net::TcpStream::connect(&self.addr)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            s.write_all(request.as_bytes())
                .await
                .map_err(|e| format!("send: {e}"))?;
            let mut raw = Vec::new();
            s.read_to_end(&mut raw)
                .await
                .map_err(|e| format!("receive: {e}"))?;
            parse_response(&raw)
        };
        tokio::time::timeout(CLIENT_TIMEOUT, call)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {CLIENT_TIMEOUT:?}")))
    }
}

impl HttpTarget {
    /// `POST /reservations/{id}/{how}` (confirm or cancel).
    async fn end(&self, id: &ReservationId, how: &str) -> Out {
        let a = self
            .post(&format!("/reservations/{id}/{how}"), None, &json!({}))
            .await;
        let gone = Some(Val::End(NO_RESERVATION));
        outcome(a, |v| reservation_end(v).map(Val::End), gone)
    }
}

/// Status and body of a raw HTTP/1.1 response (content-length or chunked).
fn parse_response(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("truncated response ({} bytes)", raw.len()))?;
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line in {head:?}"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body).ok_or_else(|| format!("bad chunked body {body:?}"))?
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n")?;
        let n = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if n == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..n)?);
        s = rest.get(n + 2..)?;
    }
}

/// The outcome of an answer: `ok` parses a 2xx body; `gone` is the outcome of a 404 naming
/// the reservation (confirm / cancel).
fn outcome(answer: Answer, ok: impl FnOnce(&Value) -> Option<Val>, gone: Option<Val>) -> Out {
    let (status, body) = match answer {
        Ok(a) => a,
        Err(e) => return Out::Unknown(format!("http: {e}")),
    };
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    match status {
        200..=299 => Out::Ok(
            ok(&v).unwrap_or_else(|| panic!("unparsable {status} answer from serve: {body}")),
        ),
        400 | 409 => Out::Fail(format!("{status} {body}")),
        404 if v["field"] == "reservation" => match gone {
            Some(g) => Out::Ok(g),
            None => Out::Unknown(format!("unexpected {status} {body}")),
        },
        // "Being loaded" (`NotReady`) never happens in a steady sale: unexpected, as in
        // process.
        503 if body.contains("is being loaded") => {
            Out::Unknown(format!("unexpected {status} {body}"))
        }
        // A lock strategy that lost (or never got) the lock before writing: retryable, and
        // nothing was written — a definite "nothing happened", as in process.
        503 if body.contains("nothing was written") => Out::Fail(format!("{status} {body}")),
        // Redis errors, a request timeout: the engine's infrastructure errors, retryable with
        // the same request id.
        503 => Out::Unknown(format!("{status} {body}")),
        // Anything else (500: a store reply this version does not understand, ...) is what
        // the engine in process reports as unexpected (check 0 flags it).
        _ => Out::Unknown(format!("unexpected {status} {body}")),
    }
}

/// The `segment` and `units` of an applied, replayed or held answer.
fn part(v: &Value) -> Option<(u32, u64)> {
    Some((
        u32::try_from(v["segment"].as_u64()?).ok()?,
        v["units"].as_u64()?,
    ))
}

/// A [`Deduction`] from its JSON form (`outcome` tag, snake case).
pub fn deduction(v: &Value) -> Option<Deduction> {
    let n = |k: &str| v[k].as_u64();
    Some(match v["outcome"].as_str()? {
        "applied" => {
            let (segment, units) = part(v)?;
            Deduction::Applied { segment, units }
        }
        "replayed" => {
            let (segment, units) = part(v)?;
            Deduction::Replayed { segment, units }
        }
        "sold_out" => Deduction::SoldOut,
        "insufficient" => Deduction::Insufficient {
            available: n("available")?,
        },
        "limit_reached" => Deduction::LimitReached { limit: n("limit")? },
        "user_busy" => Deduction::UserBusy,
        "over_limit" => Deduction::OverLimit { limit: n("limit")? },
        _ => return None,
    })
}

/// A [`Reserved`] from the reservation route's JSON.
pub fn reserved(v: &Value) -> Option<Reserved> {
    let id = |v: &Value| v["id"].as_str()?.parse::<ReservationId>().ok();
    Some(match v["outcome"].as_str()? {
        "held" => {
            let (segment, units) = part(v)?;
            Reserved::Held {
                id: id(v)?,
                segment,
                units,
            }
        }
        "replayed" => {
            let (segment, units) = part(v)?;
            Reserved::Replayed {
                id: id(v)?,
                segment,
                units,
            }
        }
        "not_held" => Reserved::NotHeld(deduction(&v["deduction"])?),
        _ => return None,
    })
}

/// A [`ReservationEnd`] from the confirm / cancel routes' JSON.
pub fn reservation_end(v: &Value) -> Option<ReservationEnd> {
    let state = match &v["state"] {
        Value::Null => None,
        s => Some(match s.as_str()? {
            "reserved" => ResvState::Reserved,
            "confirmed" => ResvState::Confirmed,
            "cancelled" => ResvState::Cancelled,
            "expired" => ResvState::Expired,
            _ => return None,
        }),
    };
    Some(ReservationEnd {
        state,
        done: v["done"].as_bool()?,
    })
}

/// A [`Restocked`] from the restock route's JSON.
pub fn restocked(v: &Value) -> Option<Restocked> {
    Some(Restocked {
        added: v["added"].as_u64()?,
        replayed: v["replayed"].as_bool()?,
    })
}

/// What a confirm or cancel of a reservation that does not exist answers in process.
const NO_RESERVATION: ReservationEnd = ReservationEnd {
    state: None,
    done: false,
};

impl Target for HttpTarget {
    fn deduct<'a>(&'a self, d: &'a Deduct) -> BoxFuture<'a, Out> {
        Box::pin(async move {
            let rid = d.request_id.as_str();
            let body = json!({ "user": d.user.as_str(), "qty": d.qty, "request_id": rid });
            let path = format!("/skus/{}/deduct", d.sku);
            let _open = self.user_open(d.user.as_str());
            let a = self.post(&path, Some(rid), &body).await;
            outcome(a, |v| deduction(v).map(Val::Ded), None)
        })
    }

    fn reserve<'a>(&'a self, d: &'a Deduct, ttl: Duration) -> BoxFuture<'a, Out> {
        Box::pin(async move {
            let rid = d.request_id.as_str();
            let body = json!({
                "user": d.user.as_str(),
                "qty": d.qty,
                "request_id": rid,
                "ttl_ms": ttl.as_millis() as u64,
            });
            let path = format!("/skus/{}/reservations", d.sku);
            let _open = self.user_open(d.user.as_str());
            let a = self.post(&path, Some(rid), &body).await;
            outcome(a, |v| reserved(v).map(Val::Res), None)
        })
    }

    fn confirm<'a>(&'a self, id: &'a ReservationId) -> BoxFuture<'a, Out> {
        Box::pin(self.end(id, "confirm"))
    }

    fn cancel<'a>(&'a self, id: &'a ReservationId) -> BoxFuture<'a, Out> {
        Box::pin(self.end(id, "cancel"))
    }

    fn restock<'a>(&'a self, sku: &'a Sku, qty: u64, rid: &'a RequestId) -> BoxFuture<'a, Out> {
        Box::pin(async move {
            let body = json!({ "qty": qty, "request_id": rid.as_str() });
            let path = format!("/skus/{sku}/restock");
            let a = self.post(&path, None, &body).await;
            outcome(a, |v| restocked(v).map(Val::Stock), None)
        })
    }
}
