//! Orders (carts) over HTTP against a real `shardstock serve` process over a real
//! redis-server: `POST /orders` held, replayed, refused (naming the item, holding nothing
//! anywhere), ended; confirm, cancel and `GET /orders/{order_id}` with percent-encoded ids;
//! 400s naming the field (items as `items[<index>].<field>`) that write nothing, the 409 of a
//! request id reused with other items, the 404s of unknown orders and SKUs, a confirm after the
//! deadline answered `expired`; the orders metric by event.

use crate::common;

use common::RedisServer;
use common::http_client;
use common::serve_process::ServeProcess as Serve;
use serde_json::{Value, json};
use std::time::Duration;

/// A reply: status and JSON body (Null when not JSON).
#[derive(Debug)]
struct Reply {
    status: u16,
    body: Value,
}

fn call(a: &ureq::Agent, method: &str, url: &str, body: Option<&Value>) -> Reply {
    let mut r = match method {
        "GET" => a.get(url).call(),
        _ => {
            let req = match method {
                "PUT" => a.put(url),
                _ => a.post(url),
            };
            req.header("content-type", "application/json")
                .send(body.map(Value::to_string).unwrap_or_default())
        }
    }
    .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let text = r.body_mut().read_to_string().unwrap();
    Reply {
        status: r.status().as_u16(),
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
    }
}

/// The server, an agent, and the calls of these tests.
struct Api {
    serve: Serve,
    agent: ureq::Agent,
}

impl Api {
    fn start(redis: &RedisServer) -> Self {
        Self {
            serve: Serve::start(&redis.url(), &["--audit-every-ms", "0"], &[]),
            agent: http_client::agent_with_timeout(Duration::from_secs(20)),
        }
    }

    fn get(&self, path: &str) -> Reply {
        call(&self.agent, "GET", &self.serve.url(path), None)
    }

    fn post(&self, path: &str, body: Value) -> Reply {
        call(&self.agent, "POST", &self.serve.url(path), Some(&body))
    }

    fn load(&self, sku: &str, stock: u64, segments: u32, limit: u64) {
        let body = json!({"stock": stock, "segments": segments, "per_user_limit": limit});
        let r = call(
            &self.agent,
            "PUT",
            &self.serve.url(&format!("/skus/{sku}")),
            Some(&body),
        );
        assert_eq!(r.status, 201, "{r:?}");
    }

    fn order(&self, user: &str, rid: &str, items: &[(&str, u64)], hold_ms: u64) -> Reply {
        let items: Vec<Value> = items
            .iter()
            .map(|(s, q)| json!({"sku": s, "qty": q}))
            .collect();
        self.post(
            "/orders",
            json!({"user": user, "request_id": rid, "items": items, "hold_ms": hold_ms}),
        )
    }

    /// `POST /orders/{id}/<what>` (`what` empty: `GET /orders/{id}`), the id percent-encoded.
    fn on(&self, id: &str, what: &str) -> Reply {
        let path = format!("/orders/{}", encode(id));
        if what.is_empty() {
            self.get(&path)
        } else {
            self.post(&format!("{path}/{what}"), json!({}))
        }
    }

    /// `reserved` of the SKU's status, after checking its audit balances.
    fn reserved(&self, sku: &str) -> u64 {
        let a = self.get(&format!("/skus/{sku}/audit"));
        assert_eq!((a.status, &a.body["ok"]), (200, &json!(true)), "{a:?}");
        let s = self.get(&format!("/skus/{sku}"));
        assert_eq!(s.status, 200, "{s:?}");
        assert_eq!(s.body["reserved"], a.body["reserved"], "{s:?} {a:?}");
        s.body["reserved"].as_u64().unwrap()
    }

    fn sold(&self, sku: &str) -> u64 {
        self.get(&format!("/skus/{sku}/audit")).body["sold"]
            .as_u64()
            .unwrap()
    }
}

/// A path segment percent-encoded: everything but unreserved characters (and `!`).
fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~!".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Asserts an error reply with `status`, `code` and `field`.
fn expect_error(r: &Reply, status: u16, code: &str, field: &str) {
    assert_eq!(
        (r.status, r.body["code"].as_str(), r.body["field"].as_str()),
        (status, Some(code), Some(field)),
        "{r:?}"
    );
    assert!(
        r.body["error"].as_str().is_some_and(|s| !s.is_empty()),
        "{r:?}"
    );
}

/// The order state reply: (status, state, done).
fn state(r: &Reply) -> (u16, &str, bool) {
    (
        r.status,
        r.body["state"].as_str().unwrap_or("?"),
        r.body["done"].as_bool().unwrap_or(false),
    )
}

