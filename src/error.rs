//! The one error type of the crate.
//!
//! Errors are for requests that cannot be served as asked (invalid input, an unknown SKU, a
//! reused request id, ...) and infrastructure failures. Business outcomes — sold out,
//! insufficient stock, a replayed request — are values of [`crate::Deduction`], never errors.
//!
//! [`Error::kind`] classifies an error once for everyone: the `kind` label of
//! [`crate::metrics::ERRORS`], the HTTP status of the `http` module and a caller's retry
//! decision ([`Error::is_retryable`]) all derive from it.

/// Everything that can go wrong, by cause. Each variant's doc says how to fix it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument failed validation; nothing was changed. Fix the named field.
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// Which argument (`sku`, `user`, `request_id`, `qty`, `stock`, `segments`, ...).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The SKU has never been loaded (or its metadata is gone). Load it first.
    #[error("sku {0:?} is not loaded")]
    NotLoaded(String),
    /// `load` on a SKU that exists. Reload it explicitly (`LoadOptions::replace(true)`, CLI `--replace`, HTTP `"replace":true`) to start a new generation.
    #[error(
        "sku {sku:?} is already loaded (generation {generation}); load it with replace (LoadOptions::replace(true), CLI --replace) to start a new generation"
    )]
    AlreadyLoaded {
        /// The SKU.
        sku: String,
        /// Its current load generation.
        generation: u64,
    },
    /// The SKU is in the middle of a (re)load; retry shortly. A load that crashed half-way
    /// leaves this state until the SKU is reloaded.
    #[error("sku {0:?} is being loaded; retry shortly")]
    NotReady(String),
    /// The request id was used before with other parameters. Use a fresh request id per
    /// distinct request; re-send the same parameters only when retrying the same request.
    #[error(
        "request id {request_id:?} was already used with other parameters: {field} not the same"
    )]
    RequestIdConflict {
        /// The request id.
        request_id: String,
        /// Which parameter differs (`qty`, `kind`, or an order's `items`).
        field: &'static str,
    },
    /// A lock-based strategy did not get its segment's lock within `lock_wait`, or lost it
    /// before its write landed (the lease ran out, e.g. the holder was paused, and someone
    /// else took the lock): the fenced write was refused and nothing was changed by that step.
    /// Retry with the same request id.
    #[error(
        "lock on {0} was not acquired in time or was lost before the write; nothing was written"
    )]
    LeaseLost(String),
    /// The configuration is invalid or contradictory.
    #[error("config: {0}")]
    Config(String),
    /// Redis failed (connection, timeout, server error). The outcome of a mutating call is
    /// unknown: retry it with the same request id, which is always safe.
    #[error("redis: {0}")]
    Redis(fred::error::Error),
    /// The Redis user may not run a command or touch a key shardstock needs (an ACL `NOPERM`
    /// refusal, also from inside a script). The message names the command, or for a script the
    /// script and the commands it calls; nothing was changed by the refused command. Grant the
    /// rights: `scripts/acl.sh PREFIX USER PASSWORD` prints the least-privilege `ACL SETUSER`
    /// line. Not retryable until an operator changes the ACL.
    #[error(
        "redis permission denied: {0}; grant it (scripts/acl.sh prints the ACL line shardstock needs)"
    )]
    Permission(String),
    /// Durability mode (`store.wait_replicas`): the call ran on its master, but fewer replicas
    /// than asked acknowledged its writes within `store.wait_timeout_ms` (a replica is down,
    /// lagging or being resynced). Whether the outcome survives a failover of that master is
    /// unknown. Retry with the same request id once the replicas are back: the request id
    /// makes the retry exactly-once, and it answers the outcome the master holds.
    #[error(
        "not durable: {acked} of {wanted} replicas acknowledged the write in time; retry with the same request id"
    )]
    NotDurable {
        /// Replicas that acknowledged within the timeout.
        acked: u32,
        /// Replicas asked for (`store.wait_replicas`).
        wanted: u32,
    },
    /// Redis refused the call before running it: the master of the segment cannot currently
    /// reach the replicas its `min-replicas-to-write` setting requires (`NOREPLICAS`; a replica
    /// is down or lagging past `min-replicas-max-lag`, or the master was just promoted and has
    /// none yet). **Nothing was written**: unlike [`Error::NotDurable`] the outcome is known
    /// (this error comes only in durability mode, where each call is sent once; elsewhere a
    /// `NOREPLICAS` answer may be a re-sent call's and is [`Error::Redis`]).
    /// Only this segment is affected; a sale whose home segment lives on a healthy master goes
    /// on, taking units from healthy donors. Retry with the same request id once a replica is
    /// back.
    #[error(
        "no replicas: the segment's master refused the write before running it ({0}); nothing was written, retry later"
    )]
    NoReplicas(String),
    /// The store answered something this version does not understand (a bug or a foreign
    /// writer on our keys).
    #[error("unexpected store reply: {0}")]
    Protocol(String),
    /// PostgreSQL failed (connection, server error) in the orders handler
    /// (`orders::postgres`, feature `postgres`). Retry: its writes are idempotent by request id,
    /// and a broken connection is opened again on the next call.
    #[error("postgres: {0}")]
    Postgres(String),
}

