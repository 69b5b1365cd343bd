"""Couchbase's Python SDK (4.x, the real `couchbase` package) against the KV port (eventing.kv): connecting
with a user's name and password over SCRAM, bucket, scope and collection, the document operations and the
exceptions the SDK raises for each refusal, sub-document lookups and mutations, and SDK writes reaching a
deployed function exactly once, in order (counted with the ledger)."""

from __future__ import annotations

import json
import socket
from datetime import timedelta

import pytest

pytest.importorskip("couchbase")  # a test dependency: CI always has it

import couchbase.subdocument as SD  # noqa: E402
from couchbase.auth import PasswordAuthenticator  # noqa: E402
from couchbase.cluster import Cluster  # noqa: E402
from couchbase.exceptions import (  # noqa: E402
    AuthenticationException,
    CasMismatchException,
    DocumentExistsException,
    DocumentNotFoundException,
    InvalidArgumentException,
    PathExistsException,
    PathNotFoundException,
    UnAmbiguousTimeoutException,
    ValueTooDeepException,
)
from couchbase.options import (  # noqa: E402
    ClusterOptions,
    ClusterTimeoutOptions,
    GetOptions,
    IncrementOptions,
    InsertOptions,
    MutateInOptions,
    ReplaceOptions,
    SignedInt64,
    UpsertOptions,
)
from couchbase.transcoder import RawBinaryTranscoder, RawJSONTranscoder  # noqa: E402

from eventing.control.service import EventingService  # noqa: E402
from eventing.http.auth import ServerConfig  # noqa: E402
from eventing.http.server import start_in_thread  # noqa: E402
from eventing.kv.server import start_kv_server  # noqa: E402
from eventing.ops.verify import verify_function  # noqa: E402
from eventing.security.users import hash_password  # noqa: E402
from eventing.storage.factory import create_bucket, open_bucket  # noqa: E402
from eventing.storage.keyspace import create_collection, open_keyspace  # noqa: E402
from eventing.testing import deploy_function, ledger_definition  # noqa: E402
from eventing.workers.executor import make_executor  # noqa: E402
from metadata.factory import open_store  # noqa: E402
from sharding import vbucket_of  # noqa: E402

pytestmark = pytest.mark.integration

PASSWORD = "app-password-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("sdk") / "data")
    create_bucket(data_dir, "shop").close()
    create_collection(data_dir, "shop.sales.orders")
    with open_store(data_dir) as store:
        store.put_user(
            "app",
            hash_password(PASSWORD),
            ["data_reader[shop.*.*]", "data_writer[shop.*.*]", "data_writer[events.*.*]"],
        )
        store.put_user("reader", hash_password(PASSWORD), ["data_reader[shop.*.*]"])
        store.put_user("writer", hash_password(PASSWORD), ["data_writer[shop.*.*]"])
    config = ServerConfig(data_dir, port=free_port())
    http = start_in_thread(
        config
    )  # the map names it as the management and eventing port, as eventing serve runs both
    kv = start_kv_server(config, free_port())
    yield {"data_dir": data_dir, "url": f"couchbase://127.0.0.1:{kv.node.kv_port}"}
    kv.stop()
    http.should_exit = True


def connect(site, user: str = "app", password: str = PASSWORD) -> Cluster:
    timeouts = ClusterTimeoutOptions(kv_timeout=timedelta(seconds=10), connect_timeout=timedelta(seconds=10))
    cluster = Cluster(
        site["url"], ClusterOptions(PasswordAuthenticator(user, password), timeout_options=timeouts)
    )
    cluster.wait_until_ready(timedelta(seconds=20))
    return cluster


@pytest.fixture(scope="module")
def shop(site):
    cluster = connect(site)
    yield cluster.bucket("shop")
    cluster.close()


