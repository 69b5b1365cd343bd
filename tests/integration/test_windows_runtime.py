"""Windowed functions end to end on real Ray and real PySpark (local[2], one session for the test session):
results equal a plain-Python computation from the documents, late rows are in the DLQ, and a worker killed
mid-run or a service killed between the coordinator's state commit and the sink write changes nothing."""

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
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_UPDATE, decode_document
from eventing.storage import loadgen
from eventing.storage.bucket import LocalBucket
from eventing.testing import load_source
from eventing.testing.windows import reference_results
from eventing.windows.runtime.emission import FAULT_ENV, FAULT_EXIT_CODE
from eventing.windows.runtime.host import WindowOptions
from eventing.windows.runtime.paths import WindowPaths
from eventing.windows.semantics import WindowSpec
from eventing.windows.spark.sink import ParquetWindowSink
from metadata.factory import open_store

CLOSE_WINDOWS = WindowOptions(close_windows=True)  # as `eventing run --close-windows`
pytestmark = pytest.mark.integration

MIN = 60_000
T0 = loadgen.BASE_TIME_MS
FN = "fn_win"
WINDOW = {
    "kind": "tumbling",
    "size": "1m",
    "time_field": "ts",
    "group_by": ["country"],
    "aggregates": [
        "count",
        {"op": "sum", "field": "amount"},
        {"op": "avg", "field": "amount"},
        {"op": "min", "field": "purchases"},
        {"op": "max", "field": "purchases"},
    ],
    "out_of_order_tolerance": "5s",
}
SLOW_HANDLER = "import time\n\ndef on_update(doc, meta):\n    time.sleep(SLEEP_MS / 1000)\n"


def load(data_dir: str, documents: int, mutations: int, seed: int = 5) -> LocalBucket:
    return load_source(data_dir, documents, mutations, seed=seed, span_ms=10 * MIN, disorder_ms=5_000)


def deploy(data_dir: str, *, workers: int = 3, sleep_ms: float = 0, window: dict | None = None) -> None:
    defn = FunctionDefinition.from_dict(
        {
            "name": FN,
            "source_bucket": "src",
            "worker_count": workers,
            "checkpoint_interval": "100ms",
            "batch_size": 100,
            "constants": {"SLEEP_MS": sleep_ms},
            "window": window or WINDOW,
        }
    )
    lifecycle.save_function(data_dir, defn, SLOW_HANDLER)
    lifecycle.deploy(data_dir, FN)


def sink(data_dir: str) -> ParquetWindowSink:
    return ParquetWindowSink(WindowPaths.of(data_dir, FN).root / "results")


def assert_results_match_the_documents(data_dir: str, source: LocalBucket, late: set[tuple[int, int]]) -> int:
    """Every window with an on-time row is in the sink once, with the values computed from the documents."""
    docs = [
        (m.vb, m.seqno, decode_document(m.doc))
        for batch in source.scan_log()
        for m in batch
        if m.op == OP_UPDATE
    ]
    on_time = [d for d in docs if (d[0], d[1]) not in late]
    spec = WindowSpec.from_dict(WINDOW)
    expected_windows = sorted({(t - t % MIN, t - t % MIN + MIN) for t in (d[2]["ts"] for d in on_time)})
    results = sink(data_dir).read(FN)
    assert sorted(sink(data_dir).written_windows(FN)) == expected_windows
    expected = reference_results(docs, spec, expected_windows, exclude=late)
    got, want = results.to_pylist(), expected.to_pylist()
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert {k: v for k, v in g.items() if k not in ("sum_amount", "avg_amount")} == {
            k: v for k, v in w.items() if k not in ("sum_amount", "avg_amount")
        }
        # Spark and math.fsum may add in different orders: equal to the last few bits.
        assert g["sum_amount"] == pytest.approx(w["sum_amount"], rel=1e-12)
        assert g["avg_amount"] == pytest.approx(w["avg_amount"], rel=1e-12)
    counters = open_store(data_dir).counters(FN)
    assert counters["windows_emitted"] == len(expected_windows)
    assert counters["window_rows_accepted"] == len(on_time)
    return len(on_time)


def test_windows_match_plain_python_and_late_rows_go_to_the_dlq(data_dir, ray_executor, spark, monkeypatch):
    source = load(data_dir, documents=400, mutations=6000)
    deploy(data_dir)
    # First run: windows close as the watermark passes them; the last ones stay open for the next run.
    summary = EventingService(data_dir, ray_executor, until_caught_up=True).run()
    assert not summary.errors
    emitted_first = set(sink(data_dir).written_windows(FN))
    assert emitted_first, "windows close on the watermark during the run"
    # Late arrivals: documents whose event time is in a window that has closed, and two on time.
    late_keys = [f"late-{i}" for i in range(5)]
    for i, key in enumerate(late_keys):
        source.upsert(key, {"ts": T0 + 1_000 * i, "country": "KR", "amount": 1000.0, "purchases": 1})
    source.upsert("on-time-1", {"ts": T0 + 9 * MIN + 59_000, "country": "KR", "amount": 7.25, "purchases": 3})
    source.upsert("on-time-2", {"ts": T0 + 12 * MIN, "country": "ZZ", "amount": 1.5, "purchases": 2})
    summary = EventingService(data_dir, ray_executor, until_caught_up=True, windows=CLOSE_WINDOWS).run()
    assert not summary.errors
    store = open_store(data_dir)
    dlq = store.dlq_rows(FN)
    assert sorted(r.key for r in dlq) == late_keys
    assert {r.reason for r in dlq} == {"late"}
    assert store.counters(FN)["dlq_late"] == 5
    accepted = assert_results_match_the_documents(data_dir, source, {(r.vb, r.seqno) for r in dlq})
    assert accepted > 5000
    assert emitted_first < set(sink(data_dir).written_windows(FN))


