"""Sources and bindings over several collections (`bucket.*.*`, `bucket.scope.*`, Couchbase 7.1): every
collection's mutations reach the handler with their meta.keyspace, collections created while the function
runs are picked up, dropping one leaves the function deployed, and a wildcard binding reaches a collection
through the document's keyspace only."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventing.api import Eventing
from eventing.core.couchbase_format import from_couchbase
from eventing.core.definition import FunctionDefinition
from eventing.core.keyspaces import Keyspace
from eventing.errors import ConfigError

# Copies each document into the same collection of `copies` (through the wildcard binding, by the
# document's keyspace) and into a log of keyspaces in the default collection of `copies`.
JS_HANDLER = """
function OnUpdate(doc, meta) {
    var ks = meta.keyspace;
    var into = {bucket_name: 'copies', scope_name: ks.scope_name, collection_name: ks.collection_name};
    var res = couchbase.upsert(everything, {id: meta.id, keyspace: into}, {n: doc.n, from: ks.scope_name + '.' + ks.collection_name});
    if (!res.success) { throw new Error('upsert failed'); }
    couchbase.increment(seen, {id: 'seen::' + ks.scope_name + '.' + ks.collection_name});
    try {
        everything['x'] = 1;
    } catch (e) {
        log('map access', e.message.indexOf('several collections') >= 0);
    }
}
"""  # noqa: E501

PY_HANDLER = """
def on_update(doc, meta):
    ks = meta.keyspace
    into = everything.in_keyspace({"bucket_name": "copies", "scope_name": ks["scope_name"],
                                   "collection_name": ks["collection_name"]})
    into[meta.id] = {"n": doc["n"], "py": True}
