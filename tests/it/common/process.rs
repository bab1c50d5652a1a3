//! Child processes owned by a test: killed on drop, their log shown when the test panics.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A child process killed on drop; when the test panics, the tail of its log is printed so a
/// cause on the process's side is visible next to the failed assertion.
pub struct Proc {
    /// Names the process in the printed log header.
    pub name: String,
    pub child: Child,
    /// Where the process writes its log (stderr or a log file).
    pub log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with its stderr written to `log`, named `name` in the printed log.
    pub fn spawn(name: &str, cmd: &mut Command, log: PathBuf) -> Self {
        let stderr = std::fs::File::create(&log)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        let child = cmd
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Self {
            name: name.to_string(),
            child,
            log,
        }
    }

    /// The last `lines` lines of the log, after any panic messages found anywhere in it.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        let mut out = Vec::new();
        for (i, l) in all.iter().enumerate() {
            if l.contains("panicked at") {
                out.extend(all[i..all.len().min(i + 40)].iter().copied());
                out.push("...");
            }
        }
        out.extend(all[all.len().saturating_sub(lines)..].iter().copied());
        out.join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- {} log (last lines) ---\n{}",
                self.name,
                self.log_tail(40)
            );
        }
    }
}

/// Fails the test unless `tool` is installed: the tests that need one are never skipped.
pub fn require(tool: &str) {
    let found = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        found,
        "`{tool}` is not installed; scripts/test.sh installs it (apt-get install prometheus \
         docker-compose). This test is never skipped."
    );
}
