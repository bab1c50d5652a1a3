//! The `shardstock` binary facing an operator's mistakes: a Redis URL without a Redis scheme
//! (a configuration error, exit 4, saying what to write), a port that answers but is no Redis
//! (exit 3 saying so, in bounded time), and a stdout closed before the output was written
//! (`| head`: exit 141, quietly, no panic; `orders --jsonl` leaves its events pending). Real
//! processes, real redis-server; the ports that are no Redis are a real `shardstock serve`
//! (HTTP) and plain TCP listeners.

use crate::common;

use common::RedisServer;
use common::binary::{Run, finish, run, run_line, shardstock};
use common::json::u;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// The exit code of a closed stdout (failure.rs `STDOUT_CLOSED`).
const STDOUT_CLOSED: i32 = 141;

/// A URL without a scheme, or with one that is not Redis's, is refused before any connection
/// as a configuration error (exit 4) saying what to write, from `--redis`, the config file and
/// the environment alike, though a Redis listens at the address (an `http://` URL used to
/// reach it); nothing is written. A password in such a URL is not shown.
#[test]
fn redis_urls_need_a_redis_scheme() {
    let srv = RedisServer::start_plain("URLs whose scheme is not rediss://");
    let hostport = format!("127.0.0.1:{}", srv.port);
    let cases = [
        (
            hostport.clone(),
            format!("redis URL `{hostport}` has no scheme: write redis://{hostport}"),
        ),
        (
            format!("localhost:{}", srv.port),
            format!("has no scheme: write redis://localhost:{}", srv.port),
        ),
        (
            format!("http://{hostport}"),
            format!(
                "redis URL `http://{hostport}` has scheme `http`, which is not Redis: write redis://{hostport}"
            ),
        ),
        (
            format!("HTTPS://{hostport}/0"),
            format!("has scheme `https`, which is not Redis: write redis://{hostport}/0"),
        ),
        (
            format!("redis:{hostport}"),
            format!("lacks the `//` after its scheme: write redis://{hostport}"),
        ),
        (
            "redis+unix:///tmp/redis.sock".to_string(),
            "Unix sockets are not supported".to_string(),
        ),
        (
            "redis://127.0.0.1:99999".to_string(),
            "redis URL `redis://127.0.0.1:99999`: invalid port".to_string(),
        ),
        (
            format!("u:s3cret@{hostport}"),
            format!("has no scheme: write redis://***@{hostport}"),
        ),
    ];
    let load = |url: &str| {
        run(&[
            "load",
            "--redis",
            url,
            "--sku",
            "s",
            "--stock",
            "5",
            "--segments",
            "1",
        ])
    };
    for (url, says) in &cases {
        let r = load(url);
        r.expect_code(4);
        assert!(r.stderr.contains(says), "{url}: {says:?} in\n{}", r.stderr);
        assert!(!r.stderr.contains("s3cret"), "{}", r.stderr);
        assert!(r.stdout.is_empty(), "{}", r.stdout);
    }
    assert_eq!(srv.dbsize(), 0, "a refused URL wrote to Redis");

    // The same from the configuration file and from the environment.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    std::fs::write(&file, format!("[store]\nredis_url = \"{hostport}\"\n")).unwrap();
    let r = run(&["status", "--config", file.to_str().unwrap(), "--sku", "s"]);
    r.expect_code(4);
    assert!(r.stderr.contains("has no scheme"), "{}", r.stderr);
    let r = finish({
        let mut cmd = shardstock(&["status", "--sku", "s"]);
        cmd.env("SHARDSTOCK_STORE__REDIS_URL", format!("http://{hostport}"));
        (cmd.spawn().unwrap(), "status with an http:// URL".into())
    });
    r.expect_code(4);
    assert!(r.stderr.contains("which is not Redis"), "{}", r.stderr);

    // The redlock nodes too, each named.
    let r = run_line(&format!(
        "sim --redis redis://{hostport} --strategy redlock --lock-nodes \
         redis://{hostport},{hostport},redis://127.0.0.1:1 --requests 1"
    ));
    r.expect_code(4);
    assert!(
        r.stderr.contains(&format!(
            "redlock node: redis URL `{hostport}` has no scheme"
        )),
        "{}",
        r.stderr
    );

    // The address was right all along.
    load(&format!("redis://{hostport}")).expect_code(0);
    assert!(srv.dbsize() > 0);
}

