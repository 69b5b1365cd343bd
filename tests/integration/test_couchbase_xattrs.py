"""A document's extended attributes (XATTRs) through Couchbase's Python SDK (the real `couchbase` package)
against the KV port: sub-document mutations and lookups of user and system XATTRs, the virtual `$document`
and `$XTOC`, the macros the SDK sends (`MutationMacro`), kv_engine's refusals, full-document writes that
keep the XATTRs, and deployed functions, Python and JavaScript, that get each mutation's user XATTRs as of
that mutation in OnUpdate's third argument (counted in a ledger bucket)."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest

pytest.importorskip("couchbase")  # a test dependency: CI always has it

import couchbase.subdocument as SD  # noqa: E402
from couchbase.auth import PasswordAuthenticator  # noqa: E402
from couchbase.cluster import Cluster  # noqa: E402
from couchbase.exceptions import (  # noqa: E402
    CouchbaseException,
    PathExistsException,
    PathNotFoundException,
)
from couchbase.options import ClusterOptions, ClusterTimeoutOptions, MutateInOptions  # noqa: E402
from couchbase.subdocument import StoreSemantics  # noqa: E402

from eventing.control.service import EventingService  # noqa: E402
from eventing.core.definition import FunctionDefinition  # noqa: E402
from eventing.core.xattrs import crc32c  # noqa: E402
from eventing.http.auth import ServerConfig  # noqa: E402
from eventing.http.server import start_in_thread  # noqa: E402
from eventing.kv.server import start_kv_server  # noqa: E402
from eventing.security.users import hash_password  # noqa: E402
from eventing.storage.factory import create_bucket, open_bucket  # noqa: E402
from eventing.testing import deploy_function  # noqa: E402
from eventing.workers.executor import make_executor  # noqa: E402
from metadata.factory import open_store  # noqa: E402

pytestmark = pytest.mark.integration

PASSWORD = "app-password-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("xattrs") / "data")
    create_bucket(data_dir, "shop").close()
    with open_store(data_dir) as store:
        store.put_user("app", hash_password(PASSWORD), ["data_reader[*]", "data_writer[*]"])
    config = ServerConfig(data_dir, port=free_port())
    http = start_in_thread(config)
    kv = start_kv_server(config, free_port())
    cluster = Cluster(
        f"couchbase://127.0.0.1:{kv.node.kv_port}",
        ClusterOptions(
            PasswordAuthenticator("app", PASSWORD),
            timeout_options=ClusterTimeoutOptions(
                kv_timeout=timedelta(seconds=10), connect_timeout=timedelta(seconds=10)
            ),
        ),
    )
    cluster.wait_until_ready(timedelta(seconds=20))
    yield {"data_dir": data_dir, "cluster": cluster}
    cluster.close()
    kv.stop()
    http.should_exit = True


def test_user_and_system_xattrs_macros_and_the_virtual_document(site):
    c = site["cluster"].bucket("shop").default_collection()
    written = c.upsert("order-1", {"total": 40})
    done = c.mutate_in(
        "order-1",
        [
            SD.upsert("audit.by", "ada", xattr=True, create_parents=True),
            SD.upsert("tags", ["new"], xattr=True),
            SD.array_append("tags", "paid", xattr=True),
            SD.increment("audit.n", 2, xattr=True),
            SD.upsert("_sys", {"s": 1}, xattr=True),
            SD.upsert("seen.cas", SD.MutationMacro.cas(), xattr=True, create_parents=True),
            SD.upsert("seen.seq", SD.MutationMacro.seq_no(), xattr=True, create_parents=True),
            SD.upsert("seen.crc", SD.MutationMacro.value_crc32c(), xattr=True, create_parents=True),
            SD.upsert("total", 41),
        ],
    )
    assert done.cas != written.cas
    got = c.lookup_in(
        "order-1",
        [
            SD.get("audit", xattr=True),
            SD.get("tags[1]", xattr=True),
            SD.get("_sys.s", xattr=True),
            SD.get("seen", xattr=True),
            SD.get("$document", xattr=True),
            SD.get("$XTOC", xattr=True),
            SD.exists("nope", xattr=True),
            SD.get("total"),
        ],
    )
    assert got.content_as[dict](0) == {"by": "ada", "n": 2}
    assert got.content_as[str](1) == "paid" and got.content_as[int](2) == 1
    seen = got.content_as[dict](3)
    assert SD.convert_macro_cas_to_cas(seen["cas"]) == done.cas  # kv_engine's byte order, as the SDK reads it
    vattr = got.content_as[dict](4)
    assert int(seen["seq"], 16) == int(vattr["seqno"], 16) == done.mutation_token().sequence_number
    body = b'{"total":41}'
    assert seen["crc"] == f"0x{crc32c(body):08x}" == vattr["value_crc32c"]
    assert int(vattr["CAS"], 16) == done.cas and vattr["value_bytes"] == len(body) and vattr["exptime"] == 0
    assert vattr["deleted"] is False and vattr["flags"] >> 24 == 0x02  # the common flags of JSON
    assert sorted(got.content_as[list](5)) == ["_sys", "audit", "seen", "tags"]
    assert not got.exists(6) and got.content_as[int](7) == 41
    assert c.get("order-1").content_as[dict] == {"total": 41}  # never in the body

    # kv_engine's refusals: a virtual attribute is read-only, an unknown one is unknown, names are checked
    with pytest.raises(CouchbaseException) as refused:
        c.mutate_in("order-1", [SD.upsert("$document.x", 1, xattr=True)])
    assert "0xd2" in str(refused.value).lower() or "210" in str(refused.value)
    unknown = c.lookup_in("order-1", [SD.get("$nope", xattr=True), SD.get("tags", xattr=True)])
    assert unknown.content_as[list](1) == ["new", "paid"]
    with pytest.raises(CouchbaseException):  # XATTR_UNKNOWN_VATTR (0xd1) for that spec alone
        unknown.content_as[int](0)
    with pytest.raises(CouchbaseException):
        c.mutate_in("order-1", [SD.upsert("#bad", 1, xattr=True)])
    with pytest.raises(PathExistsException):
        c.mutate_in("order-1", [SD.insert("tags", [], xattr=True)])
    with pytest.raises(PathNotFoundException):
        c.mutate_in("order-1", [SD.replace("missing", 1, xattr=True)])
    assert c.lookup_in("order-1", [SD.get("tags", xattr=True)]).content_as[list](0) == ["new", "paid"]

    # a full-document replace keeps the XATTRs (as kv_engine does); a delete drops them
    c.replace("order-1", {"total": 42})
    kept = c.lookup_in("order-1", [SD.get("tags", xattr=True), SD.get("_sys", xattr=True)])
    assert kept.content_as[list](0) == ["new", "paid"] and kept.content_as[dict](1) == {"s": 1}
    c.mutate_in("order-1", [SD.remove("tags", xattr=True), SD.remove("_sys", xattr=True)])
    assert not c.lookup_in("order-1", [SD.exists("tags", xattr=True)]).exists(0)
    c.remove("order-1")
    c.upsert("order-1", {"total": 1})
    assert c.lookup_in("order-1", [SD.get("$XTOC", xattr=True)]).content_as[list](0) == []

    # an XATTR alone on a missing document creates it (the SDK's upsert semantics send mkdoc)
    c.mutate_in(
        "fresh",
        [SD.upsert("owner", "lin", xattr=True)],
        MutateInOptions(store_semantics=StoreSemantics.UPSERT),
    )
    assert c.get("fresh").content_as[dict] == {}
    assert c.lookup_in("fresh", [SD.get("owner", xattr=True)]).content_as[str](0) == "lin"


PY_HANDLER = """
def on_update(doc, meta, xattrs):
    ledger[meta.id + "@" + str(meta.seq)] = {"xattrs": xattrs, "n": doc.get("n")}
