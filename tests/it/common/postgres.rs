//! Throwaway PostgreSQL clusters: `initdb` into a temporary directory, one `postgres` process
//! on a free loopback port (trust authentication, `fsync=off`), stopped and removed on drop.
//!
//! PostgreSQL refuses to run as root: as root, the cluster's directory is handed to the
//! `postgres` OS user (Debian's `postgresql` package creates it) and `initdb`/`postgres` run
//! as that user; otherwise they run as the current user. The database superuser is `postgres`
//! either way.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::ports::free_port;
use super::process::Proc;

/// A PostgreSQL cluster, running or stopped; it keeps its port and data across
/// [`PostgresServer::stop`] / [`PostgresServer::boot`].
pub struct PostgresServer {
    /// `None` while stopped. Declared before `dir`: the process goes before its directory.
    proc: Option<Proc>,
    pub port: u16,
    bin: PathBuf,
    /// `(uid, gid)` to run as when we are root.
    user: Option<(u32, u32)>,
    dir: tempfile::TempDir,
}

impl PostgresServer {
    /// A fresh cluster, started; waits until it accepts connections.
    pub fn start() -> Self {
        let bin = bin_dir();
        let user = run_as();
        let dir = tempfile::tempdir().unwrap();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        }
        let data = dir.path().join("data");
        let out = as_user(Command::new(bin.join("initdb")), user)
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"])
            .args(["--no-sync", "--no-instructions"])
            .output()
            .expect("initdb must be installed (scripts/test.sh installs postgresql)");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut server = Self {
            proc: None,
            port: free_port(),
            bin,
            user,
            dir,
        };
        for _ in 0..5 {
            if server.launch() {
                return server;
            }
            // Exited (port taken between probe and bind) or never ready: try another port.
            server.port = free_port();
        }
        panic!("could not start postgres");
    }

    /// Starts the stopped cluster again on its port, with its data, and waits until it
    /// accepts connections.
    pub fn boot(&mut self) {
        assert!(self.proc.is_none(), "already running");
        assert!(self.launch(), "postgres on :{} did not start", self.port);
    }

    /// Stops the cluster at once (`SIGQUIT`: immediate shutdown, clients cut off, crash
    /// recovery on the next start); its port and data stay for [`PostgresServer::boot`].
    pub fn stop(&mut self) {
        if let Some(mut proc) = self.proc.take() {
            signal(&proc, "QUIT");
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = proc.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // Still up: dropping `proc` kills it.
        }
    }

    /// Stops the cluster at once and starts it again (same port, same data).
    pub fn restart(&mut self) {
        self.stop();
        self.boot();
    }

    /// Whether the process is running.
    pub fn is_running(&self) -> bool {
        self.proc.is_some()
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// Runs `psql -At -c sql` against the cluster and returns its stdout (trimmed); panics
    /// when psql fails.
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args([
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
            ])
            .arg(sql)
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Spawns `postgres` and waits (at most 30 s) until `pg_isready` says it accepts
    /// connections; `false` (and no process) when it exited first or never got ready.
    fn launch(&mut self) -> bool {
        let mut cmd = as_user(Command::new(self.bin.join("postgres")), self.user);
        cmd.arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.dir.path().display()
            ))
            // fsync off is safe against a crash of the process (what stop() is): the WAL is
            // written to the OS at each commit, only not flushed to the disk. (Not
            // synchronous_commit=off: an immediate stop would lose acknowledged commits.)
            .args(["-c", "fsync=off"])
            .args(["-c", "full_page_writes=off", "-c", "max_connections=40"])
            .args(["-c", "shared_buffers=32MB"])
            .stdout(Stdio::null());
        let mut proc = Proc::spawn(
            &format!("postgres :{}", self.port),
            &mut cmd,
            self.log_path(),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = proc.child.try_wait() {
                return false;
            }
            if self.is_ready() {
                self.proc = Some(proc);
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        signal(&proc, "QUIT");
        false
    }

    fn is_ready(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-t", "1"])
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sends `SIGsig` to the process (the `kill` command: no libc in the harness).
fn signal(proc: &Proc, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &proc.child.id().to_string()])
        .status();
}

/// `/usr/lib/postgresql/<newest>/bin` (Debian's layout).
fn bin_dir() -> PathBuf {
    let root = Path::new("/usr/lib/postgresql");
    let newest = std::fs::read_dir(root)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            e.path()
                .join("bin/initdb")
                .exists()
                .then_some((v, e.path()))
        })
        .max();
    let (_, dir) = newest.unwrap_or_else(|| {
        panic!(
            "no /usr/lib/postgresql/*/bin/initdb: scripts/test.sh installs postgresql \
             (apt-get install postgresql). This test is never skipped."
        )
    });
    dir.join("bin")
}

/// `Some((uid, gid))` of the `postgres` OS user when we are root (PostgreSQL refuses root);
/// `None` (run as ourselves) otherwise.
fn run_as() -> Option<(u32, u32)> {
    let id = |flag: &str, user: Option<&str>| -> u32 {
        let out = Command::new("id")
            .arg(flag)
            .args(user)
            .output()
            .expect("id");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("id {flag} {user:?}: {out:?}"))
    };
    if id("-u", None) != 0 {
        return None;
    }
    Some((id("-u", Some("postgres")), id("-g", Some("postgres"))))
}

fn as_user(mut cmd: Command, user: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = user {
        // std drops the supplementary groups when root sets a uid.
        cmd.uid(uid).gid(gid);
        cmd.env("HOME", "/tmp");
    }
    cmd.env_remove("PGDATA").env_remove("PGPORT");
    cmd
}
