"""Windows whose files and results are in PostgreSQL, with real PySpark and a real PostgreSQL server: Spark
merges partials it gets from the store (as Arrow from the driver, or read from a local scratch copy when
they are many), and a service killed right after its state commit or right after its sink write is taken
over by a service on another data directory, which emits every window exactly once from what the store
holds. The metadata and the buckets stay in SQLite files here (every `State.file_area` of a data directory
is patched to the store's files table): the windows' part of the state is what is on trial."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_UPDATE, Mutation, decode_document
from eventing.storage import loadgen
from eventing.storage.state import DirectoryState
from eventing.testing import load_source
from eventing.testing.windows import ManualClock, assert_same_results, reference_results, results_sink
from eventing.windows.runtime.coordinator import WindowCoordinator
from eventing.windows.runtime.emission import FAULT_ENV, FAULT_EXIT_CODE
from eventing.windows.runtime.host import SparkAggregator, WindowOptions
from eventing.windows.runtime.row_writer import RowLayout, WindowRowWriter
from eventing.windows.semantics import WindowSpec
from eventing.windows.spark import partials, spark_job
from eventing.windows.spark.postgres_sink import PostgresWindowSink
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store

pytestmark = pytest.mark.integration

MIN = 60_000
T0 = loadgen.BASE_TIME_MS
FN = "fn_pg_win"
WINDOW: dict[str, Any] = {
    "kind": "tumbling",
    "size": "1m",
    "time_field": "ts",
    "group_by": ["country"],
    "aggregates": [
        "count",
        {"op": "sum", "field": "amount"},
        {"op": "avg", "field": "amount"},
        {"op": "max", "field": "purchases"},
    ],
    "out_of_order_tolerance": "5s",
}
# A service process whose windows keep their files and results in the store at argv[1].
DRIVER = """
import sys
from eventing.storage.postgres.file_area import PostgresArea
from eventing.storage.state import DirectoryState
DirectoryState.file_area = lambda self, root: PostgresArea.open(sys.argv[1], root)
from eventing.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture
def files_on(monkeypatch, pg_url) -> str:
    from eventing.storage.postgres.file_area import PostgresArea

    monkeypatch.setattr(DirectoryState, "file_area", lambda self, root: PostgresArea.open(pg_url, root))
    return pg_url


@pytest.mark.parametrize("through", ["driver", "arrow", "parquet"])
def test_spark_merges_partials_kept_in_postgresql(spark, data_dir, files_on, monkeypatch, through):
    if through != "driver":  # past what the driver merges with Arrow: a Spark job
        monkeypatch.setattr(partials, "DRIVER_MERGE_ROWS", 0)
    if through == "parquet":  # partials past the driver's share: local Spark reads the scratch copy's files
        monkeypatch.setattr(spark_job, "DRIVER_PARTIAL_ROWS", 0)
    layout = RowLayout.for_definition(FN, WINDOW)
    store = open_store(data_dir)
    coordinator = WindowCoordinator(
        data_dir,
        FN,
        1,
        WINDOW,
        store,
        aggregator=SparkAggregator("local[2]"),
        clock=ManualClock(T0),
        close_windows=True,
    )
    assert isinstance(coordinator.sink, PostgresWindowSink)
    docs: list[tuple[int, int, dict]] = []
    for round_ in range(4):
        writer = WindowRowWriter(data_dir, FN, 1, f"local/w{round_ % 2}", layout)
        for i in range(300):
            vb, seqno = i % 8, round_ * 300 + i + 1
            doc = {
                "ts": T0 + round_ * 40_000 + i * 170,
                "country": ["KR", "US", "FR"][i % 3],
                "amount": i / 4,
                "purchases": i % 7,
            }
            assert writer.add(Mutation(vb, seqno, f"k{seqno}", OP_UPDATE, 0, b"", None, 0, 0), doc)
            docs.append((vb, seqno, doc))
        writer.flush()
        coordinator.poll()
    assert coordinator.finish(end_of_input=True, timeout=300)
    sink = results_sink(data_dir, FN, WINDOW)
    windows = sorted(sink.written_windows(FN))
    assert len(windows) == 3 and store.dlq_rows(FN) == []
    assert_same_results(sink.read(FN), reference_results(docs, WindowSpec.from_dict(WINDOW), windows))
    assert not (Path(data_dir) / "windows").exists(), "nothing of the windows is in the data directory"
    store.close()


@pytest.mark.parametrize("fault", ["after_state_commit", "after_sink_write"])
def test_a_killed_service_s_windows_are_taken_over_from_postgresql_by_another_data_directory(
    tmp_path, spark, files_on, fault
):
    first = str(tmp_path / "first")
    source = load_source(first, 300, 3000, seed=11, span_ms=10 * MIN, disorder_ms=5_000)
    docs = [
        (m.vb, m.seqno, decode_document(m.doc))
        for batch in source.scan_log()
        for m in batch
        if m.op == OP_UPDATE
    ]
    source.close()
    defn = FunctionDefinition.from_dict(
        {
            "name": FN,
            "source_bucket": "src",
            "worker_count": 2,
            "checkpoint_interval": "100ms",
            "batch_size": 100,
            "window": WINDOW,
        }
    )
    lifecycle.save_function(first, defn, '"""Window-only."""\n')
    lifecycle.deploy(first, FN)
    driver = subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            files_on,
            "--data-dir",
            first,
            "run",
            "--until-caught-up",
            "--quiet",
            "--executor",
            "in-process",
            "--close-windows",
            "--spark-master",
            "local[1]",
        ],
        env={**os.environ, FAULT_ENV: fault},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert driver.returncode == FAULT_EXIT_CODE, driver.stderr[-2000:]
    assert not (Path(first) / "windows").exists(), "the dead service kept nothing of its windows on its disk"
    sink = PostgresWindowSink.open(files_on)
    written_before = sink.written_windows(FN)
    assert bool(written_before) == (fault == "after_sink_write")

    # Another machine: the metadata and buckets as they were (here a copy; with the store on PostgreSQL,
    # the same tables), no window file of the dead service.
    second = str(tmp_path / "second")
    shutil.copytree(first, second)
    summary = EventingService(
        second, InProcessExecutor(), until_caught_up=True, windows=WindowOptions(close_windows=True)
    ).run()
    assert not summary.errors, summary.errors
    store = open_store(second)
    late = {(r.vb, r.seqno) for r in store.dlq_rows(FN)}
    assert late == set()
    windows = sorted({(t - t % MIN, t - t % MIN + MIN) for t in (d[2]["ts"] for d in docs)})
    assert sorted(sink.written_windows(FN)) == windows
    assert_same_results(sink.read(FN), reference_results(docs, WindowSpec.from_dict(WINDOW), windows))
    counters = store.counters(FN)
    assert counters["windows_emitted"] == len(windows) and counters["window_rows_accepted"] == len(docs)
    assert store.window_states().load(FN)["pending"] == []
    assert not (Path(second) / "windows").exists()
    store.close()
