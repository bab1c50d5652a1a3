//! Debian's Prometheus on a free loopback port, for tests that evaluate real queries.

use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::http_client::{agent, get};
use super::ports::free_port;
use super::process::{Proc, require};

/// A running Prometheus with its own TSDB in a temporary directory; killed on drop.
pub struct Prometheus {
    _proc: Proc,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus with `config` (a prometheus.yml) and waits until it is ready.
    pub fn start(config: &str) -> Self {
        Self::start_with_files(config, &[])
    }

    /// Same, with `files` (name, text) written next to the config (rule files it names by a
    /// relative path).
    pub fn start_with_files(config: &str, files: &[(&str, &str)]) -> Self {
        require("prometheus");
        let agent = agent();
        for _ in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let cfg = dir.path().join("prometheus.yml");
            std::fs::write(&cfg, config).unwrap();
            for (name, text) in files {
                std::fs::write(dir.path().join(name), text).unwrap();
            }
            let log = dir.path().join("prometheus.log");
            let port = free_port();
            let mut proc = Proc::spawn(
                "prometheus",
                Command::new("prometheus")
                    .arg(format!("--config.file={}", cfg.display()))
                    .arg(format!(
                        "--storage.tsdb.path={}",
                        dir.path().join("tsdb").display()
                    ))
                    .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                    .arg("--log.level=warn")
                    .stdout(Stdio::null()),
                log,
            );
            let base = format!("http://127.0.0.1:{port}");
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = proc.child.try_wait() {
                    break; // port taken between probe and bind: try another
                }
                if let Ok((200, _)) = get(&agent, &format!("{base}/-/ready"), &[]) {
                    return Self {
                        _proc: proc,
                        base,
                        _dir: dir,
                    };
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("prometheus did not start:\n{}", proc.log_tail(20));
        }
        panic!("could not start prometheus");
    }

    /// Instant query; the `result` array.
    pub fn query(&self, agent: &ureq::Agent, expr: &str) -> Result<Vec<Value>, String> {
        let (status, body) = get(
            agent,
            &format!("{}/api/v1/query", self.base),
            &[("query", expr)],
        )?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if status != 200 || v["status"] != "success" {
            return Err(format!("HTTP {status}: {}", v["error"]));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }
}
