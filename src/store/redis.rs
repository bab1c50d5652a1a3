//! `RedisStore`: the fred-backed store.
//!
//! Every mutating step is one `EVALSHA` of a script from `src/scripts/` (NOSCRIPT → `SCRIPT
//! LOAD` and retry, counted in
//! `shardstock_script_reloads_total`). All keys a script touches share one
//! hash tag, so the store works unchanged on a Redis Cluster. Reads that span segments
//! ([`Store::segments`]) are plain `HMGET`s sent concurrently: fred pipelines them, so reading
//! 16 segments costs about one round trip.
//!
//! fred re-sends in-flight commands after a reconnect (`max_command_attempts`), so a script can
//! run twice for one call. Every script is idempotent for its request id, which makes that safe.

use super::*;
use crate::error::Error;
use crate::segments::{Keyspace, decode_parts, encode_parts};
use fred::prelude::{
    Builder, ClientLike, Config, HashesInterface, KeysInterface, Pool, ReconnectPolicy,
};
use fred::types::Value;
use fred::types::scripts::Script;
use std::sync::Arc;

mod batch;
mod strategies;
pub use batch::{CoalesceStats, Coalescing};
use std::time::Duration;
use strategies::Mode;

macro_rules! script {
    ($file:literal) => {
        Script::from_lua(concat!(
            include_str!("../scripts/prelude.lua"),
            include_str!(concat!("../scripts/", $file))
        ))
    };
    // With the shared deduction core (deduct.lua and deduct_batch.lua).
    (core $file:literal) => {
        Script::from_lua(concat!(
            include_str!("../scripts/prelude.lua"),
            include_str!("../scripts/deduct_core.lua"),
            include_str!(concat!("../scripts/", $file))
        ))
    };
}

struct Scripts {
    deduct: Script,
    deduct_batch: Script,
    fence_read: Script,
    take: Script,
    settle: Script,
    refund: Script,
    fence: Script,
    takeover: Script,
    restock: Script,
    load_begin: Script,
    load_segment: Script,
    load_commit: Script,
    user_claim: Script,
    user_finish: Script,
    seal: Script,
    reserve_end: Script,
    reclaim: Script,
    drop_segment: Script,
    claims_due: Script,
    held: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            deduct: script!(core "deduct.lua"),
            deduct_batch: script!(core "deduct_batch.lua"),
            fence_read: script!("fence_read.lua"),
            take: script!("take.lua"),
            settle: script!("settle.lua"),
            refund: script!("refund.lua"),
            fence: script!("fence.lua"),
            takeover: script!("takeover.lua"),
            restock: script!("restock.lua"),
            load_begin: script!("load_begin.lua"),
            load_segment: script!("load_segment.lua"),
            load_commit: script!("load_commit.lua"),
            user_claim: script!("user_claim.lua"),
            user_finish: script!("user_finish.lua"),
            seal: script!("seal.lua"),
            reserve_end: script!("reserve_end.lua"),
            reclaim: script!("reclaim.lua"),
            drop_segment: script!("drop_segment.lua"),
            claims_due: script!("claims_due.lua"),
            held: script!("held.lua"),
        }
    }

    fn all(&self) -> [&Script; 20] {
        [
            &self.deduct,
            &self.deduct_batch,
            &self.fence_read,
            &self.take,
            &self.settle,
            &self.refund,
            &self.fence,
            &self.takeover,
            &self.restock,
            &self.load_begin,
            &self.load_segment,
            &self.load_commit,
            &self.user_claim,
            &self.user_finish,
            &self.seal,
            &self.reserve_end,
            &self.reclaim,
            &self.drop_segment,
            &self.claims_due,
            &self.held,
        ]
    }
}

/// The Redis store. Cheap to clone.
#[derive(Clone)]
pub struct RedisStore {
    pool: Pool,
    keys: Keyspace,
    scripts: Arc<Scripts>,
    mode: Arc<Mode>,
    /// Test and demo hook: a pause inside each critical section (between the read and the
    /// write), like the slow downstream call of the seed articles. Microseconds; 0 = none.
    pause_us: Arc<std::sync::atomic::AtomicU64>,
    /// The lock strategy runs over independent nodes.
    red: bool,
    /// Request coalescing of `lua` deductions (None = one script call per request).
    batcher: Option<Arc<batch::Batcher>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("keys", &self.keys)
            .field("pool_size", &self.pool.size())
            .finish()
    }
}

