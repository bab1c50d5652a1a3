//! `examples/embed_axum.rs` as a service: its source is compiled into this test, so the
//! example cannot fall behind the library.
//!
//! - In this process, on the embedded store: it sells on its own route (its body read with
//!   `shardstock::http::Json`, a bad one refused in the API's error shape), answers on the
//!   mounted API (`/api/readyz` included), and `/api/metrics` renders the sale from the
//!   recorder it installed.
//! - As a process of its own, its `main` over a real redis-server (this test binary started
//!   again, running only [`child_runs_the_example_main`]): ready; Redis killed, a warning is
//!   logged without any request and `/api/readyz` answers 503; Redis back, ready again; SIGTERM
//!   ends it cleanly (exit 0, "stopped" logged).
//!
//! A test binary of its own: the recorder the example installs is global to the process, and
//! sales of other tests running beside it would count in its `/api/metrics`.

#[allow(dead_code)] // `main` runs in the child process only
#[path = "../examples/embed_axum.rs"]
mod embed_axum;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `(status, body)` of a request (a JSON body for a POST); every status is an answer.
fn call(method: &str, url: &str, body: Option<&str>) -> (u16, String) {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .new_agent();
    let mut resp = match (method, body) {
        ("POST", Some(b)) => agent
            .post(url)
            .header("content-type", "application/json")
            .send(b),
        ("POST", None) => agent.post(url).send_empty(),
        _ => agent.get(url).call(),
    }
    .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let body = resp.body_mut().read_to_string().unwrap();
    (resp.status().as_u16(), body)
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedding_example_sells_and_serves_metrics() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let engine = shardstock::Engine::builder()
        .build(shardstock::MemoryStore::new())
        .unwrap();
    let service = tokio::spawn(embed_axum::service(engine, listener, async {
        let _ = stopped.await;
    }));

    let answers = tokio::task::spawn_blocking(move || {
        // The service loads its stock before it serves: wait for it.
        let mut status = call("GET", &format!("{base}/api/skus/phone"), None);
        for _ in 0..100 {
            if status.0 == 200 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            status = call("GET", &format!("{base}/api/skus/phone"), None);
        }
        let order = r#"{"user":"u1","request_id":"order-1"}"#;
        let sale = call("POST", &format!("{base}/buy/phone"), Some(order));
        let replay = call("POST", &format!("{base}/buy/phone"), Some(order));
        let not_json = call("POST", &format!("{base}/buy/phone"), None);
        let bad = call(
            "POST",
            &format!("{base}/buy/phone"),
            Some(r#"{"user":"u2"}"#),
        );
        let after = call("GET", &format!("{base}/api/skus/phone"), None);
        let ready = call("GET", &format!("{base}/api/readyz"), None);
        let metrics = call("GET", &format!("{base}/api/metrics"), None);
        (status, sale, replay, not_json, bad, after, ready, metrics)
    })
    .await
    .unwrap();
    let (before, sale, replay, not_json, bad, after, ready, metrics) = answers;

    assert_eq!(before.0, 200, "{before:?}");
    assert_eq!(sale.0, 200, "{sale:?}");
    assert_eq!(json(&sale.1)["outcome"], "applied", "{sale:?}");
    let v = json(&replay.1);
    assert_eq!(v["outcome"], "replayed", "a retry sells nothing: {v}");
    // Its body is read with shardstock::http::Json: the API's refusals.
    assert_eq!(not_json.0, 415, "{not_json:?}");
    assert_eq!(json(&not_json.1)["code"], "unsupported_media_type");
    assert_eq!(bad.0, 400, "{bad:?}");
    assert_eq!(
        (&json(&bad.1)["code"], &json(&bad.1)["field"]),
        (
            &serde_json::json!("invalid_input"),
            &serde_json::json!("body")
        )
    );
    assert_eq!(json(&after.1)["remaining"], 9, "{after:?}");
    assert_eq!(ready.0, 200, "{ready:?}");
    assert_eq!(
        (&json(&ready.1)["status"], &json(&ready.1)["store"]),
        (&serde_json::json!("ready"), &serde_json::json!("memory"))
    );

    assert_eq!(metrics.0, 200, "{metrics:?}");
    let sold = metrics
        .1
        .lines()
        .find(|l| l.starts_with("shardstock_deductions_total") && l.contains("applied"))
        .unwrap_or_else(|| panic!("no applied deductions in /api/metrics:\n{}", metrics.1));
    assert!(sold.ends_with(" 1"), "{sold}");

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), service)
        .await
        .expect("the service shut down")
        .unwrap()
        .unwrap();
}

