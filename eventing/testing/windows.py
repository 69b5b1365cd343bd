"""Test harness for windowed functions: a movable clock, a pure-Python aggregator with the Spark job's
contract, and a reference computation of window results straight from documents.

``python_aggregate`` is an independent re-implementation (plain loops over dicts, no Spark, no Arrow
compute) used to check the runtime's results and to run the coordinator in unit tests without a JVM.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eventing.windows.batches import result_schema, sort_results
from eventing.windows.runtime.row_writer import RowLayout
from eventing.windows.semantics import WindowSpec, window_range
from eventing.windows.semantics.sessions import Session, plain_sessions
from eventing.windows.spark.partials import (
    merge_partial_tables,
    merge_session_partial_tables,
    partial_schema,
    session_partial_schema,
)


class ManualClock:
    """Processing time that moves only when told to (epoch ms)."""

    def __init__(self, now_ms: int):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms


def python_aggregate(
    rows: Iterable[Mapping[str, Any]],
    *,
    size_ms: int,
    slide_ms: int,
    group_by: Sequence[str],
    aggregates: Sequence[tuple[str, str | None, str]],
    windows: Iterable[tuple[int, int]],
    offset_ms: int = 0,
) -> pa.Table:
    """Window results of ``rows`` (dicts with ``event_time_ms`` and the named fields) for ``windows``.

    count without a field counts rows; count(field) counts rows whose field is not None; sum, avg, min
    and max read the field as a float and skip None, as SQL does. Returns the result layout, sorted.
    """
    wanted = set(windows)
    groups: dict[tuple[int, int, tuple[Any, ...]], list[Mapping[str, Any]]] = {}
    for row in rows:
        t = row["event_time_ms"]
        key = tuple(row.get(g) for g in group_by)
        for w in window_range(t, size_ms, slide_ms, offset_ms):
            if (w.start_ms, w.end_ms) in wanted:
                groups.setdefault((w.start_ms, w.end_ms, key), []).append(row)
    schema = result_schema(list(group_by), list(aggregates))  # type: ignore[arg-type]
    out: dict[str, list[Any]] = {name: [] for name in schema.names}
    for (start, end, key), members in groups.items():
        out["window_start_ms"].append(start)
        out["window_end_ms"].append(end)
        for g, value in zip(group_by, key, strict=True):
            out[g].append(value)
        for op, field, name in aggregates:
            out[name].append(_aggregate(op, field, members))
    table = pa.Table.from_pydict(out, schema=schema)
    return sort_results(table)


def _aggregate(op: str, field: str | None, members: list[Mapping[str, Any]]) -> Any:
    if field is None:
        return len(members)
    if op == "count":
        return sum(1 for m in members if m.get(field) is not None)
    values = [float(m[field]) for m in members if m.get(field) is not None]
    if not values:
        return None
    if op == "sum":
        return math.fsum(values)
    if op == "avg":
        return math.fsum(values) / len(values)
    return min(values) if op == "min" else max(values)


def python_aggregator(partials_dir: Path, layout: RowLayout, windows: list[tuple]) -> pa.Table:
    """An ``Aggregator`` (see ``eventing.windows.runtime.coordinator``) without Spark: merges the partial
    batches in plain Python."""
    spec = layout.spec
    files = [p for p in sorted(Path(partials_dir).rglob("*.parquet")) if not p.name.startswith((".", "_"))]
    if spec.is_session:
        return _python_session_aggregator(files, layout, windows)
    schema = partial_schema(layout.group_by, layout.aggregates)
    partials = (
        pa.concat_tables([pq.read_table(p).select(schema.names).cast(schema) for p in files])
        if files
        else schema.empty_table()
    )
    merged = merge_partial_tables(
        partials, size_ms=spec.size_ms, group_by=layout.group_by, aggregates=layout.aggregates
    )
    wanted = {start for start, _ in windows}
    result = result_schema(list(layout.group_by), layout.aggregates)
    out: dict[str, list[Any]] = {name: [] for name in result.names}
    for (start, *groups), values in merged.items():
        if start not in wanted:
            continue
        out["window_start_ms"].append(start)
        out["window_end_ms"].append(start + spec.size_ms)
        for g, value in zip(layout.group_by, groups, strict=True):
            out[g].append(value)
        for name, value in values.items():
            out[name].append(value)
    return sort_results(pa.Table.from_pydict(out, schema=result))


def _python_session_aggregator(files: list[Path], layout: RowLayout, sessions: list[tuple]) -> pa.Table:
    schema = session_partial_schema(layout.group_by, layout.aggregates)
    partials = (
        pa.concat_tables([pq.read_table(p).select(schema.names).cast(schema) for p in files])
        if files
        else schema.empty_table()
    )
    merged = merge_session_partial_tables(
        partials, sessions, group_by=layout.group_by, aggregates=layout.aggregates, gap_ms=layout.spec.gap_ms
    )
    result = result_schema(list(layout.group_by), layout.aggregates)
    out: dict[str, list[Any]] = {name: [] for name in result.names}
    for (start, end, *groups), values in merged.items():
        out["window_start_ms"].append(start)
        out["window_end_ms"].append(end)
        for g, value in zip(layout.group_by, groups, strict=True):
            out[g].append(value)
        for name, value in values.items():
            out[name].append(value)
    return sort_results(pa.Table.from_pydict(out, schema=result))


def reference_sessions(
    docs: Iterable[tuple[int, int, Mapping[str, Any]]],
    spec: WindowSpec,
    *,
    exclude: set[tuple[int, int]] = frozenset(),  # type: ignore[assignment]
    times: Mapping[tuple[int, int], int] | None = None,
) -> pa.Table:
    """Expected session results from ``(vb, seqno, doc)`` of every on_update mutation, leaving out ``exclude``
    (late rows): sessions per group computed in one pass over the sorted times (``plain_sessions``), then
    aggregated with plain loops. ``times`` overrides a row's time (processing-time sessions)."""
    rows: list[dict[str, Any]] = []
    keyed: list[tuple[tuple, int]] = []
    for vb, seqno, doc in docs:
        if (vb, seqno) in exclude:
            continue
        t = times[(vb, seqno)] if times is not None else int(doc[spec.time_field or ""])
        row: dict[str, Any] = {"event_time_ms": t}
        for g in spec.group_by:
            value = doc.get(g)
            row[g] = None if value is None else str(value)
        for agg in spec.aggregates:
            if agg.field is not None:
                row[agg.field] = doc.get(agg.field)
        rows.append(row)
        keyed.append((tuple(row[g] for g in spec.group_by), t))
    sessions = plain_sessions(keyed, spec.gap_ms, spec.max_duration_ms, spec.offset_ms)
    by_group: dict[tuple, list[Session]] = {}
    for s in sessions:
        by_group.setdefault(s.group, []).append(s)
    members: dict[Session, list[Mapping[str, Any]]] = {s: [] for s in sessions}
    for row, (group, t) in zip(rows, keyed, strict=True):
        for s in by_group[group]:
            if s.start_ms <= t <= s.last_ms:
                members[s].append(row)
                break
    schema = result_schema(list(spec.group_by), [(a.op, a.field, a.name) for a in spec.aggregates])  # type: ignore[misc]
    out: dict[str, list[Any]] = {name: [] for name in schema.names}
    for s, mine in members.items():
        out["window_start_ms"].append(s.start_ms)
        out["window_end_ms"].append(s.end_ms)
        for g, value in zip(spec.group_by, s.group, strict=True):
            out[g].append(value)
        for a in spec.aggregates:
            out[a.name].append(_aggregate(a.op, a.field, mine))
    return sort_results(pa.Table.from_pydict(out, schema=schema))


