"""The window coordinator of one function: classifies the workers' rows, closes windows, emits each exactly
once.

Every ``poll(now)``:

1. reads the row batches that workers wrote into ``incoming/`` since the last poll (per worker
   incarnation, in file order and without gaps), drops rows at or below ``classified_upto[vb]`` (copies a
   restarted worker wrote again) and duplicate ``(vb, seqno)`` pairs;
2. with arrival-time policies (docs/time-semantics.md), first puts them through the policies in arrival order
   (``eventing.windows.runtime.arrivals``: drops to the dead-letter queue, adjusted rows windowed at their
   adjusted time; with substreams, rows wait in ``held/`` until every earlier arrival has been read); then
   judges them with ``WindowOperator.observe_batch`` (each vBucket is a watermark partition): late rows go
   to the dead-letter queue with reason ``late``; the others are combined into partial aggregates per
   (window, group) (``eventing.windows.spark.partials``) and written to ``accepted/`` as one file;
3. ``advance(now)`` closes windows (watermark, allowed lateness, idle timeouts); at the end of input, with
   ``close_windows``, every open window closes. With substreams, windows close on each substream's own
   watermark and on the arrival clock of the rows judged (``SubstreamWindowOperator``), and a window
   closed for one key value is written for that value alone (sink id ``(start, end, value)``). Timeouts
   judge the source's silence by the rows' arrival times (when the source assigned their seqnos),
   not by when this service read them: rows read together are split where the source fell silent
   for a timeout's length, timeouts due before a row arrived fire before it is windowed, and no timeout
   fires while mutations that reached the source before it are unread (``_timeout_clock``). So the
   windows depend on the mutations and their arrival times, not on when the service happened to run;
4. commits, in one metadata transaction and fenced against any other coordinator: the operator state,
   ``classified_upto``, the consumed-file marks, the accepted files, the closed-but-not-yet-emitted
   windows, the late rows' DLQ entries and counters;
5. only then deletes the consumed incoming files and the accepted files no window needs any more, and
   hands closed windows to PySpark (on a background thread, so a Spark job never stalls the service):
   the aggregates of each closed window, merged from the partials of the batches accepted while it was
   open, go to the sink, which keeps the first write per window id. The next poll records them as emitted.

A crash anywhere repeats at most the uncommitted part of one poll: the incoming files it read are still
there (deleted only after the commit) and its accepted file was written under this coordinator's fence,
so a restarted coordinator ignores and deletes it. Windows closed but not yet recorded as emitted are
emitted again on restart; the sink skips those it already holds. Every window is emitted exactly once,
from exactly the rows accepted while it was open.

This class orchestrates the steps; their jobs live beside it in this package: ``row_files`` (the batch-file
protocol), ``arrivals`` (arrival-time policies), ``session_chains`` (session rows cut into chains),
``late_letters`` (dead letters), ``coordinator_state`` (what a commit holds) and ``emission`` (Spark jobs).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eventing.errors import FencedError
from eventing.storage.protocol import DirectLogSource
from eventing.storage.state import State, as_state
from eventing.windows.batches import read_row_file, write_parquet_file, write_row_file
from eventing.windows.runtime.arrivals import LIFTS, Judged, OncePerPoll, known_arrivals
from eventing.windows.runtime.coordinator_state import AcceptedBatch, CoordinatorState, PendingWindow
from eventing.windows.runtime.emission import (
    DRAIN_ATTEMPTS,
    Aggregator,
    EmitRetries,
    Emitter,
    InlineEmitter,
    Sink,
    emit,
    fault,
    job_sort_key,
    make_sink,
    stage,
)
from eventing.windows.runtime.late_letters import dead_letters, late_errors
from eventing.windows.runtime.paths import ACCEPTED, ADJUSTED, HELD, INCOMING, STAGING, window_area
from eventing.windows.runtime.row_files import drop_orphans, max_seqno_per_vb, read_fresh_rows, ready_files
from eventing.windows.runtime.row_writer import RowLayout
from eventing.windows.runtime.session_chains import cut_chains
from eventing.windows.semantics import Window, WindowOperator
from eventing.windows.semantics.sessions import SessionOperator
from eventing.windows.semantics.substreams import SubstreamWindowOperator
from eventing.windows.semantics.windows import arrow_epoch_ms
from metadata import DlqRow, MetadataStore
from metadata.sqlite_io import private_folder

log = logging.getLogger("eventing.windows")

WAITING_CHECK_S = 2.0  # how often silent vBuckets with a backlog are checked against their checkpoints


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class WindowCoordinator:
    """Windows one function's rows; see the module docstring for the steps and the guarantees."""

    def __init__(
        self,
        state: State | str | os.PathLike[str],
        function: str,
        generation: int,
        window: dict[str, Any],
        store: MetadataStore,
        *,
        aggregator: Aggregator,
        sink: Sink | None = None,
        emitter: Emitter | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        close_windows: bool = False,
        source_bucket: str | None = None,
    ):
        self.function = function
        self.generation = generation
        self.state = as_state(state)
        self.layout = RowLayout.for_definition(function, window)
        self.spec = self.layout.spec
        self.area = window_area(self.state, function)  # its files (names relative to windows/<fn>)
        self.store = store
        self.states = store.window_states()
        self.aggregator = aggregator
        self.sink = sink if sink is not None else make_sink(self.state, function, self.layout, self.area)
        self.emitter: Emitter = emitter if emitter is not None else InlineEmitter()
        self.clock = clock
        self.close_windows = close_windows
        self.source_bucket = source_bucket
        self.schema = self.layout.schema
        self._sessions = self.spec.is_session
        self._hopping = not self._sessions and self.spec.slide_ms != self.spec.size_ms
        self._inflight: Future | None = None
        self._inflight_windows: list[PendingWindow] = []
        self.retries = EmitRetries(function)
        self._jobs = 0
        self._last_waiting_check = 0.0
        self._source: DirectLogSource | None = None
        # Arrival-time policies (docs/time-semantics.md): None leaves the rows as they are, at no cost.
        self._policies = self.spec.uses_arrival_policies and self.spec.boundary == "event_time"
        # Substreams judge rows of every vBucket in one arrival order: rows wait (held/) until every
        # mutation that reached the source before them has been read.
        self._holds = self._policies and self.spec.substream_key is not None and source_bucket is not None
        self._substream_windows = (
            self._policies and self.spec.substream_key is not None and not self._sessions
        )
        self._after_commit: list[str] = []  # held files the committed state no longer lists
        self._judged_arrival_ms: int | None = None  # newest arrival the policies judged in this poll
        self._held_vb_cache: set[int] | None = None
        self.fence, saved = self.states.claim(function)
        self._load(saved)
        for folder in [INCOMING, ACCEPTED, *([HELD, ADJUSTED] if self._policies else [])]:
            local = self.area.local_path(folder)  # a data directory's folders exist from the start
            if local is not None:
                private_folder(local)
        self.area.delete_folder(STAGING)
        self._drop_orphans()

    # -- state ----------------------------------------------------------------------------------------

    def _load(self, saved: dict[str, Any] | None) -> None:
        now = self.clock()
        state = CoordinatorState.decode(
            saved,
            function=self.function,
            generation=self.generation,
            layout=self.layout,
            policies=self._policies,
            substream_windows=self._substream_windows,
        )
        self.operator = state.operator
        self.classified_upto = state.classified_upto
        self.marks = state.marks
        self.accepted = state.accepted
        self.next_seq = state.next_seq
        self.pending = state.pending
        self.waiting = state.waiting
        self.gate = state.gate
        self.held = state.held
        self.held_next = state.held_next
        self.adjusted_next = state.adjusted_next
        self._dirty = state.fresh
        if self.spec.boundary == "event_time":
            self._hold_for_backlog(now)

    def _state(self) -> dict[str, Any]:
        return CoordinatorState(
            self.operator,
            self.classified_upto,
            self.marks,
            self.accepted,
            self.next_seq,
            self.pending,
            self.waiting,
            self.gate,
            self.held,
            self.held_next,
            self.adjusted_next,
            fresh=False,
        ).encode(self.generation)

    def _commit(self, dlq: list[DlqRow], counters: Counter[str]) -> None:
        if not self.states.commit(self.function, self.fence, self._state(), dlq, counters):
            raise FencedError(
                f"the window coordinator of function '{self.function}' was replaced (another service runs it "
                "on this data directory, or it was redeployed); this coordinator stops without writing"
            )
        self._dirty = False

    def _hold_for_backlog(self, now_ms: int) -> None:
        """vBuckets with mutations still to handle hold the watermark from now on, as Flink's assigned splits
        do, so a catch-up that handles one vBucket after another does not make the others' rows late.
        One that never delivered a row is released once its checkpoint reaches where its backlog ended."""
        try:
            checkpoints = self.store.checkpoints(self.function)
            if not checkpoints or self.source_bucket is None:
                return
            highs = self._source_bucket().high_seqnos()
        except Exception as exc:  # noqa: BLE001 - without this hint the watermark is merely less patient
            log.warning("function %s: cannot read the backlog of its vBuckets (%s)", self.function, exc)
            return
        tracker = self.operator.tracker
        backlog = {vb: highs[vb] for vb, cp in checkpoints.items() if highs[vb] > cp.seqno}
        silent = [vb for vb in backlog if tracker.partition_watermark_ms(vb) is None]
        seen = {vb: tracker.partition_watermark_ms(vb) for vb in backlog if vb not in silent}
        if silent:
            self.operator.assign_partitions(silent, now_ms)
            self.waiting.update({vb: backlog[vb] for vb in silent})
        if seen:
            # Known vBuckets with a backlog are alive again, idle or not: their rows are on their way.
            tolerance = self.spec.out_of_order_tolerance_ms
            tracker.observe_maxima({vb: w + tolerance for vb, w in seen.items() if w is not None}, now_ms)
        if silent or seen:
            self._dirty = True

    def _waiting_checkpoints(self) -> dict[int, Any] | None:
        """Checkpoints of the function, read before listing the incoming files, when silent vBuckets wait."""
        if not self.waiting or time.monotonic() - self._last_waiting_check < WAITING_CHECK_S:
            return None
        self._last_waiting_check = time.monotonic()
        return self.store.checkpoints(self.function)

    def _release_waiting(self, checkpoints: dict[int, Any]) -> None:
        # A worker writes its rows before its checkpoint moves, so a checkpoint read before the listing
        # vouches for rows that were in the listing: a vBucket past its target without a row has none.
        tracker = self.operator.tracker
        delivered = [vb for vb in self.waiting if tracker.partition_watermark_ms(vb) is not None]
        held = self._held_vbs() if self.held else set()  # rows read but held (substreams): on their way
        done = [
            vb
            for vb, target in self.waiting.items()
            if vb not in delivered
            and vb not in held
            and vb in checkpoints
            and checkpoints[vb].seqno >= target
        ]
        if done:
            self.operator.revoke_partitions(done)
        for vb in delivered + done:
            del self.waiting[vb]
        if delivered or done:
            self._dirty = True

    # -- files ----------------------------------------------------------------------------------------

    def _ready(self) -> tuple[list[str], dict[str, int], list[str], bool]:
        return ready_files(self.area, self.generation, self.marks)

    def _drop_orphans(self) -> None:
        held = {name for name, _ in self.held} if self._policies else None
        drop_orphans(
            self.area, self.generation, self.marks, {a.name for a in self.accepted}, held, self.adjusted_next
        )

    def _source_bucket(self) -> DirectLogSource:
        if self._source is None:
            assert self.source_bucket is not None
            self._source = self.state.open_bucket(self.source_bucket)
        return self._source

    # -- the poll -------------------------------------------------------------------------------------

    def poll(self, *, end_of_input: bool = False) -> list[Window]:
        """One round (see the module docstring); returns the windows that closed in it."""
        now = self.clock()
        dlq: list[DlqRow] = []
        counters: Counter[str] = Counter()
        self._collect(counters)
        checkpoints = self._waiting_checkpoints()
        if checkpoints is None and (self._has_timeouts or self._holds):
            # Read before listing the files, so that they vouch for every row written up to them (see
            # _unread_arrival): a timeout must not fire while rows that reached the source before it wait.
            checkpoints = self.store.checkpoints(self.function)
        ready, marks, consumed, deferred = self._ready()
        unread = OncePerPoll(lambda: self._unread_arrival(checkpoints, deferred))
        closed: list[Any] = []
        if ready or self.held:
            # Held rows (substreams) are looked at again every poll: the mutations they wait for may have
            # been read without giving a row (a delete, a dead letter).
            release_all = end_of_input and self.close_windows
            closed += self._classify(
                ready, now, dlq, counters, unread, deferred=deferred, release_all=release_all
            )
        if ready:
            self.marks = marks
            self._dirty = True
        if checkpoints is not None and not deferred:
            self._release_waiting(checkpoints)
        closed += self._close(self._timeout_clock(now, unread), counters)
        if end_of_input and self.close_windows:
            closed += self._close_all(counters)
        prunable = self._take_prunable()
        if self._dirty or dlq or counters:
            self._commit(dlq, counters)
            if closed:
                fault("after_state_commit")
        self.area.delete_many(consumed + ready + self._after_commit)
        self._after_commit = []
        self._unlink_accepted(prunable)
        self._submit()
        return closed

    # -- time: arrival times and timeouts ---------------------------------------------------------------

    @property
    def _has_timeouts(self) -> bool:
        """Event-time windows with an idle timeout or a partition idle timeout, over a known source."""
        # Session windows judge idleness when the coordinator polls (their operator has no deadline to ask).
        return self.spec.arrival_gap_ms is not None and self.source_bucket is not None and not self._sessions

    def _next_deadline(self) -> int | None:
        operator = self.operator
        return operator.next_timeout_ms() if isinstance(operator, WindowOperator) else None

    def _timeout_due(self, at_ms: int) -> bool:
        """Whether a timeout (idle timeout, partition idleness) would fire at ``at_ms`` without more rows."""
        if not self._has_timeouts:
            return False
        deadline = self._next_deadline()
        return deadline is not None and deadline <= at_ms

    def _timeout_clock(self, at_ms: int, unread: OncePerPoll) -> int:
        """The processing time up to which timeouts may be applied now: ``at_ms``, unless a timeout would fire
        by then while mutations that reached the source earlier are still unread. Then just before the
        earliest of them: the source was not silent, only the service was slow or stopped.
        Those mutations are read first; their arrival times decide whether the source was silent."""
        if not self._timeout_due(at_ms):
            return at_ms
        first = unread()
        return at_ms if first is None else min(at_ms, first - 1)

    def _unread_arrival(self, checkpoints: dict[int, Any] | None, deferred: bool) -> int | None:
        """The earliest arrival time of the source's mutations whose rows this coordinator has not read
        (None: none). A vBucket's rows are read up to the greater of the last row classified and its
        checkpoint read before the file listing (a worker writes its rows before its checkpoint moves).
        Without that checkpoint, or while a worker's earlier file is missing, it cannot tell: then the
        operator's next deadline, which holds every timeout back until a later poll can tell."""
        deadline = self._next_deadline()
        unknown = deadline if deadline is not None else self.clock()
        if checkpoints is None or deferred:
            return unknown
        try:
            source = self._source_bucket()
            highs = source.high_seqnos()
            behind: dict[int, int] = {}
            for vb, high in enumerate(highs):
                cp = checkpoints.get(vb)
                done = max(self.classified_upto[vb], cp.seqno if cp is not None else 0)
                if high > done:
                    behind[vb] = done
            return source.first_arrival_after(behind) if behind else None
        except Exception as exc:  # noqa: BLE001 - holding the timeout back is the safe side
            log.warning("function %s: cannot read the source's waiting mutations (%s)", self.function, exc)
            return unknown

    def _close(self, at_ms: int, counters: Counter[str]) -> list[Any]:
        """Apply processing time ``at_ms`` (watermark, timeouts); closed windows wait for emission."""
        return self._hold_for_emission(self.operator.advance(at_ms), counters)

    def _close_all(self, counters: Counter[str]) -> list[Any]:
        return self._hold_for_emission(self.operator.close_all(), counters)

    def _hold_for_emission(self, closed: list[Any], counters: Counter[str]) -> list[Any]:
        if closed:
            last = self.next_seq - 1  # the windows hold the rows of the batches accepted so far
            self.pending.extend(PendingWindow.of(w, last) for w in closed)
            counters["windows_closed"] += len(closed)
            self._dirty = True
        return closed

    def _arrival_segments(self, table: pa.Table, now: int) -> list[pa.Table]:
        """The rows split where the source fell silent for at least the shortest timeout, in arrival order
        (one piece, as read, when there is no such silence). Rows of an older build (arrival 0) count as
        arriving now."""
        arrival = table["arrival_ms"]
        if pc.any(pc.equal(arrival, 0)).as_py():
            arrival = pc.if_else(pc.equal(arrival, 0), now, arrival)
            table = table.set_column(table.schema.get_field_index("arrival_ms"), "arrival_ms", arrival)
        gap = self.spec.arrival_gap_ms
        if gap is None or table.num_rows < 2:
            return [table]
        bounds = pc.min_max(arrival).as_py()
        if bounds["max"] - bounds["min"] < gap:
            return [table]
        order = pc.sort_indices(
            table, [("arrival_ms", "ascending"), ("vb", "ascending"), ("seqno", "ascending")]
        )
        table = table.take(order)
        times = table["arrival_ms"].to_numpy()
        cuts = (np.flatnonzero(np.diff(times) >= gap) + 1).tolist()
        edges = [0, *cuts, table.num_rows]
        return [table.slice(a, b - a) for a, b in zip(edges, edges[1:], strict=False)]

    # -- arrival-time policies (docs/time-semantics.md) ------------------------------------------------

    def _apply_policies(
        self,
        table: pa.Table,
        now: int,
        dlq: list[DlqRow],
        counters: Counter[str],
        unread: OncePerPoll,
        deferred: bool,
        release_all: bool,
    ) -> pa.Table:
        """Judge rows with the function's arrival-time policies (``eventing.windows.runtime.arrivals``):
        dropped rows become dead letters, adjusted ones are recorded under ``adjusted/``; returns the rows
        to window, at their windowed times, with the ``LIFTS`` column."""
        assert self.gate is not None
        table = known_arrivals(table, now)
        if self._holds:
            table = self._release(table, unread, deferred, release_all)
        if table.num_rows == 0:
            return table
        judged: Judged = self.gate.judge(table)
        self._judged_arrival_ms = int(pc.max(table["arrival_ms"]).as_py())
        for reason, rows in judged.dropped.items():
            dlq.extend(self._dead_letters(rows, reason, judged.errors[reason], now))
            counters[f"dlq_{reason}"] += rows.num_rows
        counters.update(judged.counters)
        if judged.adjusted.num_rows:
            name = f"f{self.fence}-{self.adjusted_next:09d}.parquet"
            write_parquet_file(self.area, f"{ADJUSTED}/{name}", judged.adjusted)
            self.adjusted_next += 1
        self._dirty = True
        return judged.kept

    def _release(self, table: pa.Table, unread: OncePerPoll, deferred: bool, release_all: bool) -> pa.Table:
        """Substreams: the rows (held ones and ``table``) every mutation that reached the source before which
        has been read, so rows of all vBuckets are judged in one arrival order however the workers' files
        came; the others are held (``held/``, listed in the state) for a later poll."""
        held = [self._read(f"{HELD}/{name}").select(self.schema.names) for name, _ in self.held]
        fresh = table.num_rows
        rows = pa.concat_tables([*held, table]) if held else table
        if release_all:
            frontier: int | None = None
        elif deferred:
            frontier = -(2**63)  # a worker's earlier file is not visible yet: its rows may come first
        else:
            frontier = unread()
        if frontier is None:
            go, wait = rows, rows.slice(0, 0)
        else:
            early = pc.less(rows["arrival_ms"], frontier)
            go, wait = rows.filter(early), rows.filter(pc.invert(early))
        if go.num_rows == 0:
            if fresh:  # nothing released: the new rows join the held ones as one more file
                name = f"f{self.fence}-{self.held_next:09d}.arrow"
                write_row_file(self.area, HELD, name[: -len(".arrow")], table)
                self.held.append([name, fresh])
                self._held_vb_cache = None
                self.held_next += 1
                self._dirty = True
            return go
        self._after_commit += [f"{HELD}/{name}" for name, _ in self.held]
        self.held = []
        self._held_vb_cache = None
        if wait.num_rows:
            name = f"f{self.fence}-{self.held_next:09d}.arrow"
            write_row_file(self.area, HELD, name[: -len(".arrow")], wait)
            self.held = [[name, wait.num_rows]]
            self.held_next += 1
        self._dirty = True
        return go

    def _held_vbs(self) -> set[int]:
        """vBuckets with rows held for the policies (read from the held files once, then kept up to date)."""
        if self._held_vb_cache is None:
            vbs: set[int] = set()
            for name, _ in self.held:
                vbs.update(pc.unique(self._read(f"{HELD}/{name}")["vb"]).to_pylist())
            self._held_vb_cache = vbs
        return self._held_vb_cache

    def _dead_letters(self, rows: pa.Table, reason: str, errors: list[str], now: int) -> list[DlqRow]:
        source = self._source_bucket if self.source_bucket is not None else None
        return dead_letters(self.function, self.generation, rows, reason, errors, now, source)

    def _classify(
        self,
        files: list[str],
        now: int,
        dlq: list[DlqRow],
        counters: Counter[str],
        unread: OncePerPoll,
        *,
        deferred: bool = False,
        release_all: bool = False,
    ) -> list[Window]:
        """Window the rows of ``files`` (and held rows the policies may judge now); returns the windows that
        closed between their arrivals."""
        if not files:
            return self._judged_then_clock(
                self._apply_policies(
                    self.schema.empty_table(), now, dlq, counters, unread, deferred, release_all
                ),
                now,
                dlq,
                counters,
                unread,
            )
        table, replayed = read_fresh_rows(
            self.area, files, self.schema.names, self.classified_upto, function=self.function
        )
        counters["window_rows_replayed"] += replayed
        if table.num_rows == 0 and not self.held:
            return []
        for vb, seqno in max_seqno_per_vb(table).items():
            self.classified_upto[vb] = max(self.classified_upto[vb], seqno)
        if self.spec.boundary == "processing_time":
            # Processing time is when the coordinator windows the row: the one clock that closes windows.
            index = table.schema.get_field_index("event_time")
            stamped = pa.array([now] * table.num_rows, pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
            table = table.set_column(index, "event_time", stamped.cast(table.schema.field(index).type))
        if self.gate is not None:
            table = self._apply_policies(table, now, dlq, counters, unread, deferred, release_all)
        return self._judged_then_clock(table, now, dlq, counters, unread)

    def _judged_then_clock(
        self, table: pa.Table, now: int, dlq: list[DlqRow], counters: Counter[str], unread: OncePerPoll
    ) -> list[Window]:
        """Window the judged rows; then, with substream windows, every judged row (dropped ones too: they
        are input) moves the arrival clock that closes a silent substream's windows
        (docs/time-semantics.md)."""
        closed = self._classify_judged(table, now, dlq, counters, unread)
        judged_arrival, self._judged_arrival_ms = self._judged_arrival_ms, None
        if judged_arrival is not None and isinstance(self.operator, SubstreamWindowOperator):
            self.operator.note_arrival(judged_arrival)
        return closed

    def _classify_judged(
        self, table: pa.Table, now: int, dlq: list[DlqRow], counters: Counter[str], unread: OncePerPoll
    ) -> list[Window]:
        if table.num_rows == 0:
            return []
        if isinstance(self.operator, SessionOperator):
            self._classify_sessions(self.operator, table, now, dlq, counters)
            return []
        if self.spec.boundary == "processing_time":
            self._classify_rows(table, now, None, dlq, counters)
            return []
        closed: list[Any] = []
        for segment in self._arrival_segments(table, now):
            bounds = pc.min_max(segment["arrival_ms"]).as_py()
            # Timeouts due before these rows reached the source fire first, as they would have live.
            closed += self._close(self._timeout_clock(bounds["min"] - 1, unread), counters)
            self._classify_rows(segment, now, bounds["max"], dlq, counters)
        return closed

    def _classify_rows(
        self, table: pa.Table, now: int, arrival_ms: int | None, dlq: list[DlqRow], counters: Counter[str]
    ) -> None:
        lifts = None
        if LIFTS in table.schema.names:  # judged by the arrival-time policies: early rows do not lift
            lifts = table[LIFTS]
            table = table.drop_columns([LIFTS])
        vbs = table["vb"]
        assert isinstance(self.operator, WindowOperator)  # sessions go through _classify_sessions
        if isinstance(self.operator, SubstreamWindowOperator):
            column = self.layout.substream_column
            assert column is not None
            fate = self.operator.observe_batch(
                vbs, table["event_time"], now, arrival_ms=arrival_ms, lifts=lifts, substreams=table[column]
            )
            if fate.late_count:
                fate = dataclasses.replace(fate, late=pa.array(fate.late, pa.bool_()))
        else:
            fate = self.operator.observe_batch(
                vbs, table["event_time"], now, arrival_ms=arrival_ms, lifts=lifts
            )
        if fate.late_count:
            late = table.filter(fate.late)
            dlq.extend(self._late_rows(late, fate.cutoff_ms, now))
            counters["dlq_late"] += late.num_rows
            table = table.filter(pc.invert(fate.late))
        if table.num_rows == 0:
            return
        from eventing.windows.spark.partials import combine_rows

        # Only the batch's partial aggregates per (window, group) are kept: Spark merges them per window.
        partials = combine_rows(
            table,
            size_ms=self.spec.size_ms,
            slide_ms=self.spec.slide_ms,
            group_by=self.layout.group_by,
            aggregates=self.layout.aggregates,
            offset_ms=self.spec.offset_ms,
        )
        self._accept(table, partials, counters)

    def _classify_sessions(
        self, operator: SessionOperator, table: pa.Table, now: int, dlq: list[DlqRow], counters: Counter[str]
    ) -> None:
        """Sessions: cut the batch into chains (``eventing.windows.runtime.session_chains``), let the operator
        judge and merge them, and keep one partial row per accepted chain."""
        from eventing.windows.spark.partials import combine_session_rows

        group_by = list(self.layout.group_by)
        cut = cut_chains(table, self.spec, group_by)
        table, chain_of_row, first, last = cut.table, cut.chain_of_row, cut.first, cut.last
        verdict = np.array(operator.observe_chains(cut.chains, cut.maxima, now), dtype=bool)
        for vb, seqno in max_seqno_per_vb(table).items():
            self.classified_upto[vb] = max(self.classified_upto[vb], seqno)
        row_late = verdict[chain_of_row]
        if row_late.any():
            late = table.filter(pa.array(row_late))
            dlq.extend(self._late_rows(late, None, now))
            counters["dlq_late"] += late.num_rows
            keep = pa.array(~row_late)
            table = table.filter(keep)
            chain_of_row = chain_of_row[~row_late]
        if table.num_rows == 0:
            return
        partials = combine_session_rows(
            table, chain_of_row, first, last, group_by=group_by, aggregates=self.layout.aggregates
        )
        self._accept(table, partials, counters)

    def _accept(self, table: pa.Table, partials: pa.Table, counters: Counter[str]) -> None:
        """Keep a batch's accepted rows as their partial aggregates, in the next accepted file."""
        seq = self.next_seq
        name = f"f{self.fence}-{seq:09d}.parquet"
        write_parquet_file(self.area, f"{ACCEPTED}/{name}", partials)
        bounds = pc.min_max(arrow_epoch_ms(table["event_time"])).as_py()
        self.accepted.append(AcceptedBatch(name, seq, bounds["min"], bounds["max"], table.num_rows))
        self.next_seq = seq + 1
        counters["window_rows_accepted"] += table.num_rows

    def _late_rows(self, late: pa.Table, cutoff_ms: int | None, now: int) -> list[DlqRow]:
        """DLQ rows for late rows, carrying the original mutation from the source bucket when it is there."""
        return self._dead_letters(late, "late", late_errors(late, self.spec, self.operator, cutoff_ms), now)

    def _take_prunable(self) -> set[str]:
        """Drop from the state the accepted files no window needs any more; unlink them after the commit."""
        prunable = self._prunable()
        if prunable:
            self.accepted = [a for a in self.accepted if a.name not in prunable]
            self._dirty = True
        return prunable

    def _unlink_accepted(self, names: set[str]) -> None:
        self.area.delete_many(f"{ACCEPTED}/{name}" for name in sorted(names))

    def _read(self, name: str) -> pa.Table:
        return read_row_file(self.area, name, function=self.function)

    def _prunable(self) -> set[str]:
        """Accepted files whose rows belong only to closed windows that are all emitted."""
        if isinstance(self.operator, SessionOperator):
            # Rows are in exactly one session; an open one starts at or after min_open_start_ms.
            open_start = self.operator.min_open_start_ms
            cutoff = (2**63 - 1) if open_start is None else open_start
        else:
            cutoff = self.operator.late_cutoff_ms  # type: ignore[assignment]
            if cutoff is None:
                return set()
        out = set()
        for a in self.accepted:
            if a.max_ms >= cutoff:
                continue
            needed = any(
                a.seq <= p.closed_at and a.min_ms < p.window.end_ms and p.window.start_ms <= a.max_ms
                for p in self.pending
            )
            if not needed:
                out.add(a.name)
        return out

    # -- emission -------------------------------------------------------------------------------------

    def _submit(self) -> None:
        if self._inflight is not None or not self.pending or time.monotonic() < self.retries.retry_at:
            return
        written = self.sink.written_windows(self.function)
        todo = [p for p in self.pending if p.sink_id not in written]
        if len(todo) < len(self.pending):
            # Emitted before a crash, not yet recorded: record them now.
            done = [p for p in self.pending if p not in todo]
            self.pending = todo
            self._commit([], Counter(windows_emitted=len(done)))
        if not todo:
            return
        # Tumbling: a row accepted after a window closed cannot fall in it (it would have been late), so
        # one job covers every pending window. Hopping: a row accepted later may fall in an earlier,
        # closed window too, so each window only sees the batches accepted before it closed.
        group = todo if not self._hopping else [p for p in todo if p.closed_at == todo[0].closed_at]
        self._jobs += 1
        staged = f"{STAGING}/job-{self.fence}-{self._jobs}"
        stage(self.area, staged, self.accepted, group)
        windows = sorted({p.job_key for p in group}, key=job_sort_key)
        self._inflight_windows = group
        ids = sorted({p.sink_id for p in group}) if group[0].substream is not None else None
        self._inflight = self.emitter.submit(self._emit, staged, windows, ids)

    def _emit(self, staged: str, windows: list[tuple], substream_ids: list[tuple] | None = None) -> int:
        """Runs on the emitter (``eventing.windows.runtime.emission.emit``)."""
        return emit(
            self.aggregator, self.sink, self.function, self.layout, self.area, staged, windows, substream_ids
        )

    def _collect(self, counters: Counter[str]) -> bool:
        """Record a finished emission; returns False if one is still running (or failed)."""
        future = self._inflight
        if future is None:
            return True
        if not future.done():
            return False
        self._inflight = None
        group, self._inflight_windows = self._inflight_windows, []
        error = future.exception()
        if error is not None:
            counters["window_emit_failures"] += 1
            self.retries.failed(error, len(group))
            return False
        self.retries.succeeded()
        self.pending = [p for p in self.pending if p not in group]
        counters["windows_emitted"] += len(group)
        self._dirty = True
        return True

    def final_poll(self, *, end_of_input: bool = False) -> None:
        """The round after the function's workers stopped (every row is on disk): consume every batch, close
        what the semantics allow (every window at the end of input with ``close_windows``), commit, and
        start emitting. Does not wait for Spark: ``drain`` does."""
        self.poll(end_of_input=end_of_input)
        self.retries.retry_at = 0.0

    def drain_step(self) -> bool:
        """Record a finished emission and start the next one, without waiting; True once every closed
        window is emitted and recorded."""
        counters: Counter[str] = Counter()
        self._collect(counters)
        if counters or self._dirty:
            self._commit([], counters)
        self._submit()
        if self.pending or self._inflight is not None:
            return False
        prunable = self._take_prunable()
        if self._dirty:
            self._commit([], Counter())
        self._unlink_accepted(prunable)
        return True

    def drain(self, timeout: float = 600.0) -> bool:
        """Wait until every closed window is emitted and recorded (True), or ``timeout`` passes (False: the
        rest is emitted by the next coordinator of the function, from the committed state)."""
        deadline = time.monotonic() + timeout
        self.retries.retry_at = 0.0
        while not self.drain_step():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.retries.failures >= DRAIN_ATTEMPTS:
                log.error(
                    "function %s: %d closed window(s) are not emitted yet; the next run emits them",
                    self.function,
                    len(self.pending),
                )
                return False
            if self._inflight is not None:
                try:
                    self._inflight.exception(timeout=min(remaining, 1.0))
                except TimeoutError:
                    pass
            else:
                time.sleep(min(remaining, max(0.0, self.retries.retry_at - time.monotonic()), 1.0))
        return True

    def finish(self, *, end_of_input: bool = False, timeout: float = 600.0) -> bool:
        """``final_poll`` then ``drain``."""
        self.final_poll(end_of_input=end_of_input)
        return self.drain(timeout)

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None