/// What a TCP listener that is no Redis does with a connection.
#[derive(Clone, Copy, Debug)]
enum Manner {
    /// Reads the request, then closes.
    Closes,
    /// Says something of its own first (an SSH banner) and keeps the connection.
    Banner,
    /// Reads and never answers.
    Silent,
}

/// A plain TCP listener on a free loopback port, each connection treated in `manner`; stops
/// accepting on drop (a connection's thread ends when its client goes).
struct NotRedis {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl NotRedis {
    fn start(manner: Manner) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::Acquire) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    match manner {
                        Manner::Closes => {
                            let _ = conn.read(&mut buf);
                        }
                        Manner::Banner => {
                            let _ = conn.write_all(b"SSH-2.0-OpenSSH_9.2\r\n");
                            while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
                        }
                        Manner::Silent => while matches!(conn.read(&mut buf), Ok(n) if n > 0) {},
                    }
                });
            }
        });
        Self { port, stop }
    }
}

impl Drop for NotRedis {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accepting thread, which then sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// `load` against `url`, timed.
fn load_at(url: &str) -> (Run, Duration) {
    let start = Instant::now();
    let r = run(&[
        "load",
        "--redis",
        url,
        "--sku",
        "s",
        "--stock",
        "5",
        "--segments",
        "1",
    ]);
    (r, start.elapsed())
}

/// A port that answers but is no Redis — an HTTP server (`shardstock serve` itself), a
/// listener that closes each connection, one that greets with an SSH banner, one that never
/// answers — is Redis failing (exit 3) with a message saying the port does not speak Redis
/// (or does not answer), within a bounded time; nothing hangs.
#[test]
fn a_port_that_is_no_redis_is_named_in_bounded_time() {
    // The bound: fred's handshake timeout (10 s) and the probe's two (2 s each), with room.
    const BOUND: Duration = Duration::from_secs(30);
    let http = common::serve_process::ServeProcess::start("", &[], &[]);
    let closes = NotRedis::start(Manner::Closes);
    let banner = NotRedis::start(Manner::Banner);
    let silent = NotRedis::start(Manner::Silent);
    let cases = [
        (
            format!("redis://{}", http.addr()),
            "does not speak the Redis protocol: it answered \"HTTP/1.1 400",
        ),
        (
            format!("redis://127.0.0.1:{}", closes.port),
            "does not speak the Redis protocol: it closed the connection without answering PING",
        ),
        (
            format!("redis-cluster://127.0.0.1:{}", closes.port),
            "does not speak the Redis protocol: it closed the connection",
        ),
        (
            format!("redis://127.0.0.1:{}", banner.port),
            "does not speak the Redis protocol: it answered \"SSH-2.0-OpenSSH_9.2\" to PING",
        ),
        (
            format!("redis://127.0.0.1:{}", silent.port),
            "does not answer PING (nothing within 2 s): not a Redis server, or a stuck one",
        ),
    ];
    // In parallel: the silent port takes its timeouts.
    let runs: Vec<_> = cases
        .iter()
        .map(|(url, _)| {
            let url = url.clone();
            thread::spawn(move || load_at(&url))
        })
        .collect();
    for ((url, says), r) in cases.iter().zip(runs) {
        let (r, took) = r.join().unwrap();
        r.expect_code(3);
        assert!(
            r.stderr.contains(&format!(
                "error: cannot connect to Redis at {url}: the server at "
            )),
            "{url}: {}",
            r.stderr
        );
        assert!(r.stderr.contains(says), "{url}: {says:?} in\n{}", r.stderr);
        assert!(took < BOUND, "{url}: took {took:?}");
    }
}

/// `cmd` with stdout a pipe whose reading end is already closed: its first write gets EPIPE.
/// Bounded by [`TIMEOUT`] like every CLI call.
fn with_stdout_closed(mut cmd: std::process::Command, what: &str) -> Run {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    cmd.stdout(writer);
    let child = cmd.spawn().unwrap();
    // `cmd` holds a copy of the writing end until dropped: the child's is then the only one.
    drop(cmd);
    wait_bounded(child, what)
}

/// Waits for `child` (at most [`TIMEOUT`], then kills it and fails) and collects its stderr.
fn wait_bounded(child: std::process::Child, what: &str) -> Run {
    finish((child, what.to_string()))
}

/// A closed stdout ends every printing command quietly with exit code 141: no panic (101), no
/// message; what the command did stays done. Once with the pipe closed before the first write
/// (text and `--json`), once with a reader that takes the first line and goes (`| head -1`)
/// while `audit` of a SKU with 1024 segments still has ~70 KB to print (more than a pipe
/// holds).
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let srv = RedisServer::start();
    let url = srv.url();
    let segs = 1024;
    run_line(&format!(
        "load --redis {url} --sku wide --stock 100000 --segments {segs}"
    ))
    .expect_code(0);
    let audit_before = common::cli::audit(&srv, "wide", 0);
    let commands = [
        format!("audit --redis {url} --sku wide"),
        format!("audit --redis {url} --sku wide --json"),
        format!("status --redis {url} --sku wide"),
        format!("status --redis {url} --sku wide --json"),
        format!("restock --redis {url} --sku wide --qty 1024 --request-id rs-closed"),
        format!("load --redis {url} --sku other --stock 10 --segments 2"),
        format!(
            "sim --redis {url} --sku wide --skip-load --requests 50 --users 50 --concurrency 4"
        ),
    ];
    for line in &commands {
        let cmd = shardstock(&common::binary::words(line));
        let r = with_stdout_closed(cmd, line);
        r.expect_code(STDOUT_CLOSED);
        assert!(
            r.stderr.trim().is_empty(),
            "`{line}`: quiet, no panic:\n{}",
            r.stderr
        );
    }
    // What they did is done: the restock (once), the load, the sale.
    let audit = common::cli::audit(&srv, "wide", 0);
    assert_eq!(u(&audit, "restocked"), 1024, "{audit}");
    assert_eq!(u(&audit, "sold"), 50, "{audit}");
    assert_eq!(
        u(&audit, "loaded"),
        u(&audit_before, "loaded"),
        "{audit_before}"
    );
    common::cli::audit(&srv, "other", 0);