def reference_results(
    docs: Iterable[tuple[int, int, Mapping[str, Any]]],
    spec: WindowSpec,
    windows: Iterable[tuple[int, int]],
    *,
    exclude: set[tuple[int, int]] = frozenset(),  # type: ignore[assignment]
) -> pa.Table:
    """Expected results from ``(vb, seqno, doc)`` of every on_update mutation, leaving out ``exclude``
    (late rows), computed from the documents alone: no row files, no Arrow, no Spark."""
    rows = []
    for vb, seqno, doc in docs:
        if (vb, seqno) in exclude:
            continue
        row: dict[str, Any] = {"event_time_ms": int(doc[spec.time_field or ""])}
        for g in spec.group_by:
            value = doc.get(g)
            row[g] = None if value is None else str(value)
        for agg in spec.aggregates:
            if agg.field is not None:
                row[agg.field] = doc.get(agg.field)
        rows.append(row)
    return python_aggregate(
        rows,
        size_ms=spec.size_ms,
        slide_ms=spec.slide_ms,
        group_by=spec.group_by,
        aggregates=[(a.op, a.field, a.name) for a in spec.aggregates],
        windows=windows,
        offset_ms=spec.offset_ms,
    )


def assert_same_results(actual: pa.Table, expected: pa.Table, *, rel: float = 1e-12) -> None:
    """Equal windows, groups and counts; floats equal up to summation order (partials add up per batch)."""
    got, want = actual.to_pylist(), expected.to_pylist()
    assert len(got) == len(want), f"{len(got)} result rows, expected {len(want)}"
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys(), f"columns {list(g)} != {list(w)}"
        for name, value in w.items():
            if isinstance(value, float) and isinstance(g[name], float):
                assert math.isclose(g[name], value, rel_tol=rel, abs_tol=1e-9), f"{name}: {g} != {w}"
            else:
                assert g[name] == value, f"{name}: {g} != {w}"


