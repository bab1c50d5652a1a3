//! `RedisStore`: the fred-backed store.
//!
//! Every step is one script of [`lua`] (one `EVALSHA`; a `NOSCRIPT` answer reloads the
//! script, counted in `shardstock_script_reloads_total`), and each script mirrors the
//! [`Segment`](super::memory::Segment) method of the same name. All keys a script touches share
//! one hash tag, so the store works unchanged on a Redis Cluster.
//!
//! fred re-sends in-flight commands after a reconnect (`max_command_attempts`), so a script can
//! run twice for one call. Every script is idempotent for its request id (or transfer id),
//! which makes that safe.
//!
//! # Layout
//! - this file: [`RedisStore`] and its [`Store`] steps, each one typed call of [`lua`];
//! - `conn`: the pool, the key names and the durability mode every call runs on;
//! - `builder`: [`RedisStoreBuilder`] (connection, strategy, request coalescing);
//! - `endpoint`: the Redis URL checked, and a port that answers but is no Redis named;
//! - `strategies`: how `sell` runs under each [`crate::Strategy`];
//! - `coalescing` and `batch`: request coalescing of `lua` sales ([`Coalescing`]): its options
//!   and figures, then its lanes;
//! - [`lock`]: distributed locks for the lock strategies (public as `shardstock::lock`);
//! - `health`: readiness, every master asked whether it answers and would take a write;
//! - `invalidate`: the stock-notification subscriber;
//! - `outbox`: the outbox streams as a consumer group sees them;
//! - [`lua`]: the script registry, the one `eval` path, each script's call, the stored letters.
//!
//! What a cluster adds (placement, durability waits, slots in motion, evacuation) is the
//! `cluster` room's, which this store calls.

use super::*;
use crate::cluster::moving;
use crate::cluster::placement::{self, Placement, SegmentHome, SlotMap};
use crate::error::Error;
use crate::segments::Keyspace;
use fred::prelude::{Client, ClientLike, HashesInterface, Pool};
use lua::{SegmentKeys, segment, transfer};
use std::sync::Arc;

mod batch;
mod builder;
pub(crate) mod coalescing;
mod conn;
pub(crate) mod endpoint;
pub use crate::cluster::evacuate;
mod health;
mod invalidate;
pub mod lock;
pub mod lua;
pub(crate) mod outbox;
mod strategies;

