//! The Redis URL a store connects to, checked before fred reads it, and what the server at the
//! other end is when a connection fails for want of a Redis there.
//!
//! fred reads any URL whose host it can find: `http://host:6379` connects as if it said
//! `redis://`, and `127.0.0.1:6379` fails as a relative URL. Both are configuration mistakes,
//! refused here as [`Error::Config`] saying what to write. A port that answers but is no Redis
//! (an HTTP server, a listener that closes or answers something else) makes fred fail with a
//! decoding error or a closed connection; [`NotRedis::probe`] then says what the port did.

use crate::error::{Error, Result};
use fred::prelude::Config;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The schemes fred 10.1 reads as built here (TLS on, Unix sockets off): plain and TLS, alone,
/// clustered or behind sentinels, under Redis's and Valkey's names.
const SCHEMES: [&str; 12] = [
    "redis",
    "rediss",
    "redis-cluster",
    "rediss-cluster",
    "redis-sentinel",
    "rediss-sentinel",
    "valkey",
    "valkeys",
    "valkey-cluster",
    "valkeys-cluster",
    "valkey-sentinel",
    "valkeys-sentinel",
];

/// The schemes as a reader is told them.
const SCHEMES_HINT: &str = "redis://, rediss:// for TLS, redis-cluster:// or rediss-cluster:// \
     for a cluster, redis-sentinel:// behind sentinels, and their valkey names";

/// Checks that `url` names a scheme fred reads as Redis.
///
/// # Errors
/// [`Error::Config`] for an empty URL, a URL without a scheme (`127.0.0.1:6379`: write
/// `redis://127.0.0.1:6379`), or one with another scheme (`http://`, `redis+unix://`), the
/// URL shown without its password.
pub(crate) fn check_scheme(url: &str) -> Result<()> {
    let url = url.trim();
    if url.is_empty() {
        return Err(Error::Config(
            "the redis URL is empty: write redis://HOST:PORT".into(),
        ));
    }
    let shown_url = shown(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        // `redis:host:6379` names a scheme but lacks the `//`; `host:6379` names none (a URL
        // parser reads `host` as its scheme).
        if let Some((scheme, rest)) = url.split_once(':')
            && SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(scheme))
        {
            let scheme = scheme.to_ascii_lowercase();
            let rest = rest.trim_start_matches('/');
            return Err(Error::Config(format!(
                "redis URL `{shown_url}` lacks the `//` after its scheme: write {}",
                shown(&format!("{scheme}://{rest}"))
            )));
        }
        return Err(Error::Config(format!(
            "redis URL `{shown_url}` has no scheme: write {}",
            shown(&format!("redis://{url}"))
        )));
    };
    let scheme = scheme.to_ascii_lowercase();
    if SCHEMES.contains(&scheme.as_str()) {
        return Ok(());
    }
    if scheme.ends_with("+unix") {
        return Err(Error::Config(format!(
            "redis URL `{shown_url}`: Unix sockets are not supported by this build; connect over \
             TCP (redis://HOST:PORT)"
        )));
    }
    Err(Error::Config(format!(
        "redis URL `{shown_url}` has scheme `{scheme}`, which is not Redis: write {} (the \
         schemes: {SCHEMES_HINT})",
        shown(&format!("redis://{rest}"))
    )))
}

/// fred's client configuration for `url`: [`check_scheme`], then fred's own reading, whose
/// complaints (no host, a bad port, a database that is not a number, ...) are configuration
/// errors too.
pub(crate) fn parse(url: &str) -> Result<Config> {
    check_scheme(url)?;
    Config::from_url(url.trim()).map_err(|e| {
        Error::Config(format!(
            "redis URL `{}`: {}",
            shown(url.trim()),
            words(e.details())
        ))
    })
}

