//! The `shardstock` binary end to end, the subcommands around a sale: `load` (and
//! `--replace`), `restock`, `audit`, `status`, invalid input and missing SKUs. Real processes
//! (`CARGO_BIN_EXE_shardstock`), their `--json` output and exit codes; one redis-server per
//! test, so the tests run in parallel.

use crate::common;

use common::RedisServer;
use common::binary::{finish, run, run_line, shardstock};
use common::cli::{audit, load, sim_report_is_complete};
use common::json::{b, s, u};

/// (4) `load` refuses an existing SKU without `--replace` (and changes nothing); with it, the
/// SKU starts a new generation with fresh counters.
#[test]
fn load_refuses_an_existing_sku_unless_replace() {
    let srv = RedisServer::start();
    let url = srv.url();
    let first = load(&srv, "dup", 100, 4);
    // Sell a little so that "fresh counters" after the replace is visible.
    let r = run_line(&format!(
        "sim --redis {url} --sku dup --skip-load --requests 10 --users 10 --concurrency 4 --json"
    ));
    r.expect_code(0);
    assert_eq!(u(&r.json(), "sold_units"), 10);

    let before = audit(&srv, "dup", 0);
    assert_eq!(u(&before, "sold"), 10);
    assert_eq!(u(&before, "remaining"), 90);
    let keys_before = srv.dbsize();

    let r = run_line(&format!(
        "load --redis {url} --sku dup --stock 50 --segments 2 --json"
    ));
    r.expect_code(5);
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
    assert_eq!(srv.dbsize(), keys_before);

    let r = run_line(&format!(
        "load --redis {url} --sku dup --stock 50 --segments 2 --replace --json"
    ));
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
    let keys_before = srv.dbsize();
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
        assert_eq!(srv.dbsize(), keys_before, "`{}` wrote to Redis", r.what);
    }
    assert_eq!(srv.cli(&["EXISTS", "ss:{fresh}:meta"]), "0");
    assert_eq!(audit(&srv, "valid", 0), audit_before);
}

/// (6) Broken books: `audit` exits 1 (a check failed) and says what is wrong; a sale on them
/// exits 1 too.
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

    let a = audit(&srv, "tamper", 1);
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
    r.expect_code(1);
    assert!(r.stdout.contains("audit: FAILED"), "{}", r.stdout);

    // The sale sells the real 100 units; the books then show 105 sold of 100.
    let r = run_line(&format!(
        "sim --redis {url} --sku tamper --skip-load --requests 300 --users 300 --concurrency 16 \
         --json"
    ));
    r.expect_code(1);
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
        run_line(&format!(
            "restock --redis {url} --sku rs --qty {qty} --request-id R-1 --json"
        ))
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
    r.expect_code(5);
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

/// Unknown SKUs and `--skip-load` on the embedded store fail with a hint, exit code 5.
#[test]
fn missing_skus_are_reported_with_a_hint() {
    let srv = RedisServer::start();
    let url = srv.url();

    let r = run(&["audit", "--redis", &url, "--sku", "nothing", "--json"]);
    r.expect_code(5);
    assert!(r.stderr.contains("not loaded"), "stderr: {}", r.stderr);
    assert!(r.stdout.trim().is_empty(), "stdout: {}", r.stdout);

    let r = run(&["sim", "--sku", "nothing", "--skip-load", "--json"]);
    r.expect_code(5);
    assert!(r.stderr.contains("--redis"), "stderr: {}", r.stderr);
    assert_eq!(srv.dbsize(), 0);
}

/// `status` shows remaining per segment, units in transit, reserved and sold.
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
    assert_eq!(u(&v, "in_transit"), 0, "{v}");
    let r = run(&["status", "--redis", &url, "--sku", "nope"]);
    r.expect_code(5);
    assert!(r.stderr.contains("not loaded"), "{}", r.stderr);
}

/// The exit codes `--help` documents: 2 for a command line clap refuses, 3 when Redis cannot
/// be reached (said in words, not as an OS error's debug form), 4 for a configuration error
/// (an unknown key names the closest known one, from a file or from the environment), 5 for a
/// refused command (above); 1 for a failed check is `tampered_books_fail_audit_and_sim`'s.
#[test]
fn exit_codes_say_what_failed() {
    let r = run(&["status", "--sku", "x", "--bogus"]);
    r.expect_code(2);
    assert!(r.stderr.contains("--bogus"), "{}", r.stderr);
    let help = run(&["--help"]);
    help.expect_code(0);
    for line in [
        "Exit codes:",
        "1  a check failed",
        "3  Redis",
        "4  configuration",
        "141  stdout was closed",
    ] {
        assert!(
            help.stdout.contains(line),
            "{line:?} in --help:\n{}",
            help.stdout
        );
    }

    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let r = run(&["audit", "--redis", &url, "--sku", "x"]);
    r.expect_code(3);
    assert!(
        r.stderr.contains(&format!(
            "cannot connect to Redis at {url}: connection refused"
        )),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("Os {"), "{}", r.stderr);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("typo.toml");
    std::fs::write(&file, "[store]\npool_sise = 8\n").unwrap();
    let r = run(&["status", "--config", file.to_str().unwrap(), "--sku", "x"]);
    r.expect_code(4);
    assert!(r.stderr.contains("`store.pool_sise`"), "{}", r.stderr);
    assert!(
        r.stderr.contains("did you mean `pool_size`?"),
        "{}",
        r.stderr
    );

    let r = common::binary::finish({
        let mut cmd = common::binary::shardstock(&["status", "--sku", "x"]);
        cmd.env("SHARDSTOCK_ENGINE__MAX_QTTY", "3");
        (
            cmd.spawn().unwrap(),
            "status with SHARDSTOCK_ENGINE__MAX_QTTY".into(),
        )
    });
    r.expect_code(4);
    assert!(
        r.stderr
            .contains("did you mean `max_qty` (SHARDSTOCK_ENGINE__MAX_QTY)?"),
        "{}",
        r.stderr
    );
}

