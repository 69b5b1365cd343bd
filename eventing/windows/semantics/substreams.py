"""Windows closed by each substream's own clock (Azure Stream Analytics' ``TIMESTAMP BY ... OVER key``, seed
003).

With substreams every key value (a device id) has its own watermark: the greatest time of its rows so far
minus ``out_of_order_tolerance`` (early rows, which the policies flag, never move it). Seed 003 adds the rule
for a substream that sends nothing: *"when there are no incoming events, the watermark is the current
estimated arrival time minus the late arrival tolerance"*. The arrival clock here is the arrival time of the
newest row judged so far (rows are judged in arrival order; the arrival time is journalled with the
mutation), so the rule is repeatable on replay and never reads the wall clock. A substream's watermark is
therefore ``max(its rows' watermark, arrival clock - late_arrival_tolerance)``, never moving back.

Two ways to close, chosen by the declaration:

- **per substream** (``group_by`` holds the substream key, the usual case): each (window, substream) is a
  result of its own and closes once *that* substream's watermark passes its end + ``allowed_lateness``. A
  fast device does not close a slow device's windows, and a slow device does not hold back a fast one's;
  ``advance`` returns ``SubstreamWindow`` values;
- **shared** (``group_by`` without the key): a window's result mixes substreams, including ones not seen
  yet, whose first rows may lie as far back as the late-arrival rule lets them (arrival - tolerance). So it
  closes once ``arrival clock - late_arrival_tolerance`` (the least watermark any substream, seen or not,
  can have) passes its end + ``allowed_lateness``: later than per substream, but never leaving a row out.

A row is late when its substream has closed every window holding it (shared: when the shared frontier
has). Rows judged in arrival order by the policies are never late here: a kept row's windowed time is at
least its arrival time minus the tolerance and at least its substream's watermark. The per-partition
(vBucket) watermark of ``WindowOperator`` is still kept, for the runtime's backlog bookkeeping, but closes
nothing; idle timeouts do not apply (the arrival-clock rule is what closes a silent substream's windows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from eventing.windows.semantics.spec import WindowSpec
from eventing.windows.semantics.window_operator import BatchFate, WindowOperator, WindowStateError, _is_arrow
from eventing.windows.semantics.windows import Window, arrow_epoch_ms, ensure_ms, late_cutoff_ms

_BIG = 2**62


@dataclass(frozen=True, order=True)
class SubstreamWindow:
    """A window of one substream (per-substream closing): its result holds that key value's rows only."""

    window: Window
    substream: str

    @property
    def start_ms(self) -> int:
        return self.window.start_ms

    @property
    def end_ms(self) -> int:
        return self.window.end_ms


