"""Two-phase aggregation without Spark: partials of any split of the rows merge into the rows' results."""

from __future__ import annotations

import math

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from eventing.testing.windows import python_aggregate
from eventing.windows.batches import build_row_batch, row_schema
from eventing.windows.spark.partials import combine_rows, merge_partial_tables, partial_schema

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
