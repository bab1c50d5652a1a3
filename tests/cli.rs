mod common;

// The `shardstock` binary end to end: real processes (`CARGO_BIN_EXE_shardstock`), their
// `--json` output and exit codes, against the embedded store and real redis-server processes.
// One redis-server per test, so the tests run in parallel.

use common::RedisServer;
use serde_json::Value;
use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// A CLI call that has not finished by then is hung: kill it and fail.
const TIMEOUT: Duration = Duration::from_secs(120);

/// What a finished CLI process left behind.
#[derive(Debug)]
struct Run {
    what: String,
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The exit code (`None` when killed by a signal).
    fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Panics unless the process exited with `code`.
    fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code(),
            Some(code),
            "`{}`: exit code\nstdout: {}\nstderr: {}",
            self.what,
            self.stdout,
            self.stderr
        );
        self
    }

    /// Panics unless the process exited non-zero (and was not killed by a signal).
    fn expect_failure(&self) -> &Self {
        let code = self.code();
        assert!(
            code.is_some() && code != Some(0),
            "`{}` should fail, exited with {code:?}\nstdout: {}\nstderr: {}",
            self.what,
            self.stdout,
            self.stderr
        );
        self
    }

    /// stdout as the one JSON object `--json` prints.
    fn json(&self) -> Value {
        let v: Value = serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "`{}`: stdout is not JSON ({e})\nstdout: {}\nstderr: {}",
                self.what, self.stdout, self.stderr
            )
        });
        assert!(v.is_object(), "`{}`: not a JSON object: {v}", self.what);
        v
    }
}

/// The binary, with no `SHARDSTOCK_*` settings or `RUST_LOG` inherited from the environment.
fn shardstock(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shardstock"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SHARDSTOCK_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env_remove("RUST_LOG")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Starts the binary without waiting for it.
fn spawn(args: &[&str]) -> (Child, String) {
    let what = format!("shardstock {}", args.join(" "));
    let child = shardstock(args)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
    (child, what)
}

/// Waits for a spawned process (at most [`TIMEOUT`]) and collects its output.
fn finish((mut child, what): (Child, String)) -> Run {
    let drain = |mut r: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            r.read_to_end(&mut buf).unwrap();
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`{what}` still running after {TIMEOUT:?}: killed");
        }
        thread::sleep(Duration::from_millis(10));
    };
    Run {
        what,
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// Runs the binary to completion.
fn run(args: &[&str]) -> Run {
    finish(spawn(args))
}

/// A non-negative integer field; panics when missing or of another type.
fn u(v: &Value, field: &str) -> u64 {
    v.get(field)
        .unwrap_or_else(|| panic!("field {field:?} missing in {v}"))
        .as_u64()
        .unwrap_or_else(|| panic!("field {field:?} is not an unsigned integer in {v}"))
}

/// A number field.
fn f(v: &Value, field: &str) -> f64 {
    v.get(field)
        .unwrap_or_else(|| panic!("field {field:?} missing in {v}"))
        .as_f64()
        .unwrap_or_else(|| panic!("field {field:?} is not a number in {v}"))
}

/// A boolean field.
fn b(v: &Value, field: &str) -> bool {
    v.get(field)
        .unwrap_or_else(|| panic!("field {field:?} missing in {v}"))
        .as_bool()
        .unwrap_or_else(|| panic!("field {field:?} is not a boolean in {v}"))
}

/// A string field.
fn s<'a>(v: &'a Value, field: &str) -> &'a str {
    v.get(field)
        .unwrap_or_else(|| panic!("field {field:?} missing in {v}"))
        .as_str()
        .unwrap_or_else(|| panic!("field {field:?} is not a string in {v}"))
}

/// `audit --json` of `sku`, expecting exit code `code`.
fn audit(srv: &RedisServer, sku: &str, code: i32) -> Value {
    let url = srv.url();
    let r = run(&["audit", "--redis", &url, "--sku", sku, "--json"]);
    r.expect_code(code);
    r.json()
}

