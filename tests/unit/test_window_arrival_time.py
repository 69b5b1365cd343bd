"""Arrival times: the idle timeout judges the source's silence by when mutations reached the source, not by
when the service happened to run, and reads what is waiting before it fires.

See docs/operations-run.md, 'Arrival time and the window idle timeout'.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.storage.bucket import LocalBucket
from eventing.storage.files import bucket_path
from eventing.testing.windows import ManualClock, python_aggregator
from eventing.windows.runtime import coordinator as coordinator_module
from eventing.windows.runtime import host
from eventing.windows.runtime.coordinator import WindowCoordinator
from eventing.windows.runtime.paths import WindowPaths
from eventing.windows.spark.sink import ParquetWindowSink
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store
from sharding import vbucket_of

S = 1000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a window start
ROOT = Path(__file__).resolve().parents[2]
SALES = json.loads((ROOT / "functions" / "fn_sales_per_minute.json").read_text())
FN = SALES["name"]


class Runs:
    """`eventing run --until-caught-up` of fn_sales_per_minute (in-process workers, Spark replaced by the
    pure-Python aggregator) with the window coordinator on a movable clock."""

    def __init__(self, data_dir: str, monkeypatch: pytest.MonkeyPatch, window: dict | None = None):
        self.data_dir = data_dir
        self.clock = ManualClock(T0)
        monkeypatch.setattr(host, "make_aggregator", lambda master=None: python_aggregator)
        monkeypatch.setattr(
            coordinator_module, "WindowCoordinator", functools.partial(WindowCoordinator, clock=self.clock)
        )
        self.source = LocalBucket.create(data_dir, SALES["source_bucket"])
        spec = dict(SALES, handler="fn_sales_per_minute.py", checkpoint_interval="10ms", worker_count=2)
        if window is not None:
            spec["window"] = window
        defn = FunctionDefinition.from_dict(spec)
        lifecycle.save_function(data_dir, defn, (ROOT / "functions" / "fn_sales_per_minute.py").read_text())
        lifecycle.deploy(data_dir, FN)

    def load(self, key: str, ts_ms: int, arrival_ms: int, country: str = "KR") -> None:
        self.source.upsert(key, {"ts": ts_ms, "country": country, "amount": 1.0}, arrival_ms=arrival_ms)

    def run(self, at_ms: int) -> None:
        self.clock.now_ms = at_ms
        summary = EventingService(self.data_dir, InProcessExecutor(), until_caught_up=True).run()
        assert not summary.errors

    def windows(self) -> list[tuple[int, str, int]]:
        sink = ParquetWindowSink(WindowPaths.of(self.data_dir, FN).root / "results")
        return sorted((r["window_start_ms"], r["country"], r["count"]) for r in sink.read(FN).to_pylist())

    def late(self) -> list[str]:
        with open_store(self.data_dir) as store:
            return sorted(r.key for r in store.dlq_rows(FN) if r.reason == "late")


def test_a_row_that_arrived_before_the_idle_timeout_joins_its_window_though_the_service_was_stopped(
    data_dir, monkeypatch
):
    # The sequence: two rows, a run, a third row seconds later, 70 s with the service stopped,
    # another run. The source was never silent for the idle timeout (1 minute): the window holds all three.
    runs = Runs(data_dir, monkeypatch)
    a0 = T0 + 50 * S
    runs.load("r1", T0 + 5 * S, a0)
    runs.load("r2", T0 + 15 * S, a0)
    runs.run(a0 + 1 * S)
    assert runs.windows() == []
    runs.load("r3", T0 + 25 * S, a0 + 2 * S)
    runs.run(a0 + 72 * S)
    assert runs.windows() == [(T0, "KR", 3)]
    assert runs.late() == []
    # A row that reaches the source after a real minute of silence is late, as it would be live.
    runs.load("r4", T0 + 30 * S, a0 + 80 * S)
    runs.run(a0 + 81 * S)
    assert runs.late() == ["r4"]
    assert runs.windows() == [(T0, "KR", 3)]


def test_a_silence_inside_the_waiting_rows_fires_the_idle_timeout_between_them(data_dir, monkeypatch):
    # Both rows wait while the service is stopped; the second reached the source after a minute of silence
    # past the window's end, so the window closed before it, exactly as a running service would have done.
    runs = Runs(data_dir, monkeypatch)
    runs.load("r1", T0 + 5 * S, T0 + 10 * S)
    runs.load("r2", T0 + 20 * S, T0 + 125 * S)
    runs.run(T0 + 300 * S)
    assert runs.windows() == [(T0, "KR", 1)]
    assert runs.late() == ["r2"]


# -- the same mutations with the same arrival times give the same windows, whatever the runs ------------

WINDOW = dict(SALES["window"], idle_timeout="20s", partition_idle_timeout="30s", out_of_order_tolerance="5s")
KEYS = ["a", "b", "c", "d", "e", "f"]


@st.composite
def histories(draw) -> tuple[list[tuple[str, int, int]], list[int]]:
    """Mutations (key, event time, arrival time), in arrival order, with event times at most the tolerance
    behind the latest (so only the idle timeout can make a row late), and times at which the service runs."""
    mutations = []
    arrival = T0 + draw(st.integers(0, 50)) * S
    latest = arrival
    for _ in range(draw(st.integers(1, 8))):
        arrival += draw(st.sampled_from([0, 1, 3, 15, 25, 40, 70])) * S
        latest = max(latest, arrival - 2 * S)
        ts = latest - draw(st.integers(0, 5)) * S
        mutations.append((draw(st.sampled_from(KEYS)), ts, arrival))
    # Runs shortly after an arrival, or after a pause long enough for a timeout to come due meanwhile.
    after = st.tuples(st.sampled_from(mutations), st.sampled_from([1, 10, 30, 50, 90]))
    runs = sorted({m[2] + pause * S for m, pause in draw(st.lists(after, max_size=3))})
    return mutations, runs


def replay(data_dir: str, monkeypatch: pytest.MonkeyPatch, mutations, run_times) -> tuple[list, list]:
    """Load the mutations as their arrival times come and run the service at ``run_times``, then once more
    long after the last (every timeout due by then)."""
    runs = Runs(data_dir, monkeypatch, WINDOW)
    pending = list(mutations)
    final = mutations[-1][2] + 600 * S
    for at in [*run_times, final]:
        while pending and pending[0][2] <= at:
            key, ts, arrival = pending.pop(0)
            runs.load(key, ts, arrival, country=key.upper())
        runs.run(at)
    late = [(vbucket_of(k), k) for k in runs.late()]
    return runs.windows(), sorted(late)


# Each example runs the service up to a dozen times (~0.1-0.3 s each): few random examples, and the shapes
# that matter as explicit ones.
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=histories())
# The shape: a row waits while the service is stopped past the idle timeout's deadline.
@example(
    history=([("a", T0 + 5 * S, T0 + 10 * S), ("a", T0 + 8 * S, T0 + 13 * S)], [T0 + 11 * S, T0 + 63 * S])
)
# A run, then a 40 s silence (past both idle timeouts) before two more rows, the second out of order.
@example(
    history=(
        [("a", T0 + 5 * S, T0 + 10 * S), ("b", T0 + 48 * S, T0 + 50 * S), ("c", T0 + 47 * S, T0 + 51 * S)],
        [T0 + 11 * S, T0 + 100 * S],
    )
)
def test_the_same_arrivals_give_the_same_windows_whatever_the_service_stops_and_starts(
    tmp_path_factory, monkeypatch, history
):
    mutations, run_times = history
    # A service that ran at every arrival (as close to always running as this test gets) ...
    always = sorted({arrival for _, _, arrival in mutations})
    with monkeypatch.context() as m:
        expected = replay(str(tmp_path_factory.mktemp("always")), m, mutations, always)
    # ... and one that ran only now and then agree.
    with monkeypatch.context() as m:
        got = replay(str(tmp_path_factory.mktemp("sometimes")), m, mutations, run_times)
    assert got == expected


# -- the bucket keeps the arrival time ----------------------------------------------------------------


def test_arrival_times_are_kept_with_the_mutation_and_never_go_backwards_in_a_vbucket(data_dir):
    bucket = LocalBucket.create(data_dir, "src")
    bucket.upsert("k", {"v": 1}, arrival_ms=T0 + 5 * S)
    bucket.upsert("k", {"v": 2}, arrival_ms=T0)  # an older time given: held at the vBucket's latest
    bucket.upsert("k", {"v": 3})
    log = bucket.read_vb(vbucket_of("k"), 0, 10)
    assert [m.arrival_ms for m in log[:2]] == [T0 + 5 * S, T0 + 5 * S]
    assert log[2].arrival_ms > T0 + 5 * S  # now
    packed = bucket.read_vb_packed(vbucket_of("k"), 0, 10, "fn")
    assert (packed.arrival_min_ms, packed.arrival_max_ms, packed.arrivals) == (
        T0 + 5 * S,
        log[2].arrival_ms,
        None,
    )
    exact = bucket.read_vb_packed(vbucket_of("k"), 0, 10, "fn", exact_arrivals_over_ms=1)
    assert exact.arrivals == [m.arrival_ms for m in log]
    assert bucket.first_arrival_after({vbucket_of("k"): 1}) == T0 + 5 * S
    assert bucket.first_arrival_after({vbucket_of("k"): 3}) is None


def test_a_bucket_file_without_arrival_times_gets_them_from_its_cas_when_opened(data_dir):
    bucket = LocalBucket.create(data_dir, "old")
    bucket.upsert("k", {"v": 1})
    cas = bucket.read_vb(vbucket_of("k"), 0, 1)[0].cas
    bucket.close()
    # Rebuild the log as an older build wrote it: no arrival_ms column.
    db = sqlite3.connect(bucket_path(data_dir, "old"))
    db.executescript(
        "CREATE TABLE log2(vb INTEGER NOT NULL, seqno INTEGER NOT NULL, key TEXT NOT NULL, op INTEGER NOT "
        "NULL, cas INTEGER NOT NULL, doc BLOB, origin TEXT, expiry INTEGER NOT NULL, flags INTEGER NOT NULL, "
        "PRIMARY KEY(vb, seqno)) WITHOUT ROWID;"
        "INSERT INTO log2 SELECT vb, seqno, key, op, cas, doc, origin, expiry, flags FROM log;"
        "DROP TABLE log; ALTER TABLE log2 RENAME TO log;"
    )
    db.close()
    reopened = LocalBucket.open(data_dir, "old")
    assert reopened.read_vb(vbucket_of("k"), 0, 1)[0].arrival_ms == cas // 1_000_000
    reopened.upsert("k2", {"v": 2})
    assert reopened.read_vb(vbucket_of("k2"), 0, 1)[0].arrival_ms > 0
