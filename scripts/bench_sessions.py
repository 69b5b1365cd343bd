"""Session windows: the two-phase path (coordinator cuts chains and merges sessions, Spark merges the closed
sessions' partials) against Spark's own ``session_window`` over the raw rows, on the same rows, in one run.

Rows: N rows over U users, one every ~2 ms of event time on average, with up to --disorder-ms of disorder;
gap 10 s, count + sum(amount). Times:

(a) coordinator: every row batch (2,000 rows) through ``WindowCoordinator.poll`` (read, dedup, chain
    cutting, ``SessionOperator``, session partials written, state committed), Spark jobs excluded;
(b) Spark merge: ``merge_session_partials`` of every closed session from the partials (one job);
(c) Spark ``session_window``: ``groupBy(session_window(event_time, '10 seconds'), user).agg(...)`` over the
    raw rows as Parquet (one job), the alternative, which would also need every raw row of every open
    session kept until it closes and still needs (a)'s session tracking to know which sessions closed and
    which rows are late.

Both Spark jobs run twice and the second run is reported (the first pays compilation). Results of (b) and
(c) are asserted equal. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow.parquet as pq  # noqa: E402

from eventing.core.mutation import OP_UPDATE, Mutation  # noqa: E402
from eventing.windows.batches import read_row_batch  # noqa: E402
from eventing.windows.runtime.coordinator import WindowCoordinator  # noqa: E402
from eventing.windows.runtime.paths import WindowPaths  # noqa: E402
from eventing.windows.runtime.row_writer import RowLayout, WindowRowWriter  # noqa: E402
from metadata.factory import open_store  # noqa: E402

FN = "fn_bench_sessions"
WINDOW = {
    "kind": "session",
    "gap": "10s",
    "time_field": "ts",
    "group_by": ["user"],
    "aggregates": ["count", {"op": "sum", "field": "amount"}],
    "out_of_order_tolerance": "30s",
}
T0 = 1_767_225_600_000
BATCH = 2000


class HeldEmitter:
    """Keeps emission jobs instead of running them, so (a) times the coordinator alone."""

    def __init__(self) -> None:
        self.jobs = 0

    def submit(self, fn, /, *args):  # type: ignore[no-untyped-def]
        from concurrent.futures import Future

        self.jobs += 1
        return Future()  # never done: the coordinator keeps the sessions pending


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--disorder-ms", type=int, default=20_000)
    parser.add_argument("--spark-master", default="local[2]")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    if args.rows <= 0 or args.users <= 0:
        parser.error("--rows and --users must be positive")

    say = (lambda *a: None) if args.json else print
    work = Path(tempfile.mkdtemp(prefix="bench-sessions-"))
    try:
        data_dir = str(work / "data")
        os.makedirs(data_dir)
        layout = RowLayout.for_definition(FN, WINDOW)
        rnd = random.Random(15)
        raw_dir = work / "raw"
        raw_dir.mkdir()
        incoming = WindowPaths.of(data_dir, FN).incoming
        store = open_store(data_dir)
        emitter = HeldEmitter()
        coord = WindowCoordinator(
            data_dir,
            FN,
            1,
            WINDOW,
            store,
            aggregator=lambda *a: None,
            emitter=emitter,
            clock=lambda: T0,
            close_windows=True,
        )
        seqnos = [0] * 64
        coordinator_s = 0.0
        for start in range(0, args.rows, BATCH):
            writer = WindowRowWriter(data_dir, FN, 1, "local/w0", layout)
            for i in range(start, min(start + BATCH, args.rows)):
                vb = rnd.randrange(64)
                seqnos[vb] += 1
                # A row every 2 ms, and a 15 s pause every minute of event time, so sessions end there.
                t = T0 + i * 2 + (i // 30_000) * 15_000 - rnd.randint(0, args.disorder_ms)
                doc = {"ts": t, "user": f"u{rnd.randrange(args.users)}", "amount": float(rnd.randint(1, 100))}
                writer.add(Mutation(vb, seqnos[vb], f"k{i}", OP_UPDATE, 0, b"", None, 0, 0), doc)
            writer.flush()
            for path in sorted(incoming.glob("*.arrow")):
                pq.write_table(read_row_batch(path), raw_dir / path.with_suffix(".parquet").name)
            started = time.perf_counter()
            coord.poll(end_of_input=start + BATCH >= args.rows)
            coordinator_s += time.perf_counter() - started
        sessions = [p.job_key for p in coord.pending]
        partial_rows = sum(
            pq.ParquetFile(p).metadata.num_rows for p in coord.paths.accepted.glob("*.parquet")
        )
        late = args.rows - sum(a.rows for a in coord.accepted)
        say(
            f"(a) coordinator: {args.rows:,} rows in {coordinator_s:.2f}s = {args.rows / coordinator_s:,.0f} "
            f"rows/s ({coordinator_s / args.rows * 1e6:.2f} us a row); {len(sessions):,} sessions, "
            f"{partial_rows:,} partial rows, {late} late rows"
        )

        from pyspark.sql import functions as F

        from eventing.windows.spark.spark_job import merge_session_partials
        from eventing.windows.spark.spark_session import get_spark

        spark = get_spark(args.spark_master)
        merged = None
        merge_s = 0.0
        for _ in range(2):
            started = time.perf_counter()
            merged = merge_session_partials(
                spark,
                coord.paths.accepted,
                gap_ms=10_000,
                group_by=["user"],
                aggregates=layout.aggregates,
                sessions=sessions,
            )
            merge_s = time.perf_counter() - started
        say(f"(b) Spark merge of the closed sessions' partials: {merge_s:.2f}s")

        sw_s = 0.0
        sw = None
        for _ in range(2):
            started = time.perf_counter()
            df = (
                spark.read.parquet(str(raw_dir))
                .groupBy(F.session_window("event_time", "10 seconds").alias("s"), "user")
                .agg(F.count(F.lit(1)).alias("count"), F.sum("amount").alias("sum_amount"))
                .select(
                    F.unix_millis("s.start").alias("window_start_ms"),
                    F.unix_millis("s.end").alias("window_end_ms"),
                    "user",
                    "count",
                    "sum_amount",
                )
            )
            sw = df.toArrow()
            sw_s = time.perf_counter() - started
        say(f"(c) Spark session_window over the raw rows: {sw_s:.2f}s")
        assert merged is not None and sw is not None
        same = None
        if not late:  # (c) cannot leave late rows out; compare when there are none
            a = sorted(
                (r["user"], r["window_start_ms"], r["window_end_ms"], r["count"]) for r in merged.to_pylist()
            )
            b = sorted(
                (r["user"], r["window_start_ms"], r["window_end_ms"], r["count"]) for r in sw.to_pylist()
            )
            same = a == b
            assert same, "session_window and the two-phase path disagree"
            say(f"results identical: {len(a):,} sessions")
        result = {
            "rows": args.rows,
            "sessions": len(sessions),
            "partial_rows": partial_rows,
            "late_rows": late,
            "coordinator_s": round(coordinator_s, 3),
            "coordinator_us_per_row": round(coordinator_s / args.rows * 1e6, 3),
            "spark_merge_s": round(merge_s, 3),
            "spark_session_window_s": round(sw_s, 3),
            "identical": same,
        }
        print(json.dumps(result))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
