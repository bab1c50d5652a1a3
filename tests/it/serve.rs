//! The HTTP API (`shardstock::http`) over a real redis-server: every route and error code, and
//! Redis failures, with the API served in this process on `127.0.0.1:0`; then what is about the
//! `shardstock serve` binary: a small version of the three-instance experiment (three processes),
//! liveness and readiness while Redis dies and comes back empty, and graceful shutdown on
//! SIGTERM.

use crate::common;

use common::RedisServer;
use common::http_client;
use common::serve_process::ServeProcess as Serve;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use serde_json::{Value, json};
use shardstock::http::ApiOptions;
use shardstock::{Engine, RedisStore};
use std::future::Future;
use std::process::Command;
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// The metrics recorder of the in-process APIs, rendered by `GET /metrics`: the local recorder
/// of every thread of their runtimes, not the global one (the other suites of this test binary
/// record nothing then, as an embedding service without a recorder would).
fn recorder() -> &'static PrometheusRecorder {
    static RECORDER: OnceLock<PrometheusRecorder> = OnceLock::new();
    RECORDER.get_or_init(|| PrometheusBuilder::new().build_recorder())
}

/// [`recorder`]'s view.
fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| recorder().handle())
}

/// The API served in this process on `127.0.0.1:0`, on a runtime of its own, over a Redis
/// store on a given server. Dropping it completes the shutdown future and waits for the server
/// to return.
struct Api {
    base: String,
    shutdown: Option<oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    rt: tokio::runtime::Runtime,
}

impl Api {
    /// `shardstock::http::serve_with` with [`recorder`] rendered by `GET /metrics`.
    fn start(redis: &RedisServer) -> Self {
        Self::start_with(redis, |listener, engine, stop| {
            let options = ApiOptions::default().metrics(|| handle().render());
            shardstock::http::serve_with(listener, engine, options, async move {
                let _ = stop.await;
            })
        })
    }

    /// Runs the server future `serve` makes of a listener on `127.0.0.1:0`, an engine over a
    /// Redis store on `redis`, and the shutdown signal (complete when it resolves).
    fn start_with<F>(
        redis: &RedisServer,
        serve: impl FnOnce(TcpListener, Engine<RedisStore>, oneshot::Receiver<()>) -> F,
    ) -> Self
    where
        F: Future<Output = std::io::Result<()>> + Send + 'static,
    {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .on_thread_start(|| {
                // For the thread's lifetime (the guard would unset it).
                std::mem::forget(::metrics::set_default_local_recorder(recorder()));
            })
            .build()
            .unwrap();
        let engine = ::metrics::with_local_recorder(recorder(), || {
            rt.block_on(common::redis_engine(redis, Engine::builder()))
        });
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel();
        let served = rt.spawn(serve(listener, engine, rx));
        Self {
            base,
            shutdown: Some(tx),
            served: Some(served),
            rt,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Completes the shutdown future; returns what the server returned.
    fn stop(&mut self) -> std::io::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.served.take() {
            Some(h) => self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(10), h).await })
                .expect("serve returns after its shutdown future completes")
                .expect("the server task does not panic"),
            None => Ok(()),
        }
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        if !thread::panicking() {
            self.stop().expect("serve ends without an error");
        }
    }
}

/// An agent for the API: every status an answer, slow calls (a Redis timeout) allowed 20 s.
fn agent() -> ureq::Agent {
    http_client::agent_with_timeout(Duration::from_secs(20))
}

/// A reply: status, JSON body (Null when not JSON), Retry-After header.
#[derive(Debug)]
struct Reply {
    status: u16,
    body: Value,
    retry_after: Option<String>,
}

fn call(a: &ureq::Agent, method: &str, url: &str, body: Option<Value>, key: Option<&str>) -> Reply {
    let mut r = match method {
        "GET" => a.get(url).call(),
        _ => {
            let mut req = match method {
                "PUT" => a.put(url),
                _ => a.post(url),
            }
            .header("content-type", "application/json");
            if let Some(k) = key {
                req = req.header("idempotency-key", k);
            }
            req.send(body.map(|b| b.to_string()).unwrap_or_default())
        }
    }
    .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let retry_after = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let text = r.body_mut().read_to_string().unwrap();
    Reply {
        status: r.status().as_u16(),
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
        retry_after,
    }
}

