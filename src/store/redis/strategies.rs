//! How one segment step runs under each [`Strategy`].
//!
//! `lua` is one script. `lock`/`redlock` take the segment's lock, bump the segment's fence,
//! read, decide, and write with a script that applies only while the fence is still theirs.
//! The baselines reproduce the seed articles' designs, including their failures: `naive` and
//! `local-mutex` read, decide and write back with separate commands; `decr-compensate`
//! decrements first (`HINCRBY`) and adds back when it went negative; when it did not, the
//! record and `sold` are written by `deduct.lua`/`take.lua` mode "decr", which gives the units
//! back and decides atomically, so twins of one request id never both sell. The decrement and
//! the compensation stay separate commands: a crash or a re-sent command between them loses
//! units — the baseline is not exactly-once, and says so (`Strategy::exactly_once`).
//!
//! Every strategy keeps the same records, claims and audit counters, so the engine's routing,
//! fallback and exactly-once logic is shared, and an oversell shows up in the audit.

use super::*;
use crate::lock::{LockFigures, LockOptions, Locker};
use crate::strategy::Strategy;
use dashmap::DashMap;
use std::sync::atomic::Ordering::Relaxed;

/// The strategy a [`RedisStore`] runs, with what it needs.
pub(super) enum Mode {
    Lua,
    Locked(Locker),
    Naive,
    LocalMutex(DashMap<String, Arc<tokio::sync::Mutex<()>>>),
    DecrCompensate,
}

impl Mode {
    fn strategy(&self, red: bool) -> Strategy {
        match self {
            Mode::Lua => Strategy::Lua,
            Mode::Locked(_) if red => Strategy::Redlock,
            Mode::Locked(_) => Strategy::Lock,
            Mode::Naive => Strategy::Naive,
            Mode::LocalMutex(_) => Strategy::LocalMutex,
            Mode::DecrCompensate => Strategy::DecrCompensate,
        }
    }
}

impl RedisStore {
    /// Switches this store (and its clones made afterwards) to `strategy`. `lock` uses this
    /// store's Redis for the locks; `redlock` needs `lock_nodes` (3 or 5 independent nodes).
    ///
    /// # Errors
    /// [`Error::Config`] for bad lock options or node lists; [`Error::Redis`] for bad URLs.
    pub async fn with_strategy(
        mut self,
        strategy: Strategy,
        lock: LockOptions,
        lock_nodes: &[String],
    ) -> Result<Self> {
        lock.validate()?;
        if strategy != Strategy::Redlock && !lock_nodes.is_empty() {
            return Err(Error::Config(
                "lock nodes are only used by the redlock strategy".into(),
            ));
        }
        self.mode = Arc::new(match strategy {
            Strategy::Lua => Mode::Lua,
            Strategy::Lock => Mode::Locked(Locker::single(self.pool.clone(), lock)),
            Strategy::Redlock => {
                if lock_nodes.is_empty() {
                    return Err(Error::Config(
                        "the redlock strategy needs lock nodes (--lock-nodes URL,URL,URL)".into(),
                    ));
                }
                Mode::Locked(Locker::redlock(lock_nodes, lock).await?)
            }
            Strategy::Naive => Mode::Naive,
            Strategy::LocalMutex => Mode::LocalMutex(DashMap::new()),
            Strategy::DecrCompensate => Mode::DecrCompensate,
        });
        self.red = strategy == Strategy::Redlock;
        Ok(self)
    }

    pub(super) fn current_strategy(&self) -> Strategy {
        self.mode.strategy(self.red)
    }

    pub(super) fn current_lock_figures(&self) -> Option<LockFigures> {
        match &*self.mode {
            Mode::Locked(l) => Some(l.stats().figures()),
            _ => None,
        }
    }

    /// Makes every critical section (lock strategies: between read and fenced write; naive
    /// baselines: between read and write-back) pause for `d` — the slow downstream call of the
    /// seed articles. For tests and demonstrations.
    pub fn set_critical_section_pause(&self, d: Duration) {
        self.pause_us.store(d.as_micros() as u64, Relaxed);
    }

    async fn pause(&self) {
        let us = self.pause_us.load(Relaxed);
        if us > 0 {
            tokio::time::sleep(Duration::from_micros(us)).await;
        }
    }

    pub(super) fn lock_lost(&self, seg: &SegAddr<'_>) -> Error {
        if let Mode::Locked(l) = &*self.mode {
            l.stats().fenced();
        }
        Error::LeaseLost(self.keys.lock(seg.sku, seg.index))
    }

