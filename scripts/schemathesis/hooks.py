"""Schemathesis hooks for shardstock's API (loaded by scripts/schemathesis.sh).

The one rule of the API that OpenAPI cannot state: a request id may come in the body's
`request_id` or in the `Idempotency-Key` header, and when both are sent they must be the same id
(deduct and reservations also need one of them). The document says so in words; a schema-valid
request that breaks the rule gets a 400, which schemathesis would report as valid data rejected.
So, for positive cases only: a header next to a body id takes the body's id, and a deduct or
reservation with neither gets a fresh body id. Negative cases are left as generated.
"""

import itertools

import schemathesis

ROUTES = ("/skus/{sku}/deduct", "/skus/{sku}/reservations", "/skus/{sku}/restock")
NEEDS_ONE = ("/skus/{sku}/deduct", "/skus/{sku}/reservations")
_fresh = itertools.count()


def _positive(case):
    meta = case.meta
    return meta is not None and meta.generation.mode.is_positive


def _one_id(case):
    """Makes a positive `case` follow the request-id rule."""
    if case.operation.path not in ROUTES or not isinstance(case.body, dict):
        return case
    headers = case.headers or {}
    key = next((k for k in headers if k.lower() == "idempotency-key"), None)
    body_id = case.body.get("request_id")
    if key is not None and body_id is not None:
        headers[key] = body_id
        case.headers = headers
    elif key is None and body_id is None and case.operation.path in NEEDS_ONE:
        case.body["request_id"] = f"st-{next(_fresh)}"
    return case


@schemathesis.hook
def map_case(context, case):
    return _one_id(case) if _positive(case) else case


@schemathesis.hook
def before_add_examples(context, examples):
    """The examples phase's cases (schema examples: positive) skip `map_case`."""
    for case in examples:
        _one_id(case)
