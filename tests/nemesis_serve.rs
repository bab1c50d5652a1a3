//! Nemesis suite (issue 15), `serve` processes: the checked workload of `tests/nemesis.rs`
//! sent over HTTP to three `shardstock serve` processes on one redis-server (each configured
//! like the workload's engines: per-user limit 2, claim lease 300 ms, user claim TTL 600 ms,
//! pending wait 300 ms, max qty 4, a 400 ms store command timeout), while a fault breaks one of
//! them and heals it; the history is checked as in `tests/history.rs`.
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

mod common;
#[path = "common"]
mod support {
    pub mod history;
    pub mod proxy;
}

use common::serve_process::ServeProcess;
use common::*;
use fred::prelude::ClientLike;
use shardstock::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use support::history::http_target::HttpTarget;
use support::history::workload::{self, *};
use support::history::*;
use support::proxy::Proxy;

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
        ("ENGINE__CLAIM_LEASE_MS", CLAIM_LEASE_MS.to_string()),
        ("ENGINE__USER_CLAIM_TTL_MS", USER_CLAIM_TTL_MS.to_string()),
        ("ENGINE__PENDING_WAIT_MS", "300".into()),
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

    /// How many things each serve holds now: (strategy `lua`) pending fallback claims with a
    /// live lease on a request id sent to that serve and to no other in the last 2 s;
    /// (strategy `lock`) segment locks whose owner token starts with the serve's pid. The
    /// segments are read concurrently (one round trip's time), so short holdings are seen.
    async fn holdings(&self, generation: u64) -> Vec<usize> {
        let mut held = vec![0; self.victims.len()];
        let per_segment = (0..SEGMENTS).map(|seg| {
            let tag = format!("{SKU}#{seg}");
            async move {
                match self.mode {
                    Mode::Lua => {
                        let key = format!("t:{{{tag}}}:g{generation}:claims");
                        let now_ms = (now_us() / 1000).to_string();
                        let live: Vec<String> = self
                            .admin
                            .custom(
                                fred::cmd!("ZRANGEBYSCORE"),
                                vec![key, now_ms, "+inf".into()],
                            )
                            .await
                            .unwrap_or_default();
                        live
                    }
                    Mode::Lock => {
                        let key = format!("t:{{{tag}}}:lock");
                        let owner: Option<String> = self
                            .admin
                            .custom(fred::cmd!("GET"), vec![key])
                            .await
                            .unwrap_or_default();
                        owner.into_iter().collect()
                    }
                }
            }
        });
        for found in futures::future::join_all(per_segment).await.concat() {
            match self.mode {
                Mode::Lua => {
                    let Some((_, rid)) = found.split_once(":rq:") else {
                        continue;
                    };
                    let sent: Vec<usize> = (0..self.victims.len())
                        .filter(|&j| self.victims[j].target.sent_within(rid, ms(2000)))
                        .collect();
                    let [k] = sent[..] else {
                        continue;
                    };
                    let state: Option<String> = self
                        .admin
                        .custom(fred::cmd!("HGET"), vec![found.clone(), "s".into()])
                        .await
                        .unwrap_or_default();
                    held[k] += usize::from(state.as_deref() == Some("P"));
                }
                Mode::Lock => {
                    for (k, v) in self.victims.iter().enumerate() {
                        held[k] += usize::from(found.starts_with(&format!("{:x}.", v.pid)));
                    }
                }
            }
        }
        held
    }
}