impl From<fred::error::Error> for Error {
    /// A Redis error; an ACL refusal becomes [`Error::Permission`] naming what is missing.
    fn from(e: fred::error::Error) -> Self {
        if let Some(detail) = no_replicas_detail(e.details()) {
            return Error::NoReplicas(detail);
        }
        match permission_detail(e.details()) {
            Some(detail) => Error::Permission(detail),
            None => Error::Redis(e),
        }
    }
}

/// Redis's `NOREPLICAS` refusal (`min-replicas-to-write` not met), without its prefix; `None`
/// for any other error. The scripts declare `#!lua` (no `no-writes` flag), so Redis refuses
/// them before they run (a flagless script would be refused at its first write, also before
/// anything is applied).
fn no_replicas_detail(details: &str) -> Option<String> {
    let rest = details.strip_prefix("NOREPLICAS")?;
    Some(rest.trim().trim_end_matches('.').to_string())
}

/// What an ACL refusal denied, or `None` when `details` is no ACL refusal. Redis names the
/// command or key for a direct call (`NOPERM this user has no permissions to run the 'evalsha'
/// command`), but from inside a script only the script's SHA1 and line (`ERR The user
/// executing the script can't run this command or subcommand script: <sha1>,
/// @user_script:<line>...`): the script layer, which knows the script it ran, names it and the
/// command on that line ([`script_refusal`]); here it is "a script".
fn permission_detail(details: &str) -> Option<String> {
    if details.starts_with("NOPERM") {
        return Some(details.to_string());
    }
    let (what, _) = script_refusal(details)?;
    Some(format!("a script touched {what}: {details}"))
}

