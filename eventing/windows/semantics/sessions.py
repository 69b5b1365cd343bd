"""Session windows per group: which rows form a session, when sessions merge, which rows are late, and when
each session closes, exactly once.

A session of a group is a maximal set of rows whose consecutive event times are at most ``gap`` apart (as
in Flink and Spark, where the windows [t, t + gap) of two rows merge when they touch); it spans [first row,
last row + gap). With ``max_duration`` the time axis is cut at ``offset + k *
max_duration`` and no session crosses a cut. Rows come in batches in any order: a batch is first cut into
*chains* (its rows of one group, sorted, split where two neighbours are more than ``gap`` apart or a cut lies
between them); each chain then either joins (and merges) the open sessions of its group it touches, or
starts a new one. The chain, not the row, is the unit of judgement, so a batch's verdict does not depend on
the order of its rows.

Closing: a session closes when the close frontier (watermark - allowed lateness, or the processing time of
the last ``advance``) reaches its end (last row + gap). Lateness: a chain is late when it would form a
session that is closed already (its last row + gap at or before the frontier and no open session to join),
or when it comes within gap of a session already closed (merging with it would change a result already
emitted, so it is refused, where Flink would emit the session again). Late chains' rows go to the
dead-letter queue; every other row is in exactly one emitted session, and the emitted sessions are exactly
the sessions of the accepted rows, as a plain computation over them gives.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eventing.windows.semantics.spec import WindowSpec
from eventing.windows.semantics.watermark import WatermarkTracker
from eventing.windows.semantics.window_operator import FrontierClock, WindowStateError
from eventing.windows.semantics.windows import ensure_ms

STATE_VERSION = 1

Group = tuple[Any, ...]  # the group-by values of a row (strings or None), () without group_by


@dataclass(frozen=True)
class Session:
    """One session of ``group``: rows from ``start_ms`` to ``last_ms``; the window is [start, last + gap)."""

    group: Group
    start_ms: int
    last_ms: int
    end_ms: int

    @property
    def id(self) -> str:
        return f"{self.start_ms}_{self.end_ms}"


@dataclass(frozen=True)
class Chain:
    """Rows of one group in one batch, consecutive ones at most gap apart: [first_ms, last_ms], ``rows``
    rows."""

    group: Group
    first_ms: int
    last_ms: int
    rows: int = 1


def session_bucket(time_ms: int, max_duration_ms: int | None, offset_ms: int) -> int:
    """The max_duration cell of a time (0 without max_duration): sessions never cross cells."""
    return 0 if max_duration_ms is None else (time_ms - offset_ms) // max_duration_ms


def chains_of(
    groups: Sequence[Group],
    times_ms: Sequence[int],
    gap_ms: int,
    max_duration_ms: int | None = None,
    offset_ms: int = 0,
) -> tuple[list[Chain], list[int]]:
    """Cut rows into chains; returns the chains (by group, then time) and each row's chain index."""
    order = sorted(range(len(times_ms)), key=lambda i: (_sort_key(groups[i]), times_ms[i]))
    chains: list[Chain] = []
    of_row = [0] * len(times_ms)
    prev_group: Group | None = None
    prev_t = 0
    for i in order:
        g, t = groups[i], times_ms[i]
        if (
            chains
            and g == prev_group
            and t - prev_t <= gap_ms
            and session_bucket(t, max_duration_ms, offset_ms)
            == session_bucket(prev_t, max_duration_ms, offset_ms)
        ):
            c = chains[-1]
            chains[-1] = Chain(g, c.first_ms, t, c.rows + 1)
        else:
            chains.append(Chain(g, t, t, 1))
        of_row[i] = len(chains) - 1
        prev_group, prev_t = g, t
    return chains, of_row


@dataclass(frozen=True)
class SessionBatchFate:
    """Verdict on a batch: ``late`` per chain (in ``chains`` order) and per row (input order)."""

    chains: tuple[Chain, ...]
    chain_late: tuple[bool, ...]
    late: list[bool]
    late_count: int
    frontier_ms: int | None


