"""Sandboxed functions: a hostile handler that knows every path of the data directory cannot read the
metadata store, open another bucket's file for reading or writing, read another function's handler source
or write outside its private temporary folder; its binding writes still apply exactly once. The same
handler with "isolation": "none" succeeds at every attempt, so the refusals come from the sandbox."""

from __future__ import annotations

import os

import pytest

from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.storage.factory import create_bucket, open_bucket
from eventing.storage.files import bucket_path
from eventing.storage.values import Write
from eventing.testing import deploy_function, load_source
from eventing.workers.executor import InProcessExecutor
from eventing.workers.sandbox.landlock import sandbox_unavailable
from metadata.factory import SQLITE_FILE, open_store

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable())),
]

HOSTILE = """
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
"""

ATTEMPTS = (
    "read_store",
    "other_source",
    "read_bucket",
    "write_bucket",
    "write_bucket_os",
    "write_outside",
    "read_with_cat",
)
DOCUMENTS = 12


def _setup(data_dir: str, outside: str, isolation: str) -> None:
    source = create_bucket(data_dir, "src")
    source.write([Write(f"k{i}", OP_UPDATE, encode_document({"v": i})) for i in range(DOCUMENTS)])
    other = load_source(data_dir, 5, 20, bucket="tenant_b")
    assert other.count() == 5
    # another tenant's function, whose handler source the hostile one tries to read
    deploy_function(
        data_dir,
        FunctionDefinition.from_dict(
            {
                "name": "fn_other",
                "source_bucket": "tenant_b",
                "bindings": [],
            }
        ),
        "def on_update(doc, meta):\n    pass\n",
    )
    hostile = FunctionDefinition.from_dict(
        {
            "name": "fn_hostile",
            "source_bucket": "src",
            "isolation": isolation,
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
            "constants": {
                "DATA_DIR": data_dir,
                "STORE": os.path.join(data_dir, SQLITE_FILE),
                "OTHER_FUNCTION": "fn_other",
                "OTHER_BUCKET": str(bucket_path(data_dir, "tenant_b")),
                "OUTSIDE": outside,
            },
        }
    )
    deploy_function(data_dir, hostile, HOSTILE)


def _tables(path: str) -> list[str]:
    import sqlite3

    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return sorted(r[0] for r in db.execute("select name from sqlite_master where type='table'"))
    finally:
        db.close()


def _run(data_dir: str) -> dict:
    summary = EventingService(
        data_dir, InProcessExecutor(), until_caught_up=True, functions=["fn_hostile"]
    ).run()
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
    for default in ("sandbox", "none"):  # the machine's default (eventing.workers.sandbox.default)
        assert effective_isolation(defn, {"user": "u", "admin": False}, default) == "sandbox"
        assert effective_isolation(defn, {"user": "a", "admin": True}, default) == "none"
        assert effective_isolation(defn, None, default) == "none"


# -- the handler outside a worker: deploy-time import, on_deploy, dlq replay, the debugger ----------------

OUTSIDE_THE_WORKER = (
    HOSTILE
    + """

def probes(where):
    return {
        "read_store": attempt("read_store", read_store),
        "other_source": attempt("other_source", other_source),
        "read_bucket": attempt("read_bucket", read_bucket),
        "write_bucket": attempt("write_bucket", write_bucket),
        "write_outside": attempt("write_outside", lambda: write_outside(where)),
        "read_with_cat": attempt("read_with_cat", read_with_cat),
    }


# top-level code: runs at every import (deploy-time validation, on_deploy, replay, the debugger)
AT_IMPORT = probes(f"import-{os.getpid()}")


def on_deploy(action):
    out["on_deploy"] = {"import": AT_IMPORT, "call": probes("on_deploy"), "action": action.reason}


def on_update(doc, meta):
    if ctl.get("mode", {}).get("fail"):
        raise RuntimeError("failing on purpose")
    out[meta.id] = {"import": AT_IMPORT, "call": probes(meta.id), "seen": doc.get("v")}
"""
)

PROBES = ("read_store", "other_source", "read_bucket", "write_bucket", "write_outside", "read_with_cat")


