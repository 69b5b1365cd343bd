"""Two-phase aggregation: Arrow combines a batch of rows into partial aggregates per (window, group), and
the final aggregates are merged from those partials.

This is the split Spark makes itself (``partial_sum`` before the shuffle, ``merge_sum`` after) and Flink's
local-global aggregation: every supported aggregate is decomposable, so a window's result computed from the
partials of its batches equals the result over its rows. The window coordinator combines each batch of rows
it accepts (``combine_rows``, vectorised, ~0.1 us a row); the Spark job merges the partials of closed windows
(``eventing.windows.spark.spark_job.merge_partials``), which is a few rows per window and group instead of one
per mutation.

Partial batch: ``window_start_ms int64``, the group-by columns (string), then per aggregate:

- ``count`` (of rows, or of a field's non-null values): ``<name>`` int64, merged by sum;
- ``sum``, ``min``, ``max``: ``<name>`` float64, null when the batch had no non-null value, merged by the
  same op (SQL skips nulls, so a window whose values are all null stays null);
- ``avg``: ``<name>#sum`` float64 and ``<name>#n`` int64, merged as sum / n (null when n is 0).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from eventing.windows.batches import (
    EVENT_TIME,
    GROUP_BY_METADATA_KEY,
    WINDOW_START,
    AggregateColumn,
    check_aggregates,
)

AVG_SUM = "#sum"
AVG_COUNT = "#n"


def partial_columns(aggregates: Sequence[AggregateColumn]) -> list[tuple[str, pa.DataType, str, str | None]]:
    """``(partial column, type, Arrow aggregation, row column)`` for each column a partial batch carries."""
    out: list[tuple[str, pa.DataType, str, str | None]] = []
    for op, field, name in aggregates:
        if op == "count":
            out.append((name, pa.int64(), "count_all" if field is None else "count", field))
        elif op == "avg":
            out.append((name + AVG_SUM, pa.float64(), "sum", field))
            out.append((name + AVG_COUNT, pa.int64(), "count", field))
        else:
            out.append((name, pa.float64(), op, field))
    return out


def partial_schema(group_by: Sequence[str], aggregates: Sequence[AggregateColumn]) -> pa.Schema:
    check_aggregates(aggregates, group_by)
    return pa.schema(
        [
            pa.field(WINDOW_START, pa.int64(), nullable=False),
            *(pa.field(g, pa.string()) for g in group_by),
            *(pa.field(name, kind) for name, kind, _, _ in partial_columns(aggregates)),
        ],
        metadata={GROUP_BY_METADATA_KEY: json.dumps(list(group_by)).encode()},
    )


def window_starts(event_ms: np.ndarray, size_ms: int, slide_ms: int, offset_ms: int = 0) -> list[np.ndarray]:
    """For each row, the start of every window (aligned to the epoch plus ``offset_ms``) holding it: one array
    per window position (one for tumbling, size / slide for hopping), as ``window_range`` does row by row."""
    # numpy's % floors like Python's, so negative times align too
    last = event_ms - (event_ms - offset_ms) % slide_ms if offset_ms else event_ms - event_ms % slide_ms
    return [last - k * slide_ms for k in range(size_ms // slide_ms)]


def combine_rows(
    rows: pa.Table,
    *,
    size_ms: int,
    slide_ms: int,
    group_by: Sequence[str],
    aggregates: Sequence[AggregateColumn],
    offset_ms: int = 0,
) -> pa.Table:
    """Partial aggregates of ``rows`` (the row batch layout) per (window, group), in ``partial_schema``."""
    schema = partial_schema(group_by, aggregates)
    if rows.num_rows == 0:
        return schema.empty_table()
    event_ms = rows[EVENT_TIME].cast(pa.timestamp("ms", "UTC"), safe=False).cast(pa.int64())
    starts = window_starts(event_ms.to_numpy(), size_ms, slide_ms, offset_ms)
    columns = partial_columns(aggregates)
    fields = sorted({field for _, _, _, field in columns if field is not None})
    base = rows.select([*group_by, *fields])
    # A hopping window's row counts once in each of its windows: one copy of the rows per window position.
    expanded = pa.concat_tables([base.append_column(WINDOW_START, pa.array(s, pa.int64())) for s in starts])
    # Arrow names a result "<field>_<how>" (or "count_all"); sum(amount) may serve both sum and avg.
    result_names = ["count_all" if how == "count_all" else f"{field}_{how}" for _, _, how, field in columns]
    specs: dict[str, tuple[str | list[str], str]] = {
        result: ([], how) if how == "count_all" else (field, how)  # type: ignore[misc]
        for result, (_, _, how, field) in zip(result_names, columns, strict=True)
    }
    grouped = expanded.group_by([WINDOW_START, *group_by], use_threads=False).aggregate(list(specs.values()))
    picked = [
        grouped[result].cast(kind) for result, (_, kind, _, _) in zip(result_names, columns, strict=True)
    ]
    arrays = [grouped[WINDOW_START], *(grouped[g] for g in group_by), *picked]
    return pa.Table.from_arrays(arrays, schema=schema)


def merge_partial_tables(
    partials: pa.Table, *, size_ms: int, group_by: Sequence[str], aggregates: Sequence[AggregateColumn]
) -> dict[tuple, dict[str, object]]:
    """Merge partial rows in plain Python: ``{(window_start, *groups): {aggregate name: value}}`` (tests and
    small tables; Spark does it for the runtime)."""
    merged: dict[tuple, dict[str, float | int | None]] = {}
    for row in partials.to_pylist():
        key = (row[WINDOW_START], *(row[g] for g in group_by))
        acc = merged.setdefault(key, {})
        for op, _, name in aggregates:
            if op == "avg":
                for part in (name + AVG_SUM, name + AVG_COUNT):
                    acc[part] = _merge("sum", acc.get(part), row[part])
            else:
                acc[name] = _merge("sum" if op == "count" else op, acc.get(name), row[name])
    out: dict[tuple, dict[str, object]] = {}
    for key, acc in merged.items():
        values: dict[str, object] = {}
        for op, _, name in aggregates:
            if op == "avg":
                total, n = acc[name + AVG_SUM], acc[name + AVG_COUNT]
                values[name] = total / n if n else None  # type: ignore[operator]
            else:
                values[name] = acc[name]
        out[key] = values
    return out


# Partial rows up to which a merge for a local Spark master runs on the driver with Arrow
# (``merge_on_driver``): a Spark job for the ~16,000 partial rows of 121 closed windows (bench_windows) took
# 0.12-0.2 s on a quiet machine and up to 0.6 s on a loaded one (the JVM's threads wait for the cores),
# Arrow's hash aggregation 4-60 ms. Larger merges, and every merge for a Spark cluster, stay Spark jobs.
DRIVER_MERGE_ROWS = 1_000_000


def partial_files(partials_dir: str | os.PathLike[str]) -> list[str]:
    """The Parquet files under a local folder that a merge reads (hidden and ``_`` names skipped), sorted."""
    found = []
    for root, dirs, names in os.walk(partials_dir):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        found += [
            os.path.join(root, f) for f in names if f.endswith(".parquet") and not f.startswith((".", "_"))
        ]
    return sorted(found)


def requested_starts(windows: Sequence[tuple[int, int]], size_ms: int) -> list[int]:
    """The starts of the closed ``windows`` a merge is asked for, each checked to be ``size_ms`` long."""
    for start, end in windows:
        if end - start != size_ms:
            raise ValueError(
                f"window [{start}, {end}) is not {size_ms} ms long; ask only for this function's windows"
            )
    return sorted({start for start, _ in windows})


def merge_on_driver(
    partials_dir: str | os.PathLike[str],
    *,
    size_ms: int,
    group_by: Sequence[str],
    aggregates: Sequence[AggregateColumn],
    windows: Sequence[tuple[int, int]],
    max_rows: int | None = None,
) -> pa.Table | None:
    """``eventing.windows.spark.spark_job.merge_partials`` with Arrow's hash aggregation in this process: the
    results of the closed ``windows`` (``result_schema``, ordered by window then group) merged from every
    partial batch under ``partials_dir``, each aggregate as Spark merges it (counts and sums summed, min of
    mins, max of maxes, avg as sum / n, null when n is 0; nulls skipped). None, to leave the merge to Spark,
    when the files hold more than ``max_rows`` (default ``DRIVER_MERGE_ROWS``) partial rows or a min or max
    partial is NaN (Spark orders NaN above every number, Arrow skips it)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from eventing.windows.batches import WINDOW_END, result_schema, sort_results

    schema = result_schema(group_by, aggregates)
    starts = requested_starts(windows, size_ms)
    files = partial_files(partials_dir)
    if not starts or not files:
        return schema.empty_table()
    limit = DRIVER_MERGE_ROWS if max_rows is None else max_rows
    if sum(pq.ParquetFile(f).metadata.num_rows for f in files) > limit:
        return None
    parts = partial_schema(group_by, aggregates)
    table = pa.concat_tables([pq.read_table(f, schema=parts) for f in files])
    table = table.filter(pc.is_in(table[WINDOW_START], pa.array(starts, pa.int64())))
    if table.num_rows == 0:
        return schema.empty_table()
    specs: list[tuple[str, str]] = []
    for op, _, name in aggregates:
        if op in ("min", "max") and pc.any(pc.is_nan(table[name])).as_py():
            return None
        merged = [name + AVG_SUM, name + AVG_COUNT] if op == "avg" else [name]
        specs += [(column, op if op in ("min", "max") else "sum") for column in merged]
    grouped = table.group_by([WINDOW_START, *group_by], use_threads=False).aggregate(specs)
    columns: dict[str, pa.Array] = {
        WINDOW_START: grouped[WINDOW_START],
        WINDOW_END: pc.add(grouped[WINDOW_START], size_ms),
        **{g: grouped[g] for g in group_by},
    }
    for op, _, name in aggregates:
        if op == "avg":
            total, n = grouped[f"{name}{AVG_SUM}_sum"], grouped[f"{name}{AVG_COUNT}_sum"]
            positive = pc.greater(n, 0)
            columns[name] = pc.if_else(
                positive, pc.divide(total, pc.if_else(positive, n, 1).cast(pa.float64())), None
            )
        else:
            columns[name] = grouped[f"{name}_{op if op in ('min', 'max') else 'sum'}"]
    return sort_results(pa.Table.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema))