/// `load --json` of a new SKU; returns the reported generation.
fn load(srv: &RedisServer, sku: &str, stock: u64, segments: u32) -> u64 {
    let url = srv.url();
    let (stock_s, segs_s) = (stock.to_string(), segments.to_string());
    let r = run(&[
        "load",
        "--redis",
        &url,
        "--sku",
        sku,
        "--stock",
        &stock_s,
        "--segments",
        &segs_s,
        "--json",
    ]);
    r.expect_code(0);
    let v = r.json();
    assert_eq!(s(&v, "sku"), sku);
    assert_eq!(u(&v, "stock"), stock);
    assert_eq!(u(&v, "segments"), u64::from(segments));
    assert_eq!(s(&v, "store"), "redis");
    u(&v, "generation")
}

fn dbsize(srv: &RedisServer) -> u64 {
    let out = srv.cli(&["DBSIZE"]);
    out.parse()
        .unwrap_or_else(|_| panic!("DBSIZE answered {out:?}"))
}

/// The per-outcome counters of a `sim` report add up to its request count.
fn outcomes_add_up(v: &Value) {
    let total: u64 = [
        "applied",
        "sold_out",
        "insufficient",
        "in_flight",
        "replayed",
        "limit_reached",
        "user_busy",
        "errors",
    ]
    .iter()
    .map(|k| u(v, k))
    .sum();
    assert_eq!(total, u(v, "requests"), "outcomes do not add up: {v}");
}

/// Every field README and `sim.rs` promise is in the report, with the right JSON type.
fn sim_report_is_complete(v: &Value) {
    for k in [
        "generation",
        "segments",
        "requests",
        "users",
        "qty",
        "concurrency",
        "applied",
        "sold_units",
        "sold_out",
        "insufficient",
        "in_flight",
        "replayed",
        "errors",
        "remaining",
        "loaded",
        "restocked",
        "sold",
        "oversold",
    ] {
        u(v, k);
    }
    for k in [
        "elapsed_s",
        "throughput_per_s",
        "p50_ms",
        "p99_ms",
        "p999_ms",
        "max_ms",
    ] {
        f(v, k);
    }
    for k in ["sku", "store", "run_id"] {
        s(v, k);
    }
    b(v, "audit_ok");
    assert!(v["remaining_per_segment"].is_array(), "{v}");
    assert!(v["audit_problems"].is_array(), "{v}");
    assert!(
        v.get("first_error")
            .is_some_and(|e| e.is_null() || e.is_string()),
        "first_error missing or mistyped: {v}"
    );
}

/// (1) The README's first command: a sale on the embedded store with default settings.
#[test]
fn sim_on_the_embedded_store_sells_exactly_the_stock() {
    let r = run(&["sim", "--json"]);
    r.expect_code(0);
    let v = r.json();
    sim_report_is_complete(&v);

    assert_eq!(s(&v, "store"), "memory");
    assert_eq!(s(&v, "sku"), "flash-1");
    assert!(u(&v, "generation") > 0);
    assert_eq!(u(&v, "segments"), 10);
    assert_eq!(u(&v, "requests"), 2000);
    assert_eq!(u(&v, "users"), 1000);
    assert_eq!(u(&v, "qty"), 1);
    assert_eq!(u(&v, "concurrency"), 64);

    assert_eq!(u(&v, "applied"), 100);
    assert_eq!(u(&v, "sold_units"), 100);
    assert_eq!(u(&v, "errors"), 0);
    assert_eq!(u(&v, "in_flight"), 0);
    assert_eq!(u(&v, "replayed"), 0);
    assert!(v["first_error"].is_null(), "{v}");
    outcomes_add_up(&v);
    assert_eq!(u(&v, "sold_out") + u(&v, "insufficient"), 1900, "{v}");

    assert_eq!(u(&v, "remaining"), 0);
    assert_eq!(
        v["remaining_per_segment"],
        serde_json::json!(vec![0u64; 10])
    );
    assert_eq!(u(&v, "loaded"), 100);
    assert_eq!(u(&v, "restocked"), 0);
    assert_eq!(u(&v, "sold"), 100);
    assert_eq!(u(&v, "sold_units"), u(&v, "sold"));
    assert_eq!(u(&v, "oversold"), 0);
    assert!(b(&v, "audit_ok"), "{v}");
    assert_eq!(v["audit_problems"], serde_json::json!([]));

    let (p50, p99, p999, max) = (
        f(&v, "p50_ms"),
        f(&v, "p99_ms"),
        f(&v, "p999_ms"),
        f(&v, "max_ms"),
    );
    assert!(p50 > 0.0, "{v}");
    assert!(p50 <= p99 && p99 <= p999 && p999 <= max, "{v}");
    assert!(f(&v, "elapsed_s") > 0.0, "{v}");
    assert!(f(&v, "throughput_per_s") > 0.0, "{v}");
}