def test_crud_with_cas_and_the_exceptions_the_sdk_maps(site, shop):
    c = shop.default_collection()
    first = c.upsert("crud", {"n": 1})
    # the SDK routed the key by the map it was given: this system's vBucket of the key (sharding.vbucket)
    for key in ("route", "a", "user::42", "ü-key"):
        token = c.upsert(key, {"k": key}).mutation_token()
        assert token.partition_id == vbucket_of(key)
        with open_keyspace(site["data_dir"], "shop") as coll:
            assert coll.get_meta(key)["vb"] == token.partition_id
    got = c.get("crud")
    assert got.content_as[dict] == {"n": 1} and got.cas == first.cas
    with pytest.raises(DocumentExistsException):
        c.insert("crud", {"n": 2})
    with pytest.raises(CasMismatchException):
        c.replace("crud", {"n": 3}, ReplaceOptions(cas=first.cas + 1))
    replaced = c.replace("crud", {"n": 3}, ReplaceOptions(cas=first.cas))
    assert replaced.cas != first.cas and c.get("crud").content_as[dict] == {"n": 3}
    assert c.insert("crud-new", {"n": 0}, InsertOptions()).cas > 0
    assert c.exists("crud").exists and not c.exists("no-such-doc").exists
    c.remove("crud")
    with pytest.raises(DocumentNotFoundException):
        c.get("crud")
    with pytest.raises(DocumentNotFoundException):
        c.remove("crud")
    # what the SDK wrote is the bucket's document, as every other reader sees it
    with open_keyspace(site["data_dir"], "shop") as coll:
        assert coll.get("crud-new") == {"n": 0} and coll.get("crud") is None


def test_expiry_touch_and_get_and_touch(shop):
    c = shop.default_collection()
    c.upsert("ttl", {"t": 1}, UpsertOptions(expiry=timedelta(seconds=100)))
    first = c.get("ttl", GetOptions(with_expiry=True)).expiry_time
    assert first is not None
    c.touch("ttl", timedelta(seconds=1000))
    touched = c.get_and_touch("ttl", timedelta(seconds=2000))
    assert touched.content_as[dict] == {"t": 1}
    later = c.get("ttl", GetOptions(with_expiry=True)).expiry_time
    assert 1900 <= (later - first).total_seconds() <= 1910
    with pytest.raises(DocumentNotFoundException):
        c.touch("no-such-doc", timedelta(seconds=5))


def test_binary_counters_append_and_prepend(shop):
    b = shop.default_collection().binary()
    assert b.increment("ctr", IncrementOptions(initial=SignedInt64(10))).content == 10
    assert b.increment("ctr").content == 11
    assert b.decrement("ctr").content == 10
    c = shop.default_collection()
    c.upsert("raw", b"mid", UpsertOptions(transcoder=RawBinaryTranscoder()))
    b.append("raw", b"-end")
    b.prepend("raw", b"start-")
    assert c.get("raw", GetOptions(transcoder=RawBinaryTranscoder())).content_as[bytes] == b"start-mid-end"
    with pytest.raises(DocumentNotFoundException):
        b.append("no-such-doc", b"x")


def test_lookup_in_and_mutate_in(shop):
    c = shop.default_collection()
    c.upsert("sub", {"name": "a", "tags": ["x"], "n": 1, "nested": {"k": "v"}})
    r = c.lookup_in("sub", [SD.get("nested.k"), SD.exists("missing"), SD.count("tags"), SD.get("tags[0]")])
    assert r.content_as[str](0) == "v" and not r.exists(1) and r.content_as[int](2) == 1
    assert r.content_as[str](3) == "x"
    c.mutate_in(
        "sub",
        [
            SD.upsert("a.b", 5, create_parents=True),
            SD.array_append("tags", "y"),
            SD.array_prepend("tags", "w"),
            SD.array_insert("tags[1]", "z"),
            SD.array_addunique("tags", "q"),
            SD.increment("n", 4),
            SD.remove("name"),
            SD.replace("nested.k", "w"),
            SD.insert("fresh", True),
        ],
    )
    assert c.get("sub").content_as[dict] == {
        "tags": ["w", "z", "x", "y", "q"],
        "n": 5,
        "nested": {"k": "w"},
        "a": {"b": 5},
        "fresh": True,
    }
    with pytest.raises(PathNotFoundException):
        c.mutate_in("sub", [SD.replace("nope", 1)])
    with pytest.raises(PathExistsException):
        c.mutate_in("sub", [SD.insert("fresh", 1)])
    with pytest.raises(DocumentNotFoundException):
        c.lookup_in("no-such-doc", [SD.get("x")])


