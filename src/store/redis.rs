//! `RedisStore`: the fred-backed store.
//!
//! Every mutating step is one script of [`lua`] (one `EVALSHA`; a `NOSCRIPT` answer reloads
//! the script, counted in `shardstock_script_reloads_total`). All keys a script touches share
//! one hash tag, so the store works unchanged on a Redis Cluster. Reads that span segments
//! ([`Store::segments`]) are plain `HMGET`s sent concurrently: fred pipelines them, so reading
//! 16 segments costs about one round trip.
//!
//! fred re-sends in-flight commands after a reconnect (`max_command_attempts`), so a script can
//! run twice for one call. Every script is idempotent for its request id, which makes that safe.
//!
//! # Layout
//! - this file: [`RedisStore`] and its [`Store`] steps, each one typed call of [`lua`];
//! - `builder`: [`RedisStoreBuilder`] (connection, strategy, request coalescing);
//! - `strategies`: how `deduct_home` and `take` run under each [`crate::Strategy`];
//! - `batch`: request coalescing of `lua` deductions ([`Coalescing`]);
//! - `wait`: durability mode, `WAIT` for replicas after each mutating call;
//! - [`lua`]: the script registry, the one `eval` path, each script's call, the stored letters.

use super::*;
use crate::error::Error;
use crate::placement::{self, Placement, SegmentHome, SlotMap};
use crate::segments::{Keyspace, decode_parts};
use fred::prelude::{Client, ClientLike, HashesInterface, Pool};
use lua::{Call, SegmentKeys, claim, deduct, segment, user};
use std::sync::Arc;

mod batch;
mod builder;
mod invalidate;
pub mod lua;
pub(crate) mod moving;
pub(crate) mod outbox;
mod strategies;
mod wait;

pub use batch::{CoalesceStats, Coalescing};
pub use builder::RedisStoreBuilder;
use strategies::Runner;
pub(crate) use wait::check as check_durability;

/// The connection and the key names: what every script call runs on.
#[derive(Clone)]
pub(crate) struct Conn {
    pool: Pool,
    keys: Keyspace,
    /// Durability mode: replicas each mutating call waits for (`None`: off).
    durable: Option<Arc<wait::Durable>>,
}

impl Conn {
    /// The keys of segment `seg`.
    fn at<'a>(&'a self, seg: SegAddr<'a>) -> SegmentKeys<'a> {
        SegmentKeys {
            keys: &self.keys,
            seg,
        }
    }

    /// Runs `call` on the next client of the pool (in durability mode, with its `WAIT` on
    /// the same client).
    async fn run<C: Call>(&self, call: C) -> Result<C::Output> {
        lua::run_durable(self.pool.next(), call, self.durable.as_ref()).await
    }
}

/// The Redis store. Cheap to clone. Built with [`RedisStore::builder`] (or
/// [`crate::Config::build_store`]).
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    /// The strategy and what it needs (locks, coalescing lanes); shared by clones.
    runner: Arc<Runner>,
    /// The stock-notification subscriber (`None` on a cluster); shared by clones.
    subscriber: Option<Arc<invalidate::Subscriber>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("keys", &self.conn.keys)
            .field("pool_size", &self.conn.pool.size())
            .field("strategy", &self.runner.strategy())
            .finish()
    }
}

