"""Windowed aggregation on real PySpark (local[2]) against a plain-Python reference, and the window sinks."""

from __future__ import annotations

import math
import random
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from eventing.windows.batches import (
    WINDOW_END,
    WINDOW_START,
    AggregateColumn,
    atomic_write_parquet,
    build_row_batch,
    result_schema,
    row_schema,
    sort_results,
    write_row_batch,
)
from eventing.windows.spark import spark_job
from eventing.windows.spark.partials import combine_rows, merge_on_driver
from eventing.windows.spark.sink import ParquetWindowSink, SqliteWindowSink, WindowSink
from eventing.windows.spark.spark_job import aggregate_windows, merge_partials
from eventing.windows.spark.structured_streaming import run_structured_streaming, write_watermark_sentinel

pytestmark = pytest.mark.integration

# A minute boundary, so epoch-aligned windows of 10 s and 2.5 s start exactly here.
BASE_MS = 1_700_000_040_000
SPAN_MS = 60_000
GROUP_BY = ["region", "tier"]
VALUE_FIELDS = ["amount", "latency"]
AGGREGATES: list[AggregateColumn] = [
    ("count", None, "n"),
    ("count", "amount", "n_amount"),
    ("sum", "amount", "total"),
    ("avg", "amount", "mean"),
    ("min", "latency", "fastest"),
    ("max", "latency", "slowest"),
]
N_ROWS = 3000
BATCH_ROWS = 500

Row = dict[str, Any]