    /// Bumps the segment's fence (every acquisition does) and reads generation and stock: one
    /// script, one round trip.
    async fn fence_and_read(&self, seg: &SegAddr<'_>) -> Result<Option<(u64, i64)>> {
        let v = self
            .eval_raw(
                &self.scripts.fence_read,
                "fence_read",
                vec![self.seg_key(seg)],
                vec![],
            )
            .await?;
        let bad = || Error::Protocol(format!("fence_read: reply {v:?}"));
        let Value::Array(a) = &v else {
            return Err(bad());
        };
        let fence = a.first().and_then(Value::as_u64).ok_or_else(bad)?;
        let num = |i: usize| a.get(i).and_then(Value::as_i64);
        Ok(match (num(1), num(2)) {
            (Some(g), Some(stock)) if g == seg.generation as i64 => Some((fence, stock)),
            _ => None,
        })
    }

    async fn read_stock(&self, seg: &SegAddr<'_>) -> Result<Option<i64>> {
        let v: Vec<Option<i64>> = self
            .pool
            .next()
            .hmget(self.seg_key(seg), vec!["gen", "stock"])
            .await?;
        Ok(match v.as_slice() {
            [Some(g), Some(stock)] if *g == seg.generation as i64 => Some(*stock),
            _ => None,
        })
    }

    /// The baselines' non-atomic sale: counters and record with separate commands.
    async fn record_sale(
        &self,
        seg: &SegAddr<'_>,
        req: &ReqArgs<'_>,
        units: u64,
        epoch: u64,
        home: bool,
    ) -> Result<()> {
        let client = self.pool.next();
        let rq = self.rq_key(seg, req.request_id);
        let _: i64 = client
            .hincrby(self.seg_key(seg), "sold", units as i64)
            .await?;
        let mut fields: Vec<(String, String)> = vec![
            ("s".into(), "A".into()),
            ("u".into(), req.user.to_string()),
            ("q".into(), req.qty.to_string()),
            ("e".into(), epoch.to_string()),
            ("k".into(), req.kind.code().into()),
        ];
        if home {
            fields.push(("parts".into(), format!("{}:{}", seg.index, units)));
        } else {
            fields.push(("p".into(), units.to_string()));
        }
        let _: i64 = client.hset(&rq, fields).await?;
        let _: bool = client.pexpire(&rq, req.ttl_ms as i64, None).await?;
        Ok(())
    }

    /// Naive read-decide-write at the home segment (records are checked, non-atomically).
    async fn naive_home(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        claim: bool,
    ) -> Result<HomeReply> {
        let stock = match self.lua_home(seg, req, false, "claim", 0).await? {
            HomeReply::Short { stock, .. } => self.read_stock(&seg).await?.unwrap_or(stock as i64),
            other => return Ok(other),
        };
        if stock < req.qty as i64 {
            return self.lua_home(seg, req, claim, "claim", 0).await;
        }
        self.pause().await;
        let after = stock - req.qty as i64;
        let _: i64 = self
            .pool
            .next()
            .hset(self.seg_key(&seg), ("stock", after))
            .await?;
        self.record_sale(&seg, &req, req.qty, 0, true).await?;
        Ok(HomeReply::Applied {
            stock_after: after as u64,
        })
    }

    async fn naive_take(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        part: u64,
        epoch: u64,
    ) -> Result<TakeReply> {
        let Some(stock) = self.read_stock(&seg).await? else {
            return Ok(TakeReply::Stale);
        };
        if stock < part as i64 {
            return Ok(TakeReply::Short {
                stock: stock.max(0) as u64,
            });
        }
        self.pause().await;
        let after = stock - part as i64;
        let _: i64 = self
            .pool
            .next()
            .hset(self.seg_key(&seg), ("stock", after))
            .await?;
        self.record_sale(&seg, &req, part, epoch, false).await?;
        Ok(TakeReply::Taken {
            stock_after: after as u64,
            part,
        })
    }

    /// DECRBY first; add back when it went below zero.
    async fn decr(&self, seg: &SegAddr<'_>, units: u64) -> Result<Option<u64>> {
        let key = self.seg_key(seg);
        let client = self.pool.next();
        let after: i64 = client.hincrby(&key, "stock", -(units as i64)).await?;
        if after < 0 {
            let _: i64 = client.hincrby(&key, "stock", units as i64).await?;
            return Ok(None);
        }
        Ok(Some(after as u64))
    }

    async fn local_mutex(
        &self,
        map: &DashMap<String, Arc<tokio::sync::Mutex<()>>>,
        seg: &SegAddr<'_>,
    ) -> tokio::sync::OwnedMutexGuard<()> {
        let m = Arc::clone(&*map.entry(self.seg_key(seg)).or_default());
        m.lock_owned().await
    }
}

