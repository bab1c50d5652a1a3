//! The `shardstock` binary as a child process: started with a clean environment, bounded in
//! time, its exit code and output collected.

use serde_json::Value;
use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// A CLI call that has not finished by then is hung: kill it and fail.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// What a finished CLI process left behind.
#[derive(Debug)]
pub struct Run {
    /// The command line, for failure messages.
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The exit code (`None` when killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Panics unless the process exited with `code`.
    pub fn expect_code(&self, code: i32) -> &Self {
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
    pub fn expect_failure(&self) -> &Self {
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
    pub fn json(&self) -> Value {
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

/// The binary, with no `SHARDSTOCK_*` settings or `RUST_LOG` inherited from the environment
/// (a developer's shell must not change what a test sees), but the test process's CA as
/// `store.tls_ca_file` when an argument holds a `rediss://` URL; stdin closed, stdout and
/// stderr piped.
pub fn shardstock(args: &[&str]) -> Command {
    // Set when the suite is built with the binary (feature `cli`); the suites that run it
    // require that feature (Cargo.toml).
    let Some(bin) = option_env!("CARGO_BIN_EXE_shardstock") else {
        panic!("the shardstock binary is built with feature `cli`: cargo test --features cli")
    };
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SHARDSTOCK_") {
            cmd.env_remove(&k);
        }
    }
    // A `rediss://` URL of a test server (`SHARDSTOCK_TEST_TLS=1`): trust the process's CA.
    if args.iter().any(|a| a.contains("rediss://")) {
        cmd.env(
            "SHARDSTOCK_STORE__TLS_CA_FILE",
            &super::tls::process_tls().ca.cert,
        );
    }
    cmd.env_remove("RUST_LOG")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Starts the binary without waiting for it.
pub fn spawn(args: &[&str]) -> (Child, String) {
    let what = format!("shardstock {}", args.join(" "));
    let child = shardstock(args)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
    (child, what)
}

/// Waits for a spawned process (at most [`TIMEOUT`], then kills it and fails) and collects
/// its output (a stream not piped reads as empty).
pub fn finish((mut child, what): (Child, String)) -> Run {
    let drain = |mut r: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            r.read_to_end(&mut buf).unwrap();
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    // A stream the caller redirected elsewhere (not piped) reads as empty.
    let empty = || Box::new(std::io::empty()) as Box<dyn Read + Send>;
    let out = drain(child.stdout.take().map_or_else(empty, |o| Box::new(o) as _));
    let err = drain(child.stderr.take().map_or_else(empty, |e| Box::new(e) as _));
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
pub fn run(args: &[&str]) -> Run {
    finish(spawn(args))
}

/// The arguments of a command line written as in a shell (split at whitespace; no quoting), so
/// a test reads like the README's commands.
pub fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Runs `shardstock <line>` to completion (see [`words`]).
pub fn run_line(line: &str) -> Run {
    run(&words(line))
}