"""
JS_HANDLER = """
function OnUpdate(doc, meta, xattrs) {
    ledger[meta.id + "@" + meta.seq] = {"xattrs": xattrs, "n": doc.n};
}
"""


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_a_function_gets_each_mutations_user_xattrs_as_of_that_mutation(site, language):
    data_dir = site["data_dir"]
    source = f"events_{language}"
    create_bucket(data_dir, source).close()
    defn = FunctionDefinition.from_dict(
        {
            "name": f"fn_xattrs_{language}",
            "source_bucket": source,
            "language": language,
            "bindings": [{"alias": "ledger", "bucket": f"ledger_{language}", "access": "rw"}],
            "worker_count": 2,
        }
    )
    deploy_function(data_dir, defn, JS_HANDLER if language == "javascript" else PY_HANDLER)
    c = site["cluster"].bucket(source).default_collection()
    expected: dict[str, dict] = {}
    for i in range(20):
        key = f"doc-{i}"
        c.upsert(key, {"n": 0})  # seqno 1: no XATTRs
        c.mutate_in(key, [SD.upsert("v", 1, xattr=True), SD.upsert("_s", "hidden", xattr=True)])  # 2
        c.mutate_in(key, [SD.upsert("v", 2, xattr=True), SD.upsert("n", 1)])  # 3
        c.replace(key, {"n": 2})  # 4: a full-document write keeps them
        expected.update(
            {
                f"{key}@1": {"xattrs": {}, "n": 0},
                f"{key}@2": {"xattrs": {"v": 1}, "n": 0},  # system XATTRs are not handed to handlers
                f"{key}@3": {"xattrs": {"v": 2}, "n": 1},
                f"{key}@4": {"xattrs": {"v": 2}, "n": 2},
            }
        )
    summary = EventingService(data_dir, make_executor("in-process"), until_caught_up=True).run()
    assert not summary.errors
    with open_bucket(data_dir, f"ledger_{language}") as ledger:
        got = {key: doc for key, doc, _ in ledger.scan()}
    assert got == expected  # one entry per mutation, each with the XATTRs it had then
