"""A request a sandboxed child asks "ahead" (a caught-up step's read of the rows to come) is answered by its
host just before the host's next call, so that it holds what was written by then; one the child waits for
sooner is asked for at once ("now") and answered then, never left waiting. Both ends of the line over a
socket pair: the host's `_Sandboxed._rpc` with a child played by the test, and the child's `_Line` with a
host played by the test."""

from __future__ import annotations

import pickle
import socket
import threading
import types

import pytest

from eventing.workers.sandbox import child, host
from eventing.workers.sandbox.line import _recv, _send


class _Service:
    """Answers every data request with how many it answered so far, and notes when it did."""

    def __init__(self, events: list):
        self.events = events

    def call(self, method, *args):
        self.events.append(("answered", args[1]))
        return len([e for e in self.events if e[0] == "answered"])


def _host_end(sock: socket.socket, events: list) -> host._Sandboxed:
    sandbox = host._Sandboxed.__new__(host._Sandboxed)
    sandbox.sock, sandbox._send_lock, sandbox._ended = sock, threading.Lock(), False
    sandbox._held, sandbox.held_answered = [], 0
    sandbox.service = _Service(events)
    return sandbox


def _frames(sock: socket.socket, n: int) -> list[tuple]:
    return [pickle.loads(_recv(sock)) for _ in range(n)]


def _put(sock: socket.socket, *message) -> None:
    _send(sock, pickle.dumps(message, protocol=5))


def test_the_host_answers_a_request_asked_ahead_just_before_its_next_call():
    ours, theirs = socket.socketpair()
    events: list = []
    sandbox = _host_end(ours, events)
    seen: list = []

    def play_child():
        seen.extend(_frames(theirs, 1))  # the first call
        _put(theirs, "ahead", 1, "bucket", ("src", "read_changed", [], 10))
        _put(theirs, "done", None, True, "first step")
        seen.extend(_frames(theirs, 2))  # the held answer, then the second call
        _put(theirs, "done", None, True, "second step")

    playing = threading.Thread(target=play_child)
    playing.start()
    try:
        assert sandbox._rpc("step", (None, 0.0)) == "first step"
        assert events == []  # held: not read when asked
        events.append(("writes", "made while the host waited"))
        assert sandbox._rpc("step", (None, 0.0)) == "second step"
    finally:
        playing.join(10)
        ours.close()
        theirs.close()
    assert events == [("writes", "made while the host waited"), ("answered", "read_changed")]
    assert [f[0] for f in seen] == ["call", "ans", "call"]
    assert seen[1][1:] == (1, True, 1)
    assert sandbox.held_answered == 1 and sandbox._held == []


def test_a_request_asked_ahead_and_waited_for_in_the_same_call_is_answered_when_asked_now():
    ours, theirs = socket.socketpair()
    events: list = []
    sandbox = _host_end(ours, events)
    seen: list = []

    def play_child():
        seen.extend(_frames(theirs, 1))
        _put(theirs, "ahead", 1, "bucket", ("src", "read_changed", [], 10))
        _put(theirs, "now", 1, None, None)
        seen.extend(_frames(theirs, 1))  # answered now, within the call
        _put(theirs, "done", None, True, "step")

    playing = threading.Thread(target=play_child)
    playing.start()
    try:
        assert sandbox._rpc("step", (None, 0.0)) == "step"
    finally:
        playing.join(10)
        ours.close()
        theirs.close()
    assert [f[0] for f in seen] == ["call", "ans"]
    assert events == [("answered", "read_changed")] and sandbox._held == []


@pytest.fixture
def line_pair(monkeypatch):
    """The child's `_Line` on one end, the test's host on the other. Its reader thread ends the process when
    the host's end closes; here it just returns, and is joined before the test ends."""
    monkeypatch.setattr(child, "os", types.SimpleNamespace(_exit=lambda code: None))
    host_end, child_end = socket.socketpair()
    before = set(threading.enumerate())
    line = child._Line(child_end)
    (reader,) = set(threading.enumerate()) - before
    yield line, host_end
    host_end.close()
    reader.join(10)
    assert not reader.is_alive()
    child_end.close()


def test_the_childs_wait_for_a_request_asked_ahead_asks_for_it_now(line_pair):
    line, host_end = line_pair
    wait = line.submit_ahead("bucket", "src", "read_changed", [], 10)
    (asked,) = _frames(host_end, 1)
    assert asked[:3] == ("ahead", 1, "bucket")
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(wait()))
    waiting.start()
    (now,) = _frames(host_end, 1)
    assert now == ("now", 1, None, None)
    _put(host_end, "ans", 1, True, 7)
    waiting.join(10)
    assert got == [7]


def test_the_childs_wait_for_an_answer_already_come_asks_nothing(line_pair):
    line, host_end = line_pair
    wait = line.submit_ahead("bucket", "src", "read_changed", [], 10)
    _frames(host_end, 1)
    _put(host_end, "ans", 1, True, 8)
    _put(host_end, "call", "step", (None, 0.0))  # the host's next call comes after the answer
    assert line.calls.get(timeout=10) == ("step", (None, 0.0))
    assert wait() == 8
    host_end.setblocking(False)
    with pytest.raises(BlockingIOError):
        host_end.recv(1)
