use crate::common;

// The Grafana dashboard, proven against a real Prometheus scraping a live sale.
//
// `every_panel_query_returns_series_from_a_live_sale` starts a redis-server, a timed
// `shardstock sim --strategy lock --outbox --metrics-addr ...`, an order consumer
// `shardstock orders --jsonl --metrics-addr ...` on the same Redis, and Debian's Prometheus
// (scraping both every second with config/prometheus.yml, retargeted to their ports), then
// evaluates every panel query of grafana/shardstock.json with the dashboard's variables
// substituted as Grafana would (both instances selected), and fails naming each query that
// returns no series. It also lints both live expositions with `promtool check metrics`, checks
// that the histograms are real histograms (`_bucket` series, no summary quantiles), shows that
// a misspelt metric is caught, and, once the sale is over and the consumer has caught up,
// checks the order metrics' values in Prometheus: events appended (the streams' entries-added
// in Redis) = events handled (the consumer's JSON lines) > 0, nothing pending or undelivered.
//
// The other tests are static: the dashboard's metric names against the `pub const` names in
// src/ (both ways), its provisioning rules, `promtool check config`, `docker-compose config`.
//
// Prometheus, promtool and docker-compose are required: a missing tool fails the test (it is
// never skipped). scripts/test.sh installs them (Debian packages prometheus, docker-compose).

use common::RedisServer;
use common::binary::shardstock;
use common::http_client::{agent, get};
use common::ports::free_port;
use common::process::{Proc, require};
use common::prometheus::Prometheus;
use common::serve_process::ServeProcess;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Prometheus scrapes every second; Grafana's `$__rate_interval` is then
/// max(4 × scrape interval, $__interval + scrape interval) = 4s for short ranges.
const RATE_INTERVAL: &str = "4s";
/// Metrics described in src/ that deliberately have no panel. Each entry needs a comment saying
/// why.
// The sold-out-from-memory counter: the live sale below runs the lock strategy, which keeps no
// sold-out flags (tests/it/sold_out.rs covers them).
const UNPANELLED: &[&str] = &["shardstock_sold_out_from_memory_total"];
/// The timed sale's length: long enough for Prometheus's first scrape (~5 s after it starts:
/// its scrape manager takes target updates every 5 s), 5 s more of samples, and evaluating
/// every query while the sim is still running (a finished target's series go stale at once,
/// and then every query would return nothing).
const SALE_SECONDS: u64 = 15;
const SKU: &str = "metrics-sale";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn dashboard() -> Value {
    let text = std::fs::read_to_string(root().join("grafana/shardstock.json")).unwrap();
    serde_json::from_str(&text).expect("grafana/shardstock.json is JSON")
}

/// Non-row panels (rows may also nest panels when collapsed).
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        if p["type"] == "row" {
            out.extend(p["panels"].as_array().into_iter().flatten());
        } else {
            out.push(p);
        }
    }
    out
}

/// (panel title, refId, expr) of every target.
fn targets(d: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for p in panels(d) {
        let title = p["title"].as_str().unwrap_or("?").to_string();
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((
                title.clone(),
                t["refId"].as_str().unwrap_or("?").to_string(),
                t["expr"]
                    .as_str()
                    .expect("every target has an expr")
                    .to_string(),
            ));
        }
    }
    out
}

/// Template variables by name.
fn variables(d: &Value) -> BTreeMap<String, &Value> {
    d["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|v| (v["name"].as_str().unwrap().to_string(), v))
        .collect()
}

/// `shardstock_*` identifiers in a PromQL expression.
fn metric_tokens(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(pos) = expr[i..].find("shardstock_") {
        let start = i + pos;
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        let boundary =
            start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_');
        if boundary {
            out.insert(expr[start..end].to_string());
        }
        i = end;
    }
    out
}

/// Every `pub const NAME: &str = "shardstock_...";` in a file of src/ that describes metrics
/// (`describe_counter!` / `_gauge!` / `_histogram!`) — the metrics module, the lock module's
/// `metric_names`, and wherever later metrics land. Other such constants are not metrics
/// (e.g. the PostgreSQL orders table, `shardstock_orders`).
fn described_metrics() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                if ![
                    "describe_counter!",
                    "describe_gauge!",
                    "describe_histogram!",
                ]
                .iter()
                .any(|m| text.contains(m))
                {
                    continue;
                }
                for line in text.lines() {
                    let l = line.trim();
                    if l.starts_with("pub const ")
                        && l.contains(": &str = \"shardstock_")
                        && let Some(q) = l.split('"').nth(1)
                    {
                        out.insert(q.to_string());
                    }
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&root().join("src"), &mut out);
    out
}