/// `deduct_home` under the store's strategy.
pub(super) async fn deduct_home(
    s: &RedisStore,
    seg: SegAddr<'_>,
    req: ReqArgs<'_>,
    claim: bool,
) -> Result<HomeReply> {
    match &*s.mode {
        Mode::Lua => match &s.batcher {
            Some(b) => b.submit(s, seg, req, claim).await,
            None => s.lua_home(seg, req, claim, "lua", 0).await,
        },
        Mode::Naive => s.naive_home(seg, req, claim).await,
        Mode::LocalMutex(map) => {
            let _held = s.local_mutex(map, &seg).await;
            s.naive_home(seg, req, claim).await
        }
        // DECRBY first (the articles' design, with its transient negatives); then the record
        // and `sold` are written by deduct.lua mode "decr", which gives the units back and
        // decides atomically — so a twin that also decremented replays instead of selling.
        Mode::DecrCompensate => match s.lua_home(seg, req, false, "claim", 0).await? {
            HomeReply::Short { .. } => match s.decr(&seg, req.qty).await? {
                Some(_) => {
                    s.lua_home(
                        seg,
                        req,
                        claim,
                        "decr",
                        fastrand::u64(1..1_000_000_000_000_000),
                    )
                    .await
                }
                None => s.lua_home(seg, req, claim, "claim", 0).await,
            },
            other => Ok(other),
        },
        Mode::Locked(locker) => {
            let key = s.keys.lock(seg.sku, seg.index);
            let Some(guard) = locker.acquire(&key).await? else {
                // Contended: don't queue on a hot segment; claim and let the router fall back.
                locker.stats().fallback();
                return Ok(match s.lua_home(seg, req, claim, "claim", 0).await? {
                    HomeReply::Short { claimed, .. } => HomeReply::Short { stock: 0, claimed },
                    other => other,
                });
            };
            let result = async {
                let Some((fence, stock)) = s.fence_and_read(&seg).await? else {
                    return Ok(HomeReply::Stale);
                };
                s.pause().await;
                if guard.is_lost() {
                    return Err(Error::LeaseLost(key.clone()));
                }
                let mode = if stock >= req.qty as i64 {
                    "fenced"
                } else {
                    "claim"
                };
                s.lua_home(seg, req, claim, mode, fence).await
            }
            .await;
            let _ = guard.release().await;
            result
        }
    }
}

/// `take` under the store's strategy.
pub(super) async fn take(
    s: &RedisStore,
    seg: SegAddr<'_>,
    req: ReqArgs<'_>,
    part: u64,
    epoch: u64,
    is_home: bool,
) -> Result<TakeReply> {
    // The claim's home part lives in the claim record: keep that path atomic for every
    // strategy (it is the engine's bookkeeping, not the strategy under study).
    match &*s.mode {
        Mode::Lua => s.lua_take(seg, req, part, epoch, is_home, "lua", 0).await,
        _ if is_home && !matches!(&*s.mode, Mode::Locked(_)) => {
            s.lua_take(seg, req, part, epoch, is_home, "lua", 0).await
        }
        Mode::Naive => s.naive_take(seg, req, part, epoch).await,
        Mode::LocalMutex(map) => {
            let _held = s.local_mutex(map, &seg).await;
            s.naive_take(seg, req, part, epoch).await
        }
        Mode::DecrCompensate => match s.decr(&seg, part).await? {
            Some(_) => {
                let token = fastrand::u64(1..1_000_000_000_000_000);
                s.lua_take(seg, req, part, epoch, is_home, "decr", token)
                    .await
            }
            None => Ok(TakeReply::Short { stock: 0 }),
        },
        Mode::Locked(locker) => {
            let key = s.keys.lock(seg.sku, seg.index);
            let Some(guard) = locker.acquire(&key).await? else {
                locker.stats().fallback();
                return Ok(TakeReply::Short { stock: 0 });
            };
            let result = async {
                let Some((fence, stock)) = s.fence_and_read(&seg).await? else {
                    return Ok(TakeReply::Stale);
                };
                s.pause().await;
                if guard.is_lost() {
                    return Err(Error::LeaseLost(key.clone()));
                }
                if stock < part as i64 {
                    return Ok(TakeReply::Short {
                        stock: stock.max(0) as u64,
                    });
                }
                s.lua_take(seg, req, part, epoch, is_home, "fenced", fence)
                    .await
            }
            .await;
            let _ = guard.release().await;
            result
        }
    }
}
