//! The `shardstock` binary facing an operator's mistakes: a Redis URL without a Redis scheme
//! (a configuration error, exit 4, saying what to write) and a port that answers but is no
//! Redis (exit 3 saying so, in bounded time). Real processes, real redis-server; the ports
//! that are no Redis are a real `shardstock serve` (HTTP) and plain TCP listeners.

use crate::common;

use common::RedisServer;
use common::binary::{Run, finish, run, run_line, shardstock};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

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
