//! Nemesis suite, `serve` processes: the checked workload of `tests/it/nemesis.rs`
//! sent over HTTP to three `shardstock serve` processes on one redis-server (each configured
//! like the workload's engines: per-user limit 2, claim lease 300 ms, user claim TTL 600 ms,
//! pending wait 300 ms, max qty 4, a 400 ms store command timeout), while a fault breaks one of
//! them and heals it; the history is checked as in `tests/it/history.rs`.
//!
//! - A serve paused (`SIGSTOP`) past its leases (0.6–1.5 s), then resumed (`SIGCONT`),
//!   again and again, different serves. The pause is aimed: the fault watches Redis for a
//!   serve holding something (strategy `lua`: a live fallback claim on a request only that
//!   serve was sent; strategy `lock`: a segment lock whose owner token names that serve's pid)
//!   and pauses it then; after the `SIGSTOP` it looks again and counts the pauses that caught
//!   the process holding it ("held"). What the paused process writes after it resumes must be
//!   refused: the claim's epoch (a newer holder shut it out) or the lock's fence token.
//! - A serve partitioned from Redis (its store URL points at a [`Proxy`]), alternately holding
//!   the bytes and cutting the connections, healed mid-sale.
//!
//! Each test prints `nemesis <fault>: struck N, held M, ops K, anomalies 0`.

use crate::common;

use common::history::http_target::HttpTarget;
use common::history::workload::{self, *};
use common::history::*;
use common::proxy::Proxy;
use common::serve_process::ServeProcess;
use common::*;
use fred::prelude::ClientLike;
use shardstock::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Store command timeout of every process (a stalled Redis link shows up as unknown outcomes).
const COMMAND_TIMEOUT_MS: u64 = 400;
/// Lock lease of the lock strategy (renewed every lease/3), shorter than every pause.
const LOCK_LEASE_MS: u64 = 300;
/// Longest pause or partition: commands may run that much later than their caller gave up.
const LONGEST_MS: u64 = 1500;

/// How the serves store and take stock.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Lua,
    Lock,
}

impl Mode {
    fn strategy(self) -> Strategy {
        match self {
            Mode::Lua => Strategy::Lua,
            Mode::Lock => Strategy::Lock,
        }
    }
}

/// The store settings every process of a test shares (in-process engines and serves alike).
fn store_config(server: &impl RedisAt, mode: Mode) -> shardstock::Config {
    let mut c = redis_config(server, "t");
    c.store.command_timeout_ms = COMMAND_TIMEOUT_MS;
    c.store.strategy = mode.strategy();
    c.store.lock_lease_ms = LOCK_LEASE_MS;
    c.store.lock_wait_ms = 100;
    c
}

async fn engine_at(config: &shardstock::Config) -> Engine<RedisStore> {
    let store = config.store.redis_builder().connect().await.unwrap();
    workload::builder().build(store).unwrap()
}

/// A serve on `redis_url` with the workload's engine options and `config`'s store settings;
/// `coalesce` turns request coalescing on (strategy `lua`).
fn serve(redis_url: &str, config: &shardstock::Config, coalesce: bool) -> ServeProcess {
    let s = &config.store;
    let env: Vec<(String, String)> = [
        ("STORE__KEY_PREFIX", s.key_prefix.clone()),
        ("STORE__POOL_SIZE", "2".into()),
        (
            "STORE__COMMAND_TIMEOUT_MS",
            s.command_timeout_ms.to_string(),
        ),
        ("STORE__STRATEGY", s.strategy.name().into()),
        ("STORE__LOCK_LEASE_MS", s.lock_lease_ms.to_string()),
        ("STORE__LOCK_WAIT_MS", s.lock_wait_ms.to_string()),
        ("STORE__COALESCE", coalesce.to_string()),
        ("ENGINE__PER_USER_LIMIT", LIMIT.to_string()),
        ("ENGINE__TRANSFER_LEASE_MS", TRANSFER_LEASE_MS.to_string()),
        ("ENGINE__SOLD_OUT_TTL_MS", SOLD_OUT_TTL_MS.to_string()),
        ("ENGINE__MAX_QTY", "4".into()),
    ]
    .into_iter()
    .map(|(k, v)| (format!("SHARDSTOCK_{k}"), v))
    .collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    // The lock strategy pauses 3 ms between its read and its fenced write (a slow critical
    // section, `--critical-pause-ms`): locks are held long enough to be caught.
    let pause = if s.strategy == Strategy::Lock {
        "3"
    } else {
        "0"
    };
    ServeProcess::start(
        redis_url,
        &["--audit-every-ms", "0", "--critical-pause-ms", pause],
        &env,
    )
}

