//! What the binary reports when a command cannot do its job, and the exit code that says which
//! kind of failure it was (the table is [`EXIT_CODES`], shown by `--help`).

use shardstock::ErrorKind;
use std::process::ExitCode;

/// The exit codes, as `shardstock --help` prints them (and docs/operations.md).
pub(crate) const EXIT_CODES: &str = "\
Exit codes:
    0  ok
    1  a check failed: `audit` (or `sweep`) found a conservation problem, `sim` oversold,
       its audit failed or (--cart) an order's items were not all in its one state
    2  invalid command line (unknown flag, missing or malformed value)
    3  Redis (or PostgreSQL for `orders`) cannot be reached or failed: connection refused,
       timeout, permission denied (ACL), a port that does not speak the Redis protocol;
       retrying later may succeed (`sim` still prints its report, saying what it could
       not check)
    4  configuration error: unreadable file, unknown key, bad value, contradictory settings,
       a Redis URL without a Redis scheme (127.0.0.1:6379, http://...)
    5  the command failed otherwise: invalid input, SKU not loaded or already loaded, request
       id reused with other parameters, address in use, `orders --until-idle` timed out,
       stdout cannot be written (a full disk)
  141  stdout was closed before everything was printed (`| head`): the command stops
       quietly, its output cut (128 + SIGPIPE, as a shell reports a command a closed pipe
       ended); `orders --jsonl` leaves the events it could not write pending";

/// A check failed (`audit`, `sim`).
pub(crate) const CHECK_FAILED: u8 = 1;
/// Redis or PostgreSQL cannot be reached or failed.
pub(crate) const STORE: u8 = 3;
/// The configuration is invalid.
pub(crate) const CONFIG: u8 = 4;
/// The command failed otherwise (refused input, unknown SKU, address in use, ...).
pub(crate) const REFUSED: u8 = 5;
/// stdout was closed before everything was printed: 128 + SIGPIPE (13), what a shell reports
/// for a command that a closed pipe ended.
pub(crate) const STDOUT_CLOSED: u8 = 141;

/// A failure to report: the message goes to stderr, the process exits with `code`.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) msg: String,
    code: u8,
}

impl Failure {
    /// The command failed otherwise (exit code 5).
    pub(crate) fn new(msg: impl Into<String>) -> Self {
        Self {
            msg: msg.into(),
            code: REFUSED,
        }
    }

    /// A configuration error (exit code 4).
    pub(crate) fn config(msg: impl Into<String>) -> Self {
        Self {
            msg: msg.into(),
            code: CONFIG,
        }
    }

    /// A write to stdout failed: a closed stdout (`EPIPE`: the reader went away, as `head`
    /// does once it has its lines) ends the command quietly with [`STDOUT_CLOSED`]; any
    /// other error (a full disk) is reported, exit code 5.
    pub(crate) fn stdout(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Self::stdout_closed()
        } else {
            Self::new(format!("cannot write to stdout: {e}"))
        }
    }

    /// stdout was closed: no message, exit code [`STDOUT_CLOSED`].
    pub(crate) fn stdout_closed() -> Self {
        Self {
            msg: String::new(),
            code: STDOUT_CLOSED,
        }
    }

    /// Whether the failure is told on stderr (all but a closed stdout, which ends quietly).
    pub(crate) fn is_told(&self) -> bool {
        self.code != STDOUT_CLOSED
    }

    /// The exit code.
    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.code)
    }

    /// A failure to connect the store at `url` (shown without its password).
    pub(crate) fn connect(url: &str, e: shardstock::Error) -> Self {
        match &e {
            shardstock::Error::Redis(r) => Self {
                msg: format!("cannot connect to Redis at {}: {}", redact(url), human(r)),
                code: STORE,
            },
            _ => Self::from(e),
        }
    }
}

impl From<shardstock::Error> for Failure {
    fn from(e: shardstock::Error) -> Self {
        let hint = match e.kind() {
            ErrorKind::AlreadyLoaded => {
                " (the old stock, counters and request records then stop counting)"
            }
            ErrorKind::NotLoaded => {
                "; load it first with `shardstock load --sku ... --stock ... --segments ...`"
            }
            _ => "",
        };
        let code = match e.kind() {
            ErrorKind::Config => CONFIG,
            ErrorKind::Redis
            | ErrorKind::Permission
            | ErrorKind::NotDurable
            | ErrorKind::NoReplicas
            | ErrorKind::LeaseLost
            | ErrorKind::Protocol
            | ErrorKind::Postgres => STORE,
            _ => REFUSED,
        };
        let msg = match &e {
            shardstock::Error::Redis(r) => format!("redis: {}", human(r)),
            e => e.to_string(),
        };
        Self {
            msg: format!("{msg}{hint}"),
            code,
        }
    }
}

/// A Redis error as a person reads it: an I/O failure by its message (`connection refused`),
/// not the `Os { code: 111, kind: ConnectionRefused, .. }` the client records.
pub(crate) fn human(e: &fred::error::Error) -> String {
    let details = e.details();
    if *e.kind() == fred::error::ErrorKind::IO {
        // The client keeps an I/O error as its debug form: `Os { .., message: "Connection
        // refused" }` or `Custom { kind: .., error: "failed to lookup address ..." }`.
        for field in ["message: \"", "error: \""] {
            if let Some(rest) = details.split(field).nth(1)
                && let Some(text) = rest.split('"').next()
                && !text.is_empty()
            {
                let mut chars = text.chars();
                let first = chars.next().map(|c| c.to_ascii_lowercase());
                return first.into_iter().chain(chars).collect();
            }
        }
        // `Kind(ConnectionRefused)`: the kind's name in words.
        if let Some(rest) = details.strip_prefix("Kind(") {
            let name = rest.trim_end_matches(')');
            let mut words = String::new();
            for c in name.chars() {
                if c.is_ascii_uppercase() && !words.is_empty() {
                    words.push(' ');
                }
                words.push(c.to_ascii_lowercase());
            }
            return words;
        }
    }
    if details.is_empty() {
        e.kind().to_str().to_ascii_lowercase()
    } else {
        details.to_string()
    }
}

/// Shows a Redis URL without its password.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s + 3 => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_read_as_their_message() {
        #[cfg(target_os = "linux")]
        {
            let refused = fred::error::Error::from(std::io::Error::from_raw_os_error(111));
            assert_eq!(human(&refused), "connection refused");
        }
        let kind = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(human(&fred::error::Error::from(kind)), "connection refused");
        let custom = fred::error::Error::from(std::io::Error::other("Name or service not known"));
        assert_eq!(human(&custom), "name or service not known");
        let other = fred::error::Error::new(fred::error::ErrorKind::Timeout, "Request timed out.");
        assert_eq!(human(&other), "Request timed out.");
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(redact("redis://u:pw@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
