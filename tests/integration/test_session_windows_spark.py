"""Session windows with real PySpark: the window coordinator judges and merges sessions, Spark merges the
closed sessions' partial aggregates, and every emitted session equals a plain computation over the accepted
rows (rows out of order across vBuckets and workers, merges, null groups, a restart, late rows)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from eventing.core.mutation import OP_UPDATE, Mutation
from eventing.testing.windows import ManualClock, assert_same_results, reference_sessions
from eventing.windows.runtime.coordinator import WindowCoordinator
from eventing.windows.runtime.host import SparkAggregator
from eventing.windows.runtime.paths import WindowPaths
from eventing.windows.runtime.row_writer import RowLayout, WindowRowWriter
from eventing.windows.semantics import WindowSpec
from eventing.windows.spark.sink import ParquetWindowSink
from metadata.factory import open_store

pytestmark = pytest.mark.integration

S = 1000
T0 = 1_767_225_600_000
FN = "fn_sessions"
WINDOW: dict[str, Any] = {
    "kind": "session",
    "gap": "10s",
    "max_duration": "2m",
    "time_field": "ts",
    "group_by": ["user"],
    "aggregates": [
        "count",
        {"op": "sum", "field": "amount"},
        {"op": "avg", "field": "amount"},
        {"op": "min", "field": "amount"},
        {"op": "count", "field": "amount", "name": "n_amount"},
    ],
    "out_of_order_tolerance": "8s",
}


def test_spark_merges_sessions_exactly_as_the_plain_computation(spark, data_dir):
    rnd = random.Random(15)
    layout = RowLayout.for_definition(FN, WINDOW)
    store = open_store(data_dir)
    clock = ManualClock(T0)
    aggregator = SparkAggregator("local[2]")

    def coordinator() -> WindowCoordinator:
        return WindowCoordinator(
            data_dir, FN, 1, WINDOW, store, aggregator=aggregator, clock=clock, close_windows=True
        )

    coord = coordinator()
    docs: list[tuple[int, int, dict]] = []
    seqnos = [0] * 16
    t = 0
    for round_ in range(10):
        for worker in ("local/w0", "local/w1"):
            writer = WindowRowWriter(data_dir, FN, 1, worker, layout)
            for _ in range(rnd.randint(50, 150)):
                vb = rnd.randrange(16)
                seqnos[vb] += 1
                t += rnd.randint(0, 2 * S)
                doc: dict[str, Any] = {"ts": T0 + t - rnd.randint(0, 20 * S)}
                if rnd.random() > 0.05:
                    doc["user"] = rnd.choice(["ann", "bob", "cy", "dee"])  # a few rows without a user
                if rnd.random() > 0.1:
                    doc["amount"] = float(rnd.randint(1, 40)) / 4
                assert writer.add(
                    Mutation(vb, seqnos[vb], f"k{vb}-{seqnos[vb]}", OP_UPDATE, 0, b"", None, 0, 0), doc
                )
                docs.append((vb, seqnos[vb], doc))
            writer.flush()
        coord.poll()
        if round_ == 5:
            assert coord.drain(timeout=300)
            coord = coordinator()  # a restarted service resumes the sessions from the committed state
    # A row far behind the watermark (its session would have ended long ago) and one inside a closed session.
    writer = WindowRowWriter(data_dir, FN, 1, "local/w0", layout)
    for vb, doc in ((0, {"ts": T0 - 3_600 * S, "user": "ann", "amount": 1.0}), (1, dict(docs[0][2]))):
        seqnos[vb] += 1
        assert writer.add(Mutation(vb, seqnos[vb], f"k{vb}-{seqnos[vb]}", OP_UPDATE, 0, b"", None, 0, 0), doc)
        docs.append((vb, seqnos[vb], doc))
    writer.flush()
    assert coord.finish(end_of_input=True, timeout=300)

    late = {(r.vb, r.seqno) for r in store.dlq_rows(FN) if r.reason == "late"}
    assert {(0, seqnos[0]), (1, seqnos[1])} <= late
    got = ParquetWindowSink(WindowPaths.of(data_dir, FN).root / "results").read(FN)
    want = reference_sessions(docs, WindowSpec.from_dict(WINDOW), exclude=late)
    assert got.num_rows > 50
    assert_same_results(got, want)
    assert sum(r["count"] for r in got.to_pylist()) + len(late) == len(docs), (
        "every row once: a session or the DLQ"
    )
    assert any(r["user"] is None for r in got.to_pylist())
    counters = store.counters(FN)
    assert counters["windows_emitted"] == counters["windows_closed"] == got.num_rows