/// (2) The README's Redis sale (scaled down): 20 000 buyers for 5 000 units over 16 segments.
#[test]
fn sim_on_redis_sells_exactly_the_stock() {
    let srv = RedisServer::start();
    let url = srv.url();
    let r = run(&[
        "sim",
        "--redis",
        &url,
        "--stock",
        "5000",
        "--segments",
        "16",
        "--users",
        "20000",
        "--requests",
        "20000",
        "--concurrency",
        "64",
        "--json",
    ]);
    r.expect_code(0);
    let v = r.json();
    sim_report_is_complete(&v);

    assert_eq!(s(&v, "store"), "redis");
    assert_eq!(u(&v, "segments"), 16);
    assert_eq!(u(&v, "requests"), 20000);
    assert_eq!(u(&v, "applied"), 5000);
    assert_eq!(u(&v, "sold_units"), 5000);
    assert_eq!(u(&v, "errors"), 0, "{v}");
    outcomes_add_up(&v);
    assert_eq!(u(&v, "remaining"), 0);
    assert_eq!(
        v["remaining_per_segment"],
        serde_json::json!(vec![0u64; 16])
    );
    assert_eq!(u(&v, "loaded"), 5000);
    assert_eq!(u(&v, "sold"), 5000);
    assert_eq!(u(&v, "oversold"), 0);
    assert!(b(&v, "audit_ok"), "{v}");
    assert!(f(&v, "p50_ms") <= f(&v, "p99_ms"), "{v}");

    // The books in Redis agree with the report, seen by another process.
    let a = audit(&srv, "flash-1", 0);
    assert_eq!(u(&a, "loaded"), 5000);
    assert_eq!(u(&a, "sold"), 5000);
    assert_eq!(u(&a, "remaining"), 0);
    assert!(b(&a, "ok"), "{a}");
}

/// (3) Three processes sell one loaded SKU at the same time: together exactly its stock.
#[test]
fn three_concurrent_processes_sell_exactly_the_stock() {
    let srv = RedisServer::start();
    let url = srv.url();
    let generation = load(&srv, "multi", 3000, 16);

    let args = [
        "sim",
        "--redis",
        &url,
        "--sku",
        "multi",
        "--skip-load",
        "--requests",
        "4000",
        "--users",
        "4000",
        "--concurrency",
        "32",
        "--json",
    ];
    let children: Vec<_> = (0..3).map(|_| spawn(&args)).collect();
    let runs: Vec<Run> = children.into_iter().map(finish).collect();

    let mut sold_units = 0;
    let mut applied = 0;
    let mut run_ids = Vec::new();
    for r in &runs {
        r.expect_code(0);
        let v = r.json();
        sim_report_is_complete(&v);
        assert_eq!(s(&v, "store"), "redis");
        assert_eq!(s(&v, "sku"), "multi");
        assert_eq!(
            u(&v, "generation"),
            generation,
            "--skip-load must not reload: {v}"
        );
        assert_eq!(u(&v, "segments"), 16);
        assert_eq!(u(&v, "loaded"), 3000);
        assert_eq!(u(&v, "oversold"), 0, "{v}");
        assert_eq!(u(&v, "errors"), 0, "{v}");
        assert!(b(&v, "audit_ok"), "{v}");
        outcomes_add_up(&v);
        sold_units += u(&v, "sold_units");
        applied += u(&v, "applied");
        run_ids.push(s(&v, "run_id").to_string());
    }
    run_ids.sort();
    run_ids.dedup();
    assert_eq!(run_ids.len(), 3, "each process needs its own request ids");
    assert_eq!(sold_units, 3000, "the three processes together: {runs:#?}");
    assert_eq!(applied, 3000);

    let a = audit(&srv, "multi", 0);
    assert_eq!(u(&a, "generation"), generation);
    assert_eq!(u(&a, "loaded"), 3000);
    assert_eq!(u(&a, "restocked"), 0);
    assert_eq!(u(&a, "sold"), 3000);
    assert_eq!(u(&a, "remaining"), 0);
    assert_eq!(u(&a, "reserved"), 0);
    assert!(b(&a, "ok"), "{a}");
    assert_eq!(a["problems"], serde_json::json!([]));
    assert_eq!(a["segments"].as_array().map(Vec::len), Some(16));
}