fn get(a: &ureq::Agent, url: &str) -> Reply {
    call(a, "GET", url, None, None)
}

fn post(a: &ureq::Agent, url: &str, body: Value) -> Reply {
    call(a, "POST", url, Some(body), None)
}

fn put(a: &ureq::Agent, url: &str, body: Value) -> Reply {
    call(a, "PUT", url, Some(body), None)
}

/// Asserts an error reply with `status` naming `field`.
fn expect_error(r: &Reply, status: u16, field: &str) {
    assert_eq!(r.status, status, "{r:?}");
    assert_eq!(r.body["field"], field, "{r:?}");
    assert!(
        r.body["error"].as_str().is_some_and(|s| !s.is_empty()),
        "{r:?}"
    );
}

#[test]
fn every_route_answers_with_the_documented_codes() {
    let srv = RedisServer::start();
    let s = Api::start(&srv);
    let a = agent();

    let h = get(&a, &s.url("/healthz"));
    assert_eq!(
        (h.status, &h.body["strategy"]),
        (200, &json!("lua")),
        "{h:?}"
    );
    let r = get(&a, &s.url("/readyz"));
    assert_eq!(
        (r.status, &r.body["status"], &r.body["timeout_ms"]),
        (200, &json!("ready"), &json!(1000)),
        "{r:?}"
    );

    // Load, and load again.
    let r = put(
        &a,
        &s.url("/skus/phone"),
        json!({"stock": 10, "segments": 2, "per_user_limit": 0}),
    );
    assert_eq!(r.status, 201, "{r:?}");
    let first = r.body["generation"].as_u64().expect("a generation");
    expect_error(
        &put(
            &a,
            &s.url("/skus/phone"),
            json!({"stock": 10, "segments": 2}),
        ),
        409,
        "sku",
    );
    let r = put(
        &a,
        &s.url("/skus/phone"),
        json!({"stock": 10, "segments": 2, "per_user_limit": 0, "replace": true}),
    );
    assert_eq!(r.status, 201, "{r:?}");
    assert!(
        r.body["generation"].as_u64().expect("a generation") > first,
        "a replace starts a newer generation: {r:?}"
    );
    expect_error(
        &put(&a, &s.url("/skus/phone2"), json!({"stock": 10})),
        400,
        "segments",
    );
    expect_error(
        &put(
            &a,
            &s.url("/skus/phone2"),
            json!({"stock": 10, "segments": 0}),
        ),
        400,
        "segments",
    );
    expect_error(
        &put(
            &a,
            &s.url("/skus/bad%20sku"),
            json!({"stock": 1, "segments": 1}),
        ),
        400,
        "sku",
    );

    // Deduct: applied, replayed (body id and header id), bad input, conflicts.
    let deduct = s.url("/skus/phone/deduct");
    let r = post(
        &a,
        &deduct,
        json!({"user": "u1", "qty": 1, "request_id": "r1"}),
    );
    assert_eq!(
        (r.status, &r.body["outcome"]),
        (200, &json!("applied")),
        "{r:?}"
    );
    let r = call(
        &a,
        "POST",
        &deduct,
        Some(json!({"user": "u1", "qty": 1})),
        Some("r1"),
    );
    assert_eq!(
        (r.status, &r.body["outcome"]),
        (200, &json!("replayed")),
        "{r:?}"
    );
    let r = call(
        &a,
        "POST",
        &deduct,
        Some(json!({"user": "u1", "qty": 1})),
        Some("k2"),
    );
    assert_eq!(r.body["outcome"], "applied", "{r:?}");
    let r = call(
        &a,
        "POST",
        &deduct,
        Some(json!({"user": "u1", "qty": 1})),
        Some("k2"),
    );
    assert_eq!(r.body["outcome"], "replayed", "{r:?}");
    expect_error(
        &post(
            &a,
            &deduct,
            json!({"user": "a{b", "qty": 1, "request_id": "r9"}),
        ),
        400,
        "user",
    );
    expect_error(
        &post(&a, &deduct, json!({"user": "u1", "qty": 1})),
        400,
        "request_id",
    );
    expect_error(
        &post(
            &a,
            &deduct,
            json!({"user": "u1", "qty": 0, "request_id": "r9"}),
        ),
        400,
        "qty",
    );
    expect_error(
        &post(
            &a,
            &deduct,
            json!({"user": "u1", "qty": -1, "request_id": "r9"}),
        ),
        400,
        "qty",
    );
    expect_error(
        &post(&a, &deduct, json!({"user": 7, "request_id": "r9"})),
        400,
        "user",
    );
    expect_error(
        &post(&a, &deduct, json!({"usr": "u1", "request_id": "r9"})),
        400,
        "usr",
    );
    expect_error(
        &call(
            &a,
            "POST",
            &deduct,
            Some(json!({"user": "u1", "request_id": "r9"})),
            Some("other"),
        ),
        400,
        "request_id",
    );
    // Request ids are scoped per user: the same id as a reservation of the same user is a
    // conflict of kind (under another user it would be another request).
    expect_error(
        &post(
            &a,
            &s.url("/skus/phone/reservations"),
            json!({"user": "u1", "qty": 1, "request_id": "r1", "ttl_ms": 60000}),
        ),
        409,
        "kind",
    );
    expect_error(
        &post(
            &a,
            &deduct,
            json!({"user": "u1", "qty": 2, "request_id": "r1"}),
        ),
        409,
        "qty",
    );
    // Under a per-user limit too: the same id with a quantity above the limit is the same
    // 409 (the id's record is looked at first); a new id above it is `over_limit`, 200.
    let r = put(
        &a,
        &s.url("/skus/limited"),
        json!({"stock": 10, "segments": 2, "per_user_limit": 1}),
    );
    assert_eq!(r.status, 201, "{r:?}");
    let limited = s.url("/skus/limited/deduct");
    let r = post(&a, &limited, json!({"user": "u1", "request_id": "l1"}));
    assert_eq!(r.body["outcome"], "applied", "{r:?}");
    expect_error(
        &post(
            &a,
            &limited,
            json!({"user": "u1", "qty": 2, "request_id": "l1"}),
        ),
        409,
        "qty",
    );
    let r = post(
        &a,
        &limited,
        json!({"user": "u1", "qty": 2, "request_id": "l2"}),
    );
    assert_eq!(
        (r.status, &r.body["outcome"], &r.body["limit"]),
        (200, &json!("over_limit"), &json!(1)),
        "{r:?}"
    );
    let r = a
        .post(&deduct)
        .header("content-type", "application/json")
        .send("{not json")
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    expect_error(
        &post(
            &a,
            &s.url("/skus/nothing/deduct"),
            json!({"user": "u1", "request_id": "r1"}),
        ),
        404,
        "sku",
    );
    let r = post(
        &a,
        &deduct,
        json!({"user": "u3", "qty": 9, "request_id": "r3"}),
    );
    assert_eq!(r.body["outcome"], "insufficient", "{r:?}");

    // Status and audit.
    let r = get(&a, &s.url("/skus/phone"));
    assert_eq!((r.status, &r.body["remaining"]), (200, &json!(8)), "{r:?}");
    assert_eq!(r.body["per_segment"].as_array().unwrap().len(), 2);
    expect_error(&get(&a, &s.url("/skus/nothing")), 404, "sku");
    let r = get(&a, &s.url("/skus/phone/audit"));
    assert_eq!(
        (r.status, &r.body["ok"], &r.body["sold"]),
        (200, &json!(true), &json!(2)),
        "{r:?}"
    );
    expect_error(&get(&a, &s.url("/skus/nothing/audit")), 404, "sku");

    // Restock: once per request id, conflicts on another quantity.
    let restock = s.url("/skus/phone/restock");
    let r = post(&a, &restock, json!({"qty": 4, "request_id": "s1"}));
    assert_eq!((r.status, &r.body["added"]), (200, &json!(4)), "{r:?}");
    let r = call(&a, "POST", &restock, Some(json!({"qty": 4})), Some("s1"));
    assert_eq!(
        (r.status, &r.body["replayed"]),
        (200, &json!(true)),
        "{r:?}"
    );
    expect_error(
        &post(&a, &restock, json!({"qty": 5, "request_id": "s1"})),
        409,
        "qty",
    );
    expect_error(&post(&a, &restock, json!({"qty": "5"})), 400, "qty");
    assert_eq!(get(&a, &s.url("/skus/phone")).body["remaining"], 12);

    // Reservations: hold, replay, confirm; hold, cancel; unknown and malformed ids.
    let resv = s.url("/skus/phone/reservations");
    let r = post(
        &a,
        &resv,
        json!({"user": "v1", "qty": 1, "request_id": "h1", "ttl_ms": 60000}),
    );
    assert_eq!(
        (r.status, &r.body["outcome"]),
        (201, &json!("held")),
        "{r:?}"
    );
    let id = r.body["id"].as_str().unwrap().to_string();
    let r = post(
        &a,
        &resv,
        json!({"user": "v1", "qty": 1, "request_id": "h1", "ttl_ms": 60000}),
    );
    assert_eq!(
        (r.status, &r.body["outcome"], &r.body["id"]),
        (200, &json!("replayed"), &json!(id)),
        "{r:?}"
    );
    expect_error(
        &post(
            &a,
            &resv,
            json!({"user": "v1", "qty": 1, "request_id": "h9"}),
        ),
        400,
        "ttl_ms",
    );
    expect_error(
        &post(
            &a,
            &resv,
            json!({"user": "v1", "qty": 1, "request_id": "h9", "ttl_ms": 0}),
        ),
        400,
        "ttl_ms",
    );
    assert_eq!(get(&a, &s.url("/skus/phone/audit")).body["reserved"], 1);
    let r = post(
        &a,
        &s.url(&format!("/reservations/{id}/confirm")),
        json!({}),
    );
    assert_eq!(
        (r.status, &r.body["state"], &r.body["done"]),
        (200, &json!("confirmed"), &json!(true)),
        "{r:?}"
    );
    let r = post(
        &a,
        &resv,
        json!({"user": "v2", "qty": 2, "request_id": "h2", "ttl_ms": 60000}),
    );
    assert_eq!(r.status, 201, "{r:?}");
    let id2 = r.body["id"].as_str().unwrap().to_string();
    let r = post(
        &a,
        &s.url(&format!("/reservations/{id2}/cancel")),
        json!({}),
    );
    assert_eq!(
        (r.status, &r.body["state"]),
        (200, &json!("cancelled")),
        "{r:?}"
    );
    let r = post(&a, &s.url(&format!("/reservations/{id}/cancel")), json!({}));
    assert_eq!(
        (r.status, &r.body["done"]),
        (200, &json!(false)),
        "confirmed stays confirmed: {r:?}"
    );
    let unknown = id.replace("~h1", "~zz");
    expect_error(
        &post(
            &a,
            &s.url(&format!("/reservations/{unknown}/confirm")),
            json!({}),
        ),
        404,
        "reservation",
    );
    expect_error(
        &post(&a, &s.url("/reservations/garbage/confirm"), json!({})),
        400,
        "reservation",
    );
    let r = get(&a, &s.url("/skus/phone/audit"));
    assert!(
        r.body["ok"] == json!(true) && r.body["sold"] == json!(3) && r.body["reserved"] == json!(0),
        "{r:?}"
    );

    // Metrics and unknown routes.
    let (status, text) = http_client::get(&a, &s.url("/metrics"), &[]).unwrap();
    assert_eq!(status, 200);
    assert!(text.contains("shardstock_deductions_total"), "{text}");
    assert_eq!(get(&a, &s.url("/nothing")).status, 404);
}

