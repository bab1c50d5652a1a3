//! TLS material made by `openssl`: a CA, a server certificate for `127.0.0.1`/`localhost`
//! signed by it, and the one set of both a test process gives its TLS `redis-server`s.

use std::path::{Path, PathBuf};
use std::process::Command;

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

/// The TLS material of this test process, made once (a CA and a server certificate for
/// `127.0.0.1`/`localhost` signed by it), for every TLS [`super::RedisServer`]: with
/// `SHARDSTOCK_TEST_TLS=1` that is every single-node server, else the ones
/// [`super::RedisServer::start_tls`] starts. It lives under the target directory's
/// `tmp/` (`CARGO_TARGET_TMPDIR`), not in the system's temporary directory: a static is never
/// dropped, and `cargo clean` removes it (or the next process, an hour later).
pub struct ProcessTls {
    pub ca: Ca,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// [`ProcessTls`], made on the first call.
pub fn process_tls() -> &'static ProcessTls {
    static TLS: std::sync::OnceLock<ProcessTls> = std::sync::OnceLock::new();
    TLS.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
        remove_stale(root);
        let dir = tempfile::Builder::new()
            .prefix("tls-")
            .tempdir_in(root)
            .unwrap()
            .keep();
        let ca = Ca::new(&dir, "ca");
        let (cert, key) = ca.server_cert(&dir);
        ProcessTls { ca, cert, key }
    })
}

/// Removes the `tls-*` directories of test processes that started over an hour ago (no test
/// process lives that long; their certificates are valid for 2 days).
fn remove_stale(root: &Path) {
    let hour = std::time::Duration::from_secs(3600);
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > hour));
        if old && entry.file_name().to_string_lossy().starts_with("tls-") {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A rustls connector trusting only the CA certificate in the PEM file `ca` (what the store
/// builds from `store.tls_ca_file`), for test clients of TLS servers.
pub fn connector(ca: &Path) -> fred::types::config::TlsConnector {
    use fred::rustls::pki_types::CertificateDer;
    use fred::rustls::pki_types::pem::PemObject;
    use fred::rustls::{ClientConfig, RootCertStore};
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(fred::rustls::crypto::ring::default_provider());
    ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
        .into()
}