#[test]
fn held_orders_are_confirmed_or_cancelled_as_one() {
    let redis = RedisServer::start();
    let api = Api::start(&redis);
    api.load("phone", 10, 2, 0);
    api.load("case", 10, 1, 0);

    // Held: every item at its home, then a replay answers the same order.
    let r = api.order("u1", "o1", &[("phone", 2), ("case", 1)], 60_000);
    assert_eq!(
        (r.status, &r.body["outcome"]),
        (200, &json!("held")),
        "{r:?}"
    );
    assert_eq!(r.body["order_id"], "u1~o1", "{r:?}");
    let items = r.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{r:?}");
    assert_eq!(
        (
            &items[0]["sku"],
            &items[0]["qty"],
            &items[1]["sku"],
            &items[1]["qty"]
        ),
        (&json!("phone"), &json!(2), &json!("case"), &json!(1)),
        "{r:?}"
    );
    assert!(items[0]["segment"].as_u64().unwrap() < 2, "{r:?}");
    let left = r.body["left_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 60_000, "{r:?}");
    let again = api.order("u1", "o1", &[("phone", 2), ("case", 1)], 60_000);
    assert_eq!(
        (again.status, &again.body["outcome"], &again.body["items"]),
        (200, &json!("held"), &r.body["items"]),
        "{again:?}"
    );
    assert_eq!((api.reserved("phone"), api.reserved("case")), (2, 1));
    let g = api.on("u1~o1", "");
    assert_eq!(state(&g), (200, "held", false), "{g:?}");
    assert!(g.body["left_ms"].as_u64().unwrap() > 0, "{g:?}");

    // Confirm: every item sold; idempotent; a replay of the hold answers `ended`.
    let c = api.on("u1~o1", "confirm");
    assert_eq!(state(&c), (200, "confirmed", true), "{c:?}");
    assert_eq!(
        (&c.body["order_id"], &c.body["left_ms"], &c.body["reloaded"]),
        (&json!("u1~o1"), &json!(0), &json!([])),
        "{c:?}"
    );
    assert_eq!(state(&api.on("u1~o1", "confirm")), (200, "confirmed", true));
    assert_eq!(state(&api.on("u1~o1", "cancel")), (200, "confirmed", false));
    assert_eq!(state(&api.on("u1~o1", "")), (200, "confirmed", false));
    let e = api.order("u1", "o1", &[("phone", 2), ("case", 1)], 60_000);
    assert_eq!(
        (e.status, &e.body["outcome"], &e.body["state"]),
        (200, &json!("ended"), &json!("confirmed")),
        "{e:?}"
    );
    assert_eq!((api.reserved("phone"), api.sold("phone")), (0, 2));
    assert_eq!((api.reserved("case"), api.sold("case")), (0, 1));

    // Cancel: every item back. Ids with `~`, `!`, `%` and `/` travel escaped and
    // percent-encoded; a SKU may appear twice.
    let r = api.order("a~b/c", "r%1!", &[("phone", 1), ("phone", 3)], 60_000);
    assert_eq!(
        (r.status, &r.body["outcome"]),
        (200, &json!("held")),
        "{r:?}"
    );
    let id = r.body["order_id"].as_str().unwrap().to_string();
    assert_eq!(id, "a!tb/c~r!p1!!");
    assert_eq!(api.reserved("phone"), 4);
    assert_eq!(state(&api.on(&id, "")), (200, "held", false));
    let k = api.on(&id, "cancel");
    assert_eq!(state(&k), (200, "cancelled", true), "{k:?}");
    assert_eq!(k.body["order_id"], json!(id), "{k:?}");
    assert_eq!(state(&api.on(&id, "cancel")), (200, "cancelled", true));
    assert_eq!(state(&api.on(&id, "confirm")), (200, "cancelled", false));
    assert_eq!(state(&api.on(&id, "")), (200, "cancelled", false));
    assert_eq!((api.reserved("phone"), api.sold("phone")), (0, 2));
    let s = api.get("/skus/phone");
    assert_eq!(s.body["remaining"], 8, "{s:?}");

    // The orders metric, by event.
    let (status, text) = http_client::get(&api.agent, &api.serve.url("/metrics"), &[]).unwrap();
    assert_eq!(status, 200);
    for event in ["held", "confirmed", "cancelled"] {
        let series = format!("shardstock_orders_total{{event=\"{event}\"}}");
        assert!(
            text.lines().any(|l| l.starts_with(&series)),
            "no {series}:\n{text}"
        );
    }
}

#[test]
fn a_refused_order_names_its_item_and_holds_nothing() {
    let redis = RedisServer::start();
    let api = Api::start(&redis);
    api.load("phone", 10, 2, 0);
    api.load("case", 10, 1, 0);
    api.load("scarce", 2, 1, 0);
    api.load("gone", 0, 1, 0);
    api.load("limited", 10, 2, 1);

    // Item 3 is short: items 1 and 2 were held, then given back before the answer.
    let items = [("phone", 1), ("case", 2), ("scarce", 5)];
    let r = api.order("u1", "o1", &items, 60_000);
    assert_eq!(
        (
            r.status,
            &r.body["outcome"],
            &r.body["item"],
            &r.body["sku"]
        ),
        (200, &json!("refused"), &json!(3), &json!("scarce")),
        "{r:?}"
    );
    assert_eq!(r.body["order_id"], "u1~o1", "{r:?}");
    assert_eq!(
        r.body["reason"],
        json!({"outcome": "insufficient", "available": 2}),
        "{r:?}"
    );
    for sku in ["phone", "case", "scarce"] {
        assert_eq!(api.reserved(sku), 0, "{sku}");
        assert_eq!(api.sold(sku), 0, "{sku}");
    }
    assert_eq!(api.get("/skus/phone").body["remaining"], 10);
    assert_eq!(state(&api.on("u1~o1", "")), (200, "refused", false));
    // A retry answers the same refusal; a confirm cannot revive it.
    let again = api.order("u1", "o1", &items, 60_000);
    assert_eq!(
        (
            &again.body["outcome"],
            &again.body["item"],
            &again.body["reason"]
        ),
        (&r.body["outcome"], &r.body["item"], &r.body["reason"]),
        "{again:?}"
    );
    assert_eq!(state(&api.on("u1~o1", "confirm")), (200, "refused", false));
    assert_eq!(api.reserved("phone"), 0);

    // Sold out, and over the per-user limit (final), as a deduction answers them.
    let r = api.order("u2", "o2", &[("phone", 1), ("gone", 1)], 60_000);
    assert_eq!(
        (&r.body["outcome"], &r.body["item"], &r.body["reason"]),
        (
            &json!("refused"),
            &json!(2),
            &json!({"outcome": "sold_out"})
        ),
        "{r:?}"
    );
    let r = api.order("u3", "o3", &[("limited", 2)], 60_000);
    assert_eq!(
        (&r.body["outcome"], &r.body["item"], &r.body["reason"]),
        (
            &json!("refused"),
            &json!(1),
            &json!({"outcome": "over_limit", "limit": 1})
        ),
        "{r:?}"
    );
    for sku in ["phone", "gone", "limited"] {
        assert_eq!(api.reserved(sku), 0, "{sku}");
    }
}

#[test]
fn bad_orders_are_400s_that_write_nothing_and_reused_ids_409() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let api = Api::start(&redis);
    api.load("phone", 10, 2, 0);
    let snapshot = || (redis.dbsize(), redis.cli(&["DEBUG", "DIGEST"]));
    let before = snapshot();

    let item = json!({"sku": "phone", "qty": 1});
    let base = json!({"user": "u1", "request_id": "o1", "items": [item], "hold_ms": 60000});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let without = |k: &str| {
        let mut b = base.clone();
        b.as_object_mut().unwrap().remove(k);
        b
    };
    let many: Vec<Value> = (0..33).map(|_| item.clone()).collect();
    let cases: Vec<(&str, Value, &str)> = vec![
        ("no items", without("items"), "items"),
        ("items null", with("items", Value::Null), "items"),
        ("no item", with("items", json!([])), "items"),
        ("33 items", with("items", json!(many)), "items"),
        (
            "items not an array",
            with("items", json!({"sku": "phone"})),
            "items",
        ),
        (
            "an item not an object",
            with("items", json!([item, 7])),
            "items[1]",
        ),
        (
            "qty 0",
            with("items", json!([item, {"sku": "phone", "qty": 0}])),
            "items[1].qty",
        ),
        (
            "qty above max_qty",
            with("items", json!([{"sku": "phone", "qty": 10001}])),
            "items[0].qty",
        ),
        (
            "qty 2.5",
            with("items", json!([{"sku": "phone", "qty": 2.5}])),
            "items[0].qty",
        ),
        (
            "no qty",
            with("items", json!([{"sku": "phone"}])),
            "items[0].qty",
        ),
        (
            "a bad sku",
            with("items", json!([{"sku": "a b", "qty": 1}])),
            "items[0].sku",
        ),
        ("no sku", with("items", json!([{"qty": 1}])), "items[0].sku"),
        (
            "an unknown item field",
            with(
                "items",
                json!([{"sku": "phone", "qty": 1, "colour": "red"}]),
            ),
            "items[0].colour",
        ),
        ("hold_ms 0", with("hold_ms", json!(0)), "hold_ms"),
        (
            "hold_ms above the request TTL",
            with("hold_ms", json!(86_400_001u64)),
            "hold_ms",
        ),
        ("no hold_ms", without("hold_ms"), "hold_ms"),
        (
            "a request id of 126 bytes",
            with("request_id", json!("r".repeat(126))),
            "request_id",
        ),
        ("no request id", without("request_id"), "request_id"),
        ("a bad user", with("user", json!("a{b")), "user"),
        ("an unknown field", with("ttl_ms", json!(1000)), "ttl_ms"),
    ];
    for (what, body, field) in cases {
        let r = api.post("/orders", body);
        assert_eq!(r.status, 400, "{what}: {r:?}");
        expect_error(&r, 400, "invalid_input", field);
    }
    // A malformed order id in the path.
    expect_error(&api.on("garbage", ""), 400, "invalid_input", "order");
    expect_error(&api.on("u1~a!x", "confirm"), 400, "invalid_input", "order");
    expect_error(
        &api.on("u1~a b", "cancel"),
        400,
        "invalid_input",
        "request_id",
    );
    // Unknown orders: no record read or confirmed (a cancel is remembered: below).
    expect_error(&api.on("u1~nothing", ""), 404, "unknown_order", "order");
    expect_error(
        &api.on("u1~nothing", "confirm"),
        404,
        "unknown_order",
        "order",
    );
    assert_eq!(snapshot(), before, "a refused request wrote to Redis");

    // The same request id with other items: 409 naming `items`, the order untouched.
    let r = api.order("u1", "o1", &[("phone", 1)], 60_000);
    assert_eq!(r.body["outcome"], "held", "{r:?}");
    expect_error(
        &api.order("u1", "o1", &[("phone", 2)], 60_000),
        409,
        "request_id_conflict",
        "items",
    );
    // The same id under another user is another order.
    let r = api.order("u2", "o1", &[("phone", 2)], 60_000);
    assert_eq!(r.body["outcome"], "held", "{r:?}");
    assert_eq!(state(&api.on("u1~o1", "")), (200, "held", false));
    assert_eq!(api.reserved("phone"), 3);
}