/// Redis gone: a 503 with a retry hint, not a hang or a panic.
#[test]
fn redis_failure_is_a_503_with_retry_after() {
    let srv = RedisServer::start();
    let s = Api::start(&srv);
    let a = agent();
    assert_eq!(
        put(&a, &s.url("/skus/x"), json!({"stock": 5, "segments": 1})).status,
        201
    );
    drop(srv);
    let start = Instant::now();
    let r = post(
        &a,
        &s.url("/skus/x/deduct"),
        json!({"user": "u1", "request_id": "r1"}),
    );
    assert_eq!(r.status, 503, "{r:?}");
    assert!(r.retry_after.is_some(), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(15));
    assert_eq!(get(&a, &s.url("/healthz")).status, 200);
}

/// A route of the app's own taking its body with `shardstock::http::Json`.
async fn own_order(
    shardstock::http::Json(order): shardstock::http::Json<Value>,
) -> Result<shardstock::http::Json<Value>, shardstock::http::ApiError> {
    let user = shardstock::UserId::new(order["user"].as_str().unwrap_or_default())?;
    Ok(shardstock::http::Json(json!({ "user": user.as_str() })))
}

/// The routes mounted under a prefix in another axum app, next to routes of its own: both
/// answer, and the API's JSON 404s and 405s stay inside its prefix; the app's own route answers
/// its errors in the API's shape (a key named twice among them). Without a metrics renderer,
/// `/metrics` is a 404 saying so.
#[test]
fn the_routes_mount_in_another_app() {
    let srv = RedisServer::start();
    let s = Api::start_with(&srv, |listener, engine, stop| async move {
        let app = axum::Router::new()
            .route("/own", axum::routing::get(|| async { "mine" }))
            .route("/own/order", axum::routing::post(own_order))
            .nest("/api", shardstock::http::router(engine));
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop.await;
            })
            .await
    });
    let a = agent();
    let r = put(
        &a,
        &s.url("/api/skus/mounted"),
        json!({"stock": 3, "segments": 1, "per_user_limit": 0}),
    );
    assert_eq!(r.status, 201, "{r:?}");
    let r = post(
        &a,
        &s.url("/api/skus/mounted/deduct"),
        json!({"user": "u1", "request_id": "r1"}),
    );
    assert_eq!(
        (r.status, &r.body["outcome"]),
        (200, &json!("applied")),
        "{r:?}"
    );
    let (status, own) = http_client::get(&a, &s.url("/own"), &[]).unwrap();
    assert_eq!(status, 200);
    assert_eq!(own, "mine");
    let r = get(&a, &s.url("/api/metrics"));
    assert_eq!(r.status, 404, "{r:?}");
    assert!(
        r.body["error"]
            .as_str()
            .is_some_and(|e| e.contains("metrics")),
        "{r:?}"
    );
    let r = get(&a, &s.url("/api/nothing"));
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(r.body["error"], "no such route", "{r:?}");
    assert_eq!(r.body["code"], "not_found", "{r:?}");
    let r = get(&a, &s.url("/api/skus/mounted/deduct"));
    assert_eq!(
        (r.status, &r.body["code"]),
        (405, &json!("method_not_allowed")),
        "{r:?}"
    );
    // The app's own route: JSON in and out, errors in the API's shape.
    let r = post(&a, &s.url("/own/order"), json!({"user": "u1"}));
    assert_eq!((r.status, &r.body["user"]), (200, &json!("u1")), "{r:?}");
    let r = post(&a, &s.url("/own/order"), json!({"user": "a{b"}));
    assert_eq!((r.status, &r.body["field"]), (400, &json!("user")), "{r:?}");
    assert_eq!(r.body["code"], "invalid_input", "{r:?}");
    // A key named twice: refused by name, not read as its last value.
    let mut twice = a
        .post(&s.url("/own/order"))
        .header("content-type", "application/json")
        .send(r#"{"user":"a{b","user":"u1"}"#)
        .unwrap();
    assert_eq!(twice.status().as_u16(), 400);
    let body: Value = serde_json::from_str(&twice.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(
        (&body["code"], &body["field"]),
        (&json!("invalid_input"), &json!("user")),
        "{body}"
    );
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("\"user\" is repeated")),
        "{body}"
    );
    let mut form = a
        .post(&s.url("/own/order"))
        .header("content-type", "text/plain")
        .send("{\"user\":\"u1\"}")
        .unwrap();
    assert_eq!(form.status().as_u16(), 415);
    let body: Value = serde_json::from_str(&form.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(body["code"], "unsupported_media_type", "{body}");
}