/// The described metric a dashboard token refers to (`_bucket`/`_sum`/`_count` of a
/// histogram), if any.
fn resolve<'a>(token: &str, described: &'a BTreeSet<String>) -> Option<&'a String> {
    if let Some(m) = described.get(token) {
        return Some(m);
    }
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| token.strip_suffix(s).and_then(|base| described.get(base)))
}

#[test]
fn dashboard_metric_names_match_the_metrics_module() {
    let d = dashboard();
    let described = described_metrics();
    assert!(
        described.len() >= 20,
        "found only {} metric names in src/: {described:?}",
        described.len()
    );
    let mut used = BTreeSet::new();
    let mut unknown = Vec::new();
    let mut exprs: Vec<(String, String)> = targets(&d)
        .into_iter()
        .map(|(title, _, e)| (title, e))
        .collect();
    for (name, v) in variables(&d) {
        if let Some(q) = v["definition"].as_str() {
            exprs.push((format!("variable ${name}"), q.to_string()));
        }
    }
    for (title, expr) in &exprs {
        for t in metric_tokens(expr) {
            match resolve(&t, &described) {
                Some(m) => {
                    used.insert(m.clone());
                }
                None => unknown.push(format!("{title}: {t}")),
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "the dashboard uses metrics that src/ does not define:\n  {}",
        unknown.join("\n  ")
    );
    for u in UNPANELLED {
        assert!(described.contains(*u), "UNPANELLED lists unknown {u}");
        assert!(
            !used.contains(*u),
            "UNPANELLED lists {u}, but a panel uses it"
        );
    }
    let missing: Vec<&String> = described
        .iter()
        .filter(|m| !used.contains(*m) && !UNPANELLED.contains(&m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics without a panel (add one to grafana/shardstock.json, or list them in \
         UNPANELLED with the reason): {missing:?}"
    );
}

#[test]
fn a_misspelt_metric_is_caught_by_the_name_check() {
    let described = described_metrics();
    let good = "sum(rate(shardstock_fallbacks_total[4s]))";
    let bad = "sum(rate(shardstock_fallback_total[4s]))";
    assert!(
        metric_tokens(good)
            .iter()
            .all(|t| resolve(t, &described).is_some())
    );
    assert!(
        metric_tokens(bad)
            .iter()
            .any(|t| resolve(t, &described).is_none())
    );
    let h = "histogram_quantile(0.99, sum by (le) (rate(shardstock_deduct_duration_seconds_bucket[4s])))";
    assert!(
        metric_tokens(h)
            .iter()
            .all(|t| resolve(t, &described).is_some())
    );
}

#[test]
fn dashboard_is_provisionable() {
    let d = dashboard();
    let text = std::fs::read_to_string(root().join("grafana/shardstock.json")).unwrap();
    assert!(
        d.get("__inputs").is_none() && !text.contains("${DS_"),
        "__inputs / ${{DS_...}} only work through the import screen, not provisioning"
    );
    assert!(
        d["uid"].as_str().is_some_and(|u| !u.is_empty()),
        "a fixed uid"
    );
    let vars = variables(&d);
    assert_eq!(vars["datasource"]["type"], "datasource");
    assert_eq!(vars["datasource"]["query"], "prometheus");
    for v in ["instance", "sku"] {
        assert_eq!(vars[v]["type"], "query", "${v} is a query variable");
        assert_eq!(vars[v]["datasource"]["uid"], "${datasource}");
    }
    let mut rows = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        if p["type"] == "row" {
            rows.push(p["title"].as_str().unwrap().to_string());
        }
    }
    for want in ["Throughput", "Latency", "Segments", "Locks", "errors"] {
        assert!(
            rows.iter().any(|r| r.contains(want)),
            "no row about {want}: {rows:?}"
        );
    }
    let mut problems = Vec::new();
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap_or("?");
        if p["datasource"]["uid"] != "${datasource}" {
            problems.push(format!("{title}: panel datasource is not ${{datasource}}"));
        }
        if p["fieldConfig"]["defaults"]["unit"]
            .as_str()
            .is_none_or(str::is_empty)
        {
            problems.push(format!("{title}: no unit"));
        }
        let ts = p["targets"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if ts.is_empty() {
            problems.push(format!("{title}: no query"));
        }
        for t in ts {
            let e = t["expr"].as_str().unwrap_or("");
            if t["datasource"]["uid"] != "${datasource}" {
                problems.push(format!("{title}: target datasource is not ${{datasource}}"));
            }
            if !e.contains("instance=~\"$instance\"") {
                problems.push(format!("{title}: not filtered by $instance: {e}"));
            }
            for f in ["rate(", "increase("] {
                let windows = e.matches(f).count();
                if windows > 0 && e.matches("[$__rate_interval]").count() < windows {
                    problems.push(format!("{title}: {f} without [$__rate_interval]: {e}"));
                }
            }
            if e.contains("histogram_quantile(") && !e.contains("sum by (le") {
                problems.push(format!(
                    "{title}: histogram_quantile not over sum by (le): {e}"
                ));
            }
            if e.contains("_bucket") && !e.contains("histogram_quantile(") {
                problems.push(format!("{title}: buckets outside histogram_quantile: {e}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn promtool_accepts_the_prometheus_config() {
    require("promtool");
    let out = Command::new("promtool")
        .args(["check", "config"])
        .arg(root().join("config/prometheus.yml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check config:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn docker_compose_file_is_valid() {
    require("docker-compose");
    let out = Command::new("docker-compose")
        .current_dir(root())
        .args(["config", "-q"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker-compose config -q:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------
// The live test.

/// Prometheus with config/prometheus.yml, its scrape target replaced by `targets` (the sim
/// and the order consumer).
fn prometheus_scraping(targets: &[&str]) -> Prometheus {
    let shipped = std::fs::read_to_string(root().join("config/prometheus.yml")).unwrap();
    assert!(
        shipped.contains("\"127.0.0.1:9898\"") && shipped.contains("scrape_interval: 1s"),
        "config/prometheus.yml should scrape 127.0.0.1:9898 every 1s (this test relies on it)"
    );
    let list: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
    Prometheus::start(&shipped.replace("\"127.0.0.1:9898\"", &list.join(", ")))
}

/// Grafana's formatting of a multi-value variable inside `=~"..."`: regex metacharacters
/// escaped (as `\\.` in the PromQL string).
fn grafana_regex_escape(v: &str) -> String {
    let mut out = String::new();
    for c in v.chars() {
        if "\\^$*+?.()|{}[]".contains(c) {
            out.push_str("\\\\");
        }
        out.push(c);
    }
    out
}

/// A multi-value variable as Grafana formats it for Prometheus: one value escaped, several as
/// `(a|b)`.
fn grafana_multi(values: &[&str]) -> String {
    let escaped: Vec<String> = values.iter().map(|v| grafana_regex_escape(v)).collect();
    match escaped.as_slice() {
        [one] => one.clone(),
        many => format!("({})", many.join("|")),
    }
}

/// A query as Grafana sends it with `$instance` = the scrape targets and `$sku` = the sale's.
fn substitute(expr: &str, instances: &[&str]) -> String {
    let s = expr
        .replace("$__rate_interval", RATE_INTERVAL)
        .replace("$instance", &grafana_multi(instances))
        .replace("$sku", &grafana_regex_escape(SKU));
    assert!(!s.contains('$'), "unsubstituted variable in {s}");
    s
}

/// Evaluates every panel target of `dashboard`; the failures, one line each.
fn evaluate(
    prom: &Prometheus,
    agent: &ureq::Agent,
    dashboard: &Value,
    instances: &[&str],
    verbose: bool,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (title, ref_id, expr) in targets(dashboard) {
        let q = substitute(&expr, instances);
        match prom.query(agent, &q) {
            Err(e) => failures.push(format!("{title} [{ref_id}]: error {e}: {q}")),
            Ok(r) if r.is_empty() => failures.push(format!("{title} [{ref_id}]: no series: {q}")),
            Ok(r) => {
                if verbose {
                    let first = &r[0]["value"][1];
                    eprintln!("  {title} [{ref_id}]: {} series, e.g. {first}", r.len());
                }
                // A quantile over buckets with no observations in the window is NaN: the
                // panel would be empty just the same.
                let nan = r.iter().all(|s| s["value"][1] == "NaN");
                if q.starts_with("histogram_quantile") && nan {
                    failures.push(format!("{title} [{ref_id}]: only NaN: {q}"));
                }
            }
        }
    }
    failures
}

/// The sim's /metrics text, fetched directly.
fn exposition(agent: &ureq::Agent, addr: &str) -> String {
    let (status, body) = get(agent, &format!("http://{addr}/metrics"), &[]).expect("GET /metrics");
    assert_eq!(status, 200, "GET /metrics: {body}");
    body
}

fn promtool_check_metrics(text: &str) {
    require("promtool");
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics found problems in the live exposition:\n{said}"
    );
}

/// Everything in a live exposition was described (help text) and is a name src/ defines.
fn check_described(who: &str, text: &str) {
    let described = described_metrics();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let name = rest.split_whitespace().next().unwrap_or("");
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{who}: {name} is exported without a description (metrics::describe())"
            );
            assert!(
                described.contains(name),
                "{who}: {name} is exported but not a `pub const` metric name in src/"
            );
        }
    }
}

/// The value of an instant query that returns one series (`None`: no series, or several).
fn scalar(prom: &Prometheus, agent: &ureq::Agent, q: &str) -> Option<f64> {
    match prom.query(agent, q).ok()?.as_slice() {
        [one] => one["value"][1].as_str()?.parse().ok(),
        _ => None,
    }
}

/// Sum of `XINFO STREAM` entries-added over every outbox stream (`*:out`) in `redis`.
fn entries_added(redis: &RedisServer) -> u64 {
    let mut total = 0;
    for key in redis.cli(&["--scan", "--pattern", "*:out"]).lines() {
        let info = redis.cli(&["XINFO", "STREAM", key]);
        let lines: Vec<&str> = info.lines().collect();
        let added = lines
            .windows(2)
            .find(|w| w[0] == "entries-added")
            .unwrap_or_else(|| panic!("no entries-added in XINFO STREAM {key}:\n{info}"));
        total += added[1].parse::<u64>().unwrap();
    }
    total
}

#[test]
fn every_panel_query_returns_series_from_a_live_sale() {
    let t0 = Instant::now();
    let redis = RedisServer::start();
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let orders_addr = format!("127.0.0.1:{}", free_port());
    // A `serve` beside them, buyers sending it requests for the whole sale: the HTTP panels,
    // and orders (carts) held, confirmed and cancelled: the orders panel.
    let serve = ServeProcess::start(&redis.url(), &["--audit-every-ms", "0"], &[]);
    let instances = [metrics_addr.as_str(), orders_addr.as_str(), serve.addr()];
    let prom = prometheus_scraping(&instances);
    let http_done = Arc::new(AtomicBool::new(false));
    let http_buyers = {
        let (base, done) = (serve.base.clone(), Arc::clone(&http_done));
        std::thread::spawn(move || {
            let a = agent();
            let put = a
                .put(format!("{base}/skus/web"))
                .header("content-type", "application/json")
                .send(r#"{"stock":100000,"segments":2,"per_user_limit":0}"#)
                .unwrap();
            assert_eq!(put.status().as_u16(), 201);
            for n in 0u64.. {
                if done.load(Relaxed) {
                    return n;
                }
                let _ = a
                    .post(format!("{base}/skus/web/deduct"))
                    .header("content-type", "application/json")
                    .send(format!(r#"{{"user":"w{n}","qty":1,"request_id":"r{n}"}}"#));
                if n % 10 == 0 {
                    let _ = get(&a, &format!("{base}/skus/web"), &[]);
                    let _ = get(&a, &format!("{base}/no-such-route"), &[]);
                    // An order (cart) held, then confirmed or cancelled: the orders panel.
                    let _ = a
                        .post(format!("{base}/orders"))
                        .header("content-type", "application/json")
                        .send(format!(
                            r#"{{"user":"c{n}","request_id":"o{n}","items":[{{"sku":"web","qty":1}}],"hold_ms":60000}}"#
                        ));
                    let end = if n % 20 == 0 { "confirm" } else { "cancel" };
                    let _ = a
                        .post(format!("{base}/orders/c{n}~o{n}/{end}"))
                        .header("content-type", "application/json")
                        .send("");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            unreachable!()
        })
    };
    eprintln!("prometheus ready after {:.1}s", t0.elapsed().as_secs_f64());
    let agent = agent();

    // The lock strategy so lock metrics exist; 8 segments of 12-13 units, qty 2 and far more
    // buyers than stock for short homes, transfers, units in transit drained by requests about
    // to answer sold out, sold_out and insufficient; a per-user limit for the guard (1,000
    // users in turn: a buyer comes back within seconds even when the lock strategy runs well
    // below the rate, so the guard answers from memory while Prometheus scrapes); restocks
    // every second keep it selling;
    // the outbox on, so every sale and reservation event reaches the order consumer.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("sim.stderr");
    let out_path = dir.path().join("sim.stdout");
    let duration = SALE_SECONDS.to_string();
    let mut cmd = shardstock(&[
        "sim",
        "--redis",
        &redis.url(),
        "--strategy",
        "lock",
        "--metrics-addr",
        &metrics_addr,
        "--sku",
        SKU,
        "--stock",
        "100",
        "--segments",
        "8",
        "--qty",
        "2",
        "--users",
        "1000",
        "--per-user-limit",
        "2",
        "--reserve-ratio",
        "0.3",
        "--ttl-ms",
        "300",
        "--concurrency",
        "16",
        "--rate",
        "1000",
        "--restock-every",
        "1",
        "--duration",
        &duration,
        "--outbox",
        "--json",
    ]);
    cmd.env("RUST_BACKTRACE", "1")
        .stdout(std::fs::File::create(&out_path).unwrap());
    let mut sim = Proc::spawn("shardstock sim", &mut cmd, log);

    // The order consumer, once the SKU is registered for the outbox (it discovers SKUs when it
    // starts and then every 5 s).
    let deadline = Instant::now() + Duration::from_secs(SALE_SECONDS);
    while redis.cli(&["KEYS", "*:outbox"]).trim().is_empty() {
        if let Ok(Some(status)) = sim.child.try_wait() {
            panic!("the sim exited early ({status}):\n{}", sim.log_tail(20));
        }
        assert!(Instant::now() < deadline, "the sim never loaded its SKU");
        std::thread::sleep(Duration::from_millis(50));
    }
    let jsonl_path = dir.path().join("orders.jsonl");
    let mut cmd = shardstock(&[
        "orders",
        "--redis",
        &redis.url(),
        "--metrics-addr",
        &orders_addr,
        "--jsonl",
    ]);
    cmd.env("RUST_BACKTRACE", "1")
        .stdout(std::fs::File::create(&jsonl_path).unwrap());
    let mut orders = Proc::spawn(
        "shardstock orders",
        &mut cmd,
        dir.path().join("orders.stderr"),
    );

    // First data from both in Prometheus.
    let first = loop {
        if let Ok(Some(status)) = sim.child.try_wait() {
            panic!("the sim exited early ({status}):\n{}", sim.log_tail(20));
        }
        if let Ok(Some(status)) = orders.child.try_wait() {
            panic!("the consumer exited ({status}):\n{}", orders.log_tail(20));
        }
        let has = |q: &str| prom.query(&agent, q).is_ok_and(|r| !r.is_empty());
        if has("shardstock_deductions_total") && has("shardstock_orders_handled_total > 0") {
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "no data from the sim and the consumer in Prometheus after {SALE_SECONDS}s"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!(
        "first samples in Prometheus after {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    // Redis forgets its scripts (as after a restart or failover): the store reloads them on
    // NOSCRIPT and counts it.
    redis.cli(&["SCRIPT", "FLUSH"]);

    // The expositions themselves: promtool-clean, real histograms with our buckets.
    std::thread::sleep(Duration::from_secs(1));
    let text = exposition(&agent, &metrics_addr);
    promtool_check_metrics(&text);
    for (h, le) in [
        ("shardstock_deduct_duration_seconds", "0.00005"),
        ("shardstock_deduct_duration_seconds", "1"),
        ("shardstock_lock_wait_seconds", "0.00005"),
        ("shardstock_lock_wait_seconds", "1"),
        ("shardstock_segment_attempts", "1"),
        ("shardstock_segment_attempts", "32"),
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("{h}_bucket{{"))
                    && l.contains(&format!("le=\"{le}\""))),
            "no {h}_bucket{{le=\"{le}\"}} in the exposition (a histogram without buckets \
             is exported as a summary):\n{text}"
        );
        assert!(
            text.contains(&format!("# TYPE {h} histogram")),
            "{h} is not a histogram"
        );
    }
    assert!(
        !text.contains("quantile=\""),
        "a summary in the exposition:\n{text}"
    );
    check_described("sim", &text);
    let orders_text = exposition(&agent, &orders_addr);
    promtool_check_metrics(&orders_text);
    check_described("orders", &orders_text);
    let serve_text = exposition(&agent, serve.addr());
    promtool_check_metrics(&serve_text);
    check_described("serve", &serve_text);
    // Routes are templates (never a SKU or id), requests no route matched are `unmatched`,
    // and the latency is a histogram with our buckets.
    for want in [
        "shardstock_http_requests_total{route=\"/skus/{sku}/deduct\",method=\"POST\",status=\"200\"}",
        "shardstock_http_requests_total{route=\"unmatched\",method=\"GET\",status=\"404\"}",
        "shardstock_http_request_duration_seconds_bucket{route=\"/skus/{sku}/deduct\",le=\"0.00005\"}",
    ] {
        assert!(
            serve_text.lines().any(|l| l.starts_with(want)),
            "no {want} in serve's exposition:\n{serve_text}"
        );
    }
    assert!(
        !serve_text.contains("/skus/web"),
        "a SKU in a route label:\n{serve_text}"
    );

    // Let every rate window ($__rate_interval = 4s) fill with samples taken after the flush.
    let settle = Duration::from_secs(5);
    if let Some(left) = settle.checked_sub(first.elapsed()) {
        std::thread::sleep(left);
    }

    let d = dashboard();
    let failures = evaluate(&prom, &agent, &d, &instances, true);

    // The variables resolve: label_values(selector, label) lists the targets and the SKU.
    let mut var_failures = Vec::new();
    for (name, want) in [
        ("instance", metrics_addr.as_str()),
        ("instance", orders_addr.as_str()),
        ("sku", SKU),
    ] {
        let def = variables(&d)[name]["definition"]
            .as_str()
            .unwrap()
            .to_string();
        let inner = def
            .strip_prefix("label_values(")
            .and_then(|s| s.strip_suffix(')'))
            .unwrap_or_else(|| panic!("${name}: unexpected definition {def}"));
        let (selector, label) = inner.rsplit_once(',').unwrap();
        let q = format!(
            "count by ({}) ({})",
            label.trim(),
            substitute(selector.trim(), &instances)
        );
        let r = prom.query(&agent, &q).unwrap_or_default();
        if !r.iter().any(|s| s["metric"][label.trim()] == want) {
            var_failures.push(format!("${name}: {want} not among {r:?} ({q})"));
        }
    }

    // A misspelt metric in a copy of the dashboard must be reported, and only that panel.
    let misspelt_text = serde_json::to_string(&d)
        .unwrap()
        .replace("shardstock_transfers_total", "shardstock_transfer_total");
    let misspelt: Value = serde_json::from_str(&misspelt_text).unwrap();
    let caught = evaluate(&prom, &agent, &misspelt, &instances, false);
    let still_running = sim.child.try_wait().unwrap().is_none();
    let evaluated_at = t0.elapsed();
    http_done.store(true, Relaxed);
    let http_requests = http_buyers.join().unwrap();
    eprintln!("{http_requests} deductions sent to serve");

    assert!(
        still_running,
        "the sim finished before the queries were evaluated (this machine is slow): the \
         results below may be stale-marked; raise SALE_SECONDS"
    );
    assert!(
        failures.is_empty() && var_failures.is_empty(),
        "dashboard queries without data from a live sale:\n  {}",
        failures
            .iter()
            .chain(&var_failures)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    assert!(
        caught.len() == 1 && caught[0].contains("shardstock_transfer_total"),
        "the misspelt metric was not reported (or other panels failed too): {caught:?}"
    );

    // The sale itself ends normally, sold, answered sold out, and never oversold.
    let status = sim.child.wait().unwrap();
    let mut stdout = String::new();
    std::fs::File::open(&out_path)
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(
        status.success(),
        "sim: {status}\n{stdout}\n{}",
        sim.log_tail(80)
    );
    let r: Value = serde_json::from_str(stdout.trim()).expect("sim --json");
    for k in ["applied", "sold_out", "replayed", "restocked"] {
        assert!(r[k].as_u64().unwrap() > 0, "{k} = 0 in a timed sale: {r}");
    }
    // --rate 1000 is a cap: no more than rate × duration (+ the requests already due).
    let sent = r["requests"].as_u64().unwrap();
    assert!(
        sent <= 1000 * SALE_SECONDS + 16,
        "--rate 1000 not honoured: {sent} requests"
    );
    assert_eq!(r["oversold"], 0, "{r}");
    assert_eq!(r["audit_ok"], true, "{r}");

    // The sale is over: the consumer catches up, and its next lag refresh (every 5 s) reports
    // every appended event handled. Prometheus then holds the final figures.
    let appended_in_redis = entries_added(&redis);
    let group = "{group=\"orders\"}";
    let q_appended = format!("shardstock_outbox_events_appended{group}");
    let q_pending = format!("shardstock_orders_pending{group}");
    let q_undelivered = format!("shardstock_orders_undelivered{group}");
    let q_oldest = format!("shardstock_orders_oldest_pending_seconds{group}");
    let q_handled = "shardstock_orders_handled_total";
    let deadline = Instant::now() + Duration::from_secs(20);
    let (appended, handled, pending, undelivered, oldest) = loop {
        if let Ok(Some(status)) = orders.child.try_wait() {
            panic!("the consumer exited ({status}):\n{}", orders.log_tail(20));
        }
        let v = |q: &str| scalar(&prom, &agent, q);
        let now = (
            v(&q_appended),
            v(q_handled),
            v(&q_pending),
            v(&q_undelivered),
            v(&q_oldest),
        );
        if let (Some(a), Some(h), Some(p), Some(u), Some(o)) = now
            && a == appended_in_redis as f64
            && h == a
            && p == 0.0
            && u == 0.0
        {
            break (a, h, p, u, o);
        }
        assert!(
            Instant::now() < deadline,
            "the order metrics in Prometheus never showed the consumer caught up with the \
             {appended_in_redis} events in Redis: appended, handled, pending, undelivered, \
             oldest pending age = {now:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let lines = std::fs::read_to_string(&jsonl_path)
        .unwrap()
        .lines()
        .count();
    assert!(handled > 0.0, "no order handled");
    assert_eq!(
        lines as f64, handled,
        "the consumer printed {lines} events, its counter says {handled}"
    );
    assert_eq!(oldest, 0.0, "nothing pending, yet an oldest pending age");
    // Nothing failed: the rare counters are exported at zero, and stayed there.
    for c in [
        "shardstock_orders_handler_failures_total",
        "shardstock_orders_redeliveries_total",
        "shardstock_orders_dead_letters_total",
    ] {
        assert_eq!(scalar(&prom, &agent, c), Some(0.0), "{c}");
    }
    eprintln!(
        "orders: {appended} appended = {handled} handled = {lines} JSON lines; \
         pending {pending}, undelivered {undelivered}"
    );

    let queries = targets(&d).len();
    eprintln!(
        "{queries} panel queries returned series; evaluated at {:.1}s, test took {:.1}s \
         ({} requests)",
        evaluated_at.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        r["requests"]
    );
}
