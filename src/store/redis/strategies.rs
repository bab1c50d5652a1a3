//! How [`Store::sell`](crate::Store::sell) runs under each [`Strategy`].
//!
//! - `lua`: `sell.lua`, one atomic script at the home segment; concurrent requests without
//!   credits are coalesced into one call (see `batch`).
//! - `lock` / `redlock`: the critical section is at home. Take the home segment's lock, bump the
//!   segment's fence token and read it (`fence_read.lua`), then call `sell.lua` with that fence
//!   token: it applies only while the token is still the segment's, so a holder whose lease
//!   lapsed (a pause, a partition) writes nothing once a newer holder exists (`lock_lost`).
//!   The decision itself is `sell.lua`'s, exactly as under `lua`: the lock adds mutual
//!   exclusion (and its costs), not different answers.
//! - The unsafe baselines reproduce the common flash-sale designs, failures included, with plain
//!   commands on the segment hash and no request records at all (no exactly-once: a re-sent
//!   request sells again; a `Replay` never happens for them). They sell only: a reservation,
//!   or a segment with a per-user limit, is refused with [`Error::Config`] (both live in the
//!   records they do not keep).
//!   - `naive`: read the stock (`HMGET`), check, then `HINCRBY stock -q` and `HINCRBY sold +q`.
//!     Two buyers that read the same stock both sell: it **oversells** under concurrency (the
//!     stock goes below zero).
//!   - `local-mutex`: the same under a process-local mutex per segment. Safe within one
//!     process only: two processes (instances) **oversell** exactly like `naive`.
//!   - `decr-compensate`: `HINCRBY stock -q` first; when the result is negative, `HINCRBY stock
//!     +q` gives the units back and the answer is short; otherwise `HINCRBY sold +q`. Within one
//!     generation it never oversells, but transient negatives turn buyers away while stock
//!     remains, a crash or a re-sent command between its steps loses or double-counts units, and
//!     its steps are not tied to a generation: a decrement checked against generation g can
//!     land after a reload on generation g+1 (and a give-back too), so it **can oversell across
//!     a reload**.
//!
//! Every strategy keeps the same segment counters, so the audit shows an oversell whoever made
//! it. Transfers (`transfer.lua`) and the credits a sale carries are the same for all: the
//! baselines credit with plain commands too (`HSETNX` on the credits hash, then `HINCRBY`).

use super::batch::Batcher;
use super::coalescing::{CoalesceStats, Coalescing};
use super::conn::Conn;
use super::lua::lock::FenceRead;
use super::lua::sell::{Sell, SellHead, SellItem};
use crate::error::{Error, Result};
use crate::store::redis::lock::{LockFigures, LockOptions, Locker};
use crate::store::{Credit, SegAddr, SellArgs, SellReply};
use crate::strategy::Strategy;
use dashmap::DashMap;
use fred::prelude::{HashesInterface, Pool};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// What a strategy needs to run.
enum Mode {
    /// With request coalescing when configured.
    Lua(Option<Arc<Batcher>>),
    Locked(Locker),
    Naive,
    LocalMutex(DashMap<String, Arc<tokio::sync::Mutex<()>>>),
    DecrCompensate,
}

/// The strategy a [`super::RedisStore`] runs, with what it needs; shared by the store's clones.
pub(super) struct Runner {
    strategy: Strategy,
    mode: Mode,
    /// Test and demo hook: a pause inside each critical section (lock strategies: between the
    /// fence read and the fenced write; naive baselines: between the read and the write), like
    /// the slow downstream call of those designs. Microseconds; 0 = none.
    pause_us: AtomicU64,
}

impl Runner {
    /// `lock` takes its locks on `pool` (the store's Redis); `redlock` on `lock_nodes`.
    /// `coalescing` applies to `lua` only.
    pub(super) async fn new(
        strategy: Strategy,
        pool: &Pool,
        lock: LockOptions,
        lock_nodes: &[String],
        coalescing: Option<Coalescing>,
    ) -> Result<Self> {
        let mode = match strategy {
            Strategy::Lua => Mode::Lua(coalescing.map(|o| Arc::new(Batcher::new(o)))),
            Strategy::Lock => Mode::Locked(Locker::single(pool.clone(), lock)),
            Strategy::Redlock => Mode::Locked(Locker::redlock(lock_nodes, lock).await?),
            Strategy::Naive => Mode::Naive,
            Strategy::LocalMutex => Mode::LocalMutex(DashMap::new()),
            Strategy::DecrCompensate => Mode::DecrCompensate,
        };
        Ok(Self {
            strategy,
            mode,
            pause_us: AtomicU64::new(0),
        })
    }

