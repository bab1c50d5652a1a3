//! `serve`'s guards over a real redis-server: 60+ malformed inputs (bodies, keys named twice, media types, methods,
//! paths, headers, ids, numbers, tokens) each answered with a 4xx whose JSON names the problem
//! and carries its `code`, with nothing written
//! to Redis (`DBSIZE` and `DEBUG DIGEST` before = after); bearer tokens on the admin and buyer
//! routes; a call cut by the request timeout during a paused Redis, retried with the same request
//! id: one effect; admin routes refused on a non-loopback address without a token.

use crate::common;

use common::RedisServer;
use serde_json::Value;
use shardstock::http::ApiOptions;
use shardstock::{Engine, LoadOptions, RedisStore, Sku};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const ADMIN: &str = "Bearer admin-s3cret";
const BUYER: &str = "Bearer buyer-s3cret";

/// The API on `127.0.0.1:0` over a Redis engine, on a runtime of its own; stops on drop.
struct Api {
    addr: SocketAddr,
    engine: Engine<RedisStore>,
    stop: Option<oneshot::Sender<()>>,
    rt: tokio::runtime::Runtime,
}

impl Api {
    fn start(redis: &RedisServer, options: ApiOptions) -> Self {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (engine, listener) = rt.block_on(async {
            let engine = common::redis_engine(redis, Engine::builder()).await;
            (engine, TcpListener::bind("127.0.0.1:0").await.unwrap())
        });
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let options = options
            .admin_token("admin-s3cret")
            .buyer_token("buyer-s3cret")
            .sweep_every(None);
        rt.spawn(shardstock::http::serve_with(
            listener,
            engine.clone(),
            options,
            async move {
                let _ = rx.await;
            },
        ));
        Self {
            addr,
            engine,
            stop: Some(tx),
            rt,
        }
    }

    fn load(&self, sku: &str, stock: u64, segments: u32) {
        let sku = Sku::new(sku).unwrap();
        let options = LoadOptions::new(segments).per_user_limit(0);
        self.rt
            .block_on(self.engine.load(&sku, stock, options))
            .unwrap();
    }

    fn audit(&self, sku: &str) -> shardstock::Audit {
        let sku = Sku::new(sku).unwrap();
        self.rt.block_on(self.engine.audit(&sku)).unwrap()
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// A reply: status, headers (lower-cased names), body.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// Leaves a request without the `Content-Type: application/json` that [`send`] adds to a body.
const NO_CONTENT_TYPE: &[u8] = b"X-Test: no content type";

/// One HTTP/1.1 request written byte for byte (so headers and paths can be malformed). A body
/// goes out as `Content-Type: application/json` unless `headers` name another type or hold
/// [`NO_CONTENT_TYPE`].
fn send(addr: SocketAddr, method: &str, path: &str, headers: &[&[u8]], body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    )
    .into_bytes();
    let typed = headers
        .iter()
        .any(|h| *h == NO_CONTENT_TYPE || h.to_ascii_lowercase().starts_with(b"content-type:"));
    if !body.is_empty() && !typed {
        req.extend_from_slice(b"Content-Type: application/json\r\n");
    }
    for h in headers {
        req.extend_from_slice(h);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body);
    // The server may answer (413) and close before reading all of a large body.
    let _ = s.write_all(&req);
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if raw.is_empty() => panic!("{method} {path}: no reply: {e}"),
            Err(_) => break,
        }
    }
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{method} {path}: malformed reply {raw:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_string(),
    }
}

fn auth(token: &str) -> Vec<u8> {
    format!("Authorization: {token}").into_bytes()
}

/// What the store holds: key count and digest of the whole dataset.
fn snapshot(redis: &RedisServer) -> (u64, String) {
    (redis.dbsize(), redis.cli(&["DEBUG", "DIGEST"]))
}

/// What, method, path, headers, body, the status expected and the field it must name.
type Case<'a> = (
    &'a str,
    &'a str,
    String,
    Vec<&'a [u8]>,
    String,
    u16,
    &'a str,
);

