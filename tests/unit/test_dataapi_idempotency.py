"""The Data API's Idempotency-Key on writes (eventing.http.dataapi.idempotency), through the ASGI app
in-process on real SQLite: a retried write gets its first answer again and makes no second mutation (counted
in the bucket's log), another request with the same key is refused, keys are per caller, the retention
window ends a record, and reads ignore the header."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from eventing.http.app import build_app
from eventing.http.auth import ServerConfig
from eventing.http.dataapi.idempotency import IdempotencyRecords
from eventing.storage.bucket import LocalBucket
from eventing.storage.state import as_state

D = "/v1/buckets/shop/scopes/_default/collections/_default/documents"


class Client:
    def __init__(self, app: Any):
        self.app = app

    def __call__(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8096") as client:
                return await client.request(method, path, **kwargs)

        return asyncio.run(call())


def mutations(data_dir: str) -> int:
    with LocalBucket.open(data_dir, "shop") as bucket:
        return bucket.stats()["mutations"]


@pytest.fixture
def api(data_dir):
    LocalBucket.create(data_dir, "shop").close()
    return Client(build_app(ServerConfig(data_dir)))


def test_a_retried_write_gets_its_first_answer_and_makes_no_second_mutation(api, data_dir):
    key = {"Idempotency-Key": "order-17-create"}
    first = api("POST", f"{D}/o17", json={"total": 40}, headers=key)
    assert first.status_code == 200 and "idempotent-replayed" not in first.headers
    again = api(
        "POST", f"{D}/o17", json={"total": 40}, headers=key
    )  # a create of an existing key: 409 if run
    assert again.status_code == 200 and again.headers["etag"] == first.headers["etag"]
    assert again.headers["idempotent-replayed"] == "true"
    assert mutations(data_dir) == 1
    api("POST", f"{D}/counter/increment", json={"initial": 10})
    increments = [
        api("POST", f"{D}/counter/increment", json={"delta": 5}, headers={"Idempotency-Key": "inc-1"})
        for _ in range(3)
    ]
    assert {r.status_code for r in increments} == {200} and {r.json() for r in increments} == {15}
    assert api("GET", f"{D}/counter").json() == 15  # incremented once
    assert mutations(data_dir) == 3
    unkeyed = [
        api("PUT", f"{D}/o18", json={"total": 1}) for _ in range(2)
    ]  # without the header: each applies
    assert [r.status_code for r in unkeyed] == [200, 200] and mutations(data_dir) == 5


def test_the_same_key_with_another_request_is_refused_and_an_error_answer_is_kept_too(api, data_dir):
    key = {"Idempotency-Key": "k-1"}
    assert api("PUT", f"{D}/a", json={"n": 1}, headers=key).status_code == 200
    other = api("PUT", f"{D}/a", json={"n": 2}, headers=key)
    assert other.status_code == 422 and other.json()["code"] == "IdempotencyKeyReused"
    assert "was used for another request" in other.json()["message"]
    assert api("DELETE", f"{D}/a", headers=key).status_code == 422  # another method
    assert api("GET", f"{D}/a").json() == {"n": 1} and mutations(data_dir) == 1
    missing = api("DELETE", f"{D}/nothing", headers={"Idempotency-Key": "k-2"})
    assert missing.status_code == 404
    api("PUT", f"{D}/nothing", json={})
    again = api("DELETE", f"{D}/nothing", headers={"Idempotency-Key": "k-2"})
    assert again.status_code == 404 and again.headers["idempotent-replayed"] == "true"  # the first answer
    bad = api("PUT", f"{D}/b", json={}, headers={"Idempotency-Key": "x" * 300})
    assert bad.status_code == 400 and "Idempotency-Key" in bad.json()["message"]


def test_reads_ignore_the_header_and_records_end_with_the_retention_window(data_dir):
    LocalBucket.create(data_dir, "shop").close()
    api = Client(build_app(ServerConfig(data_dir, idempotency_retention_s=0.5)))
    key = {"Idempotency-Key": "r-1"}
    assert api("PUT", f"{D}/a", json={"n": 1}, headers=key).status_code == 200
    got = api("GET", f"{D}/a", headers=key)
    assert got.status_code == 200 and "idempotent-replayed" not in got.headers
    records = IdempotencyRecords(as_state(data_dir), retention_s=0.5)
    assert len(records.area.list("")) == 1
    time.sleep(0.6)  # the window is the subject here: its end is a time
    assert records.prune() == 1 and records.area.list("") == []
    assert api("PUT", f"{D}/a", json={"n": 1}, headers=key).headers.get("idempotent-replayed") is None
    assert mutations(data_dir) == 2  # past the window the key is new again


def test_keys_are_per_caller(data_dir):
    from eventing.security.users import hash_password

    LocalBucket.create(data_dir, "shop").close()
    store = as_state(data_dir).metadata
    for user in ("ann", "bob"):
        store.put_user(user, hash_password("pw-" + user * 4), ["admin"])
    api = Client(build_app(ServerConfig(data_dir)))
    key = {"Idempotency-Key": "same"}
    ann = api("PUT", f"{D}/x-ann", json={}, headers=key, auth=("ann", "pw-" + "ann" * 4))
    bob = api("PUT", f"{D}/x-bob", json={}, headers=key, auth=("bob", "pw-" + "bob" * 4))
    assert ann.status_code == bob.status_code == 200  # bob's "same" is not ann's
    assert mutations(data_dir) == 2
