//! The engine: the public face. Loads SKUs, deducts with routing and fallback, restocks, audits.
//!
//! # How a deduction runs
//! 1. **Home attempt** (one script, the common case). The request id hashes to a *home*
//!    segment; `deduct.lua` there checks the request's record (replay / conflict), then takes
//!    the whole quantity if the segment has it. When it is short, the same script writes a
//!    *claim* for the request, so concurrent duplicates of this request id wait instead of
//!    falling back on their own (which could sell twice).
//! 2. **Fallback** (claim holder only). Try the other segments, skipping those the local hints
//!    say are short; then read every segment (one pipelined round trip). A single segment that
//!    can serve the request is used; otherwise, when the SKU has enough in total, the request is
//!    served across segments **all or nothing** (parts taken one by one, refunded on failure).
//!    The claim is settled at home as applied (with the parts) or released.
//! 3. **Sold out / insufficient** are answered only from that fresh read, never from hints.
//!    They change nothing and are not recorded: retrying the same request id later (say after
//!    a restock) is a fresh attempt.
//! 4. **Crash recovery.** A claim has a lease on the store's clock. If its holder dies, a retry
//!    of the request takes the claim over with a higher epoch, *fences* every other segment
//!    (after which the old holder can no longer take or refund there), counts what the old
//!    holder took, and either settles it (replay) or refunds it and starts afresh.

use crate::coalesce::ReadGroup;
use crate::error::{Error, Result};
use crate::ids::{MAX_SEGMENTS, MAX_UNITS, RequestId, Sku, UserId, check_qty};
use crate::router::{Hints, others, plan_split};
use crate::segments::{Part, home, split};
use crate::store::*;
use dashmap::DashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A deduction request: `qty` units of `sku` for `user`, idempotent by `request_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deduct {
    /// The SKU.
    pub sku: Sku,
    /// The buyer.
    pub user: UserId,
    /// Units wanted (1..=`max_qty`).
    pub qty: u64,
    /// Idempotency key: resend the same request with the same id.
    pub request_id: RequestId,
}

impl Deduct {
    /// Builds a request from raw text, validating the ids (the quantity is checked by the
    /// engine against its `max_qty`).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the first invalid field.
    pub fn new(sku: &str, user: &str, qty: u64, request_id: &str) -> Result<Self> {
        Ok(Self {
            sku: Sku::new(sku)?,
            user: UserId::new(user)?,
            qty,
            request_id: RequestId::new(request_id)?,
        })
    }
}

/// The outcome of a deduction. Business outcomes are values, not errors.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Deduction {
    /// The units were taken now, from these segments.
    Applied {
        /// Where the units came from.
        parts: Vec<Part>,
    },
    /// This request id was applied before; nothing changed this time.
    Replayed {
        /// Where the units came from, back then.
        parts: Vec<Part>,
    },
    /// No units left at all.
    SoldOut,
    /// Some units are left, fewer than asked for.
    Insufficient {
        /// Units left when the engine looked.
        available: u64,
    },
    /// Another call with the same request id is being processed right now (it did not finish
    /// within `pending_wait`). Retry later with the same id.
    InFlight,
    /// The user already holds the per-user limit of this SKU (units sold, or reserved by live
    /// reservations); attempts still pending never cause it (see [`Deduction::UserBusy`]).
    LimitReached {
        /// The SKU's per-user limit.
        limit: u64,
    },
    /// This user already has an attempt on this SKU running — in this process (a double
    /// click), or elsewhere (a pending per-user claim not yet settled) with the limit counted
    /// against it; nothing was done. The user holds fewer units than the limit: retry shortly.
    UserBusy,
}

impl Deduction {
    /// Units this call newly sold (0 for replays and rejections).
    pub fn units_applied(&self) -> u64 {
        match self {
            Deduction::Applied { parts } => parts.iter().map(|p| p.units).sum(),
            _ => 0,
        }
    }

    /// A short name: `applied`, `replayed`, `sold_out`, `insufficient`, `in_flight`,
    /// `limit_reached`, `user_busy`.
    pub fn kind(&self) -> &'static str {
        match self {
            Deduction::Applied { .. } => "applied",
            Deduction::Replayed { .. } => "replayed",
            Deduction::SoldOut => "sold_out",
            Deduction::Insufficient { .. } => "insufficient",
            Deduction::InFlight => "in_flight",
            Deduction::LimitReached { .. } => "limit_reached",
            Deduction::UserBusy => "user_busy",
        }
    }
}

/// The outcome of a restock.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Restocked {
    /// Units added by this call (0 when the whole request was a replay).
    pub added: u64,
    /// True when every segment had already applied this request id.
    pub replayed: bool,
}

/// The outcome of [`Engine::reserve`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Reserved {
    /// Held now; confirm or cancel it with `id`.
    Held {
        /// Reservation id: `<sku>~<generation>~<segment>~<request id>`.
        id: String,
        /// Where the units are held.
        parts: Vec<Part>,
    },
    /// This request id reserved before; same reservation.
    Replayed {
        /// Reservation id.
        id: String,
        /// Where the units are held.
        parts: Vec<Part>,
    },
    /// Nothing held: sold out, insufficient, limit reached, in flight, ...
    NotHeld(Deduction),
}

/// The outcome of [`Engine::confirm`] / [`Engine::cancel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ReservationEnd {
    /// The reservation's state now (`None`: no such reservation).
    pub state: Option<ResvState>,
    /// This call (or an earlier one with the same intent) brought it there; false when it had
    /// ended otherwise (e.g. confirming an expired reservation: nothing sold).
    pub done: bool,
}

/// The running sweeper; dropping it stops it.
#[derive(Debug)]
pub struct Sweeper {
    task: tokio::task::JoinHandle<()>,
}

impl Sweeper {
    /// Stops the sweeper now.
    pub fn stop(self) {}
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Units left, in total and per segment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Remaining {
    /// Sum over segments.
    pub total: u64,
    /// Per segment, by index.
    pub per_segment: Vec<u64>,
}

/// One segment in an [`Audit`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SegmentAudit {
    /// Index.
    pub index: u32,
    /// Counters (zeros when the segment is missing).
    #[serde(flatten)]
    pub state: SegmentState,
    /// Units held by this segment's live reservations (must equal `reserved`).
    pub held: u64,
    /// Live reservations in this segment.
    pub reservations: u64,
    /// `loaded + restocked = remaining + reserved + sold` holds, every reserved unit belongs
    /// to a live reservation, and the segment exists.
    pub ok: bool,
}

/// A conservation check of one SKU: `loaded + restocked = remaining + reserved + sold`, per
/// segment and in total; every reserved unit is held by a live reservation (per segment, read
/// atomically with the counters); and the segments' loads add up to what the SKU was loaded
/// with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Audit {
    /// The SKU.
    pub sku: String,
    /// Load generation.
    pub generation: u64,
    /// Units loaded (from the SKU metadata).
    pub loaded: u64,
    /// Units restocked since.
    pub restocked: u64,
    /// Units left.
    pub remaining: u64,
    /// Units sold.
    pub sold: u64,
    /// Units held by live reservations (not sold, not sellable until they end).
    pub reserved: u64,
    /// Every check passed.
    pub ok: bool,
    /// What failed, in words.
    pub problems: Vec<String>,
    /// Per segment.
    pub segments: Vec<SegmentAudit>,
}

/// Tunables, with the defaults a flash sale wants.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineOptions {
    /// How long a request id's outcome is remembered (default 24 h).
    pub request_ttl: Duration,
    /// Lease of a fallback claim; after it a retry may take over (default 5 s).
    pub claim_lease: Duration,
    /// How long a duplicate waits for an in-flight twin before answering `InFlight` (1 s).
    pub pending_wait: Duration,
    /// How long a "segment is short" hint is trusted for skipping (default 200 ms; 0 = off).
    pub hint_ttl: Duration,
    /// Largest quantity one deduction may ask for (default 10 000).
    pub max_qty: u64,
    /// Rounds of "read all segments, then take" before answering insufficient under
    /// contention (default 3).
    pub fallback_rounds: u32,
    /// Per-user limit for SKUs loaded with [`Engine::load`] (default 1 = one unit per user;
    /// 0 = no limit). [`Engine::load_limited`] sets it per SKU.
    pub per_user_limit: u64,
    /// How long a per-user claim may stay pending before another call may verify it (the
    /// claimer presumed dead; default 10 s).
    pub user_claim_ttl: Duration,
    /// Lifetime of the in-process guard's entries (default 60 s).
    pub guard_ttl: Duration,
    /// Most entries the in-process guard holds (default 100 000).
    pub guard_cap: usize,
    /// SKUs that get their own `sku` label on the remaining-units gauges.
    pub metric_skus: Vec<String>,
    /// Besides `metric_skus`, how many SKUs get a label on first sight (default 16); the
    /// rest are not exported per SKU, which keeps label cardinality bounded.
    pub metric_sku_cap: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            request_ttl: Duration::from_secs(24 * 3600),
            claim_lease: Duration::from_secs(5),
            pending_wait: Duration::from_secs(1),
            hint_ttl: Duration::from_millis(200),
            max_qty: 10_000,
            fallback_rounds: 3,
            per_user_limit: 1,
            user_claim_ttl: Duration::from_secs(10),
            guard_ttl: Duration::from_secs(60),
            guard_cap: 100_000,
            metric_skus: Vec::new(),
            metric_sku_cap: 16,
        }
    }
}