use crate::cluster::wait;
pub(crate) use crate::cluster::wait::check as check_durability;
pub use builder::RedisStoreBuilder;
pub use coalescing::{CoalesceStats, Coalescing};
use conn::Conn;
pub use evacuate::{EvacuateOptions, Evacuation, MovedSlot, RefusalWatch};
use strategies::Runner;

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

    /// Durability mode (`store.wait_replicas` > 0): what is missing on the Redis side, one
    /// line per master whose `min-replicas-to-write` is below the replicas waited for (or that
    /// refused to say). Empty when the mode is off or every master is set up. `connect` logs
    /// these as warnings.
    pub async fn durability_warnings(&self) -> Vec<String> {
        match &self.conn.durable {
            Some(d) => wait::setup_warnings(self.conn.pool.next(), d.replicas()).await,
            None => Vec::new(),
        }
    }

    /// The cluster's masters as fred knows them after asking the cluster again (a failover
    /// or a moved slot since the last look is seen).
    async fn masters(&self) -> Result<Vec<fred::types::config::Server>> {
        use fred::interfaces::ClusterInterface;
        let client = self.conn.pool.next();
        if !client.is_clustered() {
            return Err(Error::Config(
                "evacuation moves hash slots: it needs a Redis Cluster URL (redis-cluster://)"
                    .into(),
            ));
        }
        client.sync_cluster().await?;
        Ok(client
            .cached_cluster_state()
            .map(|s| s.unique_primary_nodes())
            .unwrap_or_default())
    }

    /// Moves every hash slot of master `from` (`host:port`) that holds this store's keys,
    /// keys and all, to the masters that can replicate, with the source's writes paused until
    /// it has given each slot up (see [`evacuate`] for the steps and what a crash leaves).
    /// Sales homed there then run on the new owners; nothing of the sale protocol changes.
    /// Needs a user allowed `CLUSTER`, `CLIENT PAUSE`/`UNPAUSE`, `SCAN`, `PEXPIRETIME`, `DUMP`,
    /// `RESTORE`, `DEL`, `ASKING`, `INFO`, `CONFIG GET` and `WAIT` on every master: an
    /// operator's, not a service's. Run one evacuation per cluster at a time.
    pub async fn evacuate(&self, from: &str, opts: &EvacuateOptions) -> Result<Evacuation> {
        let masters = self.masters().await?;
        let base = self.conn.pool.next().client_config();
        evacuate::evacuate(&base, &masters, from, self.conn.keys.prefix(), opts).await
    }

    /// One look at every master: those that have refused writes (fewer replicas in sync than
    /// their `min-replicas-to-write`) for at least `grace` since `watch` first saw them so are
    /// evacuated ([`Self::evacuate`]), once per refusal. A master that does not answer is
    /// skipped (a dead master is the failover's to handle); one whose evacuation fails is
    /// logged and tried again at the next look. Call it every second or so from one process
    /// (`shardstock evacuate --watch`).
    pub async fn evacuate_refusing(
        &self,
        watch: &mut RefusalWatch,
        grace: std::time::Duration,
        opts: &EvacuateOptions,
    ) -> Result<Vec<Evacuation>> {
        opts.check()?;
        let masters = self.masters().await?;
        let base = self.conn.pool.next().client_config();
        let mut health = std::collections::BTreeMap::new();
        for m in &masters {
            let name = format!("{}:{}", m.host, m.port);
            match crate::cluster::node::Node::open(&base, m).await {
                Ok(n) => {
                    if let Ok(h) = n.health().await {
                        health.insert(name, h);
                    }
                    n.quit().await;
                }
                Err(e) => tracing::debug!("evacuation watch: {name} does not answer: {e}"),
            }
        }
        // One master failing does not hold the others back: its error is logged and it is
        // tried again at the next look.
        let mut done = Vec::new();
        for m in watch.due(&health, grace) {
            match evacuate::evacuate(&base, &masters, &m, self.conn.keys.prefix(), opts).await {
                Ok(e) => {
                    watch.evacuated(&m);
                    done.push(e);
                }
                Err(e) => tracing::warn!("evacuation of {m} failed: {e}"),
            }
        }
        Ok(done)
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
    /// read-then-write designs. For tests and demonstrations; affects every clone of this store.
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

    /// Unlinks every key of segment `seg`'s generation `old` (a reload or a drop made them
    /// unreachable: every script checks the generation). `SCAN MATCH …:g<old>:*` on the node
    /// owning the segment's slot (the pattern carries the segment's hash tag), then `UNLINK`
    /// in chunks (one slot: a multi-key `UNLINK` is fine on a cluster). Best effort: a failure
    /// is logged and leaves garbage, never wrong answers. Not on the sale path.
    async fn unlink_generation(&self, seg: SegAddr<'_>, old: u64) {
        if old == 0 || old == seg.generation {
            return;
        }
        let pattern = self.conn.keys.generation_keys(&seg.tag(), old);
        if let Err(e) = self.unlink_matching(&pattern).await {
            tracing::warn!(error = %e, %pattern, "cannot unlink the keys of a replaced generation; they stay as garbage");
        }
    }

    async fn unlink_matching(&self, pattern: &str) -> Result<()> {
        use fred::interfaces::KeysInterface;
        let client = self.conn.pool.next();
        let mut cursor = "0".to_string();
        loop {
            let (next, keys): (String, Vec<String>) = moving::follow(|| {
                client.scan_page(cursor.clone(), pattern.to_string(), Some(1000), None)
            })
            .await?;
            for chunk in keys.chunks(500) {
                let _: u64 = moving::follow(|| client.unlink(chunk.to_vec())).await?;
            }
            if next == "0" {
                return Ok(());
            }
            cursor = next;
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

    fn lock_figures(&self) -> Option<crate::store::redis::lock::LockFigures> {
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

    async fn health(&self, timeout: std::time::Duration) -> StoreHealth {
        health::check(self.conn.pool.next(), tokio::time::Instant::now() + timeout).await
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
        if !self.strategy().exactly_once() {
            if spec.outbox {
                return Err(Error::Config(format!(
                    "the outbox needs an exactly-once strategy (lua, lock, redlock), not {}: \
                     the baselines write around the scripts that append the events",
                    self.strategy()
                )));
            }
            if spec.user_limit > 0 {
                return Err(Error::Config(format!(
                    "a per-user limit needs an exactly-once strategy (lua, lock, redlock), not {}: \
                     the baselines keep no ledgers",
                    self.strategy()
                )));
            }
        }
        if spec.outbox {
            // Registered before the load: a consumer discovering SKUs never misses one whose
            // scripts append (registering a load that then fails costs a consumer one
            // empty look).
            self.register_outbox(sku).await?;
        }
        // The SKU registry (the sweeper's list), before the load for the same reason.
        {
            use fred::interfaces::SetsInterface;
            let client = self.conn.pool.next();
            let key = self.conn.keys.skus();
            let _: u64 = moving::follow(|| client.sadd(&key, sku.as_str())).await?;
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
        // `load.replaces` is the generation the metadata named; the script ends whatever
        // generation the segment holds (a concurrent or failed load may have written another)
        // and says which, so that is the one unlinked.
        let call = segment::LoadSegment {
            at: self.at(seg),
            units: load.units,
            outbox: load.outbox,
            user_limit: load.user_limit,
        };
        let r = self.conn.run(call).await;
        self.noticed(seg.sku, invalidate::Event::Added, seg.generation);
        let replaced = r?;
        if let Some(old) = replaced {
            self.unlink_generation(seg, old).await;
        }
        Ok(replaced.is_some())
    }

    async fn drop_segment(&self, seg: SegAddr<'_>, _replaces: u64) -> Result<()> {
        // The script ends whatever older generation the segment holds (see load_segment).
        let old = self
            .conn
            .run(segment::DropSegment { at: self.at(seg) })
            .await?;
        self.unlink_generation(seg, old).await;
        Ok(())
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
            "gen", "segments", "loaded", "state", "limit", "place", "outmax", "hf",
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
            // Missing: loaded before home functions had versions (0 matches no instance).
            home_fn: v[7].as_deref().and_then(|s| s.parse().ok()).unwrap_or(0),
        }))
    }

    async fn skus(&self) -> Result<Vec<Sku>> {
        use fred::interfaces::SetsInterface;
        let client = self.conn.pool.next();
        let key = self.conn.keys.skus();
        let names: Vec<String> = moving::follow(|| client.smembers(&key)).await?;
        // Only names that are valid SKUs were ever added (the engine validates first).
        let mut v: Vec<Sku> = names.into_iter().filter_map(|s| Sku::new(s).ok()).collect();
        v.sort();
        Ok(v)
    }

    async fn sell(&self, home: SegAddr<'_>, req: SellArgs<'_>) -> Result<SellReply> {
        let r = self.runner.sell(&self.conn, home, req).await;
        if !req.credits.is_empty() {
            // Credited units may be sellable at a segment that looked empty (no unit went
            // back: the sold-out proof's count still holds).
            self.noticed(home.sku, invalidate::Event::Added, home.generation);
        }
        r
    }

    async fn transfer(&self, donor: SegAddr<'_>, t: TransferArgs) -> Result<TransferReply> {
        let call = transfer::Debit {
            at: self.at(donor),
            t,
        };
        self.conn.run(call).await
    }

    async fn transfer_done(&self, donor: SegAddr<'_>, id: TransferId) -> Result<()> {
        let call = transfer::Done {
            at: self.at(donor),
            id,
        };
        self.conn.run(call).await
    }

    async fn transfers_due(&self, donor: SegAddr<'_>, max: usize) -> Result<Vec<DueTransfer>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let call = transfer::Due {
            at: self.at(donor),
            max: max.min(1_000_000) as u64,
        };
        self.conn.run(call).await
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

    async fn reserve_end(
        &self,
        home: SegAddr<'_>,
        user: &UserId,
        request_id: &RequestId,
        action: ReservationAction,
    ) -> Result<ReserveEnd> {
        let call = segment::ReserveEnd {
            at: self.at(home),
            user,
            request_id,
            action,
        };
        let r = self.conn.run(call).await;
        if action == ReservationAction::Cancel {
            self.noticed(home.sku, invalidate::Event::Returned, home.generation);
        }
        r
    }

    async fn survey(&self, seg: SegAddr<'_>, detail: bool) -> Result<Option<Survey>> {
        let r = self
            .conn
            .run(segment::SurveyCall {
                at: self.at(seg),
                detail,
            })
            .await;
        if matches!(&r, Ok(Some(s)) if s.reclaimed > 0) {
            self.noticed(seg.sku, invalidate::Event::Returned, seg.generation);
        }
        r
    }

    async fn peek(&self, seg: SegAddr<'_>, detail: bool) -> Result<Option<Survey>> {
        self.conn
            .run(segment::PeekCall {
                at: self.at(seg),
                detail,
            })
            .await
    }

    async fn settle(
        &self,
        home: SegAddr<'_>,
        user: &UserId,
        request_id: &RequestId,
        qty: u64,
        post: bool,
        ttl_ms: u64,
    ) -> Result<SettleReply> {
        let call = lua::order::Settle {
            at: self.at(home),
            user,
            request_id,
            qty,
            post,
            ttl_ms,
        };
        let r = self.conn.run(call).await;
        if !post {
            self.noticed(home.sku, invalidate::Event::Returned, home.generation);
        }
        r
    }

    async fn holds_due(&self, seg: SegAddr<'_>, max: usize) -> Result<Vec<DueHold>> {
        // As transfers_due: at most `max`, so none for 0 (the script takes 1 on).
        if max == 0 {
            return Ok(Vec::new());
        }
        self.conn
            .run(lua::order::HoldsDue {
                at: self.at(seg),
                max,
            })
            .await
    }

    async fn order(
        &self,
        id: &crate::cart::OrderId,
        step: crate::cart::OrderStep<'_>,
        ttl_ms: u64,
    ) -> Result<crate::cart::OrderReply> {
        self.conn
            .run(lua::order::Order {
                keys: &self.conn.keys,
                id,
                step,
                ttl_ms,
            })
            .await
    }

    /// `record.lua`. In durability mode a record found is waited for like a write (see
    /// `lua::segment::RecordRead`).
    async fn record(
        &self,
        home: SegAddr<'_>,
        user: &UserId,
        request_id: &RequestId,
    ) -> Result<Option<HomeRecord>> {
        let call = segment::RecordRead {
            at: self.at(home),
            user,
            request_id,
        };
        self.conn.run(call).await
    }
}
