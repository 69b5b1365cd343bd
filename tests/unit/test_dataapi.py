"""The Data API (eventing.http.dataapi) through the ASGI app in-process (httpx's ASGI transport, real
SQLite): every document operation, its headers and conditions, every error in the spec's shape, the
streamed bulk load, and a write through the API handled by a deployed function."""

from __future__ import annotations

import asyncio
import base64
import email.utils
import time
from typing import Any

import httpx
import pytest

from eventing.api import Eventing
from eventing.http.app import build_app
from eventing.http.auth import ServerConfig
from eventing.http.dataapi import FLAGS_BINARY, FLAGS_JSON, FLAGS_STRING, MAX_BODY_BYTES
from eventing.storage.bucket import LocalBucket
from eventing.storage.keyspace import create_collection, open_keyspace

D = "/v1/buckets/shop/scopes/sales/collections/orders/documents"
ADMIN = "admin-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"


class Client:
    """Requests to the app without a server or a socket."""

    def __init__(self, app: Any):
        self.app = app

    def __call__(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8096") as client:
                return await client.request(method, path, **kwargs)

        return asyncio.run(call())


@pytest.fixture
def api(data_dir):
    LocalBucket.create(data_dir, "shop").close()
    create_collection(data_dir, "shop.sales.orders")
    return Client(build_app(ServerConfig(data_dir)))


def error(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["code"] == code and isinstance(body["message"], str)
    return str(body["message"])


def test_create_get_update_delete_with_etags_flags_and_the_stored_document(api, data_dir):
    r = api("POST", f"{D}/o1", json={"n": 1, "items": ["a"]})
    assert r.status_code == 200 and r.content == b""
    first = r.headers["etag"]
    r = api("GET", f"{D}/o1")
    assert r.status_code == 200 and r.json() == {"n": 1, "items": ["a"]}
    assert r.headers["content-type"] == "application/json"
    assert r.headers["etag"] == first and int(r.headers["x-cb-flags"]) == FLAGS_JSON
    assert "expires" not in r.headers
    with open_keyspace(data_dir, "shop.sales.orders") as coll:  # what handlers read: the object itself
        assert coll.get("o1") == {"n": 1, "items": ["a"]}
        assert int(coll.get_meta("o1")["cas"]) == int(first, 16)
    r = api("PUT", f"{D}/o1", json={"n": 2})
    assert r.status_code == 200 and r.headers["etag"] != first
    assert api("GET", f"{D}/o1").json() == {"n": 2}
    r = api("DELETE", f"{D}/o1")
    assert r.status_code == 200
    error(api("GET", f"{D}/o1"), 404, "DocumentNotFound")
    error(api("DELETE", f"{D}/o1"), 404, "DocumentNotFound")


def test_post_of_an_existing_key_is_a_409_and_changes_nothing(api):
    api("POST", f"{D}/o1", json={"v": 1})
    assert "already exists" in error(api("POST", f"{D}/o1", json={"v": 2}), 409, "DocumentExists")
    assert api("GET", f"{D}/o1").json() == {"v": 1}


def test_if_match_replaces_only_the_version_it_names(api):
    etag = api("POST", f"{D}/o1", json={"v": 1}).headers["etag"]
    newer = api("PUT", f"{D}/o1", json={"v": 2}, headers={"If-Match": etag}).headers["etag"]
    assert "did not match" in error(
        api("PUT", f"{D}/o1", json={"v": 3}, headers={"If-Match": etag}), 409, "CasMismatch"
    )
    error(api("DELETE", f"{D}/o1", headers={"If-Match": etag}), 409, "CasMismatch")
    assert api("GET", f"{D}/o1").json() == {"v": 2}
    error(api("PUT", f"{D}/nope", json={"v": 1}, headers={"If-Match": etag}), 404, "DocumentNotFound")
    error(api("PUT", f"{D}/nope", json={"v": 1}, headers={"If-Match": "*"}), 404, "DocumentNotFound")
    assert api("PUT", f"{D}/o1", json={"v": 4}, headers={"If-Match": "*"}).status_code == 200
    newest = api("GET", f"{D}/o1").headers["etag"]
    assert newest != newer
    assert api("DELETE", f"{D}/o1", headers={"If-Match": f'"{newest}"'}).status_code == 200
    for bad in ("xyz", "0", "1" * 17):
        error(api("PUT", f"{D}/o1", json={}, headers={"If-Match": bad}), 400, "InvalidArgument")


def test_text_binary_and_non_object_bodies_round_trip_with_their_content_type(api, data_dir):
    blob = bytes(range(256))
    api("PUT", f"{D}/bin", content=blob, headers={"Content-Type": "application/octet-stream"})
    api("PUT", f"{D}/txt", content="héllo".encode(), headers={"Content-Type": "text/plain"})
    api("PUT", f"{D}/arr", content=b"[1, 2]", headers={"Content-Type": "application/json"})
    api("PUT", f"{D}/raw", content=b"plain words")  # no Content-Type: flags 0, the type guessed on read
    for key, body, ctype, flags in [
        ("bin", blob, "application/octet-stream", FLAGS_BINARY),
        ("txt", "héllo".encode(), "text/plain", FLAGS_STRING),
        ("arr", b"[1, 2]", "application/json", FLAGS_JSON),
        ("raw", b"plain words", "text/plain", 0),
    ]:
        r = api("GET", f"{D}/{key}")
        assert (r.content, r.headers["content-type"], int(r.headers["x-cb-flags"])) == (body, ctype, flags)
    with open_keyspace(data_dir, "shop.sales.orders") as coll:
        assert coll.get("bin") == blob
    r = api("PUT", f"{D}/flagged", json={"a": 1}, headers={"X-CB-Flags": str(FLAGS_BINARY)})
    assert api("GET", f"{D}/flagged").headers["content-type"] == "application/octet-stream"
    assert api("GET", f"{D}/o", params={"project": "a"}).status_code == 404
    api("PUT", f"{D}/deep", json={"a": {"b": 1, "c": 2}, "d": 3})
    assert api("GET", f"{D}/deep", params={"project": "a.b,d"}).json() == {"a": {"b": 1}, "d": 3}
    error(api("GET", f"{D}/bin", params={"project": "a"}), 400, "DocumentNotJson")


def test_expires_header_sets_the_expiry_a_put_without_it_keeps_and_get_reports(api, data_dir):
    r = api("PUT", f"{D}/e1", json={"v": 1}, headers={"Expires": "1h"})
    got = api("GET", f"{D}/e1")
    expires = email.utils.parsedate_to_datetime(got.headers["expires"]).timestamp()
    assert abs(expires - (time.time() + 3600)) < 5
    api("PUT", f"{D}/e1", json={"v": 2})  # no Expires: the expiry stays, as Couchbase's preserve-expiry
    assert api("GET", f"{D}/e1").headers["expires"] == got.headers["expires"]
    date = "Fri, 01 Jan 2100 00:00:00 GMT"
    api("PUT", f"{D}/e2", json={"v": 1}, headers={"Expires": date})
    assert api("GET", f"{D}/e2").headers["expires"] == date
    api("PUT", f"{D}/e2", json={"v": 1}, headers={"Expires": "0"})
    assert "expires" not in api("GET", f"{D}/e2").headers
    api("PUT", f"{D}/gone", json={"v": 1}, headers={"Expires": "Thu, 01 Jan 1998 00:00:00 GMT"})
    error(api("GET", f"{D}/gone"), 404, "DocumentNotFound")  # past its expiry: reads as gone
    for bad in ("tomorrow", "5 minutes", "-3s", "Mon, 99 Foo 2020"):
        assert "time" in error(
            api("PUT", f"{D}/e3", json={}, headers={"Expires": bad}), 400, "InvalidArgument"
        )
    assert r.status_code == 200


def test_append_prepend_keep_flags_and_honour_if_match(api):
    etag = api("PUT", f"{D}/log", content=b"b", headers={"Content-Type": "text/plain"}).headers["etag"]
    assert api("POST", f"{D}/log/append", content=b"c").status_code == 200
    r = api("POST", f"{D}/log/prepend", content=b"a")
    assert r.status_code == 200 and r.headers["etag"]
    got = api("GET", f"{D}/log")
    assert (got.content, got.headers["content-type"], got.headers["etag"]) == (
        b"abc",
        "text/plain",
        r.headers["etag"],
    )
    error(api("POST", f"{D}/log/append", content=b"d", headers={"If-Match": etag}), 409, "CasMismatch")
    error(api("POST", f"{D}/log/append", content=b""), 400, "InvalidArgument")
    error(api("POST", f"{D}/none/append", content=b"x"), 404, "DocumentNotFound")


def test_counters_initialise_increment_decrement_and_refuse_non_numbers(api):
    error(api("POST", f"{D}/c/increment"), 404, "DocumentNotFound")  # no initial: nothing created
    r = api("POST", f"{D}/c/increment", json={"initial": 10})
    assert (r.status_code, r.json()) == (200, 10) and r.headers["etag"]
    assert api("POST", f"{D}/c/increment", json={"delta": 5}).json() == 15
    assert api("POST", f"{D}/c/decrement").json() == 14
    assert api("POST", f"{D}/c/decrement", json={"delta": 100}).json() == 0  # floors at 0
    assert api("POST", f"{D}/max/increment", json={"initial": 2**64 - 1}).json() == 2**64 - 1
    assert api("POST", f"{D}/max/increment").json() == 0  # wraps as a uint64
    got = api("GET", f"{D}/c")
    assert (got.json(), got.headers["content-type"]) == (0, "application/json")
    api("PUT", f"{D}/obj", json={"a": 1})
    error(api("POST", f"{D}/obj/increment"), 400, "DocumentNotNumeric")
    for body in ({"delta": -1}, {"delta": "1"}, {"initial": 2**64}):
        error(api("POST", f"{D}/c/increment", json=body), 400, "InvalidArgument")
    error(
        api("POST", f"{D}/c/increment", content=b"{", headers={"Content-Type": "application/json"}),
        400,
        "InvalidArgument",
    )
    error(
        api("POST", f"{D}/c/increment", content=b"1", headers={"Content-Type": "text/plain"}),
        400,
        "InvalidArgument",
    )
    error(
        api("POST", f"{D}/n/increment", headers={"Expires": "1h"}), 400, "InvalidArgument"
    )  # expiry, no initial


def test_touch_sets_the_expiry_and_returns_the_content_on_request(api):
    api("PUT", f"{D}/t", json={"v": 1})
    r = api("POST", f"{D}/t/touch", json={"expiry": "2099-01-01T00:00:00Z"})
    assert r.status_code == 204 and r.headers["etag"]
    assert api("GET", f"{D}/t").headers["expires"] == "Thu, 01 Jan 2099 00:00:00 GMT"
    r = api("POST", f"{D}/t/touch", json={"expiry": "1h", "returnContent": True})
    assert (r.status_code, r.json(), r.headers["content-type"]) == (200, {"v": 1}, "application/json")
    error(api("POST", f"{D}/t/touch", json={}), 400, "InvalidArgument")
    error(api("POST", f"{D}/t/touch", json={"expiry": "soon"}), 400, "InvalidArgument")
    error(api("POST", f"{D}/none/touch", json={"expiry": "1h"}), 404, "DocumentNotFound")


def test_unknown_bucket_scope_and_collection_are_404s_naming_them(api):
    msg = error(
        api("GET", "/v1/buckets/nope/scopes/sales/collections/orders/documents/k"), 404, "BucketNotFound"
    )
    assert "'nope'" in msg
    msg = error(
        api("PUT", "/v1/buckets/shop/scopes/other/collections/orders/documents/k", json={}),
        404,
        "ScopeNotFound",
    )
    assert "'other'" in msg
    r = api("GET", "/v1/buckets/shop/scopes/sales/collections/lines/documents/k")
    assert "'lines'" in error(r, 404, "CollectionNotFound")
    assert r.json()["resource"] == "/buckets/shop/scopes/sales/collections/lines"
    # the default collection of every bucket is there
    assert (
        api("PUT", "/v1/buckets/shop/scopes/_default/collections/_default/documents/k", json={}).status_code
        == 200
    )


def test_bad_keys_bodies_and_sizes_are_400s_and_413s_never_5xx(api):
    assert "250" in error(api("PUT", f"{D}/{'k' * 251}", json={}), 400, "InvalidArgument")
    assert api("PUT", f"{D}/{'k' * 250}", json={}).status_code == 200
    assert api("PUT", f"{D}/a%2Fb", json={"slash": True}).status_code == 200  # a key holding '/'
    assert api("GET", f"{D}/a%2Fb").json() == {"slash": True}
    error(api("PUT", f"{D}/%01x", json={}), 400, "InvalidArgument")
    error(api("PUT", f"{D}/%FF", json={}), 400, "InvalidArgument")
    assert "not valid JSON" in error(
        api("PUT", f"{D}/j", content=b"{nope", headers={"Content-Type": "application/json"}),
        400,
        "InvalidArgument",
    )
    error(api("PUT", f"{D}/j", content=b"x" * (MAX_BODY_BYTES + 1)), 413, "InvalidArgument")
    error(api("PUT", f"{D}/j", json={}, headers={"X-CB-Flags": "-1"}), 400, "InvalidArgument")
    error(api("PUT", f"{D}/j", json={}, headers={"X-CB-DurabilityLevel": "Always"}), 400, "InvalidArgument")
    error(api("PUT", f"{D}/j", json={}, headers={"Content-Encoding": "snappy"}), 400, "InvalidArgument")
    assert api("PUT", f"{D}/j", json={}, headers={"X-CB-DurabilityLevel": "Majority"}).status_code == 200
    error(api("PATCH", f"{D}/j", json={}), 405, "InvalidArgument")
    error(api("POST", f"{D}/j/lock", json={}), 404, "InvalidArgument")
    error(
        api(
            "POST",
            "/v1.alpha/buckets/shop/scopes/sales/collections/orders/documents/j/lock",
            json={"lockTime": 5},
        ),
        404,
        "InvalidArgument",
    )


def test_tokens_decide_who_reads_and_writes_in_the_spec_s_error_shape(data_dir):
    LocalBucket.create(data_dir, "shop").close()
    api = Client(build_app(ServerConfig(data_dir, admin_token=ADMIN, read_token=READ)))
    path = "/v1/buckets/shop/scopes/_default/collections/_default/documents/k"
    error(api("GET", path), 401, "Unauthorized")
    error(api("GET", path, headers={"Authorization": "Bearer wrong-token-0123456789"}), 403, "InvalidAuth")
    basic = "Basic " + base64.b64encode(f"reporter:{READ}".encode()).decode()
    error(api("PUT", path, json={}, headers={"Authorization": basic}), 403, "NoWriteAccess")
    assert api("PUT", path, json={}, headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
    assert api("GET", path, headers={"Authorization": basic}).status_code == 200
    assert api("GET", "/v1/callerIdentity", headers={"Authorization": basic}).json() == {
        "user": "@read-token"
    }
    r = api(
        "POST",
        "/api/v1/keyspaces/shop/load",
        content=b'{"key":"a","doc":{}}\n',
        headers={"Authorization": basic},
    )
    assert r.status_code == 403  # the bulk load is an admin request like every other POST under /api/


def test_bulk_load_streams_lines_into_a_collection_and_stops_at_a_bad_line(api, data_dir):
    lines = b"".join(b'{"key":"k%05d","doc":{"i":%d}}\n' % (i, i) for i in range(45_000))

    async def chunks():  # a streamed body, cut mid-line
        for start in range(0, len(lines), 65_537):
            yield lines[start : start + 65_537]

    r = api("POST", "/api/v1/keyspaces/shop.sales.orders/load", content=chunks())
    assert r.status_code == 200, r.text
    assert r.json() == {"keyspace": "shop.sales.orders", "committed": 45_000, "written": 45_000, "skipped": 0}
    with open_keyspace(data_dir, "shop.sales.orders") as coll:
        assert coll.count() == 45_000 and coll.get("k44999") == {"i": 44999}
    body = (
        b'{"key":"x1","doc":{}}\n{"key":"x2","op":"delete"}\n{"key":"x3","op":"drop"}\n'
        b'{"key":"x4","doc":{}}\n'
    )
    r = api("POST", "/api/v1/keyspaces/shop.sales.orders/load", content=body)
    assert r.status_code == 400
    answer = r.json()
    assert answer["error"].startswith("line 3: ") and answer["committed"] == 2 and answer["written"] == 1
    with open_keyspace(data_dir, "shop.sales.orders") as coll:
        assert coll.get("x1") == {} and coll.get("x4") is None
    assert api("POST", "/api/v1/keyspaces/shop.nope.orders/load", content=body).status_code == 404
    assert api("POST", "/api/v1/keyspaces/nope/load", content=body).status_code == 404
    assert api("GET", "/api/v1/keyspaces/shop/load").status_code == 405


def test_a_write_through_the_api_is_a_mutation_a_deployed_function_handles(data_dir):
    ev = Eventing(data_dir, executor="in-process")
    ev.create_bucket("src")
    ev.create_bucket("out")
    ev.deploy(
        {
            "name": "fn_copy",
            "source_bucket": "src",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
        },
        "def on_update(doc, meta):\n    out[meta.id] = {'seen': doc}\n",
    )
    api = Client(build_app(ServerConfig(data_dir)))
    path = "/v1/buckets/src/scopes/_default/collections/_default/documents"
    assert api("PUT", f"{path}/a", json={"n": 1}).status_code == 200
    assert api("POST", f"{path}/b", json={"n": 2}).status_code == 200
    ev.run(until_caught_up=True)
    with open_keyspace(data_dir, "out") as out:
        assert out.get("a") == {"seen": {"n": 1}} and out.get("b") == {"seen": {"n": 2}}


def test_concurrent_writes_share_a_commit_and_each_condition_sees_the_writes_before_it(api):
    async def race() -> tuple[list[httpx.Response], list[httpx.Response], list[httpx.Response]]:
        transport = httpx.ASGITransport(app=api.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8096") as c:
            created = await asyncio.gather(*(c.post(f"{D}/race", json={"n": i}) for i in range(12)))
            tag = next(r.headers["etag"] for r in created if r.status_code == 200)
            replaced = await asyncio.gather(
                *(c.put(f"{D}/race", json={"r": i}, headers={"If-Match": tag}) for i in range(12))
            )
            many = await asyncio.gather(*(c.put(f"{D}/m{i}", json={"m": i}) for i in range(30)))
            return created, replaced, many

    created, replaced, many = asyncio.run(race())
    assert sorted(r.status_code for r in created) == [200] + [409] * 11  # one create wins, the others see it
    assert all(r.json()["code"] == "DocumentExists" for r in created if r.status_code == 409)
    assert sorted(r.status_code for r in replaced) == [200] + [409] * 11  # one replace under that cas
    assert all(r.json()["code"] == "CasMismatch" for r in replaced if r.status_code == 409)
    winner = next(r for r in replaced if r.status_code == 200)
    got = api("GET", f"{D}/race")
    assert got.headers["etag"] == winner.headers["etag"] and "r" in got.json()
    assert all(r.status_code == 200 for r in many) and len({r.headers["etag"] for r in many}) == 30
    for i in (0, 29):
        assert api("GET", f"{D}/m{i}").json() == {"m": i}


def test_writes_answer_etag_and_mutation_token_and_a_delete_its_own_cas(api):
    put = api("PUT", f"{D}/tok", json={"a": 1})
    bucket, vb, vbuuid, seqno = put.headers["x-cb-mutationtoken"].split(":")
    assert bucket == "shop" and vb.isdigit() and len(vbuuid) == 8 and int(vbuuid, 16) >= 0 and seqno.isdigit()
    gone = api("DELETE", f"{D}/tok", headers={"If-Match": put.headers["etag"]})
    assert gone.status_code == 200 and gone.content == b""
    assert int(gone.headers["etag"], 16) > int(put.headers["etag"], 16)  # the delete's cas, not the old one
    _, dvb, dvbuuid, dseqno = gone.headers["x-cb-mutationtoken"].split(":")
    assert (dvb, dvbuuid) == (vb, vbuuid) and int(dseqno) == int(seqno) + 1
    counted = api("POST", f"{D}/counter/increment", json={"initial": 5})
    assert (
        counted.status_code == 200
        and counted.json() == 5
        and counted.headers["x-cb-mutationtoken"].startswith("shop:")
    )


def test_users_read_and_write_only_the_keyspaces_their_roles_name(data_dir):
    from eventing.security.users import hash_password
    from metadata.factory import open_store

    LocalBucket.create(data_dir, "shop").close()
    create_collection(data_dir, "shop.sales.orders")
    create_collection(data_dir, "shop.hr.staff")
    users = {
        "clerk": ["data_writer[shop.sales.orders]"],
        "auditor": ["data_reader[shop.*.*]"],
        "boss": ["admin"],
        "viewer": ["ro_admin"],
    }
    with open_store(data_dir) as store:
        for name, roles in users.items():
            store.put_user(name, hash_password(f"{name}-password"), roles)
    api = Client(build_app(ServerConfig(data_dir)))

    def as_user(name: str, password: str | None = None) -> dict[str, str]:
        secret = password or f"{name}-password"
        return {"Authorization": "Basic " + base64.b64encode(f"{name}:{secret}".encode()).decode()}

    staff = "/v1/buckets/shop/scopes/hr/collections/staff/documents"
    assert api("PUT", f"{D}/o1", json={"n": 1}, headers=as_user("clerk")).status_code == 200
    message = error(api("PUT", f"{staff}/s1", json={}, headers=as_user("clerk")), 403, "NoWriteAccess")
    assert "clerk" in message and "data_writer[shop.sales.orders]" in message
    assert api("PUT", f"{D}/o1", json={}, headers=as_user("clerk")).status_code == 200  # a writer may write
    error(api("GET", f"{D}/o1", headers=as_user("clerk")), 403, "NoReadAccess")  # but not read
    touch = {"expiry": "0", "returnContent": True}  # nor read through a touch that returns the document
    error(api("POST", f"{D}/o1/touch", json=touch, headers=as_user("clerk")), 403, "NoReadAccess")
    assert api("POST", f"{D}/o1/touch", json={"expiry": "0"}, headers=as_user("clerk")).status_code == 204
    assert (
        api("GET", f"{D}/o1", headers=as_user("clerk")).json()["resource"]
        == "/buckets/shop/scopes/sales/collections/orders"
    )
    assert api("GET", f"{D}/o1", headers=as_user("auditor")).status_code == 200
    assert api("GET", f"{staff}/none", headers=as_user("auditor")).status_code == 404  # may read: not there
    error(api("DELETE", f"{D}/o1", headers=as_user("auditor")), 403, "NoWriteAccess")
    error(api("POST", f"{D}/c/increment", headers=as_user("viewer")), 403, "NoWriteAccess")
    assert api("GET", f"{D}/o1", headers=as_user("viewer")).status_code == 200  # ro_admin reads everything
    assert api("PUT", f"{staff}/s1", json={}, headers=as_user("boss")).status_code == 200
    error(api("GET", f"{D}/o1", headers=as_user("auditor", "wrong-password")), 403, "InvalidAuth")
    error(api("GET", f"{D}/o1"), 401, "Unauthorized")  # users exist: no more trusted local callers
    for name in users:
        assert api("GET", "/v1/callerIdentity", headers=as_user(name)).json() == {"user": name}