impl EngineOptions {
    /// Checks the options for values that cannot work together.
    ///
    /// # Errors
    /// [`Error::Config`] naming the option.
    pub fn validate(&self) -> Result<()> {
        // Every duration ends up as milliseconds added to the server clock inside a script;
        // a year bounds them far below what a Lua double holds exactly.
        let durations = [
            ("request_ttl", self.request_ttl),
            ("claim_lease", self.claim_lease),
            ("pending_wait", self.pending_wait),
            ("hint_ttl", self.hint_ttl),
            ("user_claim_ttl", self.user_claim_ttl),
            ("guard_ttl", self.guard_ttl),
        ];
        for (name, d) in durations {
            if d > MAX_DURATION {
                return Err(Error::Config(format!(
                    "{name} must be at most {} days",
                    MAX_DURATION.as_secs() / 86_400
                )));
            }
        }
        let ms = |d: Duration| d.as_millis();
        if ms(self.request_ttl) == 0 || ms(self.claim_lease) == 0 {
            return Err(Error::Config(
                "request_ttl and claim_lease must be at least 1 ms".into(),
            ));
        }
        if self.request_ttl < self.claim_lease {
            return Err(Error::Config(
                "request_ttl must not be shorter than claim_lease (a claim would outlive its record)".into(),
            ));
        }
        if self.max_qty == 0 || self.max_qty > MAX_UNITS {
            return Err(Error::Config(format!("max_qty must be in 1..={MAX_UNITS}")));
        }
        if self.per_user_limit > MAX_UNITS {
            return Err(Error::Config(format!(
                "per_user_limit must be at most {MAX_UNITS}"
            )));
        }
        if ms(self.user_claim_ttl) == 0 || ms(self.guard_ttl) == 0 || self.guard_cap == 0 {
            return Err(Error::Config(
                "user_claim_ttl, guard_ttl and guard_cap must be positive".into(),
            ));
        }
        if self.guard_cap > MAX_GUARD_CAP {
            return Err(Error::Config(format!(
                "guard_cap must be at most {MAX_GUARD_CAP}"
            )));
        }
        if self.user_claim_ttl < self.claim_lease {
            return Err(Error::Config(
                "user_claim_ttl must not be shorter than claim_lease".into(),
            ));
        }
        if self.fallback_rounds == 0 || self.fallback_rounds > 100 {
            return Err(Error::Config("fallback_rounds must be in 1..=100".into()));
        }
        if self.metric_sku_cap > 10_000 || self.metric_skus.len() > 10_000 {
            return Err(Error::Config(
                "metric_sku_cap and metric_skus allow at most 10000 labelled SKUs".into(),
            ));
        }
        Ok(())
    }
}

/// Longest duration any option may have (one year).
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Most entries the in-process guard may be configured to hold.
pub const MAX_GUARD_CAP: usize = 100_000_000;

/// Builds an [`Engine`].
#[derive(Debug, Clone, Default)]
pub struct EngineBuilder {
    opts: EngineOptions,
}

impl EngineBuilder {
    /// Starts from given options (e.g. from [`crate::config::Config`]).
    pub fn with_options(opts: EngineOptions) -> Self {
        Self { opts }
    }
    /// See [`EngineOptions::request_ttl`].
    pub fn request_ttl(mut self, d: Duration) -> Self {
        self.opts.request_ttl = d;
        self
    }
    /// See [`EngineOptions::claim_lease`].
    pub fn claim_lease(mut self, d: Duration) -> Self {
        self.opts.claim_lease = d;
        self
    }
    /// See [`EngineOptions::pending_wait`].
    pub fn pending_wait(mut self, d: Duration) -> Self {
        self.opts.pending_wait = d;
        self
    }
    /// See [`EngineOptions::hint_ttl`].
    pub fn hint_ttl(mut self, d: Duration) -> Self {
        self.opts.hint_ttl = d;
        self
    }
    /// See [`EngineOptions::max_qty`].
    pub fn max_qty(mut self, n: u64) -> Self {
        self.opts.max_qty = n;
        self
    }
    /// See [`EngineOptions::fallback_rounds`].
    pub fn fallback_rounds(mut self, n: u32) -> Self {
        self.opts.fallback_rounds = n;
        self
    }

    /// See [`EngineOptions::per_user_limit`].
    pub fn per_user_limit(mut self, n: u64) -> Self {
        self.opts.per_user_limit = n;
        self
    }
    /// See [`EngineOptions::user_claim_ttl`].
    pub fn user_claim_ttl(mut self, d: Duration) -> Self {
        self.opts.user_claim_ttl = d;
        self
    }
    /// See [`EngineOptions::guard_ttl`] and [`EngineOptions::guard_cap`].
    pub fn guard(mut self, ttl: Duration, cap: usize) -> Self {
        self.opts.guard_ttl = ttl;
        self.opts.guard_cap = cap;
        self
    }

    /// Builds the engine over `store`.
    ///
    /// # Errors
    /// [`Error::Config`] when the options contradict each other.
    pub fn build<S: Store>(self, store: S) -> Result<Engine<S>> {
        self.opts.validate()?;
        Ok(Engine {
            inner: Arc::new(Inner {
                store,
                guard: crate::guard::LocalGuard::new(self.opts.guard_ttl, self.opts.guard_cap),
                sku_labels: crate::metrics::SkuLabels::new(
                    self.opts.metric_skus.clone(),
                    self.opts.metric_sku_cap,
                ),
                opts: self.opts,
                layouts: DashMap::new(),
            }),
        })
    }
}

/// What this engine knows locally about a loaded SKU.
#[derive(Debug)]
struct Layout {
    generation: u64,
    segments: u32,
    /// Units one user may hold (0 = no limit).
    user_limit: u64,
    hints: Hints,
    /// Coalesces "read every segment" for this SKU (see [`crate::coalesce`]).
    reads: Arc<ReadGroup<Vec<Option<SegmentState>>>>,
    /// When the remaining-units gauges were last set (ms since `born`).
    gauges_at: std::sync::atomic::AtomicU64,
    born: Instant,
}

struct Inner<S> {
    store: S,
    opts: EngineOptions,
    /// Cached layouts. A `Stale` reply (another instance reloaded the SKU) evicts the entry.
    layouts: DashMap<Sku, Arc<Layout>>,
    /// Which SKUs get their own metric label.
    sku_labels: crate::metrics::SkuLabels,
    /// The in-process per-user filter.
    guard: crate::guard::LocalGuard,
}

/// The inventory engine. Cheap to clone; share one per process.
pub struct Engine<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S> std::fmt::Debug for Engine<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("opts", &self.inner.opts)
            .finish()
    }
}

/// Per-call context: what the call is (sale or reservation) and metrics bookkeeping (atomics
/// so the futures stay `Send`).
struct Trace {
    attempts: std::sync::atomic::AtomicU32,
    /// 0: a sale; > 0: a reservation for this many ms.
    resv: u64,
    /// Sale or reservation (a reservation verified by the sweeper has `resv` 0: it takes no
    /// units, it only settles or gives back what an earlier call took).
    kind: RequestKind,
}

impl Trace {
    /// A sale (`resv_ms` = 0) or a reservation for `resv_ms`.
    fn new(resv_ms: u64) -> Self {
        Self {
            attempts: Default::default(),
            resv: resv_ms,
            kind: if resv_ms > 0 {
                RequestKind::Reservation
            } else {
                RequestKind::Sale
            },
        }
    }

    /// Recovery of an earlier call of `kind` (takes no new units).
    fn recovering(kind: RequestKind) -> Self {
        Self {
            kind,
            ..Self::new(0)
        }
    }

    fn attempt(&self) {
        self.attempts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How many times a call re-reads a SKU's layout after `Stale` before giving up.
const STALE_RETRIES: usize = 4;

/// How many times a call starts afresh after the twin it waited for released the claim,
/// before answering `InFlight`.
const MAX_RESTARTS: usize = 16;

/// Most abandoned claims one sweep recovers per segment.
const CLAIMS_PER_SWEEP: usize = 64;

/// What a fresh read says before anything is claimed.
enum Short {
    /// Replayed, sold out or insufficient: answer this, nothing to do.
    Decided(Deduction),
    /// The request's fallback claim is held by someone.
    Pending,
    /// The layout changed.
    Stale,
    /// The request id is taken by another request (or sealed): this request can never apply.
    Refused(Error),
    /// Enough stock exists: go on.
    Go,
}

/// Internal: a step's result, or "the layout changed under us".
enum Flow<T> {
    Done(T),
    Stale,
    /// The claim was released by its holder meanwhile: start the request again.
    Restart,
    /// Refused at the home segment before anything was taken: the request id belongs to
    /// another request (user, qty or kind differ) or was sealed. This request can never apply
    /// under this id, so its per-user entry goes; the error is the answer.
    Refused(Error),
}

use Flow::{Done, Refused, Restart, Stale};

/// Armed while a call of the per-user path runs (from its claim in the user record until that
/// record is settled): if the call's future is dropped — a client disconnected and the server
/// dropped its handler — a task finishes the call in the background, with the same request id:
/// its per-user entry is settled at once instead of keeping the user busy until it expires,
/// and a retry of that id by the client replays whatever the background call did. Every step
/// is idempotent by request id, so the background run and whatever the dropped call had in
/// flight cannot apply twice.
struct PendingEntry<'a, S: Store> {
    engine: &'a Engine<S>,
    layout: &'a Arc<Layout>,
    req: &'a Deduct,
    resv: u64,
    armed: bool,
}

impl<S: Store> Drop for PendingEntry<'_, S> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return; // no runtime (shutting down): the entry is verified when it lingers
        };
        let (engine, l, req) = (
            self.engine.clone(),
            Arc::clone(self.layout),
            self.req.clone(),
        );
        let resv = self.resv;
        rt.spawn(async move {
            let tr = Trace::new(resv);
            if let Err(e) = Box::pin(engine.deduct_counted(&l, &req, &tr)).await {
                tracing::warn!(error = %e, request_id = %req.request_id,
                    "finishing a dropped call failed; its per-user entry is verified when it lingers");
            }
        });
    }
}

