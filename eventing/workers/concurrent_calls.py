"""Several handler calls at once on one worker (the function setting `concurrency`, as Lambda's
ParallelizationFactor for a stream shard): `ConcurrentCalls`, attached to a WorkerCore whose function has
concurrency > 1, built with the worker's parts it works with (its SourceReader, MutationHandler, and the
core itself for the writes set aside). With concurrency 1 nothing here runs and the worker keeps its
one-call-at-a-time path.

How a batch runs (see docs/functions.md, "Concurrency"):

1. The worker reads its batch as it always does (SourceReader.process), but each run of rows is only sorted
   out (`take_run`): rows the filter drops and rows this deployment dead-lettered are counted on the spot;
   the others join the list of their document, in seqno order (a key lives in one vBucket), and the
   vBucket's position moves on.
2. Each document is one task; `concurrency` pool threads take tasks, longest first, and run a task's
   mutations one after another: one document's mutations stay in seqno order, different documents' run
   at the same time. A mutation that another function's binding wrote (it may be this function's own:
   the recursion guard of MutationHandler.handle decides) is handed to the worker's thread, which handles
   it while the task waits, so counters, dead letters and the guard stay where they are.
3. The batch waits for all its tasks (the barrier) before the read returns, so the effects flush and
   checkpoints that follow cover finished calls only; kept writes are then put back in seqno order per
   vBucket (ConcurrentEffectBuffer.in_seqno_order), as the effect marks need. Counters and dead letters
   of the tasks are added on the worker's thread after the barrier.
4. While a batch's tasks run, the worker's thread writes what earlier batches left: the writes set aside
   after them and a checkpoint a step left behind it (WorkerCore.set_aside_effects, defer_end,
   flush_set_aside: the pool's `effects`), so the pool does not wait for the disk. A failed write is
   rewound after the barrier. It then reads the rows the next batch will take (_read_ahead), so the pool
   does not wait for those between batches either.

Timeouts: SIGALRM reaches only the main thread, so a watcher thread raises HandlerTimeout inside a pool
thread's call that overran (LaneContext.interrupt); the mutation is dead-lettered as `timeout` and the other
tasks go on. A call that cannot be interrupted (blocked in C) is left to the hang guard's recycling.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from functools import partial
from queue import SimpleQueue
from typing import Any, Protocol

from eventing.core import counters as counter_names
from eventing.core.mutation import Mutation
from eventing.execution.bindings import ConcurrentEffectBuffer
from eventing.execution.context import LaneContext
from eventing.execution.runner import NO_HANDLER, Failure, HandlerCall, HandlerTimeout, Rejection
from eventing.workers.handling import MutationHandler
from eventing.workers.hang_guard import TIMEOUT_REPEAT_S
from eventing.workers.source_reads import SourceReader

_as_mutation = partial(tuple.__new__, Mutation)

Task = list[tuple[Mutation, Any]]  # one document's mutations of a batch, in seqno order, with meta.keyspace
Tally = tuple[Counter, list[tuple[Mutation, Any, Failure | None]]]  # a task's counters and failures


class _OnWorkerThread:
    """A mutation a task hands to the worker's thread (MutationHandler.handle), and the event it waits on."""

    __slots__ = ("m", "keyspace", "done")

    def __init__(self, m: Mutation, keyspace: Any):
        self.m, self.keyspace, self.done = m, keyspace, threading.Event()


class SetAsideEffects(Protocol):
    """The effects side of a worker (WorkerCore, eventing.workers.worker): its writes set aside after a batch
    and the checkpoint a step left, written while the next batch's calls run, and rewound if that failed."""

    def flush_set_aside(self) -> None: ...

    def set_aside_effects(self, minimum: int | None = None) -> None: ...

    def rewind(self) -> None: ...


