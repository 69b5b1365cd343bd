"""How a worker reads its source (``SourceReader``, a part of ``WorkerCore``, eventing.workers.worker, built
by it): a batch taken across the owned vBuckets in rotation (``process``), read ahead through the data
service (``prefetch``), from a file source less the rows the filter's byte check rules out
(``read_matching``), split by collection (``handle_collections``), or, for a window-only function, packed in
bulk (``take_window_batch``); each run of rows read is noted in the worker's call notes, or handled alone
where it holds a suspect (``handle_rows``, eventing.workers.crash_guard), and goes on to the worker's
``MutationHandler`` (eventing.workers.handling).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from eventing.core import counters as counter_names
from eventing.core.filters import Prefilter
from eventing.storage.protocol import Bucket, DirectLogSource, LogSource
from eventing.storage.remote import RemoteBucket
from eventing.workers.collections import COLLECTION_MARK_BYTES, SourceCollections
from eventing.workers.crash_guard import CrashGuard, handle_alone
from eventing.workers.handling import MutationHandler
from eventing.workers.progress import WorkerProgress

if TYPE_CHECKING:
    from eventing.workers.batch_calls import BatchCalls
    from eventing.workers.concurrent_calls import ConcurrentCalls

# A worker reading through the data service reads this many mutations ahead in one call, and keeps one
# such call in flight while fewer than this many are read ahead: a call across Ray nodes costs milliseconds
# of CPU whatever its size, so fewer, larger calls read faster (figures in docs/benchmarks.md, "Remote read
# ahead"). EVENTING_REMOTE_READ_AHEAD overrides it (forwarded to every node).
REMOTE_READ_AHEAD = int(os.environ.get("EVENTING_REMOTE_READ_AHEAD", "32000"))
# A row the filter's byte check rules out never leaves SQLite: scanning it costs about a tenth of reading and
# handling a mutation, so a batch counts such rows at this many to one mutation of its budget, and a batch
# of mostly rejected rows is not cut short. A read asks for as many entries as should keep the rows it hands
# to Python within the budget, at the ratio of scanned to kept entries seen lately (1 to this many).
REJECTED_ROWS_PER_MUTATION = 8


class SourceReader:
    """Reads a worker's source for its handler (see the module docstring). Built by WorkerCore
    (eventing.workers.worker) with what it needs; the worker's `progress` (eventing.workers.progress) is
    shared with the handler and the worker's other parts."""

    def __init__(
        self,
        progress: WorkerProgress,
        source: Bucket,
        collections: SourceCollections,
        handler: MutationHandler,
        crash_guard: CrashGuard,
        *,
        reads_ahead: bool,
        prefilter: Prefilter | None,
    ):
        self.progress = progress
        self.name = progress.name
        self.source = source
        self.collections = collections
        self.handler = handler
        self.crash_guard = crash_guard
        # Through the data service: reads ahead in calls of many batches (prefetch).
        self.reads_ahead = reads_ahead
        # The filter's byte check, for a file source's query (read_matching), else None.
        self.prefilter = prefilter
        # Changed in place only (eventing.workers.progress): held here.
        self.positions, self.lettered = progress.positions, progress.lettered
        # A window-only function (no on_update, no filter) reads packed runs (take_window_batch).
        self.window_only = (
            handler.on_update is None and handler.window_rows is not None and handler.filter is None
        )
        self.window_read = 1 << 62  # a window-only read's entries at most (the worker sets batch_size)
        # Rows a read ahead asks for: REMOTE_READ_AHEAD, fewer in a sandboxed child, whose host reads its
        # files on the spot (eventing.workers.sandbox.child).
        self.read_ahead = REMOTE_READ_AHEAD
        self.rotor = 0
        self.resume_vb: int | None = None  # where process stopped: the first of the next look's runs
        self.scan_per_kept = 1.0  # filtered reads: entries scanned per row the query kept, lately
        # Chosen when the worker is built: how a run of rows is read (the source's, or a pool's rows read
        # ahead: eventing.workers.concurrent_calls), and a run read in bulk by an on_batch worker
        # (eventing.workers.batch_calls: how many log entries it took, 0 to leave them to the rows; None:
        # every run is read as rows).
        self.read_rows: Callable[[int, int, int], list[tuple]] = source.read_vb_rows
        self.take_packed: Callable[[int, int, int], int] | None = None
        # A pool's calls or on_batch's, when the worker has one: handle_alone waits for them, or runs a
        # suspect as a batch of its own (eventing.workers.crash_guard).
        self.calls: ConcurrentCalls | None = None
        self.batches: BatchCalls | None = None

    def remote_highs(self) -> list[int]:
        """Through the data service, the high seqnos a step starts from: those read with the rows read
        ahead at the end of the last step (or during it) when they show work, with no round trip of their
        own; otherwise (a step woken by a write made since, or polled) read now, with the rows that follow
        the positions, in one round trip."""
        source = cast(RemoteBucket, self.source)
        positions = self.positions
        if source.highs_ahead():
            highs = source.high_seqnos(prefetched=True)
            if any(positions[vb] < highs[vb] for vb in self.progress.epochs):
                return highs
        self.read_changed()
        return source.high_seqnos(prefetched=True)

    def read_changed(self, for_next_step: bool = False) -> None:
        """Read ahead the rows that follow the positions, in the vBuckets not read ahead already that have
        any (a caught-up step asks as it ends, `for_next_step`: the next one starts with them), up to
        REMOTE_READ_AHEAD rows read ahead in all (RemoteBucket.read_changed)."""
        source, positions = cast(RemoteBucket, self.source), self.positions
        epochs = self.progress.epochs
        if source.holds_ahead():
            asked = [(vb, positions[vb]) for vb in epochs if not source.has_ahead(vb)]
        else:  # caught up, as a woken worker is: every owned vBucket, in C-level loops
            asked = list(zip(epochs, map(positions.__getitem__, epochs), strict=True))
        source.read_changed(asked, self.read_ahead, for_next_step=for_next_step)

    def rotation_start(self, work: list[int]) -> int:
        """Where in `work` the rotation resumes: at the vBucket the last pass stopped before. vBuckets that
        caught up since have left `work`, so the last pass's index would land past vBuckets still waiting
        (a lap's worth of rows read ahead for them would wait in memory till the rotation came round)."""
        resume = self.resume_vb
        if resume is not None:
            try:
                return work.index(resume)
            except ValueError:
                pass  # it left `work` (revoked, or a look at other vBuckets): where the index falls
        return self.rotor % len(work)

    def prefetch(self, work: list[int], limits: dict[int, int], budget: int) -> None:
        """Through the data service: when the vBuckets process takes next (in its order) have fewer than
        twice REMOTE_READ_AHEAD mutations (or less than this batch) read ahead or in flight, ask for the
        next REMOTE_READ_AHEAD in one call (a call still in flight is waited for first), while this batch is
        handled: one read being taken while the next comes (with one read's worth, a worker on another node
        waited for its reads: 0.82-0.84 of the embedded rate against 0.86). read_vb takes rows read ahead
        from the front of each vBucket's rows; a read they do not cover is made on the spot (a round trip,
        never a wrong answer)."""
        source: LogSource = self.source
        source.forget_prefetched(self.positions)
        positions = self.positions
        start = self.rotation_start(work)
        covered = 0
        runs: list[tuple[int, int, int]] = []
        total = 0
        enough = max(budget, 2 * self.read_ahead)  # see above
        has_ahead = source.has_ahead
        for vb in work[start:] + work[:start]:
            backlog = min(limits[vb] - positions[vb], self.read_ahead)
            if has_ahead(vb):
                if not runs:
                    covered += backlog
                    if covered >= enough:
                        return  # enough read ahead in the order of the coming batches
                continue
            if not runs and covered >= enough:
                return
            if backlog > 0:
                runs.append((vb, positions[vb], backlog))
                total += backlog
                if total >= self.read_ahead:
                    break
        source.prefetch(runs)

    def process(self, work: list[int], limits: dict[int, int], budget: int) -> int:
        # Resume the rotation where the last step stopped, so every vBucket makes progress even when
        # the budget is smaller than the backlog; read long runs of one vBucket per query.
        window_only = self.window_only
        if self.reads_ahead and not window_only:
            self.prefetch(work, limits, budget)
        handled = 0
        take_packed = self.take_packed
        used = 0.0  # of the budget: `handled`, less what rejected rows do not cost
        scanned_all = kept_all = 0
        start = self.rotation_start(work)
        self.rotor = 0
        self.resume_vb = None
        order = work[start:] + work[:start]
        for i, vb in enumerate(order):
            if used >= budget:
                last = order[i - 1] if i else None
                if (
                    last is not None
                    and self.reads_ahead
                    and not window_only  # reads packed runs, never the rows read ahead
                    and self.positions[last] < limits[last]
                    and self.source.has_ahead(last)
                ):
                    # The vBucket left halfway is taken up first: the rest of its rows are read ahead, and
                    # would otherwise wait in memory for a whole lap of the rotation (a lap of laps' rows).
                    i -= 1
                    vb = last
                self.rotor = start + i
                self.resume_vb = vb
                break
            position = self.positions[vb]
            if self.prefilter is not None:
                limit = min(max(1, int((budget - used) * self.scan_per_kept)), limits[vb] - position)
                scanned, kept = self.read_matching(vb, position, limit, limits[vb])
                handled += scanned
                used += kept + (scanned - kept) / REJECTED_ROWS_PER_MUTATION
                scanned_all += scanned
                kept_all += kept
                continue
            limit = min(budget - int(used), limits[vb] - position)
            if window_only:
                limit = min(limit, self.window_read)  # in bulk or row by row, the same runs
                taken = self.take_window_batch(vb, position, limit)
                if taken:
                    handled += taken
                    used += taken
                    continue
            elif take_packed is not None:
                taken = take_packed(vb, position, limit)
                if taken:
                    handled += taken
                    used += taken
                    continue
            rows = self.read_rows(vb, position, limit)
            taken = self.handle_rows(vb, position, rows)
            handled += taken
            used += taken
        if scanned_all:
            self.scan_per_kept = min(REJECTED_ROWS_PER_MUTATION, scanned_all / max(kept_all, 1))
        return handled

    def read_matching(self, vb: int, position: int, limit: int, upto: int) -> tuple[int, int]:
        """process's read of the next `limit` log entries of a vBucket from a file source whose query
        leaves out the rows the filter's byte check rules out; they are counted as filtered here, the rest
        go on as read rows do. Returns how many entries it passed (0: none left up to `upto`) and how many
        of them it read (the others were ruled out in the query)."""
        source = cast(DirectLogSource, self.source)  # a prefilter is set only where nothing is read ahead
        rows, scanned, last = source.read_vb_matching(
            vb, position, limit, upto, cast(Prefilter, self.prefilter), self.name
        )
        if rows:
            self.handle_rows(vb, position, rows)
        skipped = scanned - len(rows)
        if skipped:
            c = self.progress.counters
            c[counter_names.MUTATIONS_SEEN] += skipped
            c[counter_names.FILTERED] += skipped
        if last > self.positions[vb]:
            self.positions[vb] = last
        return scanned, len(rows)

    def handle_rows(self, vb: int, position: int, rows: list) -> int:
        """A run of one vBucket's rows, read: handled with the run noted in the worker's call notes, or, when
        it holds mutations to be handled alone, by handle_alone (eventing.workers.crash_guard)."""
        guard = self.crash_guard
        if guard.suspects and guard.suspected(vb, rows):
            return handle_alone(self, vb, position, rows)
        if not rows:
            return self.handler.handle_run(vb, position, rows)
        notes = guard.notes
        notes.note(0, vb, rows[0][1], rows[-1][1])
        try:
            return self.handle_rows_noted(vb, position, rows)
        finally:
            notes.clear(0)

    def handle_rows_noted(
        self, vb: int, position: int, rows: list, take: Callable[[int, int, list], int] | None = None
    ) -> int:
        """`take`: a run handler other than the one chosen when the worker was built (handle_alone's)."""
        if rows and self.collections.mixed(rows):
            return self.handle_collections(vb, position, rows, take)
        return self.handler.handle_run(vb, position, rows, take)

    def handle_collections(
        self, vb: int, position: int, rows: list, take: Callable[[int, int, list], int] | None = None
    ) -> int:
        """A run whose rows are not all of the source collection: the others are passed over (their seqnos
        still move the position, as Couchbase's DCP stream filtered by collection moves on), the source's
        go to handle_run with their own keys and meta.keyspace."""
        runner = self.handler.runner
        for keyspace, group in self.collections.split(rows):
            if keyspace is None:
                self.progress.counters[counter_names.COLLECTION_FILTERED] += len(group)
                last = group[-1][1]
                if last <= position:
                    self.progress.order_violation(vb, last, position)
                position = self.positions[vb] = last
                continue
            runner.keyspace = keyspace
            self.handler.handle_run(vb, position, group, take)
            position = self.positions[vb]
        runner.keyspace = self.collections.default_meta
        return len(rows)

    def take_window_batch(self, vb: int, position: int, limit: int) -> int:
        """For a window-only function (no on_update): buffer the rows of the next ``limit`` log entries
        of a vBucket whole, read in bulk, and count them as MutationHandler.handle would, when every entry is
        a plain update (or a delete without on_delete) that gives a row. Returns how many entries it took: 0,
        with nothing counted or buffered, leaves them to handle one by one (dead letters, the function's own
        writes, float times, ...), with the same rows, counters and dead letters either way."""
        if self.lettered and any(lettered_vb == vb for lettered_vb, _ in self.lettered):
            return 0
        if not self.collections.source_is_default:
            return 0  # rows of other collections to pass over: one by one
        handler = self.handler
        window_rows, max_bytes = handler.window_rows, handler.max_bytes
        assert window_rows is not None
        batch = self.source.read_vb_packed(
            vb, position, limit, self.name, exact_arrivals_over_ms=window_rows.arrival_gap_ms
        )
        if (
            batch is None
            or (batch.other_seqnos and handler.runner.on_delete is not None)
            or COLLECTION_MARK_BYTES in batch.keys
        ):
            return 0
        # An oversize document is dead-lettered: only a batch larger than the limit can hold one.
        if (
            len(batch.docs) > max_bytes
            and self.source.max_doc_bytes(vb, position, batch.last_seqno) > max_bytes
        ):
            return 0
        if not window_rows.add_packed(batch):
            return 0
        self.positions[vb] = batch.last_seqno
        c = self.progress.counters
        c[counter_names.MUTATIONS_SEEN] += batch.count
        if batch.other_seqnos:  # as handle, no zero entries: a counter appears once it counts something
            c[counter_names.NO_HANDLER] += len(batch.other_seqnos)
        return batch.count  # the updates count as window_rows_written once flushed, as in handle