class SessionOperator(FrontierClock):
    """Sessions of one function; the same driving contract as ``WindowOperator`` (``observe_batch`` then
    ``advance(now_ms)`` after each batch and on a timer; ``close_all`` at the end of input; ``to_state`` /
    ``from_state``), with groups: sessions are per group, so rows carry their group values.

    ``advance`` returns each session once, when it closes, ordered by end then start; a session returned is
    never joined again. The watermark and idle timeouts are ``WindowOperator``'s.
    """

    def __init__(self, spec: WindowSpec) -> None:
        if not spec.is_session:
            raise ValueError(f"SessionOperator runs session windows, not {spec.kind} windows")
        self._spec = spec
        self._gap_ms = spec.gap_ms
        self._max_ms = spec.max_duration_ms
        self._offset_ms = spec.offset_ms
        self._lateness_ms = spec.allowed_lateness_ms
        self._idle_timeout_ms = spec.idle_timeout_ms
        self._event_time = spec.boundary == "event_time"
        self._tracker = WatermarkTracker.for_spec(spec)
        # (group, cell) -> open sessions [[start, last], ...] sorted by start, pairwise more than gap apart
        self._open: dict[tuple[Group, int], list[list[int]]] = {}
        # (group, cell) -> greatest end of a closed session: a chain starting at or before it touches that one
        self._horizon: dict[tuple[Group, int], int] = {}
        self._now_ms: int | None = None
        self._last_activity_ms: int | None = None
        self._clock_frontier_ms: int | None = None
        self._closed_through_ms: int | None = None
        self._late_rows = 0

    # -- reading ---------------------------------------------------------------------------------------

    @property
    def open_sessions(self) -> list[Session]:
        out = [
            Session(g, s, last, last + self._gap_ms)
            for (g, _), sessions in self._open.items()
            for s, last in sessions
        ]
        return sorted(out, key=_session_key)

    @property
    def min_open_start_ms(self) -> int | None:
        """The earliest first row of an open session (rows before it can only be in closed sessions)."""
        starts = [sessions[0][0] for sessions in self._open.values() if sessions]
        return min(starts) if starts else None

    @property
    def late_rows(self) -> int:
        return self._late_rows

    # -- partitions ------------------------------------------------------------------------------------

    def assign_partitions(self, partitions: Iterable[int], now_ms: int) -> None:
        self._tracker.assign_partitions(partitions, self._tick(now_ms))

    def revoke_partitions(self, partitions: Iterable[int]) -> None:
        self._tracker.revoke_partitions(partitions)

    # -- rows ------------------------------------------------------------------------------------------

    def observe_batch(
        self,
        partitions: int | Sequence[int],
        groups: Sequence[Group],
        event_times_ms: Sequence[int] | None,
        now_ms: int,
    ) -> SessionBatchFate:
        """Judge a batch of rows arriving at ``now_ms`` (one partition for all, or one per row); for
        processing-time sessions every row's time is ``now_ms`` and ``event_times_ms`` is ignored."""
        now_ms = self._tick(now_ms)
        if self._event_time:
            if event_times_ms is None:
                raise ValueError(
                    f"event-time sessions need event times (document field {self._spec.time_field!r})"
                )
            times = [ensure_ms(t, "event_time_ms") for t in event_times_ms]
        else:
            times = [now_ms] * len(groups)
        if len(times) != len(groups):
            raise ValueError(f"batch has {len(times)} event times but {len(groups)} group values")
        chains, of_row = chains_of(groups, times, self._gap_ms, self._max_ms, self._offset_ms)
        maxima: dict[int, int] = {}
        if self._event_time:
            per_row = None if isinstance(partitions, int) else list(partitions)
            for i, t in enumerate(times):
                p = partitions if per_row is None else per_row[i]
                assert isinstance(p, int)
                if p not in maxima or t > maxima[p]:
                    maxima[p] = t
        verdict = self.observe_chains(chains, maxima, now_ms)
        late = [verdict[c] for c in of_row]
        return SessionBatchFate(tuple(chains), tuple(verdict), late, sum(late), self.close_frontier_ms)

    def observe_chains(self, chains: Sequence[Chain], maxima: Mapping[int, int], now_ms: int) -> list[bool]:
        """Judge a batch already cut into chains (``chains_of``, or the runtime's vectorised equivalent);
        ``maxima`` is the greatest event time per partition in the batch. Returns ``late`` per chain.

        Every chain is judged against the frontier in force before the batch; the batch then lifts each
        partition's watermark by its greatest event time, late rows included.
        """
        now_ms = self._tick(now_ms)
        frontier = self.close_frontier_ms
        gap = self._gap_ms
        out: list[bool] = []
        for chain in chains:
            key = (chain.group, session_bucket(chain.first_ms, self._max_ms, self._offset_ms))
            sessions = self._open.get(key)
            horizon = self._horizon.get(key)
            if horizon is not None and chain.first_ms <= horizon:
                out.append(True)  # within gap of a session already closed
                continue
            lo = chain.first_ms - gap  # a session with last >= lo and start <= hi touches the chain
            hi = chain.last_ms + gap
            touched: list[int] = []
            if sessions:
                i = bisect.bisect_right(sessions, [hi, 2**63])
                j = i - 1
                while j >= 0 and sessions[j][1] >= lo:
                    touched.append(j)
                    j -= 1
            if not touched and frontier is not None and chain.last_ms + gap <= frontier:
                out.append(True)
                continue
            out.append(False)
            start, last = chain.first_ms, chain.last_ms
            if sessions is None:
                sessions = self._open[key] = []
            for j in touched:  # descending, so deleting keeps the other indexes valid
                start = min(start, sessions[j][0])
                last = max(last, sessions[j][1])
                del sessions[j]
            bisect.insort(sessions, [start, last])
        late_rows = sum(c.rows for c, is_late in zip(chains, out, strict=True) if is_late)
        self._late_rows += late_rows
        if any(not x for x in out):
            self._last_activity_ms = now_ms
        if self._event_time and maxima:
            self._last_activity_ms = now_ms
            self._tracker.observe_maxima(maxima, now_ms)
        return out

    # -- closing ---------------------------------------------------------------------------------------

    def advance(self, now_ms: int) -> list[Session]:
        """Apply processing time ``now_ms``; return the sessions that closed since the last call."""
        now_ms = self._tick(now_ms)
        if self._event_time:
            self._tracker.advance(now_ms)
            if self._idle_timeout_ms is not None:
                self._apply_idle_timeout(now_ms, self._idle_timeout_ms)
        elif self._clock_frontier_ms is None or now_ms > self._clock_frontier_ms:
            self._clock_frontier_ms = now_ms
        return self._take_closed()

    def _apply_idle_timeout(self, now_ms: int, idle_timeout_ms: int) -> None:
        if self._last_activity_ms is None:
            return
        for session in self.open_sessions:
            frontier = self.close_frontier_ms
            if frontier is not None and session.end_ms <= frontier:
                continue
            due_ms = session.end_ms + self._lateness_ms
            if now_ms < max(due_ms, self._last_activity_ms) + idle_timeout_ms:
                break
            self._tracker.advance_to(due_ms)

    def close_all(self) -> list[Session]:
        """End of input: close every open session now and return them."""
        sessions = self.open_sessions
        if not sessions:
            return []
        last_end = max(s.end_ms for s in sessions)
        if self._event_time:
            self._tracker.advance_to(last_end + self._lateness_ms)
        elif self._clock_frontier_ms is None or last_end > self._clock_frontier_ms:
            self._clock_frontier_ms = last_end
        return self._take_closed()

    def _take_closed(self) -> list[Session]:
        frontier = self.close_frontier_ms
        if frontier is None:
            return []
        self._closed_through_ms = frontier
        closed: list[Session] = []
        for key in list(self._open):
            sessions = self._open[key]
            keep = []
            for start, last in sessions:
                end = last + self._gap_ms
                if end <= frontier:
                    closed.append(Session(key[0], start, last, end))
                    self._horizon[key] = max(self._horizon.get(key, end), end)
                else:
                    keep.append([start, last])
            if keep:
                self._open[key] = keep
            else:
                del self._open[key]
        if self._max_ms is not None:
            # A cell wholly behind the frontier with nothing open takes no chain any more (any chain in it
            # ends before cell end + gap <= frontier): its horizon can go.
            for key in [k for k in self._horizon if k not in self._open]:
                cell_end = (key[1] + 1) * self._max_ms + self._offset_ms
                if cell_end + self._gap_ms <= frontier:
                    del self._horizon[key]
        return sorted(closed, key=_session_key)

    def _tick(self, now_ms: int) -> int:
        now_ms = ensure_ms(now_ms, "now_ms")
        if self._now_ms is not None and now_ms < self._now_ms:
            return self._now_ms
        self._now_ms = now_ms
        return now_ms

    # -- checkpoints -----------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "window": _fingerprint(self._spec),
            "tracker": self._tracker.to_state(),
            "open": [[list(g), cell, sessions] for (g, cell), sessions in self._open.items()],
            "horizon": [[list(g), cell, end] for (g, cell), end in self._horizon.items()],
            "now_ms": self._now_ms,
            "last_activity_ms": self._last_activity_ms,
            "clock_frontier_ms": self._clock_frontier_ms,
            "closed_through_ms": self._closed_through_ms,
            "late_rows": self._late_rows,
        }

    @classmethod
    def from_state(cls, spec: WindowSpec, state: Mapping[str, Any]) -> SessionOperator:
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise WindowStateError(
                "session state has another version; this build reads version "
                f"{STATE_VERSION}: reset the function's window state"
            )
        if state["window"] != _fingerprint(spec):
            raise WindowStateError(
                f"window state was written for {state['window']} but the function now declares "
                f"{_fingerprint(spec)}; restore the old window declaration, or redeploy the function with "
                "its window state reset"
            )
        op = cls(spec)
        op._tracker = WatermarkTracker.from_state(
            state["tracker"], spec.out_of_order_tolerance, spec.partition_idle_timeout
        )
        op._open = {(tuple(g), int(cell)): [[int(s), int(e)] for s, e in ss] for g, cell, ss in state["open"]}
        op._horizon = {(tuple(g), int(cell)): int(end) for g, cell, end in state["horizon"]}
        for name in ("now_ms", "last_activity_ms", "clock_frontier_ms", "closed_through_ms"):
            value = state[name]
            setattr(op, "_" + name, None if value is None else ensure_ms(value, name))
        op._late_rows = int(state["late_rows"])
        return op