class ConcurrentCalls:
    """The pool of one WorkerCore (eventing.workers.worker): `size` threads, each with its LaneContext,
    running the calls of what the worker's `reader` (eventing.workers.source_reads) reads, with its
    `handler`'s counters and dead letters (eventing.workers.handling); `effects` writes what earlier batches
    left while they run; `language`: the function's (a JavaScript call is stopped inside V8, see _start)."""

    def __init__(
        self,
        size: int,
        handler: MutationHandler,
        reader: SourceReader,
        effects: SetAsideEffects,
        *,
        language: str,
    ):
        self.size = size
        self.handler = handler
        self.progress = handler.progress
        self.runner = handler.runner
        self.reader = reader
        self.effects = effects
        self.language = language
        self.notes = reader.crash_guard.notes
        self.tasks: dict[tuple[int, str], Task] = {}  # (vb, key) -> the document's mutations of this batch
        self.lanes: list[LaneContext] = []
        self._queue: SimpleQueue = SimpleQueue()  # tasks for the pool (None ends a thread)
        self._done: SimpleQueue = SimpleQueue()  # a task's Tally or exception, or an _OnWorkerThread
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._keeping = threading.Lock()
        # The next batch's rows, read while this batch's calls run (_read_ahead): vb -> (the position they
        # follow, rows). A file source's log below its high seqnos does not change under a deployed
        # function (a flush is refused), so rows read ahead stay right; a source behind the data service
        # reads ahead on its own (SourceReader.prefetch), and a filtered one reads in its query.
        self._ahead: dict[int, tuple[int, list[tuple]]] = {}
        self._next_batch: tuple[list[int], dict[int, int], int] | None = None
        self.reads_ahead = (
            not reader.reads_ahead and reader.prefilter is None and handler.on_update is not None
        )
        self._read_source = reader.source.read_vb_rows
        self._buffers = [
            buf
            for buf in {id(b.buf): b.buf for b in handler.rw_bindings}.values()
            if isinstance(
                buf, ConcurrentEffectBuffer
            )  # every one (attach): each thread keeps its calls' writes
        ]

    # -- the worker's thread ---------------------------------------------------------------------------

    def process(self, work: list[int], limits: dict[int, int], budget: int) -> int:
        """SourceReader.process with the batch's calls run by the pool, returning after all of them."""
        self._next_batch = (work, limits, budget)
        try:
            return self.reader.process(work, limits, budget)
        finally:
            # Even when reading raised: positions already moved past the rows taken, so they are handled.
            self._run_tasks()

    def take_run(self, vb: int, position: int, rows: list) -> int:
        """The run handler for concurrency > 1 (MutationHandler.handle_run, past the filter): sorts a run of
        one vBucket's rows into tasks."""
        progress = self.progress
        positions, handle = progress.positions, self.handler.handle
        keyspace, lettered, tasks = self.runner.keyspace, progress.lettered, self.tasks
        for row in rows:
            seqno = row[1]
            if seqno <= position:
                progress.order_violation(vb, seqno, position)
            position = seqno
            m = _as_mutation(row)
            if lettered and (vb, seqno) in lettered:
                handle(m)  # dead-lettered by this deployment already: counted and skipped, no call
                continue
            task = tasks.get((vb, m.key))
            if task is None:
                tasks[(vb, m.key)] = [(m, keyspace)]
            else:
                task.append((m, keyspace))
        if rows:
            positions[vb] = position
        return len(rows)

    def drain(self) -> None:
        """Run the tasks taken so far and wait for them: the next mutation is handled alone, on the worker's
        thread (eventing.workers.crash_guard, handle_alone)."""
        self._run_tasks()

    def _run_tasks(self) -> None:
        """Run the batch's tasks on the pool and wait for all of them (the barrier)."""
        tasks = self.tasks
        self.tasks = {}
        if tasks:
            self._start()
            # Longest first: the barrier waits for the last task, so the long ones should not start last.
            for task in sorted(tasks.values(), key=len, reverse=True):
                self._queue.put(task)
        left, tallies, error = len(tasks), [], None
        handler, effects, notes = self.handler, self.effects, self.notes
        # The writes earlier batches set aside, and a checkpoint the last step left, are written now, while
        # this batch's calls run (WorkerCore.defer_end): the pool does not wait for them. A failed write is
        # rewound once the calls are done.
        flush_error: BaseException | None = None
        try:
            effects.flush_set_aside()
        except BaseException as exc:  # noqa: BLE001 - raised after the barrier
            flush_error = exc
        ahead_error: BaseException | None = None
        if tasks and self.reads_ahead and flush_error is None:
            try:
                self._read_ahead()
            except Exception:  # noqa: BLE001 - only a head start: the batch that needs the rows reads them again
                self._ahead = {}
            except BaseException as exc:  # noqa: BLE001 - raised after the barrier
                self._ahead = {}
                ahead_error = exc
        while left:
            item = self._done.get()
            if type(item) is _OnWorkerThread:
                runner = self.runner
                keyspace, runner.keyspace = runner.keyspace, item.keyspace
                notes.note(0, item.m.vb, item.m.seqno, item.m.seqno)
                try:
                    handler.handle(item.m)
                except BaseException as exc:  # noqa: BLE001 - raised after the barrier
                    error = error or exc
                finally:
                    notes.clear(0)
                    runner.keyspace = keyspace
                    item.done.set()
                continue
            left -= 1
            if isinstance(item, BaseException):
                error = error or item
            else:
                tallies.append(item)
        for buf in self._buffers:
            buf.in_seqno_order()
        c = self.progress.counters
        for counts, failed in tallies:
            c.update(counts)
            for m, call, failure in failed:
                if failure is not None:
                    handler.outcome(m, call, failure)
                else:
                    self.progress.dead_letter(m, call.status, call.error, "", 0)
        if flush_error is not None:
            effects.rewind()
            raise flush_error
        if error is not None:
            raise error
        if ahead_error is not None:
            raise ahead_error
        effects.set_aside_effects()

    def _read_ahead(self) -> None:
        """While the batch's calls run, read the rows the next batch takes first, as SourceReader.process
        will (the vBuckets still behind their limits, in rotation from where this batch stopped), so that
        the pool does not wait for them between batches."""
        work, limits, budget = self._next_batch or ([], {}, 0)
        positions = self.progress.positions
        left = [vb for vb in work if positions[vb] < limits[vb]]
        ahead: dict[int, tuple[int, list[tuple]]] = {}
        if left:
            start = self.reader.rotation_start(left)
            taken = 0
            for vb in left[start:] + left[:start]:
                if taken >= budget:
                    break
                position = positions[vb]
                rows = self._read_source(vb, position, min(budget - taken, limits[vb] - position))
                ahead[vb] = (position, rows)
                taken += len(rows)
        self._ahead = ahead

    def read_rows(self, vb: int, position: int, limit: int) -> list[tuple]:
        """The source's read_vb_rows, from the rows read ahead where they follow `position`."""
        ahead = self._ahead.pop(vb, None)
        if ahead is None or ahead[0] != position or not ahead[1]:
            return self._read_source(vb, position, limit)
        rows = ahead[1]
        if len(rows) > limit:
            self._ahead[vb] = (rows[limit - 1][1], rows[limit:])
            return rows[:limit]
        if len(rows) < limit:
            rows = rows + self._read_source(vb, rows[-1][1], limit - len(rows))
        return rows

    def _start(self) -> None:
        if self._threads:
            return
        for i in range(self.size):
            lane = LaneContext(self.handler.timeout_s)
            self.lanes.append(lane)
            thread = threading.Thread(target=self._lane, args=(lane, i + 1), name=f"handler-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        # A JavaScript call is stopped inside V8 by its handler's watchdog (TerminateExecution) at the same
        # deadline; an exception raised into the thread would only land after V8 returns, in STPyV8's code.
        if self.language != "javascript":
            threading.Thread(target=self._watch, name="handler-timeouts", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)

    # -- the pool's threads ----------------------------------------------------------------------------

    def _lane(self, lane: LaneContext, slot: int) -> None:
        lane.bind()
        try:
            self.runner.prepare_thread()
        except Exception:  # noqa: BLE001 - the thread's first call makes it again and fails as a call would
            pass
        while True:
            task = self._queue.get()
            if task is None:
                return
            try:
                self._done.put(self._run_task(lane, slot, task))
            except BaseException as exc:  # noqa: BLE001 - the worker's thread raises it after the barrier
                self._done.put(exc)

    def _run_task(self, lane: LaneContext, slot: int, task: Task) -> Tally:
        """One document's mutations, one after another; what handle would count and dead-letter, returned."""
        runner, epochs, success = self.runner, self.progress.epochs, self.handler.success
        counts: Counter = Counter()
        failed: list[tuple[Mutation, Any, Failure | None]] = []
        for m, keyspace in task:
            if m.origin is not None:  # a binding wrote it: handle applies the recursion guard
                ask = _OnWorkerThread(m, keyspace)
                self._done.put(ask)
                ask.done.wait()
                continue
            counts[counter_names.MUTATIONS_SEEN] += 1
            call = runner.prepare(m, keyspace)
            if type(call) is Rejection:
                if call is NO_HANDLER:
                    counts[counter_names.NO_HANDLER] += 1
                else:
                    failed.append((m, call, None))
                continue
            assert type(call) is HandlerCall
            failure = self._call(lane, slot, m, call, epochs[m.vb], counts)
            if failure is None:
                counts[success[call.kind]] += 1
            else:
                failed.append((m, call, failure))
        return counts, failed

    def _call(
        self, lane: LaneContext, slot: int, m: Mutation, call: HandlerCall, epoch: int, counts: Counter
    ) -> Failure | None:
        """HandlerRunner.call on a pool thread: retries and backoff as configured, the lane's timeout, the
        call noted in the thread's slot of the worker's call notes (eventing.workers.crash_guard).
        A timeout can land until `lane.finish()` returns, so every path through the call finishes the
        lane before anything is kept or discarded."""
        notes = self.notes
        notes.note(slot, m.vb, m.seqno, m.seqno)
        try:
            return self._noted_call(lane, m, call, epoch, counts)
        finally:
            notes.clear(slot)

    def _noted_call(
        self, lane: LaneContext, m: Mutation, call: HandlerCall, epoch: int, counts: Counter
    ) -> Failure | None:
        runner, rw = self.runner, self.handler.rw_bindings
        attempts = self.handler.attempts
        tried = None
        assert call.fn is not None
        fn, args = call.fn, call.args
        for attempt in range(1, attempts + 1):
            for b in rw:
                b.begin(m.vb, m.seqno)
            lane.begin(m, epoch)
            try:
                try:
                    fn(*args)
                except BaseException as exc:
                    lane.finish()
                    outcome = runner.failed(exc, m, call, attempt, attempts, tried)
                else:
                    lane.finish()
                    with self._keeping:  # one call's writes join the shared groups at a time
                        runner.kept(epoch)
                    return None
            except HandlerTimeout as exc:  # raised as the call ended, before the lane finished: it overran
                lane.finish()
                outcome = runner.failed(exc, m, call, attempt, attempts, tried)
            if isinstance(outcome, Failure):
                return outcome
            tried = outcome
            counts[counter_names.RETRIES] += 1
            time.sleep(outcome.delay_s)
        raise AssertionError("unreachable: attempts >= 1")

    def _watch(self) -> None:
        """Raise HandlerTimeout in pool calls past execution_timeout (checked as often as the SIGALRM
        tick)."""
        tick = max(0.01, min(0.25, self.handler.timeout_s / 4))
        while not self._closed:
            time.sleep(tick)
            now = time.monotonic()
            for lane in self.lanes:
                lane.interrupt(now, HandlerTimeout, TIMEOUT_REPEAT_S)


def attach(
    concurrency: int,
    handler: MutationHandler,
    reader: SourceReader,
    effects: SetAsideEffects,
    *,
    language: str,
) -> ConcurrentCalls | None:
    """A pool for a worker whose function runs several calls at once (`concurrency` > 1), else None
    (nothing changes)."""
    if concurrency <= 1:
        return None
    assert all(isinstance(b.buf, ConcurrentEffectBuffer) for b in handler.rw_bindings)
    return ConcurrentCalls(concurrency, handler, reader, effects, language=language)