def generate_rows(n: int, seed: int = 7) -> list[Row]:
    """Rows with increasing seqnos per vBucket, some on window boundaries, some null groups and values.

    Values are multiples of 0.25 below 2**20, so every partial sum is exact and Spark's summation order
    cannot change a bit of the result.
    """
    rnd = random.Random(seed)
    seqnos: dict[int, int] = defaultdict(int)
    rows = []
    for i in range(n):
        vb = rnd.randrange(1024)
        seqnos[vb] += 1
        if i % 50 == 0:  # exactly on a 2.5 s boundary, or 1 ms before it
            t = BASE_MS + rnd.randrange(SPAN_MS // 2500) * 2500 - (i % 100 == 0)
        else:
            t = BASE_MS + rnd.randrange(SPAN_MS)
        rows.append(
            {
                "vb": vb,
                "seqno": seqnos[vb],
                "key": f"doc-{vb}-{seqnos[vb]}",
                "event_time_ms": t,
                "region": rnd.choice(["eu", "us", "ap", None]),
                "tier": rnd.choice(["gold", "free"]),
                "amount": None if rnd.random() < 0.1 else rnd.randrange(-4000, 4000) / 4,
                "latency": None if rnd.random() < 0.1 else float(rnd.randrange(1, 500)),
            }
        )
    return rows


def row_batch(rows: list[Row]) -> pa.Table:
    return build_row_batch(
        row_schema(GROUP_BY, VALUE_FIELDS),
        vb=[r["vb"] for r in rows],
        seqno=[r["seqno"] for r in rows],
        key=[r["key"] for r in rows],
        event_time_ms=[r["event_time_ms"] for r in rows],
        columns={c: [r[c] for r in rows] for c in [*GROUP_BY, *VALUE_FIELDS]},
    )


def write_rows(directory: Path, name: str, rows: list[Row]) -> Path:
    return write_row_batch(directory, name, row_batch(rows))


def reference(rows: list[Row], windows: list[tuple[int, int]]) -> dict[tuple, Row]:
    """Plain-Python windowed aggregation: one entry per (window, group values), unique rows only."""
    unique = {(r["vb"], r["seqno"]): r for r in rows}
    members: dict[tuple, list[Row]] = defaultdict(list)
    for row in unique.values():
        for start, end in windows:
            if start <= row["event_time_ms"] < end:
                members[(start, end, *(row[g] for g in GROUP_BY))].append(row)
    out = {}
    for key, group in members.items():
        result: Row = {}
        for op, field, name in AGGREGATES:
            values = [r[field] for r in group if r[field] is not None] if field else group
            if op == "count":
                result[name] = len(values)
            elif not values:
                result[name] = None
            elif op == "sum":
                result[name] = sum(values)
            elif op == "avg":
                result[name] = sum(values) / len(values)
            else:
                result[name] = min(values) if op == "min" else max(values)
        out[key] = result
    return out


def assert_matches_reference(result: pa.Table, expected: dict[tuple, Row]) -> None:
    assert result.column_names == [WINDOW_START, WINDOW_END, *GROUP_BY, *(a[2] for a in AGGREGATES)]
    got = {}
    for row in result.to_pylist():
        key = (row[WINDOW_START], row[WINDOW_END], *(row[g] for g in GROUP_BY))
        assert key not in got, f"two result rows for {key}"
        got[key] = {a[2]: row[a[2]] for a in AGGREGATES}
    assert got.keys() == expected.keys()
    for key, want in expected.items():
        for name, value in want.items():
            if name == "mean" and value is not None:
                assert math.isclose(got[key][name], value, rel_tol=0, abs_tol=1e-9), (key, name)
            else:
                assert got[key][name] == value, (key, name, got[key][name], value)


def tumbling_windows(size_ms: int, first_ms: int, last_start_ms: int) -> list[tuple[int, int]]:
    return [(s, s + size_ms) for s in range(first_ms, last_start_ms + 1, size_ms)]


def hopping_windows(size_ms: int, slide_ms: int, first_ms: int, last_start_ms: int) -> list[tuple[int, int]]:
    return [(s, s + size_ms) for s in range(first_ms, last_start_ms + 1, slide_ms)]


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return generate_rows(N_ROWS)


@pytest.fixture(scope="module")
def rows_dir(tmp_path_factory: pytest.TempPathFactory, rows: list[Row]) -> Path:
    directory = tmp_path_factory.mktemp("rows")
    for i in range(0, len(rows), BATCH_ROWS):
        write_rows(directory, f"batch-{i // BATCH_ROWS:03d}", rows[i : i + BATCH_ROWS])
    return directory


@pytest.fixture(scope="module")
def replayed_rows_dir(tmp_path_factory: pytest.TempPathFactory, rows_dir: Path, rows: list[Row]) -> Path:
    """The same rows plus a crash replay: batch 1 rewritten in place, batches 2-3 again under new names,
    and half of batch 4 again inside a new, otherwise fresh batch name."""
    directory = tmp_path_factory.mktemp("replayed")
    for path in rows_dir.glob("*.parquet"):
        shutil.copy(path, directory / path.name)
    write_rows(directory, "batch-001", rows[BATCH_ROWS : 2 * BATCH_ROWS])
    write_rows(directory, "replay-a", rows[2 * BATCH_ROWS : 4 * BATCH_ROWS])
    write_rows(directory, "replay-b", rows[4 * BATCH_ROWS : 4 * BATCH_ROWS + BATCH_ROWS // 2])
    return directory


@pytest.fixture(scope="module")
def tumbling_result(spark, rows_dir: Path) -> tuple[pa.Table, list[tuple[int, int]]]:
    # All 10 s windows over the data but the last: the caller's watermark has not closed that one yet.
    # One window far in the future has no rows and must produce no result row.
    windows = tumbling_windows(10_000, BASE_MS - 10_000, BASE_MS + SPAN_MS - 20_000)
    windows.append((BASE_MS + 10 * SPAN_MS, BASE_MS + 10 * SPAN_MS + 10_000))
    result = aggregate_windows(
        spark,
        rows_dir,
        size_ms=10_000,
        slide_ms=10_000,
        group_by=GROUP_BY,
        aggregates=AGGREGATES,
        windows=windows,
    )
    return result, windows


def test_tumbling_aggregation_matches_python_reference(tumbling_result, rows: list[Row]) -> None:
    result, windows = tumbling_result
    assert_matches_reference(result, reference(rows, windows))
    starts = set(result[WINDOW_START].to_pylist())
    assert BASE_MS + SPAN_MS - 10_000 not in starts  # the window left open is not emitted
    assert result.equals(sort_results(result))
    assert result.num_rows >= 5 * 8  # 5 windows full of rows x 4 regions (one null) x 2 tiers


def test_hopping_aggregation_puts_a_row_in_every_window_containing_it(spark, rows_dir: Path, rows) -> None:
    windows = hopping_windows(10_000, 2_500, BASE_MS - 7_500, BASE_MS + 40_000)
    result = aggregate_windows(
        spark,
        rows_dir,
        size_ms=10_000,
        slide_ms=2_500,
        group_by=GROUP_BY,
        aggregates=AGGREGATES,
        windows=windows,
    )
    expected = reference(rows, windows)
    assert_matches_reference(result, expected)
    # A row at t in [BASE, BASE + 40 s) lies in the 4 requested windows starting in (t - 10 s, t].
    memberships = [sum(1 for s, e in windows if s <= r["event_time_ms"] < e) for r in rows]
    assert {m for m, r in zip(memberships, rows, strict=True) if r["event_time_ms"] < BASE_MS + 40_000} == {4}
    assert sum(result["n"].to_pylist()) == sum(memberships)
    assert len({(r[WINDOW_START], r[WINDOW_END]) for r in result.to_pylist()}) == len(windows)


def test_window_bounds_are_start_inclusive_and_end_exclusive(spark, tmp_path: Path) -> None:
    base = [
        {"vb": 1, "seqno": s, "key": f"k{s}", "region": "eu", "tier": "gold", "amount": 1.0, "latency": 2.0}
        for s in (1, 2, 3)
    ]
    times = [BASE_MS, BASE_MS + 9_999, BASE_MS + 10_000]
    write_rows(tmp_path, "edges", [{**r, "event_time_ms": t} for r, t in zip(base, times, strict=True)])
    common: dict[str, Any] = {"group_by": ["region"], "aggregates": [("count", None, "n")]}
    tumbling = aggregate_windows(
        spark,
        tmp_path,
        size_ms=10_000,
        slide_ms=10_000,
        windows=[(BASE_MS, BASE_MS + 10_000), (BASE_MS + 10_000, BASE_MS + 20_000)],
        **common,
    )
    assert tumbling.to_pylist() == [
        {WINDOW_START: BASE_MS, WINDOW_END: BASE_MS + 10_000, "region": "eu", "n": 2},
        {WINDOW_START: BASE_MS + 10_000, WINDOW_END: BASE_MS + 20_000, "region": "eu", "n": 1},
    ]
    hopping = aggregate_windows(
        spark,
        tmp_path,
        size_ms=10_000,
        slide_ms=5_000,
        windows=hopping_windows(10_000, 5_000, BASE_MS - 5_000, BASE_MS + 10_000),
        **common,
    )
    assert [(r[WINDOW_START] - BASE_MS, r["n"]) for r in hopping.to_pylist()] == [
        (-5_000, 1),
        (0, 2),
        (5_000, 2),
        (10_000, 1),
    ]


def test_replayed_batches_do_not_double_count(spark, replayed_rows_dir: Path, tumbling_result) -> None:
    expected, windows = tumbling_result
    assert len(list(replayed_rows_dir.glob("*.parquet"))) == N_ROWS // BATCH_ROWS + 2
    result = aggregate_windows(
        spark,
        replayed_rows_dir,
        size_ms=10_000,
        slide_ms=10_000,
        group_by=GROUP_BY,
        aggregates=AGGREGATES,
        windows=windows,
    )
    assert result.equals(expected)


@pytest.mark.parametrize("folder", ["missing", "rows"])
def test_windows_without_rows_give_an_empty_table(spark, folder: str, rows_dir: Path, tmp_path: Path) -> None:
    result = aggregate_windows(
        spark,
        rows_dir if folder == "rows" else tmp_path / "nothing-yet",
        size_ms=1_000,
        slide_ms=1_000,
        group_by=GROUP_BY,
        aggregates=AGGREGATES,
        windows=[(0, 1_000)],
    )
    assert result.num_rows == 0
    assert result.column_names == [WINDOW_START, WINDOW_END, *GROUP_BY, *(a[2] for a in AGGREGATES)]


def test_windows_off_the_function_grid_are_refused(spark, rows_dir: Path) -> None:
    with pytest.raises(ValueError, match="grid"):
        aggregate_windows(
            spark,
            rows_dir,
            size_ms=10_000,
            slide_ms=10_000,
            group_by=GROUP_BY,
            aggregates=AGGREGATES,
            windows=[(BASE_MS, BASE_MS + 10_000), (BASE_MS + 5_000, BASE_MS + 15_000)],
        )


def test_row_batch_write_leaves_no_half_file_when_it_fails(tmp_path: Path, rows, monkeypatch) -> None:
    import eventing.windows.batches as rows_module

    def crash(*_args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(rows_module.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_rows(tmp_path, "batch-000", rows[:10])
    assert list(tmp_path.iterdir()) == []


def test_row_batch_with_naive_event_time_is_refused(tmp_path: Path) -> None:
    table = pa.table(
        {
            "vb": pa.array([1], pa.int32()),
            "seqno": pa.array([1], pa.int64()),
            "key": ["k"],
            "event_time": pa.array([0], pa.timestamp("us")),
        }
    )
    with pytest.raises(ValueError, match="tz='UTC'"):
        write_row_batch(tmp_path, "naive", table)


SINKS = {
    "parquet": lambda path: ParquetWindowSink(path / "windows"),
    "sqlite": lambda path: SqliteWindowSink(path / "windows.sqlite"),
}


@pytest.mark.parametrize("backend", sorted(SINKS))
def test_sink_writes_each_window_exactly_once(backend: str, tmp_path: Path, tumbling_result) -> None:
    results, _ = tumbling_result
    windows = {(r[WINDOW_START], r[WINDOW_END]) for r in results.to_pylist()}
    first_half = results.filter(pc.less(results[WINDOW_START], BASE_MS + 20_000))
    sink: WindowSink = SINKS[backend](tmp_path)

    assert sink.write("fn_score", first_half) == len({w for w in windows if w[0] < BASE_MS + 20_000})
    assert sink.write("fn_score", results) == len({w for w in windows if w[0] >= BASE_MS + 20_000})

    # Restart: a new sink on the same storage replays everything, with different numbers for one window.
    tampered = results.set_column(results.schema.get_field_index("n"), "n", pc.add(results["n"], 1000))
    restarted: WindowSink = SINKS[backend](tmp_path)
    assert restarted.write("fn_score", tampered) == 0
    assert restarted.write("fn_score", results) == 0

    assert restarted.read("fn_score").equals(results)
    assert restarted.written_windows("fn_score") == windows
    assert restarted.written_windows("fn_other") == set()
    assert restarted.read("fn_other").num_rows == 0
    assert not [p for p in tmp_path.rglob(".*")], "a temporary file was left behind"


@pytest.mark.parametrize("backend", sorted(SINKS))
def test_sink_records_closed_windows_without_rows(backend: str, tmp_path: Path, tumbling_result) -> None:
    results, _ = tumbling_result
    empty_window = (BASE_MS + 10 * SPAN_MS, BASE_MS + 10 * SPAN_MS + 10_000)
    sink: WindowSink = SINKS[backend](tmp_path)
    sink.write("fn_score", results.slice(0, 0), windows=[empty_window])
    assert sink.written_windows("fn_score") == {empty_window}
    assert sink.write("fn_score", results.slice(0, 0), windows=[empty_window]) == 0
    assert sink.read("fn_score").num_rows == 0


def test_parquet_and_sqlite_sinks_read_back_identically(tmp_path: Path, tumbling_result) -> None:
    results, _ = tumbling_result
    tables = []
    for backend in sorted(SINKS):
        sink: WindowSink = SINKS[backend](tmp_path)
        sink.write("fn_score", results)
        tables.append(sink.read("fn_score"))
    assert tables[0].equals(tables[1])
    assert tables[0].schema.equals(tables[1].schema)


def test_structured_streaming_matches_aggregate_windows_when_all_windows_are_closed(
    spark, replayed_rows_dir: Path, tmp_path: Path
) -> None:
    # Structured Streaming closes a window only when a later row moves its watermark past the end, so the
    # stream's input (a copy) gets one sentinel row in the year 2200: it closes every real window, and its
    # own window never closes, so it never reaches the results. The input includes the replayed batches,
    # so this also checks that both sides drop duplicate (vb, seqno) the same way.
    stream_dir = tmp_path / "stream"
    shutil.copytree(replayed_rows_dir, stream_dir)
    write_watermark_sentinel(stream_dir, GROUP_BY, VALUE_FIELDS)

    streamed = run_structured_streaming(
        spark,
        stream_dir,
        size_ms=10_000,
        group_by=GROUP_BY,
        aggregates=AGGREGATES,
        watermark_delay_ms=5_000,
        out_dir=tmp_path / "ss",
    )
    batch = aggregate_windows(
        spark,
        replayed_rows_dir,
        size_ms=10_000,
        slide_ms=10_000,
        group_by=GROUP_BY,
        aggregates=AGGREGATES,
        windows=tumbling_windows(10_000, BASE_MS - 10_000, BASE_MS + SPAN_MS),
    )
    assert batch.num_rows > 0
    assert streamed.equals(batch)


# -- two-phase aggregation: Arrow partials per batch, merged by Spark -----------------------------------


def write_partials(directory: Path, rows: list[Row], *, size_ms: int, slide_ms: int) -> None:
    """Each batch of rows combined on its own, as the window coordinator does for each accepted batch."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(0, len(rows), BATCH_ROWS):
        chunk = rows[i : i + BATCH_ROWS]
        partials = combine_rows(
            row_batch(chunk), size_ms=size_ms, slide_ms=slide_ms, group_by=GROUP_BY, aggregates=AGGREGATES
        )
        assert partials.num_rows < len(chunk), "partials are fewer than the rows they stand for"
        atomic_write_parquet(partials, directory / f"partials-{i // BATCH_ROWS:03d}.parquet", overwrite=True)


@pytest.mark.parametrize("through", ["arrow", "parquet"])
@pytest.mark.parametrize(("size_ms", "slide_ms"), [(10_000, 10_000), (10_000, 2_500)])
def test_spark_merges_partials_into_the_results_of_the_rows(
    spark, tmp_path: Path, rows, size_ms, slide_ms, through, monkeypatch
) -> None:
    if through == "parquet":  # as for a large partial set: Spark reads the files itself
        monkeypatch.setattr(spark_job, "DRIVER_PARTIAL_ROWS", 0)
    write_partials(tmp_path / "partials", rows, size_ms=size_ms, slide_ms=slide_ms)
    windows = hopping_windows(
        size_ms, slide_ms, BASE_MS - size_ms + slide_ms, BASE_MS + SPAN_MS - 2 * size_ms
    )
    windows.append((BASE_MS + 10 * SPAN_MS, BASE_MS + 10 * SPAN_MS + size_ms))  # no rows: no result row
    merged = merge_partials(
        spark,
        tmp_path / "partials",
        size_ms=size_ms,
        slide_ms=slide_ms,
        group_by=GROUP_BY,
        aggregates=AGGREGATES,
        windows=windows,
    )
    assert_matches_reference(merged, reference(rows, windows))
    assert merged.equals(sort_results(merged))
    assert merged.schema == result_schema(GROUP_BY, AGGREGATES)


@pytest.mark.parametrize(("size_ms", "slide_ms"), [(10_000, 10_000), (10_000, 2_500)])
def test_a_merge_on_the_driver_gives_exactly_sparks_results(spark, tmp_path: Path, rows, size_ms, slide_ms):
    """The merge a local master's runtime does with Arrow (eventing.windows.spark.partials.merge_on_driver)
    against Spark's over the same partials: the same table, null groups, null values and averages included."""
    write_partials(tmp_path / "partials", rows, size_ms=size_ms, slide_ms=slide_ms)
    windows = hopping_windows(
        size_ms, slide_ms, BASE_MS - size_ms + slide_ms, BASE_MS + SPAN_MS - 2 * size_ms
    )
    windows.append((BASE_MS + 10 * SPAN_MS, BASE_MS + 10 * SPAN_MS + size_ms))  # no rows: no result row
    shape = {"size_ms": size_ms, "group_by": GROUP_BY, "aggregates": AGGREGATES, "windows": windows}
    on_driver = merge_on_driver(tmp_path / "partials", **shape)
    assert on_driver is not None
    assert on_driver.equals(merge_partials(spark, tmp_path / "partials", slide_ms=slide_ms, **shape))
    assert on_driver.num_rows > 0


def test_a_window_whose_values_are_all_null_merges_to_null_sums_and_zero_counts(
    spark, tmp_path: Path
) -> None:
    rows = [
        {
            "vb": 1,
            "seqno": s,
            "key": f"k{s}",
            "event_time_ms": BASE_MS + s,
            "region": "eu",
            "tier": "gold",
            "amount": None,
            "latency": None,
        }
        for s in range(1, 4)
    ]
    write_partials(tmp_path / "partials", rows, size_ms=10_000, slide_ms=10_000)
    merged = merge_partials(
        spark,
        tmp_path / "partials",
        size_ms=10_000,
        slide_ms=10_000,
        group_by=GROUP_BY,
        aggregates=AGGREGATES,
        windows=[(BASE_MS, BASE_MS + 10_000)],
    )
    on_driver = merge_on_driver(
        tmp_path / "partials",
        size_ms=10_000,
        group_by=GROUP_BY,
        aggregates=AGGREGATES,
        windows=[(BASE_MS, BASE_MS + 10_000)],
    )
    assert on_driver is not None and on_driver.equals(merged)
    assert merged.to_pylist() == [
        {
            WINDOW_START: BASE_MS,
            WINDOW_END: BASE_MS + 10_000,
            "region": "eu",
            "tier": "gold",
            "n": 3,
            "n_amount": 0,
            "total": None,
            "mean": None,
            "fastest": None,
            "slowest": None,
        }
    ]