/// (4) `load` refuses an existing SKU without `--replace` (and changes nothing); with it, the
/// SKU starts a new generation with fresh counters.
#[test]
fn load_refuses_an_existing_sku_unless_replace() {
    let srv = RedisServer::start();
    let url = srv.url();
    let first = load(&srv, "dup", 100, 4);
    // Sell a little so that "fresh counters" after the replace is visible.
    let r = run(&[
        "sim",
        "--redis",
        &url,
        "--sku",
        "dup",
        "--skip-load",
        "--requests",
        "10",
        "--users",
        "10",
        "--concurrency",
        "4",
        "--json",
    ]);
    r.expect_code(0);
    assert_eq!(u(&r.json(), "sold_units"), 10);

    let before = audit(&srv, "dup", 0);
    assert_eq!(u(&before, "sold"), 10);
    assert_eq!(u(&before, "remaining"), 90);
    let keys_before = dbsize(&srv);

    let r = run(&[
        "load",
        "--redis",
        &url,
        "--sku",
        "dup",
        "--stock",
        "50",
        "--segments",
        "2",
        "--json",
    ]);
    r.expect_failure();
    assert_eq!(r.code(), Some(1), "{r:#?}");
    assert!(r.stderr.contains("--replace"), "stderr: {}", r.stderr);
    assert!(
        r.stdout.trim().is_empty(),
        "nothing on stdout: {}",
        r.stdout
    );
    assert_eq!(
        audit(&srv, "dup", 0),
        before,
        "a refused load changed the books"
    );
    assert_eq!(dbsize(&srv), keys_before);

    let r = run(&[
        "load",
        "--redis",
        &url,
        "--sku",
        "dup",
        "--stock",
        "50",
        "--segments",
        "2",
        "--replace",
        "--json",
    ]);
    r.expect_code(0);
    let v = r.json();
    let second = u(&v, "generation");
    assert!(
        second > first,
        "a replace starts a newer generation: {first} then {second}"
    );
    assert_eq!(u(&v, "stock"), 50);
    assert_eq!(u(&v, "segments"), 2);

    let after = audit(&srv, "dup", 0);
    assert_eq!(u(&after, "generation"), second);
    assert_eq!(u(&after, "loaded"), 50);
    assert_eq!(u(&after, "restocked"), 0);
    assert_eq!(u(&after, "remaining"), 50);
    assert_eq!(u(&after, "sold"), 0);
    assert!(b(&after, "ok"), "{after}");
    let segs = after["segments"].as_array().expect("segments array");
    assert_eq!(segs.len(), 2, "{after}");
    for seg in segs {
        assert_eq!(u(seg, "loaded"), 25);
        assert_eq!(u(seg, "stock"), 25);
        assert_eq!(u(seg, "sold"), 0);
        assert!(b(seg, "ok"));
    }
    // Segments 2 and 3 of generation 1 are gone.
    assert_eq!(
        srv.cli(&["EXISTS", "ss:{dup#2}:seg", "ss:{dup#3}:seg"]),
        "0"
    );
}