impl RedisStore {
    /// A builder for a store on `url` (`redis://host:port[/db]`); see [`RedisStoreBuilder`].
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::new(url)
    }

    /// `SCRIPT LOAD`s every script (also done lazily on NOSCRIPT).
    ///
    /// # Errors
    /// [`Error::Redis`].
    pub async fn load_scripts(&self) -> Result<()> {
        lua::load(self.conn.pool.next(), lua::Script::ALL).await
    }

    /// The underlying fred pool (for tests and tools).
    pub fn pool(&self) -> &Pool {
        &self.conn.pool
    }

    /// Key names in use.
    pub fn keyspace(&self) -> &Keyspace {
        &self.conn.keys
    }

    /// Makes every critical section (lock strategies: between read and fenced write; naive
    /// baselines: between read and write-back) pause for `d` — the slow downstream call of the
    /// seed articles. For tests and demonstrations; affects every clone of this store.
    pub fn set_critical_section_pause(&self, d: std::time::Duration) {
        self.runner.set_pause(d);
    }

    /// Closes the connections.
    pub async fn quit(&self) {
        let _ = self.conn.pool.quit().await;
    }

    fn at<'a>(&'a self, seg: SegAddr<'a>) -> SegmentKeys<'a> {
        self.conn.at(seg)
    }

    /// Adds `sku` to the set of SKUs with an outbox, where consumers discover them.
    async fn register_outbox(&self, sku: &Sku) -> Result<()> {
        use fred::interfaces::SetsInterface;
        let client = self.conn.pool.next();
        let key = self.conn.keys.outbox_skus();
        let _: u64 = client.sadd(key, sku.as_str()).await?;
        Ok(())
    }

    /// The placement a load of `sku` with `segments` proposes: on a cluster, the SKU's stored
    /// placement extended by [`placement::extend`] over the slot map fred holds now; on a
    /// single Redis, none. (`load_begin.lua` keeps stored suffixes whatever the proposal.)
    async fn propose_placement(&self, sku: &Sku, segments: u32) -> Result<Placement> {
        let client = self.conn.pool.next();
        if !client.is_clustered() {
            return Ok(Placement::unplaced());
        }
        // Never propose "unplaced" on a cluster: a new SKU would stay unplaced for good, and a
        // placed one would get segments without suffixes (whose keys a later load would change).
        let map = self
            .slot_map(client)
            .filter(|m| m.masters() > 0)
            .ok_or_else(|| {
                Error::Redis(fred::error::Error::new(
                    fred::error::ErrorKind::Cluster,
                    "the cluster's slot map is not known yet; retry the load",
                ))
            })?;
        let key = self.conn.keys.meta(sku);
        let v: Vec<Option<String>> =
            moving::follow(|| client.hmget(&key, vec!["gen", "place"])).await?;
        let existing = match (&v[0], &v[1]) {
            (None, _) => Placement::unplaced(),
            // Loaded unplaced: it stays so (its keys must not change).
            (Some(_), None) => return Ok(Placement::unplaced()),
            (Some(_), Some(p)) => Placement::decode(p)
                .ok_or_else(|| Error::Protocol(format!("placement of {sku}: {p:?}")))?,
        };
        Ok(placement::extend(sku, &existing, segments, &map))
    }

    /// The slot map `client` routes by (`None` on a single Redis).
    fn slot_map(&self, client: &Client) -> Option<SlotMap> {
        if !client.is_clustered() {
            return None;
        }
        let state = fred::interfaces::ClusterInterface::cached_cluster_state(client)?;
        Some(SlotMap::new(
            state
                .slots()
                .iter()
                .map(|r| (r.start, r.end, r.primary.to_string())),
        ))
    }

    /// Tells the sold-out flags of every engine on this store at once what a call through it
    /// did (the message from Redis follows): the next call of this process sees it, whatever
    /// the message's delay. A load is noted as added units only: "saw the load" must come
    /// from the subscriber itself.
    fn noticed(&self, sku: &Sku, event: invalidate::Event, generation: u64) {
        if let Some(s) = &self.subscriber {
            s.watch.notify(sku.as_str(), event, generation);
        }
    }

    fn users<'a>(&'a self, sku: &'a Sku, generation: u64) -> user::Users<'a> {
        user::Users {
            keys: &self.conn.keys,
            sku,
            generation,
        }
    }
}

