"""A full-document write keeps the document's extended attributes, as kv_engine's set, add and replace do
(daemon/protocol/mcbp/mutation_context.cc): a write that carries none (Write.xattrs None) keeps those of the
live, unexpired document, in its live row and in its log entry, in every bucket kind and through every path
(plain and planned batches, the effects of a function's bindings, marked, unmarked and conditional, the
check-and-set, imports); xattrs.NONE leaves none, a delete drops them. And so a handler's `dst[k] = doc`,
its advanced accessors, JavaScript's `dst[k] = doc` and `couchbase.upsert/replace`, and `eventing bucket
upsert` keep them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from eventing.api import Eventing
from eventing.cli.app import main
from eventing.core import xattrs as X
from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from eventing.storage import postgres as pg_buckets
from eventing.storage.factory import create_bucket, open_bucket
from eventing.storage.values import EffectGroup, Write
from metadata.postgres import PostgresDatabase
from sharding import vbucket_of

TAG = X.encode({"audit": {"by": "ada"}, "_sync": {"rev": 1}})
OTHER = X.encode({"audit": {"by": "bob"}})


@pytest.fixture(scope="module")
def pg_module_url(pg_server) -> str:
    return pg_server.create_database(f"keep_{uuid.uuid4().hex[:8]}")


@pytest.fixture(params=["local", "partitioned", "postgres"])
def bucket(request, data_dir) -> Iterator[Any]:
    if request.param == "postgres":
        db = PostgresDatabase.open(
            request.getfixturevalue("pg_module_url") + f"?schema=t_{uuid.uuid4().hex[:12]}"
        )
        try:
            with pg_buckets.create_bucket(db, "b") as pg:
                yield pg
        finally:
            db.close()
        return
    with create_bucket(data_dir, "b", partitions=4 if request.param == "partitioned" else 1) as b:
        yield b


def _doc(i: int) -> bytes:
    return encode_document({"i": i})


def _xattrs(bucket, key: str) -> bytes | None:
    return (bucket.get_meta(key) or {}).get("xattrs")


def _entries(bucket, key: str) -> list[bytes | None]:
    """The XATTRs of each log entry of `key`, in order."""
    return [m.xattrs for m in bucket.read_vb(vbucket_of(key), 0, 10_000) if m.key == key]


@pytest.mark.parametrize("count", [1, 5, 250])  # PostgreSQL: one row, arrays, COPY; a file: planned batches
def test_a_write_that_carries_none_keeps_the_documents_own(bucket, count):
    keys = [f"k{i:03d}" for i in range(count)]
    bucket.write(
        [Write(k, OP_UPDATE, _doc(0), xattrs=TAG if i % 2 == 0 else None) for i, k in enumerate(keys)]
    )
    bucket.write([Write(k, OP_UPDATE, _doc(1)) for k in keys] + [Write("new", OP_UPDATE, _doc(1))])
    for i, key in enumerate(keys):
        want = TAG if i % 2 == 0 else None
        assert _xattrs(bucket, key) == want and _entries(bucket, key) == [want, want], key
        assert bucket.get(key) == {"i": 1}
    assert _xattrs(bucket, "new") is None and _entries(bucket, "new") == [None]


def test_a_batch_keeps_the_xattrs_its_earlier_writes_left(bucket):
    bucket.write([Write(k, OP_UPDATE, _doc(0), xattrs=TAG) for k in ("a", "b", "c")])
    bucket.write(
        [
            Write("a", OP_UPDATE, _doc(1), xattrs=OTHER),
            Write("a", OP_UPDATE, _doc(2)),  # keeps OTHER, set just before
            Write("b", OP_DELETE),
            Write("b", OP_UPDATE, _doc(3)),  # the delete took them
            Write("c", OP_UPDATE, _doc(4), xattrs=X.NONE),
            Write("c", OP_UPDATE, _doc(5)),  # none left to keep
        ]
    )
    assert _entries(bucket, "a") == [TAG, OTHER, OTHER] and _xattrs(bucket, "a") == OTHER
    assert _entries(bucket, "b") == [TAG, None, None] and _xattrs(bucket, "b") is None
    assert _entries(bucket, "c") == [TAG, None, None] and _xattrs(bucket, "c") is None
    # an expired document's are not kept: Couchbase reads it as gone
    bucket.write([Write("old", OP_UPDATE, _doc(0), expiry=int(time.time()) - 10, xattrs=TAG)])
    bucket.write([Write("old", OP_UPDATE, _doc(1)), Write("a", OP_UPDATE, _doc(6))])
    assert _xattrs(bucket, "old") is None and _xattrs(bucket, "a") == OTHER


@pytest.mark.parametrize("marks", [True, False])
def test_binding_effects_keep_them_marked_and_unmarked_and_conditional(bucket, marks):
    bucket.write([Write(k, OP_UPDATE, encode_document({"count": 1}), xattrs=TAG) for k in ("p", "q", "r")])
    plain = EffectGroup(vb=3, epoch=1, writes=[(10, Write("p", OP_UPDATE, _doc(1)))])
    result = bucket.apply_effects("fn", [plain], marks=marks)
    assert result.applied == 1 and _xattrs(bucket, "p") == TAG and _entries(bucket, "p") == [TAG, TAG]
    if not marks:
        return  # (conditions and counter deltas are resolved on the marked path)
    counter = EffectGroup(
        vb=4, epoch=1, writes=[(11, Write("q", OP_UPDATE, delta=2)), (12, Write("r", OP_UPDATE, _doc(2)))]
    )
    counter.conditional = True
    assert bucket.apply_effects("fn", [counter], marks=marks).applied == 2
    assert bucket.get("q") == {"count": 3} and _xattrs(bucket, "q") == TAG and _xattrs(bucket, "r") == TAG
    assert _entries(bucket, "q") == [TAG, TAG]


def test_the_check_and_set_and_imports_keep_them(bucket):
    bucket.write([Write(k, OP_UPDATE, _doc(0), xattrs=TAG) for k in ("s", "t")])
    [done] = bucket.change_documents(
        [("s", lambda cur: Write("s", OP_UPDATE, _doc(1), cur.expiry, cur.flags))]
    )
    assert done.after.xattrs == TAG and _xattrs(bucket, "s") == TAG and _entries(bucket, "s") == [TAG, TAG]
    assert bucket.load_rows([("t", OP_UPDATE, _doc(2), 0), ("u", OP_UPDATE, _doc(3), 0, OTHER)]) == 2
    assert _xattrs(bucket, "t") == TAG and _xattrs(bucket, "u") == OTHER


def _tag_dst(data_dir: str, keys: list[str]) -> None:
    with open_bucket(data_dir, "dst") as dst:
        dst.write([Write(k, OP_UPDATE, encode_document({"old": True}), xattrs=TAG) for k in keys])


PYTHON = """
def on_update(doc, meta):
    if meta.id == "k1":
        dst["k1"] = {"n": doc["n"]}
    elif meta.id == "k2":
        dst.upsert("k2", {"n": doc["n"]})
    elif meta.id == "k3":
        r = dst.get_result("k3")
        dst.replace("k3", {"n": doc["n"]}, cas=r.meta.cas)
    elif meta.id == "k4":
        dst.mutate_in("k4", [("upsert", "n", doc["n"])])
