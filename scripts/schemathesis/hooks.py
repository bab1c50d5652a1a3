"""Schemathesis hooks for shardstock's API (loaded by scripts/schemathesis.sh).

The one rule of the API that OpenAPI cannot state: a request id may come in the body's
`request_id` or in the `Idempotency-Key` header, and when both are sent they must be the same id
(deduct and reservations also need one of them). The document says so in words; a schema-valid
request that breaks the rule gets a 400, which schemathesis would report as valid data rejected.
So, for positive cases only: a header next to a body id takes the body's id (or goes, when the
id is not visible ASCII, which a header cannot carry), and a deduct or
reservation with neither gets a fresh body id. Negative cases are left as generated.

And one bound a pattern cannot state: a user or request id is at most 128 *bytes* of UTF-8
(the pattern counts characters). A positive case's ids, in the body or inside a reservation id
in the path, are cut to 128 bytes at a character boundary.
"""

import itertools

import schemathesis

ROUTES = ("/skus/{sku}/deduct", "/skus/{sku}/reservations", "/skus/{sku}/restock")
NEEDS_ONE = ("/skus/{sku}/deduct", "/skus/{sku}/reservations")
_fresh = itertools.count()


def _positive(case):
    meta = case.meta
    return meta is not None and meta.generation.mode.is_positive


MAX_ID_BYTES = 128


def _cut(text, limit=MAX_ID_BYTES):
    """`text` shortened to at most `limit` bytes of UTF-8, at a character boundary."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[:limit].decode(errors="ignore")


def _cut_escaped(part):
    """A reservation id's user or request id part (`!`, `~`, `%` escaped as !! / !t / !p), cut
    so that it stands for at most 128 bytes, without splitting an escape."""
    out, size, i = [], 0, 0
    while i < len(part):
        unit = part[i : i + 2] if part[i] == "!" else part[i]
        width = 1 if unit.startswith("!") else len(unit.encode())
        if size + width > MAX_ID_BYTES:
            break
        out.append(unit)
        size += width
        i += len(unit)
    return "".join(out)


def _cut_ids(case):
    """Cuts a positive `case`'s ids to their byte bound."""
    if isinstance(case.body, dict):
        for field in ("user", "request_id"):
            if isinstance(case.body.get(field), str):
                case.body[field] = _cut(case.body[field])
    params = case.path_parameters or {}
    rid = params.get("id")
    if isinstance(rid, str) and rid.count("~") == 4:
        head = rid.split("~")
        head[3], head[4] = _cut_escaped(head[3]), _cut_escaped(head[4])
        params["id"] = "~".join(head)
    return case


def _one_id(case):
    """Makes a positive `case` follow the request-id rule."""
    if case.operation.path not in ROUTES or not isinstance(case.body, dict):
        return case
    headers = case.headers or {}
    key = next((k for k in headers if k.lower() == "idempotency-key"), None)
    body_id = case.body.get("request_id")
    if key is not None and body_id is not None:
        if all("!" <= ch <= "~" for ch in body_id):
            headers[key] = body_id
        else:
            # A body id a header cannot carry (not visible ASCII): the body's alone.
            del headers[key]
        case.headers = headers
    elif key is None and body_id is None and case.operation.path in NEEDS_ONE:
        case.body["request_id"] = f"st-{next(_fresh)}"
    return case


@schemathesis.hook
def map_case(context, case):
    return _one_id(_cut_ids(case)) if _positive(case) else case


@schemathesis.hook
def before_add_examples(context, examples):
    """The examples phase's cases (schema examples: positive) skip `map_case`."""
    for case in examples:
        _one_id(_cut_ids(case))