def test_a_worker_killed_mid_run_leaves_every_window_exact(data_dir, ray_executor, spark, monkeypatch):
    source = load(data_dir, documents=400, mutations=5000, seed=9)
    deploy(data_dir, workers=3, sleep_ms=1.5)
    service = EventingService(data_dir, ray_executor, until_caught_up=True, windows=CLOSE_WINDOWS)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(summary=service.run()))
    thread.start()
    killed = 0
    deadline = time.monotonic() + 60
    while killed < 2 and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.8)
        sup = service.supervisors.get(FN)
        if sup is None:
            continue
        slots = [s for s in sup.slots.values() if s.ready and s.pid and not s.caught_up]
        if slots:
            os.kill(slots[killed % len(slots)].pid, signal.SIGKILL)  # kill -9 between row flushes
            killed += 1
    thread.join(timeout=120)
    assert killed == 2
    assert not result["summary"].errors
    assert_results_match_the_documents(data_dir, source, late=set())
    assert open_store(data_dir).dlq_rows(FN) == []


@pytest.mark.parametrize("fault", ["after_state_commit", "after_sink_write"])
def test_a_service_killed_between_state_commit_and_sink_write_emits_every_window_once(
    data_dir, ray_executor, spark, monkeypatch, fault
):
    source = load(data_dir, documents=300, mutations=3000, seed=11)
    deploy(data_dir, workers=2)
    env = {**os.environ, FAULT_ENV: fault}
    driver = subprocess.run(
        [
            sys.executable,
            "-m",
            "eventing",
            "--data-dir",
            data_dir,
            "run",
            "--until-caught-up",
            "--quiet",
            "--executor",
            "in-process",
            "--close-windows",
            "--spark-master",
            "local[1]",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert driver.returncode == FAULT_EXIT_CODE, driver.stderr[-2000:]
    store = open_store(data_dir)

    state = store.window_states().load(FN)
    assert state is not None and state["pending"], "the crash left closed windows not recorded as emitted"
    written_before = sink(data_dir).written_windows(FN)
    if fault == "after_sink_write":
        assert written_before, "the crashed service had written windows to the sink"
    else:
        assert not written_before
    summary = EventingService(data_dir, ray_executor, until_caught_up=True, windows=CLOSE_WINDOWS).run()
    assert not summary.errors
    assert_results_match_the_documents(data_dir, source, late=set())
    assert store.window_states().load(FN)["pending"] == []


def test_a_window_only_function_killed_mid_run_on_ray_leaves_every_window_exact(
    data_dir, ray_executor, spark, monkeypatch
):
    """The bulk read path (a window-only function: no on_update) on Ray workers, one killed with kill -9
    while it has a backlog: the rows it had buffered die with it, and its restart reads them again from
    the checkpoint, so every window still comes out exact."""
    source = load(data_dir, documents=2000, mutations=60_000, seed=13)
    defn = FunctionDefinition.from_dict(
        {
            "name": FN,
            "source_bucket": "src",
            "worker_count": 3,
            "checkpoint_interval": "100ms",
            "batch_size": 5,  # many small bulk reads, so the run lasts long enough to be interrupted
            "window": WINDOW,
        }
    )
    lifecycle.save_function(data_dir, defn, '"""Window-only: the window does the work."""\n')
    lifecycle.deploy(data_dir, FN)
    service = EventingService(data_dir, ray_executor, until_caught_up=True, windows=CLOSE_WINDOWS)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(summary=service.run()))
    thread.start()
    killed_at = sup = None
    deadline = time.monotonic() + 60
    while killed_at is None and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.01)
        sup = service.supervisors.get(FN)
        if sup is None or sup.handled < 5_000:
            continue
        slots = [s for s in sup.slots.values() if s.ready and s.pid and not s.caught_up and s.backlog > 1_000]
        if slots:
            killed_at = sup.handled
            os.kill(slots[0].pid, signal.SIGKILL)
    thread.join(timeout=120)
    assert killed_at is not None, "the run ended before a worker could be killed"
    assert not result["summary"].errors
    assert sup.restarts >= 1  # the killed worker was started again and replayed from its checkpoint
    accepted = assert_results_match_the_documents(data_dir, source, late=set())
    assert accepted > 50_000
    assert open_store(data_dir).dlq_rows(FN) == []
    assert open_store(data_dir).counters(FN)["mutations_seen"] >= 60_000