class SubstreamWindowOperator(WindowOperator):
    """``WindowOperator`` whose windows close on substream watermarks; see the module docstring.

    ``observe_batch`` needs each row's substream (``substreams=``: strings, list or pyarrow, no nulls: the
    policies dead-letter rows without a key first)."""

    def __init__(self, spec: WindowSpec) -> None:
        super().__init__(spec)
        if spec.substream_key is None or spec.boundary != "event_time":
            raise ValueError("SubstreamWindowOperator needs an event-time window with a substream_key")
        self.per_substream = spec.substream_key in spec.group_by
        self._ooo_ms = spec.out_of_order_tolerance_ms
        self._late_tolerance_ms = spec.late_arrival_tolerance_ms
        self._marks: dict[str, int] = {}  # greatest lifting time per substream
        self._arrival_clock_ms: int | None = None  # arrival time of the newest row observed
        self._sub_open: dict[str, set[Window]] = {}  # per substream: its open windows
        self._sub_closed: dict[str, int] = {}  # per substream: frontier of its last close (never goes back)

    # -- clocks ----------------------------------------------------------------------------------------

    @property
    def arrival_clock_ms(self) -> int | None:
        return self._arrival_clock_ms

    @property
    def substreams(self) -> tuple[str, ...]:
        return tuple(sorted(self._marks.keys() | self._sub_open.keys()))

    def substream_watermark_ms(self, substream: str) -> int | None:
        """``max(greatest time - out_of_order_tolerance, arrival clock - late_arrival_tolerance)``, or None
        for a substream never seen (a seen substream whose rows were all early has the floor only)."""
        if substream not in self._marks and substream not in self._sub_open:
            return None
        own = self._marks.get(substream)
        out = None if own is None else own - self._ooo_ms
        floor = self._floor_ms()
        if floor is not None and (out is None or floor > out):
            out = floor
        return out

    def _floor_ms(self) -> int | None:
        if self._arrival_clock_ms is None or self._late_tolerance_ms is None:
            return None
        return self._arrival_clock_ms - self._late_tolerance_ms

    def substream_frontier_ms(self, substream: str) -> int | None:
        """Windows of ``substream`` ending at or before this are closed (per-substream closing)."""
        watermark = self.substream_watermark_ms(substream)
        frontier = None if watermark is None else watermark - self._lateness_ms
        closed = self._sub_closed.get(substream)
        if frontier is None or (closed is not None and frontier < closed):
            return closed
        return frontier

    @property
    def watermark_ms(self) -> int | None:
        """Per substream: the least substream watermark. Shared: arrival clock - late-arrival tolerance,
        the least watermark any substream, even one not seen yet, can have (what a shared window waits
        for)."""
        if not self.per_substream:
            return self._floor_ms()
        marks = [w for s in self.substreams if (w := self.substream_watermark_ms(s)) is not None]
        return min(marks) if marks else None

    @property
    def close_frontier_ms(self) -> int | None:
        if self.per_substream:
            # Only for reading (stats, pruning): the least frontier among substreams with open windows.
            fronts = [
                f
                for s, ws in self._sub_open.items()
                if ws and (f := self.substream_frontier_ms(s)) is not None
            ]
            return min(fronts) if fronts else self._closed_through_ms
        watermark = self.watermark_ms
        frontier = None if watermark is None else watermark - self._lateness_ms
        if frontier is None or (self._closed_through_ms is not None and frontier < self._closed_through_ms):
            return self._closed_through_ms
        return frontier

    @property
    def late_cutoff_ms(self) -> int | None:
        """Rows with times below this are in closed windows only, whatever their substream (for pruning).
        Per substream: the least cut-off of the substreams with open windows (none open: every row)."""
        if not self.per_substream:
            return late_cutoff_ms(self._spec, self.close_frontier_ms)
        cutoffs = [
            c
            for s, ws in self._sub_open.items()
            if ws and (c := late_cutoff_ms(self._spec, self.substream_frontier_ms(s))) is not None
        ]
        if any(ws for ws in self._sub_open.values()):
            return min(cutoffs) if len(cutoffs) == sum(1 for ws in self._sub_open.values() if ws) else None
        return _BIG if self._sub_closed else None

    @property
    def open_windows(self) -> tuple[Window, ...]:
        if not self.per_substream:
            return super().open_windows
        return tuple(sorted({w for ws in self._sub_open.values() for w in ws}))

    @property
    def open_substream_windows(self) -> tuple[SubstreamWindow, ...]:
        return tuple(sorted(SubstreamWindow(w, s) for s, ws in self._sub_open.items() for w in ws))

    # -- rows ------------------------------------------------------------------------------------------

    def observe(self, partition: int, event_time_ms: int | None, now_ms: int) -> Any:
        raise TypeError("substream windows take rows through observe_batch(..., substreams=...)")

    def observe_batch(
        self,
        partitions: int | Sequence[int] | Any,
        event_times_ms: Sequence[int] | Any | None,
        now_ms: int,
        *,
        arrival_ms: int | None = None,
        lifts: Sequence[bool] | Any | None = None,
        substreams: Sequence[str] | Any | None = None,
    ) -> BatchFate:
        """Window a batch: each row against its substream's cut-off before the batch (shared: the shared
        one), then the rows lift their substreams' watermarks and ``arrival_ms`` (the greatest arrival time
        of the batch's rows) moves the arrival clock. ``late`` is a list of bools."""
        if event_times_ms is None or substreams is None:
            raise ValueError("substream windows need each row's event time and substream")
        now_ms = self._tick(now_ms)
        times = _ms_array(event_times_ms)
        n = len(times)
        names, codes = _substream_codes(substreams, n)
        lifting = np.ones(n, bool) if lifts is None else np.asarray(_pylist(lifts), bool)
        shared_frontier = None if self.per_substream else self.close_frontier_ms
        frontiers = [self.substream_frontier_ms(s) if self.per_substream else shared_frontier for s in names]
        cutoffs = np.array(
            [_BIG * -1 if (c := late_cutoff_ms(self._spec, f)) is None else c for f in frontiers], np.int64
        )
        late = times < cutoffs[codes] if n else np.zeros(0, bool)
        watermark = self.watermark_ms
        behind = int((times < watermark).sum()) if watermark is not None else 0
        slide, size, offset = self._slide_ms, self._size_ms, self._offset_ms
        ok = ~late
        # Distinct (substream, last window start) pairs of the rows on time: numpy, not a loop over rows.
        pairs = np.unique(np.stack([codes[ok], (times - (times - offset) % slide)[ok]], axis=1), axis=0)
        every: set[Window] = set()
        for code, last_start in pairs.tolist():
            frontier = frontiers[code]
            joined = {
                Window(start, start + size)
                for start in (last_start - k * slide for k in range(size // slide))
                if frontier is None or start + size > frontier
            }
            every |= joined
            if self.per_substream:
                self._sub_open.setdefault(names[code], set()).update(joined)
            else:
                self._open.update(joined)
        if n:
            for name in names:
                self._sub_open.setdefault(name, set())  # seen: the arrival clock now moves its watermark
            lifted = np.where(lifting, times, -_BIG)
            tops = np.full(len(names), -_BIG, np.int64)
            np.maximum.at(tops, codes, lifted)
            for name, top in zip(names, tops.tolist(), strict=True):
                if top != -_BIG and (name not in self._marks or top > self._marks[name]):
                    self._marks[name] = top
            if arrival_ms is not None:
                arrival = ensure_ms(arrival_ms, "arrival_ms")
                if self._arrival_clock_ms is None or arrival > self._arrival_clock_ms:
                    self._arrival_clock_ms = arrival
            # The vBucket watermark closes nothing here; it is kept for the runtime's backlog bookkeeping.
            parts = (
                np.full(n, partitions, np.int64)
                if isinstance(partitions, int)
                else np.asarray(_pylist(partitions), np.int64)
            )
            vbs, where = np.unique(parts, return_inverse=True)
            highest = np.full(len(vbs), -_BIG, np.int64)
            np.maximum.at(highest, where, times)
            maxima = dict(zip(vbs.tolist(), highest.tolist(), strict=True))
            activity = now_ms if arrival_ms is None else ensure_ms(arrival_ms, "arrival_ms")
            if self._last_activity_ms is None or activity > self._last_activity_ms:
                self._last_activity_ms = activity
            self._tracker.observe_maxima(maxima, activity)
        late_count = int(late.sum())
        self._late_rows += late_count
        cutoff = None if self.per_substream else late_cutoff_ms(self._spec, shared_frontier)
        return BatchFate(late.tolist(), late_count, tuple(sorted(every)), cutoff, behind)

    # -- closing ---------------------------------------------------------------------------------------

    def advance(self, now_ms: int) -> list[Any]:
        """Close what the substream watermarks allow (processing time closes nothing here)."""
        at_ms = ensure_ms(now_ms, "now_ms")
        self._tick(at_ms)
        self._tracker.advance(at_ms)
        return self._take_closed()

    def next_timeout_ms(self) -> int | None:
        return None  # no idle timeouts: a silent substream closes by the arrival clock

    def advance_arrival_clock(self, arrival_ms: int) -> list[Any]:
        """Move the arrival clock to ``arrival_ms`` (every mutation that reached the source before it has
        been judged) and close what that allows: the seed's rule for silent substreams."""
        self.note_arrival(arrival_ms)
        return self._take_closed()

    def note_arrival(self, arrival_ms: int) -> None:
        """Move the arrival clock to a judged row's arrival time without windowing anything (a row the
        policies dropped is input too); the next ``advance`` closes what that allows. Call it after the
        batch's kept rows are observed: they are judged against the clock before them."""
        arrival_ms = ensure_ms(arrival_ms, "arrival_ms")
        if self._arrival_clock_ms is None or arrival_ms > self._arrival_clock_ms:
            self._arrival_clock_ms = arrival_ms

    def close_all(self) -> list[Any]:
        if not self.per_substream:
            if not self._open:
                return []
            self._closed_through_ms = max(self._closed_through_ms or -_BIG, max(w.end_ms for w in self._open))
            return self._take_closed()
        for s, ws in self._sub_open.items():
            if ws:
                last = max(w.end_ms for w in ws)
                self._sub_closed[s] = max(self._sub_closed.get(s, last), last)
        return self._take_closed()

    def _take_closed(self) -> list[Any]:
        if not self.per_substream:
            frontier = self.close_frontier_ms
            if frontier is None:
                return []
            self._closed_through_ms = frontier
            closed = sorted(w for w in self._open if w.end_ms <= frontier)
            self._open.difference_update(closed)
            return closed
        out: list[SubstreamWindow] = []
        for s, ws in self._sub_open.items():
            frontier = self.substream_frontier_ms(s)
            if frontier is None:
                continue
            self._sub_closed[s] = frontier
            done = [w for w in ws if w.end_ms <= frontier]
            ws.difference_update(done)
            out += [SubstreamWindow(w, s) for w in done]
        return sorted(out)

    # -- checkpoints -----------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        state = super().to_state()
        state["substreams"] = {
            "per_substream": self.per_substream,
            "arrival_clock_ms": self._arrival_clock_ms,
            "marks": sorted([s, t] for s, t in self._marks.items()),
            "open": sorted([s, w.start_ms, w.end_ms] for s, ws in self._sub_open.items() for w in ws),
            "seen": sorted(self._sub_open),
            "closed_through": sorted([s, t] for s, t in self._sub_closed.items()),
        }
        return state

    @classmethod
    def from_state(cls, spec: WindowSpec, state: Mapping[str, Any]) -> SubstreamWindowOperator:
        sub = state.get("substreams") if isinstance(state, Mapping) else None
        if sub is None:
            raise WindowStateError(
                "window state was written before windows closed per substream; redeploy the function with "
                "its window state reset"
            )
        op = super().from_state(spec, state)
        assert isinstance(op, SubstreamWindowOperator)
        if bool(sub["per_substream"]) != op.per_substream:
            raise WindowStateError(
                "window state was written with the substream key "
                f"{'in' if sub['per_substream'] else 'not in'} group_by; restore the old group_by, or "
                "redeploy the function with its window state reset"
            )
        clock = sub["arrival_clock_ms"]
        op._arrival_clock_ms = None if clock is None else ensure_ms(clock, "arrival_clock_ms")
        op._marks = {str(s): ensure_ms(t, "watermark_ms") for s, t in sub["marks"]}
        op._sub_open = {str(s): set() for s in sub["seen"]}
        for s, start, end in sub["open"]:
            op._sub_open.setdefault(str(s), set()).add(Window(int(start), int(end)))
        op._sub_closed = {str(s): ensure_ms(t, "closed_through_ms") for s, t in sub["closed_through"]}
        return op


def _substream_codes(substreams: Any, n: int) -> tuple[list[str], Any]:
    """The batch's distinct substreams and each row's index into them."""
    if _is_arrow(substreams):
        import pyarrow as pa
        import pyarrow.compute as pc

        column = substreams.combine_chunks() if isinstance(substreams, pa.ChunkedArray) else substreams
        _no_nulls(column.null_count)
        encoded = pc.dictionary_encode(column.cast(pa.string()))
        names = [str(v) for v in encoded.dictionary.to_pylist()]
        codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), np.int64)
    else:
        keys = list(substreams)
        _no_nulls(sum(k is None for k in keys))
        lookup: dict[str, int] = {}
        codes = np.fromiter((lookup.setdefault(str(k), len(lookup)) for k in keys), np.int64, len(keys))
        names = list(lookup)
    if len(codes) != n:
        raise ValueError(f"batch has {n} event times but {len(codes)} substreams")
    return names, codes


def _no_nulls(nulls: int) -> None:
    if nulls:
        raise ValueError(
            f"{nulls} row(s) without a substream reached the window; dead-letter them first "
            "(no_substream_key)"
        )


def _pylist(values: Any) -> list[Any]:
    return values.to_pylist() if _is_arrow(values) else list(values)


def _ms_array(values: Any) -> Any:
    if _is_arrow(values):
        import pyarrow as pa

        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if values.null_count:
            raise ValueError(f"{values.null_count} row(s) of the batch have no event time")
        return np.asarray(arrow_epoch_ms(values).to_numpy(zero_copy_only=False), np.int64)
    return np.asarray([ensure_ms(t, "event_time_ms") for t in values], np.int64)
