"""Shared worker processes (eventing.workers.shared_host) on the in-process executor: where cores go, what a
kill, a release and a host's death do, and whole runs of several functions whose ledgers stay exact. The
same on real Ray processes is tests/integration/test_shared_workers_ray.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from eventing.control.service import EventingService
from eventing.errors import ConfigError
from eventing.storage.factory import open_bucket
from eventing.testing import check_ledger, deploy_function, ledger_definition, load_source
from eventing.workers import shared_host
from eventing.workers import worker as worker_module
from eventing.workers.executor import InProcessExecutor, WorkerDied
from eventing.workers.shared_host import LocalHostBackend, SharedHosts, worker_processes_setting


def spec(function: str, worker: str = "w0") -> Any:
    return SimpleNamespace(function=function, worker_id=worker)


def result(future: Any) -> Any:
    if future.error is not None:
        raise future.error
    return future.value


def test_cores_spread_over_at_most_n_hosts_least_loaded_first():
    hosts = SharedHosts(2, LocalHostBackend())
    handles = [
        hosts.start_worker(spec(f"fn{i // 2}", f"w{i % 2}"), spec(f"fn{i // 2}", f"w{i % 2}"))
        for i in range(6)
    ]
    assert len(hosts.hosts) == 2 and hosts.started == 2
    assert [len(h.cores) for h in hosts.hosts] == [3, 3]
    # The two workers of each function are in different processes.
    assert all(handles[i].host is not handles[i + 1].host for i in range(0, 6, 2))
    assert sorted(h.actor.host.held() for h in hosts.hosts) == sorted(sorted(h.cores) for h in hosts.hosts)


def test_kill_and_release_drop_one_core_and_the_host_ends_with_its_last():
    hosts = SharedHosts(1, LocalHostBackend())
    a, b, c = (hosts.start_worker(spec(n), spec(n)) for n in ("fa", "fb", "fc"))
    host = a.host
    hosts.kill(a)
    assert not host.dead and host.actor.host.held() == sorted([b.core_id, c.core_id])
    with pytest.raises(WorkerDied):  # a call to the dropped core: that worker is gone, not the process
        result(a.call("step"))
    assert result(b.call("respec", spec("fb"))) is None  # the others still answer
    hosts.release(b)
    assert not host.dead and host.actor.host.held() == [c.core_id]
    hosts.release(c)
    assert host.dead and hosts.hosts == []
    hosts.kill(a)  # twice is harmless


def test_a_dead_host_fails_every_core_it_held_and_new_cores_go_to_a_new_one():
    hosts = SharedHosts(2, LocalHostBackend())
    handles = [hosts.start_worker(spec(f"fn{i}"), spec(f"fn{i}")) for i in range(4)]
    first = handles[0].host
    hosts.end(first)  # its process crashed
    on_first = [h for h in handles if h.host is first]
    assert len(on_first) == 2
    for h in on_first:
        with pytest.raises(WorkerDied):
            result(h.call("step"))
        hosts.kill(h)  # what a supervisor does before restarting the worker
    again = hosts.start_worker(spec("fn0"), spec("fn0"))
    assert again.host is not first and not again.host.dead and hosts.started == 3
    assert len(hosts.hosts) == 2


class SilentBackend(LocalHostBackend):
    """A host whose drops never come back: unresponsive."""

    def finished(self, futures: list[Any]) -> list[Any]:
        return []


def test_a_host_that_does_not_answer_a_drop_is_ended(monkeypatch):
    hosts = SharedHosts(1, SilentBackend())
    a = hosts.start_worker(spec("fa"), spec("fa"))
    b = hosts.start_worker(spec("fb"), spec("fb"))
    hosts.kill(a)
    hosts.check()
    assert not b.host.dead  # not overdue yet
    monkeypatch.setattr(shared_host, "DROP_TIMEOUT_S", 0.0)
    hosts.kill(hosts.start_worker(spec("fc"), spec("fc")))
    hosts.check()
    assert b.host.dead
    with pytest.raises(WorkerDied):
        result(b.call("step"))


def test_the_setting():
    assert worker_processes_setting(3) == 3 and worker_processes_setting("0") == 0
    with pytest.raises(ConfigError):
        worker_processes_setting(-1)
    with pytest.raises(ConfigError):
        worker_processes_setting("many")


def test_the_setting_from_the_environment(monkeypatch):
    monkeypatch.delenv(shared_host.ENV, raising=False)
    assert worker_processes_setting() == 0  # default: a process per worker
    monkeypatch.setenv(shared_host.ENV, "4")
    assert worker_processes_setting() == 4 and worker_processes_setting(0) == 0


# -- whole runs -----------------------------------------------------------------------------------------


FUNCTIONS = ("fn_a", "fn_b", "fn_c", "fn_d")


def deploy_several(data_dir: str, mutations: int) -> Any:
    source = load_source(data_dir, mutations // 10, mutations, chunk=5000, seed=5)
    for name in FUNCTIONS:
        deploy_function(data_dir, ledger_definition(name, "src", f"ledger_{name}", workers=2, batch_size=200))
    return source


def check_every_ledger(
    data_dir: str, source: Any, summary: Any, mutations: int, *, replays: bool = False
) -> None:
    assert not summary.errors
    for name in FUNCTIONS:
        handled = summary.functions[name].handled  # counts the calls replayed after a crash
        assert handled >= mutations if replays else handled == mutations
        report = check_ledger(source, open_bucket(data_dir, f"ledger_{name}"))
        assert report.ok, f"{name}: {report.summary()}"
        assert report.handled == mutations


def test_several_functions_in_two_shared_hosts_handle_every_mutation_once(data_dir):
    source = deploy_several(data_dir, 2000)
    executor = InProcessExecutor(worker_processes=2)
    seen: list[list[int]] = []
    summary = EventingService(
        data_dir,
        executor,
        until_caught_up=True,
        on_progress=lambda _: seen.append([len(h.cores) for h in executor.shared.hosts]),
    ).run()
    check_every_ledger(data_dir, source, summary, 2000)
    assert executor.shared.started == 2  # 8 workers of 4 functions in 2 processes
    assert [4, 4] in seen
    assert executor.shared.hosts == []  # each ended with its last worker's release


def test_a_shared_host_crashing_mid_run_restarts_its_cores_and_loses_nothing(data_dir, monkeypatch):
    monkeypatch.setattr(worker_module, "STEP_SLICE_S", 0.0)  # one batch a step: the run lasts many steps
    source = deploy_several(data_dir, 3000)
    executor = InProcessExecutor(worker_processes=2)
    crashed: list[int] = []

    def crash(summary: Any) -> None:
        handled = sum(p.handled for p in summary.functions.values())
        if not crashed and 1000 < handled < 8000 and executor.shared.hosts:
            host = executor.shared.hosts[0]
            crashed.append(len(host.cores))
            executor.shared.end(host)

    summary = EventingService(data_dir, executor, until_caught_up=True, on_progress=crash).run()
    assert crashed == [4]
    check_every_ledger(data_dir, source, summary, 3000, replays=True)
    # The crashed host's cores came back in a host started for them (a host whose cores were all released
    # as their functions caught up may be started again later, under load: hence at least, not exactly).
    assert executor.shared.started >= 3