/// An ACL refusal from inside a script (`details` as Redis wrote it): what it denied, and the
/// script line Redis names (1-based, of the source as sent) when it names one; `None` for any
/// other error.
pub(crate) fn script_refusal(details: &str) -> Option<(&'static str, Option<usize>)> {
    if !details.contains("The user executing the script can't") {
        return None;
    }
    let what = if details.contains("access at least one of the keys") {
        "a key outside the user's key pattern"
    } else {
        "a command the user may not run"
    };
    let line = details
        .split("@user_script:")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok());
    Some((what, line))
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            field,
            reason: reason.into(),
        }
    }

    /// What kind of failure this is: the one classification of errors that metrics, the HTTP
    /// layer and callers share.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidInput { .. } => ErrorKind::InvalidInput,
            Error::NotLoaded(_) => ErrorKind::NotLoaded,
            Error::AlreadyLoaded { .. } => ErrorKind::AlreadyLoaded,
            Error::NotReady(_) => ErrorKind::NotReady,
            Error::RequestIdConflict { .. } => ErrorKind::RequestIdConflict,
            Error::LeaseLost(_) => ErrorKind::LeaseLost,
            Error::Config(_) => ErrorKind::Config,
            Error::Redis(_) => ErrorKind::Redis,
            Error::Permission(_) => ErrorKind::Permission,
            Error::NotDurable { .. } => ErrorKind::NotDurable,
            Error::NoReplicas(_) => ErrorKind::NoReplicas,
            Error::Protocol(_) => ErrorKind::Protocol,
            Error::Postgres(_) => ErrorKind::Postgres,
        }
    }

    /// True when sending the same request again, **with the same request id**, is safe and may
    /// succeed. See [`ErrorKind::is_retryable`] for each kind.
    pub fn is_retryable(&self) -> bool {
        self.kind().is_retryable()
    }

    /// The input to blame, when one is: the argument that failed validation
    /// ([`InvalidInput`](Error::InvalidInput)), the parameter that differs from the request id's
    /// first use ([`RequestIdConflict`](Error::RequestIdConflict)), `sku` for
    /// [`NotLoaded`](Error::NotLoaded) and [`AlreadyLoaded`](Error::AlreadyLoaded), and
    /// `None` for failures no input caused.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Error::InvalidInput { field, .. } | Error::RequestIdConflict { field, .. } => {
                Some(field)
            }
            Error::NotLoaded(_) | Error::AlreadyLoaded { .. } => Some("sku"),
            _ => None,
        }
    }
}

