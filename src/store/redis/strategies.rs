//! How the two stock-taking steps (`deduct_home`, `take`) run under each [`Strategy`].
//!
//! `lua` is one script (or one coalesced call, see `batch`). `lock`/`redlock` take the
//! segment's lock, bump the segment's fence token and read (`fence_read.lua`), decide, and
//! write with a script that applies only while the fence token is still theirs. The baselines
//! reproduce the seed articles' designs, including their failures: `naive` and `local-mutex`
//! read, decide and write back with separate commands; `decr-compensate` decrements first
//! (`HINCRBY`) and adds back when it went negative; when it did not, the record and `sold` are
//! written by `deduct.lua`/`take.lua` mode "decr", which gives the units back and decides
//! atomically, so twins of one request id never both sell. The decrement and the compensation
//! stay separate commands: a crash or a re-sent command between them loses units — the
//! baseline is not exactly-once, and says so (`Strategy::exactly_once`).
//!
//! Every strategy keeps the same records, claims and audit counters, so the engine's routing,
//! fallback and exactly-once logic is shared, and an oversell shows up in the audit.

use super::batch::Batcher;
use super::lua::deduct::{Check, Deduct, Take};
use super::lua::lock::{FenceRead, Fenced};
use super::{CoalesceStats, Coalescing, Conn};
use crate::error::{Error, Result};
use crate::lock::{LockFigures, LockOptions, Locker};
use crate::store::{HomeReply, OnShort, ReqArgs, SegAddr, SegmentRole, TakeReply};
use crate::strategy::Strategy;
use dashmap::DashMap;
use fred::prelude::{HashesInterface, KeysInterface, Pool};
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
    /// Test and demo hook: a pause inside each critical section (between the read and the
    /// write), like the slow downstream call of the seed articles. Microseconds; 0 = none.
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

    /// `deduct_home` under the strategy.
    pub(super) async fn deduct_home(
        &self,
        c: &Conn,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        on_short: OnShort,
    ) -> Result<HomeReply> {
        match &self.mode {
            Mode::Lua(Some(b)) => b.submit(c, seg, req, on_short).await,
            // Boxed: the other paths' state (a lock's, above all) would otherwise be part of
            // every coalesced deduction's future too, which the engine builds and moves at
            // each of its layers, per request (see `lua::run_durable`).
            _ => Box::pin(self.deduct_home_other(c, seg, req, on_short)).await,
        }
    }

    /// `deduct_home` for every strategy but coalesced `lua` (it answers for that one too).
    async fn deduct_home_other(
        &self,
        c: &Conn,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        on_short: OnShort,
    ) -> Result<HomeReply> {
        let deduct = |on_short, check| {
            let at = c.at(seg);
            c.run(Deduct {
                at,
                req,
                on_short,
                check,
            })
        };
        match &self.mode {
            Mode::Lua(Some(b)) => b.submit(c, seg, req, on_short).await,
            Mode::Lua(None) => deduct(on_short, Check::Stock).await,
            Mode::Naive => self.naive_home(c, seg, req, on_short).await,
            Mode::LocalMutex(map) => {
                let _held = local_mutex(c, map, &seg).await;
                self.naive_home(c, seg, req, on_short).await
            }
            // DECRBY first (the articles' design, with its transient negatives); then the record
            // and `sold` are written by deduct.lua mode "decr", which gives the units back and
            // decides atomically — so a twin that also decremented replays instead of selling.
            Mode::DecrCompensate => match deduct(OnShort::Report, Check::RecordOnly).await? {
                HomeReply::Short { .. } => match decr(c, &seg, req.qty).await? {
                    Some(_) => deduct(on_short, Check::decremented()).await,
                    None => deduct(on_short, Check::RecordOnly).await,
                },
                other => Ok(other),
            },
            Mode::Locked(locker) => {
                let write = async |Fenced { token, stock }| {
                    let check = if stock >= req.qty as i64 {
                        Check::Fenced { token }
                    } else {
                        Check::RecordOnly
                    };
                    deduct(on_short, check).await
                };
                match self
                    .under_lock(c, locker, seg, HomeReply::Stale, write)
                    .await?
                {
                    Some(reply) => Ok(reply),
                    // Contended: don't queue on a hot segment; claim and let the router fall back.
                    None => Ok(match deduct(on_short, Check::RecordOnly).await? {
                        HomeReply::Short { claimed, .. } => HomeReply::Short { stock: 0, claimed },
                        other => other,
                    }),
                }
            }
        }
    }

    /// `take` under the strategy.
    pub(super) async fn take(
        &self,
        c: &Conn,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        part: u64,
        epoch: u64,
        role: SegmentRole,
    ) -> Result<TakeReply> {
        let take = |check| {
            c.run(Take {
                at: c.at(seg),
                req,
                part,
                epoch,
                role,
                check,
            })
        };
        // The claim's home part lives in the claim record: keep that path atomic for every
        // strategy (it is the engine's bookkeeping, not the strategy under study).
        match &self.mode {
            Mode::Lua(_) => take(Check::Stock).await,
            _ if role == SegmentRole::Home && !matches!(&self.mode, Mode::Locked(_)) => {
                take(Check::Stock).await
            }
            Mode::Naive => self.naive_take(c, seg, req, part, epoch).await,
            Mode::LocalMutex(map) => {
                let _held = local_mutex(c, map, &seg).await;
                self.naive_take(c, seg, req, part, epoch).await
            }
            Mode::DecrCompensate => match decr(c, &seg, part).await? {
                Some(_) => take(Check::decremented()).await,
                None => Ok(TakeReply::Short { stock: 0 }),
            },
            Mode::Locked(locker) => {
                let write = async |Fenced { token, stock }| {
                    if stock < part as i64 {
                        return Ok(TakeReply::Short {
                            stock: stock.max(0) as u64,
                        });
                    }
                    take(Check::Fenced { token }).await
                };
                let reply = self.under_lock(c, locker, seg, TakeReply::Stale, write);
                // Contended: the router falls back to another segment.
                Ok(reply.await?.unwrap_or(TakeReply::Short { stock: 0 }))
            }
        }
    }

    /// Runs `write` under `seg`'s lock, with the fence token and stock `fence_read.lua` gave
    /// this holder (`stale` when the segment is missing or of another generation). `None` when
    /// the lock stayed taken (contended: counted as a fallback).
    async fn under_lock<T>(
        &self,
        c: &Conn,
        locker: &Locker,
        seg: SegAddr<'_>,
        stale: T,
        write: impl AsyncFnOnce(Fenced) -> Result<T>,
    ) -> Result<Option<T>> {
        let key = c.at(seg).lock();
        let Some(guard) = locker.acquire(&key).await? else {
            locker.stats().fallback();
            return Ok(None);
        };
        let result = async {
            let Some(fenced) = c.run(FenceRead { at: c.at(seg) }).await? else {
                return Ok(stale);
            };
            self.pause().await;
            if guard.is_lost() {
                return Err(Error::LeaseLost(key.clone()));
            }
            let written = write(fenced).await;
            // A fenced write refused because a newer holder bumped the fence token.
            if let Err(Error::LeaseLost(_)) = &written {
                locker.stats().fenced();
            }
            written
        }
        .await;
        let _ = guard.release().await;
        result.map(Some)
    }

    /// Naive read-decide-write at the home segment (records are checked, non-atomically).
    async fn naive_home(
        &self,
        c: &Conn,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        on_short: OnShort,
    ) -> Result<HomeReply> {
        let deduct = |on_short| {
            c.run(Deduct {
                at: c.at(seg),
                req,
                on_short,
                check: Check::RecordOnly,
            })
        };
        let stock = match deduct(OnShort::Report).await? {
            HomeReply::Short { stock, .. } => read_stock(c, &seg).await?.unwrap_or(stock as i64),
            other => return Ok(other),
        };
        if stock < req.qty as i64 {
            return deduct(on_short).await;
        }
        self.pause().await;
        let stock_after = write_back(c, &seg, &req, stock, req.qty, 0, SegmentRole::Home).await?;
        Ok(HomeReply::Applied { stock_after })
    }

    async fn naive_take(
        &self,
        c: &Conn,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        part: u64,
        epoch: u64,
    ) -> Result<TakeReply> {
        let Some(stock) = read_stock(c, &seg).await? else {
            return Ok(TakeReply::Stale);
        };
        if stock < part as i64 {
            return Ok(TakeReply::Short {
                stock: stock.max(0) as u64,
            });
        }
        self.pause().await;
        let role = SegmentRole::Fallback;
        let stock_after = write_back(c, &seg, &req, stock, part, epoch, role).await?;
        Ok(TakeReply::Taken { stock_after, part })
    }
}