def _setup_outside(data_dir: str, outside: str, isolation: str) -> None:
    source = create_bucket(data_dir, "src")
    source.write([Write(f"k{i}", OP_UPDATE, encode_document({"v": i})) for i in range(DOCUMENTS)])
    create_bucket(data_dir, "ctl").upsert("mode", {"fail": True})
    load_source(data_dir, 5, 20, bucket="tenant_b")
    deploy_function(
        data_dir,
        FunctionDefinition.from_dict(
            {
                "name": "fn_other",
                "source_bucket": "tenant_b",
                "bindings": [],
            }
        ),
        "def on_update(doc, meta):\n    pass\n",
    )
    hostile = FunctionDefinition.from_dict(
        {
            "name": "fn_hostile",
            "source_bucket": "src",
            "isolation": isolation,
            "bindings": [
                {"alias": "out", "bucket": "out", "access": "rw"},
                {"alias": "ctl", "bucket": "ctl"},
            ],
            "constants": {
                "DATA_DIR": data_dir,
                "STORE": os.path.join(data_dir, SQLITE_FILE),
                "OTHER_FUNCTION": "fn_other",
                "OTHER_BUCKET": str(bucket_path(data_dir, "tenant_b")),
                "OUTSIDE": outside,
            },
        }
    )
    deploy_function(data_dir, hostile, OUTSIDE_THE_WORKER)  # validation at save and deploy, then on_deploy


def _outside_the_worker(data_dir: str, outside) -> dict:
    """Deployed (on_deploy ran), a debug trace of one mutation, every mutation dead-lettered, then replayed
    once the handler stops failing (and a second replay applies nothing)."""
    from eventing.ops.debugger import DebugSession
    from eventing.ops.dlq import DlqSelector, replay

    out = open_bucket(data_dir, "out")
    deployed = out.get("on_deploy")
    open_bucket(data_dir, "ctl").upsert("mode", {"fail": False})
    session = DebugSession(data_dir, "fn_hostile", key="k3")
    traced = session.run()
    assert traced.status == "ok", traced
    assert [e["event"] for e in session.events][:2] == ["pulled", "call"]
    assert any(e["event"] == "read" and e["key"] == "mode" for e in session.events)
    (held,) = [w for w in session.report()["writes"] if w["key"] == "k3"]
    assert out.get("k3") is None  # held, not applied
    open_bucket(data_dir, "ctl").upsert("mode", {"fail": True})
    summary = EventingService(
        data_dir, InProcessExecutor(), until_caught_up=True, functions=["fn_hostile"]
    ).run()
    assert summary.functions["fn_hostile"].handled == DOCUMENTS
    assert out.count() == 1  # only on_deploy's document: every mutation failed
    open_bucket(data_dir, "ctl").upsert("mode", {"fail": False})
    report = replay(data_dir, "fn_hostile", DlqSelector(everything=True))
    assert (report.selected, report.replayed, report.writes_applied) == (DOCUMENTS, DOCUMENTS, DOCUMENTS), (
        report
    )
    again = replay(data_dir, "fn_hostile", DlqSelector(everything=True))
    assert (again.replayed, again.writes_applied) == (0, 0)
    replayed = {key: doc for key, doc, _ in out.scan() if key != "on_deploy"}
    assert sorted(d["seen"] for d in replayed.values()) == list(range(DOCUMENTS))
    assert out.count() == DOCUMENTS + 1
    return {"on_deploy": deployed, "debug": held["doc"], "replay": replayed}