/// A script's reply as a tag and its fields.
struct Reply {
    tag: String,
    rest: Vec<Value>,
    script: &'static str,
}

impl Reply {
    fn parse(v: Value, script: &'static str) -> Result<Self> {
        let mut arr = match v {
            Value::Array(a) if !a.is_empty() => a,
            other => return Err(Error::Protocol(format!("{script}: reply {other:?}"))),
        };
        let rest = arr.split_off(1);
        let tag = arr[0]
            .as_string()
            .ok_or_else(|| Error::Protocol(format!("{script}: tag {:?}", arr[0])))?;
        Ok(Self { tag, rest, script })
    }

    fn u64(&self, i: usize) -> Result<u64> {
        self.rest
            .get(i)
            .and_then(Value::as_u64)
            .ok_or_else(|| self.bad())
    }

    /// A stock figure; the unsafe baselines can drive stock below zero for a moment, which
    /// reads as 0 (the audit still sees the real counters).
    fn stock(&self, i: usize) -> Result<u64> {
        self.rest
            .get(i)
            .and_then(Value::as_i64)
            .map(|v| v.max(0) as u64)
            .ok_or_else(|| self.bad())
    }

    fn str(&self, i: usize) -> Result<String> {
        self.rest
            .get(i)
            .and_then(Value::as_string)
            .ok_or_else(|| self.bad())
    }

    fn parts(&self, i: usize) -> Result<Vec<Part>> {
        decode_parts(&self.str(i)?).ok_or_else(|| self.bad())
    }

    fn field(&self, i: usize) -> Result<&'static str> {
        match self.str(i)?.as_str() {
            "user" => Ok("user"),
            "qty" => Ok("qty"),
            "kind" => Ok("kind"),
            _ => Err(self.bad()),
        }
    }

    fn bad(&self) -> Error {
        Error::Protocol(format!(
            "{}: reply {} {:?}",
            self.script, self.tag, self.rest
        ))
    }
}

/// Maps the scripts' argument errors back to typed errors.
fn script_error(e: fred::error::Error) -> Error {
    bad_argument(e.details()).unwrap_or(Error::Redis(e))
}

/// "… shardstock bad argument: <name>" as [`Error::Invalid`] naming the field.
fn bad_argument(d: &str) -> Option<Error> {
    const PREFIX: &str = "shardstock bad argument: ";
    let pos = d.find(PREFIX)?;
    let name = d[pos + PREFIX.len()..]
        .split_whitespace()
        .next()
        .unwrap_or("");
    let field = match name {
        "qty" => "qty",
        "user" => "user",
        "part" => "part",
        "gen" => "gen",
        _ => "argument",
    };
    Some(Error::invalid(field, format!("rejected by the store: {d}")))
}

impl RedisStore {
    /// Connects a pool of `pool_size` clients to `url` (`redis://host:port[/db]`) with a 5 s
    /// command timeout, and loads the scripts. Keys are named under `prefix`.
    ///
    /// # Errors
    /// [`Error::Redis`] when the URL is invalid or Redis is unreachable.
    pub async fn connect(url: &str, pool_size: usize, prefix: &str) -> Result<Self> {
        Self::connect_with(url, pool_size, prefix, Duration::from_secs(5)).await
    }