"""

JAVASCRIPT = """
function OnUpdate(doc, meta) {
  if (meta.id === "k1") { dst["k1"] = {n: doc.n}; }
  else if (meta.id === "k2") { couchbase.upsert(dst, {id: "k2"}, {n: doc.n}); }
  else if (meta.id === "k3") {
    var r = couchbase.get(dst, {id: "k3"});
    couchbase.replace(dst, {id: "k3", cas: r.meta.cas}, {n: doc.n});
  }
  else if (meta.id === "k4") {
    couchbase.mutateIn(dst, {id: "k4"}, [couchbase.MutateInSpec.upsert("n", doc.n)]);
  }
}
"""


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_a_handlers_writes_keep_the_documents_xattrs(data_dir, language):
    if language == "javascript":
        pytest.importorskip("STPyV8")
    keys = ["k1", "k2", "k3", "k4"]
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    _tag_dst(data_dir, keys)
    for i, key in enumerate(keys):
        app.upsert("src", key, {"n": i})
    app.deploy(
        {
            "name": "fn_keep",
            "source_bucket": "src",
            "language": language,
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
        },
        PYTHON if language == "python" else JAVASCRIPT,
    )
    app.run(until_caught_up=True)
    with open_bucket(data_dir, "dst") as dst:
        for i, key in enumerate(keys):
            assert dst.get(key)["n"] == i, key
            assert _xattrs(dst, key) == TAG and _entries(dst, key) == [TAG, TAG], key


def test_bucket_upsert_keeps_them_and_bucket_delete_drops_them(data_dir, capsys):
    with create_bucket(data_dir, "dst") as dst:
        dst.write([Write("d", OP_UPDATE, _doc(0), xattrs=TAG)])
    assert main(["--data-dir", data_dir, "bucket", "upsert", "dst", "d", '{"n": 1}']) == 0
    with open_bucket(data_dir, "dst") as dst:
        assert dst.get("d") == {"n": 1} and _xattrs(dst, "d") == TAG
    assert main(["--data-dir", data_dir, "bucket", "delete", "dst", "d"]) == 0
    assert main(["--data-dir", data_dir, "bucket", "upsert", "dst", "d", '{"n": 2}']) == 0
    with open_bucket(data_dir, "dst") as dst:
        assert _xattrs(dst, "d") is None and _entries(dst, "d") == [TAG, TAG, None, None]