/// The pause fault: every 0.2–0.6 s, watch Redis for up to 2 s for a serve holding something
/// (preferring another serve than last time), `SIGSTOP` it (a random one when none was seen
/// holding), look again, keep it stopped 0.6–1.5 s and `SIGCONT` it. Counts the pauses that
/// caught the serve holding something in `held`.
fn aimed_pauses(watch: Watch, held: Arc<std::sync::atomic::AtomicU64>) -> Fault {
    let name = match watch.mode {
        Mode::Lua => "serve SIGSTOP holding a fallback claim",
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
                        .find(|&k| held[k] > 0);
                    if aim.is_none() {
                        // Leave Redis a breath between looks (2 cores shared with the sale).
                        tokio::time::sleep(ms(1)).await;
                    }
                }
                let k = aim.unwrap_or_else(|| rng.usize(..count));
                let pid = watch.victims[k].pid;
                signal(pid, "-STOP");
                // Frozen now: what Redis shows as its own stays until its lease runs out.
                if watch.holdings(generation).await[k] > 0 {
                    held.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(ms(rng.u64(600..=LONGEST_MS))).await;
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

/// What the request records show of claims changing hands: records of a claim epoch above 1
/// (a claim taken over from a holder whose lease ran out), shut-out markers (`V`: older epochs
/// refused at that segment) and refunded parts (`R`). A paused holder's late writes meet these.
async fn claim_figures(admin: &fred::clients::Client) -> (usize, usize, usize) {
    let keys: Vec<String> = admin
        .custom(fred::cmd!("KEYS"), vec![format!("t:{{{SKU}#*}}:g*:rq:*")])
        .await
        .unwrap();
    let (mut later_epoch, mut shut_out, mut refunded) = (0, 0, 0);
    for k in keys {
        let v: Vec<Option<String>> = admin
            .custom(fred::cmd!("HMGET"), vec![k, "s".into(), "e".into()])
            .await
            .unwrap();
        let epoch: u64 = v[1].as_deref().and_then(|e| e.parse().ok()).unwrap_or(0);
        later_epoch += usize::from(epoch >= 2);
        shut_out += usize::from(v[0].as_deref() == Some("V"));
        refunded += usize::from(v[0].as_deref() == Some("R"));
    }
    (later_epoch, shut_out, refunded)
}

fn report_line(fault: &str, held: u64, o: &Outcome, extra: &str) {
    eprintln!(
        "nemesis {fault}: struck {}, held {held}, ops {}, anomalies 0{extra}",
        o.struck, o.ops
    );
}

/// Three serves on one redis-server, paused past their leases by [`aimed_pauses`].
async fn paused_serves(mode: Mode) -> (Outcome, u64, Vec<ServeProcess>, (usize, usize)) {
    let srv = RedisServer::start();
    let config = store_config(&srv, mode);
    let url = config.store.redis_url.clone();
    // Strategy lua: two plain serves and a coalesced one, as in tests/nemesis.rs.
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
    let watch = Watch {
        mode,
        admin: admin.clone(),
        victims: victims.clone(),
    };
    let name = match mode {
        Mode::Lua => "nemesis-serve-pause-lua",
        Mode::Lock => "nemesis-serve-pause-lock",
    };
    let figures_admin = admin.clone();
    let o = workload::run(Run {
        name: name.into(),
        targets: victims
            .iter()
            .map(|v| v.target.clone() as Arc<dyn Target>)
            .collect(),
        engines: vec![engine_at(&config).await, engine_at(&config).await],
        fresh: Arc::new(engine_at(&config).await),
        admin,
        fault: Some(aimed_pauses(watch, held.clone())),
        tolerated: none_tolerated(),
        tolerated_why: "",
    })
    .await;
    let (later_epoch, shut_out, refunded) = claim_figures(&figures_admin).await;
    eprintln!(
        "[{name}] records of a claim epoch >= 2: {later_epoch}, shut-out markers: {shut_out}, \
         refunded parts: {refunded}"
    );
    (
        o,
        held.load(Ordering::Relaxed),
        serves,
        (later_epoch, shut_out),
    )
}

/// (a) Strategy `lua`: a serve paused past the claim lease while it holds a fallback claim;
/// after `SIGCONT` its takes and its settle carry a claim epoch a newer holder shut out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_paused_holding_a_fallback_claim() {
    let (o, held, _serves, (later_epoch, shut_out)) = paused_serves(Mode::Lua).await;
    report_line(
        "serve SIGSTOP past the claim lease (lua)",
        held,
        &o,
        &format!(", claims taken over {later_epoch}, shut-out markers {shut_out}"),
    );
    assert!(
        held > 0,
        "no pause caught a serve holding a fallback claim: the run proved less than it says"
    );
    assert!(
        later_epoch > 0 && shut_out > 0,
        "no claim was taken over (epoch >= 2: {later_epoch}, shut-out markers: {shut_out}): \
         nothing a paused holder wrote late could have been refused"
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
        matches!(&o, Out::Ok(Val::Ded(Deduction::Applied { parts })) if parts.len() == 1 && parts[0].units == 1),
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
    let missing: ReservationId = format!("{SKU}~1~0~nope").parse().unwrap();
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
    // Redis gone: the serve answers 503, unknown.
    drop(srv);
    let o = t.deduct(&d("u5", 1, "l")).await;
    assert!(
        matches!(&o, Out::Unknown(m) if m.starts_with("503")),
        "{}",
        show(&o)
    );
}
