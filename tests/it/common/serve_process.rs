//! A `shardstock serve` process on a free loopback port, killed on drop (its log printed when
//! the test panics).

use super::binary::shardstock;
use super::process::Proc;
use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::Duration;

pub struct ServeProcess {
    /// Declared before `_dir`: the process goes before the directory holding its log.
    pub proc: Proc,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    _dir: tempfile::TempDir,
}

impl ServeProcess {
    /// Starts `serve --listen 127.0.0.1:0 --redis URL <extra>` with `env` set and waits for
    /// its address (the first stdout line, `listening on http://ADDR`).
    pub fn start(redis: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--redis", redis];
        args.extend_from_slice(extra);
        let mut cmd = shardstock(&args);
        cmd.envs(env.iter().copied());
        let mut proc = Proc::spawn("shardstock serve", &mut cmd, dir.path().join("serve.log"));
        let stdout = proc.child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(l)) = lines.next() {
                let _ = tx.send(l);
            }
            for _ in lines {}
        });
        // On failure `proc` is dropped while panicking: killed, its log printed.
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("serve did not start"));
        let base = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Self {
            proc,
            base,
            _dir: dir,
        }
    }

    /// `base` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }
}
