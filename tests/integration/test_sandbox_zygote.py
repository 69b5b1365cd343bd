"""Sandboxed children are forked from one prepared process a host (eventing.workers.sandbox.zygote): the
children of a host share its zygote, which has one thread when it forks; each child is confined on its
own; a host killed with kill -9 takes its zygote and their children with it; a zygote that ended is
replaced by the next sandbox started, and the children it had end (their hosts see their line close)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from eventing.core.definition import FunctionDefinition
from eventing.testing import wait_for
from eventing.workers.sandbox.host import _NoData, _Sandboxed
from eventing.workers.sandbox.landlock import sandbox_unavailable
from eventing.workers.sandbox.scope import ScopedService
from eventing.workers.sandbox.zygote import CHILD_NAME, ZYGOTE_NAME, is_sandboxed_child

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(sandbox_unavailable()), reason=sandbox_unavailable() or ""),
]


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _comm(pid: int) -> bytes:
    with open(f"/proc/{pid}/comm", "rb") as f:
        return f.read().strip()


def _sandbox(name: str, private: str) -> _Sandboxed:
    defn = FunctionDefinition.from_dict({"name": name, "source_bucket": "src", "isolation": "sandbox"})
    s = _Sandboxed()
    s._start(defn.name, defn, ScopedService(defn.name, defn, _NoData()), private=[private])
    return s


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] == "Z"  # a zombie until its parent reaps it
    except OSError:
        return True


def test_the_children_of_a_host_share_one_single_threaded_zygote(data_dir):
    first, second = _sandbox("fn_one", data_dir), _sandbox("fn_two", data_dir)
    try:
        zygote = _parent(first.proc.pid)
        assert _parent(second.proc.pid) == zygote
        assert _parent(zygote) == os.getpid()
        assert _comm(zygote) == ZYGOTE_NAME and not is_sandboxed_child(zygote)
        # The zygote answers with the pid as it forks; the child names itself as it starts.
        wait_for(lambda: is_sandboxed_child(first.proc.pid), "the child is named", timeout=10)
        assert _comm(first.proc.pid) == CHILD_NAME
        assert len(os.listdir(f"/proc/{zygote}/task")) == 1  # forks of a process with one thread
        # Each child runs calls in its own folder and environment, not the zygote's.
        assert first._rpc("close", ()) is None
        assert first.proc.wait(10) == 0
        assert second.proc.poll() is None
    finally:
        first.close()
        second.close()
    assert second.proc.poll() is not None and not os.path.exists(second.tmp)


def test_a_child_killed_is_seen_ended_and_another_starts(data_dir):
    from eventing.workers.worker_died import WorkerDied

    s = _sandbox("fn_killed", data_dir)
    try:
        s.proc.kill()
        assert s.proc.wait(10) == -signal.SIGKILL
        with pytest.raises(WorkerDied):
            s._rpc("close", ())
    finally:
        s.close()
    again = _sandbox("fn_again", data_dir)
    try:
        assert again._rpc("close", ()) is None
    finally:
        again.close()


def test_a_zygote_that_ended_is_replaced_and_its_children_end(data_dir):
    from eventing.workers.worker_died import WorkerDied

    s = _sandbox("fn_orphan", data_dir)
    try:
        zygote = _parent(s.proc.pid)
        os.kill(zygote, signal.SIGKILL)
        wait_for(lambda: s.proc.poll() is not None, "the child ends with its zygote", timeout=10)
        with pytest.raises(WorkerDied):
            s._rpc("close", ())
    finally:
        s.close()
    wait_for(lambda: _gone(zygote), "the zygote killed is gone", timeout=10)
    again = _sandbox("fn_next", data_dir)
    try:
        assert _parent(again.proc.pid) != zygote
        assert again._rpc("close", ()) is None
    finally:
        again.close()


HOST = """
import sys, time
from eventing.core.definition import FunctionDefinition
from eventing.workers.sandbox.host import _NoData, _Sandboxed
from eventing.workers.sandbox.scope import ScopedService

sandboxes = []  # kept: a sandbox whose handle is collected closes its line, and its child ends
for name in ("fn_a", "fn_b"):
    defn = FunctionDefinition.from_dict({"name": name, "source_bucket": "src", "isolation": "sandbox"})
    s = _Sandboxed()
    s._start(defn.name, defn, ScopedService(defn.name, defn, _NoData()), private=[sys.argv[1]])
    sandboxes.append(s)
print(*(s.proc.pid for s in sandboxes), flush=True)
time.sleep(120)
"""


def test_a_host_killed_takes_its_zygote_and_children_with_it(data_dir, tmp_path):
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, data_dir],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:
        children = [int(p) for p in host.stdout.readline().split()]
        zygote = _parent(children[0])
        assert _parent(zygote) == host.pid and _comm(zygote) == ZYGOTE_NAME
        os.kill(host.pid, signal.SIGKILL)
        host.wait()
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    for pid in (zygote, *children):
        wait_for(lambda pid=pid: _gone(pid), f"process {pid} ends with its host", timeout=10)
