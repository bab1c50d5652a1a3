//! Distributed locks for the lock-based deduction strategies.
//!
//! A [`Locker`] acquires a lock with `SET key token NX PX lease` and a unique owner token,
//! waits a bounded time with **jittered exponential backoff** (a tight retry loop floods Redis
//! ahead of the holder's own commands and slows the holder down), and hands back a
//! [`LockGuard`]. While the guard lives, a **watchdog** task renews the lease every lease/3 with
//! a compare-and-`PEXPIRE`; if a renewal finds the lock gone, the guard is marked lost and the
//! caller is told (never ignored). Release is a compare-and-delete, never a plain `DEL`.
//! Dropping a guard (or cancelling the task holding it, or cancelling an acquisition half-way)
//! stops the watchdog at once and releases the lock in the background.
//!
//! **Waiters queue in process.** Tasks of one process that want the same key line up on a
//! per-key async mutex of the [`Locker`] (FIFO, no polling) before the first `SET NX`, and the
//! holder keeps its place until its release completed: only one task per process contends for
//! a key in Redis, so waiters no longer send failed `SET NX` attempts ahead of the holder's
//! commands nor burn the CPU the holder needs. The Redis lock stays what excludes holders
//! (other processes, other lockers); the queue only orders this locker's own callers, and its
//! wait counts against the same bounded `wait`.
//!
//! A lock alone cannot stop a holder that was paused past its lease (GC, `SIGSTOP`, a slow
//! downstream call) from writing after someone else took over. That is what the **fence
//! token** is for: every acquisition bumps a number stored with the segment (its `fence`
//! field, `fence_read.lua`), and the write script applies only while the number is still the
//! holder's (`sell.lua` given the token: it answers `lock_lost` and writes nothing otherwise).
//!
//! Backends: one Redis (the store's own; the lock key shares the segment's hash tag) or
//! [`redlock::RedLock`] over several independent nodes. Their scripts (`lock_renew.lua`,
//! `lock_release.lua`, `redlock_acquire.lua`) run through the store's one Lua layer
//! ([`crate::store::redis::lua`]), so a `NOSCRIPT` reload of a lock script is counted like any
//! other.

pub mod redlock;
pub(crate) mod stats;

pub use stats::{LockFigures, LockStats, metric_names};

use crate::error::{Error, Result};
use crate::store::redis::lua::{
    self,
    lock::{LockRelease, LockRenew},
};
use dashmap::DashMap;
use fred::prelude::{KeysInterface, Pool};
use fred::types::{Expiration, SetOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Lock tunables: `LockOptions::default().lease(..).wait(..)`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockOptions {
    /// Lease of one acquisition; the watchdog renews it every lease/3 (default 2 s).
    pub lease: Duration,
    /// How long an acquisition may wait before giving up as contended (default 1 s).
    pub wait: Duration,
    /// First backoff between attempts (default 1 ms); doubles up to `backoff_max`, jittered.
    pub backoff_min: Duration,
    /// Largest backoff (default 16 ms).
    pub backoff_max: Duration,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(2),
            wait: Duration::from_secs(1),
            backoff_min: Duration::from_millis(1),
            backoff_max: Duration::from_millis(16),
        }
    }
}