#[test]
fn malformed_inputs_are_named_4xx_and_write_nothing() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let api = Api::start(&redis, ApiOptions::default());
    api.load("phone", 10, 2);
    let long_id = "r".repeat(200);
    let long_sku = "s".repeat(100);
    let big = format!(
        r#"{{"user":"u1","request_id":"big","pad":"{}"}}"#,
        "x".repeat(17_000)
    );
    let (a, b) = (auth(ADMIN), auth(BUYER));
    let (a, b): (&[u8], &[u8]) = (&a, &b);
    let deduct = "/skus/phone/deduct";
    let reserve = "/skus/phone/reservations";
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        // Bodies.
        ("not JSON", "POST", deduct.into(), vec![b], "buy 1 please".into(), 400, "body"),
        ("a JSON array", "POST", deduct.into(), vec![b], "[1,2]".into(), 400, "body"),
        ("a JSON string", "POST", deduct.into(), vec![b], r#""u1""#.into(), 400, "body"),
        ("truncated JSON", "POST", deduct.into(), vec![b], r#"{"user":"u1","#.into(), 400, "body"),
        ("qty a string", "POST", deduct.into(), vec![b], r#"{"user":"u1","qty":"2","request_id":"r1"}"#.into(), 400, "qty"),
        ("qty negative", "POST", deduct.into(), vec![b], r#"{"user":"u1","qty":-1,"request_id":"r1"}"#.into(), 400, "qty"),
        ("qty a float", "POST", deduct.into(), vec![b], r#"{"user":"u1","qty":1.5,"request_id":"r1"}"#.into(), 400, "qty"),
        ("qty 1e30", "POST", deduct.into(), vec![b], r#"{"user":"u1","qty":1e30,"request_id":"r1"}"#.into(), 400, "qty"),
        ("qty u64::MAX + 1", "POST", deduct.into(), vec![b], r#"{"user":"u1","qty":18446744073709551616,"request_id":"r1"}"#.into(), 400, "qty"),
        // A key named twice: serde_json keeps the last value, which no earlier check saw.
        ("qty named twice", "POST", deduct.into(), vec![b], r#"{"user":"u1","qty":1,"qty":5,"request_id":"r1"}"#.into(), 400, "qty"),
        ("request_id named twice, the last one the Idempotency-Key", "POST", deduct.into(), vec![b, b"Idempotency-Key: a8"], r#"{"user":"u1","request_id":"a9","request_id":"a8"}"#.into(), 400, "request_id"),
        ("user named twice, once escaped", "POST", deduct.into(), vec![b], r#"{"user":"u1","us\u0065r":"u2","request_id":"r1"}"#.into(), 400, "user"),
        ("a key named twice inside a value", "POST", deduct.into(), vec![b], r#"{"user":"u1","request_id":"r1","x":{"k":1,"k":2}}"#.into(), 400, "x.k"),
        ("ttl_ms named twice (reservation)", "POST", reserve.into(), vec![b], r#"{"user":"u1","request_id":"r2","ttl_ms":60000,"ttl_ms":1}"#.into(), 400, "ttl_ms"),
        ("stock named twice (load)", "PUT", "/skus/new1".into(), vec![a], r#"{"stock":5,"segments":1,"stock":50}"#.into(), 400, "stock"),
        ("replace named twice (load)", "PUT", "/skus/phone".into(), vec![a], r#"{"stock":5,"segments":1,"replace":false,"replace":true}"#.into(), 400, "replace"),
        ("qty named twice (restock)", "POST", "/skus/phone/restock".into(), vec![a], r#"{"qty":1,"qty":1000,"request_id":"rs"}"#.into(), 400, "qty"),
        ("qty 0", "POST", deduct.into(), vec![b], r#"{"user":"u1","qty":0,"request_id":"r1"}"#.into(), 400, "qty"),
        ("qty above max_qty", "POST", deduct.into(), vec![b], r#"{"user":"u1","qty":10001,"request_id":"r1"}"#.into(), 400, "qty"),
        ("qty null is the default, user null is missing", "POST", deduct.into(), vec![b], r#"{"user":null,"qty":null,"request_id":"r1"}"#.into(), 400, "user"),
        ("unknown field", "POST", deduct.into(), vec![b], r#"{"user":"u1","request_id":"r1","colour":"red"}"#.into(), 400, "colour"),
        ("user missing", "POST", deduct.into(), vec![b], r#"{"request_id":"r1"}"#.into(), 400, "user"),
        ("user a number", "POST", deduct.into(), vec![b], r#"{"user":5,"request_id":"r1"}"#.into(), 400, "user"),
        ("user empty", "POST", deduct.into(), vec![b], r#"{"user":"","request_id":"r1"}"#.into(), 400, "user"),
        ("user with braces", "POST", deduct.into(), vec![b], r#"{"user":"{u1}","request_id":"r1"}"#.into(), 400, "user"),
        ("request_id missing", "POST", deduct.into(), vec![b], r#"{"user":"u1"}"#.into(), 400, "request_id"),
        ("request_id too long", "POST", deduct.into(), vec![b], format!(r#"{{"user":"u1","request_id":"{long_id}"}}"#), 400, "request_id"),
        ("request_id with a space", "POST", deduct.into(), vec![b], r#"{"user":"u1","request_id":"r 1"}"#.into(), 400, "request_id"),
        ("request_id an object", "POST", deduct.into(), vec![b], r#"{"user":"u1","request_id":{"id":1}}"#.into(), 400, "request_id"),
        ("body over the limit", "POST", deduct.into(), vec![b], big.clone(), 413, "body"),
        ("reserve without ttl_ms", "POST", reserve.into(), vec![b], r#"{"user":"u1","request_id":"r2"}"#.into(), 400, "ttl_ms"),
        ("reserve ttl_ms 0", "POST", reserve.into(), vec![b], r#"{"user":"u1","request_id":"r2","ttl_ms":0}"#.into(), 400, "ttl_ms"),
        ("reserve ttl_ms a string", "POST", reserve.into(), vec![b], r#"{"user":"u1","request_id":"r2","ttl_ms":"1s"}"#.into(), 400, "ttl_ms"),
        ("load stock negative", "PUT", "/skus/new1".into(), vec![a], r#"{"stock":-5,"segments":2}"#.into(), 400, "stock"),
        ("load stock above the maximum", "PUT", "/skus/new1".into(), vec![a], r#"{"stock":1000000000000,"segments":2}"#.into(), 400, "stock"),
        ("load stock missing", "PUT", "/skus/new1".into(), vec![a], r#"{"segments":2}"#.into(), 400, "stock"),
        ("load segments 0", "PUT", "/skus/new1".into(), vec![a], r#"{"stock":5,"segments":0}"#.into(), 400, "segments"),
        ("load segments 2^40", "PUT", "/skus/new1".into(), vec![a], r#"{"stock":5,"segments":1099511627776}"#.into(), 400, "segments"),
        ("load replace a string", "PUT", "/skus/new1".into(), vec![a], r#"{"stock":5,"segments":1,"replace":"yes"}"#.into(), 400, "replace"),
        ("load per_user_limit a float", "PUT", "/skus/new1".into(), vec![a], r#"{"stock":5,"segments":1,"per_user_limit":1.5}"#.into(), 400, "per_user_limit"),
        ("restock qty missing", "POST", "/skus/phone/restock".into(), vec![a], "{}".into(), 400, "qty"),
        ("restock qty a word", "POST", "/skus/phone/restock".into(), vec![a], r#"{"qty":"ten"}"#.into(), 400, "qty"),
        // Paths.
        ("SKU with braces", "PUT", "/skus/%7Bphone%7D".into(), vec![a], r#"{"stock":5,"segments":1}"#.into(), 400, "sku"),
        ("SKU with braces (deduct)", "POST", "/skus/ph%7Bo%7Dne/deduct".into(), vec![b], r#"{"user":"u1","request_id":"r1"}"#.into(), 400, "sku"),
        ("SKU too long", "POST", format!("/skus/{long_sku}/deduct"), vec![b], r#"{"user":"u1","request_id":"r1"}"#.into(), 400, "sku"),
        ("SKU with a space", "GET", "/skus/a%20b".into(), vec![a], String::new(), 400, "sku"),
        ("SKU not UTF-8", "POST", "/skus/%FF/deduct".into(), vec![b], r#"{"user":"u1","request_id":"r1"}"#.into(), 400, "path"),
        ("reservation id not an id", "POST", "/reservations/not-an-id/confirm".into(), vec![b], String::new(), 400, "reservation"),
        ("reservation id too long", "POST", format!("/reservations/{long_id}/cancel"), vec![b], String::new(), 400, "reservation"),
        // Headers.
        ("Idempotency-Key not ASCII", "POST", deduct.into(), vec![b, b"Idempotency-Key: r\xff1"], r#"{"user":"u1"}"#.into(), 400, "Idempotency-Key"),
        ("Idempotency-Key with braces", "POST", deduct.into(), vec![b, b"Idempotency-Key: {r1}"], r#"{"user":"u1"}"#.into(), 400, "request_id"),
        ("Idempotency-Key differs from request_id", "POST", deduct.into(), vec![b, b"Idempotency-Key: r9"], r#"{"user":"u1","request_id":"r1"}"#.into(), 400, "request_id"),
        ("no token (buyer route)", "POST", deduct.into(), vec![], r#"{"user":"u1","request_id":"r1"}"#.into(), 401, "Authorization"),
        ("wrong token (buyer route)", "POST", deduct.into(), vec![b"Authorization: Bearer buyer-s3creT"], r#"{"user":"u1","request_id":"r1"}"#.into(), 401, "Authorization"),
        ("Basic, not Bearer", "POST", deduct.into(), vec![b"Authorization: Basic dTpw"], r#"{"user":"u1","request_id":"r1"}"#.into(), 401, "Authorization"),
        ("empty Bearer", "GET", "/skus/phone".into(), vec![b"Authorization: Bearer "], String::new(), 401, "Authorization"),
        ("buyer token on an admin route", "PUT", "/skus/new1".into(), vec![b], r#"{"stock":5,"segments":1}"#.into(), 401, "Authorization"),
        ("admin token on a buyer route", "POST", deduct.into(), vec![a], r#"{"user":"u1","request_id":"r1"}"#.into(), 401, "Authorization"),
        ("no token (restock)", "POST", "/skus/phone/restock".into(), vec![], r#"{"qty":1000}"#.into(), 401, "Authorization"),
        ("no token (audit)", "GET", "/skus/phone/audit".into(), vec![], String::new(), 401, "Authorization"),
        ("no token (cancel)", "POST", "/reservations/x/cancel".into(), vec![], String::new(), 401, "Authorization"),
        // Media types: a body is JSON, declared as such.
        ("a text/plain body", "POST", deduct.into(), vec![b, b"Content-Type: text/plain"], r#"{"user":"u1","request_id":"r1"}"#.into(), 415, "Content-Type"),
        ("a form body", "POST", deduct.into(), vec![b, b"Content-Type: application/x-www-form-urlencoded"], "user=u1&request_id=r1".into(), 415, "Content-Type"),
        ("a body without Content-Type", "POST", deduct.into(), vec![b, NO_CONTENT_TYPE], r#"{"user":"u1","request_id":"r1"}"#.into(), 415, "Content-Type"),
        ("JSON in latin1", "POST", deduct.into(), vec![b, b"Content-Type: application/json; charset=latin1"], r#"{"user":"u1","request_id":"r1"}"#.into(), 415, "Content-Type"),
        ("a text/plain load", "PUT", "/skus/new1".into(), vec![a, b"Content-Type: text/plain"], r#"{"stock":5,"segments":1}"#.into(), 415, "Content-Type"),
        ("a text/plain restock", "POST", "/skus/phone/restock".into(), vec![a, b"Content-Type: text/plain"], r#"{"qty":5}"#.into(), 415, "Content-Type"),
        ("a text/plain reservation", "POST", reserve.into(), vec![b, b"Content-Type: text/plain"], r#"{"user":"u1","request_id":"r2","ttl_ms":1000}"#.into(), 415, "Content-Type"),
        // Methods: a route's other methods.
        ("GET on a POST route", "GET", deduct.into(), vec![b], String::new(), 405, "method"),
        ("DELETE on a GET and PUT route", "DELETE", "/skus/phone".into(), vec![a], String::new(), 405, "method"),
        ("PUT on a POST route", "PUT", "/skus/phone/restock".into(), vec![a], r#"{"qty":5}"#.into(), 405, "method"),
    ];
    assert!(cases.len() >= 30, "{} cases", cases.len());
    let before = snapshot(&redis);
    assert!(before.0 > 0, "the loaded SKU is in Redis");
    let mut wrong = Vec::new();
    for (what, method, path, headers, body, status, field) in &cases {
        let r = send(api.addr, method, path, headers, body.as_bytes());
        let json: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        let named = json["field"].as_str();
        let error = json["error"].as_str().unwrap_or("");
        let code = match status {
            400 => "invalid_input",
            401 => "unauthorized",
            405 => "method_not_allowed",
            413 => "payload_too_large",
            415 => "unsupported_media_type",
            _ => unreachable!("{status}"),
        };
        if r.status != *status
            || named != Some(field)
            || error.is_empty()
            || json["code"].as_str() != Some(code)
        {
            wrong.push(format!(
                "{what}: {method} {path}: expected {status} {code} naming {field}, got {} {}",
                r.status, r.body
            ));
        }
        // A repeated key is said to be one, by name.
        if what.contains("twice") && !error.contains(&format!("key \"{field}\" is repeated")) {
            wrong.push(format!("{what}: not naming the repeated key: {}", r.body));
        }
        // A 405 names the route's methods, in the message and in `Allow`.
        let allow = r.header("allow").unwrap_or("");
        if r.status == 405 && (allow.is_empty() || !error.contains(allow)) {
            wrong.push(format!("{what}: 405 not naming {allow:?}: {}", r.body));
        }
        if r.status == 401 {
            let challenge = r.header("www-authenticate").unwrap_or("");
            if !challenge.starts_with("Bearer") {
                wrong.push(format!("{what}: 401 without WWW-Authenticate: Bearer"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
    assert_eq!(
        snapshot(&redis),
        before,
        "a malformed request wrote to Redis"
    );
    let audit = api.audit("phone");
    assert!(audit.ok, "{audit:?}");
    assert_eq!((audit.remaining, audit.sold), (10, 0));
}

#[test]
fn tokens_open_their_routes_and_health_and_metrics_stay_open() {
    let redis = RedisServer::start();
    let api = Api::start(&redis, ApiOptions::default().metrics(|| "up 1\n".into()));
    let (a, b) = (auth(ADMIN), auth(BUYER));
    let r = send(api.addr, "GET", "/healthz", &[], b"");
    assert_eq!(r.status, 200, "{}", r.body);
    let r = send(api.addr, "GET", "/metrics", &[], b"");
    assert_eq!((r.status, r.body.as_str()), (200, "up 1\n"));
    let r = send(
        api.addr,
        "PUT",
        "/skus/phone",
        &[&a],
        br#"{"stock":5,"segments":2}"#,
    );
    assert_eq!(r.status, 201, "{}", r.body);
    // The scheme is case-insensitive.
    let r = send(
        api.addr,
        "GET",
        "/skus/phone",
        &[b"Authorization: bearer admin-s3cret"],
        b"",
    );
    assert_eq!(
        (r.status, r.json()["remaining"].as_u64()),
        (200, Some(5)),
        "{}",
        r.body
    );
    let r = send(
        api.addr,
        "POST",
        "/skus/phone/deduct",
        &[&b, b"Idempotency-Key: t1"],
        br#"{"user":"u1"}"#,
    );
    assert_eq!(
        (r.status, r.json()["outcome"].as_str()),
        (200, Some("applied")),
        "{}",
        r.body
    );
    let r = send(api.addr, "GET", "/skus/phone/audit", &[&a], b"");
    assert_eq!(
        (
            r.status,
            r.json()["ok"].as_bool(),
            r.json()["sold"].as_u64()
        ),
        (200, Some(true), Some(1))
    );
    let r = send(
        api.addr,
        "GET",
        "/skus/phone/audit",
        &[b"Authorization: Bearer nope"],
        b"",
    );
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("www-authenticate"),
        Some("Bearer error=\"invalid_token\"")
    );
}

#[test]
fn a_call_cut_by_the_timeout_is_retried_with_its_request_id_once() {
    let redis = RedisServer::start();
    let api = Api::start(
        &redis,
        ApiOptions::default().request_timeout(Some(Duration::from_millis(300))),
    );
    api.load("phone", 10, 1);
    let b = auth(BUYER);
    let headers: [&[u8]; 2] = [&b, b"Idempotency-Key: slow-1"];
    let body = br#"{"user":"u1","qty":2}"#;
    // A first sale, so the engine knows the SKU's layout: the stalled command below is then the
    // deduction script itself (sent, run by Redis only after the pause), not a read before it.
    let warm: [&[u8]; 2] = [&b, b"Idempotency-Key: warm-1"];
    let r = send(
        api.addr,
        "POST",
        "/skus/phone/deduct",
        &warm,
        br#"{"user":"u0"}"#,
    );
    assert_eq!(r.json()["outcome"].as_str(), Some("applied"), "{}", r.body);
    // Every client command waits 1.5 s: the deduction is sent, then stalls past the timeout.
    redis.cli(&["CLIENT", "PAUSE", "1500", "ALL"]);
    let r = send(api.addr, "POST", "/skus/phone/deduct", &headers, body);
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(
        r.json()["request_id"].as_str(),
        Some("slow-1"),
        "{}",
        r.body
    );
    // Blocks until the pause is over (PING is paused too).
    assert_eq!(redis.cli(&["PING"]), "PONG");
    let r = send(api.addr, "POST", "/skus/phone/deduct", &headers, body);
    assert_eq!(r.status, 200, "{}", r.body);
    let outcome = r.json()["outcome"].as_str().unwrap().to_string();
    assert!(
        ["replayed", "applied"].contains(&outcome.as_str()),
        "{}",
        r.body
    );
    // A third try: the same one outcome, replayed.
    let r = send(api.addr, "POST", "/skus/phone/deduct", &headers, body);
    assert_eq!(r.json()["outcome"].as_str(), Some("replayed"), "{}", r.body);
    let audit = api.audit("phone");
    assert!(audit.ok, "{audit:?}");
    assert_eq!(
        (audit.sold, audit.remaining),
        (3, 7),
        "exactly one effect: {audit:?}"
    );
    eprintln!("timed-out call, then retry answered {outcome}");
}

#[test]
fn admin_routes_are_refused_beyond_loopback_without_a_token() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let e = rt.block_on(async {
        let engine = Engine::builder()
            .build(shardstock::MemoryStore::new())
            .unwrap();
        let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
        shardstock::http::serve_with(listener, engine, ApiOptions::default(), async {})
            .await
            .unwrap_err()
    });
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(e.to_string().contains("without an admin token"), "{e}");
    let run = common::binary::run(&["serve", "--listen", "0.0.0.0:0"]);
    run.expect_code(4);
    assert!(
        run.stderr.contains("SHARDSTOCK_SERVE__ADMIN_TOKEN"),
        "{}",
        run.stderr
    );
}