/// A serve the fault may pause: its pid and the target that talks to it.
#[derive(Clone)]
struct Victim {
    pid: u32,
    target: Arc<HttpTarget>,
}

/// What the fault looks for in Redis to tell whether a serve holds something.
#[derive(Clone)]
struct Watch {
    mode: Mode,
    admin: fred::clients::Client,
    victims: Vec<Victim>,
}

impl Watch {
    async fn generation(&self) -> u64 {
        let g: Option<String> = self
            .admin
            .custom(
                fred::cmd!("HGET"),
                vec![format!("t:{{{SKU}}}:meta"), "gen".into()],
            )
            .await
            .unwrap();
        g.and_then(|g| g.parse().ok()).expect("the SKU is loaded")
    }

    /// What each serve holds now: (strategy `lua`) transfers debited and not yet credited
    /// whose destination is the home of a user only that serve has a request open for;
    /// (strategy `lock`) segment locks whose owner token starts with the serve's pid. The
    /// segments are read concurrently (one round trip's time), so short holdings are seen.
    async fn holdings(&self, generation: u64) -> Vec<Vec<Held>> {
        let mut held = vec![Vec::new(); self.victims.len()];
        match self.mode {
            Mode::Lua => {
                let open: Vec<Vec<u32>> = self
                    .victims
                    .iter()
                    .map(|v| v.target.open_users().iter().map(|u| home_of(u)).collect())
                    .collect();
                // Homes with no stock: a request open there is moving units home (or about
                // to answer sold out).
                let stocks = futures::future::join_all((0..SEGMENTS).map(|seg| async move {
                    let v: Option<String> = self
                        .admin
                        .custom(
                            fred::cmd!("HGET"),
                            vec![format!("t:{{{SKU}#{seg}}}:seg"), "stock".into()],
                        )
                        .await
                        .unwrap_or_default();
                    v.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
                }))
                .await;
                for (k, homes) in open.iter().enumerate() {
                    for h in homes {
                        if stocks[*h as usize] == 0 {
                            held[k].push(Held::ShortHome(*h));
                        }
                    }
                }
                for t in self.in_transit(generation).await {
                    let serving: Vec<usize> = (0..open.len())
                        .filter(|&k| open[k].contains(&t.dest))
                        .collect();
                    if let [k] = serving[..] {
                        held[k].push(Held::Transfer(t));
                    }
                }
            }
            Mode::Lock => {
                let per_segment = (0..SEGMENTS).map(|seg| async move {
                    let key = format!("t:{{{SKU}#{seg}}}:lock");
                    let owner: Option<String> = self
                        .admin
                        .custom(fred::cmd!("GET"), vec![key])
                        .await
                        .unwrap_or_default();
                    owner.map(|o| (seg, o))
                });
                for (seg, owner) in futures::future::join_all(per_segment)
                    .await
                    .into_iter()
                    .flatten()
                {
                    for (k, v) in self.victims.iter().enumerate() {
                        if owner.starts_with(&format!("{:x}.", v.pid)) {
                            held[k].push(Held::Lock(seg));
                        }
                    }
                }
            }
        }
        held
    }

    /// Transfers debited and not yet credited home (their lease still running or not), read
    /// from every donor's due index and every destination's credits.
    async fn in_transit(&self, generation: u64) -> Vec<Moving> {
        let per_segment = (0..SEGMENTS).map(|seg| async move {
            let due: Vec<String> = self
                .admin
                .custom(
                    fred::cmd!("ZRANGE"),
                    vec![
                        format!("t:{{{SKU}#{seg}}}:g{generation}:txq"),
                        "0".into(),
                        "-1".into(),
                    ],
                )
                .await
                .unwrap_or_default();
            let mut out = Vec::new();
            for padded in due {
                let id = padded.trim_start_matches('0').to_string();
                let v: Option<String> = self
                    .admin
                    .custom(
                        fred::cmd!("HGET"),
                        vec![format!("t:{{{SKU}#{seg}}}:g{generation}:tx"), id.clone()],
                    )
                    .await
                    .unwrap_or_default();
                let Some(dest) = v.and_then(|v| v.split(':').next()?.parse().ok()) else {
                    continue;
                };
                let t = Moving {
                    donor: seg,
                    id,
                    dest,
                };
                if !self.credited(generation, &t).await {
                    out.push(t);
                }
            }
            out
        });
        futures::future::join_all(per_segment).await.concat()
    }

