"""Windowed-aggregation benchmark: eventing (Ray workers + window coordinator + merge) against Spark
Structured Streaming over the same rows, in one run, with identical results asserted.

Loads N mutations (faker, over D documents) whose event times `ts` span about 2 hours with up to 30 s of
disorder, then times:

(a) eventing: a window-only function (1-minute tumbling windows by `ts`, grouped by `country`, count and
    sum of `amount`, out-of-order tolerance 30 s) run with `--until-caught-up --close-windows` semantics on
    W Ray workers (default one per core). Ray is started afresh before it, as `eventing run` starts it (its
    new instance prestarts one idle worker process per CPU). Time = from the service's start (worker actors
    start inside the timing) to the return of `run()`, which is after the last window is in the sink. The
    rate once the workers were up is printed too.
(b) Spark Structured Streaming: the same rows (extracted from the same documents by the same row code,
    written as Parquet files of 50,000 rows, plus the watermark sentinel that closes the last windows) read
    as a Parquet stream with withWatermark(30 s) + window(1 minute) + groupBy(country), append mode, one
    availableNow trigger (`run_structured_streaming`). Time = from the query's start to its termination
    (its results are read back afterwards, untimed).

Both use the process's one SparkSession (local[*] unless --spark-master), warmed beforehand by running both
pipelines --warmup-runs times (default 3) on a small data set, so neither pays the JVM's cold start or its
first jobs' compilation. Prints both throughputs in rows/s (one row per update mutation) and their ratio;
the last line is JSON with eventing_rps, spark_ss_rps and ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import msgpack  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import ray  # noqa: E402

from eventing.control import lifecycle  # noqa: E402
from eventing.control.service import EventingService  # noqa: E402
from eventing.core.definition import FunctionDefinition  # noqa: E402
from eventing.core.mutation import OP_UPDATE  # noqa: E402
from eventing.storage import loadgen  # noqa: E402
from eventing.storage.bucket import LocalBucket  # noqa: E402
from eventing.storage.writes import chunked  # noqa: E402
from eventing.windows.batches import read_row_batch  # noqa: E402
from eventing.windows.runtime import host  # noqa: E402
from eventing.windows.runtime.coordinator import WindowCoordinator  # noqa: E402
from eventing.windows.runtime.paths import WindowPaths  # noqa: E402
from eventing.windows.runtime.row_writer import RowLayout, WindowRowWriter  # noqa: E402
from eventing.windows.spark.sink import ParquetWindowSink  # noqa: E402
from eventing.windows.spark.spark_session import get_spark  # noqa: E402
from eventing.windows.spark.structured_streaming import (  # noqa: E402
    run_structured_streaming,
    write_watermark_sentinel,
)
from eventing.workers.executor import RayExecutor, init_ray  # noqa: E402
from metadata.factory import open_store  # noqa: E402

FUNCTION = "fn_bench_windows"
WINDOW = {
    "kind": "tumbling",
    "size": "1m",
    "time_field": "ts",
    "group_by": ["country"],
    "aggregates": [{"op": "count"}, {"op": "sum", "field": "amount"}],
    "out_of_order_tolerance": "30s",
}
# --handler: the function's handler file. Window-only holds no code (a sandboxed one then runs without its
# child); on-update adds a handler called for every mutation beside the window (a sandboxed one crosses to
# its child for each).
HANDLERS = {
    "window-only": '"""Window-only: the window declared with the function does the work."""\n',
    "on-update": "def on_update(doc, meta):\n    pass\n",
}
SS_FILE_ROWS = 50_000
RAY_SETTLE_S = 3.0  # a new Ray instance's prestarted worker processes are up well within this


class Timed:
    """Wraps the window aggregator to report how long the merges took (with the default local master, a
    merge of few partial rows runs on the driver with Arrow, a larger one as a Spark job)."""

    def __init__(self, inner):
        self.inner, self.seconds, self.jobs = inner, 0.0, 0

    def __call__(self, rows_dir, layout, windows):
        start = time.perf_counter()
        try:
            return self.inner(rows_dir, layout, windows)
        finally:
            self.seconds += time.perf_counter() - start
            self.jobs += 1


def load(data_dir: str, documents: int, mutations: int) -> LocalBucket:
    bucket = LocalBucket.create(data_dir, "bench")
    for chunk in chunked(
        loadgen.generate(documents, mutations, seed=7, span_ms=2 * 3600 * 1000, disorder_ms=30_000), 50_000
    ):
        bucket.write(chunk)
    return bucket


def copy_bucket(bucket: LocalBucket, data_dir: str) -> str:
    """A new data directory holding a copy of ``bucket``, for one more run."""
    bucket.copy_to(data_dir)
    return data_dir


def run_eventing(
    data_dir: str, workers: int, batch_size: int, aggregator: Timed, handler: str = "window-only"
) -> tuple[float, dict]:
    defn = FunctionDefinition.from_dict(
        {
            "name": FUNCTION,
            "source_bucket": "bench",
            "worker_count": workers,
            "batch_size": batch_size,
            "checkpoint_interval": "1s",
            "window": WINDOW,
        }
    )
    lifecycle.save_function(data_dir, defn, HANDLERS[handler])
    lifecycle.deploy(data_dir, FUNCTION)
    marks: dict[str, float] = {}

    def on_progress(summary) -> None:
        sup = service.supervisors.get(FUNCTION)
        if sup is not None and sup.ready and "ready" not in marks:
            marks["ready"] = time.perf_counter()
        if sup is not None and sup.done and "caught_up" not in marks:
            marks["caught_up"] = time.perf_counter()

    # The end of the input closes every window, as `eventing run --close-windows`.
    service = EventingService(
        data_dir,
        RayExecutor(),
        until_caught_up=True,
        on_progress=on_progress,
        windows=host.WindowOptions(close_windows=True),
    )
    stopped = service.windows.function_stopped

    def function_stopped(sup) -> None:
        marks["caught_up"] = time.perf_counter()  # every row is on disk; the final window round begins
        stopped(sup)

    service.windows.function_stopped = function_stopped  # type: ignore[method-assign]
    polls = {"n": 0, "s": 0.0}
    original_poll = WindowCoordinator.poll

    def timed_poll(self, **kwargs):
        t = time.perf_counter()
        try:
            return original_poll(self, **kwargs)
        finally:
            polls["n"] += 1
            polls["s"] += time.perf_counter() - t

    WindowCoordinator.poll = timed_poll  # type: ignore[method-assign]
    start = time.perf_counter()
    try:
        summary = service.run()
    finally:
        WindowCoordinator.poll = original_poll  # type: ignore[method-assign]
    seconds = time.perf_counter() - start
    if summary.errors:
        raise SystemExit(f"error: eventing run failed: {summary.errors}")
    phases = {k: v - start for k, v in marks.items()}
    phases["polls"], phases["poll_s"] = polls["n"], polls["s"]
    return seconds, phases


def write_ss_input(bucket: LocalBucket, directory: str) -> int:
    """The rows eventing windows, extracted from the same documents by the same row writer."""
    layout = RowLayout.for_definition(FUNCTION, WINDOW)
    writer = WindowRowWriter(directory, "ss", 0, "extract", layout)
    rows = 0
    for batch in bucket.scan_log(50_000):
        for m in batch:
            if m.op != OP_UPDATE:
                continue
            writer.add(m, msgpack.unpackb(m.doc, raw=False))
            rows += 1
            if len(writer) >= SS_FILE_ROWS:
                writer.flush()
    writer.flush()
    # The writer hands rows on as Arrow files; Structured Streaming reads a Parquet stream.
    source = ss_source(directory)
    source.mkdir(parents=True, exist_ok=True)
    for path in sorted(WindowPaths.of(directory, "ss").incoming.glob("*.arrow")):
        pq.write_table(read_row_batch(path), source / path.with_suffix(".parquet").name)
    write_watermark_sentinel(source, list(layout.group_by), list(layout.value_columns))
    return rows


def ss_source(directory: str) -> Path:
    return Path(directory) / "ss-parquet"


def run_ss(spark, rows_dir: str, out_dir: str):
    """Time one Structured Streaming query from its start to its termination (reading its results back
    afterwards is not timed; eventing's time ends when its sink holds the last window, too)."""
    layout = RowLayout.for_definition(FUNCTION, WINDOW)
    shutil.rmtree(out_dir, ignore_errors=True)
    ended: list[float] = []
    start = time.perf_counter()
    results = run_structured_streaming(
        spark,
        rows_dir,
        size_ms=60_000,
        group_by=list(layout.group_by),
        aggregates=layout.aggregates,
        watermark_delay_ms=30_000,
        out_dir=out_dir,
        on_terminated=lambda: ended.append(time.perf_counter()),
    )
    return ended[0] - start, results


def compare(eventing, ss) -> float:
    """Assert both result tables hold the same windows, groups and counts, and sums equal up to float
    summation order; returns the largest relative difference of a sum."""
    a, b = eventing.to_pylist(), ss.to_pylist()
    assert len(a) == len(b), f"eventing has {len(a)} result rows, Structured Streaming {len(b)}"
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        assert (x["window_start_ms"], x["window_end_ms"], x["country"], x["count"]) == (
            y["window_start_ms"],
            y["window_end_ms"],
            y["country"],
            y["count"],
        ), f"results differ: {x} != {y}"
        diff = abs(x["sum_amount"] - y["sum_amount"]) / max(1.0, abs(y["sum_amount"]))
        assert math.isclose(x["sum_amount"], y["sum_amount"], rel_tol=1e-9), f"sums differ: {x} != {y}"
        worst = max(worst, diff)
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mutations", type=int, default=1_000_000)
    parser.add_argument("--documents", type=int, default=50_000)
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 2,
        help="Ray workers (default: one per core; more only contend for the cores)",
    )
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument("--warmup-mutations", type=int, default=100_000)
    parser.add_argument("--warmup-runs", type=int, default=3, help="runs of both pipelines before timing")
    parser.add_argument("--spark-master", default=None, help="default $EVENTING_SPARK_MASTER or local[*]")
    parser.add_argument("--data-dir", default=None, help="default: a fresh temporary directory")
    parser.add_argument(
        "--handler",
        choices=sorted(HANDLERS),
        default="window-only",
        help="the function's handler: window-only (no code, the default) or on-update (an on_update called "
        "for every mutation beside the window: a sandboxed function's child then runs the worker)",
    )
    args = parser.parse_args(argv)

    root = args.data_dir or tempfile.mkdtemp(prefix="eventing-bench-windows-")
    aggregator = Timed(host.SparkAggregator(args.spark_master))
    host.make_aggregator = lambda master=None: aggregator

    t0 = time.perf_counter()
    init_ray(windows=True)  # as `eventing run` starts it with a windowed function deployed
    spark = get_spark(args.spark_master)
    spark.range(1).count()
    print(f"start-up: Ray and Spark in {time.perf_counter() - t0:.1f}s")

    # Warm-up: both pipelines --warmup-runs times on a small data set (JVM code generation and JIT, Ray
    # worker processes), each eventing run on a fresh copy of the bucket and each Structured Streaming
    # query on a fresh checkpoint.
    warm = os.path.join(root, "warmup")
    warm_bucket = load(warm, min(5_000, args.documents), args.warmup_mutations)
    write_ss_input(warm_bucket, os.path.join(root, "warmup-ss"))
    t0 = time.perf_counter()
    for run in range(args.warmup_runs):
        run_eventing(
            copy_bucket(warm_bucket, os.path.join(root, f"warmup-{run}")),
            args.workers,
            args.batch_size,
            aggregator,
            args.handler,
        )
        run_ss(
            spark, str(ss_source(os.path.join(root, "warmup-ss"))), os.path.join(root, f"warmup-ss-out-{run}")
        )
    print(
        f"warm-up: both pipelines {args.warmup_runs}x over {args.warmup_mutations:,} mutations in "
        f"{time.perf_counter() - t0:.1f}s"
    )
    aggregator.seconds, aggregator.jobs = 0.0, 0

    data_dir = os.path.join(root, "data")
    t0 = time.perf_counter()
    bucket = load(data_dir, args.documents, args.mutations)
    print(
        f"load: {args.mutations:,} mutations over {args.documents:,} documents in "
        f"{time.perf_counter() - t0:.1f}s"
    )

    # Ray afresh, as `eventing run` finds it: a new instance prestarts one idle worker process per CPU,
    # which worker actors take (the warm-up's actors used up this instance's). Not timed, like ray.init.
    ray.shutdown()
    init_ray(windows=True)  # as `eventing run` starts it with a windowed function deployed
    time.sleep(RAY_SETTLE_S)

    eventing_s, phases = run_eventing(data_dir, args.workers, args.batch_size, aggregator, args.handler)
    store = open_store(data_dir)
    counters = store.counters(FUNCTION)
    rows = int(counters["window_rows_accepted"])
    late = int(counters.get("dlq_late", 0))
    eventing_results = ParquetWindowSink(WindowPaths.of(data_dir, FUNCTION).root / "results").read(FUNCTION)
    eventing_rps = rows / eventing_s
    print(
        f"eventing ({args.workers} Ray workers, coordinator, merge): {rows:,} rows in {eventing_s:.2f}s = "
        f"{eventing_rps:,.0f} rows/s from service start to the last window in the sink"
    )
    print(
        f"  workers up at {phases.get('ready', 0):.2f}s, every row on disk and workers stopped at "
        f"{phases.get('caught_up', 0):.2f}s; {phases['polls']} coordinator polls took "
        f"{phases['poll_s']:.2f}s in the service thread; {aggregator.jobs} merge(s) took "
        f"{aggregator.seconds:.2f}s"
    )
    print(
        f"  {int(counters['windows_emitted'])} windows, {eventing_results.num_rows} result rows, {late} late "
        "rows"
    )
    if late:
        raise SystemExit("error: the benchmark's tolerance covers its disorder, so no row should be late")
    after_start = eventing_s - phases.get("ready", 0.0)
    print(f"  once the workers were up: {rows / after_start:,.0f} rows/s ({after_start:.2f}s)")

    ss_dir = os.path.join(root, "ss")
    t0 = time.perf_counter()
    ss_rows = write_ss_input(bucket, ss_dir)
    print(
        f"Structured Streaming input: {ss_rows:,} rows as Parquet in {time.perf_counter() - t0:.1f}s (not "
        "timed)"
    )
    assert ss_rows == rows, f"eventing windowed {rows} rows, the extraction gave {ss_rows}"
    ss_s, ss_results = run_ss(spark, str(ss_source(ss_dir)), os.path.join(root, "ss-out"))
    spark_ss_rps = ss_rows / ss_s
    print(
        f"Spark Structured Streaming: {ss_rows:,} rows in {ss_s:.2f}s = {spark_ss_rps:,.0f} rows/s "
        "from query start to query end"
    )

    worst = compare(eventing_results, ss_results)
    print(
        f"results identical: {eventing_results.num_rows} (window, country) rows, equal counts, sums equal "
        f"(largest relative difference {worst:.1e}, float summation order)"
    )
    ratio = eventing_rps / spark_ss_rps
    print(f"ratio eventing/Structured Streaming: {ratio:.2f}")
    print(
        json.dumps(
            {
                "eventing_rps": round(eventing_rps),
                "spark_ss_rps": round(spark_ss_rps),
                "ratio": round(ratio, 3),
                "rows": rows,
                "mutations": args.mutations,
                "eventing_s": round(eventing_s, 2),
                "spark_ss_s": round(ss_s, 2),
                "eventing_rps_after_workers_up": round(rows / after_start),
                "workers": args.workers,
            }
        )
    )
    if not args.data_dir:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
