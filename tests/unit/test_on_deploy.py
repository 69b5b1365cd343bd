"""on_deploy(action): runs once on deploy and on resume before any mutation; its writes apply once; a
failure keeps the function undeployed (deploy) or paused (resume) with the error shown."""

from __future__ import annotations

import time

import pytest

from eventing.control import lifecycle
from eventing.core.definition import FunctionDefinition
from eventing.errors import LifecycleError
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata import FunctionState
from metadata.factory import open_store
from sharding import NUM_VBUCKETS

HANDLER = """
import time

def on_deploy(action):
    if dst.get("fail_" + action.reason):
        raise RuntimeError("setup failed on " + action.reason)
    dst.increment("runs|" + action.reason)
    dst["last"] = {"reason": action.reason, "delay": action.delay}
    create_timer(tick, time.time(), "boot", {"reason": action.reason})

def tick(context):
    dst["ticked|" + context["reason"]] = {"ok": True}

def on_update(doc, meta):
    dst["seen|" + meta.id] = {"ok": True}
"""


def defn() -> FunctionDefinition:
    return FunctionDefinition.from_dict(
        {
            "name": "fn_d",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
        }
    )


def test_on_deploy_runs_once_on_deploy_and_on_resume_and_its_timers_fire(data_dir):
    LocalBucket.create(data_dir, "src")
    deploy_function(data_dir, defn(), HANDLER)
    dst = LocalBucket.open(data_dir, "dst")
    assert dst.get("runs|deploy") == {"count": 1} and dst.get("last")["reason"] == "deploy"
    store = open_store(data_dir)
    assert store.get_timer("fn_d", "tick", "boot") is not None
    w = WorkerCore(
        WorkerSpec(
            data_dir, "fn_d", store.get_function("fn_d").generation, "n/w0", tuple(range(NUM_VBUCKETS))
        )
    )
    w.step()
    w.commit()
    assert dst.get("ticked|deploy") == {"ok": True}
    w.stop()
    lifecycle.pause(data_dir, "fn_d")
    time.sleep(1.1)
    lifecycle.resume(data_dir, "fn_d")
    assert dst.get("runs|resume") == {"count": 1} and dst.get("last") == {"reason": "resume", "delay": 1}
    assert dst.get("runs|deploy") == {"count": 1}


def test_a_failing_on_deploy_keeps_the_function_undeployed_or_paused_with_the_error(data_dir):
    LocalBucket.create(data_dir, "src")
    dst = LocalBucket.create(data_dir, "dst")
    dst.upsert("fail_deploy", {"yes": True})
    with pytest.raises(
        LifecycleError, match="on_deploy of function 'fn_d' failed .RuntimeError: setup failed on deploy"
    ):
        deploy_function(data_dir, defn(), HANDLER)
    store = open_store(data_dir)
    assert store.get_function("fn_d").state is FunctionState.UNDEPLOYED
    assert store.checkpoints("fn_d") == {}
    dst.delete("fail_deploy")
    lifecycle.deploy(data_dir, "fn_d")
    lifecycle.pause(data_dir, "fn_d")
    dst.upsert("fail_resume", {"yes": True})
    with pytest.raises(LifecycleError, match="stays paused"):
        lifecycle.resume(data_dir, "fn_d")
    assert store.get_function("fn_d").state is FunctionState.PAUSED
