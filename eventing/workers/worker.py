"""One worker of one function: owns vBuckets, streams their mutations from the source in seqno order,
calls the handler, flushes binding effects and commits checkpoints.

`WorkerCore` is a plain class so tests can drive it in-process; `eventing.workers.executor` wraps it in a Ray
actor. It is the facade that the executor, the hosts, the sandbox and the service call, and it builds its
parts, each in a module of its own and given what it works with: what they share and the checkpoint takes
(`WorkerProgress`, eventing.workers.progress), handling the rows read (`MutationHandler`,
eventing.workers.handling), reading the source (`SourceReader`, eventing.workers.source_reads) and firing
timers (`TimerFiring`, eventing.workers.timer_firing), with a pool of calls or on_batch where the function
has them (eventing.workers.concurrent_calls, batch_calls) and collaborators that interrupt or recycle a
handler that overruns execution_timeout (eventing.workers.hang_guard) or that ends the process
(eventing.workers.crash_guard). This module holds what a worker is given and reports (`WorkerSpec`,
`StepReport`), and the core itself: ownership of vBuckets, the step, flushing effects and checkpoints.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from eventing.core import counters as counter_names
from eventing.core import filters
from eventing.core.definition import FunctionDefinition
from eventing.errors import FencedError, StoreError
from eventing.execution.bindings import BucketBinding, learn_partition_marks
from eventing.execution.runner import HandlerRunner
from eventing.storage.origins import deployment_origin
from eventing.storage.remote import DataAccess, DataServiceRef
from eventing.storage.values import EffectGroup
from eventing.windows.runtime.row_writer import WindowRowWriter
from eventing.workers import batch_calls, concurrent_calls
from eventing.workers.collections import SourceCollections
from eventing.workers.crash_guard import CrashGuard, open_notes_file
from eventing.workers.handling import MutationHandler
from eventing.workers.handover import count_applied
from eventing.workers.hang_guard import HangGuard
from eventing.workers.looks import SourceLooks
from eventing.workers.progress import WorkerProgress
from eventing.workers.source_reads import SourceReader
from eventing.workers.timer_firing import TimerFiring
from eventing.workers.write_waiter import WriteWaiter, open_waiter

if TYPE_CHECKING:
    from eventing.storage.postgres.wake_wait import PostgresWriteWaiter
from metadata import TIMER_VB_BASE, DlqRow, TimerDone, owner_vb
from metadata.model import FunctionRecord


@dataclass(frozen=True)
class WorkerSpec:
    location: str  # the state's (eventing.storage.state); opened directly where this worker reaches it
    function: str
    generation: int  # the deployment this worker serves; a redeploy makes it stale
    worker_id: str  # "node/wN", recorded as the owner of its vBuckets
    vbuckets: tuple[int, ...]
    targets: tuple[int, ...] | None = None  # stop at these seqnos (index = vBucket): --until-caught-up
    # The data service serving a data directory on a Ray cluster (None: embedded, in-process, or a state on a
    # server, which every worker reaches directly).
    data_service: DataServiceRef | None = None
    # "sandbox": the core runs in a Landlocked process of its own (eventing.workers.sandbox); "none": here.
    isolation: str = "none"
    # A caught-up worker waits for its next write in its step, woken through this socket (an abstract UNIX
    # name, eventing.workers.write_waiter); None: it is asked again by the service instead.
    wake_address: str | None = None
    # Machines running the function's workers: each takes this share of its URL bindings' rate_limit and
    # max_in_flight (eventing.execution.limits).
    machines: int = 1

    def data_access(self) -> DataAccess:
        return DataAccess(self.location, self.data_service, key=self.worker_id)


class Checkpoint(NamedTuple):
    """What one checkpoint writes (WorkerCore._take_commit): moved positions, dead letters, counters,
    timer changes and fired timers."""

    moved: dict[int, int]
    dlq: list[DlqRow]
    counters: dict[str, int]
    changes: list
    done: list[TimerDone]


@dataclass
class StepReport:
    worker_id: str
    handled: int = 0  # mutations whose position advanced in this step
    caught_up: bool = False  # every owned vBucket reached its target (or the high seqno)
    backlog: int = 0  # mutations known to be waiting in owned vBuckets after this step
    fenced: list[int] = field(default_factory=list)  # vBuckets lost to a newer owner
    owned: int = 0
    timers_fired: int = 0  # timer callbacks run in this step (not mutations: `handled` leaves them out)
    first_handled_at: float = (
        0.0  # epoch s: when the worker's first handled batch began (its first step with any)
    )
    waited: bool = False  # the step waited for a write (idle_wait_s): the next one may be sent at once


# A supervisor's step keeps taking batches this long while the worker is behind: ~10 round trips a
# second instead of one per batch_size mutations, each of which costs the worker and the driver CPU.
STEP_SLICE_S = 0.1
EFFECT_FLUSH_MIN = 8000  # binding writes buffered before a flush within a step (every step ends with one)
# A window-only function's batch at least (no handler runs; each read still takes at most batch_size
# entries): each batch costs a pass over the vBuckets with work (~1 ms), and a batch of batch_size would
# cut a vBucket's run into several reads.
WINDOW_ONLY_BATCH = 20_000


class WorkerCore:
    """Processes its vBuckets strictly in seqno order; every write it makes is fenced by its epochs."""

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        recycle_on_hang: bool = False,
        notes_fd: int | None = None,
        record: FunctionRecord | None = None,  # the function's, read already by the caller
    ):
        self.spec = spec
        self.name = spec.function
        self.origin = deployment_origin(spec.function, spec.generation)  # of its writes: the recursion guard
        self.data = spec.data_access()
        self.store = self.data.metadata()
        record = record or self.store.get_function(spec.function)
        if record.generation != spec.generation:
            raise FencedError(
                f"function '{spec.function}' was redeployed (generation {record.generation}, "
                f"worker for {spec.generation}); this worker stops"
            )
        self.defn = defn = FunctionDefinition.from_dict(record.definition)
        self.source = self.data.bucket(defn.source_bucket)
        # A source behind the data service reads ahead in calls of many batches (SourceReader.prefetch); one
        # on a server reached directly (a PostgreSQL store) looks at the high seqnos and next rows of the
        # owned vBuckets in one round trip at each pass of a step (_look).
        self._reads_ahead = self.source.reads_ahead and not self.data.local
        self._looks_ahead = self.source.reads_ahead and self.data.local
        # The state's application log; without the data directory, log() lines reach it through the data
        # service.
        self.app_log = self.data.app_log_writer(spec.function, defn.app_log_max_size, defn.app_log_max_files)
        self.runner = runner = HandlerRunner(
            self.name,
            defn,
            record.source,
            self.source,
            self.data.bucket,
            self.app_log,
            limit_share=1 / max(1, spec.machines),
        )
        # The function's filter (eventing.core.filters): rows it does not match are dropped before any
        # handler path (MutationHandler.drop_filtered), or, with previous_version (whose versions follow the
        # log order), one by one in MutationHandler.handle. A file source also skips them in its query when
        # their bytes tell (read_vb_matching): those rows never become Python objects.
        flt = filters.compile_filter(defn.filter) if defn.filter is not None else None
        drops = flt is not None and runner.previous is None
        prefilter = (flt.prefilter if drops and flt is not None and not self._reads_ahead else None) or None
        # Rows are read ahead only for the path that reads them (not a filtered read's or a window's).
        self._looks_ahead = self._looks_ahead and prefilter is None
        self.rw_bindings = runner.rw_bindings
        # at_least_once: no effect marks are read, fenced or written (see LocalBucket.apply_effects).
        self.marked = defn.delivery == "exactly_once"
        self._fenced_aside: set[int] = set()  # what a flush of set-aside writes fenced (flush_set_aside)
        self._deferred: Checkpoint | None = None  # a checkpoint defer_end took, written after its writes
        self.handover: Any = None  # a sandboxed core's writes applied beside its next batch (handover.py)
        # Positions, checkpoints, epochs, counters, dead letters, letters and fired timers: what the parts
        # share and the checkpoint takes (eventing.workers.progress).
        self.progress = progress = WorkerProgress(self.name, spec.generation, self.source.name)
        self.targets = spec.targets
        self.window_rows = WindowRowWriter.for_worker(  # rows of a windowed function, else None
            self.data.state if self.data.local else spec.location,
            spec.function,
            spec.generation,
            spec.worker_id,
            defn.window,
            progress.counters,
            put_file=None if self.data.local else self.data.put_file,
        )
        self.last_commit = time.monotonic()
        window_only = runner.on_update is None and self.window_rows is not None and flt is None
        if window_only:
            self._looks_ahead = False  # a window-only function reads packed runs (take_window_batch)
        self._batch = max(defn.batch_size, WINDOW_ONLY_BATCH) if window_only else defn.batch_size
        self._handled_any = False
        self._closed = False
        self.timers = runner.timers
        self.timers.lookup = lambda callback, reference: self.store.get_timer(self.name, callback, reference)
        self.hang_guard = HangGuard(runner.context, runner.timeout_s)
        # What the handler runs is noted in a file (its sandboxed host opens it: `notes_fd`), so that a death
        # is counted against its mutation and a mutation that keeps ending the process is dead-lettered.
        if notes_fd is None:
            notes_fd = open_notes_file(
                spec.location,
                spec.function,
                spec.worker_id,
                self.data.state.directory if self.data.local else None,
            )
        pool = defn.concurrency if defn.concurrency > 1 else 0
        batch_slots = batch_calls.NOTE_SLOTS if runner.on_batch is not None else 0
        self.crash_guard = CrashGuard(
            self.store, self.name, spec.generation, notes_fd, 1 + pool + batch_slots
        )
        # The parts, each with what it works with: the handler of the rows read, the reader of the source
        # (which hands its runs of rows to the handler) and the firing of timers (whose callbacks run as the
        # handler's calls do).
        self.handler = handler = MutationHandler(
            progress,
            runner,
            origin=self.origin,
            filter=flt,
            window_rows=self.window_rows,
            max_bytes=defn.max_document_bytes,
            crash_guard=self.crash_guard,
        )
        self.reader = reader = SourceReader(
            progress,
            self.source,
            SourceCollections(self.source, defn.source_keyspace),
            handler,
            self.crash_guard,
            reads_ahead=self._reads_ahead,
            prefilter=prefilter,
        )
        reader.window_read = defn.batch_size
        self.looks = SourceLooks(self.source, progress, reader, self.targets)
        self.timer_firing = TimerFiring(
            progress,
            self.store,
            runner,
            handler,
            self.hang_guard,
            self.crash_guard,
            batch_size=defn.batch_size,
            # A claim of timers through the data service, on a server's store or from a sandbox is a round
            # trip: one that found none is not made again for a while (timer_firing.TIMER_CLAIM_IDLE_S).
            claims_travel=not self.data.local or self.data.state.directory is None,
        )
        # concurrency > 1: a pool runs the batch's calls, several documents at once (else None: one at a
        # time), writing what earlier batches left (this core's writes set aside) while they run.
        self.calls = concurrent_calls.attach(defn.concurrency, handler, reader, self, language=defn.language)
        if self.calls is not None:
            self.hang_guard.lanes = self.calls.lanes  # its recycling sees the pool's calls too
        # on_batch: the batch's rows go to the handler in one call (else None: one call a mutation).
        self.batches = batch_calls.attach(handler, reader)
        # How a batch is handled, chosen once here and shared by one read loop (SourceReader.process): each
        # run of rows read (the reader's `read_rows`: plain row tuples, no Mutation built per row by Python)
        # goes to the handler's `take_run`, and the batch runs in `_dispatch`. One call a mutation on this
        # thread (MutationHandler.handle_serial, the read loop itself), a pool's calls (the pool runs what the
        # loop sorted into tasks, reading the next batch's rows meanwhile), or on_batch (runs of a file
        # source read in bulk, the handler called once the batch is read). A suspect of the crash guard is
        # handled alone, after the pool's calls or as a batch of its own (the reader's `calls`, `batches`).
        reader.calls, reader.batches = self.calls, self.batches
        self._dispatch: Callable[[list[int], dict[int, int], int], int]
        if self.batches is not None:
            handler.take_run, self._dispatch = self.batches.take_run, self.batches.process
            if self.batches.reads_packed:
                reader.take_packed = self.batches.take_packed
        elif self.calls is not None:
            handler.take_run, self._dispatch = self.calls.take_run, self.calls.process
            if self.calls.reads_ahead:
                reader.read_rows = self.calls.read_rows
        else:
            self._dispatch = reader.process
        self.waiter = self._open_waiter() if spec.wake_address and self.data.local else None
        self.assign_vbuckets(spec.vbuckets)
        if recycle_on_hang:
            self.hang_guard.recycle_on_hang(
                self.name, spec.generation, progress.epochs, lambda: self.spec.data_access().metadata()
            )

    # What the parts share, read-only, for those who look at the worker from outside (tests, tools).
    @property
    def positions(self) -> dict[int, int]:
        return self.progress.positions

    @property
    def epochs(self) -> dict[int, int]:
        return self.progress.epochs

    @property
    def counters(self) -> Counter[str]:
        return self.progress.counters

    def _open_waiter(self) -> WriteWaiter | PostgresWriteWaiter | None:
        """The waiter of a caught-up step (eventing.workers.write_waiter.open_waiter)."""
        assert self.spec.wake_address is not None
        return open_waiter(
            self.data.state, self.spec.wake_address, self.defn.source_bucket, self.progress.epochs
        )

    # -- ownership ----------------------------------------------------------------------------------

    def assign_vbuckets(self, vbuckets) -> None:
        """Claim vBuckets with a higher epoch and resume each right after its checkpoint."""
        vbs = list(vbuckets)
        if not vbs:
            return
        if self.handover is not None:
            self.flush_effects()  # the marks read below are after the writes in flight
        progress = self.progress
        # A bucket whose effect marks hold a higher epoch than the store (the store was restored from a
        # backup) would reject every effect of this claim as a zombie's: claim above its marks instead.
        # Normally the marks trail the store's epochs and this changes nothing.
        wanted = set(vbs)
        floor: dict[int, int] = {}
        for bucket in {id(b.bucket): b.bucket for b in self.rw_bindings if self.marked}.values():
            for mark_vb, (mark_epoch, _) in bucket.effect_marks(self.name).items():
                vb = owner_vb(mark_vb)  # timer effects are marked beside their vBucket
                if vb in wanted and mark_epoch >= floor.get(vb, 0):
                    floor[vb] = mark_epoch + 1
        claimed = self.store.claim(self.name, vbs, self.spec.worker_id, min_epochs=floor)
        for vb, cp in claimed.items():
            if cp.bucket_uuid != self.source.uuid:
                raise StoreError(
                    f"source bucket '{self.defn.source_bucket}' was recreated after function '{self.name}' "
                    "was deployed, so its checkpoints do not apply; undeploy and deploy the function again"
                )
            progress.positions[vb] = progress.committed[vb] = cp.seqno
            progress.epochs[vb] = cp.epoch
        # Raise the effect fences first, so a zombie's binding writes are rejected from now on (timer
        # callbacks' writes are marked under TIMER_VB_BASE + vb, with the same epoch).
        epochs = {vb: progress.epochs[vb] for vb in vbs}
        epochs.update({TIMER_VB_BASE + vb: progress.epochs[vb] for vb in vbs})
        for bucket in {id(b.bucket): b.bucket for b in self.rw_bindings if self.marked}.values():
            bucket.fence(self.name, epochs)
        # Then learn how far each bucket already holds this function's effects (see BucketBinding.keep).
        for binding in self.rw_bindings if self.marked else ():
            marks = binding.bucket.effect_marks(self.name)
            for vb in epochs:
                binding.applied_upto[vb] = marks.get(vb, (0, 0))[1]
            learn_partition_marks(binding.buf, binding.bucket, self.name, epochs)
        self.timer_firing.reclaim.update(vbs)
        self.looks.changed()
        # Mutations ahead of the checkpoint that this deployment already dead-lettered are not handled again
        # by the stream: one a previous process of this worker hung on (and was recycled for) would hang
        # again, and after a rewind a letter belongs to `dlq replay`, whose effects are marked per letter
        # (replayed: its effects are applied; pending: replay applies them), never to the stream's per
        # vBucket marks, so either way handling it again could apply its effects twice or not at all.
        # Letters of earlier deployments do not count: a fresh deployment handles every mutation of its
        # boundary, whatever an older handler did (the deploy resolved those letters).
        for row in self.store.find_dlq_rows(
            self.name, include_replayed=True, generation=self.spec.generation
        ):
            if row.reason == "late":
                continue
            hung = row.reason == "timeout" and row.replayed_at is None
            if row.vb in wanted and row.seqno > progress.committed[row.vb]:
                progress.lettered[(row.vb, row.seqno)] = (
                    counter_names.HUNG_SKIPPED if hung else counter_names.DEAD_LETTERED_SKIPPED
                )
            elif hung and row.vb >= TIMER_VB_BASE and owner_vb(row.vb) in wanted:
                # a timer whose callback hung: recorded as done instead
                progress.lettered[(row.vb, row.seqno)] = counter_names.HUNG_SKIPPED
        # Mutations a worker of this deployment died on: dead-lettered when they come, or handled alone.
        self.crash_guard.claimed(vbs, progress.committed, progress.lettered)

    def revoke_vbuckets(self, vbuckets) -> dict[int, int]:
        """Finish, flush, checkpoint and release vBuckets; returns their final checkpoints."""
        self.commit()
        epochs = self.progress.epochs
        vbs = [vb for vb in vbuckets if vb in epochs]  # after the commit: it forgets fenced vBuckets
        self.store.release(self.name, {vb: epochs[vb] for vb in vbs})
        out = {vb: self.progress.committed[vb] for vb in vbs}
        for vb in vbs:
            self._forget(vb)
        return out

    def stop(self) -> dict[int, int]:
        return self.revoke_vbuckets(list(self.progress.epochs))

    def _forget(self, vb: int) -> None:
        self.looks.changed()
        progress = self.progress
        progress.positions.pop(vb, None)
        progress.committed.pop(vb, None)
        progress.epochs.pop(vb, None)

    def owned(self) -> list[int]:
        return sorted(self.progress.epochs)

    # -- processing ---------------------------------------------------------------------------------

    def step(self, budget: int | None = None, idle_wait_s: float = 0.0) -> StepReport:
        """Handle mutations across owned vBuckets in batches of `budget` (default batch_size), flushing
        effects after each batch, and checkpoint if due. An explicit budget is exactly one batch; the
        supervisor's call (no budget) keeps taking batches for STEP_SLICE_S while a backlog is left, so a
        worker that is behind pays one round trip per slice instead of one per batch. With `idle_wait_s`
        and a waiter (eventing.workers.write_waiter), a step that finds nothing to do waits up to that long
        (from its start) for writes to its vBuckets and handles each at once."""
        slice_ends = time.monotonic() + (STEP_SLICE_S if budget is None else 0.0)
        budget = budget or self._batch
        targets = self.targets
        handled = 0
        fenced: set[int] = set()
        # Through the data service, the high seqnos are asked at most once a step (those read along with
        # the last read ahead when there are: no round trip of their own while the worker is behind).
        remote = self._reads_ahead
        highs = self.reader.remote_highs() if remote else []
        first_at = 0.0 if self._handled_any else time.time()
        progress = self.progress
        positions, epochs = progress.positions, progress.epochs
        waiter = self.waiter if idle_wait_s > 0 and not remote else None
        waited = False
        behind_on: list[int] | None = None
        # A caught-up worker whose looks are round trips (a server's bucket) looks again, once it has handled
        # all a look found, only at the vBuckets announced as written since, here and in its next steps
        # (eventing.workers.looks).
        announcing = waiter if self._looks_ahead and self.calls is None else None
        looks = self.looks
        seen = looks.resume()
        quiet = False  # the last pass handled all its look found
        if announcing is not None and seen is not None:
            highs, quiet = seen, True
        elif waiter is not None:
            waiter.drain()  # every write notified so far is seen by the first look below
            waiter.take_woken()
        if waiter is not None:
            wait_ends = time.monotonic() + idle_wait_s
        while True:
            if quiet and announcing is not None:
                highs = looks.look_announced(budget, highs, announcing)
            elif self._looks_ahead:
                highs = looks.look(budget)
            elif not remote:
                highs = looks.high_seqnos()
            # Limits only where there is work: a caught-up worker woken for one write does one pass over its
            # vBuckets, not three (this step runs once per write when writes are sparse).
            # While its batches are full, a worker that is behind looks only at the vBuckets of its last pass
            # (a pass over all 1,024 cost ~10% of a batch handler's time); a batch that was not full, or a
            # new step, looks at them all again.
            candidates = epochs if behind_on is None else [vb for vb in behind_on if vb in epochs]
            if targets:
                work = [vb for vb in candidates if positions[vb] < highs[vb] and positions[vb] < targets[vb]]
                limits = {vb: min(highs[vb], targets[vb]) for vb in work}
            else:
                work = [vb for vb in candidates if positions[vb] < highs[vb]]
                limits = {vb: highs[vb] for vb in work}
            quiet = not work
            if not work and waiter is not None:
                left = wait_ends - time.monotonic()
                if left > 0:
                    # What this step handled is committed before it waits again: an effect never waits for
                    # the next write. The step goes on handling writes as they come until its wait is over,
                    # one Ray call per wait rather than one per write.
                    if self._pending_effects() or self._deferred is not None:
                        fenced |= self.flush_effects()
                    if not fenced:
                        waited = True
                        if waiter.wait(left):
                            continue  # a write to an owned vBucket (or a stale notification): look again
            batch = 0
            if work:
                armed = self.hang_guard.arm()
                started = time.perf_counter()
                try:
                    batch = self._dispatch(work, limits, budget)
                finally:
                    if armed:
                        self.hang_guard.disarm()
                if batch:
                    self._observe_latency(time.perf_counter() - started, batch)
            quiet = batch < budget
            if self._fenced_aside:  # found by a pool's writes beside its calls
                fenced |= self.forget_fenced_aside()
            # Effects go to their buckets in transactions of at least EFFECT_FLUSH_MIN writes (and at the end
            # of the step): each transaction rewrites the B-tree pages it touches, so fewer, larger ones
            # cost less per write. Reads see pending writes meanwhile (the bindings' overlay).
            # A waiting worker that has caught up with what it saw commits those effects before it looks
            # again: while writes keep coming, each look finds a few more, and the effects of the first
            # would otherwise wait for all of them.
            pending = self._pending_effects(set_aside=False)
            if pending >= EFFECT_FLUSH_MIN or (pending and waiter is not None and batch < budget):
                fenced |= self.flush_effects() if self.handover is None else self._hand_over()
            handled += batch
            behind_on = work if batch >= budget else None
            if fenced or time.monotonic() >= slice_ends:
                break
            if batch < budget and (waiter is None or not batch or time.monotonic() >= wait_ends):
                break
        if quiet and announcing is not None and not fenced:
            looks.keep(highs)
        # A pool of calls still behind (its last batch was full) leaves the step's flush and checkpoint to its
        # next batch, which writes them while its calls run (defer_end); otherwise they happen here.
        behind = self.calls is not None and batch >= budget and not fenced
        handing = self.handover is not None and batch >= budget and not fenced  # applied beside the next
        if handing:
            fenced |= self._hand_over()
        elif self.handover is not None and not fenced:  # sent as the step ends, applied before it answers
            fenced |= self._hand_over(at_step_end=True)
        elif not behind:
            fenced |= self.flush_effects()
        fired = self.timer_firing.fire_timers() if epochs else 0
        if fired:
            behind = False
            fenced |= self.flush_effects()
        # Every owned vBucket outside `limits` had no work at its last pass, and positions never go back.
        backlog = sum(max(0, limit - positions[vb]) for vb, limit in limits.items() if vb in epochs)
        # Caught up includes timers already due: a full batch of firings may leave more, and a timer created
        # for the past can be claimed only once its create is durable, so a caught-up worker commits now
        # (creates and firings) instead of at the checkpoint interval.
        creates_due = not backlog and self.timer_firing.creates_due()
        commit_due = bool(creates_due or (not backlog and progress.timers_done)) or (
            time.monotonic() - self.last_commit >= self.defn.checkpoint_interval.total_seconds()
        )
        if behind and backlog and not creates_due:
            self.defer_end(commit_due)
        elif commit_due:
            fenced |= self.commit()
        elif behind or (handing and not backlog):  # caught up: its writes are durable when it says so
            fenced |= self.flush_effects()
        if remote and handled and not backlog and not fenced:
            # Caught up with what it read: the next step's rows are read while this one's report travels.
            self.reader.read_changed(for_next_step=True)
        timers_due = creates_due or fired >= self.defn.batch_size
        if handled and not self._handled_any:
            self._handled_any = True
        else:
            first_at = 0.0
        return StepReport(
            self.spec.worker_id,
            handled=handled,
            caught_up=backlog == 0 and not timers_due,
            backlog=backlog,
            fenced=sorted(fenced),
            owned=len(epochs),
            timers_fired=fired,
            first_handled_at=first_at,
            waited=waited,
        )

    def fire_timers(self) -> int:
        """Claim and fire the due timers of owned vBuckets (TimerFiring.fire_timers)."""
        return self.timer_firing.fire_timers()

    def _pending_effects(self, set_aside: bool = True) -> int:
        return sum(b.pending(set_aside) for b in self.rw_bindings) if self.rw_bindings else 0

    def _observe_latency(self, seconds: float, count: int) -> None:
        """One histogram observation per batch, weighted by its size (see counters.LATENCY_BOUNDS_US)."""
        c = self.progress.counters
        c[counter_names.latency_bucket(seconds * 1e6 / count)] += count
        c[counter_names.LATENCY_COUNT] += count
        c[counter_names.LATENCY_SUM_US] += round(seconds * 1e6)

    # -- durability ---------------------------------------------------------------------------------

    def flush_effects(self) -> set[int]:
        """Apply buffered binding writes to their buckets (deduplicated by source seqno, fenced by epoch)."""
        try:
            if self.handover is not None:
                self.handover.settle()  # the writes handed over first
            # Writes set aside first, with the checkpoint a step left (a pool's: defer_end), then the rest.
            self.flush_set_aside()
            for binding in self.rw_bindings:
                if binding.pending():
                    self._fenced_aside |= self._apply(binding, binding.take_groups())
            self._collect_op_counts()
        except Exception:
            self.rewind()
            raise
        return self.forget_fenced_aside()

    def _collect_op_counts(self) -> None:
        """Counts the bindings and curl keep beside the worker's counters (taken while no call runs)."""
        counters = self.progress.counters
        for binding in self.rw_bindings:
            # Replayed writes dropped before the batch (BucketBinding.keep) count even when nothing is
            # pending.
            if binding.replayed_writes:
                counters[counter_names.EFFECTS_DUPLICATE] += binding.replayed_writes
                binding.replayed_writes = 0
        for binding in self.runner.bindings:
            if binding.buf.ops:
                counters.update(binding.buf.ops)
                binding.buf.ops.clear()
        if self.runner.curl.ops:
            counters.update(self.runner.curl.ops)
            self.runner.curl.ops.clear()

    # -- a pool's flushes and checkpoints beside its calls ---------------------------------------------
    #
    # With concurrency > 1 (eventing.workers.concurrent_calls) the pool would wait for every flush and
    # checkpoint, a tenth of its time with an I/O-bound handler. So kept writes are set aside (reads still
    # see them) and applied by the next batch while its calls run, and a step that ends behind leaves its
    # checkpoint, taken as it stands, to be written once those writes are durable. Nothing is checkpointed
    # before its effects, as in commit(); a crash in between replays from the last checkpoint as before.

    def set_aside_effects(self, minimum: int | None = None) -> None:
        """After a batch of the pool: once `minimum` (EFFECT_FLUSH_MIN) kept writes wait, set them aside for
        flush_set_aside."""
        if self._pending_effects(set_aside=False) >= max(1, EFFECT_FLUSH_MIN if minimum is None else minimum):
            for binding in self.rw_bindings:
                binding.set_aside()

    def defer_end(self, commit_due: bool) -> None:
        """The end of a step whose pool is behind: every kept write is set aside, and when a checkpoint is
        due, what commit() would write now is taken as it stands (positions, dead letters, counters, timer
        changes) for flush_set_aside to write after the writes. Window rows and log lines are written now:
        they go before a checkpoint and their readers drop replays."""
        self.set_aside_effects(minimum=1)
        if not commit_due or self._deferred is not None:
            return
        if self.window_rows is not None:
            self.window_rows.flush()
        if self.app_log is not None:
            self.app_log.flush()
        self._collect_op_counts()
        self._deferred = self._take_commit()
        self._forget_taken()

    def flush_set_aside(self) -> None:
        """Apply the writes set aside, then write the checkpoint defer_end left; the pool calls it while its
        calls run (on failure it rewinds once they are done). What applying the writes finds (cas
        conflicts as dead letters, effect counts) belongs to the mutations those writes came from, so it
        goes into that checkpoint, or, without one, to the worker's next. Fenced vBuckets are forgotten
        when no call runs (forget_fenced_aside, flush_effects)."""
        progress = self.progress  # its dead letters and counters are swapped: every part sees the swap
        live_dlq, live_counters = progress.dlq, progress.counters
        progress.dlq, progress.counters = [], Counter()
        try:
            for binding in self.rw_bindings:
                groups = binding.take_set_aside()
                if groups:
                    try:
                        self._fenced_aside |= self._apply(binding, groups)
                    finally:
                        binding.flushed()  # a read waiting on these writes goes on (after a failure: rewound)
        finally:
            found_dlq, found_counters = progress.dlq, progress.counters
            progress.dlq, progress.counters = live_dlq, live_counters
        if self._deferred is not None:
            self._deferred.dlq.extend(found_dlq)
            for name, n in found_counters.items():
                self._deferred.counters[name] = self._deferred.counters.get(name, 0) + n
        else:
            progress.dlq.extend(found_dlq)
            progress.counters.update(found_counters)
        self._fenced_aside |= self._commit_deferred()

    def forget_fenced_aside(self) -> set[int]:
        """The vBuckets writes found fenced, forgotten now that no call runs (after a flush, and after a
        pool's batch whose writes beside the calls found some): the owner vBuckets, for the step's report."""
        fenced, self._fenced_aside = self._fenced_aside, set()
        owners = {owner_vb(v) for v in fenced}
        for vb in owners:
            self._forget(vb)
        return owners

    def _commit_deferred(self) -> set[int]:
        """Write the checkpoint defer_end took, once every write it covers is durable."""
        if self._deferred is None:
            return set()
        taken, self._deferred = self._deferred, None
        return self._write_commit(taken)

    def _apply(self, binding: BucketBinding, groups: list[EffectGroup]) -> set[int]:
        result = binding.bucket.apply_effects(self.name, groups, origin=self.origin, marks=self.marked)
        return count_applied(self.progress, self.source, binding.bucket.name, result)

    def _hand_over(self, at_step_end: bool = False) -> set[int]:
        self.handover.hand_over(at_step_end=at_step_end)
        return self.forget_fenced_aside()

    def rewind(self) -> None:
        """A flush failed (disk full, a damaged bucket): the writes it took are gone from memory. Forget
        everything since the last checkpoint (positions, buffered writes, DLQ rows, counters) so that no
        later commit, not even the one at stop, checkpoints past effects that never became durable. The
        mutations are handled again; effects that did apply are skipped by the buckets' marks."""
        for binding in self.rw_bindings:
            binding.take_groups()
            binding.discard()
            binding.replayed_writes = 0
        progress, epochs = self.progress, self.progress.epochs
        progress.dlq = []
        progress.counters.clear()
        self._deferred = None  # a checkpoint defer_end took: its writes are the ones lost
        progress.positions.update(progress.committed)
        self.looks.changed()
        if self.runner.previous is not None:
            self.runner.previous.clear()  # the replay reads versions again from the log
        # Timer changes are made again by the replayed calls; fired timers are claimed again (same fire_seq).
        self.timers.discard()
        self.timers.committed(len(self.timers.kept))
        progress.timers_done = []
        self.timer_firing.reclaim.update(epochs)
        for binding in self.rw_bindings if self.marked else ():
            marks = binding.bucket.effect_marks(self.name)
            for vb in epochs:
                binding.applied_upto[vb] = marks.get(vb, (0, 0))[1]
                binding.applied_upto[TIMER_VB_BASE + vb] = marks.get(TIMER_VB_BASE + vb, (0, 0))[1]
            learn_partition_marks(
                binding.buf,
                binding.bucket,
                self.name,
                [*epochs, *(TIMER_VB_BASE + vb for vb in epochs)],
            )

    def commit(self) -> set[int]:
        """The one place checkpoints are written. Order matters:

        1. flush binding effects: a checkpoint must never cover an effect that is not durable;
        2. in one metadata transaction, conditional on this worker's epochs: DLQ rows, timer creates and
           cancels (fenced by the vBucket that made them), fired timers (by theirs), counters, then
           checkpoints. A zombie (older epoch) has all of them rejected. A crash between 1 and 2 replays
           the mutations after the old checkpoint and fires the claimed timers again with their old
           fire_seq; their effects are skipped by the bucket's marks, their DLQ rows by the (function,
           vBucket, seqno) key and their timer creates overwrite themselves, so nothing applies twice.
        Window rows are written first, as one batch file: the coordinator drops replayed rows by (vb, seqno).
        """
        if self.window_rows is not None:
            self.window_rows.flush()
        if self.app_log is not None:
            self.app_log.flush()  # a remote worker's log lines are on disk by its checkpoint
        fenced = self.flush_effects()
        fenced |= self._write_commit(self._take_commit())
        self._forget_taken()
        for vb in fenced:
            self._forget(vb)
        return fenced

    def _take_commit(self) -> Checkpoint:
        """What a checkpoint writes now: moved positions, dead letters, counters, timer changes and
        firings."""
        progress = self.progress
        moved = {vb: s for vb, s in progress.positions.items() if s != progress.committed.get(vb)}
        dlq, counters = progress.dlq, dict(progress.counters)
        changes, done = list(self.timers.kept), progress.timers_done
        if changes:
            created = sum(1 for ch in changes if ch.due_ms is not None)
            counters[counter_names.TIMERS_CREATED] = counters.get(counter_names.TIMERS_CREATED, 0) + created
            counters[counter_names.TIMERS_CANCELLED] = (
                counters.get(counter_names.TIMERS_CANCELLED, 0) + len(changes) - created
            )
        return Checkpoint(moved, dlq, counters, changes, done)

    def _forget_taken(self) -> None:
        """The worker collects the next checkpoint's dead letters, counters and firings (timer changes leave
        when written, in _write_commit)."""
        progress = self.progress
        progress.dlq = []
        progress.counters.clear()
        progress.timers_done = []

    def _write_commit(self, taken: Checkpoint) -> set[int]:
        fenced: set[int] = set()
        epochs, committed = self.progress.epochs, self.progress.committed
        moved = {vb: seqno for vb, seqno in taken.moved.items() if vb in epochs}  # none forgotten meanwhile
        if moved or taken.dlq or taken.counters or taken.done:
            fenced = self.store.commit(
                self.name, epochs, moved, taken.dlq, taken.counters, taken.changes, taken.done
            )
            self.timers.committed(len(taken.changes))
            if taken.changes:
                self.timer_firing.claim_after = 0.0  # a timer this worker created may be due: look at once
            for vb, seqno in moved.items():
                if vb not in fenced and vb in committed:
                    committed[vb] = seqno
        self.last_commit = time.monotonic()
        return fenced

    def close(self) -> None:
        self._closed = True
        if self.handover is not None:
            self.handover.close()
        self.hang_guard.close()  # ends its thread: a pooled worker process outlives its cores
        if self.calls is not None:
            self.calls.close()  # ends the pool's threads
        if self.waiter is not None:
            self.waiter.close()
        if self.app_log is not None:
            try:
                self.app_log.flush()
            except Exception:  # noqa: BLE001 - a worker being ended; the data service may be gone already
                pass
        self.crash_guard.close()
        self.store.close()
        self.runner.close()
