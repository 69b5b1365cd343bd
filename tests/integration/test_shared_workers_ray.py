"""Shared worker processes on real Ray (`eventing run --worker-processes N`, eventing.workers.shared_host):
several functions' workers in few processes with every ledger exact, a sandboxed function among them, a
shared process killed with kill -9 mid-run, one worker of a live process killed or released, a handler stuck
in an (interruptible) infinite loop beside a healthy function in the same process, and a hang SIGALRM cannot
interrupt, which ends the shared process. The bookkeeping alone runs in tests/unit/test_shared_workers.py.
Every test uses the session's one Ray instance (tests/conftest.py, `ray_session`)."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from eventing.control.service import EventingService
from eventing.storage.factory import open_bucket
from eventing.testing import check_ledger, deploy_function, ledger_definition, load_source, wait_for
from eventing.workers.executor import RayExecutor, WorkerDied
from eventing.workers.sandbox.landlock import sandbox_unavailable
from eventing.workers.worker import WorkerSpec
from metadata.factory import open_store
from sharding import NUM_VBUCKETS

pytestmark = pytest.mark.integration

SPIN = """
def on_update(doc, meta):
    while True:  # a hang SIGALRM interrupts: the worker's watchdog ends the call at execution_timeout
        pass
"""

BLOCKED = """
import signal
import time


def on_update(doc, meta):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # SIGALRM cannot interrupt this call
    time.sleep(120)
