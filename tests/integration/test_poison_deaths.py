"""Poison mutations with real process deaths: a handler that ends its process on one document (os._exit) in a
Ray worker, in an in-process `eventing run`, in a sandboxed child (ending itself, or sending its host a frame
that is no value); and JavaScript throws on Ray that STPyV8 would hand over as objects Ray cannot pickle.
Each time the poison document is dead-lettered (`crashed` after its worker died on it twice alone; `error` for
a throw) and every other mutation is handled exactly once (the ledger), so the function goes on. A sandboxed
handler that fills its private folder past EVENTING_SANDBOX_DISK_MB is ended by its host the same way."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.ops import dlq as dlq_ops
from eventing.storage.factory import create_bucket, open_bucket
from eventing.testing import LEDGER_HANDLER, check_ledger, deploy_function, ledger_definition
from eventing.workers.executor import InProcessExecutor
from eventing.workers.sandbox.landlock import sandbox_unavailable
from metadata.factory import open_store
from sharding import vbucket_of

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

# The ledger handler with a poison document; DEATH says how its process dies.
POISONED = (
    LEDGER_HANDLER
    + """

def _die():
    import os
    if DEATH == "exit":
        os._exit(7)
    if DEATH == "disk":  # fills its private folder until its host ends it (EVENTING_SANDBOX_DISK_MB)
        import tempfile, time
        folder = tempfile.mkdtemp()
        for i in range(10_000):
            with open(os.path.join(folder, f"f{i}"), "wb") as f:
                f.write(b"x" * (4 << 20))
            time.sleep(0.02)
    import socket, struct, sys  # a sandboxed child: a frame its host cannot read as values
    line = socket.socket(fileno=int(sys.argv[1]))
    line.sendall(struct.pack("!Q", 5) + b"junk!")
    import time
    time.sleep(30)


_on_update = on_update


def on_update(doc, meta):
    if meta.id == "poison":
        _die()
    _on_update(doc, meta)
"""
)


def poisoned(data_dir: str, *, death: str = "exit", documents: int = 300, **settings) -> None:
    source = create_bucket(data_dir, "src")
    for i in range(documents):
        source.upsert("poison" if i == documents // 2 else f"k{i}", {"rev": i})
    source.close()
    defn = ledger_definition("fn_p", "src", "ledger", batch_size=50, **settings)
    defn = FunctionDefinition.from_dict({**defn.to_dict(), "constants": {**defn.constants, "DEATH": death}})
    deploy_function(data_dir, defn, POISONED)


def check_poison_dead_lettered(data_dir: str, documents: int = 300) -> None:
    letters = dlq_ops.list_rows(data_dir, "fn_p")
    assert [(r.key, r.reason) for r in letters] == [("poison", "crashed")]
    assert open_store(data_dir).deaths("fn_p") == {(vbucket_of("poison"), letters[0].seqno): 2}
    report = check_ledger(
        open_bucket(data_dir, "src"),
        open_bucket(data_dir, "ledger"),
        dead_letters=[(r.vb, r.seqno) for r in letters],
    )
    assert report.ok, report.summary()
    assert report.handled == documents - 1 and report.dead_lettered == 1


def test_a_ray_worker_that_dies_on_one_mutation_dead_letters_it_and_goes_on(data_dir, ray_executor):
    poisoned(data_dir, workers=2)
    started = time.monotonic()
    summary = EventingService(data_dir, ray_executor, until_caught_up=True).run()
    assert not summary.errors, summary.errors
    check_poison_dead_lettered(data_dir)
    assert time.monotonic() - started < 60


def test_an_in_process_run_that_dies_on_one_mutation_exits_until_it_is_dead_lettered(data_dir):
    poisoned(data_dir)
    command = [
        sys.executable,
        "-m",
        "eventing",
        "--data-dir",
        data_dir,
        "run",
        "--executor",
        "in-process",
        "--until-caught-up",
    ]
    codes = []
    while not codes or codes[-1] == 7:
        assert len(codes) < 6, f"the run kept dying: exit codes {codes}"
        codes.append(subprocess.run(command, cwd=ROOT, capture_output=True, timeout=120).returncode)
    # The poison's vBucket holds no other document: each death names it. The third run dead-letters it (exit
    # 3: the run finished with dead letters); the next finds nothing left to do.
    assert codes == [7, 7, 3]
    check_poison_dead_lettered(data_dir)
    assert subprocess.run(command, cwd=ROOT, capture_output=True, timeout=120).returncode == 0


@pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable()))
@pytest.mark.parametrize("death", ["exit", "malformed frame", "disk"])
def test_a_sandboxed_child_that_dies_on_one_mutation_dead_letters_it(data_dir, death, monkeypatch):
    monkeypatch.setenv("EVENTING_SANDBOX_DISK_MB", "24")
    poisoned(data_dir, death=death, documents=120, workers=1, isolation="sandbox")
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors, summary.errors
    check_poison_dead_lettered(data_dir, documents=120)


def test_javascript_throws_ray_could_not_return_are_ordinary_dead_letters_on_ray(data_dir, ray_executor):
    pytest.importorskip("STPyV8")
    source = """
function trap() { throw new Error('trap'); }
function OnUpdate(doc, meta) {
    if (meta.id === 'cyclic') { var o = {}; o.self = o; throw o; }
    if (meta.id === 'proxy') { throw new Proxy({}, {get: trap, getPrototypeOf: trap, ownKeys: trap}); }
    ledger['e|' + meta.id] = doc;
}
"""
    src = create_bucket(data_dir, "src")
    keys = [f"k{i}" for i in range(200)] + ["cyclic", "proxy"]
    for key in keys:
        src.upsert(key, {"key": key})
    deploy_function(
        data_dir,
        FunctionDefinition.from_dict(
            {
                "name": "fn_js",
                "source_bucket": "src",
                "language": "javascript",
                "worker_count": 2,
                "bindings": [{"alias": "ledger", "bucket": "ledger", "access": "rw"}],
            }
        ),
        source,
    )
    summary = EventingService(data_dir, ray_executor, until_caught_up=True).run()
    assert not summary.errors, summary.errors
    letters = dlq_ops.list_rows(data_dir, "fn_js")
    assert sorted((r.key, r.reason) for r in letters) == [("cyclic", "error"), ("proxy", "error")]
    assert sorted(open_bucket(data_dir, "ledger").keys()) == sorted(f"e|k{i}" for i in range(200))
    counters = open_store(data_dir).counters("fn_js")
    assert counters["on_update_success"] == 200 and counters.get("workers_recycled", 0) == 0