impl Engine<()> {
    /// A builder with default options.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }
}

impl<S: Store> Engine<S> {
    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// Entries held by the in-process per-user guard.
    pub fn guard_len(&self) -> usize {
        self.inner.guard.len()
    }

    /// The options in force.
    pub fn options(&self) -> &EngineOptions {
        &self.inner.opts
    }

    fn ttl_ms(&self) -> u64 {
        self.inner.opts.request_ttl.as_millis() as u64
    }

    /// Loads `sku` with `total` units split over `segments` (sizes differ by at most one).
    /// Refuses an existing SKU unless `replace`; a replace starts a new generation: stock,
    /// counters and request records of the old one no longer count.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for bad figures; [`Error::AlreadyLoaded`]; [`Error::NotReady`]
    /// when another load overtook this one; store errors.
    pub async fn load(&self, sku: &Sku, total: u64, segments: u32, replace: bool) -> Result<u64> {
        self.load_limited(
            sku,
            total,
            segments,
            replace,
            self.inner.opts.per_user_limit,
        )
        .await
    }

    /// [`load`](Self::load) with an explicit per-user limit for this SKU: units one user may
    /// hold (sold or reserved) at most; 0 = no limit.
    ///
    /// # Errors
    /// As [`load`](Self::load).
    pub async fn load_limited(
        &self,
        sku: &Sku,
        total: u64,
        segments: u32,
        replace: bool,
        per_user_limit: u64,
    ) -> Result<u64> {
        if per_user_limit > MAX_UNITS {
            return Err(Error::invalid(
                "per_user_limit",
                format!("must be at most {MAX_UNITS}"),
            ));
        }
        if segments == 0 || segments > MAX_SEGMENTS {
            return Err(Error::invalid(
                "segments",
                format!("must be in 1..={MAX_SEGMENTS}"),
            ));
        }
        if total > MAX_UNITS {
            return Err(Error::invalid(
                "stock",
                format!("must be at most {MAX_UNITS}"),
            ));
        }
        let store = &self.inner.store;
        let (generation, old) = match store
            .load_begin(
                sku,
                LoadSpec {
                    segments,
                    total,
                    if_loaded: if replace {
                        IfLoaded::Replace
                    } else {
                        IfLoaded::Refuse
                    },
                    user_limit: per_user_limit,
                },
            )
            .await?
        {
            LoadBegin::Exists { generation } => {
                return Err(Error::AlreadyLoaded {
                    sku: sku.to_string(),
                    generation,
                });
            }
            LoadBegin::Started {
                generation,
                old_segments,
            } => (generation, old_segments),
        };
        self.inner.layouts.remove(sku);
        let amounts = split(total, segments);
        let at = |index| SegAddr {
            sku,
            generation,
            index,
        };
        let writes = amounts
            .iter()
            .enumerate()
            .map(|(i, units)| store.load_segment(at(i as u32), *units));
        let written = futures::future::try_join_all(writes).await?;
        // A concurrent load of a newer generation wrote some segment first: it wins (its
        // segments are never overwritten by ours), and this load is overtaken.
        if written.contains(&false) {
            return Err(Error::NotReady(sku.to_string()));
        }
        let drops = (segments..old).map(|i| store.drop_segment(at(i)));
        futures::future::try_join_all(drops).await?;
        if !store.load_commit(sku, generation).await? {
            return Err(Error::NotReady(sku.to_string()));
        }
        Ok(generation)
    }

    async fn layout(&self, sku: &Sku) -> Result<Arc<Layout>> {
        if let Some(l) = self.inner.layouts.get(sku) {
            return Ok(Arc::clone(&l));
        }
        let meta = self
            .inner
            .store
            .meta(sku)
            .await?
            .ok_or_else(|| Error::NotLoaded(sku.to_string()))?;
        if !meta.ready {
            return Err(Error::NotReady(sku.to_string()));
        }
        let layout = Arc::new(Layout {
            generation: meta.generation,
            segments: meta.segments,
            user_limit: meta.user_limit,
            hints: Hints::new(meta.segments, self.inner.opts.hint_ttl),
            reads: ReadGroup::new(),
            gauges_at: std::sync::atomic::AtomicU64::new(0),
            born: Instant::now(),
        });
        self.inner.layouts.insert(sku.clone(), Arc::clone(&layout));
        Ok(layout)
    }

    /// Every segment of `sku`, from a read that started after this call (shared with
    /// concurrent callers; see [`crate::coalesce`]). Falls back to a read of its own when the
    /// shared one failed, so errors come back typed.
    async fn read_segments(&self, l: &Layout, sku: &Sku) -> Result<Vec<Option<SegmentState>>> {
        let (inner, sku_owned) = (Arc::clone(&self.inner), sku.clone());
        let (generation, segments) = (l.generation, l.segments);
        let shared = l
            .reads
            .join(move || {
                let (inner, sku) = (Arc::clone(&inner), sku_owned.clone());
                async move { inner.store.segments(&sku, generation, segments).await.ok() }
            })
            .await;
        match shared {
            Some(v) => Ok(v.as_ref().clone()),
            None => self.inner.store.segments(sku, generation, segments).await,
        }
    }

    /// True when `l` is still the SKU's layout in the store (one metadata read).
    async fn is_current(&self, l: &Layout, sku: &Sku) -> Result<bool> {
        Ok(self
            .inner
            .store
            .meta(sku)
            .await?
            .is_some_and(|m| m.generation == l.generation))
    }

    fn forget(&self, sku: &Sku, generation: u64) {
        self.inner
            .layouts
            .remove_if(sku, |_, l| l.generation == generation);
    }

    /// Reserves `req.qty` units for `ttl` (pre-deduction): they leave the sellable stock at
    /// once and become sold on [`confirm`](Self::confirm), or go back on
    /// [`cancel`](Self::cancel) — and by themselves, exactly once, when `ttl` passes
    /// unconfirmed (on the store's clock). Idempotent by request id like [`deduct`](Self::deduct);
    /// counts against the per-user limit until cancelled or expired. A reservation is held in
    /// one segment (so its expiry and its units are decided atomically); a quantity no single
    /// segment holds is answered `Insufficient`.
    ///
    /// # Errors
    /// As [`deduct`](Self::deduct); [`Error::Config`] when the store's strategy is an unsafe
    /// baseline (reservations need `lua`, `lock` or `redlock`); [`Error::InvalidInput`] for a
    /// zero or over-long `ttl`.
    pub async fn reserve(&self, req: &Deduct, ttl: Duration) -> Result<Reserved> {
        let strategy = self.inner.store.strategy();
        if !matches!(
            strategy,
            crate::Strategy::Lua | crate::Strategy::Lock | crate::Strategy::Redlock
        ) {
            return Err(Error::Config(format!(
                "reservations need the lua, lock or redlock strategy, not {strategy}"
            )));
        }
        let ms = ttl.as_millis() as u64;
        if ms == 0 || ttl > self.inner.opts.request_ttl {
            return Err(Error::invalid(
                "ttl",
                "must be at least 1 ms and at most the request TTL",
            ));
        }
        // The generation the units are held in (not a re-read layout: a reload may have
        // happened since).
        let (d, generation) = self.measured(req, ms).await?;
        let id = |parts: &[Part]| {
            let seg = parts.first().map_or(0, |p| p.segment);
            format!("{}~{}~{}~{}", req.sku, generation, seg, req.request_id)
        };
        Ok(match d {
            Deduction::Applied { parts } => {
                crate::metrics::reservation("created");
                Reserved::Held {
                    id: id(&parts),
                    parts,
                }
            }
            Deduction::Replayed { parts } => Reserved::Replayed {
                id: id(&parts),
                parts,
            },
            other => Reserved::NotHeld(other),
        })
    }

    /// Confirms a reservation: its units become sold. Confirming one that expired or was
    /// cancelled sells nothing and says so; confirming twice is harmless.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed id; store errors (retry: it is idempotent).
    pub async fn confirm(&self, reservation: &str) -> Result<ReservationEnd> {
        self.end_reservation(reservation, true).await
    }

