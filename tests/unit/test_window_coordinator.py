"""The window coordinator without Spark or Ray: classification, late rows, replays, restarts at every step,
fencing, and the whole in-process runtime from documents to window results."""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_UPDATE, Mutation, decode_document, unpack_mutation
from eventing.errors import FencedError
from eventing.storage.bucket import LocalBucket
from eventing.testing import load_source
from eventing.testing.windows import (
    ManualClock,
    area_files,
    assert_same_results,
    python_aggregator,
    reference_results,
    results_sink,
)
from eventing.windows.runtime import coordinator as coordinator_module
from eventing.windows.runtime import host
from eventing.windows.runtime.coordinator import WindowCoordinator
from eventing.windows.runtime.host import WindowOptions
from eventing.windows.runtime.paths import WindowPaths, window_area
from eventing.windows.runtime.row_files import has_duplicate_rows
from eventing.windows.runtime.row_writer import RowLayout, WindowRowWriter
from eventing.windows.semantics import WindowSpec
from eventing.windows.spark.sink import ParquetWindowSink
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store
from sharding import vbucket_of

MIN = 60_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
CLOSE_WINDOWS = WindowOptions(close_windows=True)  # as `eventing run --close-windows`
FN = "fn_w"
WINDOW = {
    "kind": "tumbling",
    "size": "1m",
    "time_field": "ts",
    "group_by": ["country"],
    "aggregates": ["count", {"op": "sum", "field": "amount"}, {"op": "max", "field": "amount"}],
    "out_of_order_tolerance": "10s",
}


class Harness:
    """One function's coordinator over hand-written worker batches, with a movable clock."""

    def __init__(
        self,
        data_dir: str,
        window: dict[str, Any] | None = None,
        emitter: Any = None,
        aggregator: Any = python_aggregator,
        source_bucket: str | None = None,
    ):
        self.data_dir = data_dir
        self.source_bucket = source_bucket
        self.window = window or WINDOW
        self.layout = RowLayout.for_definition(FN, self.window)
        self.store = open_store(data_dir)
        self.clock = ManualClock(T0)
        self.emitter = emitter
        self.aggregator = aggregator
        self.docs: list[tuple[int, int, dict]] = []
        self.coordinator = self.restart()

    def restart(self, **kwargs: Any) -> WindowCoordinator:
        self.coordinator = WindowCoordinator(
            self.data_dir,
            FN,
            1,
            self.window,
            self.store,
            aggregator=kwargs.get("aggregator", self.aggregator),
            emitter=kwargs.get("emitter", self.emitter),
            clock=self.clock,
            close_windows=True,
            source_bucket=self.source_bucket,
        )
        return self.coordinator

    def writer(self, worker: str = "local/w0") -> WindowRowWriter:
        return WindowRowWriter(self.data_dir, FN, 1, worker, self.layout)

    def write(self, writer: WindowRowWriter, rows: list[tuple[int, int, int, str, float]]) -> None:
        """rows: (vb, seqno, event time offset ms from T0, country, amount), written as one batch."""
        for vb, seqno, offset, country, amount in rows:
            doc = {"ts": T0 + offset, "country": country, "amount": amount}
            m = Mutation(vb, seqno, f"k{vb}-{seqno}", OP_UPDATE, 0, b"", None, 0, 0)
            assert writer.add(m, doc)
            if (vb, seqno, doc) not in self.docs:
                self.docs.append((vb, seqno, doc))
        writer.flush()

    @property
    def sink(self) -> Any:
        return results_sink(self.data_dir, FN, self.window)

    def results(self) -> list[dict]:
        return self.sink.read(FN).to_pylist()

    def expected(self, exclude: set[tuple[int, int]] = frozenset()) -> list[dict]:  # type: ignore[assignment]
        spec = WindowSpec.from_dict(self.window)
        windows = sorted(self.sink.written_windows(FN))
        return reference_results(self.docs, spec, windows, exclude=exclude).to_pylist()


