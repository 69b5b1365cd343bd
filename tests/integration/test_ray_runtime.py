"""The runtime on a real local Ray instance: crash recovery (worker processes and the driver killed), and a
long-running service that follows lifecycle changes made by other processes. Order, exactly-once and the
distribution over workers run on both executors in tests/unit/test_runtime_inprocess.py (`executor_kind`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.storage.bucket import LocalBucket
from eventing.storage.factory import create_bucket, open_bucket
from eventing.testing import (
    BackgroundLoop,
    check_ledger,
    deploy_function,
    ledger_definition,
    load_source,
    read_call_log,
    wait_for,
)
from metadata.factory import open_store
from sharding import NUM_VBUCKETS

pytestmark = pytest.mark.integration


def load(data_dir: str, documents: int, mutations: int, seed: int = 3, bucket: str = "src") -> LocalBucket:
    return load_source(data_dir, documents, mutations, bucket=bucket, seed=seed)


def deploy(data_dir: str, defn) -> None:
    deploy_function(data_dir, defn)


class CheckpointWatcher(BackgroundLoop):
    """Samples every checkpoint in the background and records any that moved backwards."""

    interval_s = 0.05

    def __init__(self, data_dir: str, functions: list[str]):
        super().__init__()
        self.functions = functions
        self.store = open_store(data_dir)
        self.backwards: list[tuple] = []
        self.samples = 0
        self._last: dict[tuple[str, int], int] = {}

    def tick(self) -> None:
        for fn in self.functions:
            for vb, cp in self.store.checkpoints(fn).items():
                if cp.seqno < self._last.get((fn, vb), 0):
                    self.backwards.append((fn, vb, self._last[(fn, vb)], cp.seqno))
                self._last[(fn, vb)] = cp.seqno
        self.samples += 1

    def finish(self) -> None:
        self.store.close()


def kill_workers_during_run(
    data_dir, tmp_path, executor, *, mutations: int, kills: int, ledger_partitions: int = 1
) -> None:
    """Run a slow ledger function on 4 workers and kill -9 one worker process `kills` times, in turn."""
    source = load(data_dir, documents=400, mutations=mutations)
    create_bucket(data_dir, "ledger", partitions=ledger_partitions).close()
    calls = tmp_path / "calls.log"
    deploy(
        data_dir,
        ledger_definition(
            "fn_k", "src", "ledger", workers=4, call_log=str(calls), sleep_ms=3, batch_size=100
        ),
    )
    service = EventingService(data_dir, executor, until_caught_up=True)
    result = {}
    thread = threading.Thread(target=lambda: result.update(summary=service.run()))
    with CheckpointWatcher(data_dir, ["fn_k"]) as watcher:
        thread.start()
        killed = 0
        deadline = time.monotonic() + 120 + kills * 5
        while killed < kills and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.7)
            sup = service.supervisors.get("fn_k")
            if sup is None:
                continue
            slot = sup.slots[f"local/w{killed % 4}"]
            if slot.ready and slot.pid and not slot.caught_up:
                os.kill(slot.pid, signal.SIGKILL)  # kill -9 mid-batch
                killed += 1
        thread.join(timeout=300)
    assert killed == kills
    assert not result["summary"].errors
    ledger = open_bucket(data_dir, "ledger")
    assert ledger.stats()["partitions"] == ledger_partitions
    report = check_ledger(source, ledger)
    assert report.ok, report.summary()
    assert watcher.backwards == [] and watcher.samples > 5
    per_doc = read_call_log(calls)
    total_calls = sum(len(v) for v in per_doc.values())
    assert (
        total_calls >= mutations
    )  # at least once; replays after a kill are allowed, duplicate effects are not
    cps = open_store(data_dir).checkpoints("fn_k")
    assert [cps[vb].seqno for vb in range(NUM_VBUCKETS)] == source.high_seqnos()
    print(
        f"kill -9 x{kills}: {mutations} mutations, {total_calls} handler calls "
        f"({total_calls - mutations} repeated after kills), {service.summary.seconds:.1f}s"
    )


def test_killing_worker_processes_mid_run_loses_nothing(data_dir, tmp_path, ray_executor):
    kill_workers_during_run(data_dir, tmp_path, ray_executor, mutations=6000, kills=3)


def test_killing_worker_processes_loses_nothing_with_a_partitioned_ledger(data_dir, tmp_path, ray_executor):
    # Each handler call writes two ledger keys that hash to different partitions, so kills fall between
    # partitions' commits too; every partition's marks skip what it already holds.
    kill_workers_during_run(data_dir, tmp_path, ray_executor, mutations=4000, kills=2, ledger_partitions=4)


@pytest.mark.soak
def test_soak_killing_workers_repeatedly_during_a_long_run(data_dir, tmp_path, ray_executor):
    kill_workers_during_run(data_dir, tmp_path, ray_executor, mutations=60_000, kills=30)


def test_a_driver_killed_mid_run_resumes_from_its_checkpoints(data_dir, ray_session):
    source = load(data_dir, documents=300, mutations=4000)
    deploy(data_dir, ledger_definition("fn_d", "src", "ledger", workers=2, sleep_ms=1, batch_size=50))
    address = ray_session.get_runtime_context().gcs_address
    driver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventing",
            "--data-dir",
            data_dir,
            "run",
            "--until-caught-up",
            "--quiet",
            "--ray-address",
            address,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    store = open_store(data_dir)
    deadline = time.monotonic() + 90
    progressed = 0
    while time.monotonic() < deadline:
        progressed = sum(cp.seqno for cp in store.checkpoints("fn_d").values())
        if progressed > 500:
            break
        time.sleep(0.2)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert 500 < progressed < 4000, "the driver should have been killed mid-run"
    before = {vb: cp.seqno for vb, cp in store.checkpoints("fn_d").items()}
    from eventing.workers.executor import RayExecutor

    summary = EventingService(data_dir, RayExecutor(), until_caught_up=True).run()
    assert not summary.errors
    after = store.checkpoints("fn_d")
    assert all(after[vb].seqno >= seqno for vb, seqno in before.items())
    report = check_ledger(source, open_bucket(data_dir, "ledger"))
    assert report.ok, report.summary()


def test_a_running_service_follows_deploys_pauses_and_resumes_from_other_processes(data_dir, ray_executor):
    source = load(data_dir, documents=200, mutations=1000)
    deploy(data_dir, ledger_definition("fn_live", "src", "ledger_live", workers=2))
    service = EventingService(data_dir, ray_executor)
    thread = threading.Thread(target=service.run)
    thread.start()
    try:
        wait_for(lambda: caught_up(data_dir, "fn_live", source), "fn_live catches up")
        for i in range(100):  # new mutations while running are picked up
            source.upsert(f"live::{i}", {"rev": 1})
        wait_for(lambda: caught_up(data_dir, "fn_live", source), "new mutations handled")
        # A pause from another process: the service checkpoints, releases and confirms.
        cli = [sys.executable, "-m", "eventing", "--data-dir", data_dir]
        assert subprocess.run([*cli, "pause", "fn_live"], capture_output=True, timeout=60).returncode == 0
        assert open_store(data_dir).get_function("fn_live").state.value == "paused"
        assert not any(cp.leased for cp in open_store(data_dir).checkpoints("fn_live").values())
        for i in range(100, 200):
            source.upsert(f"live::{i}", {"rev": 1})
        time.sleep(1.0)
        assert not caught_up(data_dir, "fn_live", source)  # paused: nothing handled
        assert subprocess.run([*cli, "resume", "fn_live"], capture_output=True, timeout=60).returncode == 0
        wait_for(lambda: caught_up(data_dir, "fn_live", source), "handled after resume")
        # A function deployed while the service runs starts without a restart.
        deploy(data_dir, ledger_definition("fn_late", "src", "ledger_late", workers=1))
        wait_for(lambda: caught_up(data_dir, "fn_late", source), "fn_late deployed while running")
    finally:
        service.stop()
        thread.join(timeout=60)
    for fn, ledger in (("fn_live", "ledger_live"), ("fn_late", "ledger_late")):
        report = check_ledger(source, open_bucket(data_dir, ledger))
        assert report.ok and report.handled == 1200, f"{fn}: {report.summary()}"


def caught_up(data_dir: str, function: str, source: LocalBucket) -> bool:
    cps = open_store(data_dir).checkpoints(function)
    return bool(cps) and [cps[vb].seqno for vb in range(NUM_VBUCKETS)] == source.high_seqnos()


def test_a_handler_that_cannot_be_interrupted_gets_its_worker_recycled(data_dir, ray_executor):
    from eventing.core.definition import FunctionDefinition

    source = create_bucket(data_dir, "src")
    for i in range(20):
        source.upsert(f"k{i:02d}", {"i": i})
    create_bucket(data_dir, "out")
    handler = (
        "import signal, time\n"
        "def on_update(doc, meta):\n"
        "    if doc['i'] == 7:\n"
        "        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # as if stuck in C code\n"
        "        time.sleep(600)\n"
        "    out[meta.id] = doc\n"
    )
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_stuck",
            "source_bucket": "src",
            "execution_timeout": "500ms",
            "checkpoint_interval": "100ms",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
        }
    )
    lifecycle.save_function(data_dir, defn, handler)
    lifecycle.deploy(data_dir, "fn_stuck")
    started = time.monotonic()
    summary = EventingService(data_dir, ray_executor, until_caught_up=True).run()
    assert not summary.errors
    assert time.monotonic() - started < 60
    store = open_store(data_dir)
    rows = store.dlq_rows("fn_stuck")
    assert [(r.key, r.reason) for r in rows] == [("k07", "timeout")]
    assert "recycled" in rows[0].error
    assert sorted(open_bucket(data_dir, "out").keys()) == [f"k{i:02d}" for i in range(20) if i != 7]
    counters = store.counters("fn_stuck")
    assert counters["workers_recycled"] == 1 and counters["hung_skipped"] == 1
    # The handler is fixed and the function deployed afresh: the mutation the old handler hung on is handled
    # (the quarantine of a hung mutation belongs to the deployment that hung on it).
    lifecycle.undeploy(data_dir, "fn_stuck")
    lifecycle.save_function(data_dir, defn, "def on_update(doc, meta):\n    out[meta.id] = doc\n")
    lifecycle.deploy(data_dir, "fn_stuck")
    summary = EventingService(data_dir, ray_executor, until_caught_up=True).run()
    assert not summary.errors
    assert sorted(open_bucket(data_dir, "out").keys()) == [f"k{i:02d}" for i in range(20)]
    assert open_store(data_dir).counters("fn_stuck")["hung_skipped"] == 1  # nothing skipped this time