impl Store for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn strategy(&self) -> crate::strategy::Strategy {
        self.runner.strategy()
    }

    fn lock_figures(&self) -> Option<crate::lock::LockFigures> {
        self.runner.lock_figures()
    }

    fn coalescing(&self) -> Option<CoalesceStats> {
        self.runner.coalescing()
    }

    fn stock_watch(&self, sku: &Sku) -> Option<crate::store::StockWatch> {
        // Only for the Lua strategy: the others write stock outside the scripts too.
        let s = self.subscriber.as_ref()?;
        (self.runner.strategy() == crate::Strategy::Lua).then(|| crate::store::StockWatch {
            sku: s.watch.sku(sku.as_str()),
            hub: std::sync::Arc::clone(&s.watch),
        })
    }

    async fn segment_homes(
        &self,
        sku: &Sku,
        placement: &Placement,
        segments: u32,
    ) -> Result<Option<Vec<SegmentHome>>> {
        let client = self.conn.pool.next();
        if !client.is_clustered() {
            return Ok(None);
        }
        // The slot map as the cluster has it now, not as this client last saw it (or as it
        // last saw it, when the cluster cannot be asked right now).
        if let Err(e) = fred::interfaces::ClusterInterface::sync_cluster(client).await {
            tracing::warn!(error = %e, "cannot refresh the slot map; showing the cached one");
        }
        let map = self.slot_map(client);
        Ok(Some(
            (0..segments)
                .map(|index| {
                    let tag = placement.tag(sku, index);
                    let slot = placement::slot_of_tag(&tag);
                    let master = map.as_ref().and_then(|m| {
                        m.master_of(slot)
                            .and_then(|n| m.master_name(n))
                            .map(str::to_string)
                    });
                    SegmentHome {
                        index,
                        tag,
                        slot,
                        master,
                    }
                })
                .collect(),
        ))
    }

    async fn load_begin(&self, sku: &Sku, spec: LoadSpec) -> Result<LoadBegin> {
        let placement = &self.propose_placement(sku, spec.segments).await?;
        if spec.outbox && !self.strategy().exactly_once() {
            return Err(Error::Config(format!(
                "the outbox needs an exactly-once strategy (lua, lock, redlock), not {}: \
                 the baselines write around the scripts that append the events",
                self.strategy()
            )));
        }
        if spec.outbox {
            // Registered before the load: a consumer discovering SKUs never misses one whose
            // scripts append (registering a load that then fails costs a consumer one
            // empty look).
            self.register_outbox(sku).await?;
        }
        let keys = &self.conn.keys;
        let call = segment::LoadBegin {
            keys,
            sku,
            spec,
            placement,
        };
        self.conn.run(call).await
    }

    async fn load_segment(&self, seg: SegAddr<'_>, load: SegmentLoad) -> Result<bool> {
        let at = self.at(seg);
        let old = self.at(SegAddr {
            generation: load.replaces,
            ..seg
        });
        let call = segment::LoadSegment {
            at,
            old,
            units: load.units,
            outbox: load.outbox,
        };
        let r = self.conn.run(call).await;
        self.noticed(seg.sku, invalidate::Event::Added, seg.generation);
        r
    }

    async fn drop_segment(&self, seg: SegAddr<'_>, replaces: u64) -> Result<()> {
        let at = self.at(seg);
        let old = self.at(SegAddr {
            generation: replaces,
            ..seg
        });
        self.conn.run(segment::DropSegment { at, old }).await
    }

    async fn load_commit(&self, sku: &Sku, generation: u64) -> Result<bool> {
        let keys = &self.conn.keys;
        let call = segment::LoadCommit {
            keys,
            sku,
            generation,
        };
        let r = self.conn.run(call).await;
        self.noticed(sku, invalidate::Event::Added, generation);
        r
    }

    async fn meta(&self, sku: &Sku) -> Result<Option<Meta>> {
        let key = self.conn.keys.meta(sku);
        let client = self.conn.pool.next();
        let fields = [
            "gen", "segments", "loaded", "state", "limit", "place", "outmax",
        ];
        let v: Vec<Option<String>> = moving::follow(|| client.hmget(&key, fields.to_vec())).await?;
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
            placement: Placement::decode(v[5].as_deref().unwrap_or(""))
                .ok_or_else(|| Error::Protocol(format!("placement of {sku}: {:?}", v[5])))?,
            outbox_segments: v[6].as_deref().and_then(|s| s.parse().ok()).unwrap_or(0),
        }))
    }

    async fn deduct_home(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        on_short: OnShort,
    ) -> Result<HomeReply> {
        let r = self
            .runner
            .deduct_home(&self.conn, seg, req, on_short)
            .await;
        if let Ok(HomeReply::Short {
            claimed: Some(_), ..
        }) = &r
        {
            let id = req.request_id.as_str().to_owned();
            self.noticed(seg.sku, invalidate::Event::Recorded(id), seg.generation);
        }
        r
    }

    async fn take(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        part: u64,
        epoch: u64,
        role: SegmentRole,
    ) -> Result<TakeReply> {
        self.runner
            .take(&self.conn, seg, req, part, epoch, role)
            .await
    }

    async fn settle(
        &self,
        home: SegAddr<'_>,
        req: ReqArgs<'_>,
        epoch: u64,
        how: SettleAs<'_>,
    ) -> Result<SettleReply> {
        let at = self.at(home);
        let call = claim::Settle {
            home: at,
            req,
            epoch,
            how,
        };
        let r = self.conn.run(call).await;
        if matches!(how, SettleAs::Seal) {
            let id = req.request_id.as_str().to_owned();
            self.noticed(home.sku, invalidate::Event::Recorded(id), home.generation);
        }
        r
    }

    async fn refund(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        epoch: u64,
        role: SegmentRole,
    ) -> Result<u64> {
        let call = deduct::Refund {
            at: self.at(seg),
            request_id: req.request_id,
            epoch,
            role,
        };
        let r = self.conn.run(call).await;
        if matches!(r, Ok(units) if units > 0) {
            self.noticed(seg.sku, invalidate::Event::Returned, seg.generation);
        }
        r
    }

    async fn shut_out(
        &self,
        seg: SegAddr<'_>,
        req: ReqArgs<'_>,
        epoch: u64,
    ) -> Result<ShutOutReply> {
        let at = self.at(seg);
        self.conn.run(claim::ShutOut { at, req, epoch }).await
    }

    async fn takeover(&self, home: SegAddr<'_>, req: ReqArgs<'_>) -> Result<TakeoverReply> {
        let home = self.at(home);
        self.conn.run(claim::Takeover { home, req }).await
    }

    async fn restock(
        &self,
        seg: SegAddr<'_>,
        request_id: &RequestId,
        qty: u64,
        total: u64,
        ttl_ms: u64,
    ) -> Result<RestockReply> {
        let call = segment::Restock {
            at: self.at(seg),
            request_id,
            qty,
            total,
            ttl_ms,
        };
        let r = self.conn.run(call).await;
        self.noticed(seg.sku, invalidate::Event::Added, seg.generation);
        r
    }

    async fn user_claim(
        &self,
        sku: &Sku,
        generation: u64,
        req: ReqArgs<'_>,
        limit: u64,
        claim_ttl_ms: u64,
    ) -> Result<UserClaim> {
        let call = user::UserClaim {
            users: self.users(sku, generation),
            req,
            limit,
            claim_ttl_ms,
        };
        self.conn.run(call).await
    }

    async fn user_finish(
        &self,
        sku: &Sku,
        generation: u64,
        req: ReqArgs<'_>,
        how: UserFinish,
    ) -> Result<()> {
        let call = user::UserFinish {
            users: self.users(sku, generation),
            req,
            how,
        };
        self.conn.run(call).await
    }

    async fn reserve_end(
        &self,
        seg: SegAddr<'_>,
        request_id: &RequestId,
        action: ReservationAction,
    ) -> Result<ReserveEnd> {
        let call = segment::ReserveEnd {
            at: self.at(seg),
            request_id,
            action,
        };
        let r = self.conn.run(call).await;
        if action == ReservationAction::Cancel {
            self.noticed(seg.sku, invalidate::Event::Returned, seg.generation);
        }
        r
    }

    async fn reclaim(&self, seg: SegAddr<'_>) -> Result<(u64, u64)> {
        let at = self.at(seg);
        let r = self.conn.run(segment::Reclaim { at }).await;
        if matches!(r, Ok((back, _)) if back > 0) {
            self.noticed(seg.sku, invalidate::Event::Returned, seg.generation);
        }
        r
    }

    async fn seal(&self, home: SegAddr<'_>, req: ReqArgs<'_>) -> Result<SealReply> {
        let at = self.at(home);
        let r = self.conn.run(claim::Seal { home: at, req }).await;
        if matches!(r, Ok(SealReply::Sealed)) {
            let id = req.request_id.as_str().to_owned();
            self.noticed(home.sku, invalidate::Event::Recorded(id), home.generation);
        }
        r
    }

    async fn segments(
        &self,
        sku: &Sku,
        generation: u64,
        placement: &Placement,
        segments: u32,
    ) -> Result<Vec<Option<SegmentState>>> {
        let reads = (0..segments).map(|i| {
            let key = self.conn.keys.segment(&placement.tag(sku, i));
            async move {
                // i64: the unsafe baselines can drive stock below zero for a moment; it reads
                // as 0 and the audit, comparing counters, reports the hole.
                let client = self.conn.pool.next();
                let fields = ["gen", "stock", "sold", "loaded", "restocked", "reserved"];
                let v: Vec<Option<i64>> =
                    moving::follow(|| client.hmget(&key, fields.to_vec())).await?;
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

    /// `record.lua` (the record key or its compact entry, read as one); the record's `s`
    /// letters are tabled in [`lua`]. In durability mode a
    /// record found is waited for like a write: the engine answers replays from it, and the
    /// write it replays may not have reached a replica yet (its own `WAIT` fell short). On
    /// Redis 7.0 any command moves the connection's replication mark to the master's current
    /// offset, so the `WAIT` after this read covers the earlier write.
    async fn record(
        &self,
        home: SegAddr<'_>,
        request_id: &RequestId,
    ) -> Result<Option<HomeRecord>> {
        let at = self.at(home);
        let key = at.record(request_id);
        let client = self.conn.pool.next();
        // record.lua: the record key, or the compact entry of a sale applied at home.
        let read = lua::deduct::RecordRead {
            key: key.clone(),
            segment: at.segment(),
        };
        let flat = lua::run(client, read).await?;
        // 'F': a released claim, the request id is free (settle.lua).
        if flat.is_empty() || flat.get("s").is_some_and(|s| s == "F") {
            return Ok(None);
        }
        if let Some(d) = &self.conn.durable {
            d.acked(client, wait::Durable::slot(client, Some(&key)))
                .await?;
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
        let at = self.at(seg);
        self.conn.run(claim::ClaimsDue { at, max, grace_ms }).await
    }

    async fn held(&self, seg: SegAddr<'_>) -> Result<Option<HeldState>> {
        let at = self.at(seg);
        self.conn.run(segment::Held { at }).await
    }
}
