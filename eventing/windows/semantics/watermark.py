"""The event-time watermark of one function: per-partition watermarks, their minimum over active partitions,
idleness."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from eventing.windows.semantics.spec import WindowSpec, duration_ms
from eventing.windows.semantics.windows import ensure_ms


@dataclass
class _Partition:
    max_event_ms: int | None  # greatest event time seen; None until the partition delivers data
    last_seen_ms: int  # processing time of its last data (or of its assignment)
    idle: bool = False


class WatermarkTracker:
    """Flink/Atlas watermark over partitions (vBuckets), with processing time always passed in as ``now_ms``.

    - A partition's watermark is the greatest event time it delivered minus ``out_of_order_tolerance``.
    - The function's watermark is the minimum over active partitions, and never moves backwards: it is
      ``max(previous, min over active)``. While an active partition has delivered nothing, or no partition
      is active, it stays where it is.
    - ``advance(now_ms)`` marks a partition idle once it has delivered nothing for
      ``partition_idle_timeout`` (``now - last data >= timeout``); an idle partition no longer holds the
      watermark back. Its next data makes it active again; if it is behind, it holds the watermark
      (without pulling it back) until it catches up.
    - Partitions join when they first deliver data, or earlier through ``assign_partitions``, which makes a
      silent partition hold the watermark until it delivers or goes idle.

    Only ``advance`` applies the passage of time; ``observe`` is driven by data alone.
    """

    def __init__(
        self,
        out_of_order_tolerance: timedelta = timedelta(0),
        partition_idle_timeout: timedelta | None = None,
    ) -> None:
        self._tolerance_ms = duration_ms(out_of_order_tolerance)
        self._idle_timeout_ms = (
            None if partition_idle_timeout is None else duration_ms(partition_idle_timeout)
        )
        if self._tolerance_ms < 0 or (self._idle_timeout_ms is not None and self._idle_timeout_ms <= 0):
            raise ValueError(
                "out_of_order_tolerance must be >= 0 and partition_idle_timeout positive (or None for off)"
            )
        self._partitions: dict[int, _Partition] = {}
        self._watermark_ms: int | None = None

    @classmethod
    def for_spec(cls, spec: WindowSpec) -> WatermarkTracker:
        return cls(spec.out_of_order_tolerance, spec.partition_idle_timeout)

    @property
    def watermark_ms(self) -> int | None:
        """The function watermark, or None before every active partition has delivered data."""
        return self._watermark_ms

    def partition_watermark_ms(self, partition: int) -> int | None:
        part = self._partitions.get(partition)
        if part is None or part.max_event_ms is None:
            return None
        return part.max_event_ms - self._tolerance_ms

    @property
    def partitions(self) -> frozenset[int]:
        return frozenset(self._partitions)

    @property
    def idle_partitions(self) -> frozenset[int]:
        return frozenset(p for p, part in self._partitions.items() if part.idle)

    @property
    def active_partitions(self) -> frozenset[int]:
        return frozenset(p for p, part in self._partitions.items() if not part.idle)

    def assign_partitions(self, partitions: Iterable[int], now_ms: int) -> None:
        """Track ``partitions`` from ``now_ms`` before they deliver data (already tracked ones are kept)."""
        now_ms = ensure_ms(now_ms, "now_ms")
        for partition in partitions:
            if partition not in self._partitions:
                self._partitions[_partition_id(partition)] = _Partition(None, now_ms)

    def revoke_partitions(self, partitions: Iterable[int]) -> int | None:
        """Stop tracking ``partitions`` (moved elsewhere); the watermark may advance. Returns it."""
        for partition in partitions:
            self._partitions.pop(partition, None)
        return self._recompute()

    def observe(self, partition: int, event_time_ms: int, now_ms: int) -> int | None:
        """Record one event time of ``partition`` arriving at ``now_ms``; returns the function watermark."""
        return self.observe_maxima({partition: event_time_ms}, now_ms)

    def observe_maxima(self, maxima: Mapping[int, int], now_ms: int) -> int | None:
        """Record, per partition, the greatest event time of a batch arriving at ``now_ms``; one recompute."""
        now_ms = ensure_ms(now_ms, "now_ms")
        for partition, event_time_ms in maxima.items():
            event_time_ms = ensure_ms(event_time_ms, "event_time_ms")
            part = self._partitions.get(partition)
            if part is None:
                part = self._partitions[_partition_id(partition)] = _Partition(None, now_ms)
            if part.max_event_ms is None or event_time_ms > part.max_event_ms:
                part.max_event_ms = event_time_ms
            part.last_seen_ms = max(part.last_seen_ms, now_ms)
            part.idle = False
        return self._recompute()

    def advance(self, now_ms: int) -> int | None:
        """Apply the passage of processing time: partitions silent for the idle timeout turn idle."""
        now_ms = ensure_ms(now_ms, "now_ms")
        if self._idle_timeout_ms is not None:
            for part in self._partitions.values():
                if not part.idle and now_ms - part.last_seen_ms >= self._idle_timeout_ms:
                    part.idle = True
        return self._recompute()

    def next_idle_ms(self) -> int | None:
        """When the first active partition turns idle if it delivers nothing more (None: never)."""
        if self._idle_timeout_ms is None:
            return None
        seen = [part.last_seen_ms for part in self._partitions.values() if not part.idle]
        return min(seen) + self._idle_timeout_ms if seen else None

    def advance_to(self, watermark_ms: int) -> int | None:
        """Move the function watermark forward to ``watermark_ms`` without data (idle timeout); never back."""
        watermark_ms = ensure_ms(watermark_ms, "watermark_ms")
        if self._watermark_ms is None or watermark_ms > self._watermark_ms:
            self._watermark_ms = watermark_ms
        return self._watermark_ms

    def _recompute(self) -> int | None:
        low: int | None = None
        for part in self._partitions.values():
            if part.idle:
                continue
            if part.max_event_ms is None:
                return self._watermark_ms  # an active partition with no data yet holds everything back
            if low is None or part.max_event_ms < low:
                low = part.max_event_ms
        if low is not None:
            self.advance_to(low - self._tolerance_ms)
        return self._watermark_ms

    def to_state(self) -> dict[str, Any]:
        """JSON-able snapshot; ``from_state`` with the same settings resumes exactly here."""
        return {
            "watermark_ms": self._watermark_ms,
            "partitions": {
                str(p): {
                    "max_event_ms": part.max_event_ms,
                    "last_seen_ms": part.last_seen_ms,
                    "idle": part.idle,
                }
                for p, part in sorted(self._partitions.items())
            },
        }

    @classmethod
    def from_state(
        cls,
        state: Mapping[str, Any],
        out_of_order_tolerance: timedelta = timedelta(0),
        partition_idle_timeout: timedelta | None = None,
    ) -> WatermarkTracker:
        tracker = cls(out_of_order_tolerance, partition_idle_timeout)
        watermark = state["watermark_ms"]
        tracker._watermark_ms = None if watermark is None else ensure_ms(watermark, "watermark_ms")
        for key, raw in state["partitions"].items():
            max_event = raw["max_event_ms"]
            tracker._partitions[int(key)] = _Partition(
                None if max_event is None else ensure_ms(max_event, "max_event_ms"),
                ensure_ms(raw["last_seen_ms"], "last_seen_ms"),
                bool(raw["idle"]),
            )
        return tracker


def _partition_id(partition: Any) -> int:
    if isinstance(partition, bool) or not isinstance(partition, int):
        raise TypeError(f"partition must be an int (a vBucket number), not {partition!r}")
    return partition
