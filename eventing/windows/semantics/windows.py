"""Epoch-aligned window assignment: the [start, end) windows that hold a time, and the cut-off below which a
time is late."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from eventing.windows.semantics.spec import WindowSpec

if TYPE_CHECKING:
    import pyarrow as pa

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_WINDOW_ID = re.compile(r"^(-?\d+)_(-?\d+)$")
_INT64_MIN = -(2**63)


@dataclass(frozen=True, order=True)
class Window:
    """The interval [start_ms, end_ms) of epoch milliseconds (UTC). Orders by start, then end."""

    start_ms: int
    end_ms: int

    def __post_init__(self) -> None:
        if not (_is_ms(self.start_ms) and _is_ms(self.end_ms)) or self.end_ms <= self.start_ms:
            raise ValueError(
                f"window [{self.start_ms!r}, {self.end_ms!r}) is not an interval; "
                "give integer epoch ms with start < end"
            )

    @property
    def id(self) -> str:
        """Stable key of the window within its function: ``<start_ms>_<end_ms>``, as in sink file names."""
        return f"{self.start_ms}_{self.end_ms}"

    @classmethod
    def from_id(cls, window_id: str) -> Window:
        match = _WINDOW_ID.match(window_id)
        if not match:
            raise ValueError(f"window id {window_id!r} is not '<start_ms>_<end_ms>'")
        return cls(int(match.group(1)), int(match.group(2)))

    def contains(self, time_ms: int) -> bool:
        return self.start_ms <= time_ms < self.end_ms

    @property
    def label(self) -> str:
        """ISO 8601 interval for people: ``2024-05-01T12:00:00Z/2024-05-01T12:05:00Z``."""
        return f"{_iso(self.start_ms)}/{_iso(self.end_ms)}"

    def __str__(self) -> str:
        return self.label


def windows_for(time_ms: int, spec: WindowSpec) -> list[Window]:
    """Every window of ``spec`` that holds ``time_ms``, by start: one for tumbling, size/slide for hopping.

    Windows are aligned to the epoch plus the spec's offset: starts are ``offset + k * slide`` (the size, for
    tumbling).
    """
    return window_range(time_ms, spec.size_ms, spec.slide_ms, spec.offset_ms)


def window_range(time_ms: int, size_ms: int, slide_ms: int, offset_ms: int = 0) -> list[Window]:
    """The windows of ``size_ms`` every ``slide_ms`` (size a multiple of slide), starting at
    ``offset_ms + k * slide_ms``, holding ``time_ms``, by start."""
    last_start = time_ms - (time_ms - offset_ms) % slide_ms  # Python's % floors, so negative times align too
    count = size_ms // slide_ms
    return [
        Window(s, s + size_ms) for s in range(last_start - (count - 1) * slide_ms, last_start + 1, slide_ms)
    ]


def late_cutoff_ms(spec: WindowSpec, close_frontier_ms: int | None) -> int | None:
    """The time below which a row is late once every window ending at or before ``close_frontier_ms`` has
    closed; ``None`` (no frontier yet) means nothing is late.

    The last window holding t ends at ``t - t % slide + size``, which never decreases as t grows, so "every
    window of t is closed" is exactly ``t < cutoff``: one comparison per row, easy to vectorise.
    """
    if close_frontier_ms is None:
        return None
    slide_ms, offset_ms = spec.slide_ms, spec.offset_ms
    return ((close_frontier_ms - spec.size_ms - offset_ms) // slide_ms + 1) * slide_ms + offset_ms


def classify_late(event_times_ms: Iterable[int] | pa.Array | pa.ChunkedArray, cutoff_ms: int | None) -> Any:
    """Late flags for many rows at once, against a cut-off from ``late_cutoff_ms``.

    A pyarrow Array or ChunkedArray (integer epoch ms, or timestamps of any unit) gives a pyarrow boolean
    array of the same shape, nulls staying null; any other iterable of ints gives ``list[bool]``.
    """
    if _is_arrow(event_times_ms):
        import pyarrow as pa
        import pyarrow.compute as pc

        event_times_ms = arrow_epoch_ms(event_times_ms)
        # No int64 is below the smallest int64, so a missing cut-off flags nothing and keeps nulls null.
        bound = _INT64_MIN if cutoff_ms is None else cutoff_ms
        return pc.less(event_times_ms, pa.scalar(bound, pa.int64()))
    if cutoff_ms is None:
        return [False for _ in event_times_ms]
    return [t < cutoff_ms for t in event_times_ms]


def arrow_epoch_ms(values: Any) -> Any:
    """A pyarrow array of epoch ms as int64; timestamp arrays (the row batches use microseconds) are
    converted, sub-millisecond digits dropped."""
    import pyarrow as pa

    if pa.types.is_timestamp(values.type):
        values = values.cast(pa.timestamp("ms", values.type.tz), safe=False)
    return values.cast(pa.int64())


def _is_arrow(value: Any) -> bool:
    return type(value).__module__.startswith("pyarrow")


def _is_ms(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _iso(ms: int) -> str:
    try:
        moment = _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:  # beyond year 1..9999: still show something
        return f"{ms}ms"
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{ms % 1000:03d}Z" if ms % 1000 else f"{text}Z"


def ensure_ms(value: Any, what: str) -> int:
    """``value`` as epoch ms, refusing anything but an int (bool included) with a message naming ``what``."""
    if not _is_ms(value):
        raise TypeError(f"{what} must be integer epoch milliseconds (UTC), not {value!r}")
    return int(value)