    /// Whether transfer `t` was credited at its destination.
    async fn credited(&self, generation: u64, t: &Moving) -> bool {
        let n: i64 = self
            .admin
            .custom(
                fred::cmd!("HEXISTS"),
                vec![
                    format!("t:{{{SKU}#{}}}:g{generation}:in", t.dest),
                    t.id.clone(),
                ],
            )
            .await
            .unwrap_or(0);
        n == 1
    }
}

/// A transfer in transit: debited at `donor`, bound for `dest`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Moving {
    donor: u32,
    id: String,
    dest: u32,
}

/// What a serve was seen holding.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Held {
    /// Units debited for a request only this serve has open, not yet credited home.
    Transfer(Moving),
    /// A request open at this serve whose home segment has no stock: it is moving units
    /// home (transfers), or surveying before it answers sold out.
    ShortHome(u32),
    Lock(u32),
}

/// The home segment of every request of `user` (the SKU has a per-user limit).
fn home_of(user: &str) -> u32 {
    shardstock::segments::home(
        &UserId::new(user).unwrap(),
        &RequestId::new("any").unwrap(),
        SEGMENTS,
        true,
    )
}

/// The pause fault: every 0.2–0.6 s, watch Redis for up to 2 s for a serve holding something
/// (preferring another serve than last time), `SIGSTOP` it (a random one when none was seen
/// holding), look again, keep it stopped 0.6–1.5 s and `SIGCONT` it. Counts the pauses that
/// caught the serve holding something in `held`, and (strategy `lua`) those that caught it
/// holding units in transit in `moving`, and during which such units were credited by someone
/// else in `credited`.
fn aimed_pauses(
    watch: Watch,
    held: Arc<std::sync::atomic::AtomicU64>,
    moving: Arc<std::sync::atomic::AtomicU64>,
    credited: Arc<std::sync::atomic::AtomicU64>,
) -> Fault {
    let name = match watch.mode {
        Mode::Lua => "serve SIGSTOP holding units in transit",
        Mode::Lock => "serve SIGSTOP holding a segment lock",
    };
    Fault::new(name, move |stop| {
        tokio::spawn(async move {
            let mut n = 0;
            let mut rng = fastrand::Rng::new();
            let generation = watch.generation().await;
            let count = watch.victims.len();
            let mut last = count;
            for _ in 0..200 {
                if !pause(&stop, ms(rng.u64(200..600))).await {
                    break;
                }
                let deadline = tokio::time::Instant::now() + ms(2000);
                let mut aim = None;
                while aim.is_none()
                    && tokio::time::Instant::now() < deadline
                    && !stop.load(Ordering::Relaxed)
                {
                    let held = watch.holdings(generation).await;
                    // Start after the last victim: different serves get their turn.
                    aim = (1..=count)
                        .map(|i| (last + i) % count)
                        .find(|&k| !held[k].is_empty());
                    if aim.is_none() {
                        // Leave Redis a breath between looks (2 cores shared with the sale).
                        tokio::time::sleep(ms(1)).await;
                    }
                }
                let k = aim.unwrap_or_else(|| rng.usize(..count));
                let pid = watch.victims[k].pid;
                signal(pid, "-STOP");
                // Frozen now: what Redis shows as its own stays until its lease runs out.
                let caught = watch.holdings(generation).await.swap_remove(k);
                if !caught.is_empty() {
                    held.fetch_add(1, Ordering::Relaxed);
                }
                if caught.iter().any(|h| matches!(h, Held::Transfer(_))) {
                    moving.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(ms(rng.u64(600..=LONGEST_MS))).await;
                // Units the stopped serve had debited, credited home meanwhile by a sweeper
                // (or a request that drained them): its own credit, sent after the resume,
                // must add nothing.
                let mut meanwhile = false;
                for h in &caught {
                    if let Held::Transfer(t) = h {
                        meanwhile |= watch.credited(generation, t).await;
                    }
                }
                if meanwhile {
                    credited.fetch_add(1, Ordering::Relaxed);
                }
                signal(pid, "-CONT");
                last = k;
                n += 1;
            }
            n
        })
    })
    .late(ms(LONGEST_MS))
}

/// Sums a counter over the serves' `/metrics` (0 when absent).
async fn metric_sum(serves: &[ServeProcess], name: &'static str) -> u64 {
    let urls: Vec<String> = serves.iter().map(|s| s.url("/metrics")).collect();
    tokio::task::spawn_blocking(move || {
        let agent = http_client::agent();
        let mut sum = 0.0;
        for url in urls {
            let (status, text) = http_client::get(&agent, &url, &[]).unwrap();
            assert_eq!(status, 200, "{url}: {text}");
            sum += text
                .lines()
                .filter(|l| l.starts_with(name))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
        }
        sum as u64
    })
    .await
    .unwrap()
}

fn report_line(fault: &str, held: u64, o: &Outcome, extra: &str) {
    eprintln!(
        "nemesis {fault}: struck {}, held {held}, ops {}, anomalies 0{extra}",
        o.struck, o.ops
    );
}

/// Three serves on one redis-server, paused past their leases by [`aimed_pauses`]: the
/// outcome, the pauses that caught a serve holding something, the serves, and (strategy
/// `lua`) the pauses that caught one holding units in transit and those during which such
/// units were credited by someone else.
async fn paused_serves(mode: Mode) -> (Outcome, u64, Vec<ServeProcess>, (u64, u64)) {
    let srv = RedisServer::start();
    let config = store_config(&srv, mode);
    let url = config.store.redis_url.clone();
    // Strategy lua: two plain serves and a coalesced one, as in tests/it/nemesis.rs.
    let serves: Vec<ServeProcess> = (0..3)
        .map(|k| serve(&url, &config, mode == Mode::Lua && k == 2))
        .collect();
    let victims: Vec<Victim> = serves
        .iter()
        .map(|s| Victim {
            pid: s.proc.child.id(),
            target: Arc::new(HttpTarget::new(s.addr())),
        })
        .collect();
    let admin = admin_client(&srv).await;
    let held = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let credited = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let moving = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let watch = Watch {
        mode,
        admin: admin.clone(),
        victims: victims.clone(),
    };
    let name = match mode {
        Mode::Lua => "nemesis-serve-pause-lua",
        Mode::Lock => "nemesis-serve-pause-lock",
    };
    let o = workload::run(Run {
        name: name.into(),
        targets: victims
            .iter()
            .map(|v| v.target.clone() as Arc<dyn Target>)
            .collect(),
        engines: vec![engine_at(&config).await, engine_at(&config).await],
        fresh: Arc::new(engine_at(&config).await),
        admin,
        fault: Some(aimed_pauses(
            watch,
            held.clone(),
            moving.clone(),
            credited.clone(),
        )),
        tolerated: none_tolerated(),
        tolerated_why: "",
    })
    .await;
    (
        o,
        held.load(Ordering::Relaxed),
        serves,
        (
            moving.load(Ordering::Relaxed),
            credited.load(Ordering::Relaxed),
        ),
    )
}

/// (a) Strategy `lua`: a serve paused past the transfer lease while it serves a request whose
/// home has no stock — moving units home: before its debit, between its debit and its
/// credit (then a sweeper credits the units home meanwhile, and the serve's own credit, sent
/// after `SIGCONT`, adds nothing), or surveying. The history's conservation and transfer checks
/// judge what the paused serve writes late. Catching a serve exactly between a debit and its
/// credit (one round trip) is rare here, so it is counted, not required: `tests/it/safety.rs`
/// plays that crash point deterministically.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_paused_holding_units_in_transit() {
    let (o, held, _serves, (moving, credited)) = paused_serves(Mode::Lua).await;
    report_line(
        "serve SIGSTOP past the transfer lease (lua)",
        held,
        &o,
        &format!(", holding units in transit {moving}, credited by another meanwhile {credited}"),
    );
    assert!(
        held > 0,
        "no pause caught a serve moving units home: the run proved less than it says"
    );
}