/// (5) Invalid input fails with the field named on stderr and writes nothing to Redis.
#[test]
fn bad_input_names_the_field_and_changes_nothing() {
    let srv = RedisServer::start();
    let url = srv.url();
    load(&srv, "valid", 20, 4);
    let keys_before = dbsize(&srv);
    let audit_before = audit(&srv, "valid", 0);
    assert!(keys_before >= 5, "meta + 4 segments, got {keys_before}");

    let cases: &[(&[&str], &str)] = &[
        (
            &["load", "--sku", "a{b}", "--stock", "10", "--segments", "2"],
            "sku",
        ),
        (
            &["load", "--sku", "a#1", "--stock", "10", "--segments", "2"],
            "sku",
        ),
        (
            &["load", "--sku", "fresh", "--stock", "10", "--segments", "0"],
            "segments",
        ),
        (
            &[
                "load",
                "--sku",
                "fresh",
                "--stock",
                "1000000000000",
                "--segments",
                "2",
            ],
            "stock",
        ),
        (
            &["sim", "--sku", "valid", "--skip-load", "--qty", "0"],
            "--qty",
        ),
        (&["sim", "--sku", "fresh", "--qty", "0"], "--qty"),
        (&["sim", "--sku", "fresh", "--qty", "10001"], "qty"),
        (&["sim", "--sku", "a{b}"], "sku"),
        (&["restock", "--sku", "valid", "--qty", "0"], "qty"),
        (
            &[
                "restock",
                "--sku",
                "valid",
                "--qty",
                "5",
                "--request-id",
                "bad id",
            ],
            "request_id",
        ),
        (&["audit", "--sku", "a}b"], "sku"),
    ];
    for (args, field) in cases {
        let mut full = vec!["--redis", url.as_str()];
        full.extend_from_slice(args);
        let r = run(&full);
        r.expect_failure();
        assert!(
            r.stderr.contains(field),
            "`{}`: stderr should name {field:?}: {}",
            r.what,
            r.stderr
        );
        assert_eq!(dbsize(&srv), keys_before, "`{}` wrote to Redis", r.what);
    }
    assert_eq!(srv.cli(&["EXISTS", "ss:{fresh}:meta"]), "0");
    assert_eq!(audit(&srv, "valid", 0), audit_before);
}

/// (6) Broken books: `audit` exits 2 and says what is wrong; a sale on them exits 3.
#[test]
fn tampered_books_fail_audit_and_sim() {
    let srv = RedisServer::start();
    let url = srv.url();
    load(&srv, "tamper", 100, 4);
    assert!(b(&audit(&srv, "tamper", 0), "ok"));

    // Someone writes behind the engine's back: 5 units "sold" out of thin air at segment 0.
    assert_eq!(
        srv.cli(&["HINCRBY", "ss:{tamper#0}:seg", "sold", "5"]),
        "5",
        "the key layout changed: segment 0 of SKU tamper is not ss:{{tamper#0}}:seg"
    );

    let a = audit(&srv, "tamper", 2);
    assert!(!b(&a, "ok"), "{a}");
    assert_eq!(u(&a, "loaded"), 100);
    assert_eq!(u(&a, "remaining"), 100);
    assert_eq!(u(&a, "sold"), 5);
    let problems = a["problems"].as_array().expect("problems array");
    assert!(
        problems
            .iter()
            .any(|p| p.as_str().is_some_and(|p| p.contains("segment 0"))),
        "{a}"
    );
    let segs = a["segments"].as_array().expect("segments array");
    let oks: Vec<bool> = segs.iter().map(|seg| b(seg, "ok")).collect();
    assert_eq!(oks, [false, true, true, true], "{a}");

    // Human output: same exit code, and it says so.
    let r = run(&["audit", "--redis", &url, "--sku", "tamper"]);
    r.expect_code(2);
    assert!(r.stdout.contains("audit: FAILED"), "{}", r.stdout);

    // The sale sells the real 100 units; the books then show 105 sold of 100.
    let r = run(&[
        "sim",
        "--redis",
        &url,
        "--sku",
        "tamper",
        "--skip-load",
        "--requests",
        "300",
        "--users",
        "300",
        "--concurrency",
        "16",
        "--json",
    ]);
    r.expect_code(3);
    let v = r.json();
    sim_report_is_complete(&v);
    assert_eq!(u(&v, "sold_units"), 100, "{v}");
    assert_eq!(u(&v, "remaining"), 0);
    assert_eq!(u(&v, "loaded"), 100);
    assert_eq!(u(&v, "sold"), 105);
    assert_eq!(u(&v, "oversold"), 5, "{v}");
    assert!(!b(&v, "audit_ok"), "{v}");
    assert!(
        !v["audit_problems"].as_array().expect("array").is_empty(),
        "{v}"
    );
}