/// `serve` returns `Ok` once the shutdown future it was given completes, and the port then
/// refuses connections.
#[test]
fn serve_returns_when_its_shutdown_future_completes() {
    let srv = RedisServer::start();
    let mut s = Api::start(&srv);
    let a = agent();
    assert_eq!(get(&a, &s.url("/healthz")).status, 200);
    s.stop().expect("serve returns Ok");
    assert!(
        http_client::get(&a, &s.url("/healthz"), &[]).is_err(),
        "still answering after shutdown"
    );
}

/// Fires `threads` threads at each instance, each sending `per_thread` deducts with unique
/// users and request ids; returns the units the replies say were applied.
fn drive(instances: &[Serve], sku: &str, threads: usize, per_thread: usize) -> u64 {
    let mut handles = Vec::new();
    for (i, s) in instances.iter().enumerate() {
        for t in 0..threads {
            let url = s.url(&format!("/skus/{sku}/deduct"));
            handles.push(thread::spawn(move || {
                let a = agent();
                let mut applied = 0;
                for n in 0..per_thread {
                    let id = format!("i{i}-t{t}-n{n}");
                    let r = post(&a, &url, json!({"user": id, "qty": 1, "request_id": id}));
                    assert_eq!(r.status, 200, "{r:?}");
                    if r.body["outcome"] == "applied" {
                        applied += 1;
                    }
                }
                applied
            }));
        }
    }
    handles.into_iter().map(|h| h.join().unwrap()).sum()
}

