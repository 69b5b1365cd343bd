"""Sandboxed functions: a hostile handler that knows every path of the data directory cannot read the
metadata store, open another bucket's file for reading or writing, read another function's handler source
or write outside its private temporary folder; its binding writes still apply exactly once. The same
handler with "isolation": "none" succeeds at every attempt, so the refusals come from the sandbox."""

from __future__ import annotations

import os

import pytest

from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.storage.bucket import bucket_path
from eventing.storage.factory import create_bucket, open_bucket
from eventing.testing import deploy_function, load_source
from eventing.workers.executor import InProcessExecutor
from eventing.workers.sandbox import sandbox_unavailable
from metadata.factory import SQLITE_FILE, open_store

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable())),
]

HOSTILE = '''
import os, sqlite3, subprocess, tempfile


def attempt(what, fn):
    try:
        fn()
        return "ok"
    except Exception as exc:
        return type(exc).__name__


def read_store():
    db = sqlite3.connect(f"file:{STORE}?mode=ro", uri=True)
    db.execute("select count(*) from functions").fetchone()


def other_source():
    db = sqlite3.connect(f"file:{STORE}?mode=ro", uri=True)
    row = db.execute("select source from functions where name=?", (OTHER_FUNCTION,)).fetchone()
    assert row and "on_update" in row[0]


def read_bucket():
    with open(OTHER_BUCKET, "rb") as f:
        assert f.read(16).startswith(b"SQLite format 3")


def write_bucket():
    db = sqlite3.connect(OTHER_BUCKET, timeout=5)
    db.execute("create table if not exists intruder(x)")
    db.commit()


def write_bucket_os():
    os.close(os.open(OTHER_BUCKET, os.O_WRONLY))


def write_outside(key):
    with open(os.path.join(OUTSIDE, key + ".txt"), "w") as f:
        f.write("x")


def read_with_cat():
    subprocess.run(["cat", STORE], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def parents_descriptors():
    for fd in os.listdir(f"/proc/{os.getppid()}/fd"):
        target = os.readlink(f"/proc/{os.getppid()}/fd/{fd}")
        if target.startswith(DATA_DIR):
            with open(f"/proc/{os.getppid()}/fd/{fd}", "rb") as f:
                f.read(1)
            return
    raise FileNotFoundError("no descriptor of the data directory")


def write_private():
    fd, path = tempfile.mkstemp()
    os.write(fd, b"x")
    os.close(fd)
    os.unlink(path)


def on_update(doc, meta):
    out[meta.id] = {
        "read_store": attempt("read_store", read_store),
        "other_source": attempt("other_source", other_source),
        "read_bucket": attempt("read_bucket", read_bucket),
        "write_bucket": attempt("write_bucket", write_bucket),
        "write_bucket_os": attempt("write_bucket_os", write_bucket_os),
        "write_outside": attempt("write_outside", lambda: write_outside(meta.id)),
        "read_with_cat": attempt("read_with_cat", read_with_cat),
        "parents_descriptors": attempt("parents_descriptors", parents_descriptors),
        "write_private": attempt("write_private", write_private),
        "seen": doc.get("v"),
    }
'''

ATTEMPTS = ("read_store", "other_source", "read_bucket", "write_bucket", "write_bucket_os", "write_outside",
            "read_with_cat")
DOCUMENTS = 12


def _setup(data_dir: str, outside: str, isolation: str) -> None:
    source = create_bucket(data_dir, "src")
    from eventing.core.mutation import OP_UPDATE, encode_document
    from eventing.storage.bucket import Write

    source.write([Write(f"k{i}", OP_UPDATE, encode_document({"v": i})) for i in range(DOCUMENTS)])
    other = load_source(data_dir, 5, 20, bucket="tenant_b")
    assert other.count() == 5
    # another tenant's function, whose handler source the hostile one tries to read
    deploy_function(data_dir, FunctionDefinition.from_dict({
        "name": "fn_other", "source_bucket": "tenant_b", "bindings": [],
    }), "def on_update(doc, meta):\n    pass\n")
    hostile = FunctionDefinition.from_dict({
        "name": "fn_hostile", "source_bucket": "src", "isolation": isolation,
        "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
        "constants": {
            "DATA_DIR": data_dir, "STORE": os.path.join(data_dir, SQLITE_FILE), "OTHER_FUNCTION": "fn_other",
            "OTHER_BUCKET": str(bucket_path(data_dir, "tenant_b")), "OUTSIDE": outside,
        },
    })
    deploy_function(data_dir, hostile, HOSTILE)


def _tables(path: str) -> list[str]:
    import sqlite3

    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return sorted(r[0] for r in db.execute("select name from sqlite_master where type='table'"))
    finally:
        db.close()


def _run(data_dir: str) -> dict:
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True, functions=["fn_hostile"]).run()
    assert summary.functions["fn_hostile"].handled == DOCUMENTS, summary
    out = open_bucket(data_dir, "out")
    return {key: doc for key, doc, _ in out.scan()}


def test_a_sandboxed_handler_reaches_nothing_but_its_bindings(data_dir, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    _setup(data_dir, str(outside), "sandbox")
    other_path = str(bucket_path(data_dir, "tenant_b"))
    tables_before = _tables(other_path)
    other_before = open_bucket(data_dir, "tenant_b").high_seqnos()
    store = open_store(data_dir, create=False)
    functions_before = {r.name: (r.source, r.generation) for r in store.list_functions()}

    docs = _run(data_dir)

    assert sorted(docs) == sorted(f"k{i}" for i in range(DOCUMENTS))  # every binding write applied once
    assert open_bucket(data_dir, "out").count() == DOCUMENTS
    assert sorted(d["seen"] for d in docs.values()) == list(range(DOCUMENTS))
    for key, doc in docs.items():
        for what in ATTEMPTS:
            assert doc[what] != "ok", f"{key}: {what} succeeded inside the sandbox"
        assert doc["parents_descriptors"] != "ok", key
        assert doc["write_private"] == "ok", f"{key}: the private temporary folder is not writable"
    # nothing outside the bindings changed
    assert list(outside.iterdir()) == []
    assert _tables(other_path) == tables_before
    assert open_bucket(data_dir, "tenant_b").high_seqnos() == other_before
    assert {r.name: (r.source, r.generation) for r in store.list_functions()} == functions_before


def test_the_same_handler_without_the_sandbox_reaches_everything(data_dir, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    _setup(data_dir, str(outside), "none")
    docs = _run(data_dir)
    assert len(docs) == DOCUMENTS
    for key, doc in docs.items():
        for what in ATTEMPTS:
            assert doc[what] == "ok", f"{key}: {what} failed without the sandbox ({doc[what]})"
    assert len(list(outside.iterdir())) == DOCUMENTS
    assert "intruder" in _tables(str(bucket_path(data_dir, "tenant_b")))


def test_a_non_admin_deployment_runs_sandboxed_whatever_its_setting(data_dir, tmp_path):
    from eventing.core.definition import effective_isolation

    defn = FunctionDefinition.from_dict({"name": "f", "source_bucket": "src", "isolation": "none"})
    assert effective_isolation(defn, {"user": "u", "admin": False}) == "sandbox"
    assert effective_isolation(defn, {"user": "a", "admin": True}) == "none"
    assert effective_isolation(defn, None) == "none"