/// (b) Strategy `lock`: a serve paused past the lock lease while it holds a segment lock; after
/// `SIGCONT` its write carries a fence token a newer holder bumped, and is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_paused_holding_a_segment_lock() {
    let (o, held, serves, _) = paused_serves(Mode::Lock).await;
    let fenced = metric_sum(&serves, "shardstock_lock_fenced_writes_rejected_total").await;
    let lost = metric_sum(&serves, "shardstock_lock_leases_lost_total").await;
    report_line(
        "serve SIGSTOP past the lock lease (lock)",
        held,
        &o,
        &format!(", fenced writes refused {fenced}, leases lost {lost}"),
    );
    assert!(
        held > 0,
        "no pause caught a serve holding a segment lock: the run proved less than it says"
    );
    assert!(
        fenced > 0,
        "no late write met the fence token ({held} pauses caught a lock holder)"
    );
}

/// (c) One serve reaches Redis through a proxy that partitions it for 0.5–1.5 s at a time,
/// alternately holding the bytes (delivered at the heal) and cutting the connections; the
/// other two sell throughout. "held": partitions that held requests of that serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_serve_partitioned_from_redis_and_healed() {
    let srv = RedisServer::start();
    let config = store_config(&srv, Mode::Lua);
    let proxy = Arc::new(Proxy::start(srv.port).await);
    let url = proxy.reroute(&config.store.redis_url);
    let serves = [
        serve(&url, &config, false),
        serve(&config.store.redis_url, &config, false),
        serve(&config.store.redis_url, &config, true),
    ];
    let targets: Vec<Arc<HttpTarget>> = serves
        .iter()
        .map(|s| Arc::new(HttpTarget::new(s.addr())))
        .collect();
    let held = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (p, cut_off, h) = (proxy.clone(), targets[0].clone(), held.clone());
    let fault = Fault::new("one serve partitioned (hold / cut)", move |stop| {
        tokio::spawn(async move {
            p.partition_repeatedly(&stop, 500..=LONGEST_MS, || {
                if cut_off.open() > 0 {
                    h.fetch_add(1, Ordering::Relaxed);
                }
            })
            .await
        })
    })
    .late(ms(LONGEST_MS));
    let o = workload::run(Run {
        name: "nemesis-serve-partition".into(),
        targets: targets
            .iter()
            .map(|t| t.clone() as Arc<dyn Target>)
            .collect(),
        engines: vec![engine_at(&config).await],
        fresh: Arc::new(engine_at(&config).await),
        admin: admin_client(&srv).await,
        fault: Some(fault),
        tolerated: none_tolerated(),
        tolerated_why: "",
    })
    .await;
    let held = held.load(Ordering::Relaxed);
    report_line("one serve partitioned from redis", held, &o, "");
    assert!(held > 0, "no partition held a request of the cut-off serve");
}