fn three(srv: &RedisServer, extra: &[&str]) -> Vec<Serve> {
    (0..3)
        .map(|_| Serve::start(&srv.url(), extra, &[]))
        .collect()
}

#[test]
fn three_lua_instances_sell_exactly_the_stock() {
    let srv = RedisServer::start();
    let inst = three(&srv, &["--strategy", "lua"]);
    let a = agent();
    let r = put(
        &a,
        &inst[0].url("/skus/m3"),
        json!({"stock": 150, "segments": 4, "per_user_limit": 0}),
    );
    assert_eq!(r.status, 201, "{r:?}");
    let sold = drive(&inst, "m3", 8, 12); // 288 requests for 150 units
    assert_eq!(sold, 150);
    let r = get(&a, &inst[1].url("/skus/m3/audit"));
    assert!(
        r.body["ok"] == json!(true)
            && r.body["sold"] == json!(150)
            && r.body["remaining"] == json!(0),
        "{r:?}"
    );
}

/// The unsafe baseline's demonstration: three processes, each with its own lock, oversell.
///
/// Each process reads the stock, holds its own mutex for the critical section and only then
/// decrements. One unit and a 1.5 s section make the oversell certain rather than likely: every
/// process's first request reads the stock at start, and any two of those reads within 1.5 s
/// of each other both see the one unit and both sell it. (100 units and a 20 ms section relied
/// on the processes overlapping at the last unit; they could end in step and sell exactly 100.)
#[test]
fn three_local_mutex_instances_oversell() {
    let srv = RedisServer::start();
    let inst = three(
        &srv,
        &["--strategy", "local-mutex", "--critical-pause-ms", "1500"],
    );
    let a = agent();
    let r = put(
        &a,
        &inst[0].url("/skus/lm"),
        json!({"stock": 1, "segments": 1, "per_user_limit": 0}),
    );
    assert_eq!(r.status, 201, "{r:?}");
    let sold = drive(&inst, "lm", 2, 3);
    let r = get(&a, &inst[2].url("/skus/lm/audit"));
    let audited = r.body["sold"].as_u64().unwrap();
    let loaded = r.body["loaded"].as_u64().unwrap();
    assert!(sold > 1 && audited > loaded, "replies {sold}, audit {r:?}");
    assert_eq!(r.body["ok"], false, "{r:?}");
}