"""


class PidWatch:
    """Every worker pid and restart count the service's supervisors report, sampled at each progress
    report."""

    def __init__(self) -> None:
        self.service: EventingService | None = None
        self.pids: dict[str, set[int]] = {}  # function -> worker processes seen
        self.restarts: dict[str, int] = {}
        self.finished_at: dict[str, float] = {}

    def __call__(self, summary: Any) -> None:
        assert self.service is not None
        for name, sup in list(self.service.supervisors.items()):
            self.pids.setdefault(name, set()).update(s.pid for s in sup.slots.values() if s.pid)
            self.restarts[name] = max(self.restarts.get(name, 0), sup.restarts)
        for name, p in summary.functions.items():
            if p.state == "caught up":
                self.finished_at.setdefault(name, time.monotonic())


def run(data_dir: str, executor: RayExecutor, watch: PidWatch) -> Any:
    service = EventingService(data_dir, executor, until_caught_up=True, on_progress=watch)
    watch.service = service
    return service


def check(data_dir: str, source: Any, names: list[str], summary: Any, mutations: int) -> None:
    """Every function's ledger: each mutation's effect exactly once, in per-document order."""
    assert not summary.errors, summary.errors
    for name in names:
        report = check_ledger(source, open_bucket(data_dir, f"ledger_{name}"))
        assert report.ok, f"{name}: {report.summary()}"
        assert report.handled == mutations


def test_several_functions_in_two_processes_each_ledger_exact(data_dir, ray_session):
    mutations = 4000
    source = load_source(data_dir, 400, mutations, seed=11)
    names = ["fn_a", "fn_b", "fn_c", "fn_d"]
    for name in names:
        deploy_function(data_dir, ledger_definition(name, "src", f"ledger_{name}", workers=2, batch_size=200))
    if sandbox_unavailable() is None:  # a sandboxed function keeps its child process inside a shared host
        names.append("fn_sandboxed")
        deploy_function(
            data_dir,
            ledger_definition(
                "fn_sandboxed", "src", "ledger_fn_sandboxed", workers=2, batch_size=200, isolation="sandbox"
            ),
        )
    executor = RayExecutor(worker_processes=2)
    watch = PidWatch()
    summary = run(data_dir, executor, watch).run()
    check(data_dir, source, names, summary, mutations)
    for name in names:
        assert summary.functions[name].handled == mutations
        assert len(watch.pids[name]) == 2  # its two workers in different processes
    assert len(set().union(*watch.pids.values())) == 2  # every worker of every function in 2 processes
    assert executor.shared.started == 2 and executor.shared.hosts == []  # ended with their last workers


def test_kill_9_of_a_shared_process_mid_run_restarts_its_workers_and_loses_nothing(data_dir, ray_session):
    mutations = 4000
    source = load_source(data_dir, 400, mutations, seed=12)
    names = ["fn_a", "fn_b", "fn_c"]
    for name in names:
        deploy_function(
            data_dir, ledger_definition(name, "src", f"ledger_{name}", workers=2, batch_size=50, sleep_ms=1)
        )
    executor = RayExecutor(worker_processes=2)
    watch = PidWatch()
    service = run(data_dir, executor, watch)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(summary=service.run()))
    thread.start()
    store = open_store(data_dir)
    try:
        wait_for(
            lambda: sum(cp.seqno for cp in store.checkpoints("fn_a").values()) > 300, "fn_a checkpointed some"
        )
        victim = next(s.pid for s in service.supervisors["fn_a"].slots.values() if s.pid)
        sharing = [n for n in names if victim in watch.pids.get(n, set())]
        os.kill(victim, signal.SIGKILL)  # kill -9 of a shared worker process, mid-run
        killed_at = sum(cp.seqno for n in names for cp in store.checkpoints(n).values())
    finally:
        thread.join(timeout=240)
    assert not thread.is_alive()
    assert killed_at < mutations * len(names), "the process should have been killed mid-run"
    assert len(sharing) == len(names)  # it held a worker of every function
    summary = result["summary"]
    check(data_dir, source, names, summary, mutations)
    for name in names:
        assert watch.restarts[name] >= 1, f"{name}'s worker in the killed process was not restarted"
    assert executor.shared.started >= 3  # a new process took the killed one's workers


def test_an_interruptible_hang_does_not_stop_a_function_sharing_its_process(data_dir, ray_session):
    mutations = 3000
    source = load_source(data_dir, 300, mutations, seed=13)
    deploy_function(data_dir, ledger_definition("fn_ok", "src", "ledger_fn_ok", workers=2, batch_size=200))
    load_source(data_dir, 4, 4, bucket="spin_src", seed=14)
    spin = ledger_definition("fn_spin", "spin_src", "ledger_fn_spin", workers=1, execution_timeout="1s")
    deploy_function(data_dir, spin, SPIN)
    executor = RayExecutor(worker_processes=1)  # one process: fn_spin and fn_ok take turns in it
    watch = PidWatch()
    began = time.monotonic()
    summary = run(data_dir, executor, watch).run()
    check(data_dir, source, ["fn_ok"], summary, mutations)
    assert summary.functions["fn_ok"].handled == mutations
    assert sum(summary.functions["fn_spin"].dead_letters.values()) == 4  # each call ended by its timeout
    assert len(set().union(*watch.pids.values())) == 1
    # Interrupted inside the step: the process lived on, nobody restarted.
    assert watch.restarts == {"fn_ok": 0, "fn_spin": 0}
    assert watch.finished_at["fn_ok"] - began < 120


def test_an_uninterruptible_hang_ends_the_shared_process_and_its_neighbours_resume_exactly(
    data_dir, ray_session
):
    """What sharing costs: the hang guard ends the whole process, so the healthy function's workers there
    restart from their checkpoints too. Nothing is lost or applied twice; the stuck call is dead-lettered."""
    mutations = 3000
    source = load_source(data_dir, 300, mutations, seed=15)
    deploy_function(
        data_dir, ledger_definition("fn_ok", "src", "ledger_fn_ok", workers=2, batch_size=100, sleep_ms=2)
    )
    load_source(data_dir, 1, 1, bucket="stuck_src", seed=16)
    stuck = ledger_definition("fn_stuck", "stuck_src", "ledger_fn_stuck", workers=1, execution_timeout="1s")
    deploy_function(data_dir, stuck, BLOCKED)
    executor = RayExecutor(worker_processes=1)
    watch = PidWatch()
    summary = run(data_dir, executor, watch).run()
    check(data_dir, source, ["fn_ok"], summary, mutations)
    rows = open_store(data_dir).dlq_rows("fn_stuck")  # the stuck call, written by the hang guard
    assert [r.reason for r in rows] == ["timeout"]
    assert watch.restarts["fn_ok"] >= 1  # its workers shared the ended process
    assert executor.shared.started >= 2


def test_killing_or_releasing_one_worker_leaves_the_others_of_its_process_running(data_dir, ray_session):
    load_source(data_dir, 50, 200, seed=17)
    names = ("fn_a", "fn_b", "fn_c")
    store = open_store(data_dir)
    executor = RayExecutor(worker_processes=1)
    handles = {}
    for name in names:
        deploy_function(data_dir, ledger_definition(name, "src", f"ledger_{name}", workers=1))
        spec = WorkerSpec(
            data_dir, name, store.get_function(name).generation, "local/w0", tuple(range(NUM_VBUCKETS))
        )
        handles[name] = executor.start_worker(spec)
    pids = {executor.result(h.call("start")) for h in handles.values()}
    assert len(pids) == 1  # one process holds the three
    host = handles["fn_a"].host
    executor.kill(handles["fn_a"])
    with pytest.raises(WorkerDied):  # that worker is gone ...
        executor.result(handles["fn_a"].call("step"))
    assert executor.result(handles["fn_b"].call("step")).handled == 200  # ... the others are not
    executor.result(handles["fn_b"].call("stop"))
    executor.release(handles["fn_b"])
    assert executor.result(handles["fn_c"].call("step")).handled == 200
    assert not host.dead and host.cores == {handles["fn_c"].core_id}
    executor.result(handles["fn_c"].call("stop"))
    executor.release(handles["fn_c"])
    assert host.dead and executor.shared.hosts == []  # ended with its last worker
    pid = pids.pop()
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), "the process ended", timeout=30)
