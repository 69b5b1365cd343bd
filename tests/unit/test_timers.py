"""Durable timers on the in-process runtime: create, overwrite, cancel, fire once (also across a crash
between firing and recording), fencing of a stale owner, pause keeps and undeploy drops, dead letters and
their replay, and the bad input a handler gets as a TimerError."""

from __future__ import annotations

import time

import pytest

from eventing.control import lifecycle
from eventing.core.definition import FunctionDefinition
from eventing.ops import dlq as dlq_ops
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata import TIMER_VB_BASE
from metadata.factory import open_store
from sharding import NUM_VBUCKETS

HANDLER = """
import time

def on_update(doc, meta):
    if doc.get("cancel"):
        dst["cancelled|" + meta.id] = {"found": cancel_timer(fire, meta.id)}
        return
    create_timer(fire, time.time() + doc.get("delay", 0), meta.id, {"id": meta.id, "rev": doc.get("rev", 0)})

def fire(context):
    if context.get("rev") == "boom" and not dst.get("fixed"):
        raise RuntimeError("callback failed for " + context["id"])
    if context.get("rev") == "hang":
        time.sleep(5)
    dst["fired|" + context["id"]] = {"rev": context["rev"], "at": time.time()}
"""


def definition(name: str = "fn_t", **extra) -> FunctionDefinition:
    return FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
            "checkpoint_interval": "1h",
            **extra,
        }
    )


def setup(data_dir: str, handler: str = HANDLER, **extra) -> LocalBucket:
    source = LocalBucket.create(data_dir, "src", exist_ok=True)
    deploy_function(data_dir, definition(**extra), handler)
    return source


def worker(data_dir: str, name: str = "fn_t", wid: str = "n/w0") -> WorkerCore:
    store = open_store(data_dir)
    generation = store.get_function(name).generation
    store.close()
    return WorkerCore(WorkerSpec(data_dir, name, generation, wid, tuple(range(NUM_VBUCKETS))))


def settle(w: WorkerCore, rounds: int = 3) -> None:
    """Handle everything, commit (timers become durable), fire what is due, commit again."""
    for _ in range(rounds):
        w.step()
        w.commit()


def fired(data_dir: str) -> dict[str, int]:
    return LocalBucket.open(data_dir, "dst").logged_writes("fired|")


def test_a_timer_fires_once_after_its_commit_with_its_context(data_dir):
    source = setup(data_dir)
    for i in range(20):
        source.upsert(f"k{i}", {"rev": i})
    w = worker(data_dir)
    w.step()
    assert fired(data_dir) == {}  # created, but not durable before the commit: nothing fires yet
    settle(w)
    assert fired(data_dir) == {f"fired|k{i}": 1 for i in range(20)}
    dst = LocalBucket.open(data_dir, "dst")
    assert dst.get("fired|k7")["rev"] == 7
    store = open_store(data_dir)
    assert store.timer_backlog("fn_t", int(time.time() * 1000)) == {"pending": 0, "due": 0}
    counters = store.counters("fn_t")
    assert (counters["timers_created"], counters["timers_fired"]) == (20, 20)
    assert sum(v for k, v in counters.items() if k.startswith("timer_delay_")) == 20


def test_a_future_timer_waits_and_the_same_callback_and_reference_overwrites(data_dir):
    source = setup(data_dir)
    source.upsert("a", {"rev": 1, "delay": 0.6})
    source.upsert("a", {"rev": 2, "delay": 0.6})  # same (fire, "a"): replaces the first
    w = worker(data_dir)
    settle(w)
    assert fired(data_dir) == {}
    time.sleep(0.7)
    settle(w)
    assert fired(data_dir) == {"fired|a": 1}
    assert LocalBucket.open(data_dir, "dst").get("fired|a")["rev"] == 2


def test_cancel_timer_removes_a_pending_timer_and_says_whether_there_was_one(data_dir):
    source = setup(data_dir)
    source.upsert("a", {"rev": 1, "delay": 60})
    w = worker(data_dir)
    settle(w)
    source.upsert("a", {"cancel": True})
    source.upsert("b", {"cancel": True})
    settle(w)
    dst = LocalBucket.open(data_dir, "dst")
    assert dst.get("cancelled|a") == {"found": True} and dst.get("cancelled|b") == {"found": False}
    store = open_store(data_dir)
    assert store.get_timer("fn_t", "fire", "a") is None
    assert store.counters("fn_t")["timers_cancelled"] == 1


def test_a_crash_between_firing_and_recording_fires_again_without_duplicate_effects(data_dir):
    source = setup(data_dir)
    for i in range(10):
        source.upsert(f"k{i}", {"rev": i})
    first = worker(data_dir)
    first.step()
    first.commit()  # timers durable
    assert first.fire_timers() == 10
    first.flush_effects()  # effects applied ... and the process dies before the commit records them
    assert fired(data_dir) == {f"fired|k{i}": 1 for i in range(10)}
    second = worker(data_dir, wid="n/w1")  # takes over with higher epochs, reclaims the claimed timers
    settle(second)
    assert fired(data_dir) == {f"fired|k{i}": 1 for i in range(10)}  # still once each
    store = open_store(data_dir)
    assert store.timer_backlog("fn_t", 10**13)["pending"] == 0
    assert store.counters("fn_t")["effects_duplicate"] == 10
    # The old owner is a zombie now: it can neither claim timers nor record them.
    assert first.fire_timers() == 0