"""


def _app(data_dir: str, handler: str, language: str) -> Eventing:
    app = Eventing(data_dir, executor="in-process")
    for bucket in ("shop", "copies"):
        app.create_bucket(bucket)
        for ks in ("sales.orders", "hr.staff"):
            app.create_collection(f"{bucket}.{ks}")
    definition = {
        "name": "fn_all",
        "source_bucket": "shop",
        "source_scope": "*",
        "source_collection": "*",
        "language": language,
        "bindings": [
            {"alias": "everything", "bucket": "copies", "scope": "*", "collection": "*", "access": "rw"},
            {"alias": "seen", "bucket": "copies", "access": "rw"},
        ],
    }
    app.deploy(definition, handler)
    return app


def _run(app: Eventing) -> None:
    summary = app.run(until_caught_up=True)
    assert not summary.errors, summary.errors


@pytest.mark.parametrize("language", ["javascript", "python"])
def test_a_function_over_every_collection_sees_each_one_and_picks_up_new_ones(data_dir, language):
    if language == "javascript":
        pytest.importorskip("STPyV8")
    app = _app(data_dir, JS_HANDLER if language == "javascript" else PY_HANDLER, language)
    for keyspace, n in (("shop", 1), ("shop.sales.orders", 2), ("shop.hr.staff", 3)):
        app.upsert(keyspace, f"k{n}", {"n": n})
    _run(app)
    # a collection created while the function is deployed, and one in it
    app.create_collection("shop.sales.returns")
    app.create_collection("copies.sales.returns")
    app.upsert("shop.sales.returns", "k4", {"n": 4})
    _run(app)
    for keyspace, key, n in (
        ("shop", "k1", 1),
        ("shop.sales.orders", "k2", 2),
        ("shop.hr.staff", "k3", 3),
        ("shop.sales.returns", "k4", 4),
    ):
        copy = app.get(keyspace.replace("shop", "copies"), key)
        assert copy is not None and copy["n"] == n, (keyspace, copy)
    if language == "javascript":
        assert app.get("copies.hr.staff", "k3") == {"n": 3, "from": "hr.staff"}
        counts = {key: app.get("copies", key) for key in app.keys("copies", "seen::")}
        # once each: the function's writes to `copies` are not its source, and a document is handled once
        assert counts == {
            "seen::_default._default": {"count": 1},
            "seen::hr.staff": {"count": 1},
            "seen::sales.orders": {"count": 1},
            "seen::sales.returns": {"count": 1},
        }
        text = (Path(data_dir) / "logs" / "fn_all.log").read_text()
        assert text.count('"map access" true') == 4  # a bucket-map access names no collection: refused


def test_dropping_a_collection_leaves_a_wildcard_function_deployed(data_dir):
    app = _app(data_dir, PY_HANDLER, "python")
    app.upsert("shop.hr.staff", "k1", {"n": 1})
    _run(app)
    from eventing.ops import buckets

    dropped = buckets.drop_collection(data_dir, "shop.hr.staff")
    assert dropped["undeployed_functions"] == [] and dropped["named_by_undeployed_functions"] == []
    # the wildcard binding's collection too
    assert buckets.drop_collection(data_dir, "copies.hr.staff")["undeployed_functions"] == []
    from metadata.factory import open_store

    with open_store(data_dir) as store:
        assert store.get_function("fn_all").state.value == "deployed"
    app.upsert("shop.sales.orders", "k2", {"n": 2})
    _run(app)
    assert app.get("copies.sales.orders", "k2") == {"n": 2, "py": True}


def test_wildcard_keyspaces_in_definitions_and_couchbase_exports():
    defn = FunctionDefinition.from_dict(
        {"name": "f", "source_bucket": "b", "source_scope": "*", "source_collection": "*"}
    )
    assert defn.source_keyspace == Keyspace("b", "*", "*") and str(defn.source_keyspace) == "b.*.*"
    with pytest.raises(ConfigError, match=r"use 'b\.\*\.\*' or name the scope"):
        FunctionDefinition.from_dict(
            {"name": "f", "source_bucket": "b", "source_scope": "*", "source_collection": "c"}
        )
    assert Keyspace("b", "*", "*").covers(Keyspace("b", "s", "c")) and Keyspace("b", "*", "*").covers(
        Keyspace("b")
    )
    assert Keyspace("b", "s", "*").covers(Keyspace("b", "s", "c")) and not Keyspace("b", "s", "*").covers(
        Keyspace("b")
    )
    assert not Keyspace("b", "*", "*").covers(Keyspace("other", "s", "c"))
    exported = {
        "appname": "multi",
        "appcode": "function OnUpdate(doc, meta) {}",
        "depcfg": {
            "source_bucket": "source",
            "source_scope": "*",
            "source_collection": "*",
            "metadata_bucket": "rr100",
            "metadata_scope": "eventing",
            "metadata_collection": "metadata",
            "buckets": [
                {
                    "alias": "alias_rw",
                    "bucket_name": "source",
                    "scope_name": "myscope",
                    "collection_name": "*",
                    "access": "rw",
                }
            ],
        },
        "settings": {},
        "function_scope": {"bucket": "*", "scope": "*"},
    }
    converted = from_couchbase(exported)
    assert converted.definition.source_keyspace == Keyspace("source", "*", "*")
    assert converted.definition.bindings[0].keyspace == Keyspace("source", "myscope", "*")


def test_a_sandboxed_function_reaches_every_collection_its_wildcards_cover_and_writes_as_its_deployment(
    data_dir,
):
    from eventing.core.keyspaces import key_prefix
    from eventing.storage.factory import create_bucket
    from eventing.storage.remote import DataService
    from eventing.storage.values import EffectGroup, Write
    from eventing.workers.sandbox.scope import ScopedService

    source = create_bucket(data_dir, "src")
    staff = source.create_collection("hr", "staff")
    out = create_bucket(data_dir, "out")
    a, other = out.create_collection("t", "a"), out.create_collection("u", "b")
    for bucket, cids in ((source, (0, staff)), (out, (0, a, other))):
        bucket.write([Write(key_prefix(cid) + "doc", 0, b"\x80") for cid in cids])
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn",
            "source_bucket": "src",
            "source_scope": "*",
            "source_collection": "*",
            "bindings": [{"alias": "o", "bucket": "out", "scope": "t", "collection": "*", "access": "rw"}],
        }
    )
    service = ScopedService("fn", defn, DataService(data_dir))
    try:
        for bucket, key in (
            ("src", "doc"),
            ("src", key_prefix(staff) + "doc"),
            ("out", key_prefix(a) + "doc"),
        ):
            assert service.call("bucket", bucket, "get_raw", (key,), {}) is not None
        for key in ("doc", key_prefix(other) + "doc"):  # outside `out.t.*`
            with pytest.raises(ConfigError, match="runs sandboxed"):
                service.call("bucket", "out", "get_raw", (key,), {})
        group = EffectGroup(0, 1, [(1, Write(key_prefix(a) + "new", 0, b"\x80"))])
        service.call("bucket", "out", "apply_effects", ("fn", [group]), {"origin": "fn@1", "marks": False})
        for origin in ("other@1", 7):  # another function's origin, or no origin at all
            with pytest.raises(ConfigError, match="runs sandboxed"):
                service.call(
                    "bucket", "out", "apply_effects", ("fn", [group]), {"origin": origin, "marks": False}
                )
    finally:
        service.backend.close()
        source.close()
        out.close()
