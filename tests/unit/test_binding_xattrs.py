"""A document's user extended attributes through a binding's sub-document accessors, as Couchbase Eventing
serves them: `mutate_in`/`couchbase.mutateIn` and `lookup_in`/`couchbase.lookupIn` specs with
`{"xattrs": True}` read and change XATTR paths (system XATTRs kept as they were), the handler reads its own
pending changes, a full-document write after them keeps them, and Couchbase's refusals (a system name, a
name of 16 bytes or more, an `xattrs` that is not a boolean) are errors of the call."""

from __future__ import annotations

import pytest

from eventing.api import Eventing
from eventing.core import xattrs as X
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.storage.factory import open_bucket
from eventing.storage.values import Write
from sharding import vbucket_of

SYSTEM = {"_sync": {"rev": 7}}


def _app(data_dir: str, language: str, source: str, keys: list[str]) -> Eventing:
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    with open_bucket(data_dir, "dst") as dst:  # each target with a system XATTR the handler cannot see
        dst.write([Write(k, OP_UPDATE, encode_document({"k": k}), xattrs=X.encode(SYSTEM)) for k in keys])
    for key in keys:
        app.upsert("src", key, {"n": 1})
    app.deploy(
        {
            "name": "fn_x",
            "source_bucket": "src",
            "language": language,
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
        },
        source,
    )
    return app


def _stored(data_dir: str, key: str) -> tuple[dict | None, dict, list[dict]]:
    """The document, its XATTRs and those of each of its log entries."""
    with open_bucket(data_dir, "dst") as dst:
        entries = [X.decode(m.xattrs) for m in dst.read_vb(vbucket_of(key), 0, 1000) if m.key == key]
        return dst.get(key), X.decode((dst.get_meta(key) or {}).get("xattrs")), entries


PYTHON = """
def on_update(doc, meta):
    if meta.id == "a":
        r = dst.mutate_in("a", [("upsert", "audit.by", "ada", {"xattrs": True}),
                                ("array_append", "audit.seen", 1, {"xattrs": True}),
                                ("upsert", "body", True)])
        assert r.success, r.error
        mine = dst.lookup_in("a", [("get", "audit", {"xattrs": True}), ("exists", "nope", {"xattrs": True}),
                                   ("get", "body")])
        dst["a"] = {"replaced": True}  # a full-document write after it keeps them
        again = dst.lookup_in("a", [("get", "audit.by", {"xattrs": True})])
        dst["seen|a"] = {"first": mine.value, "after_write": again.value}
    elif meta.id == "b":
        dst.mutate_in("b", [("upsert", "tag", 1, {"xattrs": True})])
        del dst["b"]
        dst["b"] = {"new": True}  # after a delete: none
        dst["seen|b"] = {"after": dst.lookup_in("b", [("exists", "tag", {"xattrs": True})]).value}
    elif meta.id == "c":
        errors = []
        for spec in [("get", "_sync", {"xattrs": True}), ("get", "x" * 16, {"xattrs": True}),
                     ("get", "x", {"xattrs": "yes"}), ("get", "$document", {"xattrs": True})]:
            try:
                dst.lookup_in("c", [spec])
            except Exception as exc:
                errors.append(str(exc))
        dst["seen|c"] = {"errors": errors}
"""


def test_python_mutate_in_and_lookup_in_of_xattrs(data_dir):
    app = _app(data_dir, "python", PYTHON, ["a", "b", "c"])
    app.run(until_caught_up=True)
    doc, xattrs, entries = _stored(data_dir, "a")
    assert doc == {"replaced": True}
    assert xattrs == {**SYSTEM, "audit": {"by": "ada", "seen": [1]}}
    assert entries == [SYSTEM, xattrs, xattrs]  # the mutate_in's entry, then the full write's
    seen = _stored(data_dir, "seen|a")[0]
    assert seen == {"first": [{"by": "ada", "seen": [1]}, False, True], "after_write": ["ada"]}
    assert _stored(data_dir, "b")[1] == {} and _stored(data_dir, "seen|b")[0] == {"after": [False]}
    errors = _stored(data_dir, "seen|c")[0]["errors"]
    assert [e.split(": ", 1)[1].split(" (")[0] for e in errors] == [
        "XATTR path cannot start with underscore",
        "XATTR key size must be less than 16 characters",
        "xattrs must be a boolean value",
        "'$document' is a virtual XATTR, which bindings do not read; read it with an SDK over the KV port",
    ]


JAVASCRIPT = """
function OnUpdate(doc, meta) {
  var m = {"id": meta.id};
  var steps = [
    [couchbase.MutateInSpec.insert("user_xattrs", {"testField": "insert"}, {"xattrs": true})],
    [couchbase.MutateInSpec.upsert("user_xattrs", {"testField": "upsert"}, {"xattrs": true})],
    [couchbase.MutateInSpec.replace("user_xattrs", {"testField": "replace"}, {"xattrs": true})],
    [couchbase.MutateInSpec.upsert("user_xattrs.arrayTest", [], {"create_path": true, "xattrs": true}),
     couchbase.MutateInSpec.arrayAppend("user_xattrs.arrayTest", 2, {"create_path": true, "xattrs": true}),
     couchbase.MutateInSpec.arrayPrepend("user_xattrs.arrayTest", 1, {"create_path": true, "xattrs": true}),
     couchbase.MutateInSpec.arrayInsert("user_xattrs.arrayTest[0]", 0, {"create_path": true, "xattrs": true}),
     couchbase.MutateInSpec.arrayAddUnique("user_xattrs.arrayTest", 3, {"create_path": true, "xattrs": true})]
  ];
  for (var i = 0; i < steps.length; i++) {
    var r = couchbase.mutateIn(dst, m, steps[i]);
    if (!r.success) { dst["failed|" + i] = r; return; }
  }
  var again = couchbase.mutateIn(dst, m, [couchbase.MutateInSpec.insert("user_xattrs", 1, {"xattrs": true})]);
  var res = couchbase.lookupIn(dst, m, [couchbase.LookupInSpec.get("user_xattrs", {"xattrs": true}),
                                        couchbase.LookupInSpec.get("user_xattrs.none", {"xattrs": true}),
                                        couchbase.LookupInSpec.get("k")]);
  var refused = "";
  try { couchbase.lookupIn(dst, m, [couchbase.LookupInSpec.get("_sync", {"xattrs": true})]); }
  catch (e) { refused = e.message; }
  dst["seen|" + meta.id] = {lookup: res.doc, insert_again: again.error.name, refused: refused};
}
"""


def test_javascript_mutate_in_and_lookup_in_of_xattrs(data_dir):
    pytest.importorskip("STPyV8")
    app = _app(data_dir, "javascript", JAVASCRIPT, ["j"])
    app.run(until_caught_up=True)
    user = {"testField": "replace", "arrayTest": [0, 1, 2, 3]}
    doc, xattrs, entries = _stored(data_dir, "j")
    assert doc == {"k": "j"} and xattrs == {**SYSTEM, "user_xattrs": user}  # the body as it was
    assert len(entries) == 5 and entries[-1] == xattrs
    seen = _stored(data_dir, "seen|j")[0]
    assert seen["lookup"] == [
        {"value": user, "success": True},
        {"success": False},
        {"value": "j", "success": True},
    ]
    assert seen["insert_again"] == "LCB_ERR_SUBDOC_PATH_EXISTS"
    assert "XATTR path cannot start with underscore" in seen["refused"]