    pub(super) fn strategy(&self) -> Strategy {
        self.strategy
    }

    pub(super) fn lock_figures(&self) -> Option<LockFigures> {
        match &self.mode {
            Mode::Locked(l) => Some(l.stats().figures()),
            _ => None,
        }
    }

    pub(super) fn coalescing(&self) -> Option<CoalesceStats> {
        match &self.mode {
            Mode::Lua(batcher) => batcher.as_ref().map(|b| b.stats()),
            _ => None,
        }
    }

    pub(super) fn set_pause(&self, d: Duration) {
        self.pause_us.store(d.as_micros() as u64, Relaxed);
    }

    async fn pause(&self) {
        let us = self.pause_us.load(Relaxed);
        if us > 0 {
            tokio::time::sleep(Duration::from_micros(us)).await;
        }
    }

    /// `sell` under the strategy.
    pub(super) async fn sell(
        &self,
        c: &Conn,
        home: SegAddr<'_>,
        req: SellArgs<'_>,
    ) -> Result<SellReply> {
        match &self.mode {
            Mode::Lua(Some(b)) if req.credits.is_empty() && req.fence == 0 => {
                b.submit(c, home, req).await
            }
            // Boxed: the other paths' state (a lock's, above all) would otherwise be part of
            // every coalesced sale's future too, which the engine builds and moves at each of
            // its layers, per request (see `lua::run_durable`).
            _ => Box::pin(self.sell_other(c, home, req)).await,
        }
    }

    /// `sell` for every case but a coalesced `lua` request.
    async fn sell_other(
        &self,
        c: &Conn,
        home: SegAddr<'_>,
        req: SellArgs<'_>,
    ) -> Result<SellReply> {
        match &self.mode {
            Mode::Lua(_) => sell_one(c, home, &req, req.fence).await,
            Mode::Locked(locker) => self.sell_locked(c, locker, home, &req).await,
            Mode::Naive => self.naive(c, home, &req).await,
            Mode::LocalMutex(map) => {
                let _held = local_mutex(c, map, &home).await;
                self.naive(c, home, &req).await
            }
            Mode::DecrCompensate => self.decr_compensate(c, home, &req).await,
        }
    }

    /// Lock strategies: `sell.lua` with this holder's fence token, under the home segment's
    /// lock. A lock that stays taken for the whole wait (contended), or a lease lost before the
    /// write, answers [`SellReply::LockLost`]: nothing was written (credits included), and the
    /// request may be sent again with the same request id.
    async fn sell_locked(
        &self,
        c: &Conn,
        locker: &Locker,
        home: SegAddr<'_>,
        req: &SellArgs<'_>,
    ) -> Result<SellReply> {
        let key = c.at(home).lock();
        let Some(guard) = locker.acquire(&key).await? else {
            // Counted as the contended give-ups (`fallbacks` in the lock figures).
            locker.stats().fallback();
            return Ok(SellReply::LockLost);
        };
        let result = async {
            let Some(fenced) = c.run(FenceRead { at: c.at(home) }).await? else {
                return Ok(SellReply::Stale);
            };
            self.pause().await;
            if guard.is_lost() {
                return Ok(SellReply::LockLost);
            }
            let written = sell_one(c, home, req, fenced.token).await;
            // A fenced write refused because a newer holder bumped the fence token.
            if let Ok(SellReply::LockLost) = &written {
                locker.stats().fenced();
            }
            written
        }
        .await;
        let _ = guard.release().await;
        result
    }

    /// `naive` (and `local-mutex` under its mutex): read, check, write — see the module docs.
    async fn naive(&self, c: &Conn, home: SegAddr<'_>, req: &SellArgs<'_>) -> Result<SellReply> {
        let Some(stock) = baseline_open(self.strategy, c, &home, req).await? else {
            return Ok(SellReply::Stale);
        };
        if req.qty == 0 {
            return Ok(SellReply::Applied {
                stock_after: stock.max(0) as u64,
            });
        }
        if stock < req.qty as i64 {
            return Ok(SellReply::Short {
                stock: stock.max(0) as u64,
            });
        }
        self.pause().await;
        let key = c.at(home).segment();
        let client = c.pool.next();
        let after: i64 = client.hincrby(&key, "stock", -(req.qty as i64)).await?;
        let _: i64 = client.hincrby(&key, "sold", req.qty as i64).await?;
        Ok(SellReply::Applied {
            stock_after: after.max(0) as u64,
        })
    }

