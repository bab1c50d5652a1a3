//! `examples/embed_axum.rs` as a service: its source is compiled into this test, so the
//! example cannot fall behind the library. Run on a free port, it sells on its own route,
//! answers on the mounted API, and `/api/metrics` renders the sale from the recorder it
//! installed.
//!
//! A test binary of its own: the recorder the example installs is global to the process, and
//! sales of other tests running beside it would count in its `/api/metrics`.

#[allow(dead_code)] // the example's `main`
#[path = "../examples/embed_axum.rs"]
mod embed_axum;

use std::time::Duration;

/// `(status, body)` of a request; every status is an answer.
fn call(method: &str, url: &str) -> (u16, String) {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .new_agent();
    let mut resp = match method {
        "POST" => agent.post(url).send_empty(),
        _ => agent.get(url).call(),
    }
    .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let body = resp.body_mut().read_to_string().unwrap();
    (resp.status().as_u16(), body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedding_example_sells_and_serves_metrics() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = tokio::spawn(embed_axum::service(listener, async {
        let _ = stopped.await;
    }));

    let answers = tokio::task::spawn_blocking(move || {
        // The service loads its stock before it serves: wait for it.
        let mut status = call("GET", &format!("{base}/api/skus/phone"));
        for _ in 0..100 {
            if status.0 == 200 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            status = call("GET", &format!("{base}/api/skus/phone"));
        }
        let sale = call("POST", &format!("{base}/buy/phone/u1/order-1"));
        let replay = call("POST", &format!("{base}/buy/phone/u1/order-1"));
        let after = call("GET", &format!("{base}/api/skus/phone"));
        let metrics = call("GET", &format!("{base}/api/metrics"));
        (status, sale, replay, after, metrics)
    })
    .await
    .unwrap();
    let (before, sale, replay, after, metrics) = answers;

    assert_eq!(before.0, 200, "{before:?}");
    assert_eq!(sale.0, 200, "{sale:?}");
    let v: serde_json::Value = serde_json::from_str(&sale.1).unwrap();
    assert_eq!(v["outcome"], "applied", "{v}");
    let v: serde_json::Value = serde_json::from_str(&replay.1).unwrap();
    assert_eq!(v["outcome"], "replayed", "a retry sells nothing: {v}");
    let v: serde_json::Value = serde_json::from_str(&after.1).unwrap();
    assert_eq!(v["remaining"], 9, "{v}");

    assert_eq!(metrics.0, 200, "{metrics:?}");
    let sold = metrics
        .1
        .lines()
        .find(|l| l.starts_with("shardstock_deductions_total") && l.contains("applied"))
        .unwrap_or_else(|| panic!("no applied deductions in /api/metrics:\n{}", metrics.1));
    assert!(sold.ends_with(" 1"), "{sold}");

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), service)
        .await
        .expect("the service shut down")
        .unwrap()
        .unwrap();
}
