"""A flash sale over HTTP against `shardstock serve`, for Locust (run by `scripts/bench.sh locust`).

Every task is one new buyer: a user id no one else uses, one request id of its own, one
`POST /skus/{sku}/deduct` of one unit. A 503 (Redis failing, the request timeout, a SKU mid
reload), a timeout or a broken connection leaves the outcome unknown, so the buyer sends the
same request again, same user and same request id, until an answer comes: `applied` (sold now),
`replayed` (an earlier send of this request sold it), or a refusal (`sold_out`, ...). A buyer
who never gets an answer within RETRIES sends is counted `unknown`.

Each Locust process writes what its buyers were told to $SHARDSTOCK_LOCUST_OUT/acks-<pid>.json
when the run stops: units acknowledged (applied + replayed), outcomes, retries, unknowns.
scripts/bench/locust.sh adds them up and compares them with the SKU's audit.

Env: SHARDSTOCK_SKU (flash), SHARDSTOCK_TOKEN (the buyer token, if the server has one),
SHARDSTOCK_LOCUST_OUT (where to write the tallies), SHARDSTOCK_RETRIES (20).
"""

import collections
import json
import os
import random
import time
import uuid

from locust import FastHttpUser, constant, events, task

SKU = os.environ.get("SHARDSTOCK_SKU", "flash")
TOKEN = os.environ.get("SHARDSTOCK_TOKEN", "")
OUT = os.environ.get("SHARDSTOCK_LOCUST_OUT", "")
RETRIES = int(os.environ.get("SHARDSTOCK_RETRIES", "20"))
# A prefix per run and process (`--processes` forks after this module is imported: the pid
# tells the processes apart), a counter per buyer: user and request ids no one else uses.
PREFIX = uuid.uuid4().hex[:8]
SOLD = ("applied", "replayed")

tally = collections.Counter()
_buyers = iter(range(1 << 62))


class Buyer(FastHttpUser):
    wait_time = constant(0)
    # Above serve's request timeout (10 s): the server answers 503 before the client gives up.
    network_timeout = 15.0
    connection_timeout = 5.0

    @task
    def buy(self):
        n = next(_buyers)
        user = f"{PREFIX}-{os.getpid()}-u{n}"
        request_id = f"{PREFIX}-{os.getpid()}-r{n}"
        headers = {"Content-Type": "application/json"}
        if TOKEN:
            headers["Authorization"] = f"Bearer {TOKEN}"
        body = json.dumps({"user": user, "qty": 1, "request_id": request_id})
        tally["buyers"] += 1
        for attempt in range(RETRIES):
            if attempt:
                tally["retries"] += 1
                time.sleep(min(0.05 * 2**attempt, 1.0) * random.random())
            with self.client.post(
                f"/skus/{SKU}/deduct",
                data=body,
                headers=headers,
                name="/skus/[sku]/deduct",
                catch_response=True,
            ) as r:
                if r.status_code == 200:
                    outcome = r.json().get("outcome", "?")
                    tally[f"outcome:{outcome}"] += 1
                    if outcome in SOLD:
                        tally["acknowledged"] += 1
                    r.success()
                    return
                if r.status_code == 503 or r.status_code == 0:
                    # Unknown outcome: the same request again.
                    tally[f"status:{r.status_code}"] += 1
                    r.failure(f"{r.status_code}: retried with the same request id")
                    continue
                tally[f"status:{r.status_code}"] += 1
                r.failure(f"{r.status_code}: {r.text[:200]}")
                return
        tally["unknown"] += 1


@events.quitting.add_listener
def write_tally(environment, **_kwargs):
    if OUT:
        with open(os.path.join(OUT, f"acks-{os.getpid()}.json"), "w") as f:
            json.dump(dict(tally), f)
