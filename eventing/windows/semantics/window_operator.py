"""Which open windows each row joins, which rows are late, and when each window closes, exactly once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from eventing.windows.semantics.spec import WindowSpec, format_duration
from eventing.windows.semantics.watermark import WatermarkTracker
from eventing.windows.semantics.windows import (
    Window,
    arrow_epoch_ms,
    classify_late,
    ensure_ms,
    late_cutoff_ms,
    window_range,
)

STATE_VERSION = 1


class WindowStateError(ValueError):
    """Checkpointed window state that cannot be resumed with this window declaration."""


@dataclass(frozen=True)
class RowFate:
    """What happens to one row.

    ``time_ms`` is the time the row was windowed by (its event time, or ``now_ms`` for processing-time
    windows). ``windows`` are the open windows it joins, by start. ``late`` is true when every window it
    belongs to has closed (``windows`` is then empty): the caller sends it to the dead-letter store with
    reason ``late``. ``closed_windows`` are the windows it belongs to that had closed already (a hopping row
    can miss some and still join others). ``behind_watermark`` marks an event time below the watermark at
    arrival, out of order by more than the tolerance, whether or not that made it late.
    """

    time_ms: int
    windows: tuple[Window, ...]
    late: bool
    closed_windows: tuple[Window, ...] = ()
    behind_watermark: bool = False


@dataclass(frozen=True)
class BatchFate:
    """What happens to a batch of rows, all judged against the cut-off in force when the batch arrived.

    ``late`` has one flag per row in input order: ``list[bool]``, or a pyarrow boolean array when the event
    times came as pyarrow. ``windows`` are the distinct open windows that at least one row joins, by start.
    """

    late: Any
    late_count: int
    windows: tuple[Window, ...]
    cutoff_ms: int | None
    behind_watermark_count: int = 0


class FrontierClock:
    """What window and session operators share: the spec, the watermark and the close frontier.

    Subclasses set ``_spec``, ``_tracker``, ``_event_time``, ``_lateness_ms``, ``_clock_frontier_ms``
    (processing time: now_ms of the last advance) and ``_closed_through_ms`` (the frontier of the last
    close)."""

    _spec: WindowSpec
    _tracker: WatermarkTracker
    _event_time: bool
    _lateness_ms: int
    _clock_frontier_ms: int | None
    _closed_through_ms: int | None

    @property
    def spec(self) -> WindowSpec:
        return self._spec

    @property
    def tracker(self) -> WatermarkTracker:
        """The per-partition watermark state (event time), for stats such as idle partitions."""
        return self._tracker

    @property
    def watermark_ms(self) -> int | None:
        """Event-time watermark (None until there is one; always None for processing-time windows)."""
        return self._tracker.watermark_ms if self._event_time else None

    @property
    def close_frontier_ms(self) -> int | None:
        """Windows (sessions) with ``end_ms <= close_frontier_ms`` are closed; None until the first
        watermark/advance."""
        if self._event_time:
            watermark = self._tracker.watermark_ms
            frontier = None if watermark is None else watermark - self._lateness_ms
        else:
            frontier = self._clock_frontier_ms
        if frontier is None or (self._closed_through_ms is not None and frontier < self._closed_through_ms):
            return self._closed_through_ms
        return frontier


class WindowOperator(FrontierClock):
    """Window assignment, lateness and closing for one function's windowed aggregation.

    The caller feeds rows with ``observe`` / ``observe_batch`` and calls ``advance(now_ms)`` after each batch
    and on a timer even when no rows come (idle timeouts fire only there). Rows observed with some
    ``now_ms`` (or ``arrival_ms``, when the source's arrival time is known) count as source activity at that
    time before an ``advance`` with the same time.

    Event time: the close frontier is ``watermark - allowed_lateness``; a window [start, end) is closed once
    ``end <= frontier`` (watermark >= end + allowed_lateness). The watermark comes from
    ``WatermarkTracker``, plus the idle timeout: once processing time has passed an open window's
    ``end + allowed_lateness`` and the whole source has delivered nothing for ``idle_timeout`` since the
    later of that moment and its last row, the watermark advances to ``end + allowed_lateness`` and the
    window closes. Processing time: a row's time is ``now_ms``, the frontier is the ``now_ms`` of the last
    ``advance``, and rows are never late (until ``close_all``).

    Guarantees: the frontier never moves backwards; a row is late exactly when all its windows end at or
    before the frontier (``time < late_cutoff_ms``); ``advance`` returns each window that holds at least one
    row once, when it closes, ordered by start, and window ends never decrease from one call to the next;
    no row joins a window after it was returned. Processing time that goes backwards (a wall clock stepped
    back) is held at the latest value seen, so it can neither reopen windows nor re-arm timeouts; an
    ``advance`` to an earlier time applies the timeouts due by that time only (it fires fewer, never
    reopens anything), which is how a caller holds them back until it has read what reached the source
    before them (``next_timeout_ms``).

    ``to_state()`` / ``from_state()`` checkpoint all of this in a small JSON-able dict. Take it after the
    windows returned by ``advance`` are durably written: a window returned after the last checkpoint is
    returned again after a restore, under the same ``Window.id``, so sinks keep the first write per id.
    """

    def __init__(self, spec: WindowSpec) -> None:
        self._spec = spec
        self._size_ms = spec.size_ms
        self._slide_ms = spec.slide_ms
        self._offset_ms = spec.offset_ms
        if spec.is_session:
            raise ValueError("session windows are run by SessionOperator, not WindowOperator")
        self._lateness_ms = spec.allowed_lateness_ms
        self._idle_timeout_ms = spec.idle_timeout_ms
        self._event_time = spec.boundary == "event_time"
        self._tracker = WatermarkTracker.for_spec(spec)
        self._open: set[Window] = set()
        self._now_ms: int | None = None  # latest processing time seen; held when the clock steps back
        self._last_activity_ms: int | None = None  # processing time of the latest row from any partition
        self._clock_frontier_ms: int | None = None  # processing-time windows: now_ms of the last advance
        # The frontier of the last close. A checkpoint resumed with a longer allowed_lateness would put
        # watermark - lateness behind it and reopen windows already emitted; the frontier never goes below it.
        self._closed_through_ms: int | None = None
        self._late_rows = 0

    # -- reading ---------------------------------------------------------------------------------------

    @property
    def late_cutoff_ms(self) -> int | None:
        """Rows with ``time_ms < late_cutoff_ms`` are late now (None: nothing is late yet)."""
        return late_cutoff_ms(self._spec, self.close_frontier_ms)

    @property
    def open_windows(self) -> tuple[Window, ...]:
        """Windows holding rows and not yet returned by ``advance``, by start."""
        return tuple(sorted(self._open))

    @property
    def late_rows(self) -> int:
        """Rows found late since the operator began (carried across checkpoints)."""
        return self._late_rows

    # -- partitions ------------------------------------------------------------------------------------

    def assign_partitions(self, partitions: Iterable[int], now_ms: int) -> None:
        """Make ``partitions`` hold the watermark from ``now_ms`` until they deliver data or go idle."""
        self._tracker.assign_partitions(partitions, self._tick(now_ms))

    def revoke_partitions(self, partitions: Iterable[int]) -> None:
        """Stop waiting for ``partitions``; windows they held open close at the next ``advance``."""
        self._tracker.revoke_partitions(partitions)

    # -- rows ------------------------------------------------------------------------------------------

    def observe(self, partition: int, event_time_ms: int | None, now_ms: int) -> RowFate:
        """Window one row of ``partition`` arriving at ``now_ms``. ``event_time_ms`` is required for
        event-time windows (a document without its time field belongs in the dead-letter store, not here)
        and ignored for processing-time windows."""
        now_ms = self._tick(now_ms)
        self._last_activity_ms = now_ms
        if self._event_time:
            if event_time_ms is None:
                raise ValueError(
                    f"event-time window needs the event time of each row (document field "
                    f"{self._spec.time_field!r}); send rows without it to the dead-letter store"
                )
            time_ms = ensure_ms(event_time_ms, "event_time_ms")
        else:
            time_ms = now_ms
        frontier = self.close_frontier_ms
        watermark = self.watermark_ms
        candidates = window_range(time_ms, self._size_ms, self._slide_ms, self._offset_ms)
        joined: tuple[Window, ...]
        missed: tuple[Window, ...]
        if frontier is None:
            joined, missed = tuple(candidates), ()
        else:
            joined = tuple(w for w in candidates if w.end_ms > frontier)
            missed = tuple(w for w in candidates if w.end_ms <= frontier)
        if self._event_time:
            # The row's own event time cannot close its own windows: it lifts its partition's watermark at
            # most to time - tolerance < end, so judging before or after the update gives the same answer.
            self._tracker.observe(partition, time_ms, now_ms)
        late = not joined
        if late:
            self._late_rows += 1
        else:
            self._open.update(joined)
        return RowFate(
            time_ms=time_ms,
            windows=joined,
            late=late,
            closed_windows=missed,
            behind_watermark=watermark is not None and time_ms < watermark,
        )

    def observe_batch(
        self,
        partitions: int | Sequence[int] | Any,
        event_times_ms: Sequence[int] | Any | None,
        now_ms: int,
        *,
        arrival_ms: int | None = None,
        lifts: Sequence[bool] | Any | None = None,
    ) -> BatchFate:
        """Window a batch arriving at ``now_ms``: one partition for all rows, or one per row (list or
        pyarrow).

        ``arrival_ms``, when given, is when the batch's rows reached the source (the greatest of their
        arrival times): the source and its partitions count as active then, not at ``now_ms``, so a batch
        read late (a service that was stopped) does not look like fresh activity. Without it, ``now_ms``.

        Every row is judged against the cut-off in force before the batch (as a Spark micro-batch is
        against the previous watermark); the batch then lifts each partition's watermark by its greatest
        event time, late rows included. So a batch flags a subset of what one-by-one ``observe`` calls
        in the same order would: a row that a later row of the same batch would have closed out still
        joins its window. Event times are a sequence of int epoch ms, or a pyarrow array (int epoch ms, or
        timestamps of any unit) without nulls; partitions likewise, or one int for the whole batch. For
        processing-time windows ``event_times_ms`` may be None, with ``partitions`` a sequence giving the
        row count, and ``late`` is always a list of False. ``lifts``, one flag per row (list or pyarrow
        boolean array), keeps the rows flagged False out of the watermark: they are windowed but do not
        move it (rows the early-arrival policy adjusted; see docs/time-semantics.md).
        """
        now_ms = self._tick(now_ms)
        if not self._event_time:
            return self._observe_batch_processing_time(partitions, event_times_ms, now_ms)
        if event_times_ms is None:
            raise ValueError(
                "event-time window needs event times for the batch (document field "
                f"{self._spec.time_field!r})"
            )
        cutoff = self.late_cutoff_ms
        frontier = self.close_frontier_ms
        watermark = self._tracker.watermark_ms
        if _is_arrow(event_times_ms):
            late, late_count, behind, starts, maxima = self._scan_arrow(
                partitions, event_times_ms, cutoff, watermark, lifts
            )
        else:
            late, late_count, behind, starts, maxima = self._scan_python(
                partitions, event_times_ms, cutoff, watermark, lifts
            )
        joined: set[Window] = set()
        count = self._size_ms // self._slide_ms
        for last_start in starts:
            for k in range(count):
                start = last_start - k * self._slide_ms
                if frontier is None or start + self._size_ms > frontier:
                    joined.add(Window(start, start + self._size_ms))
        if maxima:
            activity = now_ms if arrival_ms is None else ensure_ms(arrival_ms, "arrival_ms")
            if self._last_activity_ms is None or activity > self._last_activity_ms:
                self._last_activity_ms = activity
            self._tracker.observe_maxima(maxima, activity)
        self._late_rows += late_count
        self._open.update(joined)
        return BatchFate(late, late_count, tuple(sorted(joined)), cutoff, behind)

    def _scan_python(
        self,
        partitions: Any,
        event_times_ms: Sequence[int],
        cutoff: int | None,
        watermark: int | None,
        lifts: Any = None,
    ) -> tuple[list[bool], int, int, set[int], dict[int, int]]:
        times = [ensure_ms(t, "event_time_ms") for t in event_times_ms]
        per_row = _per_row_partitions(partitions, len(times))
        late = classify_late(times, cutoff)
        maxima: dict[int, int] = {}
        starts: set[int] = set()
        late_count = behind = 0
        slide, offset = self._slide_ms, self._offset_ms
        lifting = None if lifts is None else (lifts.to_pylist() if _is_arrow(lifts) else list(lifts))
        for i, t in enumerate(times):
            p = partitions if per_row is None else per_row[i]
            if (lifting is None or lifting[i]) and (p not in maxima or t > maxima[p]):
                maxima[p] = t
            if late[i]:
                late_count += 1
            else:
                starts.add(t - (t - offset) % slide)
            if watermark is not None and t < watermark:
                behind += 1
        return late, late_count, behind, starts, maxima

    def _scan_arrow(
        self,
        partitions: Any,
        event_times_ms: Any,
        cutoff: int | None,
        watermark: int | None,
        lifts: Any = None,
    ) -> tuple[Any, int, int, set[int], dict[int, int]]:
        import pyarrow as pa
        import pyarrow.compute as pc

        times = event_times_ms
        if isinstance(times, pa.ChunkedArray):
            times = times.combine_chunks()
        if times.null_count:
            raise ValueError(
                f"{times.null_count} row(s) of the batch have no event time; send them to the dead-letter "
                "store before windowing"
            )
        times = arrow_epoch_ms(times)
        late = classify_late(times, cutoff)
        late_count = int(pc.sum(late).as_py() or 0)
        behind = 0 if watermark is None else int(pc.sum(pc.less(times, watermark)).as_py() or 0)
        on_time = times if late_count == 0 else pc.filter(times, pc.invert(late))
        # Arrow's modulo floors like Python's, so this is t - t % slide for negative times too.
        shifted = on_time if not self._offset_ms else pc.subtract(on_time, self._offset_ms)
        starts = set(pc.unique(pc.subtract(on_time, pc.modulo(shifted, self._slide_ms))).to_pylist())
        maxima: dict[int, int] = {}
        single = isinstance(partitions, int) and not isinstance(partitions, bool)
        parts = None if single else partitions if _is_arrow(partitions) else pa.array(partitions, pa.int64())
        if parts is not None and len(parts) != len(times):
            raise ValueError(f"batch has {len(times)} event times but {len(parts)} partitions")
        if lifts is not None:
            mask = lifts if _is_arrow(lifts) else pa.array(lifts, pa.bool_())
            times = pc.filter(times, mask)
            parts = None if parts is None else pc.filter(parts, mask)
        if len(times):
            if parts is None:
                maxima[partitions] = int(pc.max(times).as_py())
            else:
                grouped = pa.table({"p": parts, "t": times}).group_by("p").aggregate([("t", "max")])
                maxima = dict(zip(grouped["p"].to_pylist(), grouped["t_max"].to_pylist(), strict=True))
        return late, late_count, behind, starts, maxima

    def _observe_batch_processing_time(self, partitions: Any, event_times_ms: Any, now_ms: int) -> BatchFate:
        if event_times_ms is not None:
            rows = len(event_times_ms)
        elif isinstance(partitions, int):
            raise ValueError("give the batch's partitions as a sequence (one per row) or its event times")
        else:
            rows = len(partitions)
        windows = tuple(window_range(now_ms, self._size_ms, self._slide_ms, self._offset_ms)) if rows else ()
        if rows:
            self._last_activity_ms = now_ms
            self._open.update(windows)
        return BatchFate([False] * rows, 0, windows, self.late_cutoff_ms)

    # -- closing ---------------------------------------------------------------------------------------

    def advance(self, now_ms: int) -> list[Window]:
        """Apply processing time ``now_ms`` and return the windows that closed since the last call, by
        start."""
        at_ms = ensure_ms(now_ms, "now_ms")
        now_ms = self._tick(at_ms)
        if self._event_time:
            # Timeouts apply at the time given even when it is behind the latest seen: a caller holds them
            # back while rows that reached the source earlier are unread, and an earlier time fires fewer.
            self._tracker.advance(at_ms)
            if self._idle_timeout_ms is not None:
                self._apply_idle_timeout(at_ms, self._idle_timeout_ms)
        elif self._clock_frontier_ms is None or now_ms > self._clock_frontier_ms:
            self._clock_frontier_ms = now_ms
        return self._take_closed()

    def next_timeout_ms(self) -> int | None:
        """The earliest processing time at which ``advance`` would apply a timeout (a partition turning
        idle, or the idle timeout closing a window), given no more rows; None when none is armed. A caller
        that may still have rows to read which reached the source before that time reads them first."""
        if not self._event_time:
            return None
        deadlines = []
        partition = self._tracker.next_idle_ms()
        if partition is not None:
            deadlines.append(partition)
        if self._idle_timeout_ms is not None and self._last_activity_ms is not None:
            frontier = self.close_frontier_ms
            for window in sorted(self._open):
                if frontier is not None and window.end_ms <= frontier:
                    continue
                due_ms = window.end_ms + self._lateness_ms
                deadlines.append(max(due_ms, self._last_activity_ms) + self._idle_timeout_ms)
                break
        return min(deadlines) if deadlines else None

    def _apply_idle_timeout(self, now_ms: int, idle_timeout_ms: int) -> None:
        if self._last_activity_ms is None:
            return
        for window in sorted(self._open):
            frontier = self.close_frontier_ms
            if frontier is not None and window.end_ms <= frontier:
                continue  # closes on the watermark anyway
            due_ms = window.end_ms + self._lateness_ms
            # Atlas: the idle interval starts once processing time has passed the window's end and the
            # source is idle; it fires after idle_timeout more of silence. Deadlines grow with the window
            # end, so the first window that is not due ends the scan.
            if now_ms < max(due_ms, self._last_activity_ms) + idle_timeout_ms:
                break
            self._tracker.advance_to(due_ms)

    def close_all(self) -> list[Window]:
        """End of input: close every open window now, as if the watermark passed the last one, and return
        them by start. The frontier moves to the last window's end, so later rows for them are late."""
        if not self._open:
            return []
        last_end = max(w.end_ms for w in self._open)
        if self._event_time:
            self._tracker.advance_to(last_end + self._lateness_ms)
        elif self._clock_frontier_ms is None or last_end > self._clock_frontier_ms:
            self._clock_frontier_ms = last_end
        return self._take_closed()

    def _take_closed(self) -> list[Window]:
        frontier = self.close_frontier_ms
        if frontier is None:
            return []
        self._closed_through_ms = frontier
        closed = sorted(w for w in self._open if w.end_ms <= frontier)
        self._open.difference_update(closed)
        return closed

    def _tick(self, now_ms: int) -> int:
        now_ms = ensure_ms(now_ms, "now_ms")
        if self._now_ms is not None and now_ms < self._now_ms:
            return self._now_ms
        self._now_ms = now_ms
        return now_ms

    # -- checkpoints -----------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """A JSON-able dict from which ``from_state`` resumes exactly here (see the class docstring)."""
        return {
            "version": STATE_VERSION,
            "window": _fingerprint(self._spec),
            "tracker": self._tracker.to_state(),
            "open_windows": [[w.start_ms, w.end_ms] for w in sorted(self._open)],
            "now_ms": self._now_ms,
            "last_activity_ms": self._last_activity_ms,
            "clock_frontier_ms": self._clock_frontier_ms,
            "closed_through_ms": self._closed_through_ms,
            "late_rows": self._late_rows,
        }

    @classmethod
    def from_state(cls, spec: WindowSpec, state: Mapping[str, Any]) -> WindowOperator:
        """Resume from ``to_state()``. Tolerance, lateness and timeouts come from ``spec`` and may have
        changed; the window shape and time boundary may not."""
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise WindowStateError(
                "window state has version "
                f"{state.get('version') if isinstance(state, Mapping) else state!r}; this build reads "
                f"version {STATE_VERSION}: reset the function's window state"
            )
        saved, wanted = state["window"], _fingerprint(spec)
        if saved != wanted:
            raise WindowStateError(
                f"window state was written for {_describe(saved)} windows but the function now declares "
                f"{_describe(wanted)}; restore the old window declaration, or redeploy the function with its "
                "window state reset"
            )
        op = cls(spec)
        op._tracker = WatermarkTracker.from_state(
            state["tracker"], spec.out_of_order_tolerance, spec.partition_idle_timeout
        )
        op._open = {Window(int(s), int(e)) for s, e in state["open_windows"]}
        op._now_ms = _opt_ms(state["now_ms"], "now_ms")
        op._last_activity_ms = _opt_ms(state["last_activity_ms"], "last_activity_ms")
        op._clock_frontier_ms = _opt_ms(state["clock_frontier_ms"], "clock_frontier_ms")
        op._closed_through_ms = _opt_ms(state["closed_through_ms"], "closed_through_ms")
        op._late_rows = int(state["late_rows"])
        return op


