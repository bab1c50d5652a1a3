//! The one error type of the crate.
//!
//! Errors are for invalid input and infrastructure failures only. Business outcomes — sold out,
//! insufficient stock, a replayed request — are values of [`crate::Deduction`], never errors.

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
    /// `load` on a SKU that exists. Use an explicit reload (`replace = true`) to reset it.
    #[error(
        "sku {sku:?} is already loaded (generation {generation}); load it with replace = true (CLI: --replace) to start a new generation"
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
    #[error("request id {request_id:?} was already used with a different {field}")]
    RequestIdConflict {
        /// The request id.
        request_id: String,
        /// Which parameter differs (`user` or `qty`).
        field: &'static str,
    },
    /// A lock-based strategy lost its lock before its write landed (the lease ran out, e.g.
    /// the holder was paused, and someone else took the lock): the fenced write was refused
    /// and nothing was changed by that step. Retry with the same request id.
    #[error("lock on {0:?} was lost before the write; nothing was written")]
    LeaseLost(String),
    /// The request's per-user claim expired before the request was applied (its process was
    /// presumed dead), was verified void, and the request id was sealed: it can never apply.
    /// Nothing was sold. Send the purchase again with a new request id.
    #[error(
        "request id {0:?} was sealed after its per-user claim expired; nothing was sold, use a new request id"
    )]
    Sealed(String),
    /// The configuration is invalid or contradictory.
    #[error("config: {0}")]
    Config(String),
    /// Redis failed (connection, timeout, server error). The outcome of a mutating call is
    /// unknown: retry it with the same request id, which is always safe.
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
    /// The store answered something this version does not understand (a bug or a foreign
    /// writer on our keys).
    #[error("unexpected store reply: {0}")]
    Protocol(String),
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
}
