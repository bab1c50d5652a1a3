//! Real `redis-server` processes on free loopback ports.
//!
//! Each [`RedisServer`] is its own process with its own port and working directory, so tests
//! run in parallel without sharing state. It is killed on drop; when a test panics, its log is
//! printed so a server-side cause is visible.
//!
//! With `SHARDSTOCK_TEST_TLS=1` ([`super::tls_knob`]) every single-node server listens with
//! TLS only (`--port 0 --tls-port P`, the process's certificate, [`super::tls::process_tls`]):
//! its URLs are `rediss://`, and redis-cli ([`RedisServer::cli`], [`redis_cli`]) talks TLS to
//! it. Cluster nodes ([`RedisServer::start_on`]) and [`RedisServer::start_plain`] stay plain.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::ports::free_port;
use super::process::Proc;
use super::tls::process_tls;

/// Why RedLock lock nodes stay plain under `SHARDSTOCK_TEST_TLS=1`.
pub const LOCK_NODE: &str = "a RedLock lock node: the redlock strategy connects to its lock \
    nodes without store.tls_ca_file (src/store/redis/lock/redlock.rs), so it cannot trust the test CA";

/// Why cluster nodes stay plain under `SHARDSTOCK_TEST_TLS=1`.
pub const CLUSTER_NODE: &str = "a cluster node: the harness builds clusters without TLS \
    (--tls-cluster, redis-cli --cluster --tls, rediss cluster URLs: not done)";

fn say_plain(why: &str) {
    if super::tls_knob() {
        eprintln!("NOT TLS under SHARDSTOCK_TEST_TLS=1: a plain redis-server for {why}");
    }
}

/// The ports of this process's TLS servers, so [`redis_cli`] (which knows only a port) adds
/// `--tls --cacert`.
static TLS_PORTS: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

fn is_tls_port(port: u16) -> bool {
    TLS_PORTS
        .lock()
        .unwrap()
        .as_ref()
        .is_some_and(|p| p.contains(&port))
}

