//! The OpenAPI 3.1 document of the API, made from the code: the handlers' `#[utoipa::path]`
//! and the body types' schemas (utoipa), completed here with what depends on the server and
//! what every route shares: each operation's error replies (status, the codes it may answer,
//! headers), the bearer tokens the server was given, and the bounds the engine's options set
//! (`qty` up to `max_qty`, `ttl_ms` and `hold_ms` up to the request TTL).
//!
//! `docs/openapi.json` is the document of a server with the default engine options, an admin
//! and a buyer token, and a metrics renderer (`shardstock serve` with both tokens set); the
//! `committed_document_is_the_generated_one` test fails when it differs and says how to
//! regenerate it.

use super::error::{ErrorBody, ErrorCode};
use super::{ApiOptions, routes};
use crate::engine::EngineOptions;
use serde_json::{Map, Value, json};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "shardstock",
        description = "Flash-sale inventory over HTTP: load a SKU, sell it exactly once per \
            (user, request id), reserve, confirm, cancel, hold orders of several SKUs all or \
            nothing, restock, audit. Business outcomes \
            (sold out, insufficient, limit reached, user busy, over limit, replayed, an order \
            refused) are 200 replies with an `outcome`; errors are JSON `{\"error\", \"code\", \"field\"?}` with \
            the status of their `code`. A field sent as `null` is the same as an absent one. \
            A write's request id is the body's `request_id` (an `Idempotency-Key` header is \
            accepted instead, the same id when both are sent). Retry a 503 (it carries \
            `Retry-After`) with the same request id: the request id makes every write \
            exactly-once."
    ),
    paths(
        routes::load,
        routes::status,
        routes::restock,
        routes::audit,
        routes::deduct,
        routes::reserve,
        routes::confirm,
        routes::cancel,
        routes::hold_order,
        routes::order,
        routes::confirm_order,
        routes::cancel_order,
        routes::healthz,
        routes::readyz,
        routes::render_metrics,
        routes::openapi,
    ),
    components(schemas(ErrorBody, ErrorCode)),
    tags(
        (name = "admin", description = "Load, restock, status, audit: `Bearer <admin token>` when the server has one"),
        (name = "buyer", description = "Deduct, reservations, orders, confirm, cancel: `Bearer <buyer token>` when the server has one"),
        (name = "open", description = "Liveness, readiness, metrics and this document: never behind a token"),
    )
)]
struct Doc;

/// Which token an operation needs: its tag.
fn role(op: &Value) -> Option<&'static str> {
    match op["tags"][0].as_str() {
        Some("admin") => Some("admin_token"),
        Some("buyer") => Some("buyer_token"),
        _ => None,
    }
}

/// The codes each operation may answer besides its success, by operation id (the 401 of a
/// route behind a token is added where there is one).
fn errors(operation: &str) -> Vec<ErrorCode> {
    use ErrorCode::*;
    // (its own codes, has a body, calls the engine)
    let (own, body, engine): (&[ErrorCode], bool, bool) = match operation {
        "load" => (&[AlreadyLoaded], true, true),
        "restock" => (&[NotLoaded, RequestIdConflict], true, true),
        "deduct" | "reserve" | "hold_order" => {
            (&[NotLoaded, RequestIdConflict, Config], true, true)
        }
        "status" | "audit" => (&[InvalidInput, NotLoaded], false, true),
        "confirm" | "cancel" => (&[InvalidInput, NotLoaded, UnknownReservation], false, true),
        // An item's request id taken by a sale or reservation of the same user: 409 `kind`.
        "confirm_order" => (
            &[InvalidInput, UnknownOrder, RequestIdConflict],
            false,
            true,
        ),
        "cancel_order" => (&[InvalidInput, RequestIdConflict], false, true),
        "order" => (&[InvalidInput, UnknownOrder], false, true),
        "metrics" => (&[NotFound], false, false),
        _ => (&[], false, false),
    };
    let mut codes = own.to_vec();
    if body {
        codes.extend([InvalidInput, PayloadTooLarge, UnsupportedMediaType]);
    }
    if engine {
        codes.extend([
            NotReady, LeaseLost, Redis, NotDurable, NoReplicas, Timeout, Permission, Protocol,
        ]);
    }
    codes
}