impl LockOptions {
    /// Sets [`lease`](Self::lease).
    #[must_use]
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = d;
        self
    }

    /// Sets [`wait`](Self::wait).
    #[must_use]
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }

    /// Sets [`backoff_min`](Self::backoff_min) and [`backoff_max`](Self::backoff_max).
    #[must_use]
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max;
        self
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::Config`] naming the option.
    pub fn validate(&self) -> Result<()> {
        if self.lease < Duration::from_millis(30) {
            return Err(Error::Config("lock lease must be at least 30 ms".into()));
        }
        if self.backoff_min.is_zero() || self.backoff_max < self.backoff_min {
            return Err(Error::Config(
                "lock backoff must satisfy 0 < min <= max".into(),
            ));
        }
        Ok(())
    }
}

/// Where locks live.
pub(crate) enum Backend {
    /// The store's own Redis: the lock key shares the segment's hash tag.
    Single(Pool),
    /// A quorum of independent nodes.
    Red(redlock::RedLock),
}

impl Backend {
    /// One attempt; `Some(validity)` when acquired.
    async fn try_lock(&self, key: &str, token: &str, lease: Duration) -> Result<Option<Duration>> {
        match self {
            Backend::Single(pool) => {
                let client = pool.next();
                let px = Some(Expiration::PX(lease.as_millis() as i64));
                let set = || client.set(key, token, px.clone(), Some(SetOptions::NX), false);
                let r: Option<String> = crate::cluster::moving::follow(set).await?;
                Ok(r.map(|_| lease))
            }
            Backend::Red(r) => r.try_lock(key, token, lease).await,
        }
    }

    async fn renew(&self, key: &str, token: &str, lease: Duration) -> Result<bool> {
        match self {
            Backend::Single(pool) => lua::run(pool.next(), LockRenew { key, token, lease }).await,
            Backend::Red(r) => r.renew(key, token, lease).await,
        }
    }

    async fn unlock(&self, key: &str, token: &str) -> Result<()> {
        match self {
            Backend::Single(pool) => {
                lua::run(pool.next(), LockRelease { key, token }).await?;
                Ok(())
            }
            Backend::Red(r) => r.unlock(key, token).await,
        }
    }
}

/// Acquires locks; cheap to clone.
#[derive(Clone)]
pub struct Locker {
    backend: Arc<Backend>,
    opts: LockOptions,
    stats: Arc<LockStats>,
    /// The in-process queue per key (see the module docs); an entry lives while someone
    /// holds or waits for it.
    queues: Arc<Queues>,
}

type Queues = DashMap<String, Arc<tokio::sync::Mutex<()>>>;

/// A place at the head of a key's in-process queue; leaving it drops the key's entry when
/// nobody else holds or waits for it.
struct Place {
    queues: Arc<Queues>,
    key: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Place").field("key", &self.key).finish()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        // Unlock first: a waiter woken now holds its own Arc, so the count below sees it.
        drop(self.guard.take());
        // Under the map's shard lock, as every clone in `Locker::queue` is: no race.
        self.queues
            .remove_if(&self.key, |_, m| Arc::strong_count(m) == 1);
    }
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker").field("opts", &self.opts).finish()
    }
}

/// A unique owner token: process id, a per-process counter and randomness.
fn token() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!(
        "{:x}.{:x}.{:016x}",
        std::process::id(),
        SEQ.fetch_add(1, Relaxed),
        fastrand::u64(..)
    )
}

/// Releases a lock that an acquisition may have obtained when that acquisition is cancelled
/// half-way (the `SET NX` can succeed on the server after the caller stopped listening).
struct Pending {
    backend: Arc<Backend>,
    key: String,
    token: String,
    armed: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.armed {
            release_in_background(&self.backend, &self.key, &self.token);
        }
    }
}

fn release_in_background(backend: &Arc<Backend>, key: &str, token: &str) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let (b, k, t) = (Arc::clone(backend), key.to_string(), token.to_string());
        rt.spawn(async move {
            let _ = b.unlock(&k, &t).await;
        });
    }
}

impl Locker {
    pub(crate) fn new(backend: Backend, opts: LockOptions) -> Self {
        Self {
            backend: Arc::new(backend),
            opts,
            stats: Arc::new(LockStats::default()),
            queues: Arc::new(DashMap::new()),
        }
    }

    /// A locker on one Redis (the pool's), e.g. the store's own.
    pub fn single(pool: Pool, opts: LockOptions) -> Self {
        Self::new(Backend::Single(pool), opts)
    }

    /// A RedLock locker over independent nodes (`redis://...` URLs; 3 or 5 is usual).
    ///
    /// # Errors
    /// [`Error::Config`] for fewer than 3 nodes or an even count; [`Error::Redis`] when a URL
    /// is invalid. Unreachable nodes are not an error here: they just cannot vote.
    pub async fn redlock(urls: &[String], opts: LockOptions) -> Result<Self> {
        opts.validate()?;
        Ok(Self::new(
            Backend::Red(redlock::RedLock::connect(urls).await?),
            opts,
        ))
    }

    /// Counters.
    pub fn stats(&self) -> &Arc<LockStats> {
        &self.stats
    }

    /// Options in force.
    pub fn options(&self) -> &LockOptions {
        &self.opts
    }

    /// Acquires `key`, waiting at most `wait`; `None` when it stayed taken (contended).
    ///
    /// # Errors
    /// [`Error::Redis`] (or a RedLock error) when the backend fails.
    pub async fn acquire(&self, key: &str) -> Result<Option<LockGuard>> {
        let start = Instant::now();
        let deadline = start + self.opts.wait;
        let mut backoff = self.opts.backoff_min;
        // Wait in process first, without touching Redis (bounded by the same deadline).
        let queue = Arc::clone(&*self.queues.entry(key.to_string()).or_default());
        let mut place = Place {
            queues: Arc::clone(&self.queues),
            key: key.to_string(),
            guard: None,
        };
        let held = match Arc::clone(&queue).try_lock_owned() {
            Ok(g) => Ok(g),
            Err(_) => {
                // Taken in this process: queue behind the holder (counted as contention).
                self.stats.queued.fetch_add(1, Relaxed);
                metrics::counter!(metric_names::CONTENDED).increment(1);
                tokio::time::timeout_at(deadline.into(), queue.lock_owned()).await
            }
        };
        match held {
            Ok(g) => place.guard = Some(g),
            Err(_) => {
                drop(place);
                self.stats.contended.fetch_add(1, Relaxed);
                metrics::counter!(metric_names::CONTENDED).increment(1);
                return Ok(self.timed_out(start));
            }
        }
        let token = token();
        let mut pending = Pending {
            backend: Arc::clone(&self.backend),
            key: key.to_string(),
            token: token.clone(),
            armed: true,
        };
        loop {
            if let Some(validity) = self.backend.try_lock(key, &token, self.opts.lease).await? {
                pending.armed = false;
                self.waited(start, &self.stats.acquired, metric_names::ACQUIRED);
                return Ok(Some(self.guard(key, token, validity, place)));
            }
            self.stats.contended.fetch_add(1, Relaxed);
            metrics::counter!(metric_names::CONTENDED).increment(1);
            let now = Instant::now();
            if now >= deadline {
                pending.armed = false;
                return Ok(self.timed_out(start));
            }
            // Full jitter: sleep a random time up to the current backoff.
            let nanos = fastrand::u64(backoff.as_nanos() as u64 / 2..=backoff.as_nanos() as u64);
            tokio::time::sleep(Duration::from_nanos(nanos).min(deadline - now)).await;
            backoff = (backoff * 2).min(self.opts.backoff_max);
        }
    }

    /// Counts an acquisition that gave up after the wait.
    fn timed_out(&self, start: Instant) -> Option<LockGuard> {
        self.waited(start, &self.stats.timeouts, metric_names::TIMEOUTS);
        None
    }

    /// Counts an acquisition's end (`count`, metric `counter`) and the time it waited.
    fn waited(&self, start: Instant, count: &AtomicU64, counter: &'static str) {
        count.fetch_add(1, Relaxed);
        let waited = start.elapsed();
        self.stats
            .wait_us
            .fetch_add(waited.as_micros() as u64, Relaxed);
        metrics::counter!(counter).increment(1);
        metrics::histogram!(metric_names::WAIT_SECONDS).record(waited.as_secs_f64());
    }

    fn guard(&self, key: &str, token: String, validity: Duration, place: Place) -> LockGuard {
        let lost = Arc::new(AtomicBool::new(false));
        let (backend, stats, lease) = (
            Arc::clone(&self.backend),
            Arc::clone(&self.stats),
            self.opts.lease,
        );
        let (k, t, l) = (key.to_string(), token.clone(), Arc::clone(&lost));
        stats.watchdogs.fetch_add(1, Relaxed);
        let counter = WatchdogCount(Arc::clone(&stats));
        let watchdog = tokio::spawn(async move {
            let _counter = counter; // decrements when the task ends or is aborted
            // The lease certainly holds until `valid_until`; a renewal that errors (timeout,
            // reconnect) is retried until then, and only a definite "not yours" or running out
            // of lease marks the lock lost.
            let mut valid_until = tokio::time::Instant::now() + lease;
            loop {
                tokio::time::sleep(lease / 3).await;
                loop {
                    let sent = tokio::time::Instant::now();
                    match backend.renew(&k, &t, lease).await {
                        Ok(true) => {
                            valid_until = sent + lease;
                            stats.renewals.fetch_add(1, Relaxed);
                            metrics::counter!(metric_names::RENEWALS).increment(1);
                            break;
                        }
                        Err(_) if tokio::time::Instant::now() + lease / 10 < valid_until => {
                            tokio::time::sleep(lease / 20).await;
                        }
                        // Gone (expired or taken), or unreachable past the lease: report, stop.
                        Ok(false) | Err(_) => {
                            l.store(true, Relaxed);
                            stats.lost();
                            return;
                        }
                    }
                }
            }
        });
        LockGuard {
            key: key.to_string(),
            token,
            backend: Arc::clone(&self.backend),
            lost,
            acquired_at: Instant::now(),
            validity,
            watchdog: Some(watchdog),
            released: false,
            _place: place,
        }
    }
}