#[test]
fn unknown_skus_cancels_before_holds_and_the_deadline() {
    let redis = RedisServer::start();
    let api = Api::start(&redis);
    api.load("phone", 10, 2, 0);

    // An unknown SKU: 404 naming the item, before anything is written (no order, nothing
    // held).
    let r = api.order("u1", "o1", &[("phone", 1), ("nosuch", 1)], 60_000);
    expect_error(&r, 404, "not_loaded", "items[1].sku");
    let g = api.on("u1~o1", "");
    assert_eq!(g.status, 404, "{g:?}");
    assert_eq!(api.reserved("phone"), 0);

    // A cancel that comes before its hold (or of an order never held) is remembered: the
    // hold, when it comes, holds nothing.
    assert_eq!(state(&api.on("u1~o2", "cancel")), (200, "cancelled", true));
    let r = api.order("u1", "o2", &[("phone", 1)], 60_000);
    assert_eq!(
        (r.status, &r.body["outcome"], &r.body["state"]),
        (200, &json!("ended"), &json!("cancelled")),
        "{r:?}"
    );
    assert_eq!(api.reserved("phone"), 0);

    // The deadline, on the record's clock: read as expired, and a confirm after it answers
    // expired (nothing sold, every item given back).
    let r = api.order("u1", "o3", &[("phone", 2)], 300);
    assert_eq!(r.body["outcome"], "held", "{r:?}");
    assert!(r.body["left_ms"].as_u64().unwrap() <= 300, "{r:?}");
    std::thread::sleep(Duration::from_millis(500));
    let g = api.on("u1~o3", "");
    assert_eq!(state(&g), (200, "expired", false), "{g:?}");
    assert_eq!(g.body["left_ms"], 0, "{g:?}");
    let c = api.on("u1~o3", "confirm");
    assert_eq!(state(&c), (200, "expired", false), "{c:?}");
    assert_eq!((api.reserved("phone"), api.sold("phone")), (0, 0));
    let e = api.order("u1", "o3", &[("phone", 2)], 300);
    assert_eq!(
        (&e.body["outcome"], &e.body["state"]),
        (&json!("ended"), &json!("expired")),
        "{e:?}"
    );
    assert_eq!(api.get("/skus/phone").body["remaining"], 10);
}
