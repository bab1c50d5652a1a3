//! The randomized workload the history checks run over, and the hook the nemesis
//! suite injects its faults through.
//!
//! Many tasks send deductions, reservations (short TTLs), confirms, cancels and restocks to
//! several [`Target`]s (engines with their own connection pools, or `serve` processes over
//! HTTP) sharing one SKU, with a per-user limit and few users, request ids reused (retries,
//! other users, other kinds, other quantities) and futures dropped at random points. Every
//! operation is recorded as invoke → ok / fail / unknown. While the tasks run, an optional
//! [`Fault`] breaks something (kills connections, pauses or kills Redis, partitions a client)
//! and heals it. At the end everything expires, the sweeper runs, every user below the limit
//! tries one more purchase, and the history plus the store's records are checked ([`check`]).
//!
//! Knobs: `HISTORY_SEED` replays a seed (printed at start; thread timing still varies),
//! `HISTORY_OPS` scales the workload, `HISTORY_REUSE` (percent of requests reusing an earlier
//! id, default 30) and `HISTORY_DROPS` (percent of calls dropped after a tiny timeout, default
//! 12). The whole history of each run is written to `target/tmp/history-<name>.log`.

use super::*;
use crate::common::env_knob;
use fred::prelude::{ClientLike, HashesInterface};
use futures::StreamExt;
use futures::future::BoxFuture;
use shardstock::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const SKU: &str = "hist";
pub const LIMIT: u64 = 2;
pub const LOADED: u64 = 12;
pub const SEGMENTS: u32 = 4;
pub const USERS_PER_PHASE: usize = 4;
/// Operations per phase (each phase has its own users, so the limit keeps mattering).
pub const PHASE_OPS: usize = 100;
pub const TASKS: usize = 24;
/// How long units moved by a transfer may stay in transit before any sweeper credits them.
pub const TRANSFER_LEASE_MS: u64 = 300;
/// How long a proven sell-out is answered from memory at most.
pub const SOLD_OUT_TTL_MS: u64 = 300;
pub const MAX_RESV_MS: u64 = 800;

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

pub fn builder() -> EngineBuilder {
    Engine::builder()
        .per_user_limit(LIMIT)
        .transfer_lease(ms(TRANSFER_LEASE_MS))
        .sold_out_ttl(ms(SOLD_OUT_TTL_MS))
        .max_qty(4)
}

/// A request sent earlier (for retries and reuse).
#[derive(Debug, Clone)]
struct Sent {
    rid: String,
    user: String,
    qty: u64,
    reserve: bool,
}

#[derive(Default)]
struct Shared {
    next: AtomicUsize,
    seq: AtomicUsize,
    sent: Mutex<Vec<Sent>>,
    /// (reservation id, request id, user)
    resvs: Mutex<Vec<(ReservationId, String, String)>>,
    restocks: Mutex<Vec<(String, u64)>>,
    /// Requests whose outcome was unknown, with the time (µs): a client retries them later.
    dropped: Mutex<Vec<(Sent, u64)>>,
}

fn recent<T: Clone>(v: &Mutex<Vec<T>>, rng: &mut fastrand::Rng, window: usize) -> Option<T> {
    let v = v.lock().unwrap();
    if v.is_empty() {
        return None;
    }
    let lo = v.len().saturating_sub(window);
    Some(v[rng.usize(lo..v.len())].clone())
}

fn push_capped<T>(v: &Mutex<Vec<T>>, x: T) {
    let mut v = v.lock().unwrap();
    v.push(x);
    if v.len() > 1024 {
        v.drain(..512);
    }
}

/// Classifies a call's result: typed "nothing happened" errors fail, the rest is unknown.
pub fn classify<T>(
    r: Result<shardstock::Result<T>, tokio::time::error::Elapsed>,
    wrap: impl FnOnce(T) -> Val,
) -> Out {
    match r {
        Err(_) => Out::Unknown("timeout (future dropped)".into()),
        Ok(Ok(v)) => Out::Ok(wrap(v)),
        Ok(Err(e)) => match e {
            // A lock lost (or not got in time) before the write: nothing was written.
            // A master that cannot replicate refused the script before it ran (NoReplicas).
            Error::RequestIdConflict { .. }
            | Error::InvalidInput { .. }
            | Error::LeaseLost(_)
            | Error::NoReplicas(_) => Out::Fail(format!("{e:?}")),
            Error::Redis(_) => Out::Unknown(format!("redis: {e}")),
            // The write may be on the master and lost with it, or kept: unknown.
            Error::NotDurable { .. } => Out::Unknown(format!("not durable: {e}")),
            other => Out::Unknown(format!("unexpected {other:?}")),
        },
    }
}

