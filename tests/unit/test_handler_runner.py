"""One handler runner for workers, the debugger and DLQ replay: the three run a handler the same way.

The handler writes through one alias and reads back through a second alias of the same bucket, so it
sees its own write only if both aliases share the effect buffer (as a worker's always did; the debugger's
and replay's copies once did not)."""

from __future__ import annotations

import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.ops import dlq
from eventing.ops.debugger import DebugSession
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.workers.executor import InProcessExecutor

TWO_ALIASES = """
def on_update(doc, meta):
    if FAIL:
        raise RuntimeError("failing until the handler is fixed")
    first[meta.id] = {"rev": doc["rev"]}
    seen = second.get(meta.id)
    second[meta.id + "#check"] = {"saw_own_write": seen is not None, "rev": doc["rev"]}
"""


def definition(name: str, dst: str, fail: bool) -> FunctionDefinition:
    return FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": "src",
            "bindings": [
                {"alias": "first", "bucket": dst, "access": "rw"},
                {"alias": "second", "bucket": dst, "access": "rw"},
            ],
            "constants": {"FAIL": fail},
            "retries": 0,
        }
    )


def run_until_caught_up(data_dir: str) -> None:
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors, summary.errors


def docs_of(bucket: LocalBucket) -> dict[str, dict]:
    return {key: bucket.get(key) for key in bucket.keys()}


@pytest.fixture
def data_dir(tmp_path) -> str:
    path = str(tmp_path / "data")
    LocalBucket.create(path, "src").upsert("doc1", {"rev": 7})
    return path


def test_worker_debugger_and_replay_run_a_handler_alike(data_dir):
    # 1. A live worker.
    deploy_function(data_dir, definition("fn_worker", "by_worker", fail=False), TWO_ALIASES)
    # 2. The debugger, on a deployed (paused) function whose worker has not handled the mutation yet.
    deploy_function(data_dir, definition("fn_debug", "by_debugger", fail=False), TWO_ALIASES)
    lifecycle.pause(data_dir, "fn_debug")
    # 3. DLQ replay: the first handler fails, the fixed one is replayed.
    deploy_function(data_dir, definition("fn_replay", "by_replay", fail=True), TWO_ALIASES)
    run_until_caught_up(data_dir)

    session = DebugSession(data_dir, "fn_debug", apply=True)
    outcome = session.run()
    assert outcome.status == "ok"

    lifecycle.pause(data_dir, "fn_replay")
    lifecycle.save_function(data_dir, definition("fn_replay", "by_replay", fail=False), TWO_ALIASES)
    report = dlq.replay(data_dir, "fn_replay", dlq.DlqSelector(everything=True))
    assert report.replayed == 1 and report.failed == 0

    by_worker = docs_of(LocalBucket.open(data_dir, "by_worker"))
    assert by_worker == {"doc1": {"rev": 7}, "doc1#check": {"saw_own_write": True, "rev": 7}}
    assert docs_of(LocalBucket.open(data_dir, "by_debugger")) == by_worker
    assert docs_of(LocalBucket.open(data_dir, "by_replay")) == by_worker
    # The debugger lists each write once, though two aliases name the bucket.
    assert [(w.write.key, w.bucket.name) for w in session.writes] == [
        ("doc1", "by_debugger"),
        ("doc1#check", "by_debugger"),
    ]