/// Liveness and readiness of a `serve` process over a redis-server that is killed and comes
/// back empty: `/healthz` answers 200 throughout (the process is alive); `/readyz` answers 200
/// `ready`, then 503 `unavailable` within its bound (`--ready-timeout-ms 500`) with the reason
/// and `Cache-Control: no-store`, then 200 `degraded` naming the SKU that vanished, then 200
/// `ready` once it is loaded again. The change of state is in the log.
#[test]
fn readyz_follows_the_store_and_healthz_stays_up() {
    let mut srv = RedisServer::start();
    let s = Serve::start(&srv.url(), &["--ready-timeout-ms", "500"], &[]);
    let a = agent();
    let ready = |expect: u16| {
        let t = Instant::now();
        let mut r = a.get(&s.url("/readyz")).call().unwrap();
        let took = t.elapsed();
        let no_store = r
            .headers()
            .get("cache-control")
            .map(|v| v.to_str().unwrap().to_string());
        let body: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        assert_eq!(r.status().as_u16(), expect, "{body}");
        assert_eq!(no_store.as_deref(), Some("no-store"));
        (body, took)
    };
    let load = || {
        let r = put(
            &a,
            &s.url("/skus/phone"),
            json!({"stock": 10, "segments": 2, "replace": true}),
        );
        assert_eq!(r.status, 201, "{r:?}");
    };
    load();
    let (r, _) = ready(200);
    assert_eq!(
        (&r["status"], &r["store"]),
        (&json!("ready"), &json!("redis")),
        "{r}"
    );
    assert_eq!(r["timeout_ms"], 500, "{r}");

    srv.stop();
    let (r, took) = ready(503);
    assert_eq!(r["status"], "unavailable", "{r}");
    assert!(
        r["reason"]
            .as_str()
            .is_some_and(|s| s.starts_with("redis unreachable")),
        "{r}"
    );
    assert!(
        took < Duration::from_millis(1500),
        "/readyz took {took:?}: {r}"
    );
    let h = get(&a, &s.url("/healthz"));
    assert_eq!((h.status, &h.body["status"]), (200, &json!("ok")), "{h:?}");

    srv.boot();
    let deadline = Instant::now() + Duration::from_secs(20);
    let r = loop {
        let mut resp = a.get(&s.url("/readyz")).call().unwrap();
        let body: Value = serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
        if resp.status().as_u16() == 200 {
            break body;
        }
        assert!(Instant::now() < deadline, "never ready again: {body}");
        thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(r["status"], "degraded", "{r}");
    assert_eq!(r["vanished_skus"], json!(["phone"]), "{r}");
    load();
    let (r, _) = ready(200);
    assert_eq!(r["status"], "ready", "{r}");
    let log = std::fs::read_to_string(&s.proc.log).unwrap();
    assert!(
        log.contains("store unavailable") && log.contains("store degraded"),
        "{log}"
    );
}

/// SIGTERM with a request in flight: the request completes, then the process exits 0.
#[test]
fn sigterm_lets_the_in_flight_request_finish() {
    let srv = RedisServer::start();
    let mut s = Serve::start(
        &srv.url(),
        &["--strategy", "local-mutex", "--critical-pause-ms", "1500"],
        &[],
    );
    let a = agent();
    // Without a per-user limit: a baseline keeps no ledgers, and refuses a SKU with one.
    assert_eq!(
        put(
            &a,
            &s.url("/skus/g"),
            json!({"stock": 5, "segments": 1, "per_user_limit": 0})
        )
        .status,
        201
    );
    let url = s.url("/skus/g/deduct");
    let slow =
        thread::spawn(move || post(&agent(), &url, json!({"user": "u1", "request_id": "r1"})));
    thread::sleep(Duration::from_millis(500));
    let pid = s.proc.child.id().to_string();
    let st = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(st.success());
    let r = slow.join().unwrap();
    assert_eq!(
        (r.status, &r.body["outcome"]),
        (200, &json!("applied")),
        "{r:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = s.proc.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "serve still running after SIGTERM"
        );
        thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
}