/// Set in the child process: run the example's `main`.
const CHILD: &str = "SHARDSTOCK_EMBED_EXAMPLE_CHILD";

/// In the child process (see [`the_example_as_a_process_logs_an_outage_and_stops_on_sigterm`]):
/// the example's `main`, with its log subscriber and signal handling. Elsewhere: nothing.
#[test]
fn child_runs_the_example_main() {
    if std::env::var_os(CHILD).is_some() {
        embed_axum::main().expect("the example's main ends without an error");
    }
}

/// A redis-server on a free port (no persistence), killed on drop.
struct Redis {
    port: u16,
    child: Option<Child>,
    dir: std::path::PathBuf,
}

impl Redis {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("embed-example-redis-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = Self {
            port,
            child: None,
            dir,
        };
        r.boot();
        r
    }

    /// Starts it (empty) and waits until it answers PING.
    fn boot(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.pings() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pings(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    /// `kill -9`.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The child process, killed on drop (its stderr, the example's log, printed on a failure).
struct Example {
    child: Child,
    log: std::path::PathBuf,
}

impl Example {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (at most `within`) until the log has a line for which `found` holds.
    fn wait_for_line(&self, within: Duration, what: &str, found: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Some(l) = self.log().lines().find(|l| found(l)) {
                return l.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "no log line {what}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- the example's log ---\n{}", self.log());
        }
    }
}

#[test]
fn the_example_as_a_process_logs_an_outage_and_stops_on_sigterm() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let mut redis = Redis::start();
    let log = std::env::temp_dir().join(format!("embed-example-{}.log", redis.port));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_runs_the_example_main", "--nocapture"])
        .env(CHILD, "1")
        .env("LISTEN", "127.0.0.1:0")
        .env("REDIS_URL", format!("redis://127.0.0.1:{}", redis.port))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut example = Example { child, log };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.strip_prefix("listening on ") {
                let _ = tx.send(addr.to_string());
            }
        }
    });
    let base = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("the example did not start:\n{}", example.log()));

    // Ready once its stock is loaded.
    let deadline = Instant::now() + Duration::from_secs(20);
    while call("GET", &format!("{base}/api/skus/phone"), None).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "never loaded:\n{}",
            example.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let order = r#"{"user":"u1","request_id":"order-1"}"#;
    let sale = call("POST", &format!("{base}/buy/phone"), Some(order));
    assert_eq!(json(&sale.1)["outcome"], "applied", "{sale:?}");
    let ready = call("GET", &format!("{base}/api/readyz"), None);
    assert_eq!(
        (ready.0, &json(&ready.1)["status"]),
        (200, &serde_json::json!("ready"))
    );

    // Redis gone: the outage is in the log without a single request (the sweeper's warning),
    // and readiness fails.
    redis.kill();
    let warned = example.wait_for_line(Duration::from_secs(20), "warning of the outage", |l| {
        l.contains("WARN") && l.contains("sweep failed")
    });
    eprintln!("logged: {warned}");
    let down = call("GET", &format!("{base}/api/readyz"), None);
    assert_eq!(down.0, 503, "{down:?}");
    assert_eq!(json(&down.1)["status"], "unavailable", "{down:?}");
    example.wait_for_line(Duration::from_secs(5), "of readiness failing", |l| {
        l.contains("WARN") && l.contains("store unavailable")
    });
    let live = call("GET", &format!("{base}/api/healthz"), None);
    assert_eq!(live.0, 200, "liveness does not ask the store: {live:?}");

    // Back (empty): the store answers again.
    redis.boot();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = call("GET", &format!("{base}/api/readyz"), None);
        if r.0 == 200 {
            assert_eq!(
                json(&r.1)["vanished_skus"],
                serde_json::json!(["phone"]),
                "{r:?}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "never ready again: {r:?}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // SIGTERM: a graceful stop, exit 0.
    let pid = example.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(st) = example.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "still running after SIGTERM:\n{}",
            example.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}:\n{}", example.log());
    let log = example.log();
    assert!(
        log.contains("SIGTERM: stopping") && log.contains("stopped"),
        "{log}"
    );
}