/// The OpenAPI document of the API as a server with these options serves it, as JSON text.
pub(super) fn document(engine: &EngineOptions, options: &ApiOptions) -> String {
    let mut doc = serde_json::to_value(Doc::openapi()).expect("the document is JSON");
    let tokens = [
        ("admin_token", options.admin_token.is_some()),
        ("buyer_token", options.buyer_token.is_some()),
    ];
    // Bounds from the engine's options.
    let max_qty = json!(engine.max_qty);
    let ttl_ms = json!(engine.request_ttl.as_millis() as u64);
    let schemas = &mut doc["components"]["schemas"];
    for name in ["DeductRequest", "ReserveRequest"] {
        set(
            schemas,
            &[name, "properties", "qty", "maximum"],
            max_qty.clone(),
        );
    }
    set(
        schemas,
        &["OrderItemRequest", "properties", "qty", "maximum"],
        max_qty,
    );
    set(
        schemas,
        &["ReserveRequest", "properties", "ttl_ms", "maximum"],
        ttl_ms.clone(),
    );
    set(
        schemas,
        &["OrderRequest", "properties", "hold_ms", "maximum"],
        ttl_ms,
    );
    // Security schemes for the tokens the server has.
    let mut schemes = Map::new();
    for (name, set) in tokens {
        if set {
            let who = name.trim_end_matches("_token");
            schemes.insert(
                name.to_string(),
                json!({
                    "type": "http",
                    "scheme": "bearer",
                    "description": format!("The {who} token (`serve.{name}`): `Authorization: Bearer <token>`"),
                }),
            );
        }
    }
    if !schemes.is_empty() {
        doc["components"]["securitySchemes"] = Value::Object(schemes);
    }
    // Each operation's errors and security.
    let paths = doc["paths"].as_object_mut().expect("paths");
    for item in paths.values_mut() {
        for op in item.as_object_mut().expect("a path item").values_mut() {
            let id = op["operationId"]
                .as_str()
                .expect("an operation id")
                .to_string();
            let mut codes = errors(&id);
            if let Some(token) = role(op)
                && tokens.iter().any(|(n, set)| *n == token && *set)
            {
                op["security"] = json!([{ token: [] }]);
                codes.push(ErrorCode::Unauthorized);
            }
            if id == "metrics" && options.metrics.is_some() {
                codes.retain(|c| *c != ErrorCode::NotFound);
            }
            if id == "metrics" && options.metrics.is_none() {
                op["responses"]
                    .as_object_mut()
                    .expect("responses")
                    .remove("200");
            }
            let responses = op["responses"].as_object_mut().expect("responses");
            for reply in responses.values_mut() {
                if let Some(links) = reply.get_mut("links").and_then(Value::as_object_mut) {
                    links.values_mut().for_each(camel_case_link);
                }
            }
            for (status, reply) in error_replies(&codes) {
                responses.insert(status, reply);
            }
        }
    }
    let mut text = serde_json::to_string_pretty(&doc).expect("the document is JSON");
    text.push('\n');
    text
}