async fn read_stock(c: &Conn, seg: &SegAddr<'_>) -> Result<Option<i64>> {
    let v: Vec<Option<i64>> = c
        .pool
        .next()
        .hmget(c.at(*seg).segment(), vec!["gen", "stock"])
        .await?;
    Ok(match v.as_slice() {
        [Some(g), Some(stock)] if *g == seg.generation as i64 => Some(*stock),
        _ => None,
    })
}

/// The baselines' non-atomic sale of `units` from the `stock` the caller read: the stock
/// written back, then `sold` and the record, each a separate command (the record's fields and
/// letters as the scripts write them, see the tables in `lua`). Returns the stock written.
async fn write_back(
    c: &Conn,
    seg: &SegAddr<'_>,
    req: &ReqArgs<'_>,
    stock: i64,
    units: u64,
    epoch: u64,
    role: SegmentRole,
) -> Result<u64> {
    let client = c.pool.next();
    let at = c.at(*seg);
    let after = stock - units as i64;
    let _: i64 = client.hset(at.segment(), ("stock", after)).await?;
    let rq = at.record(req.request_id);
    let _: i64 = client.hincrby(at.segment(), "sold", units as i64).await?;
    let mut fields: Vec<(String, String)> = vec![
        ("s".into(), "A".into()),
        ("u".into(), req.user.to_string()),
        ("q".into(), req.qty.to_string()),
        ("e".into(), epoch.to_string()),
        ("k".into(), req.kind.code().into()),
    ];
    if role == SegmentRole::Home {
        fields.push(("parts".into(), format!("{}:{}", seg.index, units)));
    } else {
        fields.push(("p".into(), units.to_string()));
    }
    let _: i64 = client.hset(&rq, fields).await?;
    let _: bool = client.pexpire(&rq, req.ttl_ms as i64, None).await?;
    Ok(after as u64)
}

/// DECRBY first; add back when it went below zero.
async fn decr(c: &Conn, seg: &SegAddr<'_>, units: u64) -> Result<Option<u64>> {
    let key = c.at(*seg).segment();
    let client = c.pool.next();
    let after: i64 = client.hincrby(&key, "stock", -(units as i64)).await?;
    if after < 0 {
        let _: i64 = client.hincrby(&key, "stock", units as i64).await?;
        return Ok(None);
    }
    Ok(Some(after as u64))
}

async fn local_mutex(
    c: &Conn,
    map: &DashMap<String, Arc<tokio::sync::Mutex<()>>>,
    seg: &SegAddr<'_>,
) -> tokio::sync::OwnedMutexGuard<()> {
    let m = Arc::clone(&*map.entry(c.at(*seg).segment()).or_default());
    m.lock_owned().await
}