struct WatchdogCount(Arc<LockStats>);

impl Drop for WatchdogCount {
    fn drop(&mut self) {
        self.0.watchdogs.fetch_sub(1, Relaxed);
    }
}

/// A held lock. Renewed by its watchdog while it lives; released by [`release`](Self::release)
/// or, in the background, on drop.
#[derive(Debug)]
pub struct LockGuard {
    key: String,
    token: String,
    backend: Arc<Backend>,
    lost: Arc<AtomicBool>,
    acquired_at: Instant,
    validity: Duration,
    watchdog: Option<tokio::task::JoinHandle<()>>,
    released: bool,
    /// This locker's next waiter for the key gets in when the guard is gone (after
    /// `release` completed, or at drop).
    _place: Place,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Single(_) => "Single",
            Backend::Red(_) => "RedLock",
        })
    }
}

impl LockGuard {
    /// The owner token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// True when the watchdog found the lease gone: the holder must not act on the lock.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Relaxed)
    }

    /// Validity left of the first lease (RedLock: lease − acquisition time − drift); renewals
    /// extend the lock itself, this only tells how much margin the acquisition had.
    pub fn initial_validity_left(&self) -> Duration {
        self.validity.saturating_sub(self.acquired_at.elapsed())
    }

    /// Stops the watchdog and releases (compare-and-delete).
    ///
    /// # Errors
    /// Backend errors (the lock then expires by its lease).
    pub async fn release(mut self) -> Result<()> {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
        let r = self.backend.unlock(&self.key, &self.token).await;
        // Only now: if this future is dropped before the unlock completed, Drop still
        // releases in the background.
        self.released = true;
        r
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
        if !self.released {
            release_in_background(&self.backend, &self.key, &self.token);
        }
    }
}