    // `| head -1`: the reader goes while the writer is blocked on a full pipe.
    let mut child = shardstock(&common::binary::words(&format!(
        "audit --redis {url} --sku wide"
    )))
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("sku wide"), "{first}");
    let r = wait_bounded(child, "audit | head -1");
    r.expect_code(STDOUT_CLOSED);
    let stderr = r.stderr;
    assert!(stderr.trim().is_empty(), "{stderr}");
}

/// `orders --jsonl` with its stdout closed stops at the first event it cannot write (exit
/// 141) instead of failing delivery after delivery into the dead letters: a later consumer
/// prints every sale once the events are idle, none dead.
#[test]
fn orders_jsonl_stops_on_a_closed_stdout_and_loses_nothing() {
    let srv = RedisServer::start();
    let url = srv.url();
    run_line(&format!(
        "--redis {url} load --sku ob --stock 300 --segments 4 --per-user-limit 0 --outbox"
    ))
    .expect_code(0);
    let sim = run_line(&format!(
        "--redis {url} sim --sku ob --skip-load --requests 200 --users 200 --concurrency 8 --json"
    ));
    sim.expect_code(0);
    let applied = u(&sim.json(), "applied");
    assert!(applied > 0);

    let line = format!("--redis {url} orders --jsonl --until-idle");
    let start = Instant::now();
    let r = with_stdout_closed(shardstock(&common::binary::words(&line)), &line);
    r.expect_code(STDOUT_CLOSED);
    assert!(r.stderr.trim().is_empty(), "{}", r.stderr);
    assert!(start.elapsed() < Duration::from_secs(30));

    // Another consumer claims what the first one held once it is idle (100 ms).
    thread::sleep(Duration::from_millis(200));
    let out = run_line(&format!(
        "--redis {url} orders --jsonl --until-idle --min-idle-ms 100 --consumer second"
    ));
    out.expect_code(0);
    let mut rids: Vec<String> = out
        .stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["request_id"].as_str().unwrap().to_string()
        })
        .collect();
    rids.sort();
    rids.dedup();
    assert_eq!(rids.len() as u64, applied, "{}", out.stderr);
    assert!(out.stderr.contains(", 0 dead letters)"), "{}", out.stderr);
}