/// A redis-server (no persistence, `noeviction`), running or stopped; it keeps its port, so
/// it can be stopped and started again **empty** where clients expect it.
pub struct RedisServer {
    /// `None` while stopped. Declared before `dir`: the process goes before its directory.
    proc: Option<Proc>,
    pub port: u16,
    /// TLS only on `port` (no plain port).
    tls: bool,
    extra: Vec<String>,
    /// `ACL SETUSER` lines run so far ([`RedisServer::acl_url`]), run again after a restart
    /// (users live in memory only).
    acl: std::sync::Mutex<Vec<String>>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server and waits until it answers PING (TLS with `SHARDSTOCK_TEST_TLS=1`).
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Same, with extra `--flag value` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_as(extra, super::tls_knob())
    }

    /// A server without TLS whatever the knob says, for what cannot use one (`why`, printed
    /// under `SHARDSTOCK_TEST_TLS=1` so a TLS run says what it did not cover), e.g.
    /// [`LOCK_NODE`].
    pub fn start_plain(why: &str) -> Self {
        say_plain(why);
        Self::start_as(&[], false)
    }

    /// [`RedisServer::reserved`] without TLS whatever the knob says (see
    /// [`RedisServer::start_plain`]).
    pub fn reserved_plain(why: &str) -> Self {
        say_plain(why);
        Self::reserved_on(free_port(), &[], false)
    }

    /// A server with TLS only whatever the knob says (the process's CA:
    /// [`RedisServer::tls_ca`]).
    pub fn start_tls() -> Self {
        Self::start_as(&[], true)
    }

    fn start_as(extra: &[&str], tls: bool) -> Self {
        for _ in 0..5 {
            let mut server = Self::reserved_on(free_port(), extra, tls);
            if server.launch() {
                return server;
            }
            // Exited (port taken between probe and bind) or never answered: try another port.
        }
        panic!("could not start redis-server");
    }

    /// Starts a server on `port` (chosen by the caller, e.g. a cluster node whose bus port
    /// `port + 10000` must be free too), always plain; `None` when it could not start there.
    pub fn start_on(port: u16, extra: &[&str]) -> Option<Self> {
        say_plain(CLUSTER_NODE);
        let mut server = Self::reserved_on(port, extra, false);
        server.launch().then_some(server)
    }

    /// A port and a directory for a server that is not running yet: nothing listens there
    /// until [`RedisServer::boot`].
    pub fn reserved() -> Self {
        Self::reserved_on(free_port(), &[], super::tls_knob())
    }

    fn reserved_on(port: u16, extra: &[&str], tls: bool) -> Self {
        if tls {
            TLS_PORTS
                .lock()
                .unwrap()
                .get_or_insert_with(HashSet::new)
                .insert(port);
        }
        Self {
            proc: None,
            port,
            tls,
            extra: extra.iter().map(|a| a.to_string()).collect(),
            acl: Default::default(),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// Starts the server on its port, with no data, and waits until it answers PING.
    pub fn boot(&mut self) {
        assert!(self.proc.is_none(), "already running");
        assert!(
            self.launch(),
            "redis-server on :{} did not start",
            self.port
        );
    }

    /// Kills the server; its port and directory stay for a later [`RedisServer::boot`].
    pub fn stop(&mut self) {
        self.proc = None;
    }

    /// Kills the server and starts it again on the same port with no data (no persistence).
    pub fn restart_empty(&mut self) {
        self.stop();
        self.boot();
    }

    /// Spawns the process and waits (at most 10 s) until it answers PING; `false` (and no
    /// process) when it exited first or never answered.
    fn launch(&mut self) -> bool {
        let log = self.log_path();
        let port = self.port.to_string();
        let mut cmd = Command::new("redis-server");
        if self.tls {
            let tls = process_tls();
            cmd.args(["--port", "0", "--tls-port", &port])
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca.cert)
                .args(["--tls-auth-clients", "no", "--tls-replication", "yes"]);
        } else {
            cmd.args(["--port", &port]);
        }
        let child = cmd
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--maxmemory-policy", "noeviction"])
            .args(["--logfile", log.to_str().unwrap()])
            .args(["--dir", self.dir.path().to_str().unwrap()])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)");
        let mut proc = Proc {
            name: format!("redis-server :{}", self.port),
            child,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = proc.child.try_wait() {
                return false;
            }
            if self.ping() {
                self.proc = Some(proc);
                for line in self.acl.lock().unwrap().iter() {
                    assert_eq!(self.acl_setuser(line), "OK", "{line}");
                }
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Whether the process is running (not [`RedisServer::stop`]ped).
    pub fn is_running(&self) -> bool {
        self.proc.is_some()
    }

    /// `redis://127.0.0.1:P`, or `rediss://` with TLS.
    pub fn url(&self) -> String {
        format!("{}127.0.0.1:{}", self.scheme(), self.port)
    }

    fn scheme(&self) -> &'static str {
        if self.tls { "rediss://" } else { "redis://" }
    }

    /// The CA that signed this server's certificate (`store.tls_ca_file`); `None` without TLS.
    pub fn tls_ca(&self) -> Option<&'static Path> {
        self.tls.then(|| process_tls().ca.cert.as_path())
    }

    fn ping(&self) -> bool {
        if self.tls {
            self.cli(&["PING"]) == "PONG"
        } else {
            ping(self.port)
        }
    }

    /// Creates (once) the least-privilege user of `prefix` with the line `scripts/acl.sh`
    /// prints, and returns the URL that logs in as it. The `default` user stays for the test
    /// harness (`cli`); the engine connected by this URL has only the documented rights.
    pub fn acl_url(&self, prefix: &str) -> String {
        let user = format!("ss-{}", prefix.replace(':', "_"));
        let pass = "acl-test-pass";
        if self.cli(&["ACL", "GETUSER", &user]).is_empty() {
            let line = acl_line(prefix, &user, pass, &[]);
            assert_eq!(self.acl_setuser(&line), "OK", "{line}");
            self.acl.lock().unwrap().push(line);
        }
        format!("{}{user}:{pass}@127.0.0.1:{}", self.scheme(), self.port)
    }

    /// Runs an `ACL SETUSER ...` line (as redis-cli reads it from stdin) as `default`.
    pub fn acl_setuser(&self, line: &str) -> String {
        redis_cli_stdin(self.port, &[], line)
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Runs redis-cli against this server and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }

    /// The records kept without a per-user limit for `user` in the generation whose keys start
    /// with `gbase` (`<prefix>:{<tag>}:g<gen>`): (request id, record in full, key) from the
    /// record hash and every sales window.
    pub fn unlimited_records(&self, gbase: &str, user: &str) -> Vec<(String, String, String)> {
        let mut keys: Vec<String> = self
            .cli(&["KEYS", &format!("{gbase}:w*")])
            .lines()
            .filter(|k| !k.is_empty())
            .map(String::from)
            .collect();
        keys.push(format!("{gbase}:rec"));
        let mut out = Vec::new();
        for key in keys {
            let all = self.cli(&["HGETALL", &key]);
            let lines: Vec<&str> = all.lines().collect();
            for kv in lines.chunks(2) {
                if let [f, v] = kv
                    && let Some(rid) = f.strip_prefix(&format!("{user} "))
                {
                    let rec = super::history::workload::full_record(&key, v);
                    out.push((rid.to_string(), rec, key.clone()));
                }
            }
        }
        out
    }

    /// The number of keys (`DBSIZE`).
    pub fn dbsize(&self) -> u64 {
        let out = self.cli(&["DBSIZE"]);
        out.parse()
            .unwrap_or_else(|_| panic!("DBSIZE answered {out:?}"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // The port may serve a plain server later.
        if self.tls
            && let Some(ports) = TLS_PORTS.lock().unwrap().as_mut()
        {
            ports.remove(&self.port);
        }
    }
}

/// redis-cli for the server on `port`: `-p port`, and `--tls --cacert` when it is one of this
/// process's TLS servers.
fn redis_cli_cmd(port: u16) -> Command {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-p", &port.to_string()]);
    if is_tls_port(port) {
        cmd.arg("--tls").arg("--cacert").arg(&process_tls().ca.cert);
    }
    cmd
}

/// Runs redis-cli against the server on `port` and returns its stdout. For threads that
/// cannot borrow the [`RedisServer`].
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = redis_cli_cmd(port).args(args).output().expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs redis-cli (with `args`, e.g. `--user`) on `port` with `line` as its input, as it
/// reads a command with quoting from stdin; its stdout.
pub fn redis_cli_stdin(port: u16, args: &[&str], line: &str) -> String {
    use std::io::Write;
    let mut child = redis_cli_cmd(port)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli");
    writeln!(child.stdin.take().unwrap(), "{line}").unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The line `scripts/acl.sh PREFIX USER PASSWORD [EXTRA...]` prints.
pub fn acl_line(prefix: &str, user: &str, pass: &str, extra: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/acl.sh"))
        .args([prefix, user, pass])
        .args(extra)
        .output()
        .expect("bash scripts/acl.sh");
    assert!(out.status.success(), "scripts/acl.sh: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Whether a server on `port` answers `PING` in plain RESP (a TLS-only one does not).
pub fn ping(port: u16) -> bool {
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