def _merge(op: str, a: float | int | None, b: float | int | None) -> float | int | None:
    if a is None:
        return b
    if b is None:
        return a
    if op == "sum":
        return a + b
    return min(a, b) if op == "min" else max(a, b)


# Session partials: one row per chain (``eventing.windows.semantics.sessions.Chain``) of a batch, keyed by its
# first row's time in ``window_start_ms`` and its last row's in SESSION_LAST; a closed session [start, last]
# of a group is merged from exactly the chains of that group with start <= first and last <= last.
SESSION_LAST = "session_last_ms"


def session_partial_schema(group_by: Sequence[str], aggregates: Sequence[AggregateColumn]) -> pa.Schema:
    base = partial_schema(group_by, aggregates)
    return base.insert(1, pa.field(SESSION_LAST, pa.int64(), nullable=False))


def combine_session_rows(
    rows: pa.Table,
    chain_of_row: np.ndarray,
    chain_first: np.ndarray,
    chain_last: np.ndarray,
    *,
    group_by: Sequence[str],
    aggregates: Sequence[AggregateColumn],
) -> pa.Table:
    """Partial aggregates of ``rows`` per chain (``chain_of_row[i]`` indexes ``chain_first``/``chain_last``),
    in ``session_partial_schema``."""
    schema = session_partial_schema(group_by, aggregates)
    if rows.num_rows == 0:
        return schema.empty_table()
    columns = partial_columns(aggregates)
    fields = sorted({field for _, _, _, field in columns if field is not None})
    base = rows.select([*group_by, *fields]).append_column("#chain", pa.array(chain_of_row, pa.int64()))
    result_names = ["count_all" if how == "count_all" else f"{field}_{how}" for _, _, how, field in columns]
    specs: dict[str, tuple[str | list[str], str]] = {
        result: ([], how) if how == "count_all" else (field, how)  # type: ignore[misc]
        for result, (_, _, how, field) in zip(result_names, columns, strict=True)
    }
    aggs = list(specs.values()) + [(g, "first") for g in group_by]
    grouped = base.group_by(["#chain"], use_threads=False).aggregate(aggs)
    chain = grouped["#chain"].to_numpy()
    picked = [
        grouped[result].cast(kind) for result, (_, kind, _, _) in zip(result_names, columns, strict=True)
    ]
    arrays = [
        pa.array(chain_first[chain], pa.int64()),
        pa.array(chain_last[chain], pa.int64()),
        *(grouped[f"{g}_first"].cast(pa.string()) for g in group_by),
        *picked,
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def merge_session_partial_tables(
    partials: pa.Table,
    sessions: Sequence[tuple[int, int, tuple]],
    *,
    group_by: Sequence[str],
    aggregates: Sequence[AggregateColumn],
    gap_ms: int,
) -> dict[tuple, dict[str, object]]:
    """Merge session partials in plain Python: ``{(start, end, *groups): {aggregate: value}}`` for the given
    ``(start, end, group)`` sessions (tests and small tables; Spark does it for the runtime)."""
    by_group: dict[tuple, list[tuple[int, int, int]]] = {}
    for start, end, group in sessions:
        by_group.setdefault(tuple(group), []).append((start, end - gap_ms, end))
    relabelled: dict[str, list] = {name: [] for name in partials.schema.names}
    keys: list[tuple] = []
    for row in partials.to_pylist():
        group = tuple(row[g] for g in group_by)
        for start, last, end in by_group.get(group, ()):
            if start <= row[WINDOW_START] and row[SESSION_LAST] <= last:
                keys.append((start, end))
                for name, value in row.items():
                    relabelled[name].append(value)
                break
    relabelled[WINDOW_START] = [k[0] for k in keys]  # the session's start identifies it within its group
    table = pa.Table.from_pydict(relabelled, schema=partials.schema).drop_columns([SESSION_LAST])
    merged = merge_partial_tables(table, size_ms=0, group_by=group_by, aggregates=aggregates)
    ends = {(k[0], *g): end for g, items in by_group.items() for k in items for end in [k[2]]}
    return {(key[0], ends[key], *key[1:]): values for key, values in merged.items()}
