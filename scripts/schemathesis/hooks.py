"""Schemathesis hooks for shardstock's API (loaded by run 2 of scripts/schemathesis.sh).

The one bound a pattern cannot state: a user or request id is at most 128 *bytes* of UTF-8
(the pattern counts characters; the descriptions say bytes), an order's request id at most 125
(its items' ids are `<request id>#<n>`). A positive case's ids, in the body or inside a
reservation or order id in the path, are cut to their bound at a character boundary. Negative
cases are left as generated.

The request id itself needs no hook: the document declares one carrier, the body's
`request_id` (required by deduct and reservations), and no `Idempotency-Key` parameter, so a
generated request never carries two ids that could differ.
"""

import schemathesis


def _positive(case):
    meta = case.meta
    return meta is not None and meta.generation.mode.is_positive


MAX_ID_BYTES = 128
MAX_ORDER_REQUEST_ID_BYTES = 125


def _cut(text, limit=MAX_ID_BYTES):
    """`text` shortened to at most `limit` bytes of UTF-8, at a character boundary."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[:limit].decode(errors="ignore")


def _cut_escaped(part, limit=MAX_ID_BYTES):
    """A reservation or order id's user or request id part (`!`, `~`, `%` escaped as !! / !t /
    !p), cut so that it stands for at most `limit` bytes, without splitting an escape."""
    out, size, i = [], 0, 0
    while i < len(part):
        unit = part[i : i + 2] if part[i] == "!" else part[i]
        width = 1 if unit.startswith("!") else len(unit.encode())
        if size + width > limit:
            break
        out.append(unit)
        size += width
        i += len(unit)
    return "".join(out)


def _cut_ids(case):
    """Cuts a positive `case`'s ids to their byte bound."""
    order = getattr(getattr(case, "operation", None), "path", None) == "/orders"
    if isinstance(case.body, dict):
        for field in ("user", "request_id"):
            if isinstance(case.body.get(field), str):
                limit = MAX_ORDER_REQUEST_ID_BYTES if order and field == "request_id" else MAX_ID_BYTES
                case.body[field] = _cut(case.body[field], limit)
    params = case.path_parameters or {}
    rid = params.get("id")
    if isinstance(rid, str) and rid.count("~") == 4:
        head = rid.split("~")
        head[3], head[4] = _cut_escaped(head[3]), _cut_escaped(head[4])
        params["id"] = "~".join(head)
    oid = params.get("order_id")
    if isinstance(oid, str) and oid.count("~") == 1:
        user, request_id = oid.split("~")
        params["order_id"] = "~".join(
            (_cut_escaped(user), _cut_escaped(request_id, MAX_ORDER_REQUEST_ID_BYTES))
        )
    return case


@schemathesis.hook
def map_case(context, case):
    return _cut_ids(case) if _positive(case) else case


@schemathesis.hook
def before_add_examples(context, examples):
    """The examples phase's cases (schema examples: positive) skip `map_case`."""
    for case in examples:
        _cut_ids(case)