/// One response per status the `codes` have: the error body, its `code` narrowed to them, and
/// the headers that status carries.
fn error_replies(codes: &[ErrorCode]) -> Vec<(String, Value)> {
    let mut statuses: Vec<u16> = codes.iter().map(|c| c.status().as_u16()).collect();
    statuses.sort_unstable();
    statuses.dedup();
    statuses
        .into_iter()
        .map(|status| {
            let mine: Vec<&str> = codes
                .iter()
                .filter(|c| c.status().as_u16() == status)
                .map(|c| c.as_str())
                .collect();
            let mut reply = json!({
                "description": format!("`code`: {}", mine.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ")),
                "content": { "application/json": { "schema": { "allOf": [
                    { "$ref": "#/components/schemas/ErrorBody" },
                    { "type": "object", "properties": { "code": { "enum": mine } } },
                ] } } },
            });
            let header = |description: &str| json!({ "schema": { "type": "string" }, "description": description });
            match status {
                401 => {
                    reply["headers"] = json!({ "WWW-Authenticate": header(
                        "`Bearer`, or `Bearer error=\"invalid_token\"` for a wrong token") });
                }
                503 => {
                    reply["headers"] = json!({ "Retry-After": header(
                        "`1`: retry with the same request id after a second") });
                }
                _ => {}
            }
            (status.to_string(), reply)
        })
        .collect()
}

/// A Link Object's fields as OpenAPI spells them (`operationId`, ...): utoipa 5 writes them in
/// snake case.
fn camel_case_link(link: &mut Value) {
    let Some(link) = link.as_object_mut() else {
        return;
    };
    for (from, to) in [
        ("operation_id", "operationId"),
        ("operation_ref", "operationRef"),
        ("request_body", "requestBody"),
    ] {
        if let Some(v) = link.remove(from) {
            link.insert(to.to_string(), v);
        }
    }
}

/// Sets `value` at `path` below `v`, which must exist but for its last step.
fn set(v: &mut Value, path: &[&str], value: Value) {
    let (last, parents) = path.split_last().expect("a path");
    let mut at = v;
    for step in parents {
        at = at
            .get_mut(*step)
            .unwrap_or_else(|| panic!("no {step:?} in the document (path {path:?})"));
    }
    at[*last] = value;
}

#[cfg(test)]
mod tests {
    use super::super::messages::{
        self, ID_PATTERN, ORDER_PATTERN, ORDER_REQUEST_ID_PATTERN, RESERVATION_PATTERN, SKU_PATTERN,
    };
    use super::*;
    use std::path::Path;

    /// The options `docs/openapi.json` is written for.
    pub(crate) fn committed_options() -> ApiOptions {
        ApiOptions::default()
            .admin_token("admin")
            .buyer_token("buyer")
            .metrics(String::new)
    }

    #[test]
    fn committed_document_is_the_generated_one() {
        let generated = document(&EngineOptions::default(), &committed_options());
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
        if std::env::var_os("SHARDSTOCK_BLESS").is_some() {
            std::fs::write(&path, &generated).unwrap();
            return;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/openapi.json differs from the document the code generates; regenerate it \
             with `SHARDSTOCK_BLESS=1 cargo test --lib http::openapi` and commit it"
        );
    }

    fn doc(engine: &EngineOptions, options: &ApiOptions) -> Value {
        serde_json::from_str(&document(engine, options)).unwrap()
    }

    #[test]
    fn bodies_list_exactly_the_fields_the_handlers_read_and_refuse_others() {
        let d = doc(&EngineOptions::default(), &committed_options());
        for (name, fields) in [
            ("LoadRequest", messages::fields::LOAD),
            ("RestockRequest", messages::fields::RESTOCK),
            ("DeductRequest", messages::fields::DEDUCT),
            ("ReserveRequest", messages::fields::RESERVE),
            ("OrderRequest", messages::fields::ORDER),
            ("OrderItemRequest", messages::fields::ORDER_ITEM),
        ] {
            let s = &d["components"]["schemas"][name];
            let mut props: Vec<&str> = s["properties"]
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            let mut want = fields.to_vec();
            props.sort_unstable();
            want.sort_unstable();
            assert_eq!(props, want, "{name}");
            assert_eq!(s["additionalProperties"], json!(false), "{name}");
        }
    }

    #[test]
    fn bounds_follow_the_engine_and_patterns_are_the_ids() {
        let engine = EngineOptions {
            max_qty: 7,
            request_ttl: std::time::Duration::from_secs(60),
            ..EngineOptions::default()
        };
        let d = doc(&engine, &ApiOptions::default());
        let schemas = &d["components"]["schemas"];
        assert_eq!(schemas["DeductRequest"]["properties"]["qty"]["maximum"], 7);
        assert_eq!(schemas["ReserveRequest"]["properties"]["qty"]["maximum"], 7);
        assert_eq!(
            schemas["ReserveRequest"]["properties"]["ttl_ms"]["maximum"],
            60_000
        );
        assert_eq!(
            schemas["OrderItemRequest"]["properties"]["qty"]["maximum"],
            7
        );
        assert_eq!(
            schemas["OrderRequest"]["properties"]["hold_ms"]["maximum"],
            60_000
        );
        let items = &schemas["OrderRequest"]["properties"]["items"];
        assert_eq!(
            (&items["minItems"], &items["maxItems"]),
            (&json!(1), &json!(crate::cart::MAX_ITEMS))
        );
        assert_eq!(
            schemas["LoadRequest"]["properties"]["stock"]["maximum"],
            crate::ids::MAX_UNITS
        );
        assert_eq!(
            schemas["LoadRequest"]["properties"]["segments"]["maximum"],
            crate::ids::MAX_SEGMENTS
        );
        // Every pattern in the document is one of those the ids are checked against.
        let text = d.to_string();
        let mut rest = text.as_str();
        let mut seen = 0;
        while let Some(at) = rest.find("\"pattern\":\"") {
            rest = &rest[at + 11..];
            let end = rest.find('"').unwrap();
            let p = rest[..end].replace("\\\\", "\\");
            assert!(
                [
                    SKU_PATTERN,
                    ID_PATTERN,
                    RESERVATION_PATTERN,
                    ORDER_REQUEST_ID_PATTERN,
                    ORDER_PATTERN
                ]
                .contains(&p.as_str()),
                "{p}"
            );
            seen += 1;
        }
        assert!(seen >= 10, "{seen} patterns");
    }

    #[test]
    fn tokens_decide_security_and_401s() {
        let open = doc(&EngineOptions::default(), &ApiOptions::default());
        let deduct = &open["paths"]["/skus/{sku}/deduct"]["post"];
        assert!(deduct.get("security").is_none());
        assert!(deduct["responses"].get("401").is_none());
        assert!(open["components"].get("securitySchemes").is_none());
        let closed = doc(&EngineOptions::default(), &committed_options());
        let deduct = &closed["paths"]["/skus/{sku}/deduct"]["post"];
        assert_eq!(deduct["security"], json!([{ "buyer_token": [] }]));
        assert!(deduct["responses"]["401"].is_object());
        let load = &closed["paths"]["/skus/{sku}"]["put"];
        assert_eq!(load["security"], json!([{ "admin_token": [] }]));
        assert!(closed["paths"]["/healthz"]["get"].get("security").is_none());
        let codes = &closed["components"]["schemas"]["ErrorCode"]["enum"];
        let all: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(codes, &json!(all));
        assert_eq!(closed["openapi"], "3.1.0");
        let links =
            &closed["paths"]["/skus/{sku}/reservations"]["post"]["responses"]["201"]["links"];
        assert_eq!(links["confirm"]["operationId"], "confirm");
        assert!(links["confirm"].get("operation_id").is_none());
        let links = &closed["paths"]["/orders"]["post"]["responses"]["200"]["links"];
        for op in ["order", "confirm_order", "cancel_order"] {
            assert_eq!(links[op]["operationId"], op);
            assert_eq!(
                links[op]["parameters"]["order_id"],
                "$response.body#/order_id"
            );
        }
        let order = &closed["paths"]["/orders/{order_id}"]["get"];
        assert_eq!(order["security"], json!([{ "buyer_token": [] }]));
        assert!(
            order["responses"]["404"]
                .to_string()
                .contains("unknown_order")
        );
    }

    /// One carrier of the request id in the document: the body's `request_id`, required where
    /// the server requires an id (deduct, reservations), optional on a restock. The
    /// `Idempotency-Key` header the server also accepts is no parameter: a schema-valid
    /// request with a header of another id would be refused, which a document cannot say.
    #[test]
    fn the_request_id_is_the_bodys_and_required_where_the_server_needs_one() {
        let d = doc(&EngineOptions::default(), &committed_options());
        let schemas = &d["components"]["schemas"];
        for (name, required) in [
            ("DeductRequest", true),
            ("ReserveRequest", true),
            ("OrderRequest", true),
            ("RestockRequest", false),
        ] {
            let listed = schemas[name]["required"]
                .as_array()
                .is_some_and(|r| r.contains(&json!("request_id")));
            assert_eq!(listed, required, "{name}: {}", schemas[name]);
        }
        for (path, item) in d["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let params = op["parameters"].as_array().map(Vec::as_slice);
                assert!(
                    params
                        .unwrap_or_default()
                        .iter()
                        .all(|p| p["in"] != "header"),
                    "{method} {path} declares a header parameter: {op}"
                );
            }
        }
        let deduct = d["paths"]["/skus/{sku}/deduct"]["post"].to_string();
        assert!(
            deduct.contains("Idempotency-Key"),
            "the header is described: {deduct}"
        );
    }
}
