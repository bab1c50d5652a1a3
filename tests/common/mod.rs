//! Test support: real `redis-server` processes on free loopback ports.
//!
//! Each [`RedisServer`] is its own process with its own port and working directory, so tests
//! run in parallel without sharing state. It is killed on drop; when a test panics, its log is
//! printed so a server-side cause is visible.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shardstock::{Engine, EngineBuilder, MemoryStore, RedisStore};

/// A running redis-server.
pub struct RedisServer {
    child: Child,
    pub port: u16,
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl RedisServer {
    /// Starts a server (no persistence, `noeviction`) and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Same, with extra `--flag value` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        for _ in 0..5 {
            let port = free_port();
            let dir = tempfile::tempdir().unwrap();
            let log = dir.path().join("redis.log");
            let mut child = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--maxmemory-policy",
                    "noeviction",
                    "--logfile",
                    log.to_str().unwrap(),
                    "--dir",
                    dir.path().to_str().unwrap(),
                ])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server must be installed (scripts/test.sh installs it)");
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // exited (port taken between probe and bind): try another
                }
                if ping(port) {
                    return Self { child, port, dir };
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start redis-server");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Runs redis-cli against this server and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

fn ping(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking()
            && let Ok(log) = std::fs::read_to_string(self.log_path())
        {
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!("--- redis-server :{} log (last lines) ---", self.port);
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

/// The store settings of the test engines: `server`, 2 clients, keys under `prefix`, no
/// request coalescing.
pub fn redis_config(server: &RedisServer, prefix: &str) -> shardstock::Config {
    let mut config = shardstock::Config::default();
    config.store.redis_url = server.url();
    config.store.pool_size = 2;
    config.store.key_prefix = prefix.into();
    config.store.coalesce = false;
    config
}

/// An engine over a fresh Redis store on `server`.
pub async fn redis_engine(server: &RedisServer, builder: EngineBuilder) -> Engine<RedisStore> {
    let store = redis_config(server, "t").build_store().await.unwrap();
    builder.build(store).unwrap()
}

/// An engine over a fresh Redis store with request coalescing (`opts`) under key prefix
/// `prefix`.
pub async fn coalesced_engine(
    server: &RedisServer,
    builder: EngineBuilder,
    opts: shardstock::Coalescing,
    prefix: &str,
) -> Engine<RedisStore> {
    let store = redis_config(server, prefix)
        .store
        .redis_builder()
        .coalescing(Some(opts))
        .connect()
        .await
        .unwrap();
    builder.build(store).unwrap()
}

/// An engine over a Redis store running `strategy` with `lock` options.
pub async fn strategy_engine(
    server: &RedisServer,
    builder: EngineBuilder,
    strategy: shardstock::Strategy,
    lock: shardstock::lock::LockOptions,
) -> Engine<RedisStore> {
    let store = redis_config(server, "t")
        .store
        .redis_builder()
        .strategy(strategy)
        .lock_options(lock)
        .connect()
        .await
        .unwrap();
    builder.build(store).unwrap()
}

/// Lock options with the given lease and wait.
pub fn lock_opts(lease_ms: u64, wait_ms: u64) -> shardstock::lock::LockOptions {
    let mut o = shardstock::lock::LockOptions::default();
    o.lease = Duration::from_millis(lease_ms);
    o.wait = Duration::from_millis(wait_ms);
    o
}

/// An engine over a fresh memory store.
pub fn memory_engine(builder: EngineBuilder) -> Engine<MemoryStore> {
    builder.build(MemoryStore::new()).unwrap()
}