def _fingerprint(spec: WindowSpec) -> dict[str, Any]:
    return {
        "kind": spec.kind,
        "boundary": spec.boundary,
        "gap_ms": spec.gap_ms,
        "max_duration_ms": spec.max_duration_ms,
        "offset_ms": spec.offset_ms,
    }


def _sort_key(group: Group) -> tuple[Any, ...]:
    # None sorts before every string, and tuples of mixed None/str compare safely.
    return tuple((0, "") if v is None else (1, str(v)) for v in group)


def _session_key(s: Session) -> tuple[Any, ...]:
    return (s.end_ms, s.start_ms, _sort_key(s.group))


def plain_sessions(
    rows: Iterable[tuple[Group, int]], gap_ms: int, max_duration_ms: int | None = None, offset_ms: int = 0
) -> list[Session]:
    """Sessions of ``(group, time)`` rows computed in one pass over all of them, sorted: the definition the
    operator must agree with (tests compare every emitted session with it)."""
    by_group: dict[Group, list[int]] = {}
    for g, t in rows:
        by_group.setdefault(g, []).append(t)
    out: list[Session] = []
    for g, times in by_group.items():
        times.sort()
        start = prev = times[0]
        for t in times[1:]:
            if t - prev <= gap_ms and session_bucket(t, max_duration_ms, offset_ms) == session_bucket(
                prev, max_duration_ms, offset_ms
            ):
                prev = t
                continue
            out.append(Session(g, start, prev, prev + gap_ms))
            start = prev = t
        out.append(Session(g, start, prev, prev + gap_ms))
    return sorted(out, key=_session_key)