    /// Cancels a reservation: its units go back to their segment and the user's chance comes
    /// back. Cancelling twice is harmless; a confirmed one cannot be cancelled.
    ///
    /// # Errors
    /// As [`confirm`](Self::confirm).
    pub async fn cancel(&self, reservation: &str) -> Result<ReservationEnd> {
        self.end_reservation(reservation, false).await
    }

    async fn end_reservation(&self, reservation: &str, confirm: bool) -> Result<ReservationEnd> {
        let bad = || {
            Error::invalid(
                "reservation",
                "expected <sku>~<generation>~<segment>~<request id>",
            )
        };
        let mut it = reservation.splitn(4, '~');
        let (Some(sku), Some(generation), Some(seg), Some(rid)) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(bad());
        };
        let sku = Sku::new(sku)?;
        let rid = RequestId::new(rid)?;
        let generation: u64 = generation.parse().map_err(|_| bad())?;
        let index: u32 = seg.parse().map_err(|_| bad())?;
        if index >= MAX_SEGMENTS {
            return Err(bad());
        }
        let at = SegAddr {
            sku: &sku,
            generation,
            index,
        };
        let (state, changed, user, units) = match self
            .inner
            .store
            .reserve_end(
                at,
                &rid,
                if confirm {
                    ReservationAction::Confirm
                } else {
                    ReservationAction::Cancel
                },
            )
            .await?
        {
            ReserveEnd::Done { state, user, units } => (state, true, user, units),
            ReserveEnd::Ended { state, user, units } => (state, false, user, units),
            ReserveEnd::Unknown | ReserveEnd::Stale => {
                return Ok(ReservationEnd {
                    state: None,
                    done: false,
                });
            }
        };
        let done = changed
            && state
                == if confirm {
                    ResvState::Confirmed
                } else {
                    ResvState::Cancelled
                };
        // The user's record follows (idempotent; a crash here is repaired when the user next
        // reaches the limit, by verify_stale).
        if let Ok(user) = UserId::new(&user)
            && units > 0
        {
            let how = match state {
                ResvState::Confirmed => Some(UserFinish::Sold),
                ResvState::Cancelled | ResvState::Expired => Some(UserFinish::Void),
                ResvState::Reserved => None,
            };
            if let Some(how) = how {
                let req = Deduct {
                    sku: sku.clone(),
                    user: user.clone(),
                    qty: units,
                    request_id: rid.clone(),
                };
                let args = self.args(&req, &Trace::recovering(RequestKind::Reservation));
                self.inner
                    .store
                    .user_finish(&sku, generation, args, how)
                    .await?;
                if how == UserFinish::Void {
                    self.inner.guard.forget(&sku, &user);
                }
            }
        }
        if done {
            crate::metrics::reservation(if confirm { "confirmed" } else { "cancelled" });
        }
        let _ = units;
        Ok(ReservationEnd {
            state: Some(state),
            done,
        })
    }

    /// One round of the sweeper over the SKUs this engine has used (what [`start_sweeper`]
    /// runs periodically):
    /// - a cached layout whose SKU metadata is gone or of another generation (a reload
    ///   elsewhere, or Redis lost its data) is dropped, with a warning, so no call goes on
    ///   using a stale layout, limit or segment count;
    /// - expired reservations go back to their stock;
    /// - fallback claims whose holder let the lease run out (crashed, or the call's future was
    ///   dropped) are taken over: a complete one is settled as applied, an incomplete one is
    ///   refunded and sealed (a retry of its request id gets [`Error::Sealed`]); the user's
    ///   per-user entry follows.
    ///
    /// Returns the reservation units given back.
    ///
    /// [`start_sweeper`]: Self::start_sweeper
    ///
    /// # Errors
    /// Store errors.
    pub async fn sweep(&self) -> Result<u64> {
        let layouts: Vec<(Sku, Arc<Layout>)> = self
            .inner
            .layouts
            .iter()
            .map(|e| (e.key().clone(), Arc::clone(e.value())))
            .collect();
        let mut back = 0;
        for (sku, l) in layouts {
            match self.inner.store.meta(&sku).await? {
                Some(m) if m.generation == l.generation => {}
                other => {
                    tracing::warn!(sku = %sku, cached = l.generation,
                        now = ?other.map(|m| m.generation),
                        "SKU metadata is gone or changed generation; dropping the cached layout");
                    self.forget(&sku, l.generation);
                    continue;
                }
            }
            let mut reserved = 0;
            for index in 0..l.segments {
                let seg = self.seg(&l, &sku, index);
                // Each call returns at most one batch (64 reservations): repeat while it
                // finds some.
                for _ in 0..1000 {
                    let (units, held) = self.inner.store.reclaim(seg).await?;
                    back += units;
                    if units == 0 {
                        reserved += held;
                        break;
                    }
                }
                if let Err(e) = self.recover_claims(&l, seg).await {
                    tracing::warn!(sku = %sku, segment = index, error = %e,
                        "recovering abandoned claims failed; next sweep retries");
                }
            }
            crate::metrics::reserved(&self.inner.sku_labels, sku.as_str(), reserved);
        }
        if back > 0 {
            crate::metrics::reservations_expired(back);
        }
        Ok(back)
    }

    /// Takes over the fallback claims at `seg` (their home) whose lease ran out, and settles
    /// or refunds and seals them (see [`sweep`](Self::sweep)). Returns how many it recovered.
    async fn recover_claims(&self, l: &Layout, seg: SegAddr<'_>) -> Result<usize> {
        let store = &self.inner.store;
        let mut recovered = 0;
        // One more lease of grace: holders do not renew, and a slow live one should finish
        // its own request rather than find it sealed.
        let grace = self.inner.opts.claim_lease.as_millis() as u64;
        for c in store.claims_due(seg, CLAIMS_PER_SWEEP, grace).await? {
            let req = Deduct {
                sku: seg.sku.clone(),
                user: c.user,
                qty: c.qty,
                request_id: c.request_id,
            };
            let tr = Trace::recovering(c.kind);
            let home_at = self.home_of(l, &req);
            if home_at.index != seg.index {
                continue; // indexed under another segment count: not ours to judge
            }
            let TakeoverReply::Won { epoch, home_part } =
                store.takeover(home_at, self.args(&req, &tr)).await?
            else {
                continue; // settled, renewed or taken over meanwhile
            };
            let outcome = match self
                .reconcile_as(l, &req, epoch, home_part, &tr, true)
                .await
            {
                Ok(outcome) => outcome,
                Err(e) => {
                    // One claim that cannot be judged (e.g. its id is taken by a live part of
                    // another request) must not hold up the others.
                    tracing::warn!(sku = %req.sku, request_id = %req.request_id, error = %e,
                        "abandoned claim not recovered");
                    continue;
                }
            };
            recovered += 1;
            tracing::info!(sku = %req.sku, request_id = %req.request_id,
                outcome = ?outcome_name(&outcome), "recovered an abandoned fallback claim");
            if l.user_limit > 0 {
                let how = match outcome {
                    Done(Deduction::Replayed { .. }) => match c.kind {
                        RequestKind::Sale => Some(UserFinish::Sold),
                        RequestKind::Reservation => {
                            self.reservation_finish(l, &req, home_at).await?
                        }
                    },
                    Done(Deduction::SoldOut) | Refused(_) => Some(UserFinish::Void),
                    _ => None,
                };
                if let Some(how) = how {
                    store
                        .user_finish(&req.sku, l.generation, self.args(&req, &tr), how)
                        .await?;
                }
            }
        }
        Ok(recovered)
    }

    /// Starts the sweeper: [`sweep`](Self::sweep) every `every`. It holds no strong reference
    /// to the engine (it ends when the engine is dropped) and stops when the returned handle is
    /// dropped. Lazy reclaim inside every script returns stock even with no sweeper running.
    pub fn start_sweeper(&self, every: Duration) -> Sweeper {
        let weak = Arc::downgrade(&self.inner);
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                let engine = Engine { inner };
                if let Err(e) = engine.sweep().await {
                    tracing::warn!(error = %e, "sweep failed; retrying next round");
                }
            }
        });
        Sweeper { task }
    }

    /// Deducts `req.qty` units: see the [module docs](self) for the route a request takes.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (quantity), [`Error::NotLoaded`], [`Error::NotReady`],
    /// [`Error::RequestIdConflict`] (same id, other user, quantity or kind — e.g. the id of a
    /// reservation), [`Error::Sealed`], and store errors — after which the outcome is unknown
    /// and the request may be retried with the same id.
    pub async fn deduct(&self, req: &Deduct) -> Result<Deduction> {
        self.measured(req, 0).await.map(|(d, _)| d)
    }

    /// Runs a deduction (`resv_ms` = 0) or reservation and records its outcome, latency and
    /// segment attempts. Also returns the load generation the outcome belongs to.
    async fn measured(&self, req: &Deduct, resv_ms: u64) -> Result<(Deduction, u64)> {
        let start = Instant::now();
        let trace = Trace::new(resv_ms);
        let r = self.deduct_traced(req, &trace).await;
        match &r {
            Ok((d, _)) => crate::metrics::deduction(
                d.kind(),
                self.inner.store.strategy().name(),
                start.elapsed(),
                trace.attempts.load(std::sync::atomic::Ordering::Relaxed),
            ),
            Err(e) => crate::metrics::error(e),
        }
        r
    }

    async fn deduct_traced(&self, req: &Deduct, tr: &Trace) -> Result<(Deduction, u64)> {
        check_qty("qty", req.qty, self.inner.opts.max_qty)?;
        let (mut stale, mut restarts) = (0, 0);
        loop {
            let layout = self.layout(&req.sku).await?;
            let flow = if layout.user_limit > 0 {
                self.deduct_limited(&layout, req, tr).await?
            } else {
                self.deduct_in(&layout, req, tr).await?
            };
            match flow {
                Done(d) => {
                    self.maybe_gauges(&layout, &req.sku);
                    return Ok((d, layout.generation));
                }
                Refused(e) => return Err(e),
                Stale => {
                    self.forget(&req.sku, layout.generation);
                    stale += 1;
                    if stale == STALE_RETRIES {
                        return Err(Error::NotReady(req.sku.to_string()));
                    }
                }
                // A twin released the claim we waited for (it sold nothing): try afresh. Twins
                // racing for the claim of a sold-out SKU can do this a few times.
                Restart => {
                    restarts += 1;
                    if restarts == MAX_RESTARTS {
                        return Ok((Deduction::InFlight, layout.generation));
                    }
                }
            }
        }
    }

    /// The per-user limit in two layers: the in-process guard filters double clicks and users
    /// this process already saw at the limit; the store's user record decides.
    async fn deduct_limited(
        &self,
        l: &Arc<Layout>,
        req: &Deduct,
        tr: &Trace,
    ) -> Result<Flow<Deduction>> {
        use crate::guard::Local;
        let limit = l.user_limit;
        if req.qty > limit {
            // Answered from the cached layout alone: make sure it is still the SKU's (a
            // reload may have changed the limit).
            return Ok(if self.is_current(l, &req.sku).await? {
                Done(Deduction::LimitReached { limit })
            } else {
                Stale
            });
        }
        let g = &self.inner.guard;
        let attempt = g.enter(
            l.generation,
            &req.sku,
            &req.user,
            &req.request_id,
            req.qty,
            limit,
        );
        crate::metrics::guard(attempt.is_err(), g);
        let attempt = match attempt {
            Ok(a) => a,
            Err(Local::InFlight) => return Ok(Done(Deduction::UserBusy)),
            // This process saw the user's units; but a retry of a request applied through
            // another instance must still replay.
            Err(_) => return self.replay_or_limit(l, req, tr).await,
        };
        let r = self.deduct_counted(l, req, tr).await;
        match &r {
            // Remember only units sold for good: pending claims and reservations may still be
            // given back, and the store must see the next attempt.
            Ok((Done(Deduction::LimitReached { .. }), Some(final_units))) => {
                attempt.saturate(*final_units)
            }
            Ok((Done(Deduction::Applied { parts } | Deduction::Replayed { parts }), _))
                if tr.kind == RequestKind::Sale =>
            {
                attempt.finish(parts.iter().map(|p| p.units).sum())
            }
            _ => attempt.finish(0),
        }
        r.map(|(flow, _)| flow)
    }

    /// "Limit reached" — unless this very request applied before (a retry, perhaps through
    /// another instance): then its replay; or its request id is taken by another request
    /// (other user, quantity or kind): then that conflict; or the cached layout is no longer
    /// the SKU's: then stale. One round trip (home record and metadata, pipelined).
    async fn replay_or_limit(
        &self,
        l: &Layout,
        req: &Deduct,
        tr: &Trace,
    ) -> Result<Flow<Deduction>> {
        // The limit and the ledger come from the cached layout: make sure it is still the SKU's
        // (a reload elsewhere may have changed the limit), in the same round trip.
        let (rec, current) = futures::join!(
            self.inner
                .store
                .record(self.home_of(l, req), &req.request_id),
            self.is_current(l, &req.sku)
        );
        if !current? {
            return Ok(Stale);
        }
        let rec = rec?;
        let limit = Done(Deduction::LimitReached {
            limit: l.user_limit,
        });
        let Some(rec) = rec else { return Ok(limit) };
        let field = if rec.user != req.user.as_str() {
            "user"
        } else if rec.qty != req.qty {
            "qty"
        } else if rec.kind != tr.kind {
            "kind"
        } else {
            return Ok(match rec.state {
                RecordState::Applied(parts) => Done(Deduction::Replayed { parts }),
                RecordState::Sealed => Refused(Error::Sealed(req.request_id.to_string())),
                RecordState::Pending { .. } => limit,
            });
        };
        Ok(Refused(Self::conflict(req, field)))
    }

    /// Claim in the user record, deduct, then settle the user record (see `user_claim.lua`
    /// for why this compensated two-step is exact). With a "limit reached", the units the user
    /// holds for good (sold) when the store knows them.
    async fn deduct_counted(
        &self,
        l: &Arc<Layout>,
        req: &Deduct,
        tr: &Trace,
    ) -> Result<(Flow<Deduction>, Option<u64>)> {
        let store = &self.inner.store;
        let args = self.args(req, tr);
        let claim_ttl = self.inner.opts.user_claim_ttl.as_millis() as u64;
        // After a sell-out most buyers are turned away: answer them from a fresh read before
        // touching the user record (nothing would be sold, so nothing needs counting).
        if (0..l.segments).all(|i| l.hints.likely_short(i, req.qty)) {
            match self.check_short(l, req, tr).await? {
                Short::Decided(d) => return Ok((Done(d), None)),
                Short::Stale => return Ok((Stale, None)),
                Short::Refused(e) => return Ok((Refused(e), None)),
                Short::Pending | Short::Go => {}
            }
        }
        // Armed before the claim is sent: a call dropped while its claim is in flight must not
        // leave the entry pending either.
        let mut pending = PendingEntry {
            engine: self,
            layout: l,
            req,
            resv: tr.resv,
            armed: true,
        };
        let mut verified = false;
        loop {
            let claim = store
                .user_claim(&req.sku, l.generation, args, l.user_limit, claim_ttl)
                .await;
            if claim.is_err() {
                pending.armed = false; // unknown: a retry with the same id finds its entry
            }
            match claim? {
                UserClaim::Ok | UserClaim::Dup { .. } => break,
                UserClaim::Mismatch(f) => {
                    pending.armed = false;
                    return Err(Self::conflict(req, f));
                }
                UserClaim::Limit {
                    used,
                    final_used,
                    fresh_pending,
                    stale,
                } => {
                    if verified || stale.is_empty() {
                        // Refuse with "limit reached" only for units the user holds (sold, or
                        // reserved and live); attempts still pending may give theirs back.
                        let in_flight: u64 = fresh_pending
                            + stale
                                .iter()
                                .filter(|e| !e.reserved)
                                .map(|e| e.qty)
                                .sum::<u64>();
                        let limit = l.user_limit;
                        pending.armed = false; // refused: nothing was claimed
                        if used.saturating_sub(in_flight) + req.qty > limit {
                            let flow = self.replay_or_limit(l, req, tr).await?;
                            return Ok((flow, Some(final_used)));
                        }
                        return Ok((Done(Deduction::UserBusy), None));
                    }
                    let checked = self.verify_stale(l, req, &stale).await;
                    if checked.is_err() {
                        pending.armed = false;
                    }
                    checked?;
                    verified = true;
                }
            }
        }
        let flow = match self.deduct_in(l, req, tr).await {
            Ok(flow) => flow,
            Err(e) => {
                // The outcome is unknown: the entry stays pending, a retry with the same id
                // finds it (or it is verified once it lingers).
                pending.armed = false;
                return Err(e);
            }
        };
        let held = match tr.kind {
            RequestKind::Reservation => UserFinish::Reserved,
            RequestKind::Sale => UserFinish::Sold,
        };
        let how = match &flow {
            // A replayed reservation may have ended since (expired, cancelled, confirmed): its
            // entry follows its state, never "reserved" for units it no longer holds.
            Done(Deduction::Replayed { .. }) if tr.kind == RequestKind::Reservation => {
                self.reservation_finish(l, req, self.home_of(l, req))
                    .await?
            }
            Done(Deduction::Applied { .. } | Deduction::Replayed { .. }) => Some(held),
            Done(Deduction::SoldOut | Deduction::Insufficient { .. }) | Refused(_) => {
                Some(UserFinish::Void)
            }
            // In flight, restarted or stale: the entry stays pending (verified if it lingers).
            _ => None,
        };
        // Still armed here: dropped during this write, the entry is resolved all the same.
        if let Some(how) = how {
            store.user_finish(&req.sku, l.generation, args, how).await?;
        }
        pending.armed = false;
        Ok((flow, None))
    }

    /// Resolves per-user entries whose claimer is presumed dead (pending past expiry) or
    /// whose reservation may have ended: counted for good if their request applied, removed
    /// once the request is sealed so it never can.
    async fn verify_stale(&self, l: &Layout, req: &Deduct, stale: &[StaleEntry]) -> Result<()> {
        for e in stale {
            if let Some(how) = self.resolve_entry(l, req, e).await? {
                let counted = Deduct {
                    qty: e.qty,
                    request_id: e.request_id.clone(),
                    ..req.clone()
                };
                let args = self.args(&counted, &Trace::recovering(e.kind));
                self.inner
                    .store
                    .user_finish(&req.sku, l.generation, args, how)
                    .await?;
            }
        }
        Ok(())
    }

    /// What a per-user entry of `req.user` should become (`None`: leave it for now).
    async fn resolve_entry(
        &self,
        l: &Layout,
        req: &Deduct,
        e: &StaleEntry,
    ) -> Result<Option<UserFinish>> {
        let store = &self.inner.store;
        let other = Deduct {
            sku: req.sku.clone(),
            user: req.user.clone(),
            qty: e.qty,
            request_id: e.request_id.clone(),
        };
        let at = self.home_of(l, &other);
        if e.reserved {
            // A reservation counts until it is confirmed, cancelled or expired.
            return self.reservation_finish(l, &other, at).await;
        }
        let mut kind = e.kind;
        for flips in 0..2 {
            let tr = Trace::recovering(kind);
            let args = self.args(&other, &tr);
            let applied = match store.seal(at, args).await? {
                SealReply::Sealed => Some(false),
                SealReply::Applied => Some(true),
                // Same user and quantity, other kind: the record is this user's request under
                // this id after all (an entry counted under the wrong kind); judge it as what
                // it is.
                SealReply::Mismatch("kind") if flips == 0 => {
                    kind = match kind {
                        RequestKind::Sale => RequestKind::Reservation,
                        RequestKind::Reservation => RequestKind::Sale,
                    };
                    continue;
                }
                // The home record belongs to another request: this one can never apply.
                SealReply::Mismatch(_) => Some(false),
                SealReply::Pending { lease_left_ms: 0 } => match store.takeover(at, args).await? {
                    TakeoverReply::Won { epoch, home_part } => {
                        match self
                            .reconcile_as(l, &other, epoch, home_part, &tr, true)
                            .await?
                        {
                            Done(Deduction::Replayed { .. }) => Some(true),
                            Done(Deduction::SoldOut) | Refused(_) => Some(false),
                            _ => None,
                        }
                    }
                    TakeoverReply::Replay(_) => Some(true),
                    TakeoverReply::Sealed | TakeoverReply::Mismatch(_) => Some(false),
                    TakeoverReply::Pending { .. } | TakeoverReply::Gone => None,
                },
                SealReply::Pending { .. } => None,
            };
            return Ok(match applied {
                Some(false) => Some(UserFinish::Void),
                Some(true) if kind == RequestKind::Sale => Some(UserFinish::Sold),
                // A reservation that applied: it counts only while it holds its units.
                Some(true) => self.reservation_finish(l, &other, at).await?,
                None => None,
            });
        }
        Ok(None)
    }

    /// What the per-user entry of a reservation should become, from its state.
    async fn reservation_finish(
        &self,
        l: &Layout,
        req: &Deduct,
        home_at: SegAddr<'_>,
    ) -> Result<Option<UserFinish>> {
        Ok(
            match self
                .reservation_state(l, &req.sku, &req.request_id, home_at)
                .await?
            {
                None | Some(ResvState::Expired | ResvState::Cancelled) => Some(UserFinish::Void),
                Some(ResvState::Confirmed) => Some(UserFinish::Sold),
                Some(ResvState::Reserved) => Some(UserFinish::Reserved),
            },
        )
    }

    /// Where a request's reservation lives (its home record's part) and its state there.
    async fn reservation_state(
        &self,
        l: &Layout,
        sku: &Sku,
        rid: &RequestId,
        home_at: SegAddr<'_>,
    ) -> Result<Option<ResvState>> {
        let Some(rec) = self.inner.store.record(home_at, rid).await? else {
            return Ok(None);
        };
        let parts = match rec.state {
            RecordState::Applied(parts) => parts,
            RecordState::Pending { .. } => return Ok(Some(ResvState::Reserved)), // being placed
            RecordState::Sealed => return Ok(None),
        };
        let Some(part) = parts.first() else {
            return Ok(None);
        };
        let at = SegAddr {
            sku,
            generation: l.generation,
            index: part.segment,
        };
        Ok(
            match self
                .inner
                .store
                .reserve_end(at, rid, ReservationAction::Inspect)
                .await?
            {
                ReserveEnd::Done { state, .. } | ReserveEnd::Ended { state, .. } => Some(state),
                ReserveEnd::Unknown | ReserveEnd::Stale => None,
            },
        )
    }

    /// Sets the remaining-units gauges from the hints, at most every 100 ms per SKU.
    fn maybe_gauges(&self, l: &Layout, sku: &Sku) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = l.born.elapsed().as_millis() as u64 + 100;
        let last = l.gauges_at.load(Relaxed);
        if now < last + 100
            || l.gauges_at
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_err()
        {
            return;
        }
        crate::metrics::remaining(&self.inner.sku_labels, sku.as_str(), &l.hints.observed());
    }

    /// The store's view of `req` for a call of `tr`'s kind.
    fn args<'a>(&self, req: &'a Deduct, tr: &Trace) -> ReqArgs<'a> {
        ReqArgs {
            request_id: &req.request_id,
            user: &req.user,
            qty: req.qty,
            // A reservation's records (its claim and home record too, not only the part that
            // holds the units) outlive the reservation by the request TTL.
            ttl_ms: self.ttl_ms() + tr.resv,
            lease_ms: self.inner.opts.claim_lease.as_millis() as u64,
            resv_ttl_ms: tr.resv,
            kind: tr.kind,
        }
    }

    /// Segment `index` of `l`'s generation.
    fn seg<'a>(&self, l: &Layout, sku: &'a Sku, index: u32) -> SegAddr<'a> {
        SegAddr {
            sku,
            generation: l.generation,
            index,
        }
    }

    /// `req`'s home segment.
    fn home_of<'a>(&self, l: &Layout, req: &'a Deduct) -> SegAddr<'a> {
        self.seg(l, &req.sku, home(&req.request_id, l.segments))
    }

    fn conflict(req: &Deduct, field: &'static str) -> Error {
        Error::RequestIdConflict {
            request_id: req.request_id.to_string(),
            field,
        }
    }

    async fn deduct_in(&self, l: &Layout, req: &Deduct, tr: &Trace) -> Result<Flow<Deduction>> {
        let store = &self.inner.store;
        let args = self.args(req, tr);
        let home_at = self.home_of(l, req);
        let home = home_at.index;

        if l.hints.likely_short(home, req.qty) {
            // Home looks short: one read of everything (and of this request's record) decides
            // between replay, sold out, insufficient, and going to claim.
            match self.check_short(l, req, tr).await? {
                Short::Decided(d) => return Ok(Done(d)),
                Short::Pending => return self.wait_for_claim(l, req, tr).await,
                Short::Stale => return Ok(Stale),
                Short::Refused(e) => return Ok(Refused(e)),
                Short::Go => {}
            }
        }

        tr.attempt();
        match store.deduct_home(home_at, args, OnShort::Claim).await? {
            HomeReply::Applied { stock_after } => {
                l.hints.observe(home, stock_after);
                Ok(Done(Deduction::Applied {
                    parts: vec![Part {
                        segment: home,
                        units: req.qty,
                    }],
                }))
            }
            HomeReply::Replay(parts) => Ok(Done(Deduction::Replayed { parts })),
            HomeReply::Mismatch(f) => Ok(Refused(Self::conflict(req, f))),
            HomeReply::Stale => Ok(Stale),
            HomeReply::Sealed => Ok(Refused(Error::Sealed(req.request_id.to_string()))),
            HomeReply::Pending { .. } => self.wait_for_claim(l, req, tr).await,
            HomeReply::Short { stock, claimed } => {
                l.hints.observe(home, stock);
                if !claimed {
                    return Err(Error::Protocol("deduct: short without claim".into()));
                }
                crate::metrics::fallback();
                self.fallback(l, req, 1, tr).await
            }
        }
    }

    /// Reads every segment (coalesced) and this request's home record: enough to answer a
    /// replay, sold out or insufficient without writing anything.
    async fn check_short(&self, l: &Layout, req: &Deduct, tr: &Trace) -> Result<Short> {
        let at = self.home_of(l, req);
        let (segs, rec) = futures::join!(
            self.read_segments(l, &req.sku),
            self.inner.store.record(at, &req.request_id)
        );
        let Some(stocks) = observe(l, &segs?) else {
            return Ok(Short::Stale);
        };
        if let Some(rec) = rec? {
            let field = if rec.user != req.user.as_str() {
                Some("user")
            } else if rec.qty != req.qty {
                Some("qty")
            } else if rec.kind != tr.kind {
                Some("kind")
            } else {
                None
            };
            if let Some(f) = field {
                return Ok(Short::Refused(Self::conflict(req, f)));
            }
            return Ok(match rec.state {
                RecordState::Applied(parts) => Short::Decided(Deduction::Replayed { parts }),
                RecordState::Pending { .. } => Short::Pending,
                RecordState::Sealed => Short::Refused(Error::Sealed(req.request_id.to_string())),
            });
        }
        let total: u64 = stocks.iter().map(|(_, s)| s).sum();
        Ok(if total == 0 {
            Short::Decided(Deduction::SoldOut)
        } else if total < req.qty {
            Short::Decided(Deduction::Insufficient { available: total })
        } else {
            Short::Go
        })
    }

    /// Another call holds this request's claim: wait for it to finish, or take it over once
    /// its lease ran out on the store's clock.
    async fn wait_for_claim(
        &self,
        l: &Layout,
        req: &Deduct,
        tr: &Trace,
    ) -> Result<Flow<Deduction>> {
        let store = &self.inner.store;
        let args = self.args(req, tr);
        let home_at = self.home_of(l, req);
        let deadline = Instant::now() + self.inner.opts.pending_wait;
        let mut pause = Duration::from_millis(1);
        loop {
            match store.takeover(home_at, args).await? {
                TakeoverReply::Replay(parts) => return Ok(Done(Deduction::Replayed { parts })),
                TakeoverReply::Gone => return Ok(Restart),
                TakeoverReply::Sealed => {
                    return Ok(Refused(Error::Sealed(req.request_id.to_string())));
                }
                TakeoverReply::Mismatch(f) => return Ok(Refused(Self::conflict(req, f))),
                TakeoverReply::Won { epoch, home_part } => {
                    return self.reconcile_as(l, req, epoch, home_part, tr, false).await;
                }
                TakeoverReply::Pending { lease_left_ms, .. } => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(Done(Deduction::InFlight));
                    }
                    let wait = pause
                        .min(Duration::from_millis(lease_left_ms.max(1)))
                        .min(deadline - now);
                    tokio::time::sleep(wait).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        }
    }

    /// After a takeover: fence every other segment, count what the previous holder took, and
    /// either settle it (it was complete) or refund it and — unless `cancel` — serve the
    /// request afresh. With `cancel` (a verified-void per-user claim, or an abandoned claim the
    /// sweeper recovers) an incomplete request is refunded and sealed.
    async fn reconcile_as(
        &self,
        l: &Layout,
        req: &Deduct,
        epoch: u64,
        home_part: u64,
        tr: &Trace,
        cancel: bool,
    ) -> Result<Flow<Deduction>> {
        let store = &self.inner.store;
        let args = self.args(req, tr);
        let home_at = self.home_of(l, req);
        let home = home_at.index;
        let fences = others(home, l.segments).map(|j| async move {
            (
                j,
                store.shut_out(self.seg(l, &req.sku, j), args, epoch).await,
            )
        });
        let mut parts = Vec::new();
        if home_part > 0 {
            parts.push(Part {
                segment: home,
                units: home_part,
            });
        }
        let mut taken_by_other = None;
        for (j, r) in futures::future::join_all(fences).await {
            match r? {
                ShutOutReply::Clear => {}
                ShutOutReply::Applied { part } if part > 0 => parts.push(Part {
                    segment: j,
                    units: part,
                }),
                ShutOutReply::Applied { .. } => {}
                ShutOutReply::Superseded => return Ok(Done(Deduction::InFlight)),
                ShutOutReply::Mismatch(f) => taken_by_other = Some(f),
            }
        }
        if let Some(f) = taken_by_other {
            // A live part of another request under this id: this one can never complete. Give
            // back what it took and seal it, rather than leave its units stranded.
            return self
                .give_up(l, req, epoch, &parts, tr, f, SettleAs::Seal)
                .await;
        }
        let taken: u64 = parts.iter().map(|p| p.units).sum();
        if taken == req.qty {
            parts.sort();
            return Ok(
                match store
                    .settle(home_at, args, epoch, SettleAs::Applied(&parts))
                    .await?
                {
                    SettleReply::Ok => Done(Deduction::Replayed { parts }),
                    SettleReply::Applied(parts) => Done(Deduction::Replayed { parts }),
                    // A newer holder took over (or released) meanwhile: it decides.
                    SettleReply::Superseded | SettleReply::Gone => Done(Deduction::InFlight),
                },
            );
        }
        self.refund_all(l, req, epoch, &parts, tr).await?;
        if cancel {
            return Ok(
                match store.settle(home_at, args, epoch, SettleAs::Seal).await? {
                    SettleReply::Ok | SettleReply::Gone => Done(Deduction::SoldOut),
                    SettleReply::Applied(parts) => Done(Deduction::Replayed { parts }),
                    SettleReply::Superseded => Done(Deduction::InFlight),
                },
            );
        }
        self.fallback(l, req, epoch, tr).await
    }

    async fn refund_all(
        &self,
        l: &Layout,
        req: &Deduct,
        epoch: u64,
        parts: &[Part],
        tr: &Trace,
    ) -> Result<()> {
        let store = &self.inner.store;
        let args = self.args(req, tr);
        let home = home(&req.request_id, l.segments);
        let refunds = parts.iter().map(|p| {
            store.refund(
                self.seg(l, &req.sku, p.segment),
                args,
                epoch,
                SegmentRole::of(p.segment, home),
            )
        });
        let back = futures::future::try_join_all(refunds).await?;
        for (p, _) in parts.iter().zip(back) {
            l.hints.forget(p.segment); // stock came back: don't skip it
        }
        Ok(())
    }

    /// The claim holder's path: other segments, then a fresh read, then an all-or-nothing
    /// multi-segment take. Ends by settling (applied) or releasing the claim.
    async fn fallback(
        &self,
        l: &Layout,
        req: &Deduct,
        epoch: u64,
        tr: &Trace,
    ) -> Result<Flow<Deduction>> {
        let store = &self.inner.store;
        let args = self.args(req, tr);
        let qty = req.qty;
        let home_at = self.home_of(l, req);
        let home = home_at.index;
        let at = |index| self.seg(l, &req.sku, index);

        // 1. Whole quantity from one other segment, skipping fresh "short" hints.
        for j in others(home, l.segments) {
            if l.hints.likely_short(j, qty) {
                crate::metrics::empty_skip();
                continue;
            }
            tr.attempt();
            match store
                .take(at(j), args, qty, epoch, SegmentRole::Fallback)
                .await?
            {
                TakeReply::Taken { stock_after, part } => {
                    l.hints.observe(j, stock_after);
                    let parts = [Part {
                        segment: j,
                        units: part,
                    }];
                    return self.settle(l, req, epoch, &parts, tr).await;
                }
                TakeReply::Short { stock } => l.hints.observe(j, stock),
                TakeReply::Superseded => return self.superseded(l, req, tr).await,
                TakeReply::Mismatch(f) => {
                    return self
                        .give_up(l, req, epoch, &[], tr, f, SettleAs::Release)
                        .await;
                }
                TakeReply::Stale => return Ok(Stale),
            }
        }

        // 2. Read everything; then one segment if any can, else all or nothing across several.
        let mut available = 0;
        for _ in 0..self.inner.opts.fallback_rounds {
            let segs = self.read_segments(l, &req.sku).await?;
            let Some(stocks) = observe(l, &segs) else {
                return Ok(Stale);
            };
            available = stocks.iter().map(|(_, s)| s).sum();
            if available < qty {
                break;
            }
            let single = std::iter::once(home)
                .chain(others(home, l.segments))
                .find(|j| stocks[*j as usize].1 >= qty);
            let plan = match single {
                Some(j) => vec![(j, qty)],
                // A reservation lives in one segment, so that its expiry and its units are
                // decided in one atomic step (see reserve_end.lua).
                None if tr.resv > 0 => break,
                None => plan_split(&stocks, qty).unwrap_or_default(),
            };
            let mut parts = Vec::with_capacity(plan.len());
            let mut complete = true;
            if plan.len() > 1 {
                crate::metrics::multi_segment();
            }
            for (j, want) in plan {
                tr.attempt();
                match store
                    .take(at(j), args, want, epoch, SegmentRole::of(j, home))
                    .await?
                {
                    TakeReply::Taken { stock_after, part } => {
                        l.hints.observe(j, stock_after);
                        parts.push(Part {
                            segment: j,
                            units: part,
                        });
                    }
                    TakeReply::Short { stock } => {
                        l.hints.observe(j, stock);
                        complete = false;
                        break;
                    }
                    TakeReply::Superseded => return self.superseded(l, req, tr).await,
                    TakeReply::Mismatch(f) => {
                        return self
                            .give_up(l, req, epoch, &parts, tr, f, SettleAs::Release)
                            .await;
                    }
                    TakeReply::Stale => return Ok(Stale),
                }
            }
            if complete && parts.iter().map(|p| p.units).sum::<u64>() == qty {
                parts.sort();
                return self.settle(l, req, epoch, &parts, tr).await;
            }
            self.refund_all(l, req, epoch, &parts, tr).await?;
        }

        // 3. Nothing sold: release the claim so the request id stays free.
        match store
            .settle(home_at, args, epoch, SettleAs::Release)
            .await?
        {
            SettleReply::Ok | SettleReply::Gone => {}
            SettleReply::Applied(parts) => return Ok(Done(Deduction::Replayed { parts })),
            SettleReply::Superseded => return Ok(Done(Deduction::InFlight)),
        }
        Ok(Done(if available == 0 {
            Deduction::SoldOut
        } else {
            Deduction::Insufficient { available }
        }))
    }

    /// The claim holder met a live part of another request under this id at some segment
    /// (its request id is taken): refund what it took, end the claim `how` (released; or
    /// sealed, when an older holder of it must never complete it), refuse.
    #[allow(clippy::too_many_arguments)]
    async fn give_up(
        &self,
        l: &Layout,
        req: &Deduct,
        epoch: u64,
        parts: &[Part],
        tr: &Trace,
        field: &'static str,
        how: SettleAs<'_>,
    ) -> Result<Flow<Deduction>> {
        self.refund_all(l, req, epoch, parts, tr).await?;
        let ended = self
            .inner
            .store
            .settle(self.home_of(l, req), self.args(req, tr), epoch, how)
            .await?;
        Ok(match ended {
            SettleReply::Ok | SettleReply::Gone => Refused(Self::conflict(req, field)),
            SettleReply::Applied(parts) => Done(Deduction::Replayed { parts }),
            SettleReply::Superseded => Done(Deduction::InFlight),
        })
    }

    async fn settle(
        &self,
        l: &Layout,
        req: &Deduct,
        epoch: u64,
        parts: &[Part],
        tr: &Trace,
    ) -> Result<Flow<Deduction>> {
        let home_at = self.home_of(l, req);
        Ok(
            match self
                .inner
                .store
                .settle(home_at, self.args(req, tr), epoch, SettleAs::Applied(parts))
                .await?
            {
                SettleReply::Ok => Done(Deduction::Applied {
                    parts: parts.to_vec(),
                }),
                SettleReply::Applied(parts) => Done(Deduction::Replayed { parts }),
                // A newer holder fenced us (and counts our parts), or released the claim after
                // refunding them: either way our parts are not ours to report.
                SettleReply::Superseded | SettleReply::Gone => Done(Deduction::InFlight),
            },
        )
    }

    /// Our claim was taken over while we worked: report what the record says now.
    async fn superseded(&self, l: &Layout, req: &Deduct, tr: &Trace) -> Result<Flow<Deduction>> {
        let home_at = self.home_of(l, req);
        Ok(
            match self
                .inner
                .store
                .takeover(home_at, self.args(req, tr))
                .await?
            {
                TakeoverReply::Replay(parts) => Done(Deduction::Replayed { parts }),
                TakeoverReply::Mismatch(f) => return Err(Self::conflict(req, f)),
                _ => Done(Deduction::InFlight),
            },
        )
    }

    /// Adds `qty` units, spread evenly over the segments (shares differ by at most one, the
    /// larger ones starting at the request's home segment), once per `request_id`. Local hints are refreshed, so the units sell at once.
    ///
    /// # Errors
    /// [`Error::InvalidInput`]; [`Error::RequestIdConflict`] (same id, other quantity);
    /// [`Error::NotLoaded`]; store errors (retry with the same id).
    pub async fn restock(&self, sku: &Sku, qty: u64, request_id: &RequestId) -> Result<Restocked> {
        check_qty("qty", qty, MAX_UNITS)?;
        for _ in 0..STALE_RETRIES {
            let l = self.layout(sku).await?;
            // The request's home segment gets the first (never empty) share and is written
            // first: a retry with another quantity is caught there, before anything changes.
            let home = home(request_id, l.segments);
            let shares: Vec<(u32, u64)> = split(qty, l.segments)
                .into_iter()
                .enumerate()
                .map(|(k, a)| ((home + k as u32) % l.segments, a))
                .filter(|(_, a)| *a > 0)
                .collect();
            let call = |(index, units): (u32, u64)| {
                let seg = SegAddr {
                    sku,
                    generation: l.generation,
                    index,
                };
                async move {
                    let r = self
                        .inner
                        .store
                        .restock(seg, request_id, units, qty, self.ttl_ms())
                        .await;
                    (index, units, r)
                }
            };
            let mut results = vec![call(shares[0]).await];
            if matches!(
                results[0].2,
                Ok(RestockReply::Restocked { .. } | RestockReply::Replay { .. })
            ) {
                results
                    .extend(futures::future::join_all(shares[1..].iter().copied().map(call)).await);
            }
            let mut added = 0;
            let mut stale = false;
            let mut all_replay = true;
            for (i, units, r) in results {
                match r? {
                    RestockReply::Restocked { stock_after } => {
                        l.hints.observe(i, stock_after);
                        added += units;
                        all_replay = false;
                    }
                    RestockReply::Replay { stock } => l.hints.observe(i, stock),
                    RestockReply::Mismatch => {
                        return Err(Error::RequestIdConflict {
                            request_id: request_id.to_string(),
                            field: "qty",
                        });
                    }
                    RestockReply::Stale => stale = true,
                }
            }
            if stale {
                self.forget(sku, l.generation);
                continue;
            }
            return Ok(Restocked {
                added,
                replayed: all_replay,
            });
        }
        Err(Error::NotReady(sku.to_string()))
    }

    /// Units left, in total and per segment (one pipelined read).
    ///
    /// # Errors
    /// [`Error::NotLoaded`], [`Error::NotReady`], store errors.
    pub async fn remaining(&self, sku: &Sku) -> Result<Remaining> {
        for _ in 0..STALE_RETRIES {
            let l = self.layout(sku).await?;
            let segs = self.read_segments(&l, sku).await?;
            if let Some(stocks) = observe(&l, &segs) {
                let per_segment: Vec<u64> = stocks.iter().map(|(_, s)| *s).collect();
                crate::metrics::remaining(&self.inner.sku_labels, sku.as_str(), &per_segment);
                return Ok(Remaining {
                    total: per_segment.iter().sum(),
                    per_segment,
                });
            }
            self.forget(sku, l.generation);
        }
        Err(Error::NotReady(sku.to_string()))
    }

    /// Checks conservation for `sku`; see [`Audit`]. A failed check is a report, not an error.
    ///
    /// # Errors
    /// [`Error::NotLoaded`], [`Error::NotReady`], store errors.
    pub async fn audit(&self, sku: &Sku) -> Result<Audit> {
        let meta = self
            .inner
            .store
            .meta(sku)
            .await?
            .ok_or_else(|| Error::NotLoaded(sku.to_string()))?;
        if !meta.ready {
            return Err(Error::NotReady(sku.to_string()));
        }
        let reads = (0..meta.segments).map(|index| {
            self.inner.store.held(SegAddr {
                sku,
                generation: meta.generation,
                index,
            })
        });
        let segs = futures::future::try_join_all(reads).await?;
        let mut problems = Vec::new();
        let mut segments = Vec::with_capacity(segs.len());
        let (mut loaded, mut restocked, mut remaining, mut sold, mut reserved) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        for (i, h) in segs.iter().enumerate() {
            let state = h.map(|h| h.state).unwrap_or_default();
            let ok = match h {
                None => {
                    problems.push(format!("segment {i} is missing or of another generation"));
                    false
                }
                Some(h) => {
                    let s = &h.state;
                    let mut ok = s.loaded.checked_add(s.restocked)
                        == s.stock
                            .checked_add(s.sold)
                            .and_then(|x| x.checked_add(s.reserved));
                    if !ok {
                        problems.push(format!(
                            "segment {i}: loaded {} + restocked {} != remaining {} + reserved {} + sold {}",
                            s.loaded, s.restocked, s.stock, s.reserved, s.sold
                        ));
                    }
                    // Every reserved unit must belong to a live reservation (it comes back
                    // when that reservation ends); a unit held by nothing never would.
                    if s.reserved != h.held {
                        ok = false;
                        problems.push(format!(
                            "segment {i}: reserved {} but its {} live reservations hold {} ({})",
                            s.reserved,
                            h.live,
                            h.held,
                            if s.reserved > h.held {
                                format!("{} reserved units held by nothing", s.reserved - h.held)
                            } else {
                                format!(
                                    "{} held units not counted as reserved",
                                    h.held - s.reserved
                                )
                            }
                        ));
                    }
                    if h.orphans > 0 {
                        ok = false;
                        problems.push(format!(
                            "segment {i}: {} reservation index entries without a live reservation",
                            h.orphans
                        ));
                    }
                    ok
                }
            };
            loaded += state.loaded;
            restocked += state.restocked;
            remaining += state.stock;
            sold += state.sold;
            reserved += state.reserved;
            segments.push(SegmentAudit {
                index: i as u32,
                state,
                held: h.map_or(0, |h| h.held),
                reservations: h.map_or(0, |h| h.live),
                ok,
            });
        }
        if loaded != meta.loaded {
            problems.push(format!(
                "segments were loaded with {loaded} units but the SKU with {}",
                meta.loaded
            ));
        }
        if loaded + restocked != remaining + reserved + sold {
            problems.push(format!(
                "total: loaded {loaded} + restocked {restocked} != remaining {remaining} + reserved {reserved} + sold {sold}"
            ));
        }
        Ok(Audit {
            sku: sku.to_string(),
            generation: meta.generation,
            loaded: meta.loaded,
            restocked,
            remaining,
            sold,
            reserved,
            ok: problems.is_empty(),
            problems,
            segments,
        })
    }
}

/// A flow's outcome for logs.
fn outcome_name(f: &Flow<Deduction>) -> &'static str {
    match f {
        Done(d) => d.kind(),
        Stale => "stale",
        Restart => "restart",
        Refused(_) => "refused",
    }
}

/// Feeds a read of every segment into the hints; `None` when a segment is missing (the
/// layout changed).
fn observe(l: &Layout, segs: &[Option<SegmentState>]) -> Option<Vec<(u32, u64)>> {
    let mut out = Vec::with_capacity(segs.len());
    for (i, s) in segs.iter().enumerate() {
        let s = s.as_ref()?;
        l.hints.observe(i as u32, s.stock);
        out.push((i as u32, s.stock));
    }
    Some(out)
}