    /// Like [`connect`](Self::connect) with an explicit per-command timeout.
    ///
    /// Connections that drop are re-established forever with exponential backoff (10 ms to
    /// 1 s), and fred re-sends commands that were in flight (at most 3 attempts each). A
    /// command that cannot complete within `command_timeout` fails with [`Error::Redis`]: its
    /// outcome is then unknown and the caller retries with the same request id.
    ///
    /// # Errors
    /// [`Error::Redis`] when the URL is invalid or Redis is unreachable.
    pub async fn connect_with(
        url: &str,
        pool_size: usize,
        prefix: &str,
        command_timeout: Duration,
    ) -> Result<Self> {
        crate::ids::check_prefix(prefix)?;
        let config = Config::from_url(url)?;
        let pool = Builder::from_config(config)
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_secs(5);
                c.max_command_attempts = 3;
            })
            .with_performance_config(|p| {
                p.default_command_timeout = command_timeout;
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 10, 1000, 2))
            .build_pool(pool_size.max(1))?;
        pool.init().await?;
        let store = Self {
            pool,
            keys: Keyspace::new(prefix),
            scripts: Arc::new(Scripts::new()),
            mode: Arc::new(Mode::Lua),
            pause_us: Arc::default(),
            red: false,
            batcher: None,
        };
        store.load_scripts().await?;
        Ok(store)
    }

    /// `SCRIPT LOAD`s every script (also done lazily on NOSCRIPT).
    ///
    /// # Errors
    /// [`Error::Redis`].
    pub async fn load_scripts(&self) -> Result<()> {
        for s in self.scripts.all() {
            s.load(self.pool.next()).await?;
        }
        Ok(())
    }

    /// The underlying fred pool (for tests and tools).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Key names in use.
    pub fn keyspace(&self) -> &Keyspace {
        &self.keys
    }

    async fn eval(
        &self,
        script: &Script,
        name: &'static str,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Reply> {
        let v = self.eval_raw(script, name, keys, args).await?;
        Reply::parse(v, name)
    }

    async fn eval_raw(
        &self,
        script: &Script,
        name: &'static str,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Value> {
        // fred's `evalsha_with_reload`, spelled out so each NOSCRIPT reload is counted.
        use fred::prelude::LuaInterface;
        // As fred keys/values (byte buffers taken over without copying), cloning for the
        // NOSCRIPT retry costs a reference count per argument, not a copy.
        let keys: Vec<fred::types::Key> = keys.into_iter().map(Into::into).collect();
        let args: Vec<Value> = args.into_iter().map(Into::into).collect();
        let client = self.pool.next();
        match client
            .evalsha(script.sha1().clone(), keys.clone(), args.clone())
            .await
        {
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                crate::metrics::script_reload(name);
                script.load(client).await.map_err(script_error)?;
                client.evalsha(script.sha1().clone(), keys, args).await
            }
            r => r,
        }
        .map_err(script_error)
    }

    /// Turns request coalescing of `lua` deductions on (`Some`) or off (`None`) for this store
    /// and its clones made afterwards. See [`Coalescing`].
    ///
    /// # Errors
    /// [`Error::Config`] for out-of-range options.
    pub fn with_coalescing(mut self, opts: Option<Coalescing>) -> Result<Self> {
        if let Some(o) = &opts {
            o.validate()?;
        }
        self.batcher = opts.map(|o| Arc::new(batch::Batcher::new(o)));
        Ok(self)
    }

    fn seg_key(&self, seg: &SegAddr<'_>) -> String {
        self.keys.segment(seg.sku, seg.index)
    }

    /// KEYS of the segment-wide scripts (reclaim.lua, held.lua): the segment hash and its
    /// reservation index.
    fn seg_and_reservations(&self, seg: &SegAddr<'_>) -> Vec<String> {
        vec![
            self.seg_key(seg),
            self.keys.reservations(seg.sku, seg.index, seg.generation),
        ]
    }

    fn rq_key(&self, seg: &SegAddr<'_>, rid: &RequestId) -> String {
        self.keys.request(seg.sku, seg.index, seg.generation, rid)
    }

    /// `deduct.lua` in `mode` (`lua`, `claim` or `fenced` with `fence`; `decr` with `fence`
    /// carrying the decrement's one-time token).
    async fn lua_home(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        claim: bool,
        mode: &str,
        fence: u64,
    ) -> Result<HomeReply> {
        let mut keys = vec![
            self.seg_key(&seg),
            self.rq_key(&seg, req.request_id),
            self.keys.reservations(seg.sku, seg.index, seg.generation),
            self.keys.claims(seg.sku, seg.index, seg.generation),
        ];
        if mode == "decr" {
            keys.push(self.decr_token(&seg, fence));
        }
        let r = self
            .eval(
                &self.scripts.deduct,
                "deduct",
                keys,
                vec![
                    seg.generation.to_string(),
                    req.user.to_string(),
                    req.qty.to_string(),
                    seg.index.to_string(),
                    req.ttl_ms.to_string(),
                    req.lease_ms.to_string(),
                    b(claim),
                    mode.to_string(),
                    fence.to_string(),
                    req.resv_ttl_ms.to_string(),
                ],
            )
            .await?;
        self.home_reply(r, Some(&seg))
    }

    /// A `deduct.lua` reply (also one element of a `deduct_batch.lua` reply) as a [`HomeReply`].
    fn home_reply(&self, r: Reply, seg: Option<&SegAddr<'_>>) -> Result<HomeReply> {
        Ok(match r.tag.as_str() {
            "applied" => HomeReply::Applied {
                stock_after: r.stock(0)?,
            },
            "short" => HomeReply::Short {
                stock: r.stock(0)?,
                claimed: r.u64(1)? == 1,
            },
            "replay" => HomeReply::Replay(r.parts(0)?),
            "pending" => HomeReply::Pending {
                epoch: r.u64(0)?,
                lease_left_ms: r.u64(1)?,
            },
            "mismatch" => HomeReply::Mismatch(r.field(0)?),
            "stale" => HomeReply::Stale,
            "sealed" => HomeReply::Sealed,
            "lock_lost" => match seg {
                Some(seg) => return Err(self.lock_lost(seg)),
                None => return Err(r.bad()),
            },
            "bad" => return Err(bad_argument(&r.str(0)?).unwrap_or_else(|| r.bad())),
            _ => return Err(r.bad()),
        })
    }

    /// The one-time token of a decr-compensate decrement (same hash tag as the segment).
    fn decr_token(&self, seg: &SegAddr<'_>, nonce: u64) -> String {
        format!("{}:dt:{nonce}", self.seg_key(seg))
    }

    /// `take.lua` in `mode` (`lua` or `fenced` with `fence`; `decr` with `fence` carrying the
    /// decrement's one-time token).
    #[allow(clippy::too_many_arguments)]
    async fn lua_take(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        part: u64,
        epoch: u64,
        is_home: bool,
        mode: &str,
        fence: u64,
    ) -> Result<TakeReply> {
        let r = self
            .eval(
                &self.scripts.take,
                "take",
                {
                    let mut keys = vec![
                        self.seg_key(&seg),
                        self.rq_key(&seg, req.request_id),
                        self.keys.reservations(seg.sku, seg.index, seg.generation),
                    ];
                    if mode == "decr" {
                        keys.push(self.decr_token(&seg, fence));
                    }
                    keys
                },
                vec![
                    seg.generation.to_string(),
                    req.user.to_string(),
                    req.qty.to_string(),
                    part.to_string(),
                    epoch.to_string(),
                    req.ttl_ms.to_string(),
                    b(is_home),
                    mode.to_string(),
                    fence.to_string(),
                    req.resv_ttl_ms.to_string(),
                ],
            )
            .await?;
        Ok(match r.tag.as_str() {
            "taken" => TakeReply::Taken {
                stock_after: r.stock(0)?,
                part: r.u64(1)?,
            },
            "short" => TakeReply::Short { stock: r.stock(0)? },
            "fenced" => TakeReply::Fenced,
            "mismatch" => TakeReply::Mismatch(r.field(0)?),
            "stale" => TakeReply::Stale,
            "lock_lost" => return Err(self.lock_lost(&seg)),
            _ => return Err(r.bad()),
        })
    }

    /// Closes the connections.
    pub async fn quit(&self) {
        let _ = self.pool.quit().await;
    }
}