    /// `decr-compensate`: decrement first, give back when it went negative — see the module
    /// docs.
    async fn decr_compensate(
        &self,
        c: &Conn,
        home: SegAddr<'_>,
        req: &SellArgs<'_>,
    ) -> Result<SellReply> {
        let Some(stock) = baseline_open(self.strategy, c, &home, req).await? else {
            return Ok(SellReply::Stale);
        };
        if req.qty == 0 {
            return Ok(SellReply::Applied {
                stock_after: stock.max(0) as u64,
            });
        }
        let key = c.at(home).segment();
        let client = c.pool.next();
        let q = req.qty as i64;
        let after: i64 = client.hincrby(&key, "stock", -q).await?;
        if after < 0 {
            let back: i64 = client.hincrby(&key, "stock", q).await?;
            return Ok(SellReply::Short {
                stock: back.max(0) as u64,
            });
        }
        let _: i64 = client.hincrby(&key, "sold", q).await?;
        Ok(SellReply::Applied {
            stock_after: after as u64,
        })
    }
}

/// `sell.lua` for one request, with its credits and `fence` (0: none).
async fn sell_one(
    c: &Conn,
    home: SegAddr<'_>,
    req: &SellArgs<'_>,
    fence: u64,
) -> Result<SellReply> {
    let head = SellHead::new(&c.at(home));
    let call = Sell {
        head: &head,
        fence,
        credits: req.credits,
        items: vec![SellItem::new(req)],
    };
    c.run(call)
        .await?
        .pop()
        .unwrap_or_else(|| Err(Error::Protocol("sell: no reply".into())))
}

/// The baselines' start: refuses what they cannot do (a reservation, a per-user limit), reads
/// the segment (`None`: missing or of another generation), credits `req.credits` with plain
/// commands, and answers the stock (below zero for a moment under the baselines).
async fn baseline_open(
    strategy: Strategy,
    c: &Conn,
    home: &SegAddr<'_>,
    req: &SellArgs<'_>,
) -> Result<Option<i64>> {
    if req.resv_ttl_ms > 0 && req.qty > 0 {
        return Err(Error::Config(format!(
            "the {strategy} baseline sells only: reservations need an exactly-once strategy (lua, lock, redlock)"
        )));
    }
    let at = c.at(*home);
    let client = c.pool.next();
    let v: Vec<Option<i64>> = client
        .hmget(at.segment(), vec!["gen", "stock", "lim"])
        .await?;
    let mut stock = match v.as_slice() {
        [Some(g), Some(stock), lim] if *g == home.generation as i64 => {
            if lim.is_some_and(|l| l > 0) {
                return Err(Error::Config(format!(
                    "the {strategy} baseline cannot enforce a per-user limit (it keeps no ledgers): use lua, lock or redlock"
                )));
            }
            *stock
        }
        _ => return Ok(None),
    };
    stock += credit_plain(c, home, req.credits).await? as i64;
    Ok(Some(stock))
}

/// The baselines' credits: each transfer id once (`HSETNX` on the credits hash), then its
/// units onto the stock and `tin` — separate commands, like everything the baselines do.
/// Answers the units credited now.
async fn credit_plain(c: &Conn, home: &SegAddr<'_>, credits: &[Credit]) -> Result<u64> {
    if credits.is_empty() {
        return Ok(0);
    }
    let at = c.at(*home);
    let (key, seg) = (at.credits(), at.segment());
    let client = c.pool.next();
    let mut added = 0;
    for cr in credits {
        let fresh: bool = client
            .hsetnx(&key, cr.id.to_string(), cr.units.to_string())
            .await?;
        if fresh {
            let _: i64 = client.hincrby(&seg, "stock", cr.units as i64).await?;
            let _: i64 = client.hincrby(&seg, "tin", cr.units as i64).await?;
            added += cr.units;
        }
    }
    Ok(added)
}

async fn local_mutex(
    c: &Conn,
    map: &DashMap<String, Arc<tokio::sync::Mutex<()>>>,
    seg: &SegAddr<'_>,
) -> tokio::sync::OwnedMutexGuard<()> {
    let m = Arc::clone(&*map.entry(c.at(*seg).segment()).or_default());
    m.lock_owned().await
}