/// Where the workload sends an operation: an engine in this process, or a `serve` process.
/// Each call answers the recorded outcome: ok, fail (a typed "nothing happened") or unknown.
pub trait Target: Send + Sync {
    fn deduct<'a>(&'a self, d: &'a Deduct) -> BoxFuture<'a, Out>;
    fn reserve<'a>(&'a self, d: &'a Deduct, ttl: Duration) -> BoxFuture<'a, Out>;
    fn confirm<'a>(&'a self, id: &'a ReservationId) -> BoxFuture<'a, Out>;
    fn cancel<'a>(&'a self, id: &'a ReservationId) -> BoxFuture<'a, Out>;
    fn restock<'a>(&'a self, sku: &'a Sku, qty: u64, rid: &'a RequestId) -> BoxFuture<'a, Out>;
}

impl Target for Engine<RedisStore> {
    fn deduct<'a>(&'a self, d: &'a Deduct) -> BoxFuture<'a, Out> {
        Box::pin(async move { classify(Ok(Engine::deduct(self, d).await), Val::Ded) })
    }
    fn reserve<'a>(&'a self, d: &'a Deduct, ttl: Duration) -> BoxFuture<'a, Out> {
        Box::pin(async move { classify(Ok(Engine::reserve(self, d, ttl).await), Val::Res) })
    }
    fn confirm<'a>(&'a self, id: &'a ReservationId) -> BoxFuture<'a, Out> {
        Box::pin(async move { classify(Ok(Engine::confirm(self, id).await), Val::End) })
    }
    fn cancel<'a>(&'a self, id: &'a ReservationId) -> BoxFuture<'a, Out> {
        Box::pin(async move { classify(Ok(Engine::cancel(self, id).await), Val::End) })
    }
    fn restock<'a>(&'a self, sku: &'a Sku, qty: u64, rid: &'a RequestId) -> BoxFuture<'a, Out> {
        Box::pin(
            async move { classify(Ok(Engine::restock(self, sku, qty, rid).await), Val::Stock) },
        )
    }
}

/// A call given at most `limit`: past it the future is dropped and the outcome is unknown.
async fn timed(limit: Duration, call: BoxFuture<'_, Out>) -> Out {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| Out::Unknown("timeout (future dropped)".into()))
}

/// A fault injected while the workload runs: started with a stop flag, it breaks and heals
/// things until the flag is set, leaves everything healed, and answers how many times it
/// struck (a run whose fault never struck fails: it proved nothing).
pub struct Fault {
    pub name: String,
    /// How much later than its caller gave up a command may still run (held by a paused
    /// server or a partitioned link, delivered at the heal): a `serve` process then keeps the
    /// user busy that much longer, which the UserBusy check allows.
    pub late: Duration,
    pub start: Box<dyn FnOnce(Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> + Send>,
}

impl Fault {
    pub fn new(
        name: impl Into<String>,
        start: impl FnOnce(Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> + Send + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            late: Duration::ZERO,
            start: Box::new(start),
        }
    }