class ManualEmitter:
    """Holds emission jobs until `run_all`, so a test can act between a window's close and its emission."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Future, Any, tuple]] = []

    def submit(self, fn: Any, /, *args: Any) -> Future:
        future: Future = Future()
        self.jobs.append((future, fn, args))
        return future

    def run_all(self) -> None:
        jobs, self.jobs = self.jobs, []
        for future, fn, args in jobs:
            future.set_result(fn(*args))


def test_rows_are_windowed_and_each_closed_window_is_emitted_once(data_dir, window_files):
    h = Harness(data_dir)
    w = h.writer()
    h.write(w, [(0, 1, 1_000, "KR", 10.0), (1, 1, 2_000, "US", 5.5), (0, 2, 61_000, "KR", 1.0)])
    h.coordinator.poll()
    assert h.results() == []  # watermark = min over vBuckets (0 and 1) - 10 s: nothing closed yet
    h.write(w, [(0, 3, 135_000, "KR", 2.0), (1, 2, 140_000, "US", 3.0)])
    closed = h.coordinator.poll()
    assert [(c.start_ms - T0, c.end_ms - T0) for c in closed] == [(0, MIN), (MIN, 2 * MIN)]
    assert h.results() == h.expected()
    assert [(r["window_start_ms"] - T0, r["country"], r["count"], r["sum_amount"]) for r in h.results()] == [
        (0, "KR", 1, 10.0),
        (0, "US", 1, 5.5),
        (MIN, "KR", 1, 1.0),
    ]
    h.coordinator.poll()
    h.coordinator.finish(end_of_input=True)
    assert len(h.results()) == 5 and h.results() == h.expected()
    counters = h.store.counters(FN)
    assert counters["windows_closed"] == counters["windows_emitted"] == 3
    assert counters["window_rows_accepted"] == 5
    assert area_files(data_dir, FN, "incoming") == [], "consumed batches are deleted"
    assert area_files(data_dir, FN, "accepted") == [], "rows of emitted windows are deleted"
    assert (window_files == "directory") == os.path.isdir(WindowPaths.of(data_dir, FN).root)


def test_a_late_row_goes_to_the_dlq_with_reason_late_and_is_counted(data_dir, window_files):
    h = Harness(data_dir)
    w = h.writer()
    h.write(w, [(0, 1, 5_000, "KR", 1.0), (0, 2, 75_000, "KR", 2.0)])  # watermark 65 s: [0, 1m) closes
    assert len(h.coordinator.poll()) == 1
    h.write(w, [(1, 1, 30_000, "US", 99.0), (1, 2, 80_000, "US", 4.0)])  # the first is late
    h.coordinator.poll()
    h.coordinator.finish(end_of_input=True)
    dlq = h.store.dlq_rows(FN)
    assert [(r.vb, r.seqno, r.reason) for r in dlq] == [(1, 1, "late")]
    assert "arrived after every window holding it had closed" in dlq[0].error
    assert "2026-01-01T00:00:30Z" in dlq[0].error
    assert unpack_mutation(dlq[0].mutation).key == "k1-1"
    assert h.store.counters(FN)["dlq_late"] == 1
    assert h.results() == h.expected(exclude={(1, 1)})
    assert all(r["sum_amount"] != 99.0 for r in h.results())


def test_rows_written_again_by_a_restarted_worker_count_once(data_dir, window_files):
    h = Harness(data_dir)
    h.write(h.writer(), [(0, s, s * 1_000, "KR", 1.0) for s in range(1, 11)])
    h.coordinator.poll()
    # The worker crashed before its checkpoint moved: its next incarnation writes seqnos 5.. again.
    h.write(h.writer(), [(0, s, s * 1_000, "KR", 1.0) for s in range(5, 16)])
    h.coordinator.poll()
    h.coordinator.finish(end_of_input=True)
    assert [r["count"] for r in h.results()] == [15]
    assert h.store.counters(FN)["window_rows_replayed"] == 6


def test_rows_written_twice_before_one_poll_count_once(data_dir, window_files):
    h = Harness(data_dir)
    # Rows out of (vb, seqno) order across vBuckets, as a live worker writes them, then a restarted
    # incarnation writing some again; the coordinator sees both files in one poll.
    h.write(h.writer(), [(vb, s, s * 1_000, "KR", 1.0) for s in range(1, 6) for vb in (3, 1)])
    h.write(h.writer(), [(1, s, s * 1_000, "KR", 1.0) for s in range(4, 8)])
    h.coordinator.poll()
    h.coordinator.finish(end_of_input=True)
    assert [r["count"] for r in h.results()] == [12]
    assert h.store.counters(FN)["window_rows_replayed"] == 2
    assert h.results() == h.expected()


def test_duplicate_rows_are_found_in_order_and_out_of_order():
    def table(pairs: list[tuple[int, int]]) -> pa.Table:
        return pa.table({"vb": pa.array([p[0] for p in pairs], pa.int32()), "seqno": [p[1] for p in pairs]})

    assert not has_duplicate_rows(table([(0, 1), (0, 2), (1, 1), (1, 2)]))
    assert not has_duplicate_rows(table([(1, 1), (0, 1), (1, 2), (0, 2)]))
    assert has_duplicate_rows(table([(1, 1), (0, 1), (1, 2), (0, 1)]))
    assert has_duplicate_rows(table([(0, 1), (0, 2), (0, 2)]))
    assert not has_duplicate_rows(table([(0, 1), (1, 1)]))  # equal seqnos in different vBuckets
    assert has_duplicate_rows(table([(5, 2**50), (5, 2**50)]))  # past the packed key: sorted instead


def test_a_later_batch_of_a_worker_waits_until_the_earlier_one_is_visible(data_dir):
    h = Harness(data_dir)
    w = h.writer()
    h.write(w, [(0, 1, 1_000, "KR", 1.0)])
    h.write(w, [(0, 2, 2_000, "KR", 1.0)])
    incoming = WindowPaths.of(data_dir, FN).incoming
    first, second = sorted(incoming.iterdir())
    hidden = first.with_name(".hidden-" + first.name)
    first.rename(hidden)  # as if the listing raced with the first file's rename into place
    h.coordinator.poll()
    assert second.exists() and h.store.counters(FN).get("window_rows_accepted", 0) == 0
    hidden.rename(first)
    h.coordinator.poll()
    assert h.store.counters(FN)["window_rows_accepted"] == 2


def test_a_crash_between_the_state_commit_and_the_sink_write_emits_every_window_once(data_dir, window_files):
    emitter = ManualEmitter()
    h = Harness(data_dir, emitter=emitter)
    w = h.writer()
    h.write(
        w,
        [
            (0, 1, 1_000, "KR", 1.0),
            (1, 1, 2_000, "US", 2.0),
            (0, 2, 200_000, "KR", 3.0),
            (1, 2, 200_000, "US", 4.0),
        ],
    )
    assert len(h.coordinator.poll()) == 1  # [0, 1m) closed and committed; its job never runs: a crash
    state = h.coordinator.states.load(FN)
    assert state is not None and len(state["pending"]) == 1
    assert h.results() == []
    h.restart(emitter=None)  # the restarted coordinator emits what the state says is closed
    h.coordinator.poll()
    assert [r["window_start_ms"] - T0 for r in h.results()] == [0, 0]
    assert h.results() == h.expected()
    h.coordinator.finish(end_of_input=True)
    assert h.results() == h.expected()
    assert h.store.counters(FN)["windows_emitted"] == h.store.counters(FN)["windows_closed"] == 2


def test_a_crash_after_the_sink_write_does_not_emit_the_window_twice(data_dir, window_files):
    writes: Counter[tuple[int, int]] = Counter()
    h = Harness(data_dir)

    class CountingSink:
        def __init__(self, inner: Any):
            self.inner = inner
            self.read, self.written_windows = inner.read, inner.written_windows

        def write(self, function, results, *, windows=()):
            written = self.inner.write(function, results, windows=windows)
            writes.update(windows)
            return written

    sink = CountingSink(h.sink)
    h.coordinator.sink = sink
    h.write(h.writer(), [(0, 1, 1_000, "KR", 1.0), (0, 2, 200_000, "KR", 3.0)])
    h.coordinator.poll()  # closes [0, 1m) and emits it, but dies before recording the emission
    assert len(h.results()) == 1 and h.coordinator.pending
    h.restart()
    h.coordinator.sink = sink
    h.coordinator.finish(end_of_input=True)
    assert h.results() == h.expected()
    assert writes[(T0, T0 + MIN)] == 1, "the restarted coordinator found the window in the sink"
    assert h.store.counters(FN)["windows_emitted"] == 2


def test_a_poll_that_crashes_before_its_commit_leaves_no_trace(data_dir, monkeypatch, window_files):
    h = Harness(data_dir)
    h.write(h.writer(), [(0, 1, 1_000, "KR", 1.0), (0, 2, 2_000, "KR", 2.0)])

    def crash(*args, **kwargs):
        raise RuntimeError("power cut")

    commit = h.coordinator.states.commit
    monkeypatch.setattr(h.coordinator.states, "commit", crash)
    with pytest.raises(RuntimeError):
        h.coordinator.poll()
    assert len(area_files(data_dir, FN, "accepted")) == 1, "its accepted file was written, the state was not"
    monkeypatch.setattr(h.coordinator.states, "commit", commit)
    h.restart()
    assert area_files(data_dir, FN, "accepted") == [], "the restarted coordinator deleted it"
    h.coordinator.finish(end_of_input=True)
    assert [r["count"] for r in h.results()] == [2]


def test_a_hopping_window_counts_only_rows_accepted_before_it_closed(data_dir, window_files):
    window = {**WINDOW, "kind": "hopping", "size": "2m", "slide": "1m", "out_of_order_tolerance": "0s"}
    emitter = ManualEmitter()
    h = Harness(data_dir, window=window, emitter=emitter)
    w = h.writer()
    h.write(w, [(0, 1, 30_000, "KR", 1.0), (0, 2, 120_000, "KR", 1.0)])  # watermark 2m: [-1m, 1m) closes
    h.coordinator.poll()
    # A row at 90 s: [0, 2m) has closed meanwhile (its end is 2m), [1m, 3m) is open, so it is not late.
    h.write(w, [(1, 1, 90_000, "US", 7.0), (1, 2, 121_000, "US", 1.0), (0, 3, 180_000, "KR", 1.0)])
    h.coordinator.poll()
    assert [len(job[2][1]) for job in emitter.jobs] == [2], "[-1m, 1m) and [0, 2m) wait for their job"
    h.restart(
        emitter=None
    )  # the jobs never ran; the restarted coordinator stages them while the 90 s row exists
    h.coordinator.finish(end_of_input=True)
    by_window = {(r["window_start_ms"] - T0, r["country"]): r["count"] for r in h.results()}
    assert ("US", 0) not in {(c, s) for s, c in by_window}, "the 90 s row arrived after [0, 2m) closed"
    assert by_window[(MIN, "US")] == 2
    assert h.store.dlq_rows(FN) == []


def test_processing_time_rows_are_windowed_by_the_coordinator_clock(data_dir):
    window = {"kind": "tumbling", "size": "1m", "boundary": "processing_time", "aggregates": ["count"]}
    h = Harness(data_dir, window=window)
    w = h.writer()
    h.clock.now_ms = T0 + 10_000
    h.write(w, [(0, 1, -5 * MIN, "KR", 1.0), (0, 2, 9 * MIN, "KR", 1.0)])  # worker times are ignored
    h.coordinator.poll()
    h.clock.now_ms = T0 + 70_000
    h.write(w, [(0, 3, 0, "KR", 1.0)])
    h.coordinator.poll()
    assert [(r["window_start_ms"] - T0, r["count"]) for r in h.results()] == [(0, 2)]
    h.coordinator.finish(end_of_input=True)
    assert [(r["window_start_ms"] - T0, r["count"]) for r in h.results()] == [(0, 2), (MIN, 1)]


def test_the_idle_timeout_closes_a_window_without_new_data(data_dir, window_files):
    h = Harness(data_dir, window={**WINDOW, "idle_timeout": "30s"})
    h.write(h.writer(), [(0, 1, 1_000, "KR", 1.0)])
    h.coordinator.poll()
    h.clock.advance(MIN + 20_000)  # past the window's end, idle for 20 s: not yet
    h.coordinator.poll()
    assert h.results() == []
    h.clock.advance(15_000)
    h.coordinator.poll()
    assert [r["count"] for r in h.results()] == [1]


def test_vbuckets_with_a_backlog_hold_the_watermark_until_they_deliver_or_catch_up(data_dir, monkeypatch):
    monkeypatch.setattr(coordinator_module, "WAITING_CHECK_S", 0.0)
    source = LocalBucket.create(data_dir, "src")
    keys: dict[int, str] = {}
    for i in range(1000):
        keys.setdefault(vbucket_of(f"doc-{i}"), f"doc-{i}")
        if len(keys) == 3:
            break
    vb_a, vb_b, vb_c = keys
    for key in keys.values():
        for rev in range(4):
            source.upsert(key, {"rev": rev})
    lifecycle.save_function(
        data_dir,
        FunctionDefinition.from_dict({"name": FN, "source_bucket": "src", "window": WINDOW}),
        "def on_update(d, m):\n  pass\n",
    )
    lifecycle.deploy(data_dir, FN)
    h = Harness(data_dir, source_bucket="src")
    w = h.writer()
    # A worker handles one vBucket's whole backlog, then the next one (as WorkerCore does).
    h.write(w, [(vb_a, s, s * 60_000, "KR", 1.0) for s in range(1, 5)])
    assert h.coordinator.poll() == [], "b and c have a backlog and no row yet: they hold the watermark"
    h.write(w, [(vb_b, s, s * 60_000 - 30_000, "US", 1.0) for s in range(1, 5)])
    assert h.coordinator.poll() == []
    assert h.store.dlq_rows(FN) == [], "b's early rows are not late"
    # c's backlog held no row for the window (its updates were, say, filtered); once its checkpoint passes
    # where its backlog ended, it stops holding the watermark.
    epochs = h.store.claim(FN, [vb_c], "test/w0")
    h.store.commit(FN, {vb_c: epochs[vb_c].epoch}, {vb_c: 4})
    closed = h.coordinator.poll()
    assert [(c.start_ms - T0) // MIN for c in closed] == [0, 1, 2]
    h.coordinator.finish(end_of_input=True)
    assert h.results() == h.expected()


def test_a_second_coordinator_fences_the_first(data_dir, window_files):
    h = Harness(data_dir)
    first = h.coordinator
    h.restart()
    h.write(h.writer(), [(0, 1, 1_000, "KR", 1.0)])
    with pytest.raises(FencedError, match="was replaced"):
        first.poll()
    h.coordinator.finish(end_of_input=True)
    assert [r["count"] for r in h.results()] == [1]


# -- the whole runtime in one process ------------------------------------------------------------------


def load(data_dir: str, documents: int, mutations: int, seed: int = 1) -> LocalBucket:
    return load_source(
        data_dir, documents, mutations, chunk=5000, seed=seed, span_ms=10 * MIN, disorder_ms=5_000
    )


def source_docs(source: LocalBucket) -> list[tuple[int, int, dict]]:
    return [
        (m.vb, m.seqno, decode_document(m.doc))
        for batch in source.scan_log()
        for m in batch
        if m.op == OP_UPDATE and m.doc is not None
    ]


def test_the_runtime_windows_every_update_and_dead_letters_documents_without_event_time(
    data_dir, monkeypatch, window_files
):
    monkeypatch.setattr(host, "make_aggregator", lambda master=None: python_aggregator)
    source = load(data_dir, 200, 3000)
    source.upsert("no-time", {"country": "KR", "amount": 1.0})
    source.upsert("text-time", {"country": "KR", "amount": 1.0, "ts": "yesterday"})
    defn = FunctionDefinition.from_dict(
        {
            "name": FN,
            "source_bucket": "src",
            "worker_count": 3,
            "checkpoint_interval": "50ms",
            "batch_size": 200,
            "window": WINDOW,
        }
    )
    lifecycle.save_function(data_dir, defn, "def on_delete(meta, options):\n    pass\n")  # no on_update
    lifecycle.deploy(data_dir, FN)
    summary = EventingService(
        data_dir, InProcessExecutor(), until_caught_up=True, windows=CLOSE_WINDOWS
    ).run()
    assert not summary.errors
    store = open_store(data_dir)
    dlq = store.dlq_rows(FN)
    assert sorted((r.key, r.reason) for r in dlq) == [
        ("no-time", "bad_event_time"),
        ("text-time", "bad_event_time"),
    ]
    assert "no event time field 'ts'" in next(r.error for r in dlq if r.key == "no-time")
    docs = [d for d in source_docs(source) if isinstance(d[2].get("ts"), int)]
    sink = results_sink(data_dir, FN, WINDOW)
    windows = sorted(sink.written_windows(FN))
    expected = reference_results(docs, WindowSpec.from_dict(WINDOW), windows)
    assert_same_results(sink.read(FN), expected)
    counters = store.counters(FN)
    # Workers handle one vBucket after another; vBuckets with a backlog hold the watermark, so no row is late.
    assert counters.get("dlq_late", 0) == 0
    assert counters["window_rows_accepted"] == len(docs)
    assert counters["windows_emitted"] == len(windows) == 11


def test_a_redeploy_starts_the_windows_afresh(data_dir, monkeypatch, window_files):
    monkeypatch.setattr(host, "make_aggregator", lambda master=None: python_aggregator)
    load(data_dir, 50, 400)
    defn = FunctionDefinition.from_dict({"name": FN, "source_bucket": "src", "window": WINDOW})
    lifecycle.save_function(data_dir, defn, "def on_update(doc, meta):\n    pass\n")
    lifecycle.deploy(data_dir, FN)
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    store = open_store(data_dir)

    states = store.window_states()
    assert states.load(FN)["classified_upto"]
    lifecycle.undeploy(data_dir, FN)
    paths = WindowPaths.of(data_dir, FN)
    window_area(data_dir, FN).write("incoming/g1-local_w0-1-000000000.arrow", b"stale")
    written = results_sink(data_dir, FN, WINDOW).written_windows(FN)
    assert written
    lifecycle.deploy(data_dir, FN)
    assert states.load(FN) is None
    assert not paths.incoming.exists() and area_files(data_dir, FN, "incoming") == []
    assert results_sink(data_dir, FN, WINDOW).written_windows(FN) == written, "results survive a redeploy"


def test_row_layout_refuses_group_fields_that_collide_with_row_columns():
    from eventing.errors import ConfigError

    with pytest.raises(ConfigError, match="reserved"):
        RowLayout.for_definition(FN, {**WINDOW, "group_by": ["key"]})


def test_count_of_a_field_counts_documents_where_it_is_present(data_dir):
    window = {**WINDOW, "aggregates": [{"op": "count", "field": "email"}, {"op": "sum", "field": "amount"}]}
    h = Harness(data_dir, window=window)
    w = h.writer()
    for vb, seqno, doc in [
        (0, 1, {"ts": T0, "email": "a@b", "amount": "2.5"}),
        (0, 2, {"ts": T0, "amount": None}),
        (0, 3, {"ts": T0, "email": None, "amount": "n/a"}),
    ]:
        assert w.add(Mutation(vb, seqno, "k", OP_UPDATE, 0, b"", None, 0, 0), doc)
    w.flush()
    h.coordinator.finish(end_of_input=True)
    assert [(r["count_email"], r["sum_amount"]) for r in h.results()] == [(1, 2.5)]
    assert w.counters["window_values_not_numeric"] == 1


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "must be a number"),
        ("2026-01-01", "must be a number"),
        (True, "must be a number"),
        (1_767_225_600.0, None),
        (float("inf"), "finite"),
        (10**20, "outside years"),
    ],
)
def test_event_times_are_integer_epoch_milliseconds(value, reason):
    from eventing.windows.runtime.row_writer import event_time_of

    t, why = event_time_of({"ts": value}, "ts")
    if reason is None:
        assert t == 1_767_225_600 and why == ""
    else:
        assert t is None and reason in why


def test_batch_files_of_one_worker_sort_in_write_order(tmp_path):
    layout = RowLayout.for_definition(FN, WINDOW)
    w = WindowRowWriter(str(tmp_path), FN, 3, "node-a/w1", layout)
    for i in range(12):
        w.add(
            Mutation(0, i + 1, "k", OP_UPDATE, 0, b"", None, 0, 0), {"ts": T0, "country": "KR", "amount": 1}
        )
        w.flush()
    names = [p.name for p in Path(w.directory).iterdir()]
    assert sorted(names) == [f"{w.prefix}-{i:09d}.arrow" for i in range(12)]
    assert all(n.startswith("g3-node_a_w1-") for n in names)


def test_the_windows_command_shows_results_and_writes_a_chart(data_dir, tmp_path, monkeypatch, capsys):
    import json

    from eventing import cli

    monkeypatch.setattr(host, "make_aggregator", lambda master=None: python_aggregator)
    load(data_dir, 100, 1000)
    lifecycle.save_function(
        data_dir,
        FunctionDefinition.from_dict({"name": FN, "source_bucket": "src", "window": WINDOW}),
        "def on_update(doc, meta):\n    pass\n",
    )
    lifecycle.deploy(data_dir, FN)
    assert (
        cli.main(
            [
                "--data-dir",
                data_dir,
                "run",
                "--until-caught-up",
                "--close-windows",
                "--quiet",
                "--executor",
                "in-process",
            ]
        )
        == 0
    )
    capsys.readouterr()
    chart = tmp_path / "chart.png"
    assert (
        cli.main(["--data-dir", data_dir, "windows", FN, "--png", str(chart), "--aggregate", "sum_amount"])
        == 0
    )
    out = capsys.readouterr().out
    assert "11 emitted, 0 open" in out and "2026-01-01T00:00:00Z  2026-01-01T00:01:00Z" in out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["--data-dir", data_dir, "windows", FN, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["windows_emitted"] == 11 and report["late_rows"] == 0
    first = report["results"][0]
    assert first["window_start"].endswith("Z") and {"country", "count", "sum_amount"} <= set(first)
    assert cli.main(["--data-dir", data_dir, "windows", FN, "--aggregate", "nope"]) == 2
    assert "has no aggregate 'nope'" in capsys.readouterr().err


def test_a_slow_spark_job_never_blocks_the_service_loop(data_dir, monkeypatch):
    import threading

    # A Spark job lasts until the service's final round has returned (or 30 s): a round that waited for
    # the job would return only after it, however fast or loaded the machine.
    round_returned, job_done = threading.Event(), threading.Event()

    def slow_aggregator(rows_dir, layout, windows):
        round_returned.wait(30)
        try:
            return python_aggregator(rows_dir, layout, windows)
        finally:
            job_done.set()

    monkeypatch.setattr(host, "make_aggregator", lambda master=None: slow_aggregator)
    load(data_dir, 100, 1000)
    lifecycle.save_function(
        data_dir,
        FunctionDefinition.from_dict({"name": FN, "source_bucket": "src", "window": WINDOW}),
        "def on_update(doc, meta):\n    pass\n",
    )
    lifecycle.deploy(data_dir, FN)
    service = EventingService(data_dir, InProcessExecutor(), until_caught_up=True, windows=CLOSE_WINDOWS)
    stopped = service.windows.function_stopped
    job_done_before_return: list[bool] = []

    def final_round(sup):
        stopped(sup)
        job_done_before_return.append(job_done.is_set())
        round_returned.set()

    monkeypatch.setattr(service.windows, "function_stopped", final_round)
    summary = service.run()
    assert not summary.errors
    assert job_done_before_return == [False], "the final round hands the Spark job to the background thread"
    sink = ParquetWindowSink(WindowPaths.of(data_dir, FN).root / "results")
    assert len(sink.written_windows(FN)) == 11, "run() returns once the last window is in the sink"