/// The kind of an [`Error`], without its details: what a caller (or a metric, or an HTTP status)
/// needs to decide what to do next. One kind per [`Error`] variant; new variants bring new kinds,
/// hence `#[non_exhaustive]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::InvalidInput`]: fix the named field. Not retryable.
    InvalidInput,
    /// [`Error::NotLoaded`]: load the SKU first. Not retryable (a retry fails the same way
    /// until someone loads the SKU).
    NotLoaded,
    /// [`Error::AlreadyLoaded`]: reload explicitly to start a new generation. Not retryable.
    AlreadyLoaded,
    /// [`Error::NotReady`]: the SKU is mid-(re)load. Retryable: the load finishes shortly.
    NotReady,
    /// [`Error::RequestIdConflict`]: the request id belongs to another request. Not retryable:
    /// the same parameters under this id can never apply.
    RequestIdConflict,
    /// [`Error::LeaseLost`]: a lock strategy's fenced write was refused and nothing was written.
    /// Retryable with the same request id.
    LeaseLost,
    /// [`Error::Config`]: the configuration (or the configured strategy) cannot serve this.
    /// Not retryable.
    Config,
    /// [`Error::Redis`]: connection, timeout or server error; the outcome of a mutating call is
    /// unknown. Retryable with the same request id, which is what makes the retry safe.
    Redis,
    /// [`Error::Permission`]: the Redis user lacks a command or key (ACL). Not retryable: an
    /// operator must grant it first.
    Permission,
    /// [`Error::NotDurable`]: the write ran but too few replicas acknowledged it in time.
    /// Retryable with the same request id (exactly-once replay).
    NotDurable,
    /// [`Error::NoReplicas`]: the segment's master refused the call before running it (too few
    /// replicas); nothing was written. Retryable with the same request id once a replica is back.
    NoReplicas,
    /// [`Error::Protocol`]: the store answered something this version does not understand (a
    /// bug, or a foreign writer on our keys). Not retryable: the same answer would come back.
    Protocol,
    /// [`Error::Postgres`]: the orders handler's database failed. Retryable: the handler's
    /// writes are idempotent by request id.
    Postgres,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 13] = [
        ErrorKind::InvalidInput,
        ErrorKind::NotLoaded,
        ErrorKind::AlreadyLoaded,
        ErrorKind::NotReady,
        ErrorKind::RequestIdConflict,
        ErrorKind::LeaseLost,
        ErrorKind::Config,
        ErrorKind::Redis,
        ErrorKind::Permission,
        ErrorKind::NotDurable,
        ErrorKind::NoReplicas,
        ErrorKind::Protocol,
        ErrorKind::Postgres,
    ];

    /// A stable lowercase name, for logs and machine-readable output.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::NotLoaded => "not_loaded",
            ErrorKind::AlreadyLoaded => "already_loaded",
            ErrorKind::NotReady => "not_ready",
            ErrorKind::RequestIdConflict => "request_id_conflict",
            ErrorKind::LeaseLost => "lease_lost",
            ErrorKind::Config => "config",
            ErrorKind::Redis => "redis",
            ErrorKind::Permission => "permission",
            ErrorKind::NotDurable => "not_durable",
            ErrorKind::NoReplicas => "no_replicas",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Postgres => "postgres",
        }
    }

    /// True when the same request, sent again with the same request id, is safe and may
    /// succeed: the failure was transient and the request id makes a repeat exactly-once.
    /// False when a retry would fail the same way (the input, the request id or the setup must
    /// change first).
    pub const fn is_retryable(self) -> bool {
        match self {
            ErrorKind::NotReady
            | ErrorKind::LeaseLost
            | ErrorKind::Redis
            | ErrorKind::NotDurable
            | ErrorKind::NoReplicas
            | ErrorKind::Postgres => true,
            ErrorKind::InvalidInput
            | ErrorKind::NotLoaded
            | ErrorKind::AlreadyLoaded
            | ErrorKind::RequestIdConflict
            | ErrorKind::Config
            | ErrorKind::Permission
            | ErrorKind::Protocol => false,
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::{Error, ErrorKind, script_refusal};

    #[test]
    fn all_lists_every_kind_once_with_distinct_names() {
        let mut names: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorKind::ALL.len());
    }

    #[test]
    fn only_transient_failures_are_retryable() {
        let retryable: Vec<ErrorKind> = ErrorKind::ALL
            .into_iter()
            .filter(|k| k.is_retryable())
            .collect();
        assert_eq!(
            retryable,
            [
                ErrorKind::NotReady,
                ErrorKind::LeaseLost,
                ErrorKind::Redis,
                ErrorKind::NotDurable,
                ErrorKind::NoReplicas,
                ErrorKind::Postgres
            ]
        );
        assert!(Error::NotReady("s".into()).is_retryable());
    }

    #[test]
    fn field_names_the_input_to_blame() {
        let conflict = Error::RequestIdConflict {
            request_id: "r".into(),
            field: "qty",
        };
        assert_eq!(conflict.field(), Some("qty"));
        assert_eq!(Error::invalid("user", "empty").field(), Some("user"));
        assert_eq!(Error::NotLoaded("s".into()).field(), Some("sku"));
        assert_eq!(Error::Config("x".into()).field(), None);
    }

    #[test]
    fn acl_refusals_become_permission_errors_naming_what_is_missing() {
        use fred::error::{Error as Fred, ErrorKind as FredKind};
        let direct: Error = Fred::new(
            FredKind::Unknown,
            "NOPERM this user has no permissions to run the 'evalsha' command",
        )
        .into();
        assert_eq!(direct.kind(), ErrorKind::Permission);
        assert!(!direct.is_retryable());
        assert!(direct.to_string().contains("'evalsha'"), "{direct}");
        let other: Error = Fred::new(FredKind::IO, "connection reset").into();
        assert_eq!(other.kind(), ErrorKind::Redis);
        // From inside a script Redis names the script's SHA1 and line only: what was denied
        // and the line are read here (the script layer names the script).
        let inside = "ERR The user executing the script can't access at least one of the keys \
                      mentioned in the command script: 0123abcd, on @user_script:42.";
        assert_eq!(
            script_refusal(inside),
            Some(("a key outside the user's key pattern", Some(42)))
        );
        let e: Error = Fred::new(FredKind::Unknown, inside).into();
        assert_eq!(e.kind(), ErrorKind::Permission);
        assert!(e.to_string().contains("a script touched a key"), "{e}");
        assert_eq!(script_refusal("ERR something else"), None);
    }
}