# -- arrival-time policies (docs/time-semantics.md, seed 003) ------------------------------------------

EARLY_LIMIT_MS = 5 * 60_000  # Azure's early-arrival limit, fixed

# The seed's example table: event time, arrival time, DeviceId (12:07 is 12 h 7 min after a day's start).
SEED_TABLE: tuple[tuple[str, str, str], ...] = (
    ("12:07", "12:07", "device1"),
    ("12:08", "12:08", "device2"),
    ("12:17", "12:11", "device1"),
    ("12:08", "12:13", "device3"),
    ("12:19", "12:16", "device1"),
    ("12:12", "12:17", "device3"),
    ("12:17", "12:18", "device2"),
    ("12:20", "12:19", "device2"),
    ("12:16", "12:21", "device3"),
    ("12:23", "12:22", "device2"),
    ("12:22", "12:24", "device2"),
    ("12:21", "12:27", "device3"),
)


def clock_ms(day_ms: int, text: str) -> int:
    """``HH:MM`` of the day starting at ``day_ms`` as epoch ms."""
    hours, minutes = text.split(":")
    return day_ms + (int(hours) * 60 + int(minutes)) * 60_000


def reference_arrival_fates(
    rows: Iterable[tuple[Any, int, int, Any]],
    *,
    out_of_order_tolerance_ms: int,
    late_arrival_tolerance_ms: int | None,
    early_arrival: str | None = "drop",
    out_of_order: str = "adjust",
    late_arrival: str = "adjust",
    substreams: bool = False,
) -> list[tuple[int | None, str | None]]:
    """The seed's rules in plain loops, independent of ``eventing.windows.semantics.arrival``: for rows
    ``(partition, event ms, arrival ms, substream key)`` in arrival order, ``(windowed ms, None)`` for a
    kept row or ``(None, dead-letter reason)`` for a dropped one. One watermark per partition (per key
    value with substreams): the greatest windowed time so far minus the out-of-order tolerance."""
    watermark: dict[Any, int] = {}
    out: list[tuple[int | None, str | None]] = []
    for partition, event_ms, arrival_ms, key in rows:
        if substreams and key is None:
            out.append((None, "no_substream_key"))
            continue
        stream = ("key", key) if substreams else partition
        if early_arrival is not None and event_ms > arrival_ms + EARLY_LIMIT_MS:
            # Early rows never move the watermark.
            out.append((None, "early") if early_arrival == "drop" else (arrival_ms + EARLY_LIMIT_MS, None))
            continue
        t = event_ms
        if late_arrival_tolerance_ms is not None and arrival_ms - event_ms > late_arrival_tolerance_ms:
            if late_arrival == "drop":
                out.append((None, "late_arrival"))
                continue
            t = arrival_ms - late_arrival_tolerance_ms
        if stream in watermark and t < watermark[stream]:
            if out_of_order == "drop":
                out.append((None, "out_of_order"))
                continue
            t = watermark[stream]
        watermark[stream] = max(
            watermark.get(stream, t - out_of_order_tolerance_ms), t - out_of_order_tolerance_ms
        )
        out.append((t, None))
    return out


def results_sink(data_dir: str, function: str, window: dict[str, Any]) -> Any:
    """The default sink of a windowed function of the data directory (``make_sink``)."""
    from eventing.windows.runtime.emission import make_sink

    return make_sink(data_dir, function, RowLayout.for_definition(function, window))


def area_files(data_dir: str, function: str, folder: str) -> list[str]:
    """The names in a folder of a function's file area (``incoming``, ``accepted``, ...): every entry of the
    folder on a data directory, hidden ones too; [] when it does not exist."""
    from eventing.windows.runtime.paths import window_area

    area = window_area(data_dir, function)
    local = area.local_path(folder)
    if local is None:
        return area.list(folder)
    return sorted(p.name for p in local.iterdir()) if local.is_dir() else []
