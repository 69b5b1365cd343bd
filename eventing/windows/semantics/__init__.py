"""Time semantics of windowed aggregation in pure Python: window declarations, assignment, watermarks,
closing.

No Spark, Ray or I/O here: the runtime feeds rows (or Arrow batches) with explicit processing times and
aggregates the windows this package tells it to open, flag late, and close.
"""

from __future__ import annotations

from eventing.windows.semantics.spec import (
    AGGREGATE_OPS,
    RESERVED_COLUMNS,
    Aggregate,
    AggregateOp,
    SinkKind,
    TimeBoundary,
    WindowConfigError,
    WindowKind,
    WindowSink,
    WindowSpec,
    format_duration,
    parse_duration,
)
from eventing.windows.semantics.watermark import WatermarkTracker
from eventing.windows.semantics.window_operator import (
    BatchFate,
    RowFate,
    WindowOperator,
    WindowStateError,
)
from eventing.windows.semantics.windows import (
    Window,
    arrow_epoch_ms,
    classify_late,
    late_cutoff_ms,
    window_range,
    windows_for,
)

__all__ = [
    "AGGREGATE_OPS",
    "RESERVED_COLUMNS",
    "Aggregate",
    "AggregateOp",
    "BatchFate",
    "RowFate",
    "SinkKind",
    "TimeBoundary",
    "WatermarkTracker",
    "Window",
    "WindowConfigError",
    "WindowKind",
    "WindowOperator",
    "WindowSink",
    "WindowSpec",
    "WindowStateError",
    "arrow_epoch_ms",
    "classify_late",
    "format_duration",
    "late_cutoff_ms",
    "parse_duration",
    "window_range",
    "windows_for",
]