/// (7) `restock` is idempotent per request id: the second call adds nothing.
#[test]
fn restock_with_the_same_request_id_adds_once() {
    let srv = RedisServer::start();
    let url = srv.url();
    load(&srv, "rs", 100, 4);
    let restock = |qty: &str| {
        run(&[
            "restock",
            "--redis",
            &url,
            "--sku",
            "rs",
            "--qty",
            qty,
            "--request-id",
            "R-1",
            "--json",
        ])
    };

    let r = restock("40");
    r.expect_code(0);
    let v = r.json();
    assert_eq!(s(&v, "request_id"), "R-1");
    assert_eq!(u(&v, "qty"), 40);
    assert_eq!(u(&v, "added"), 40);
    assert!(!b(&v, "replayed"), "{v}");

    let r = restock("40");
    r.expect_code(0);
    let v = r.json();
    assert_eq!(u(&v, "added"), 0, "a replay added units: {v}");
    assert!(b(&v, "replayed"), "{v}");

    // The same id with another quantity is a conflict, not a second restock.
    let r = restock("41");
    r.expect_code(1);
    assert!(r.stderr.contains("R-1"), "stderr: {}", r.stderr);
    assert!(r.stderr.contains("qty"), "stderr: {}", r.stderr);

    let a = audit(&srv, "rs", 0);
    assert_eq!(u(&a, "loaded"), 100);
    assert_eq!(u(&a, "restocked"), 40);
    assert_eq!(u(&a, "remaining"), 140);
    assert_eq!(u(&a, "sold"), 0);
    assert!(b(&a, "ok"), "{a}");
    let per_segment: Vec<u64> = a["segments"]
        .as_array()
        .expect("segments array")
        .iter()
        .map(|seg| u(seg, "restocked"))
        .collect();
    assert_eq!(per_segment, [10, 10, 10, 10], "{a}");
}

/// Unknown SKUs and `--skip-load` on the embedded store fail with a hint, exit code 1.
#[test]
fn missing_skus_are_reported_with_a_hint() {
    let srv = RedisServer::start();
    let url = srv.url();

    let r = run(&["audit", "--redis", &url, "--sku", "nothing", "--json"]);
    r.expect_code(1);
    assert!(r.stderr.contains("not loaded"), "stderr: {}", r.stderr);
    assert!(r.stdout.trim().is_empty(), "stdout: {}", r.stdout);

    let r = run(&["sim", "--sku", "nothing", "--skip-load", "--json"]);
    r.expect_code(1);
    assert!(r.stderr.contains("--redis"), "stderr: {}", r.stderr);
    assert_eq!(dbsize(&srv), 0);
}

/// Three processes running `sim --strategy S --skip-load` on one SKU; returns the reports and
/// the audit.
fn three_processes(
    srv: &RedisServer,
    sku: &str,
    extra: &[&str],
    requests: &str,
) -> (Vec<Value>, Value) {
    let url = srv.url();
    let mut args = vec![
        "sim",
        "--redis",
        &url,
        "--sku",
        sku,
        "--skip-load",
        "--requests",
        requests,
        "--users",
        requests,
        "--concurrency",
        "32",
        "--json",
    ];
    args.extend_from_slice(extra);
    let children: Vec<_> = (0..3).map(|_| spawn(&args)).collect();
    let runs: Vec<Run> = children.into_iter().map(finish).collect();
    let reports = runs
        .iter()
        .map(|r| {
            assert!(matches!(r.status.code(), Some(0 | 3)), "{r:?}");
            r.json()
        })
        .collect();
    let a = run(&["audit", "--redis", &url, "--sku", sku, "--json"]).json();
    (reports, a)
}