def test_deploy_time_code_on_deploy_replay_and_debugger_run_sandboxed(data_dir, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    _setup_outside(data_dir, str(outside), "sandbox")
    other_before = open_bucket(data_dir, "tenant_b").high_seqnos()
    tables_before = _tables(str(bucket_path(data_dir, "tenant_b")))
    seen = _outside_the_worker(data_dir, outside)
    assert seen["on_deploy"]["action"] == "deploy"
    results = [
        seen["on_deploy"]["import"],
        seen["on_deploy"]["call"],
        seen["debug"]["import"],
        seen["debug"]["call"],
        *(d[part] for d in seen["replay"].values() for part in ("import", "call")),
    ]
    for probed in results:
        for what in PROBES:
            assert probed[what] != "ok", f"{what} succeeded in the sandbox: {probed}"
    assert list(outside.iterdir()) == []  # nor did the imports at validation write anything
    assert open_bucket(data_dir, "tenant_b").high_seqnos() == other_before
    assert _tables(str(bucket_path(data_dir, "tenant_b"))) == tables_before


def test_deploy_time_code_on_deploy_replay_and_debugger_without_the_sandbox(data_dir, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    _setup_outside(data_dir, str(outside), "none")
    seen = _outside_the_worker(data_dir, outside)
    results = [
        seen["on_deploy"]["import"],
        seen["on_deploy"]["call"],
        seen["debug"]["import"],
        seen["debug"]["call"],
        *(d[part] for d in seen["replay"].values() for part in ("import", "call")),
    ]
    for probed in results:
        for what in PROBES:
            assert probed[what] == "ok", f"{what} failed without the sandbox: {probed}"
    names = {p.name for p in outside.iterdir()}
    assert "on_deploy.txt" in names and "k3.txt" in names
    assert sum(n.startswith("import-") for n in names) >= 1  # validation imported it here


# -- on the Ray executor -----------------------------------------------------------------------------------

RAY_PROBE = """
import os


def attempt(fn):
    try:
        fn()
        return "ok"
    except Exception as exc:
        return type(exc).__name__


def read_ray_logs():
    names = [n for n in os.listdir(RAY_LOGS) if n.endswith(".out") or n.endswith(".err")]
    with open(os.path.join(RAY_LOGS, names[0]), "rb") as f:
        f.read(1)


def on_update(doc, meta):
    out[meta.id] = {"ray_logs": attempt(read_ray_logs), "seen": doc.get("v")}
"""


def test_sandboxed_workers_on_ray_killed_with_kill_9_lose_nothing_and_cannot_read_rays_folders(
    data_dir, tmp_path, ray_executor
):
    import signal
    import threading
    import time

    import ray

    from eventing.testing import LEDGER_HANDLER, check_ledger, ledger_definition, wait_for

    logs = os.path.join(ray._private.worker.global_worker.node.get_session_dir_path(), "logs")
    assert any(n.endswith((".out", ".err")) for n in os.listdir(logs))  # readable here, outside the sandbox
    source = load_source(data_dir, 300, 3000, seed=5)
    create_bucket(data_dir, "src_probe").write(
        [Write(f"p{i}", OP_UPDATE, encode_document({"v": i})) for i in range(4)]
    )
    deploy_function(
        data_dir,
        ledger_definition("fn_k", "src", "ledger", workers=2, sleep_ms=2, batch_size=50, isolation="sandbox"),
        LEDGER_HANDLER,
    )
    deploy_function(
        data_dir,
        FunctionDefinition.from_dict(
            {
                "name": "fn_probe",
                "source_bucket": "src_probe",
                "isolation": "sandbox",
                "worker_count": 1,
                "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
                "constants": {"RAY_LOGS": logs},
            }
        ),
        RAY_PROBE,
    )
    service = EventingService(data_dir, ray_executor, until_caught_up=True)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(summary=service.run()))
    thread.start()
    killed = 0
    try:
        while killed < 2 and thread.is_alive():
            wait_for(
                lambda: (
                    (sup := service.supervisors.get("fn_k")) is not None
                    and all(s.ready and s.pid for s in sup.slots.values())
                    or not thread.is_alive()
                ),
                "fn_k's sandboxed workers are up",
                timeout=120,
            )
            slot = service.supervisors["fn_k"].slots[f"local/w{killed}"] if thread.is_alive() else None
            if slot is None or slot.caught_up:
                break
            time.sleep(0.5)
            os.kill(slot.pid, signal.SIGKILL)  # the Ray worker hosting the sandbox; its child goes with it
            killed += 1
    finally:
        thread.join(timeout=300)
    assert killed == 2, "fn_k caught up before both kills: give it more mutations"
    assert not result["summary"].errors, result["summary"].errors
    report = check_ledger(source, open_bucket(data_dir, "ledger"))
    assert report.ok and report.handled == 3000, report.summary()
    probes = {key: doc for key, doc, _ in open_bucket(data_dir, "out").scan()}
    assert len(probes) == 4 and {d["ray_logs"] for d in probes.values()} == {"PermissionError"}, probes
