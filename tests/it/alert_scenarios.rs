//! The alerts, end to end: Debian's Prometheus runs `config/prometheus.yml` **as shipped** (its
//! `rule_files` loads `config/alerts.yml`, evaluated every 5 s; only the scrape target list is
//! replaced) and scrapes one live `shardstock serve` per scenario, each over its own real
//! redis-server, all at once. Alerts carry the `instance` label of the `serve` they are about,
//! so `/api/v1/alerts` says which scenario raised what.
//!
//! Quiet scenarios (no alert may be pending or firing for their instance at any poll, from the
//! first scrape to the end): a healthy 16-segment sale whose homes run short (transfers), a
//! reservation storm whose holds expire, a restock, a reload mid-sale, buyers of a SKU not
//! loaded yet (only ShardstockDeductLatencyHigh may go pending there: its p99 depends on how
//! busy the machine is, and its `for:` is 10 minutes). Loud ones (each alert named must fire at
//! some poll; no other may be pending or firing but those named as consequences): a unit written into a
//! segment by hand, Redis killed, Redis back empty, a master refusing writes
//! (`min-replicas-to-write` with no replica). Figures each scenario reports (the remaining
//! gauge against `GET /skus/{sku}`, the audit gauges) are printed as a table at the end.

use crate::common;
use common::RedisServer;
use common::http_client::{agent, get};
use common::process::require;
use common::prometheus::Prometheus;
use common::serve_process::ServeProcess;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `METHOD url` with a JSON body (none for `None`): the status and the JSON reply.
fn send(a: &ureq::Agent, method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    let req = match method {
        "PUT" => a.put(url),
        _ => a.post(url),
    };
    let req = req.header("content-type", "application/json");
    let mut r = match body {
        Some(b) => req.send(b.to_string()),
        None => req.send_empty(),
    }
    .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let text = r.body_mut().read_to_string().unwrap();
    (
        r.status().as_u16(),
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

fn get_json(a: &ureq::Agent, url: &str) -> (u16, Value) {
    let (s, body) = get(a, url, &[]).unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (s, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Prometheus's alerts (`/api/v1/alerts`): `(instance, alertname, state)`.
fn alerts(prom: &Prometheus, a: &ureq::Agent) -> Vec<(String, String, String)> {
    let (status, body) = get(a, &format!("{}/api/v1/alerts", prom.base), &[]).unwrap();
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["data"]["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|x| {
            let l = &x["labels"];
            (
                l["instance"].as_str().unwrap_or("").to_string(),
                l["alertname"].as_str().unwrap_or("").to_string(),
                x["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// One number from an instant query (`None`: no series).
fn scalar(prom: &Prometheus, a: &ureq::Agent, expr: &str) -> Option<f64> {
    let r = prom.query(a, expr).ok()?;
    r.first()?["value"][1].as_str()?.parse().ok()
}

/// A `serve` over its own redis-server, with the live audit every second.
struct Instance {
    redis: RedisServer,
    serve: ServeProcess,
    a: ureq::Agent,
}

impl Instance {
    fn start(redis: RedisServer, env: &[(&str, &str)]) -> Self {
        let mut env = env.to_vec();
        env.push(("RUST_LOG", "shardstock=info"));
        let serve = ServeProcess::start(
            &redis.url(),
            &["--audit-every-ms", "1000", "--sweep-ms", "200"],
            &env,
        );
        Self {
            redis,
            serve,
            a: agent(),
        }
    }

    fn url(&self, path: &str) -> String {
        self.serve.url(path)
    }

    fn load(&self, sku: &str, body: Value) {
        let (s, b) = send(
            &self.a,
            "PUT",
            &self.url(&format!("/skus/{sku}")),
            Some(body),
        );
        assert_eq!(s, 201, "load {sku}: {b}");
    }

    /// A sale of one unit: the reply's `outcome` (or the HTTP status when not 200).
    fn buy(&self, sku: &str, user: &str, rid: &str) -> String {
        let (s, b) = send(
            &self.a,
            "POST",
            &self.url(&format!("/skus/{sku}/deduct")),
            Some(json!({"user": user, "qty": 1, "request_id": rid})),
        );
        if s == 200 {
            b["outcome"].as_str().unwrap_or("?").to_string()
        } else {
            format!("{s} {}", b["code"].as_str().unwrap_or(""))
        }
    }

    fn audit(&self, sku: &str) -> Value {
        let (s, b) = get_json(&self.a, &self.url(&format!("/skus/{sku}/audit")));
        assert_eq!(s, 200, "audit {sku}: {b}");
        b
    }

    fn status(&self, sku: &str) -> Value {
        let (s, b) = get_json(&self.a, &self.url(&format!("/skus/{sku}")));
        assert_eq!(s, 200, "status {sku}: {b}");
        b
    }

    /// The sum of every sample of `name` in this instance's `/metrics`.
    fn metric(&self, name: &str) -> f64 {
        let (_, text) = get(&self.a, &self.url("/metrics"), &[]).unwrap();
        text.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// What a scenario expects of the alerts for its instance.
#[derive(Clone, Copy)]
struct Expect {
    /// Must be firing at the end.
    fire: &'static [&'static str],
    /// May also fire (slower consequences of the same fault); anything else may not.
    may: &'static [&'static str],
}

const QUIET: Expect = Expect {
    fire: &[],
    may: &[],
};

type Workload = Box<dyn FnOnce(&Instance, &Notes) + Send>;

/// Figures a workload reports, by scenario, for the table at the end.
type Notes = Arc<Mutex<BTreeMap<String, Vec<String>>>>;

struct Scenario {
    name: &'static str,
    expect: Expect,
    /// Run on the instance, in a thread of its own; loud scenarios break something at the end.
    work: Workload,
}

fn note(notes: &Notes, scenario: &str, line: String) {
    eprintln!("[{scenario}] {line}");
    notes
        .lock()
        .unwrap()
        .entry(scenario.to_string())
        .or_default()
        .push(line);
}

/// A healthy sale whose homes run short: 2,000 units in 16 segments, 1,900 buyers (one unit
/// each, per-user limit 1) from 4 threads: the fuller homes pull units from the others.
fn healthy_sale_with_transfers(i: &Instance, notes: &Notes) {
    i.load(
        "phone",
        json!({"stock": 2000, "segments": 16, "per_user_limit": 1}),
    );
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || {
                let a = agent();
                for u in (t..1900).step_by(4) {
                    let (st, b) = send(
                        &a,
                        "POST",
                        &i.url("/skus/phone/deduct"),
                        Some(json!({"user": format!("u{u}"), "qty": 1, "request_id": format!("r{u}")})),
                    );
                    assert_eq!((st, b["outcome"].as_str()), (200, Some("applied")), "{b}");
                }
            });
        }
    });
    let audit = i.audit("phone");
    assert_eq!(audit["ok"], true, "{audit}");
    assert_eq!(audit["sold"], 1900, "{audit}");
    let moved: u64 = audit["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["moved_in"].as_u64().unwrap())
        .sum();
    assert!(
        moved > 0,
        "no transfer: the scenario tests nothing ({audit})"
    );
    note(
        notes,
        "healthy sale",
        format!(
            "sold 1900 of 2000, {moved} units moved between segments, {} transfers",
            i.metric("shardstock_transfers_total")
        ),
    );
}

/// Reservations by the hundred: 40 held for a minute, each confirmed or cancelled at once,
/// and 260 left to expire (300 ms); the sweeper returns the expired ones; then sales of what
/// came back.
fn reservation_storm(i: &Instance, notes: &Notes) {
    i.load(
        "ticket",
        json!({"stock": 400, "segments": 4, "per_user_limit": 0}),
    );
    let hold = |u: u64, ttl_ms: u64| {
        let (s, b) = send(
            &i.a,
            "POST",
            &i.url("/skus/ticket/reservations"),
            Some(
                json!({"user": format!("u{u}"), "qty": 1, "request_id": format!("h{u}"), "ttl_ms": ttl_ms}),
            ),
        );
        assert_eq!(s, 201, "{b}");
        b["id"].as_str().unwrap().to_string()
    };
    for u in 0..40 {
        let id = hold(u, 60_000);
        let (what, state) = if u % 2 == 0 {
            ("confirm", "confirmed")
        } else {
            ("cancel", "cancelled")
        };
        let (s, b) = send(
            &i.a,
            "POST",
            &i.url(&format!("/reservations/{id}/{what}")),
            None,
        );
        assert_eq!((s, b["state"].as_str()), (200, Some(state)), "{b}");
    }
    for u in 40..300 {
        hold(u, 300);
    }
    // The holds expire; the sweeper (every 200 ms) returns them.
    let back = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(200));
        let a = i.audit("ticket");
        a["reserved"] == 0 && a["expired"] == 0
    });
    assert!(
        back,
        "the expired holds never came back: {}",
        i.audit("ticket")
    );
    for u in 0..100 {
        assert_eq!(
            i.buy("ticket", &format!("b{u}"), &format!("s{u}")),
            "applied"
        );
    }
    let audit = i.audit("ticket");
    assert_eq!(audit["ok"], true, "{audit}");
    assert_eq!(
        (&audit["sold"], &audit["remaining"]),
        (&json!(120), &json!(280)),
        "{audit}"
    );
    note(
        notes,
        "reservation storm",
        format!(
            "300 held, 20 confirmed, 20 cancelled, 260 expired and returned ({} units by the sweeper, the rest by the scripts that met them), 100 sold after",
            i.metric("shardstock_reservation_expired_units_total")
        ),
    );
}

/// A restock in the middle of a sale.
fn restock(i: &Instance, notes: &Notes) {
    i.load(
        "mug",
        json!({"stock": 100, "segments": 4, "per_user_limit": 0}),
    );
    for u in 0..80 {
        assert_eq!(i.buy("mug", &format!("u{u}"), &format!("r{u}")), "applied");
    }
    let (s, b) = send(
        &i.a,
        "POST",
        &i.url("/skus/mug/restock"),
        Some(json!({"qty": 200, "request_id": "restock-1"})),
    );
    assert_eq!(s, 200, "{b}");
    for u in 80..250 {
        assert_eq!(i.buy("mug", &format!("u{u}"), &format!("r{u}")), "applied");
    }
    let st = i.status("mug");
    assert_eq!(st["remaining"], 50, "{st}");
    note(
        notes,
        "restock",
        "100 loaded, 80 sold, 200 restocked, 170 sold".into(),
    );
}

/// A reload while buyers keep buying: a new generation replaces the old one.
fn reload(i: &Instance, notes: &Notes) {
    i.load(
        "lamp",
        json!({"stock": 100, "segments": 4, "per_user_limit": 0}),
    );
    let outcomes = Mutex::new(BTreeMap::<String, u64>::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            for u in 0..300 {
                let o = i.buy("lamp", &format!("u{u}"), &format!("r{u}"));
                *outcomes.lock().unwrap().entry(o).or_default() += 1;
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        let (s, b) = send(
            &agent(),
            "PUT",
            &i.url("/skus/lamp"),
            Some(json!({"stock": 500, "segments": 8, "per_user_limit": 0, "replace": true})),
        );
        assert_eq!(s, 201, "{b}");
    });
    let audit = i.audit("lamp");
    assert_eq!(audit["ok"], true, "{audit}");
    note(
        notes,
        "reload",
        format!("100 units in 4 segments reloaded as 500 in 8 mid-sale; outcomes {outcomes:?}"),
    );
}

/// Buyers early for a sale: 404 `not_loaded` for 8 s, then the load and the sale.
fn not_loaded_yet(i: &Instance, notes: &Notes) {
    let until = Instant::now() + Duration::from_secs(8);
    let mut early = 0;
    while Instant::now() < until {
        assert_eq!(i.buy("drop", &format!("e{early}"), "r1"), "404 not_loaded");
        early += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    i.load(
        "drop",
        json!({"stock": 50, "segments": 2, "per_user_limit": 1}),
    );
    for u in 0..50 {
        assert_eq!(i.buy("drop", &format!("e{u}"), "r1"), "applied");
    }
    note(
        notes,
        "not loaded yet",
        format!(
            "{early} requests answered 404 not_loaded before the load, counted as kind=\"not_loaded\": {}",
            i.metric("shardstock_errors_total{kind=\"not_loaded\"}")
        ),
    );
}

/// A few sales, then one unit written into a segment's stock by hand.
fn unit_by_hand(i: &Instance, notes: &Notes) {
    i.load(
        "cup",
        json!({"stock": 50, "segments": 2, "per_user_limit": 0}),
    );
    for u in 0..5 {
        assert_eq!(i.buy("cup", &format!("u{u}"), &format!("r{u}")), "applied");
    }
    std::thread::sleep(Duration::from_secs(3)); // audited healthy first
    let keys = i.redis.cli(&["KEYS", "*cup#0*:seg"]);
    let key = keys.lines().next().expect("segment 0 of cup").to_string();
    i.redis.cli(&["HINCRBY", &key, "stock", "1"]);
    note(notes, "unit by hand", format!("HINCRBY {key} stock 1"));
}

/// Sales, then Redis killed (and left down).
fn redis_killed(i: &mut Instance, notes: &Notes) {
    i.load(
        "pen",
        json!({"stock": 50, "segments": 2, "per_user_limit": 0}),
    );
    for u in 0..5 {
        assert_eq!(i.buy("pen", &format!("u{u}"), &format!("r{u}")), "applied");
    }
    std::thread::sleep(Duration::from_secs(3));
    i.redis.stop();
    note(
        notes,
        "Redis killed",
        "redis-server killed, left down".into(),
    );
}

/// Sales, then Redis restarted with no data.
fn redis_back_empty(i: &mut Instance, notes: &Notes) {
    i.load(
        "hat",
        json!({"stock": 50, "segments": 2, "per_user_limit": 0}),
    );
    for u in 0..5 {
        assert_eq!(i.buy("hat", &format!("u{u}"), &format!("r{u}")), "applied");
    }
    std::thread::sleep(Duration::from_secs(3));
    i.redis.restart_empty();
    note(
        notes,
        "Redis back empty",
        "redis-server restarted with no data".into(),
    );
}

/// Durability mode (`store.wait_replicas 1`) over a master with one replica and
/// `min-replicas-to-write 1`: sales, then the replica is killed, so the master refuses every
/// script that may write while buyers keep coming; the audit and the status still answer, from
/// reads alone, with the figures of before.
fn refusing_master(i: &mut Instance, replica: &mut RedisServer, notes: &Notes) {
    i.load(
        "cap",
        json!({"stock": 50, "segments": 2, "per_user_limit": 0}),
    );
    for u in 0..5 {
        assert_eq!(i.buy("cap", &format!("u{u}"), &format!("r{u}")), "applied");
    }
    let before = i.audit("cap");
    std::thread::sleep(Duration::from_secs(2));
    replica.stop();
    let mut refused = 0;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        let o = i.buy("cap", &format!("late{refused}"), &format!("x{refused}"));
        // Until the master counts its replica gone (min-replicas-max-lag 1 s), a sale's WAIT
        // falls short instead (outcome unknown): retried below under the same id, it replays
        // or is refused.
        assert!(
            ["503 no_replicas", "503 not_durable"].contains(&o.as_str()),
            "{o}"
        );
        refused += u64::from(o == "503 no_replicas");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(refused > 100, "{refused} refusals");
    let t = Instant::now();
    let during = i.audit("cap");
    let took = t.elapsed();
    assert_eq!(during["ok"], true, "{during}");
    let st = i.status("cap");
    note(
        notes,
        "refusing master",
        format!(
            "{refused} sales refused (503 no_replicas); audit while refusing answered in {} ms: ok, sold {} (before {}), remaining {} (status {})",
            took.as_millis(),
            during["sold"],
            before["sold"],
            during["remaining"],
            st["remaining"]
        ),
    );
}

/// Whether `alert` was seen firing for `instance` at any poll.
fn ever_fired(
    seen: &BTreeMap<String, BTreeSet<(String, String)>>,
    instance: &str,
    alert: &str,
) -> bool {
    seen.get(instance)
        .is_some_and(|s| s.contains(&(alert.to_string(), "firing".to_string())))
}

#[test]
fn alerts_fire_for_faults_and_stay_quiet_for_healthy_sales() {
    require("prometheus");
    let notes: Notes = Arc::default();
    let scenarios: Vec<Scenario> = vec![
        Scenario {
            name: "healthy sale",
            expect: QUIET,
            work: Box::new(healthy_sale_with_transfers),
        },
        Scenario {
            name: "reservation storm",
            expect: QUIET,
            work: Box::new(reservation_storm),
        },
        Scenario {
            name: "restock",
            expect: QUIET,
            work: Box::new(restock),
        },
        Scenario {
            name: "reload",
            expect: QUIET,
            work: Box::new(reload),
        },
        Scenario {
            name: "not loaded yet",
            expect: QUIET,
            work: Box::new(not_loaded_yet),
        },
        Scenario {
            name: "unit by hand",
            expect: Expect {
                fire: &[
                    "ShardstockAuditFailed",
                    "ShardstockUnitsUnaccounted",
                    "ShardstockOversold",
                ],
                may: &[],
            },
            work: Box::new(unit_by_hand),
        },
        Scenario {
            name: "Redis killed",
            expect: Expect {
                fire: &["ShardstockStoreDown"],
                may: &["ShardstockAuditStale", "ShardstockRedisErrors"],
            },
            work: Box::new(|_, _| {}),
        },
        Scenario {
            name: "Redis back empty",
            expect: Expect {
                fire: &["ShardstockSkusVanished", "ShardstockAuditFailed"],
                may: &[],
            },
            work: Box::new(|_, _| {}),
        },
        Scenario {
            name: "refusing master",
            expect: Expect {
                fire: &["ShardstockWritesRefused"],
                may: &["ShardstockErrorRate"],
            },
            work: Box::new(|_, _| {}),
        },
    ];
    let t0 = Instant::now();
    let refusing = 8;
    let mut replica = None;
    let mut instances: Vec<Instance> = (0..scenarios.len())
        .map(|n| {
            let redis = RedisServer::start_plain("kills and restarts its server");
            if n != refusing {
                return Instance::start(redis, &[]);
            }
            // A master with one replica that refuses writes without it.
            let port = redis.port.to_string();
            let r = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
            let synced = (0..400).any(|_| {
                std::thread::sleep(Duration::from_millis(50));
                r.cli(&["INFO", "replication"])
                    .contains("master_link_status:up")
            });
            assert!(synced, "the replica never synced");
            replica = Some(r);
            redis.cli(&["CONFIG", "SET", "min-replicas-to-write", "1"]);
            redis.cli(&["CONFIG", "SET", "min-replicas-max-lag", "1"]);
            Instance::start(redis, &[("SHARDSTOCK_STORE__WAIT_REPLICAS", "1")])
        })
        .collect();
    let mut replica = replica.unwrap();
    let addrs: Vec<String> = instances
        .iter()
        .map(|i| i.serve.addr().to_string())
        .collect();
    let name_of: BTreeMap<&str, &str> = addrs
        .iter()
        .map(String::as_str)
        .zip(scenarios.iter().map(|s| s.name))
        .collect();
    let expect: BTreeMap<&str, Expect> = addrs
        .iter()
        .map(String::as_str)
        .zip(scenarios.iter().map(|s| s.expect))
        .collect();

    // The shipped configuration, its one target replaced by the scenarios' instances.
    let shipped = std::fs::read_to_string(root().join("config/prometheus.yml")).unwrap();
    let target = "targets: [\"127.0.0.1:9898\"]";
    assert!(
        shipped.contains(target),
        "config/prometheus.yml: no `{target}`"
    );
    assert!(
        shipped.contains("  - alerts.yml"),
        "config/prometheus.yml loads no alerts.yml"
    );
    let list: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
    let config = shipped.replace(target, &format!("targets: [{}]", list.join(", ")));
    let rules = std::fs::read_to_string(root().join("config/alerts.yml")).unwrap();
    let prom = Prometheus::start_with_files(&config, &[("alerts.yml", &rules)]);
    let a = agent();
    let scraped = (0..100).any(|_| {
        let up = prom.query(&a, "up == 1").map(|r| r.len()).unwrap_or(0);
        up == addrs.len() || {
            std::thread::sleep(Duration::from_millis(200));
            false
        }
    });
    assert!(scraped, "Prometheus never scraped every instance");
    // The shipped file loaded every rule of config/alerts.yml.
    let (_, body) = get(&a, &format!("{}/api/v1/rules", prom.base), &[]).unwrap();
    let v: Value = serde_json::from_str(&body).unwrap();
    let loaded = v["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .filter(|r| r["type"] == "alerting")
        .count();
    let defined = rules.matches("- alert:").count();
    assert_eq!(
        loaded, defined,
        "alerting rules loaded by config/prometheus.yml"
    );
    eprintln!(
        "prometheus scraping {} instances with {loaded} alerting rules after {:.1}s",
        addrs.len(),
        t0.elapsed().as_secs_f64()
    );

    // Every workload in a thread of its own; the loud ones end by breaking something.
    let (killed, emptied) = (6, 7);
    let mut seen: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    let quiet_since;
    {
        let notes = &notes;
        let mut rest: Vec<(&mut Instance, Workload)> = Vec::new();
        let mut loud_redis: Vec<(usize, &mut Instance)> = Vec::new();
        for (n, (i, s)) in instances.iter_mut().zip(scenarios).enumerate() {
            if n == killed || n == emptied || n == refusing {
                loud_redis.push((n, i));
            } else {
                rest.push((i, s.work));
            }
        }
        std::thread::scope(|sc| {
            let mut handles = Vec::new();
            for (i, work) in rest {
                handles.push(sc.spawn(move || work(i, notes)));
            }
            let mut replica = Some(&mut replica);
            for (n, i) in loud_redis {
                if n == refusing {
                    let r = replica.take().unwrap();
                    handles.push(sc.spawn(move || refusing_master(i, r, notes)));
                    continue;
                }
                handles.push(sc.spawn(move || {
                    if n == killed {
                        redis_killed(i, notes)
                    } else {
                        redis_back_empty(i, notes)
                    }
                }));
            }
            // Poll the alerts while the workloads run.
            while handles.iter().any(|h| !h.is_finished()) {
                for (inst, name, state) in alerts(&prom, &a) {
                    seen.entry(inst).or_default().insert((name, state));
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            for h in handles {
                if let Err(e) = h.join() {
                    std::panic::resume_unwind(e);
                }
            }
        });
        quiet_since = Instant::now();
    }

    // Until every loud scenario fires what it must, and at least 30 s past the last workload
    // (6 evaluations: a quiet scenario's delayed condition would be pending by then).
    let deadline = Instant::now() + Duration::from_secs(120);
    let firing = |all: &[(String, String, String)], inst: &str| -> BTreeSet<String> {
        all.iter()
            .filter(|(i, _, s)| i == inst && s == "firing")
            .map(|(_, n, _)| n.clone())
            .collect()
    };
    let last = loop {
        let all = alerts(&prom, &a);
        for (inst, name, state) in &all {
            seen.entry(inst.clone())
                .or_default()
                .insert((name.clone(), state.clone()));
        }
        let done = addrs.iter().all(|addr| {
            let must = expect[addr.as_str()].fire;
            must.iter().all(|m| ever_fired(&seen, addr, m))
        }) && quiet_since.elapsed() > Duration::from_secs(30);
        if done || Instant::now() > deadline {
            break all;
        }
        std::thread::sleep(Duration::from_millis(500));
    };

    // The table, then the verdicts: what fired at any poll (an alert a fault raises may
    // resolve once its window has passed: `rate(...[1m])`), and what was ever pending.
    let mut problems = Vec::new();
    eprintln!(
        "\n{:<20} {:<70} ever pending or firing",
        "scenario", "firing at the end"
    );
    for addr in &addrs {
        let name = name_of[addr.as_str()];
        let Expect { fire: must, may } = expect[addr.as_str()];
        let now = firing(&last, addr);
        let raised: BTreeSet<(String, String)> = seen.get(addr).cloned().unwrap_or_default();
        let ever: Vec<String> = raised.iter().map(|(n, st)| format!("{n} ({st})")).collect();
        eprintln!("{name:<20} {:<70} {}", format!("{now:?}"), ever.join(", "));
        for (alert, state) in &raised {
            let expected = must.contains(&alert.as_str()) || may.contains(&alert.as_str());
            // Pending is allowed only where it can be nothing but the machine's own load: the
            // p99 of debug builds on 2 shared cores (its `for:` is 10 minutes).
            let load = state == "pending" && alert == "ShardstockDeductLatencyHigh";
            if !expected && !load {
                problems.push(format!("{name}: {alert} was {state}, unexpected"));
            }
        }
        for m in must {
            if !ever_fired(&seen, addr, m) {
                problems.push(format!(
                    "{name}: {m} never fired (firing at the end: {now:?})"
                ));
            }
        }
    }

    // The gauges of the healthy sale against its API, and the hand-made unit's figures.
    let healthy = &instances[0];
    let inst = healthy.serve.addr();
    let st = healthy.status("phone");
    let gauge = scalar(
        &prom,
        &a,
        &format!("shardstock_remaining_units{{instance=\"{inst}\",sku=\"phone\"}}"),
    );
    let per_segment_gauges: Vec<f64> = (0..16)
        .map(|i| {
            scalar(
                &prom,
                &a,
                &format!(
                    "shardstock_segment_remaining_units{{instance=\"{inst}\",sku=\"phone\",segment=\"{i}\"}}"
                ),
            )
            .unwrap_or(-1.0)
        })
        .collect();
    let api_per_segment: Vec<f64> = st["per_segment"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let figures = |inst: &str| {
        (
            scalar(
                &prom,
                &a,
                &format!("shardstock_audit_excess_units{{instance=\"{inst}\"}}"),
            ),
            scalar(
                &prom,
                &a,
                &format!("shardstock_audit_unaccounted_units{{instance=\"{inst}\"}}"),
            ),
        )
    };
    let (excess, unaccounted) = figures(inst);
    eprintln!(
        "healthy sale: remaining API {} gauge {gauge:?}; per segment API {api_per_segment:?} gauges {per_segment_gauges:?}; excess {excess:?} unaccounted {unaccounted:?}",
        st["remaining"]
    );
    if gauge != st["remaining"].as_f64() || per_segment_gauges != api_per_segment {
        problems.push(format!(
            "healthy sale: remaining gauges {gauge:?} {per_segment_gauges:?} != API {st}"
        ));
    }
    if (excess, unaccounted) != (Some(0.0), Some(0.0)) {
        problems.push(format!(
            "healthy sale: excess {excess:?} unaccounted {unaccounted:?}, want 0 and 0"
        ));
    }
    let (excess, unaccounted) = figures(instances[5].serve.addr());
    eprintln!("unit by hand: excess {excess:?} unaccounted {unaccounted:?}");
    if (excess, unaccounted) != (Some(1.0), Some(1.0)) {
        problems.push(format!(
            "unit by hand: excess {excess:?} unaccounted {unaccounted:?}, want 1 and 1"
        ));
    }
    for (scenario, lines) in notes.lock().unwrap().iter() {
        for l in lines {
            eprintln!("{scenario}: {l}");
        }
    }
    eprintln!("whole run {:.1}s", t0.elapsed().as_secs_f64());
    assert!(problems.is_empty(), "{problems:#?}");
}
