"""The call in flight (eventing.execution.context.CallContext) is what curl, timers and log() read: they
work from a bare context, without a HandlerRunner, and no longer import the runner."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import eventing.execution.context as context_module
import eventing.execution.curl as curl_module
import eventing.execution.timers as timers_module
from eventing.core.mutation import OP_UPDATE, Mutation
from eventing.errors import CurlError
from eventing.execution.context import CallContext, LaneContext
from eventing.execution.curl import CurlClient, UrlBinding
from eventing.execution.runner import HandlerTimeout
from eventing.execution.timers import TimerTable
from metadata import owner_vb


def mutation(vb: int, seqno: int, key: str = "k") -> Mutation:
    return Mutation(vb, seqno, key, OP_UPDATE, 1, b"\x80", None, 0, 0)


def imports_of(module) -> set[str]:
    tree = ast.parse(Path(module.__file__).read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def test_curl_and_timers_do_not_import_the_runner():
    for module in (curl_module, timers_module):
        assert "eventing.execution.runner" not in imports_of(module), module.__name__


def test_begin_sets_the_mutation_epoch_and_deadline():
    context = CallContext(timeout_s=2.0)
    assert context.mutation is None and not context.active
    assert context.remaining_s() == 2.0  # outside a call: the whole execution_timeout
    before = time.monotonic()
    context.begin(mutation(7, 3), epoch=5)
    assert context.active and context.epoch == 5 and context.mutation == mutation(7, 3)
    assert before + 2.0 <= context.deadline <= time.monotonic() + 2.0
    assert 0 < context.remaining_s() <= 2.0


def handler_module(table: TimerTable):
    def on_timer(context):
        return context

    table.module = {"on_timer": on_timer}
    return on_timer


def test_a_timer_takes_its_source_and_default_reference_from_the_call_in_flight():
    context = CallContext(timeout_s=1.0)
    table = TimerTable("fn", 1024, context)
    on_timer = handler_module(table)
    assert table.create_timer(on_timer, 10) == "fn:deploy:0"  # outside a call (on_deploy)
    context.begin(mutation(12, 40), epoch=1)
    assert table.create_timer(on_timer, 10) == "fn:12:40:1"
    assert [c.source_vb for c in table.current] == [0, owner_vb(12)]


def test_curl_gives_a_call_what_is_left_of_its_deadline():
    context = CallContext(timeout_s=30.0)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts connections, never answers
        api = UrlBinding("api", f"http://127.0.0.1:{silent.getsockname()[1]}")
        client = CurlClient(context, [api], 1024)
        context.begin(mutation(1, 1), epoch=1)
        context.deadline = time.monotonic() - 1.0  # the call already overran execution_timeout
        started = time.monotonic()
        with pytest.raises(CurlError, match="timed out"):
            client("GET", api)
        assert time.monotonic() - started < 5.0  # the shortest wait, not the 30 s a fresh call may take


# A pool call's timeout (concurrency > 1), then a tracer: on CPython 3.11 a timeout cancelled with
# PyThreadState_SetAsyncExc(ident, NULL) left the interpreter's async-exception flag set, and the first traced
# function afterwards looped for ever (pdb, profilers and coverage all trace).
TRACED_AFTER_A_POOL_TIMEOUT = '''
import sys, tempfile
from eventing.api import Eventing
from eventing.ops import dlq as dlq_ops

handler = """
import time


def on_update(doc, meta):
    if meta.id == "hang":
        while True:
            time.sleep(0.005)
    dst[meta.id] = doc
"""
data_dir = tempfile.mkdtemp()
app = Eventing(data_dir, executor="in-process")
app.create_bucket("src")
app.create_bucket("dst")
for key in ("a", "hang", "b", "c"):
    app.upsert("src", key, {"k": key})
app.deploy({"name": "fn_t", "source_bucket": "src", "concurrency": 2, "execution_timeout": "200ms",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}]}, handler)
summary = app.run(until_caught_up=True)
assert not summary.errors, summary.errors
assert [(r.key, r.reason) for r in dlq_ops.list_rows(data_dir, "fn_t")] == [("hang", "timeout")]

events = []


def tracer(frame, event, arg):
    events.append(event)
    return tracer


def traced():
    total = 0
    for i in range(1000):
        total += i
    return total


sys.settrace(tracer)
result = traced()
sys.settrace(None)
print("traced", result, len(events) > 1000)
'''


def test_a_tracer_runs_after_a_pool_calls_timeout(tmp_path):
    script = tmp_path / "traced.py"
    script.write_text(TRACED_AFTER_A_POOL_TIMEOUT)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["traced", "499500", "True"]


def test_a_timeout_raised_as_the_call_ends_lands_in_finish_and_nowhere_after():
    """The watcher raised into the call just before it ended: the exception lands in `finish` (raised out of
    it, as from the call's end), never later in the pool's own code, and nothing is left pending."""
    lane = LaneContext(timeout_s=0.01)
    entering, outcome = threading.Event(), []

    def pool_thread() -> None:
        lane.bind()
        lane.begin(mutation(1, 1), epoch=1)
        entering.set()
        try:
            lane.finish()  # blocks on the lock the watcher holds below, then the timeout lands
        except HandlerTimeout:
            outcome.append("landed in finish")
        total = 0
        for i in range(10000):  # the pool's code after finish: nothing lands here
            total += i
        outcome.append(total)

    with lane.lock:  # the watcher's decision, as in LaneContext.interrupt, while the call ends
        thread = threading.Thread(target=pool_thread)
        thread.start()
        entering.wait(5)
        time.sleep(0.05)  # the pool thread waits on the lock in finish
        lane.fired, lane.fired_at = True, time.monotonic()
        context_module._async_raise(lane.ident, HandlerTimeout)
    thread.join(5)
    assert outcome == ["landed in finish", sum(range(10000))]
    assert not lane.active and not lane.fired