def test_json_nested_too_deep_is_refused_with_its_reason_never_an_internal_error(site, shop, caplog):
    """A value nesting deeper than documents may (a RecursionError where it is read) is refused as the Data
    API refuses it: a set by EINVAL naming the nesting, a sub-document value, or the document a value would
    make, by SUBDOC_VALUE_ETOODEEP; nothing is stored and the server logs no internal error. A document
    within the limit is changed by path."""
    c = shop.default_collection()
    raw = UpsertOptions(transcoder=RawJSONTranscoder())
    deep = b'{"a":' * 5000 + b"1" + b"}" * 5000
    with pytest.raises(InvalidArgumentException):  # EINVAL (status 4), not EINTERNAL
        c.upsert("deep", deep, raw)
    c.upsert("sub-deep", b'{"a":' * 200 + b"0" + b"}" * 200, raw)
    raw_values = MutateInOptions(transcoder=RawJSONTranscoder())
    with pytest.raises(ValueTooDeepException):
        c.mutate_in("sub-deep", [SD.upsert("n", b"1"), SD.upsert("v", deep)], raw_values)
    # each value readable, the document it would make too deep
    with pytest.raises(ValueTooDeepException):
        c.mutate_in("sub-deep", [SD.upsert(".".join(["a"] * 200), b"[" * 850 + b"]" * 850)], raw_values)
    c.upsert("doc-deep", b'{"a":' * 700 + b"0" + b"}" * 700, raw)  # a document within the limit
    c.mutate_in("doc-deep", [SD.upsert("n", 1)])  # changed by path (a deep copy of it once recursed too far)
    assert c.lookup_in("doc-deep", [SD.get("n")]).content_as[int](0) == 1
    with open_keyspace(site["data_dir"], "shop") as coll:
        assert coll.get("deep") is None
        assert json.dumps(coll.get("sub-deep")) == '{"a": ' * 200 + "0" + "}" * 200  # unchanged
    assert "KV request" not in caplog.text


def test_scopes_and_collections_and_an_unknown_collection(site, shop):
    orders = shop.scope("sales").collection("orders")
    orders.upsert("o1", {"total": 5})
    assert orders.get("o1").content_as[dict] == {"total": 5}
    with pytest.raises(DocumentNotFoundException):
        shop.default_collection().get("o1")
    with open_keyspace(site["data_dir"], "shop.sales.orders") as coll:
        assert coll.get("o1") == {"total": 5}
    # as against Couchbase: the SDK retries an unknown collection until its timeout
    with pytest.raises(UnAmbiguousTimeoutException) as caught:
        shop.scope("sales").collection("nope").get("o1", GetOptions(timeout=timedelta(seconds=1)))
    assert "COLLECTION_OUTDATED" in str(caught.value).upper()


def test_wrong_password_and_a_reader_that_writes(site, shop):
    shop.default_collection().upsert("for-reader", {"r": 1})
    with pytest.raises(AuthenticationException):
        connect(site, "app", "not-the-password")
    with pytest.raises(AuthenticationException):
        connect(site, "nobody", PASSWORD)
    reader = connect(site, "reader")
    try:
        c = reader.bucket("shop").default_collection()
        assert c.get("for-reader").content_as[dict] == {"r": 1}
        with pytest.raises(AuthenticationException) as refused:  # no_access (0x24), as the SDK maps it
            c.upsert("by-reader", {"x": 1})
        assert "'status_code': 36" in str(refused.value)
    finally:
        reader.close()
    with open_keyspace(site["data_dir"], "shop") as coll:
        assert coll.get("by-reader") is None
    writer = connect(site, "writer")
    try:
        c = writer.bucket("shop").default_collection()
        c.upsert("by-writer", {"w": 1})
        with pytest.raises(AuthenticationException):  # get-and-touch returns the document: a read
            c.get_and_touch("for-reader", timedelta(seconds=60))
        with pytest.raises(AuthenticationException):
            c.get("for-reader")
    finally:
        writer.close()


def test_sdk_writes_reach_a_deployed_function_once_each_in_order(site, shop):
    data_dir = site["data_dir"]
    create_bucket(data_dir, "events").close()
    deploy_function(data_dir, ledger_definition("fn_sdk", "events", "ledger_sdk"))
    cluster = connect(site)
    try:
        c = cluster.bucket("events").default_collection()
        for round_ in range(3):
            for i in range(100):
                c.upsert(f"doc-{i}", {"round": round_, "i": i})
        for i in range(0, 100, 10):
            c.remove(f"doc-{i}")
    finally:
        cluster.close()
    with open_bucket(data_dir, "events") as events:
        assert sum(events.high_seqnos()) == 310
    summary = EventingService(data_dir, make_executor("in-process"), until_caught_up=True).run()
    assert not summary.errors
    report = verify_function(data_dir, "fn_sdk")
    assert report.ok, report
    assert report.source_mutations == 310 and report.handled == 310 and not report.duplicate_effects
