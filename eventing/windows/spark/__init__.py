"""Spark side of windowed aggregation: row batches from workers in, closed-window results out to a sink.

The window maths (watermarks, which windows are closed) lives in ``eventing.windows.semantics``; this package
only computes the results for the windows it is given and stores them exactly once.
"""

from __future__ import annotations

from eventing.windows.batches import (
    AGGREGATE_OPS,
    WINDOW_END,
    WINDOW_START,
    AggregateColumn,
    AggregateOp,
    build_row_batch,
    result_schema,
    row_schema,
    sort_results,
    write_row_batch,
)
from eventing.windows.spark.sink import ParquetWindowSink, SqliteWindowSink, WindowSink

__all__ = [
    "AGGREGATE_OPS",
    "WINDOW_END",
    "WINDOW_START",
    "AggregateColumn",
    "AggregateOp",
    "ParquetWindowSink",
    "SqliteWindowSink",
    "WindowSink",
    "build_row_batch",
    "result_schema",
    "row_schema",
    "sort_results",
    "write_row_batch",
]
