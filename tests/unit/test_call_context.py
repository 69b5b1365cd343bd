"""The call in flight (eventing.execution.context.CallContext) is what curl, timers and log() read: they
work from a bare context, without a HandlerRunner, and no longer import the runner."""

from __future__ import annotations

import ast
import socket
import time
from pathlib import Path

import pytest

import eventing.execution.curl as curl_module
import eventing.execution.timers as timers_module
from eventing.core.mutation import OP_UPDATE, Mutation
from eventing.errors import CurlError
from eventing.execution.context import CallContext
from eventing.execution.curl import CurlClient, UrlBinding
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