    /// Commands may run up to `late` after their caller gave up.
    pub fn late(mut self, late: Duration) -> Self {
        self.late = late;
        self
    }
}

/// For a fault's loop: sleeps `d` unless `stop` is set first; `false` when stopped.
pub async fn pause(stop: &AtomicBool, d: Duration) -> bool {
    let end = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < end {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        tokio::time::sleep(ms(10)).await;
    }
    !stop.load(Ordering::Relaxed)
}

/// Sends `sig` (e.g. `-STOP`, `-CONT`) to process `pid`.
pub fn signal(pid: impl std::fmt::Display, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// One checked run.
pub struct Run {
    pub name: String,
    /// Where the operations go.
    pub targets: Vec<Arc<dyn Target>>,
    /// Engines on the same store: the first loads the SKU and runs the sweeper; all of them
    /// sweep at the end (each sweeps the layouts it cached).
    pub engines: Vec<Engine<RedisStore>>,
    /// A target none of the workload used (empty in-process state), tried last by the final
    /// purchases: which target sells tells a client-local refusal from a lockout in the store.
    pub fresh: Arc<dyn Target>,
    /// A connection with the rights to read every key (the checker reads records with `KEYS`).
    pub admin: fred::clients::Client,
    pub fault: Option<Fault>,
    /// Violations this run reports without failing (a fault's documented loss, or a known
    /// open finding).
    pub tolerated: Tolerate,
    /// What the tolerated violations are, for the report.
    pub tolerated_why: &'static str,
}

/// What a run found.
pub struct Outcome {
    /// Operations checked.
    pub ops: usize,
    /// Times the fault struck.
    pub struck: u64,
    /// Violations the run tolerated.
    pub tolerated: Vec<Violation>,
    pub audit: Audit,
}

/// Which violations a run reports without failing, judged with the whole history.
pub type Tolerate = Box<dyn Fn(&Violation, &[Op]) -> bool + Send + Sync>;

/// Admits nothing.
pub fn none_tolerated() -> Tolerate {
    Box::new(|_, _| false)
}

struct Ctx {
    targets: Vec<Arc<dyn Target>>,
    /// Percent of deducts/reservations that reuse an earlier request id.
    reuse: u32,
    /// Percent of calls wrapped in a tiny timeout (future dropped at a random point).
    drops: u32,
    sh: Shared,
    total: usize,
}

/// One task of the workload; returns its operations.
async fn task(cx: Arc<Ctx>, id: usize, seed: u64) -> Vec<Op> {
    let mut rng =
        fastrand::Rng::with_seed(seed ^ (id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let sku = Sku::new(SKU).unwrap();
    let mut ops = Vec::new();
    let sh = &cx.sh;
    loop {
        let i = sh.next.fetch_add(1, Ordering::Relaxed);
        if i >= cx.total {
            break;
        }
        let phase = i / PHASE_OPS;
        let user_of =
            |rng: &mut fastrand::Rng| format!("p{phase}u{}", rng.usize(..USERS_PER_PHASE));
        let e = rng.usize(..cx.targets.len());
        let engine = &*cx.targets[e];
        let tiny = rng.u32(..100) < cx.drops;
        let limit = if tiny {
            Duration::from_micros(rng.u64(0..2500))
        } else {
            Duration::from_secs(10)
        };
        let mut op = Op {
            seq: 0,
            engine: e,
            kind: Kind::Deduct,
            rid: String::new(),
            user: String::new(),
            qty: 0,
            ttl_ms: 0,
            resv: String::new(),
            why: "fresh",
            inv: 0,
            ret: 0,
            out: Out::Fail("not run".into()),
        };
        let roll = rng.u32(..100);
        if roll < 68 {
            // A deduct or a reservation: fresh, or an earlier request id reused.
            let mut s = Sent {
                rid: format!("r{i}"),
                user: user_of(&mut rng),
                qty: if rng.u32(..100) < 70 { 1 } else { 2 },
                reserve: roll >= 36,
            };
            // Mostly the last few requests (races), sometimes older ones (whose transfers were
            // credited by the sweeper meanwhile).
            let window = if rng.bool() { 48 } else { 400 };
            if rng.u32(..100) < cx.reuse
                && let Some(old) = recent(&sh.sent, &mut rng, window)
            {
                let r = rng.u32(..100);
                s = old.clone();
                op.why = if r < 50 {
                    // Preferably a request whose answer was lost a while ago (the transfers it
                    // left in transit credited by a sweeper meanwhile).
                    let late = {
                        let mut d = sh.dropped.lock().unwrap();
                        let due = now_us().saturating_sub(700_000);
                        d.iter().position(|(_, t)| *t < due).map(|k| d.remove(k).0)
                    };
                    if let Some(late) = late {
                        s = late;
                        op.why = "late retry";
                    }
                    if op.why == "late retry" {
                        "late retry"
                    } else {
                        "retry"
                    }
                } else if r < 70 {
                    // The same request id under another user: another request.
                    s.user = user_of(&mut rng);
                    if s.user == old.user {
                        "retry"
                    } else {
                        "collision"
                    }
                } else if r < 90 {
                    s.reserve = !s.reserve;
                    "cross-kind"
                } else {
                    s.qty = 3 - s.qty.min(2);
                    "other-qty"
                };
            }
            let d = Deduct::new(SKU, &s.user, s.qty, &s.rid).unwrap();
            op.rid = s.rid.clone();
            op.user = s.user.clone();
            op.qty = s.qty;
            op.inv = now_us();
            if s.reserve {
                op.kind = Kind::Reserve;
                op.ttl_ms = rng.u64(200..=MAX_RESV_MS);
                op.out = timed(limit, engine.reserve(&d, ms(op.ttl_ms))).await;
                op.ret = now_us();
                if let Out::Ok(Val::Res(
                    Reserved::Held { id, .. } | Reserved::Replayed { id, .. },
                )) = &op.out
                {
                    push_capped(&sh.resvs, (id.clone(), s.rid.clone(), s.user.clone()));
                }
            } else {
                op.out = timed(limit, engine.deduct(&d)).await;
                op.ret = now_us();
            }
            if op.unknown() && rng.bool() {
                push_capped(&sh.dropped, (s.clone(), op.ret));
            }
            push_capped(&sh.sent, s);
        } else if roll < 96 {
            let Some((id, rid, user)) = recent(&sh.resvs, &mut rng, 40) else {
                continue;
            };
            op.kind = if roll < 84 {
                Kind::Confirm
            } else {
                Kind::Cancel
            };
            op.rid = rid;
            op.user = user;
            op.resv = id.to_string();
            op.inv = now_us();
            op.out = if op.kind == Kind::Confirm {
                timed(limit, engine.confirm(&id)).await
            } else {
                timed(limit, engine.cancel(&id)).await
            };
            op.ret = now_us();
        } else {
            op.kind = Kind::Restock;
            let (rid, qty) = match recent(&sh.restocks, &mut rng, 16) {
                Some(old) if rng.u32(..100) < 20 => {
                    op.why = "retry";
                    old
                }
                _ => (format!("s{i}"), rng.u64(1..=3)),
            };
            op.rid = rid.clone();
            op.qty = qty;
            op.inv = now_us();
            let id = RequestId::new(&rid).unwrap();
            op.out = timed(limit, engine.restock(&sku, qty, &id)).await;
            op.ret = now_us();
            push_capped(&sh.restocks, (rid, qty));
        }
        op.seq = sh.seq.fetch_add(1, Ordering::Relaxed);
        ops.push(op);
        // Bursts and pauses: half the gaps are tiny (races), half long (expiries interleave).
        let gap = if rng.bool() {
            rng.u64(0..3_000)
        } else {
            rng.u64(20_000..150_000)
        };
        tokio::time::sleep(Duration::from_micros(gap)).await;
    }
    ops
}

/// A record as kept at `key` (the record hash, or a sales window `…:w<w>:<b>`, where a
/// one-unit sale's record is `<until - b·w>` alone: src/scripts/prelude.lua), in full.
pub fn full_record(key: &str, val: &str) -> String {
    if val.contains(':') {
        return val.to_string();
    }
    let mut parts = key.rsplit(':');
    let b: u64 = parts.next().and_then(|b| b.parse().ok()).expect("window");
    let w: u64 = parts
        .next()
        .and_then(|w| w.strip_prefix('w')?.parse().ok())
        .expect("window width");
    let off: u64 = val.parse().expect("a short record");
    format!("A:1:{}:0", b * w + off)
}

/// Reads every ledger and transfer of the SKU's generation, and the audit.
pub async fn read_facts(e: &Engine<RedisStore>, admin: &fred::clients::Client, sku: &Sku) -> Facts {
    let audit = e.audit(sku).await.unwrap();
    let mut facts = Facts::empty(SEGMENTS, LIMIT, audit);
    read_records(std::slice::from_ref(admin), SKU, &mut facts).await;
    facts
}

/// Every ledger (the users' request records and units) and every transfer (debits at donors,
/// credits at destinations) of `sku`'s generation `facts.audit.generation` under prefix `t`,
/// read through every client in `clients` (one node, or each master of a cluster: each
/// answers for the keys of its own slots) into `facts`. Segment tags may carry a placement
/// suffix (`{sku#i.k}`).
pub async fn read_records(clients: &[fred::clients::Client], sku: &str, facts: &mut Facts) {
    let g = facts.audit.generation;
    for client in clients {
        for pattern in [
            format!("t:{{{sku}#*}}:g{g}:w*"),
            format!("t:{{{sku}#*}}:g{g}:rec"),
            format!("t:{{{sku}#*}}:g{g}:led"),
            format!("t:{{{sku}#*}}:g{g}:tx"),
            format!("t:{{{sku}#*}}:g{g}:in"),
        ] {
            let keys: Vec<String> = client
                .custom(fred::cmd!("KEYS"), vec![pattern])
                .await
                .unwrap();
            let got: Vec<(String, HashMap<String, String>)> = futures::stream::iter(keys)
                .map(|k| async move {
                    let m: HashMap<String, String> = client.hgetall(&k).await.unwrap();
                    (k, m)
                })
                .buffer_unordered(32)
                .collect()
                .await;
            for (k, m) in got {
                let seg = segment_of(&k) as u32;
                if k.ends_with(":rec") || k.contains(&format!(":g{g}:w")) {
                    // Without a limit: field `<user> <request id>` of the record hash or a
                    // sales window.
                    let mut fields: Vec<_> = m.into_iter().collect();
                    fields.sort();
                    for (f, val) in fields {
                        let (user, rid) = f
                            .split_once(' ')
                            .unwrap_or_else(|| panic!("record field {f:?} at {k}"));
                        let val = full_record(&k, &val);
                        facts.add_field(seg, user, &format!("={rid}"), &val);
                    }
                } else if k.ends_with(":led") {
                    // Under a per-user limit: a field per user, `<h> <f>` then
                    // ` <request id> <record>` per record, or the request id alone (the short
                    // form); read as the fields they stand for.
                    let mut users: Vec<_> = m.into_iter().collect();
                    users.sort();
                    for (user, text) in users {
                        if user == " pad" {
                            // Written at load so that the hash stays a hash table.
                            continue;
                        }
                        // The short form: a new buyer's one sale of one unit, the request
                        // id alone.
                        let short = format!("1 1 {text} A:1:0:0");
                        let text = if text.contains(' ') { text } else { short };
                        let w: Vec<&str> = text.split(' ').collect();
                        assert!(
                            w.len() >= 2 && w.len().is_multiple_of(2),
                            "ledger {user} at {k}: {text:?}"
                        );
                        facts.add_field(seg, &user, "h", w[0]);
                        facts.add_field(seg, &user, "f", w[1]);
                        for rec in w[2..].chunks(2) {
                            facts.add_field(seg, &user, &format!("={}", rec[0]), rec[1]);
                        }
                    }
                } else if k.ends_with(":tx") {
                    for (id, val) in m {
                        // <dest>:<units>:<lease end ms> (0 once done)
                        let v: Vec<u64> = val.split(':').filter_map(|x| x.parse().ok()).collect();
                        assert_eq!(v.len(), 3, "transfer {id} at {k}: {val:?}");
                        facts.debits.push(Debit {
                            donor: seg,
                            id,
                            dest: v[0] as u32,
                            units: v[1],
                            done: v[2] == 0,
                        });
                    }
                } else {
                    for (id, val) in m {
                        let units = val
                            .parse()
                            .unwrap_or_else(|_| panic!("credit {id} at {k}: {val:?}"));
                        facts.credits.push(CreditFact {
                            dest: seg,
                            id,
                            units,
                        });
                    }
                }
            }
        }
    }
    facts
        .debits
        .sort_by(|a, b| (a.donor, &a.id).cmp(&(b.donor, &b.id)));
    facts
        .credits
        .sort_by(|a, b| (a.dest, &a.id).cmp(&(b.dest, &b.id)));
}

/// The segment index in a key's hash tag (`{sku#i}` or, placed, `{sku#i.k}`).
fn segment_of(key: &str) -> usize {
    let tag = &key[key.find('{').unwrap() + 1..key.find('}').unwrap()];
    tag[tag.find('#').unwrap() + 1..]
        .split('.')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

pub async fn sweep_all(engines: &[Engine<RedisStore>]) {
    for e in engines {
        for _ in 0..20 {
            if e.sweep().await.is_ok() {
                break;
            }
            tokio::time::sleep(ms(50)).await;
        }
    }
}

/// Units each user holds (sold, confirmed, or reserved and live), from the store's records.
fn held_per_user(f: &Facts) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for ((user, rid), recs) in &f.records {
        let e = req_facts((user, rid), recs, f).effect;
        *m.entry(user.clone()).or_default() += e.keeps();
    }
    m
}

/// What the request records say, by kind (how much of the state space the run reached).
fn store_summary(f: &Facts) -> String {
    let mut c: BTreeMap<String, usize> = BTreeMap::new();
    for ((user, rid), recs) in &f.records {
        let k = match req_facts((user, rid), recs, f).effect {
            Effect::None => "no record".to_string(),
            Effect::Sale { .. } => "sale".into(),
            Effect::Resv { state, .. } => format!("reservation {state}"),
        };
        *c.entry(k).or_default() += 1;
    }
    let credited = f.credits.len();
    format!(
        "{}; transfers: {} debited ({} units), {credited} credited",
        c.iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        f.debits.len(),
        f.debits.iter().map(|d| d.units).sum::<u64>()
    )
}

/// Runs the workload (with its fault), settles, makes the final purchases and checks the
/// history; panics on any violation that is not tolerated, after printing examples.
pub async fn run(r: Run) -> Outcome {
    let seed = env_knob("HISTORY_SEED").unwrap_or_else(|| fastrand::u64(..));
    let total = env_knob::<u64>("HISTORY_OPS").unwrap_or(6000) as usize;
    let name = r.name.clone();
    eprintln!(
        "[{name}] HISTORY_SEED={seed} HISTORY_OPS={total} ({} targets{})",
        r.targets.len(),
        r.fault
            .as_ref()
            .map_or(String::new(), |f| format!(", fault: {}", f.name))
    );
    let started = Instant::now();
    let engines = r.engines.clone();
    let sku = Sku::new(SKU).unwrap();
    engines[0]
        .load(
            &sku,
            LOADED,
            LoadOptions::new(SEGMENTS).per_user_limit(LIMIT),
        )
        .await
        .unwrap();
    let sweeper = engines[0].start_sweeper(ms(100));

    let stop = Arc::new(AtomicBool::new(false));
    let late = r.fault.as_ref().map_or(Duration::ZERO, |f| f.late);
    let fault = r.fault.map(|f| (f.start)(stop.clone()));
    let cx = Arc::new(Ctx {
        targets: r.targets.clone(),
        sh: Shared::default(),
        total,
        reuse: env_knob::<u64>("HISTORY_REUSE").unwrap_or(30) as u32,
        drops: env_knob::<u64>("HISTORY_DROPS").unwrap_or(12) as u32,
    });
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| tokio::spawn(task(cx.clone(), t, seed)))
        .collect();
    let mut ops: Vec<Op> = Vec::new();
    for t in futures::future::join_all(tasks).await {
        ops.extend(t.unwrap());
    }
    let workload = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let struck = match fault {
        Some(f) => {
            let n = f.await.expect("the fault task panicked");
            assert!(
                n > 0,
                "[{name}] the fault never struck: the run proved nothing"
            );
            n
        }
        None => 0,
    };
    drop(sweeper);

    // Settle: every reservation and transfer lease has run out, and every command delivered
    // late has run; sweep.
    tokio::time::sleep(ms(MAX_RESV_MS + TRANSFER_LEASE_MS + 500) + late).await;
    sweep_all(&engines).await;

    // Every user below the limit can still buy one unit (stock is added first).
    let mut finals = Vec::new();
    let mut seq = ops.len() + 1_000_000;
    let users: Vec<String> = {
        let mut u: Vec<String> = ops
            .iter()
            .filter(|o| o.kind.takes())
            .map(|o| o.user.clone())
            .collect();
        u.sort();
        u.dedup();
        u
    };
    let before = read_facts(&engines[0], &r.admin, &sku).await;
    let held = held_per_user(&before);
    let below: Vec<String> = users
        .iter()
        .filter(|u| held.get(*u).copied().unwrap_or(0) < LIMIT)
        .cloned()
        .collect();
    {
        let inv = now_us();
        let qty = below.len() as u64 + 1;
        let out = Target::restock(
            &engines[0],
            &sku,
            qty,
            &RequestId::new("final-restock").unwrap(),
        )
        .await;
        finals.push(Op {
            seq,
            engine: 0,
            kind: Kind::Restock,
            rid: "final-restock".into(),
            user: String::new(),
            qty,
            ttl_ms: 0,
            resv: String::new(),
            why: "final",
            inv,
            ret: now_us(),
            out,
        });
        seq += 1;
    }
    // Each user tries every target in turn, then the fresh one.
    let mut with_fresh = r.targets.clone();
    with_fresh.push(r.fresh.clone());
    let attempts = below.iter().enumerate().map(|(k, user)| {
        let targets = with_fresh.clone();
        let n_old = targets.len() - 1;
        async move {
            let rid = format!("final-{user}");
            let d = Deduct::new(SKU, user, 1, &rid).unwrap();
            let mut log = Vec::new();
            // On each target in turn, retry (same id) for 1.5 s while refused (sold out
            // included: the final restock left a unit more than there are final buyers, and a
            // target's sold-out memory forgets within its TTL).
            'targets: for n in 0..targets.len() {
                let e = if n == n_old { n_old } else { (k + n) % n_old };
                let deadline = Instant::now() + ms(1500);
                loop {
                    let inv = now_us();
                    let out = timed(ms(10_000), targets[e].deduct(&d)).await;
                    let refused = !matches!(
                        &out,
                        Out::Ok(Val::Ded(
                            Deduction::Applied { .. } | Deduction::Replayed { .. }
                        ))
                    );
                    log.push(Op {
                        seq: 0,
                        engine: e,
                        kind: Kind::Final,
                        rid: rid.clone(),
                        user: user.clone(),
                        qty: 1,
                        ttl_ms: 0,
                        resv: String::new(),
                        why: "final",
                        inv,
                        ret: now_us(),
                        out,
                    });
                    if !refused {
                        break 'targets;
                    }
                    if Instant::now() >= deadline {
                        break;
                    }
                    tokio::time::sleep(ms(100)).await;
                }
            }
            log
        }
    });
    for log in futures::future::join_all(attempts).await {
        for mut o in log {
            o.seq = seq;
            seq += 1;
            finals.push(o);
        }
    }
    ops.extend(finals);
    ops.sort_by_key(|o| (o.inv, o.seq));
    sweep_all(&engines).await;
    let facts = read_facts(&engines[0], &r.admin, &sku).await;
    let violations = check(
        &ops,
        &facts,
        Params {
            limit: LIMIT,
            loaded: LOADED,
            // How long a call whose client gave up may keep its user busy on the same target:
            // an engine in process forgets a dropped call at once; a `serve` process runs it
            // to its end (each store command bounded by its timeout), late by what the fault
            // held it.
            busy_grace_us: 2_000_000 + late.as_micros() as u64 + SLACK_US,
            sold_out_grace_us: SOLD_OUT_TTL_MS * 1000 + 100_000,
            engines: r.targets.len(),
        },
    );
    eprintln!(
        "[{name}] {} ops in {:.1} s (+ settle and checks: {:.1} s total); fault struck: {struck}; audit: remaining {} in transit {} reserved {} sold {} restocked {}\n[{name}] outcomes: {}",
        ops.len(),
        workload.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        facts.audit.remaining,
        facts.audit.in_transit,
        facts.audit.reserved,
        facts.audit.sold,
        facts.audit.restocked,
        summary(&ops)
    );
    eprintln!("[{name}] store: {}", store_summary(&facts));
    // The whole history, for digging deeper than the report.
    let dump =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("history-{name}.log"));
    let t0 = ops.first().map_or(0, |o| o.inv);
    let text: String = ops.iter().map(|o| o.line(t0) + "\n").collect();
    let _ = std::fs::write(&dump, text);
    eprintln!("[{name}] full history: {}", dump.display());
    let (known, violations): (Vec<_>, Vec<_>) =
        violations.into_iter().partition(|x| (r.tolerated)(x, &ops));
    if !known.is_empty() {
        eprintln!(
            "[{name}] TOLERATED ({}; not failing; HISTORY_SEED={seed}): {} violation(s):\n{}{}",
            r.tolerated_why,
            known.len(),
            table(&known),
            report(&ops, &facts, &known, 2)
        );
    }
    if !violations.is_empty() {
        eprintln!(
            "[{name}] VIOLATIONS (HISTORY_SEED={seed}), examples with their operations:{}",
            report(&ops, &facts, &violations, 2)
        );
        panic!(
            "[{name}] history check failed (HISTORY_SEED={seed}): {} violation(s) by check and class:\n{}",
            violations.len(),
            table(&violations)
        );
    }
    Outcome {
        ops: ops.len(),
        struck,
        tolerated: known,
        audit: facts.audit,
    }
}