def test_pause_keeps_timers_and_resume_fires_past_due_ones_undeploy_drops_them(data_dir):
    source = setup(data_dir)
    source.upsert("a", {"rev": 1, "delay": 0.3})
    source.upsert("b", {"rev": 1, "delay": 3600})
    w = worker(data_dir)
    settle(w)
    w.stop()
    lifecycle.pause(data_dir, "fn_t")
    time.sleep(0.4)
    lifecycle.resume(data_dir, "fn_t")
    settle(worker(data_dir, wid="n/w1"))
    assert fired(data_dir) == {"fired|a": 1}  # past due on resume: fired then
    store = open_store(data_dir)
    assert store.get_timer("fn_t", "fire", "b") is not None
    lifecycle.undeploy(data_dir, "fn_t")
    assert store.timer_backlog("fn_t", 10**13) == {"pending": 0, "due": 0}


def test_a_failing_callback_goes_to_the_dlq_with_its_context_and_replay_runs_it(data_dir):
    source = setup(data_dir)
    source.upsert("bad", {"rev": "boom"})
    w = worker(data_dir)
    settle(w)
    store = open_store(data_dir)
    (row,) = store.dlq_rows("fn_t")
    assert (row.reason, row.vb >= TIMER_VB_BASE, row.key) == ("timer_error", True, "bad")
    assert "callback failed for bad" in row.error
    view = dlq_ops.row_view(row, full=True)
    assert view["mutation"]["op"] == "timer" and view["mutation"]["doc"]["context"] == {
        "id": "bad",
        "rev": "boom",
    }
    assert store.timer_backlog("fn_t", 10**13)["pending"] == 0  # done: dead-lettered, not retried forever
    LocalBucket.open(data_dir, "dst").upsert("fixed", {"yes": True})
    report = dlq_ops.replay(data_dir, "fn_t", dlq_ops.DlqSelector(reason="timer_error"))
    assert (report.replayed, report.failed) == (1, 0)
    assert fired(data_dir) == {"fired|bad": 1}


def test_a_callback_past_execution_timeout_is_dead_lettered_as_timeout(data_dir):
    source = setup(data_dir, execution_timeout="300ms")
    source.upsert("slow", {"rev": "hang"})
    w = worker(data_dir)
    settle(w)
    (row,) = open_store(data_dir).dlq_rows("fn_t")
    assert row.reason == "timeout" and row.vb >= TIMER_VB_BASE


BAD_INPUT = """
import datetime

def on_update(doc, meta):
    errors = {}
    attempts = {
        "lambda": lambda: create_timer(lambda c: None, 0),
        "not_module": lambda: create_timer(print, 0),
        "when": lambda: create_timer(fire, "tomorrow"),
        "bool_when": lambda: create_timer(fire, True),
        "context_json": lambda: create_timer(fire, 0, "r", {"s": {1, 2}}),
        "context_size": lambda: create_timer(fire, 0, "r", "x" * 200),
        "reference": lambda: create_timer(fire, 0, 42),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
        except Exception as exc:
            errors[name] = type(exc).__name__ + ": " + str(exc)
    dst["errors"] = errors
    create_timer(fire, datetime.datetime.now() - datetime.timedelta(seconds=1))  # a generated reference

def fire(context):
    dst["fired|auto"] = {"ok": True}
"""


def test_bad_timer_input_raises_one_clear_timer_error_the_handler_can_catch(data_dir):
    source = setup(data_dir, BAD_INPUT, timer_context_size=100)
    source.upsert("a", {"n": 1})
    settle(worker(data_dir))
    errors = LocalBucket.open(data_dir, "dst").get("errors")
    assert set(errors) == {
        "lambda",
        "not_module",
        "when",
        "bool_when",
        "context_json",
        "context_size",
        "reference",
    }
    assert all(e.startswith("TimerError: ") for e in errors.values()), errors
    assert "not a function defined in the handler module" in errors["lambda"]
    assert "not a time" in errors["when"] and "not a time" in errors["bool_when"]
    assert "not a JSON value" in errors["context_json"]
    assert "timer_context_size is 100" in errors["context_size"]
    assert fired(data_dir) == {"fired|auto": 1}


def test_timer_context_size_must_be_positive():
    with pytest.raises(Exception, match="timer_context_size of function 'fn_t' must be an integer >= 1"):
        definition(timer_context_size=0)


PAST_TIMERS = """
import time

def on_update(doc, meta):
    # The reference is another key, so the timer's vBucket is often another worker's.
    create_timer(fire, time.time() - 60, "other-" + meta.id, {"id": meta.id})

def fire(context):
    dst["fired|" + context["id"]] = {"id": context["id"]}
"""


@pytest.mark.parametrize("workers", [1, 3])
def test_run_until_caught_up_fires_the_timers_already_due(data_dir, workers):
    """Caught up includes due timers: a timer created for the past fires before the run says caught up,
    also when another worker, already caught up, owns the timer's vBucket."""
    from eventing.api import Eventing

    source = setup(data_dir, PAST_TIMERS, worker_count=workers)
    for i in range(30):
        source.upsert(f"k{i}", {"rev": i})
    app = Eventing(data_dir, executor="in-process")
    app.run(until_caught_up=True)
    assert fired(data_dir) == {f"fired|k{i}": 1 for i in range(30)}
    with open_store(data_dir) as store:
        assert store.timer_backlog("fn_t", int(time.time() * 1000)) == {"pending": 0, "due": 0}