/// `url` with its password (the user info) shown as `***`.
pub(crate) fn shown(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let authority = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority].rfind('@') {
        Some(at) => format!("{scheme}***@{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// A URL parser's error name in words (`InvalidPort` → `invalid port`); other text unchanged.
fn words(details: &str) -> String {
    if details.is_empty() || !details.chars().all(|c| c.is_ascii_alphanumeric()) {
        return details.to_string();
    }
    let mut out = String::new();
    for c in details.chars() {
        if c.is_ascii_uppercase() && !out.is_empty() {
            out.push(' ');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// How long the probe waits to connect, and then for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// `PING` as a Redis client sends it.
const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

/// The first byte of every RESP2 and RESP3 reply (`+OK`, `-ERR`, `:1`, `$5`, `*2`, `_`, `,`,
/// `#`, `!`, `=`, `(`, `%`, `~`, `>`, `|`).
const RESP_FIRST: &[u8] = b"+-:$*_,#!=(%~>|";

/// The server a failed connection was for, to ask whether it speaks Redis at all.
pub(crate) struct NotRedis {
    host: String,
    port: u16,
}

impl NotRedis {
    /// The server `config` names first; `None` under TLS (a TLS handshake says for itself
    /// what went wrong, and a plain probe of a TLS port proves nothing).
    pub(crate) fn of(config: &Config) -> Option<Self> {
        if config.uses_tls() {
            return None;
        }
        // fred lists a URL's own host last (after its `node=` parameters).
        let server = config.server.hosts().pop()?;
        Some(Self {
            host: server.host.to_string(),
            port: server.port,
        })
    }

    /// Connects once more and sends `PING`: the reason the port is no Redis server (it
    /// answered something else, closed the connection, or said nothing within
    /// [`PROBE_TIMEOUT`]); `None` when it answers as Redis does or cannot be reached (the
    /// client's own error says enough then).
    pub(crate) async fn probe(&self) -> Option<String> {
        let addr = format!("{}:{}", self.host, self.port);
        let connect = TcpStream::connect((self.host.as_str(), self.port));
        let mut stream = tokio::time::timeout(PROBE_TIMEOUT, connect)
            .await
            .ok()?
            .ok()?;
        let exchange = async {
            stream.write_all(PING).await?;
            let mut buf = [0u8; 64];
            let n = stream.read(&mut buf).await?;
            Ok::<_, std::io::Error>(buf[..n].to_vec())
        };
        let not = format!("the server at {addr} does not speak the Redis protocol");
        match tokio::time::timeout(PROBE_TIMEOUT, exchange).await {
            Err(_) => Some(format!(
                "the server at {addr} does not answer PING (nothing within {} s): not a Redis \
                 server, or a stuck one",
                PROBE_TIMEOUT.as_secs()
            )),
            Ok(Ok(answer)) if answer.first().is_some_and(|b| RESP_FIRST.contains(b)) => None,
            Ok(Ok(answer)) if !answer.is_empty() => Some(format!(
                "{not}: it answered {:?} to PING; is this the Redis port?",
                first_line(&answer)
            )),
            // Closed (EOF) or reset.
            _ => Some(format!(
                "{not}: it closed the connection without answering PING (a TLS port needs \
                 rediss://)"
            )),
        }
    }
}

/// The first line of what a server sent, as text (at most 40 characters).
fn first_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let line = text.lines().next().unwrap_or("");
    line.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(url: &str) -> String {
        match check_scheme(url) {
            Err(Error::Config(m)) => m,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn redis_schemes_pass() {
        for url in [
            "redis://127.0.0.1:6379",
            " rediss://h:1/0 ",
            "REDIS://h",
            "redis-cluster://h:1?node=h:2",
            "rediss-cluster://h:1",
            "redis-sentinel://h:26379?sentinelServiceName=m",
            "valkey://h:1",
        ] {
            check_scheme(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }

    #[test]
    fn a_missing_or_foreign_scheme_says_what_to_write() {
        assert_eq!(
            refused("127.0.0.1:6379"),
            "redis URL `127.0.0.1:6379` has no scheme: write redis://127.0.0.1:6379"
        );
        assert_eq!(
            refused("localhost:6379"),
            "redis URL `localhost:6379` has no scheme: write redis://localhost:6379"
        );
        assert_eq!(
            refused("redis:h:6379"),
            "redis URL `redis:h:6379` lacks the `//` after its scheme: write redis://h:6379"
        );
        let m = refused("http://127.0.0.1:6379/0");
        assert!(
            m.starts_with(
                "redis URL `http://127.0.0.1:6379/0` has scheme `http`, which is not Redis: \
                 write redis://127.0.0.1:6379/0"
            ),
            "{m}"
        );
        assert!(refused("redis+unix:///tmp/r.sock").contains("Unix sockets"));
        assert!(refused("  ").contains("empty"));
    }

    #[test]
    fn passwords_are_not_shown() {
        let m = refused("u:secret@h:6379");
        assert!(!m.contains("secret"), "{m}");
        assert!(m.contains("redis://***@h:6379"), "{m}");
        let m = refused("http://u:secret@h:6379");
        assert!(!m.contains("secret"), "{m}");
        assert!(m.contains("write redis://***@h:6379"), "{m}");
        let Err(Error::Config(m)) = parse("redis://u:secret@h:6379/x") else {
            panic!("a database that is no number")
        };
        assert!(!m.contains("secret"), "{m}");
        assert_eq!(shown("redis://h:1/0"), "redis://h:1/0");
        assert_eq!(shown("redis://:pw@h:1/0?x=a@b"), "redis://***@h:1/0?x=a@b");
    }

    #[test]
    fn fred_complaints_are_configuration_errors() {
        for (url, says) in [
            ("redis://", "missing host"),
            ("redis://h:99999", "invalid port"),
        ] {
            match parse(url) {
                Err(Error::Config(m)) => assert!(m.to_lowercase().contains(says), "{url}: {m}"),
                Err(e) => panic!("{url}: {e}"),
                Ok(_) => panic!("{url}: parsed"),
            }
        }
    }
}
