//! Lock activity: the counters a [`Locker`](super::Locker) keeps ([`LockStats`]), their
//! snapshot ([`LockFigures`], what [`Store::lock_figures`](crate::Store::lock_figures) and the
//! simulator report) and the lock metrics' names. Counts only: no lock logic, no I/O, so the
//! store's interface can name the figures without depending on how locks are taken.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Counters of lock activity (shared by all clones of a store).
#[derive(Debug, Default)]
pub struct LockStats {
    pub(super) acquired: AtomicU64,
    pub(super) contended: AtomicU64,
    pub(super) queued: AtomicU64,
    pub(super) timeouts: AtomicU64,
    pub(super) renewals: AtomicU64,
    pub(super) leases_lost: AtomicU64,
    pub(super) fenced_rejected: AtomicU64,
    pub(super) fallbacks: AtomicU64,
    pub(super) wait_us: AtomicU64,
    pub(super) watchdogs: AtomicUsize,
}

/// A snapshot of [`LockStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LockFigures {
    /// Successful acquisitions.
    pub acquired: u64,
    /// Redis attempts (`SET NX`) that found the lock taken.
    pub contended: u64,
    /// Acquisitions that found the lock held in this process and queued behind its holder
    /// (first come, first served, without touching Redis).
    pub queued: u64,
    /// Acquisitions that gave up after `wait`.
    pub timeouts: u64,
    /// Lease renewals by watchdogs.
    pub renewals: u64,
    /// Leases found lost (by a watchdog or at write time).
    pub leases_lost: u64,
    /// Writes the fence token rejected (the holder was no longer current).
    pub fenced_rejected: u64,
    /// Requests that moved on to another segment because this one was locked.
    pub fallbacks: u64,
    /// Total time spent waiting for locks, in microseconds.
    pub wait_us: u64,
    /// Watchdog tasks running right now.
    pub watchdogs_running: u64,
}

impl LockStats {
    /// Current values.
    pub fn figures(&self) -> LockFigures {
        LockFigures {
            acquired: self.acquired.load(Relaxed),
            contended: self.contended.load(Relaxed),
            queued: self.queued.load(Relaxed),
            timeouts: self.timeouts.load(Relaxed),
            renewals: self.renewals.load(Relaxed),
            leases_lost: self.leases_lost.load(Relaxed),
            fenced_rejected: self.fenced_rejected.load(Relaxed),
            fallbacks: self.fallbacks.load(Relaxed),
            wait_us: self.wait_us.load(Relaxed),
            watchdogs_running: self.watchdogs.load(Relaxed) as u64,
        }
    }

    pub(crate) fn fenced(&self) {
        self.fenced_rejected.fetch_add(1, Relaxed);
        metrics::counter!(metric_names::FENCED).increment(1);
    }

    pub(crate) fn lost(&self) {
        self.leases_lost.fetch_add(1, Relaxed);
        metrics::counter!(metric_names::LEASES_LOST).increment(1);
    }

    pub(crate) fn fallback(&self) {
        self.fallbacks.fetch_add(1, Relaxed);
    }
}

/// Lock metric names (see [`crate::metrics`]).
pub mod metric_names {
    pub use crate::metrics::{
        LOCK_ACQUIRED as ACQUIRED, LOCK_CONTENDED as CONTENDED, LOCK_FENCED as FENCED,
        LOCK_LEASES_LOST as LEASES_LOST, LOCK_RENEWALS as RENEWALS, LOCK_TIMEOUTS as TIMEOUTS,
        LOCK_WAIT_SECONDS as WAIT_SECONDS,
    };
}