/// The read-only commands show only the flags they use; the store tuning flags belong to the
/// commands that sell.
#[test]
fn read_only_commands_show_only_their_flags() {
    let tuning = [
        "--strategy",
        "--lock-nodes",
        "--lease-ms",
        "--coalesce",
        "--critical-pause-ms",
        "--metrics-addr",
    ];
    for command in ["status", "audit", "load", "restock"] {
        let r = run(&[command, "--help"]);
        r.expect_code(0);
        for flag in tuning {
            assert!(
                !r.stdout.contains(flag),
                "`{command} --help` lists {flag}:\n{}",
                r.stdout
            );
        }
        for flag in ["--sku", "--redis", "--config", "--json"] {
            assert!(r.stdout.contains(flag), "`{command} --help`:\n{}", r.stdout);
        }
    }
    for command in ["sim", "serve"] {
        let r = run(&[command, "--help"]);
        r.expect_code(0);
        for flag in tuning {
            assert!(r.stdout.contains(flag), "`{command} --help` lacks {flag}");
        }
    }
    // A tuning flag where it does nothing is a usage error, not silently ignored.
    run(&["status", "--sku", "x", "--strategy", "lock"]).expect_code(2);
}

/// `cmd` started, its first stdout line (`serve`'s `listening on http://ADDR`) and the
/// process, killed on drop.
fn first_line(
    mut cmd: std::process::Command,
) -> (String, common::process::Proc, tempfile::TempDir) {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut proc = common::process::Proc::spawn("shardstock", &mut cmd, dir.path().join("log"));
    let stdout = proc.child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        if let Some(Ok(l)) = lines.next() {
            let _ = tx.send(l);
        }
        for _ in lines {}
    });
    let line = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("no first line");
    (line, proc, dir)
}

/// Every variable is `SHARDSTOCK_<SECTION>__<KEY>`: `serve.listen` and `metrics.addr` too.
/// The names of earlier releases (`SHARDSTOCK_LISTEN`, `SHARDSTOCK_METRICS_ADDR`) still work,
/// with a warning naming the new one.
#[test]
fn listen_and_metrics_addresses_follow_the_variable_pattern() {
    for var in ["SHARDSTOCK_SERVE__LISTEN", "SHARDSTOCK_LISTEN"] {
        let mut cmd = common::binary::shardstock(&["serve"]);
        cmd.env(var, "127.0.0.1:0");
        let (line, proc, _dir) = first_line(cmd);
        assert!(
            line.starts_with("listening on http://127.0.0.1:") && !line.ends_with(":8080"),
            "{var}: {line}"
        );
        let deprecated = var == "SHARDSTOCK_LISTEN";
        // The warning is written before the listener binds.
        let log = std::fs::read_to_string(&proc.log).unwrap();
        assert_eq!(
            log.contains("SHARDSTOCK_LISTEN is deprecated: set SHARDSTOCK_SERVE__LISTEN"),
            deprecated,
            "{var}: {log}"
        );
    }

    // An address already taken proves the variable was read: the metrics listener cannot bind.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    for var in ["SHARDSTOCK_METRICS__ADDR", "SHARDSTOCK_METRICS_ADDR"] {
        let r = common::binary::finish({
            let mut cmd = common::binary::shardstock(&["sim", "--requests", "10"]);
            cmd.env(var, &addr);
            (cmd.spawn().unwrap(), format!("sim with {var}"))
        });
        r.expect_code(5);
        assert!(
            r.stderr
                .contains(&format!("cannot serve metrics on {addr}")),
            "{var}: {}",
            r.stderr
        );
        assert_eq!(
            r.stderr.contains("SHARDSTOCK_METRICS_ADDR is deprecated"),
            var == "SHARDSTOCK_METRICS_ADDR",
            "{}",
            r.stderr
        );
    }
    let r = common::binary::finish({
        let mut cmd = common::binary::shardstock(&["sim", "--requests", "10"]);
        cmd.env("SHARDSTOCK_METRICS__ADDR", "nowhere");
        (cmd.spawn().unwrap(), "sim with a bad address".into())
    });
    r.expect_code(4);
    assert!(r.stderr.contains("addr"), "{}", r.stderr);
}

/// Durability mode on a Redis that does not refuse writes without replicas
/// (`min-replicas-to-write` 0): every command warns at start, naming the setting; once it is
/// set, no warning.
#[test]
fn durability_mode_without_min_replicas_to_write_warns() {
    let srv = RedisServer::start();
    let url = srv.url();
    let status = || {
        let mut cmd = shardstock(&["status", "--redis", &url, "--sku", "none"]);
        cmd.env("SHARDSTOCK_STORE__WAIT_REPLICAS", "1")
            .env("SHARDSTOCK_STORE__WAIT_TIMEOUT_MS", "50");
        finish((cmd.spawn().unwrap(), "status, durability mode".into()))
    };
    let r = status();
    assert!(
        r.stderr.contains("min-replicas-to-write 0") && r.stderr.contains("WARN"),
        "{r:?}"
    );
    srv.cli(&["CONFIG", "SET", "min-replicas-to-write", "1"]);
    let r = status();
    assert!(!r.stderr.contains("min-replicas-to-write"), "{r:?}");
}