def _fingerprint(spec: WindowSpec) -> dict[str, Any]:
    out = {"kind": spec.kind, "boundary": spec.boundary, "size_ms": spec.size_ms, "slide_ms": spec.slide_ms}
    if spec.offset_ms:  # only when set, so states written before offsets existed still resume
        out["offset_ms"] = spec.offset_ms
    return out


def _describe(fingerprint: Mapping[str, Any]) -> str:
    shape = _duration_text(fingerprint.get("size_ms"))
    if fingerprint.get("kind") == "hopping":
        shape += f" every {_duration_text(fingerprint.get('slide_ms'))}"
    return f"{fingerprint.get('kind')} {shape} {fingerprint.get('boundary')}"


def _duration_text(ms: Any) -> str:
    return format_duration(timedelta(milliseconds=ms)) if isinstance(ms, int) else repr(ms)


def _opt_ms(value: Any, what: str) -> int | None:
    return None if value is None else ensure_ms(value, what)


def _is_arrow(value: Any) -> bool:
    return type(value).__module__.startswith("pyarrow")


def _per_row_partitions(partitions: Any, rows: int) -> list[int] | None:
    if isinstance(partitions, int) and not isinstance(partitions, bool):
        return None
    per_row = partitions.to_pylist() if _is_arrow(partitions) else list(partitions)
    if len(per_row) != rows:
        raise ValueError(f"batch has {rows} event times but {len(per_row)} partitions")
    return per_row