/// `lock` across three processes, 1 and 16 segments: exactly the stock, no oversell.
#[test]
fn lock_strategy_across_three_processes_sells_exactly_the_stock() {
    let srv = RedisServer::start();
    for segments in [1u32, 16] {
        let sku = format!("lock3-{segments}");
        let url = srv.url();
        let segs = segments.to_string();
        run(&[
            "load",
            "--redis",
            &url,
            "--sku",
            &sku,
            "--stock",
            "600",
            "--segments",
            &segs,
            "--per-user-limit",
            "0",
        ])
        .expect_code(0);
        let (reports, a) = three_processes(&srv, &sku, &["--strategy", "lock"], "400");
        let sold: u64 = reports.iter().map(|v| u(v, "sold_units")).sum();
        for v in &reports {
            assert_eq!(s(v, "strategy"), "lock");
            assert_eq!(u(v, "oversold"), 0, "{v}");
            assert!(v["lock"]["acquired"].as_u64().unwrap() > 0, "{v}");
        }
        assert_eq!(sold, 600, "{segments} segments: {reports:#?}");
        assert!(
            b(&a, "ok") && u(&a, "sold") == 600 && u(&a, "remaining") == 0,
            "{a}"
        );
    }
}

/// `local-mutex` across three processes oversells, as the articles' three-instance
/// experiment found; the audit catches it.
#[test]
fn local_mutex_across_three_processes_oversells() {
    let srv = RedisServer::start();
    let url = srv.url();
    run(&[
        "load",
        "--redis",
        &url,
        "--sku",
        "lm3",
        "--stock",
        "100",
        "--segments",
        "1",
        "--per-user-limit",
        "0",
    ])
    .expect_code(0);
    let (reports, a) = three_processes(
        &srv,
        "lm3",
        &["--strategy", "local-mutex", "--critical-pause-ms", "1"],
        "100",
    );
    let sold: u64 = reports.iter().map(|v| u(v, "sold_units")).sum();
    assert!(reports.iter().all(|v| !b(v, "strategy_safe")));
    assert!(
        sold > 100,
        "three local-mutex processes sold {sold}: expected an oversell"
    );
    assert!(!b(&a, "ok") && u(&a, "sold") > 100, "{a}");
}

/// `naive` in one process oversells and `sim` says so (exit 3, oversold > 0).
#[test]
fn naive_sim_reports_its_oversell() {
    let srv = RedisServer::start();
    let url = srv.url();
    let r = run(&[
        "sim",
        "--redis",
        &url,
        "--strategy",
        "naive",
        "--critical-pause-ms",
        "1",
        "--stock",
        "100",
        "--segments",
        "1",
        "--requests",
        "400",
        "--users",
        "400",
        "--json",
    ]);
    r.expect_code(3);
    let v = r.json();
    assert_eq!(s(&v, "strategy"), "naive");
    assert!(u(&v, "oversold") > 0 && !b(&v, "audit_ok"), "{v}");
    // The embedded store refuses non-atomic strategies instead of pretending.
    let r = run(&["sim", "--strategy", "lock"]);
    assert_eq!(r.status.code(), Some(1));
    assert!(r.stderr.contains("--redis"), "{}", r.stderr);
}