fn b(v: bool) -> String {
    if v { "1" } else { "0" }.to_string()
}

impl Store for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn strategy(&self) -> crate::strategy::Strategy {
        self.current_strategy()
    }

    fn lock_figures(&self) -> Option<crate::lock::LockFigures> {
        self.current_lock_figures()
    }

    fn coalescing(&self) -> Option<CoalesceStats> {
        match &*self.mode {
            Mode::Lua => self.batcher.as_ref().map(|b| b.stats()),
            _ => None,
        }
    }

    async fn load_begin(
        &self,
        sku: &Sku,
        segments: u32,
        total: u64,
        replace: bool,
        user_limit: u64,
    ) -> Result<LoadBegin> {
        let r = self
            .eval(
                &self.scripts.load_begin,
                "load_begin",
                vec![self.keys.meta(sku)],
                vec![
                    segments.to_string(),
                    total.to_string(),
                    b(replace),
                    user_limit.to_string(),
                ],
            )
            .await?;
        match r.tag.as_str() {
            "exists" => Ok(LoadBegin::Exists {
                generation: r.u64(0)?,
            }),
            "started" => Ok(LoadBegin::Started {
                generation: r.u64(0)?,
                old_segments: r.u64(1)? as u32,
            }),
            _ => Err(r.bad()),
        }
    }

    async fn load_segment(&self, seg: SegAddr<'_>, units: u64) -> Result<bool> {
        let r = self
            .eval(
                &self.scripts.load_segment,
                "load_segment",
                vec![self.seg_key(&seg)],
                vec![seg.generation.to_string(), units.to_string()],
            )
            .await?;
        match r.tag.as_str() {
            "ok" => Ok(true),
            "superseded" => Ok(false),
            _ => Err(r.bad()),
        }
    }

    async fn drop_segment(&self, seg: SegAddr<'_>) -> Result<()> {
        let r = self
            .eval(
                &self.scripts.drop_segment,
                "drop_segment",
                vec![self.seg_key(&seg)],
                vec![seg.generation.to_string()],
            )
            .await?;
        match r.tag.as_str() {
            "ok" | "kept" => Ok(()),
            _ => Err(r.bad()),
        }
    }

    async fn load_commit(&self, sku: &Sku, generation: u64) -> Result<bool> {
        let r = self
            .eval(
                &self.scripts.load_commit,
                "load_commit",
                vec![self.keys.meta(sku)],
                vec![generation.to_string()],
            )
            .await?;
        Ok(r.tag == "ok")
    }

    async fn meta(&self, sku: &Sku) -> Result<Option<Meta>> {
        let v: Vec<Option<String>> = self
            .pool
            .hmget(
                self.keys.meta(sku),
                vec!["gen", "segments", "loaded", "state", "limit"],
            )
            .await?;
        let num = |i: usize| -> Result<u64> {
            v[i].as_deref()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| Error::Protocol(format!("meta of {sku}: {v:?}")))
        };
        if v.first().is_none_or(Option::is_none) {
            return Ok(None);
        }
        Ok(Some(Meta {
            generation: num(0)?,
            segments: num(1)? as u32,
            loaded: num(2)?,
            ready: v[3].as_deref() == Some("ready"),
            user_limit: v[4].as_deref().and_then(|s| s.parse().ok()).unwrap_or(0),
        }))
    }

    async fn deduct_home(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        claim: bool,
    ) -> Result<HomeReply> {
        strategies::deduct_home(self, seg, req, claim).await
    }

    async fn take(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        part: u64,
        epoch: u64,
        is_home: bool,
    ) -> Result<TakeReply> {
        strategies::take(self, seg, req, part, epoch, is_home).await
    }

    async fn settle(
        &self,
        home: SegAddr<'_>,
        req: ReqArgs<'_>,
        epoch: u64,
        how: SettleAs<'_>,
    ) -> Result<SettleReply> {
        let (outcome, parts) = match how {
            SettleAs::Applied(p) => ("A", encode_parts(p)),
            SettleAs::Release => ("X", String::new()),
            SettleAs::Seal => ("S", String::new()),
        };
        let r = self
            .eval(
                &self.scripts.settle,
                "settle",
                vec![
                    self.rq_key(&home, req.request_id),
                    self.keys.claims(home.sku, home.index, home.generation),
                ],
                vec![
                    epoch.to_string(),
                    outcome.into(),
                    parts,
                    req.ttl_ms.to_string(),
                ],
            )
            .await?;
        Ok(match r.tag.as_str() {
            "ok" => SettleReply::Ok,
            "gone" => SettleReply::Gone,
            "superseded" if r.str(0)? == "A" => SettleReply::Applied(r.parts(1)?),
            "superseded" => SettleReply::Superseded,
            _ => return Err(r.bad()),
        })
    }

    async fn refund(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        epoch: u64,
        is_home: bool,
    ) -> Result<u64> {
        let r = self
            .eval(
                &self.scripts.refund,
                "refund",
                vec![
                    self.seg_key(&seg),
                    self.rq_key(&seg, req.request_id),
                    self.keys.reservations(seg.sku, seg.index, seg.generation),
                ],
                vec![seg.generation.to_string(), epoch.to_string(), b(is_home)],
            )
            .await?;
        match r.tag.as_str() {
            "refunded" => r.u64(0),
            "stale" => Ok(0),
            _ => Err(r.bad()),
        }
    }

    async fn fence(&self, seg: SegAddr<'_>, req: ReqArgs<'_>, epoch: u64) -> Result<FenceReply> {
        let r = self
            .eval(
                &self.scripts.fence,
                "fence",
                vec![self.rq_key(&seg, req.request_id)],
                vec![
                    epoch.to_string(),
                    req.user.to_string(),
                    req.qty.to_string(),
                    req.ttl_ms.to_string(),
                    req.kind.code().to_string(),
                ],
            )
            .await?;
        Ok(match r.tag.as_str() {
            "clear" => FenceReply::Clear,
            "applied" => FenceReply::Applied { part: r.u64(0)? },
            "fenced" => FenceReply::Fenced,
            "mismatch" => FenceReply::Mismatch(r.field(0)?),
            _ => return Err(r.bad()),
        })
    }

    async fn takeover(&self, home: SegAddr<'_>, req: ReqArgs<'_>) -> Result<TakeoverReply> {
        let r = self
            .eval(
                &self.scripts.takeover,
                "takeover",
                vec![
                    self.rq_key(&home, req.request_id),
                    self.keys.claims(home.sku, home.index, home.generation),
                ],
                vec![
                    req.user.to_string(),
                    req.qty.to_string(),
                    req.lease_ms.to_string(),
                    req.kind.code().to_string(),
                ],
            )
            .await?;
        Ok(match r.tag.as_str() {
            "won" => TakeoverReply::Won {
                epoch: r.u64(0)?,
                home_part: r.u64(1)?,
            },
            "pending" => TakeoverReply::Pending {
                epoch: r.u64(0)?,
                lease_left_ms: r.u64(1)?,
            },
            "replay" => TakeoverReply::Replay(r.parts(0)?),
            "gone" => TakeoverReply::Gone,
            "sealed" => TakeoverReply::Sealed,
            "mismatch" => TakeoverReply::Mismatch(r.field(0)?),
            _ => return Err(r.bad()),
        })
    }

    async fn restock(
        &self,
        seg: SegAddr<'_>,
        request_id: &RequestId,
        qty: u64,
        total: u64,
        ttl_ms: u64,
    ) -> Result<RestockReply> {
        let r = self
            .eval(
                &self.scripts.restock,
                "restock",
                vec![
                    self.seg_key(&seg),
                    self.keys
                        .restock(seg.sku, seg.index, seg.generation, request_id),
                ],
                vec![
                    seg.generation.to_string(),
                    qty.to_string(),
                    ttl_ms.to_string(),
                    total.to_string(),
                ],
            )
            .await?;
        Ok(match r.tag.as_str() {
            "restocked" => RestockReply::Restocked {
                stock_after: r.u64(0)?,
            },
            "replay" => RestockReply::Replay { stock: r.u64(0)? },
            "mismatch" => RestockReply::Mismatch,
            "stale" => RestockReply::Stale,
            _ => return Err(r.bad()),
        })
    }

    async fn user_claim(
        &self,
        sku: &Sku,
        generation: u64,
        req: ReqArgs<'_>,
        limit: u64,
        claim_ttl_ms: u64,
    ) -> Result<UserClaim> {
        let r = self
            .eval(
                &self.scripts.user_claim,
                "user_claim",
                vec![self.keys.user(sku, generation, req.user)],
                vec![
                    req.request_id.to_string(),
                    req.qty.to_string(),
                    limit.to_string(),
                    claim_ttl_ms.to_string(),
                    req.ttl_ms.to_string(),
                    req.kind.code().to_string(),
                ],
            )
            .await?;
        Ok(match r.tag.as_str() {
            "ok" => UserClaim::Ok,
            "dup" => UserClaim::Dup {
                sold: r.str(0)? == "S",
            },
            "mismatch" => UserClaim::Mismatch(r.field(0)?),
            "limit" => {
                let stale = r.str(1).unwrap_or_default();
                let mut stale = stale
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|e| {
                        // "<rid>:<qty>:<state>:<kind>"; a request id may itself hold ':'.
                        let mut it = e.rsplitn(4, ':');
                        let (Some(kind), Some(state), Some(q), Some(rid)) =
                            (it.next(), it.next(), it.next(), it.next())
                        else {
                            return Err(r.bad());
                        };
                        Ok(StaleEntry {
                            request_id: RequestId::new(rid).map_err(|_| r.bad())?,
                            qty: q.parse().map_err(|_| r.bad())?,
                            reserved: state == "R",
                            kind: RequestKind::from_code(kind).ok_or_else(|| r.bad())?,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                stale.sort();
                UserClaim::Limit {
                    used: r.u64(0)?,
                    final_used: r.u64(2)?,
                    fresh_pending: r.u64(3)?,
                    stale,
                }
            }
            _ => return Err(r.bad()),
        })
    }

    async fn user_finish(
        &self,
        sku: &Sku,
        generation: u64,
        req: ReqArgs<'_>,
        how: UserFinish,
    ) -> Result<()> {
        let action = match how {
            UserFinish::Sold => "sold",
            UserFinish::Reserved => "reserved",
            UserFinish::Void => "void",
        };
        let r = self
            .eval(
                &self.scripts.user_finish,
                "user_finish",
                vec![self.keys.user(sku, generation, req.user)],
                vec![
                    req.request_id.to_string(),
                    action.to_string(),
                    req.qty.to_string(),
                    req.kind.code().to_string(),
                    req.ttl_ms.to_string(),
                ],
            )
            .await?;
        match r.tag.as_str() {
            "ok" | "absent" => Ok(()),
            _ => Err(r.bad()),
        }
    }

    async fn reserve_end(
        &self,
        seg: SegAddr<'_>,
        request_id: &RequestId,
        confirm: Option<bool>,
    ) -> Result<ReserveEnd> {
        let action = match confirm {
            Some(true) => "confirm",
            Some(false) => "cancel",
            None => "peek",
        };
        let r = self
            .eval(
                &self.scripts.reserve_end,
                "reserve_end",
                vec![
                    self.seg_key(&seg),
                    self.rq_key(&seg, request_id),
                    self.keys.reservations(seg.sku, seg.index, seg.generation),
                ],
                vec![seg.generation.to_string(), action.to_string()],
            )
            .await?;
        let state = |s: &str| -> Result<ResvState> {
            Ok(match s {
                "R" => ResvState::Reserved,
                "C" => ResvState::Confirmed,
                "K" => ResvState::Cancelled,
                "X" => ResvState::Expired,
                _ => return Err(r.bad()),
            })
        };
        Ok(match r.tag.as_str() {
            "done" => ReserveEnd::Done {
                state: state(&r.str(0)?)?,
                user: r.str(1)?,
                units: r.u64(2)?,
            },
            "ended" => ReserveEnd::Ended {
                state: state(&r.str(0)?)?,
                user: r.str(1)?,
                units: r.u64(2)?,
            },
            "unknown" => ReserveEnd::Unknown,
            "stale" => ReserveEnd::Stale,
            _ => return Err(r.bad()),
        })
    }

    async fn reclaim(&self, seg: SegAddr<'_>) -> Result<(u64, u64)> {
        let r = self
            .eval(
                &self.scripts.reclaim,
                "reclaim",
                self.seg_and_reservations(&seg),
                vec![seg.generation.to_string()],
            )
            .await?;
        match r.tag.as_str() {
            "reclaimed" => Ok((r.u64(0)?, r.u64(1)?)),
            "stale" => Ok((0, 0)),
            _ => Err(r.bad()),
        }
    }

    async fn seal(&self, home: SegAddr<'_>, req: ReqArgs<'_>) -> Result<SealReply> {
        let r = self
            .eval(
                &self.scripts.seal,
                "seal",
                vec![self.rq_key(&home, req.request_id)],
                vec![
                    req.user.to_string(),
                    req.qty.to_string(),
                    req.ttl_ms.to_string(),
                    req.kind.code().to_string(),
                ],
            )
            .await?;
        Ok(match r.tag.as_str() {
            "sealed" => SealReply::Sealed,
            "applied" => SealReply::Applied,
            "pending" => SealReply::Pending {
                lease_left_ms: r.u64(0)?,
            },
            "mismatch" => SealReply::Mismatch(r.field(0)?),
            _ => return Err(r.bad()),
        })
    }

    async fn segments(
        &self,
        sku: &Sku,
        generation: u64,
        segments: u32,
    ) -> Result<Vec<Option<SegmentState>>> {
        let reads = (0..segments).map(|i| {
            let key = self.keys.segment(sku, i);
            async move {
                // i64: the unsafe baselines can drive stock below zero for a moment; it reads
                // as 0 and the audit, comparing counters, reports the hole.
                let v: Vec<Option<i64>> = self
                    .pool
                    .next()
                    .hmget(
                        key,
                        vec!["gen", "stock", "sold", "loaded", "restocked", "reserved"],
                    )
                    .await?;
                let u = |x: &i64| (*x).max(0) as u64;
                Ok::<_, Error>(match v.as_slice() {
                    [
                        Some(g),
                        Some(stock),
                        Some(sold),
                        Some(loaded),
                        Some(restocked),
                        reserved,
                    ] if *g == generation as i64 => Some(SegmentState {
                        stock: u(stock),
                        sold: u(sold),
                        loaded: u(loaded),
                        restocked: u(restocked),
                        reserved: reserved.as_ref().map_or(0, u),
                    }),
                    _ => None,
                })
            }
        });
        futures::future::try_join_all(reads).await
    }

    async fn record(
        &self,
        home: SegAddr<'_>,
        request_id: &RequestId,
    ) -> Result<Option<HomeRecord>> {
        let key = self.rq_key(&home, request_id);
        let flat: std::collections::HashMap<String, String> = self.pool.next().hgetall(key).await?;
        if flat.is_empty() {
            return Ok(None);
        }
        let bad = || Error::Protocol(format!("record {flat:?}"));
        let get = |k: &str| flat.get(k).cloned().unwrap_or_default();
        let qty = get("q").parse().map_err(|_| bad())?;
        let kind = RequestKind::from_code(&get("k")).ok_or_else(bad)?;
        let state = match get("s").as_str() {
            "A" => RecordState::Applied(decode_parts(&get("parts")).ok_or_else(bad)?),
            "P" => RecordState::Pending {
                epoch: get("e").parse().map_err(|_| bad())?,
            },
            "X" => RecordState::Sealed,
            _ => return Err(bad()),
        };
        Ok(Some(HomeRecord {
            user: get("u"),
            qty,
            kind,
            state,
        }))
    }

    async fn claims_due(
        &self,
        seg: SegAddr<'_>,
        max: usize,
        grace_ms: u64,
    ) -> Result<Vec<DueClaim>> {
        let v = self
            .eval_raw(
                &self.scripts.claims_due,
                "claims_due",
                vec![self.keys.claims(seg.sku, seg.index, seg.generation)],
                vec![max.clamp(1, 1000).to_string(), grace_ms.to_string()],
            )
            .await?;
        let bad = || Error::Protocol(format!("claims_due: reply {v:?}"));
        let items: Vec<String> = match &v {
            Value::Array(a) => a
                .iter()
                .map(|x| x.as_string().ok_or_else(bad))
                .collect::<Result<_>>()?,
            Value::Null => Vec::new(),
            _ => return Err(bad()),
        };
        items
            .chunks(4)
            .map(|c| match c {
                [rid, user, qty, kind] => Ok(DueClaim {
                    request_id: RequestId::new(rid.as_str()).map_err(|_| bad())?,
                    user: UserId::new(user.as_str()).map_err(|_| bad())?,
                    qty: qty.parse().map_err(|_| bad())?,
                    kind: RequestKind::from_code(kind).ok_or_else(bad)?,
                }),
                _ => Err(bad()),
            })
            .collect()
    }

    async fn held(&self, seg: SegAddr<'_>) -> Result<Option<HeldState>> {
        let r = self
            .eval(
                &self.scripts.held,
                "held",
                self.seg_and_reservations(&seg),
                vec![seg.generation.to_string()],
            )
            .await?;
        match r.tag.as_str() {
            "held" => Ok(Some(HeldState {
                state: SegmentState {
                    stock: r.stock(0)?,
                    sold: r.stock(1)?,
                    loaded: r.u64(2)?,
                    restocked: r.u64(3)?,
                    reserved: r.stock(4)?,
                },
                held: r.u64(5)?,
                live: r.u64(6)?,
                orphans: r.u64(7)?,
            })),
            "stale" => Ok(None),
            _ => Err(r.bad()),
        }
    }
}
