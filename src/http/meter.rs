//! Request metrics of the mounted router: every answered request counted by route, method and
//! status (`shardstock_http_requests_total`), its latency by route
//! (`shardstock_http_request_duration_seconds`). The route is the matched path template
//! (`/skus/{sku}/deduct`, with the prefix a service nested the router under), never the path
//! itself, so the label set stays bounded whatever the SKUs and ids; a request no route
//! matched is counted under `unmatched`.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use std::time::Instant;

/// The middleware (`axum::middleware::from_fn`).
pub(super) async fn meter(req: Request, next: Next) -> Response {
    let start = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let method = req.method().clone();
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    crate::metrics::http_request(route, method.as_str(), status, Some(start.elapsed()));
    resp
}

/// A request no route matched (the fallback's 404): counted, not timed.
pub(super) fn unmatched(method: &axum::http::Method) {
    crate::metrics::http_request("unmatched".to_string(), method.as_str(), 404, None);
}