/// Issue 4's command: one unit per user at most, no oversell, audit ok; and across three
/// processes sharing the users, the limit still holds in total.
#[test]
fn per_user_limit_holds_in_one_and_across_three_processes() {
    let srv = RedisServer::start();
    let url = srv.url();
    let r = run(&[
        "sim",
        "--redis",
        &url,
        "--per-user-limit",
        "1",
        "--stock",
        "5000",
        "--users",
        "1000",
        "--requests",
        "20000",
        "--json",
    ]);
    r.expect_code(0);
    let v = r.json();
    assert_eq!(u(&v, "max_units_per_user"), 1, "{v}");
    assert_eq!(
        u(&v, "sold_units"),
        1000,
        "every user bought exactly once: {v}"
    );
    assert_eq!(u(&v, "oversold"), 0);
    assert!(b(&v, "audit_ok"));
    outcomes_add_up(&v);

    run(&[
        "load",
        "--redis",
        &url,
        "--sku",
        "lim3",
        "--stock",
        "5000",
        "--segments",
        "8",
        "--per-user-limit",
        "1",
    ])
    .expect_code(0);
    let (reports, a) = three_processes(&srv, "lim3", &[], "600");
    let sold: u64 = reports.iter().map(|v| u(v, "sold_units")).sum();
    assert_eq!(
        sold, 600,
        "600 users, one unit each, whichever process served them: {reports:#?}"
    );
    assert!(b(&a, "ok") && u(&a, "sold") == 600, "{a}");
}

/// Reservations in a sale: some confirmed, some cancelled, some left to expire. The run ends
/// with nothing reserved and every unconfirmed unit back in `remaining`.
#[test]
fn sim_with_reservations_returns_every_unconfirmed_unit() {
    let srv = RedisServer::start();
    let url = srv.url();
    let r = run(&[
        "sim",
        "--redis",
        &url,
        "--stock",
        "3000",
        "--segments",
        "8",
        "--users",
        "4000",
        "--requests",
        "4000",
        "--reserve-ratio",
        "0.7",
        "--confirm-ratio",
        "0.4",
        "--ttl-ms",
        "400",
        "--json",
    ]);
    r.expect_code(0);
    let v = r.json();
    assert!(
        u(&v, "reservations_expired_units") > 0 && u(&v, "reservations_cancelled_units") > 0,
        "{v}"
    );
    assert_eq!(u(&v, "reserved"), 0, "{v}");
    assert_eq!(u(&v, "remaining") + u(&v, "sold"), 3000, "{v}");
    assert_eq!(u(&v, "sold"), u(&v, "sold_units"), "{v}");
    assert!(b(&v, "audit_ok") && u(&v, "oversold") == 0, "{v}");
}

/// `redlock` across three processes over three lock nodes: exactly the stock.
#[test]
fn redlock_strategy_across_three_processes_sells_exactly_the_stock() {
    let srv = RedisServer::start();
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    for n in &nodes {
        n.cli(&["SET", shardstock::lock::redlock::QUARANTINE_KEY, "0"]);
    }
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let lock_nodes = urls.join(",");
    let url = srv.url();
    run(&[
        "load",
        "--redis",
        &url,
        "--sku",
        "red3",
        "--stock",
        "300",
        "--segments",
        "16",
        "--per-user-limit",
        "0",
    ])
    .expect_code(0);
    let (reports, a) = three_processes(
        &srv,
        "red3",
        &["--strategy", "redlock", "--lock-nodes", &lock_nodes],
        "200",
    );
    let sold: u64 = reports.iter().map(|v| u(v, "sold_units")).sum();
    for v in &reports {
        assert_eq!(s(v, "strategy"), "redlock");
        assert_eq!(u(v, "oversold"), 0, "{v}");
    }
    assert_eq!(sold, 300, "{reports:#?}");
    assert!(b(&a, "ok") && u(&a, "sold") == 300, "{a}");
}

/// `status` shows remaining per segment, reserved and sold.
#[test]
fn status_reports_the_stock() {
    let srv = RedisServer::start();
    let url = srv.url();
    load(&srv, "stat", 10, 4);
    let v = run(&["status", "--redis", &url, "--sku", "stat", "--json"]).json();
    assert_eq!(u(&v, "remaining"), 10);
    assert_eq!(v["remaining_per_segment"], serde_json::json!([3, 3, 2, 2]));
    assert_eq!(
        (u(&v, "reserved"), u(&v, "sold"), u(&v, "loaded")),
        (0, 0, 10)
    );
    let r = run(&["status", "--redis", &url, "--sku", "nope"]);
    assert_eq!(r.status.code(), Some(1));
    assert!(r.stderr.contains("not loaded"), "{}", r.stderr);
}