/// The HTTP target answers as the engine does in process: each outcome kind, parsed back,
/// on a live serve (business outcomes, replays, a conflict, invalid input, a reservation's
/// end, a missing reservation, a restock and its replay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_target_maps_answers_like_the_engine() {
    let srv = RedisServer::start();
    let config = store_config(&srv, Mode::Lua);
    let s = serve(&config.store.redis_url, &config, false);
    let t = HttpTarget::new(s.addr());
    let e = engine_at(&config).await;
    let sku = Sku::new(SKU).unwrap();
    e.load(&sku, 3, LoadOptions::new(1).per_user_limit(LIMIT))
        .await
        .unwrap();
    let d = |user: &str, qty: u64, rid: &str| Deduct::new(SKU, user, qty, rid).unwrap();
    let show = |o: &Out| format!("{o:?}");

    let o = t.deduct(&d("u1", 1, "a")).await;
    assert!(
        matches!(&o, Out::Ok(Val::Ded(Deduction::Applied { units: 1, .. }))),
        "{}",
        show(&o)
    );
    let o = t.deduct(&d("u1", 1, "a")).await;
    assert!(
        matches!(&o, Out::Ok(Val::Ded(Deduction::Replayed { .. }))),
        "{}",
        show(&o)
    );
    // The same request id with another quantity: a typed conflict, nothing happened.
    let o = t.deduct(&d("u1", 2, "a")).await;
    assert!(
        matches!(&o, Out::Fail(m) if m.starts_with("409")),
        "{}",
        show(&o)
    );
    let o = t.deduct(&d("u2", 3, "b")).await;
    assert!(
        matches!(&o, Out::Ok(Val::Ded(Deduction::OverLimit { limit: 2 }))),
        "{}",
        show(&o)
    );
    let o = t.reserve(&d("u2", 1, "c"), ms(60_000)).await;
    let Out::Ok(Val::Res(Reserved::Held { id, .. })) = &o else {
        panic!("{}", show(&o));
    };
    assert_eq!(id.request_id().as_str(), "c");
    let o = t.reserve(&d("u2", 1, "c"), ms(60_000)).await;
    assert!(
        matches!(&o, Out::Ok(Val::Res(Reserved::Replayed { id: i, .. })) if i == id),
        "{}",
        show(&o)
    );
    let o = t.confirm(id).await;
    assert!(
        matches!(
            &o,
            Out::Ok(Val::End(ReservationEnd {
                state: Some(store::ResvState::Confirmed),
                done: true
            }))
        ),
        "{}",
        show(&o)
    );
    let o = t.cancel(id).await;
    assert!(
        matches!(
            &o,
            Out::Ok(Val::End(ReservationEnd {
                state: Some(store::ResvState::Confirmed),
                done: false
            }))
        ),
        "{}",
        show(&o)
    );
    let missing: ReservationId = format!("{SKU}~1~0~u9~nope").parse().unwrap();
    let o = t.confirm(&missing).await;
    assert!(
        matches!(
            &o,
            Out::Ok(Val::End(ReservationEnd {
                state: None,
                done: false
            }))
        ),
        "{}",
        show(&o)
    );
    // One unit left; u3 asks for two.
    let o = t.reserve(&d("u3", 2, "d"), ms(60_000)).await;
    assert!(
        matches!(
            &o,
            Out::Ok(Val::Res(Reserved::NotHeld(Deduction::Insufficient {
                available: 1
            })))
        ),
        "{}",
        show(&o)
    );
    // A TTL of 0 is invalid input: nothing happened.
    let o = t.reserve(&d("u3", 1, "e"), Duration::ZERO).await;
    assert!(
        matches!(&o, Out::Fail(m) if m.starts_with("400")),
        "{}",
        show(&o)
    );
    let o = t.deduct(&d("u3", 1, "f")).await;
    assert!(
        matches!(&o, Out::Ok(Val::Ded(Deduction::Applied { .. }))),
        "{}",
        show(&o)
    );
    let o = t.deduct(&d("u4", 1, "g")).await;
    assert!(
        matches!(&o, Out::Ok(Val::Ded(Deduction::SoldOut))),
        "{}",
        show(&o)
    );
    let rid = RequestId::new("s1").unwrap();
    let o = t.restock(&sku, 2, &rid).await;
    assert!(
        matches!(
            &o,
            Out::Ok(Val::Stock(Restocked {
                added: 2,
                replayed: false
            }))
        ),
        "{}",
        show(&o)
    );
    let o = t.restock(&sku, 2, &rid).await;
    assert!(
        matches!(
            &o,
            Out::Ok(Val::Stock(Restocked {
                added: 0,
                replayed: true
            }))
        ),
        "{}",
        show(&o)
    );
    // The user at the limit.
    let o = t.deduct(&d("u1", 1, "h")).await;
    let o2 = t.deduct(&d("u1", 1, "i")).await;
    assert!(
        matches!(&o, Out::Ok(Val::Ded(Deduction::Applied { .. }))),
        "{}",
        show(&o)
    );
    assert!(
        matches!(&o2, Out::Ok(Val::Ded(Deduction::LimitReached { limit: 2 }))),
        "{}",
        show(&o2)
    );
    // A paused serve: the client gives up (unknown), nothing is lost when it resumes.
    signal(s.proc.child.id(), "-STOP");
    let late = tokio::time::timeout(ms(300), t.deduct(&d("u5", 1, "j"))).await;
    signal(s.proc.child.id(), "-CONT");
    assert!(late.is_err(), "a stopped serve answered");
    // No serve at all: a connection error is unknown.
    let gone = HttpTarget::new(&format!("127.0.0.1:{}", ports::free_port()));
    let o = gone.deduct(&d("u5", 1, "k")).await;
    assert!(
        matches!(&o, Out::Unknown(m) if m.contains("connect")),
        "{}",
        show(&o)
    );
    // Redis gone: the serve answers 503, unknown. Another user: u5's request "j", which the
    // paused serve read on resuming, may still be running (its user in flight: user_busy).
    drop(srv);
    let o = t.deduct(&d("u6", 1, "l")).await;
    assert!(
        matches!(&o, Out::Unknown(m) if m.starts_with("503")),
        "{}",
        show(&o)
    );
}
