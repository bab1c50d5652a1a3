//! TLS material made by `openssl` (a CA, a server certificate for `127.0.0.1`/`localhost`
//! signed by it) and a `redis-server` that listens with TLS only.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::ports::free_port;
use super::process::Proc;

/// A self-made CA (`ca.crt`, `ca.key`) in `dir`, optionally with a server certificate.
pub struct Ca {
    pub cert: PathBuf,
    key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl must be installed");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

impl Ca {
    /// A new CA named `name` (files `name.crt`, `name.key` in `dir`).
    pub fn new(dir: &Path, name: &str) -> Self {
        let (crt, key) = (format!("{name}.crt"), format!("{name}.key"));
        let subj = format!("/CN={name}");
        openssl(
            dir,
            &[
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", &key,
                "-out", &crt, "-subj", &subj,
            ],
        );
        Self {
            cert: dir.join(crt),
            key: dir.join(key),
        }
    }

    /// A server certificate and key signed by this CA, for `127.0.0.1` and `localhost`:
    /// (`server.crt`, `server.key`) in `dir`.
    pub fn server_cert(&self, dir: &Path) -> (PathBuf, PathBuf) {
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ],
        );
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-days",
                "2",
                "-CA",
                self.cert.to_str().unwrap(),
                "-CAkey",
                self.key.to_str().unwrap(),
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-extfile",
                "server.ext",
            ],
        );
        (dir.join("server.crt"), dir.join("server.key"))
    }
}

/// A redis-server listening with TLS only (`--port 0 --tls-port P`, no client certificates),
/// its certificate signed by [`TlsRedis::ca`]. Killed on drop.
pub struct TlsRedis {
    _proc: Proc,
    pub port: u16,
    pub ca: Ca,
    pub dir: tempfile::TempDir,
}

impl TlsRedis {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new(dir.path(), "ca");
        let (crt, key) = ca.server_cert(dir.path());
        let port = free_port();
        let log = dir.path().join("redis.log");
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", "0", "--bind", "127.0.0.1"])
            .args(["--tls-port", &port.to_string()])
            .args(["--tls-cert-file", crt.to_str().unwrap()])
            .args(["--tls-key-file", key.to_str().unwrap()])
            .args(["--tls-ca-cert-file", ca.cert.to_str().unwrap()])
            .args(["--tls-auth-clients", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", dir.path().to_str().unwrap()]);
        let proc = Proc::spawn(&format!("redis-server tls :{port}"), &mut cmd, log);
        let server = Self {
            _proc: proc,
            port,
            ca,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.cli(&["PING"]) != "PONG" {
            assert!(
                Instant::now() < deadline,
                "redis-server with TLS on :{port} did not answer (built without TLS?)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// `rediss://127.0.0.1:P`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// redis-cli over TLS, trusting the CA; its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["--tls", "--cacert", self.ca.cert.to_str().unwrap()])
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}
