"""Two-phase aggregation without Spark: partials of any split of the rows merge into the rows' results."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from eventing.testing.windows import python_aggregate
from eventing.windows.batches import build_row_batch, result_schema, row_schema, sort_results
from eventing.windows.spark.partials import (
    combine_rows,
    merge_on_driver,
    merge_partial_tables,
    partial_schema,
)

GROUP_BY = ["g"]
AGGREGATES = [
    ("count", None, "n"),
    ("count", "v#present", "n_v"),
    ("sum", "v", "total"),
    ("avg", "v", "mean"),
    ("min", "v", "low"),
    ("max", "v", "high"),
]
SCHEMA = row_schema(GROUP_BY, ["v", "v#present"])

row_strategy = st.fixed_dictionaries(
    {
        # Around the epoch, so negative times and their window alignment are covered too.
        "event_time_ms": st.integers(-25_000, 25_000),
        "g": st.sampled_from(["a", "b", None]),
        "v": st.one_of(st.none(), st.integers(-1000, 1000).map(lambda i: i / 4)),
    }
)


def batch(rows: list[dict]) -> pa.Table:
    return build_row_batch(
        SCHEMA,
        vb=[0] * len(rows),
        seqno=list(range(1, len(rows) + 1)),
        key=["k"] * len(rows),
        event_time_ms=[r["event_time_ms"] for r in rows],
        columns={
            "g": [r["g"] for r in rows],
            "v": [r["v"] for r in rows],
            "v#present": [None if r["v"] is None else 1.0 for r in rows],
        },
    )


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(row_strategy, max_size=60),
    cuts=st.lists(st.integers(0, 60), max_size=4),
    shape=st.sampled_from([(10_000, 10_000), (10_000, 2_500), (6_000, 3_000)]),
)
def test_partials_of_any_split_merge_into_the_results_of_all_rows(rows, cuts, shape) -> None:
    size_ms, slide_ms = shape
    bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    parts = [
        combine_rows(
            batch(rows[a:b]), size_ms=size_ms, slide_ms=slide_ms, group_by=GROUP_BY, aggregates=AGGREGATES
        )
        for a, b in zip(bounds, bounds[1:], strict=False)
    ]
    schema = partial_schema(GROUP_BY, AGGREGATES)
    merged = merge_partial_tables(
        pa.concat_tables(parts) if parts else schema.empty_table(),
        size_ms=size_ms,
        group_by=GROUP_BY,
        aggregates=AGGREGATES,
    )
    windows = {(s, s + size_ms) for s in range(-60_000, 60_000, slide_ms)}
    rows_in = [{**r, "v#present": None if r["v"] is None else 1.0} for r in rows]
    expected = python_aggregate(
        rows_in, size_ms=size_ms, slide_ms=slide_ms, group_by=GROUP_BY, aggregates=AGGREGATES, windows=windows
    ).to_pylist()
    assert len(merged) == len(expected)
    for want in expected:
        got = merged[(want["window_start_ms"], want["g"])]
        for _, _, name in AGGREGATES:
            if isinstance(want[name], float):
                assert math.isclose(got[name], want[name], rel_tol=1e-12, abs_tol=1e-12), (name, got, want)
            else:
                assert got[name] == want[name], (name, got, want)


def test_a_batch_becomes_one_partial_row_per_window_and_group() -> None:
    rows = [
        {"event_time_ms": 1_000, "g": "a", "v": 1.0},
        {"event_time_ms": 9_999, "g": "a", "v": None},
        {"event_time_ms": 10_000, "g": "a", "v": 4.0},
        {"event_time_ms": 2_000, "g": None, "v": 2.5},
    ]
    partials = combine_rows(
        batch(rows), size_ms=10_000, slide_ms=10_000, group_by=GROUP_BY, aggregates=AGGREGATES
    )
    got = sorted(partials.to_pylist(), key=lambda r: (r["window_start_ms"], r["g"] or ""))
    assert got == [
        {
            "window_start_ms": 0,
            "g": None,
            "n": 1,
            "n_v": 1,
            "total": 2.5,
            "mean#sum": 2.5,
            "mean#n": 1,
            "low": 2.5,
            "high": 2.5,
        },
        {
            "window_start_ms": 0,
            "g": "a",
            "n": 2,
            "n_v": 1,
            "total": 1.0,
            "mean#sum": 1.0,
            "mean#n": 1,
            "low": 1.0,
            "high": 1.0,
        },
        {
            "window_start_ms": 10_000,
            "g": "a",
            "n": 1,
            "n_v": 1,
            "total": 4.0,
            "mean#sum": 4.0,
            "mean#n": 1,
            "low": 4.0,
            "high": 4.0,
        },
    ]


@settings(max_examples=30, deadline=None)
@given(
    rows=st.lists(row_strategy, max_size=60),
    cuts=st.lists(st.integers(0, 60), max_size=3),
    shape=st.sampled_from([(10_000, 10_000), (10_000, 2_500)]),
    asked=st.sets(st.integers(-8, 5), max_size=8),
)
def test_a_merge_on_the_driver_gives_the_merged_partials_of_the_windows_asked(
    tmp_path_factory, rows, cuts, shape, asked
) -> None:
    """merge_on_driver (a local master's merge, Arrow) against the plain merge, window by window: the windows
    asked for and only those, null groups, all-null values (null sums, a zero count, a null average)."""
    size_ms, slide_ms = shape
    folder = tmp_path_factory.mktemp("partials")
    bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        part = combine_rows(
            batch(rows[a:b]), size_ms=size_ms, slide_ms=slide_ms, group_by=GROUP_BY, aggregates=AGGREGATES
        )
        pq.write_table(part, folder / f"f{i:03d}.parquet")
    windows = [(k * slide_ms, k * slide_ms + size_ms) for k in sorted(asked)]
    got = merge_on_driver(folder, size_ms=size_ms, group_by=GROUP_BY, aggregates=AGGREGATES, windows=windows)
    assert got is not None
    assert got.schema == result_schema(GROUP_BY, AGGREGATES)
    assert got.equals(sort_results(got))
    schema = partial_schema(GROUP_BY, AGGREGATES)
    files = sorted(folder.glob("*.parquet"))
    merged = merge_partial_tables(
        pa.concat_tables([pq.read_table(f) for f in files]) if files else schema.empty_table(),
        size_ms=size_ms,
        group_by=GROUP_BY,
        aggregates=AGGREGATES,
    )
    starts = {start for start, _ in windows}
    expected = {key: values for key, values in merged.items() if key[0] in starts}
    assert len(got) == len(expected)
    for row in got.to_pylist():
        assert row["window_end_ms"] == row["window_start_ms"] + size_ms
        want = expected[(row["window_start_ms"], row["g"])]
        for _, _, name in AGGREGATES:
            if isinstance(want[name], float):
                assert math.isclose(row[name], want[name], rel_tol=1e-12, abs_tol=1e-12), (name, row, want)
            else:
                assert row[name] == want[name], (name, row, want)


def test_a_merge_on_the_driver_leaves_large_merges_and_nan_extremes_to_spark(tmp_path) -> None:
    rows = [
        {"event_time_ms": 1_000, "g": "a", "v": 1.0},
        {"event_time_ms": 2_000, "g": "a", "v": 3.0},
    ]
    shape = {"size_ms": 10_000, "group_by": GROUP_BY, "aggregates": AGGREGATES, "windows": [(0, 10_000)]}
    part = combine_rows(
        batch(rows), slide_ms=10_000, **{k: shape[k] for k in ("size_ms", "group_by", "aggregates")}
    )
    pq.write_table(part, tmp_path / "f000.parquet")
    merged = merge_on_driver(tmp_path, **shape)
    assert merged is not None and merged.to_pylist()[0]["total"] == 4.0
    assert merge_on_driver(tmp_path, max_rows=0, **shape) is None  # more partial rows than the driver takes
    nan = part.set_column(part.schema.get_field_index("high"), "high", pa.array([math.nan], pa.float64()))
    pq.write_table(nan, tmp_path / "f001.parquet")
    assert merge_on_driver(tmp_path, **shape) is None  # Spark's max of NaN is NaN; Arrow's would skip it
