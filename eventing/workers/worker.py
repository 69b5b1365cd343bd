"""One worker of one function: owns vBuckets, streams their mutations from the source in seqno order,
calls the handler, flushes binding effects and commits checkpoints.

`WorkerCore` is a plain class so tests can drive it in-process; `eventing.workers.executor` wraps it in a Ray actor.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial

import msgpack

from eventing.core import counters as counter_names
from eventing.core import filters
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_TIMER, OP_UPDATE, Mutation, pack_mutation
from eventing.errors import FencedError, OrderViolationError, StoreError
from eventing.execution.app_log import RemoteAppLog
from eventing.execution.runner import (
    NO_HANDLER,
    Failure,
    HandlerCall,
    HandlerRunner,
    HandlerTimeout,
    Rejection,
    new_call,
)
from eventing.execution.timers import delay_counter, timer_mutation
from eventing.handler import Meta
from eventing.storage.remote import DataAccess, DataServiceRef
from eventing.windows.runtime.row_writer import WindowRowWriter
from eventing.workers.collections import COLLECTION_MARK_BYTES, SourceCollections
from metadata import TIMER_VB_BASE, DlqRow, TimerDone, TimerRecord, owner_vb

_as_mutation = tuple.__new__  # a row tuple as a Mutation, built in C (Mutation(*row) is ~0.3 us)
_unpack = partial(msgpack.unpackb, raw=False)
HANG_GRACE_S = 2.0  # past execution_timeout, how long a handler SIGALRM could not stop may still run



@dataclass(frozen=True)
class WorkerSpec:
    data_dir: str  # opened directly only by a worker that sees it on the data service's node (locality)
    function: str
    generation: int  # the deployment this worker serves; a redeploy makes it stale
    worker_id: str  # "node/wN", recorded as the owner of its vBuckets
    vbuckets: tuple[int, ...]
    targets: tuple[int, ...] | None = None  # stop at these seqnos (index = vBucket): --until-caught-up
    # The data service serving data_dir on a Ray cluster (None: embedded or in-process, files only).
    data_service: DataServiceRef | None = None
    # "sandbox": the core runs in a Landlocked process of its own (eventing.workers.sandbox); "none": here.
    isolation: str = "none"

    def data_access(self) -> DataAccess:
        return DataAccess(self.data_dir, self.data_service, key=self.worker_id)


@dataclass
class StepReport:
    worker_id: str
    handled: int = 0  # mutations whose position advanced in this step
    caught_up: bool = False  # every owned vBucket reached its target (or the high seqno)
    backlog: int = 0  # mutations known to be waiting in owned vBuckets after this step
    fenced: list[int] = field(default_factory=list)  # vBuckets lost to a newer owner
    owned: int = 0
    timers_fired: int = 0  # timer callbacks run in this step (not mutations: `handled` leaves them out)
    first_handled_at: float = 0.0  # epoch s: when the worker's first handled batch began (its first step with any)


# A supervisor's step keeps taking batches this long while the worker is behind: ~10 round trips a
# second instead of one per batch_size mutations, each of which costs the worker and the driver CPU.
STEP_SLICE_S = 0.1
# A worker reading through the data service reads this many mutations ahead in one call, and keeps one
# such call in flight while fewer than this many are read ahead: a call across Ray nodes costs milliseconds
# of CPU whatever its size, so fewer, larger calls read faster (figures in docs/benchmarks.md, "Remote read
# ahead"). EVENTING_REMOTE_READ_AHEAD overrides it (forwarded to every node).
REMOTE_READ_AHEAD = int(os.environ.get("EVENTING_REMOTE_READ_AHEAD", "32000"))
EFFECT_FLUSH_MIN = 8000  # binding writes buffered before a flush within a step (every step ends with one)


class WorkerCore:
    """Processes its vBuckets strictly in seqno order; every write it makes is fenced by its epochs."""

    def __init__(self, spec: WorkerSpec, *, recycle_on_hang: bool = False):
        self.spec = spec
        self.name = spec.function
        self.data = spec.data_access()
        self.store = self.data.metadata()
        record = self.store.get_function(spec.function)
        if record.generation != spec.generation:
            raise FencedError(
                f"function '{spec.function}' was redeployed (generation {record.generation}, "
                f"worker for {spec.generation}); this worker stops"
            )
        self.defn = FunctionDefinition.from_dict(record.definition)
        self.source = self.data.bucket(self.defn.source_bucket)
        self._reads_ahead = self.source.reads_ahead  # a source behind the data service
        # Plain row tuples: no Mutation built per row by Python.
        self._read_rows = self.source.read_vb_rows
        # Without the data directory, log() lines reach its application log through the data service.
        self.app_log = None if self.data.local else RemoteAppLog(
            self.data.app_log(spec.function, self.defn.app_log_max_size, self.defn.app_log_max_files)
        )
        self.runner = HandlerRunner(self.name, self.defn, record.source, self.source, self.data.bucket, self.app_log)
        self.collections = SourceCollections(self.source, self.defn.source_keyspace)
        # The function's filter (eventing.core.filters): rows it does not match are dropped before any
        # handler path (_drop_filtered), or, with previous_version (whose versions follow the log order),
        # one by one in _handle. A file source also skips them in its query when their bytes tell
        # (read_vb_matching): those rows never become Python objects.
        self.filter = filters.compile_filter(self.defn.filter) if self.defn.filter is not None else None
        self._drops = self.filter is not None and self.runner.previous is None
        self._prefilter = (
            self.filter.prefilter if self._drops and self.filter is not None and not self._reads_ahead else None
        ) or None
        self.rw_bindings = self.runner.rw_bindings
        # at_least_once: no effect marks are read, fenced or written (see LocalBucket.apply_effects).
        self.marked = self.defn.delivery == "exactly_once"
        self.on_update = self.runner.on_update
        self.on_delete = self.runner.on_delete
        # A handler taking a run of updates in one call (JavaScript: see _handle_batched), else None.
        self._batch = getattr(self.on_update, "batch", None)
        self._batch_slice_s = getattr(getattr(self.on_update, "handler", None), "slice_s", 0.0)
        self.max_bytes = self.defn.max_document_bytes
        self.timeout_s = self.runner.timeout_s
        self._attempts = self.defn.retries + 1
        self._backoff_s = self.defn.retry_backoff.total_seconds()
        self._success = {kind: counter_names.handler_outcome(kind, "success") for kind in ("on_update", "on_delete")}
        self.positions: dict[int, int] = {}  # vb -> last handled seqno
        self.committed: dict[int, int] = {}  # vb -> last checkpointed seqno
        self.epochs: dict[int, int] = {}
        self.targets = spec.targets
        self.counters: Counter[str] = Counter()
        self.window_rows = WindowRowWriter.for_worker(  # rows of a windowed function, else None
            spec.data_dir, spec.function, spec.generation, spec.worker_id, self.defn.window, self.counters,
            put_file=None if self.data.local else self.data.put_file,
        )
        self.dlq: list[DlqRow] = []
        self.last_commit = time.monotonic()
        self._rotor = 0
        self._handled_any = False
        self._closed = False
        self._lettered: dict[tuple[int, int], str] = {}  # (vb, seqno) -> the counter of its skip
        self.timers = self.runner.timers
        self.timers.lookup = lambda callback, reference: self.store.get_timer(self.name, callback, reference)
        self.timers_done: list[TimerDone] = []  # fired since the last commit
        self._reclaim: set[int] = set()  # newly owned vBuckets: timers a previous owner claimed fire first
        self.assign_vbuckets(spec.vbuckets)
        if recycle_on_hang:
            threading.Thread(target=self._hang_guard, name="hang-guard", daemon=True).start()

    # -- ownership ----------------------------------------------------------------------------------

    def assign_vbuckets(self, vbuckets) -> None:
        """Claim vBuckets with a higher epoch and resume each right after its checkpoint."""
        vbs = list(vbuckets)
        if not vbs:
            return
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
            self.positions[vb] = self.committed[vb] = cp.seqno
            self.epochs[vb] = cp.epoch
        # Raise the effect fences first, so a zombie's binding writes are rejected from now on (timer
        # callbacks' writes are marked under TIMER_VB_BASE + vb, with the same epoch).
        epochs = {vb: self.epochs[vb] for vb in vbs}
        epochs.update({TIMER_VB_BASE + vb: self.epochs[vb] for vb in vbs})
        for bucket in {id(b.bucket): b.bucket for b in self.rw_bindings if self.marked}.values():
            bucket.fence(self.name, epochs)
        # Then learn how far each bucket already holds this function's effects (see BucketBinding.keep).
        for binding in self.rw_bindings if self.marked else ():
            marks = binding.bucket.effect_marks(self.name)
            for vb in epochs:
                binding.applied_upto[vb] = marks.get(vb, (0, 0))[1]
        self._reclaim.update(vbs)
        # Mutations ahead of the checkpoint that this deployment already dead-lettered are not handled again
        # by the stream: one a previous process of this worker hung on (and was recycled for) would hang
        # again, and after a rewind a letter belongs to `dlq replay`, whose effects are marked per letter
        # (replayed: its effects are applied; pending: replay applies them), never to the stream's per
        # vBucket marks, so either way handling it again could apply its effects twice or not at all.
        # Letters of earlier deployments do not count: a fresh deployment handles every mutation of its
        # boundary, whatever an older handler did (the deploy resolved those letters).
        for row in self.store.find_dlq_rows(self.name, include_replayed=True, generation=self.spec.generation):
            if row.reason == "late":
                continue
            hung = row.reason == "timeout" and row.replayed_at is None
            if row.vb in wanted and row.seqno > self.committed[row.vb]:
                self._lettered[(row.vb, row.seqno)] = (
                    counter_names.HUNG_SKIPPED if hung else counter_names.DEAD_LETTERED_SKIPPED
                )
            elif hung and row.vb >= TIMER_VB_BASE and owner_vb(row.vb) in wanted:
                # a timer whose callback hung: recorded as done instead
                self._lettered[(row.vb, row.seqno)] = counter_names.HUNG_SKIPPED

    def revoke_vbuckets(self, vbuckets) -> dict[int, int]:
        """Finish, flush, checkpoint and release vBuckets; returns their final checkpoints."""
        vbs = [vb for vb in vbuckets if vb in self.epochs]
        self.commit()
        self.store.release(self.name, {vb: self.epochs[vb] for vb in vbs})
        out = {vb: self.committed[vb] for vb in vbs}
        for vb in vbs:
            self._forget(vb)
        return out

    def stop(self) -> dict[int, int]:
        return self.revoke_vbuckets(list(self.epochs))

    def _forget(self, vb: int) -> None:
        self.positions.pop(vb, None)
        self.committed.pop(vb, None)
        self.epochs.pop(vb, None)

    def owned(self) -> list[int]:
        return sorted(self.epochs)

    # -- processing ---------------------------------------------------------------------------------

    def step(self, budget: int | None = None) -> StepReport:
        """Handle mutations across owned vBuckets in batches of `budget` (default batch_size), flushing
        effects after each batch, and checkpoint if due. An explicit budget is exactly one batch; the
        supervisor's call (no budget) keeps taking batches for STEP_SLICE_S while a backlog is left, so a
        worker that is behind pays one round trip per slice instead of one per batch."""
        slice_ends = time.monotonic() + (STEP_SLICE_S if budget is None else 0.0)
        budget = budget or self.defn.batch_size
        targets = self.targets
        handled = 0
        fenced: set[int] = set()
        # Through the data service, the high seqnos are asked at most once a step (those read along with
        # the last read ahead when there are: no round trip of their own while the worker is behind).
        remote = self._reads_ahead
        highs = self.source.high_seqnos(prefetched=True) if remote else []
        first_at = 0.0 if self._handled_any else time.time()
        while True:
            if not remote:
                highs = self.source.high_seqnos()
            limits = {vb: (min(highs[vb], targets[vb]) if targets else highs[vb]) for vb in self.epochs}
            work = [vb for vb in self.epochs if self.positions[vb] < limits[vb]]
            batch = 0
            if work:
                armed = self._arm_watchdog()
                started = time.perf_counter()
                try:
                    batch = self._process(work, limits, budget)
                finally:
                    if armed:
                        self._disarm_watchdog()
                if batch:
                    self._observe_latency(time.perf_counter() - started, batch)
            # Effects go to their buckets in transactions of at least EFFECT_FLUSH_MIN writes (and at the end
            # of the step): each transaction rewrites the B-tree pages it touches, so fewer, larger ones
            # cost less per write. Reads see pending writes meanwhile (the bindings' overlay).
            if self._pending_effects() >= EFFECT_FLUSH_MIN:
                fenced |= self.flush_effects()
            handled += batch
            if batch < budget or fenced or time.monotonic() >= slice_ends:
                break
        fenced |= self.flush_effects()
        fired = self.fire_timers() if self.epochs else 0
        if fired:
            fenced |= self.flush_effects()
        backlog = sum(max(0, limits[vb] - self.positions[vb]) for vb in self.epochs)
        # Caught up includes timers already due: a full batch of firings may leave more, and a timer created
        # for the past can be claimed only once its create is durable, so a caught-up worker commits now
        # (creates and firings) instead of at the checkpoint interval.
        creates_due = not backlog and self._creates_due()
        if (creates_due or (not backlog and self.timers_done)) or (
            time.monotonic() - self.last_commit >= self.defn.checkpoint_interval.total_seconds()
        ):
            fenced |= self.commit()
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
            owned=len(self.epochs),
            timers_fired=fired,
            first_handled_at=first_at,
        )

    def _creates_due(self) -> bool:
        """Whether a timer created since the last commit is already due (it cannot be claimed before then)."""
        if not self.timers.kept:
            return False
        now_ms = time.time() * 1000
        return any(c.due_ms is not None and c.due_ms <= now_ms for c in self.timers.kept)

    def _pending_effects(self) -> int:
        return sum(b.pending() for b in self.rw_bindings) if self.rw_bindings else 0

    def _observe_latency(self, seconds: float, count: int) -> None:
        """One histogram observation per batch, weighted by its size (see counters.LATENCY_BOUNDS_US)."""
        c = self.counters
        c[counter_names.latency_bucket(seconds * 1e6 / count)] += count
        c[counter_names.LATENCY_COUNT] += count
        c[counter_names.LATENCY_SUM_US] += round(seconds * 1e6)

    # -- timers -------------------------------------------------------------------------------------

    def fire_timers(self) -> int:
        """Claim the due timers of owned vBuckets (fenced by their epochs) and run their callbacks; their
        effects join the batch keyed by (TIMER_VB_BASE + vb, fire_seq), and each timer is recorded as done
        with the next commit. Timers a previous owner claimed but never recorded fire first, with their
        old fire_seq, so the effects they already applied are skipped."""
        reclaim = self._reclaim & set(self.epochs)
        now_ms = int(time.time() * 1000)
        timers = self.store.claim_timers(self.name, self.epochs, now_ms, self.defn.batch_size, reclaim=reclaim)
        self._reclaim -= reclaim
        if not timers:
            return 0
        armed = self._arm_watchdog()
        try:
            for t in timers:
                if t.vb in self.epochs:
                    self._fire(t)
        finally:
            if armed:
                self._disarm_watchdog()
        return len(timers)

    def _fire(self, t: TimerRecord) -> None:
        c = self.counters
        c[delay_counter(time.time() * 1000 - t.due_ms)] += 1
        m = timer_mutation(t)
        call = self.runner.prepare(m)
        if self._lettered and (m.vb, m.seqno) in self._lettered:
            c[counter_names.HUNG_SKIPPED] += 1  # its dead letter was written when it hung
        elif type(call) is Rejection:
            c[counter_names.TIMERS_FAILED] += 1
            self._dead_letter(m, "timer_error", call.error, "", 0)
        else:
            assert type(call) is HandlerCall
            failure = self.runner.call(
                m, call, epoch=self.epochs[t.vb], attempts=self._attempts,
                backoff_s=self._backoff_s, on_retry=self._count_retry,
            )
            if failure is None:
                c[counter_names.TIMERS_FIRED] += 1
            else:
                c[counter_names.TIMERS_FAILED] += 1
                reason = "timeout" if failure.status == "timeout" else "timer_error"
                self._dead_letter(m, reason, failure.error, failure.traceback, failure.attempts, failure.first_failed_at)
        assert t.fire_seq is not None
        self.timers_done.append(TimerDone(t.vb, t.callback, t.reference, t.fire_seq))

    def _prefetch(self, work: list[int], limits: dict[int, int], budget: int) -> None:
        """Through the data service: when the vBuckets _process takes next (in its order) have fewer than
        REMOTE_READ_AHEAD mutations (or less than this batch) read ahead or in flight, ask for the next
        REMOTE_READ_AHEAD in one call (a call still in flight is waited for first), while this batch is
        handled. read_vb takes rows read ahead from the
        front of each vBucket's rows; a read they do not cover is made on the spot (a round trip, never a
        wrong answer)."""
        source = self.source
        source.forget_prefetched(self.positions)
        positions = self.positions
        start = self._rotor % len(work)
        covered = 0
        runs: list[tuple[int, int, int]] = []
        total = 0
        for vb in work[start:] + work[:start]:
            backlog = min(limits[vb] - positions[vb], REMOTE_READ_AHEAD)
            if source.has_ahead(vb):
                if not runs:
                    covered += backlog
                continue
            if not runs and covered >= max(budget, REMOTE_READ_AHEAD):
                return  # enough read ahead in the order of the coming batches
            if backlog > 0:
                runs.append((vb, positions[vb], backlog))
                total += backlog
                if total >= REMOTE_READ_AHEAD:
                    break
        source.prefetch(runs)

    def _process(self, work: list[int], limits: dict[int, int], budget: int) -> int:
        # Resume the rotation where the last step stopped, so every vBucket makes progress even when
        # the budget is smaller than the backlog; read long runs of one vBucket per query.
        window_only = self.on_update is None and self.window_rows is not None and self.filter is None
        if self._reads_ahead and not window_only:
            self._prefetch(work, limits, budget)
        handled = 0
        start = self._rotor % len(work)
        self._rotor = 0
        for i, vb in enumerate(work[start:] + work[:start]):
            if handled >= budget:
                self._rotor = start + i
                break
            limit = min(budget - handled, limits[vb] - self.positions[vb])
            position = self.positions[vb]
            if self._prefilter is not None:
                handled += self._read_matching(vb, position, limit, limits[vb])
                continue
            if window_only:
                taken = self._take_window_batch(vb, position, limit)
                if taken:
                    handled += taken
                    continue
            rows = self._read_rows(vb, position, limit)
            if rows and self.collections.mixed(rows):
                handled += self._handle_collections(vb, position, rows)
            else:
                handled += self._handle_run(vb, position, rows)
        return handled

    def _read_matching(self, vb: int, position: int, limit: int, upto: int) -> int:
        """_process's read of the next `limit` log entries of a vBucket from a file source whose query
        leaves out the rows the filter's byte check rules out; they are counted as filtered here, the rest
        go on as read rows do. Returns how many entries it passed (0: none left up to `upto`)."""
        rows, scanned, last = self.source.read_vb_matching(  # type: ignore[attr-defined]
            vb, position, limit, upto, self._prefilter, self.name
        )
        if rows and self.collections.mixed(rows):
            self._handle_collections(vb, position, rows)
        elif rows:
            self._handle_run(vb, position, rows)
        skipped = scanned - len(rows)
        if skipped:
            c = self.counters
            c[counter_names.MUTATIONS_SEEN] += skipped
            c[counter_names.FILTERED] += skipped
        if last > self.positions[vb]:
            self.positions[vb] = last
        return scanned

    def _drop_filtered(self, vb: int, position: int, rows: list) -> list:
        """The rows of a run the filter matches, in order (the others counted as filtered). Rows this
        function wrote (recursion guard) and rows this deployment dead-lettered stay: _handle counts them."""
        flt = self.filter
        assert flt is not None
        match_update, match_delete, needs_doc = flt.update, flt.delete, flt.needs_doc
        name, lettered, unpack = self.name, self._lettered, msgpack.unpackb
        kept = []
        for row in rows:
            seqno = row[1]
            if seqno <= position:
                self._order_violation(vb, seqno, position)
            position = seqno
            if row[6] == name or (lettered and (vb, seqno) in lettered):
                kept.append(row)
                continue
            raw = row[5]
            if row[3] != OP_UPDATE or raw is None:
                ok = match_delete(row)
            elif needs_doc:
                try:
                    ok = match_update(row, unpack(raw, raw=False))
                except Exception:  # noqa: BLE001 - undecodable: the handler path dead-letters it
                    ok = True
            else:
                ok = match_update(row, None)
            if ok:
                kept.append(row)
        dropped = len(rows) - len(kept)
        if dropped:
            c = self.counters
            c[counter_names.MUTATIONS_SEEN] += dropped
            c[counter_names.FILTERED] += dropped
        return kept

    def _handle_collections(self, vb: int, position: int, rows: list) -> int:
        """A run whose rows are not all of the source collection: the others are passed over (their seqnos
        still move the position, as Couchbase's DCP stream filtered by collection moves on), the source's
        go to _handle_run with their own keys and meta.keyspace."""
        runner = self.runner
        for keyspace, group in self.collections.split(rows):
            if keyspace is None:
                self.counters[counter_names.COLLECTION_FILTERED] += len(group)
                last = group[-1][1]
                if last <= position:
                    self._order_violation(vb, last, position)
                position = self.positions[vb] = last
                continue
            runner.keyspace = keyspace
            self._handle_run(vb, position, group)
            position = self.positions[vb]
        runner.keyspace = self.collections.default_meta
        return len(rows)

    def _handle_run(self, vb: int, position: int, rows: list, matched: bool = False) -> int:
        """_handle over a run of one vBucket's log rows (tuples in Mutation's field order), with the common
        case inlined: an update of a decodable document within max_document_bytes, not written by this
        function, for on_update. Anything else (deletes, dead letters, the recursion guard, window rows,
        previous_version, a failed call) goes through _handle or the runner's own failure path, so both
        ways give the same effects, counters and dead letters. Inlining saves ~1.5 us a mutation (no
        HandlerCall, no dispatch, counters added once a run): a third of a worker's cost on a trivial handler."""
        runner = self.runner
        positions = self.positions
        if self._drops and not matched and rows:
            kept = self._drop_filtered(vb, position, rows)
            if kept:
                self._handle_run(vb, position, kept, True)
            positions[vb] = rows[-1][1]
            return len(rows)
        if self.on_update is None or self.window_rows is not None or runner.previous is not None or self._lettered:
            for row in rows:
                m = _as_mutation(Mutation, row)
                if m.seqno <= position:
                    self._order_violation(vb, m.seqno, position)
                self._handle(m)
                position = positions[vb] = m.seqno
            return len(rows)
        if self._batch is not None:
            return self._handle_batched(vb, position, rows)
        on_update, rw, timers, keyspace = self.on_update, self.rw_bindings, self.timers, runner.keyspace
        max_bytes, epoch, unpack, monotonic = self.max_bytes, self.epochs[vb], msgpack.unpackb, time.monotonic
        context, timeout_s = runner.context, self.timeout_s  # CallContext.begin, inlined below
        context.epoch = epoch
        handled_ok = 0
        for row in rows:
            m = _as_mutation(Mutation, row)
            _, seqno, key, op, cas, raw, origin, expiry, flags, _ = m
            if seqno <= position:
                self._order_violation(vb, seqno, position)
            if op != OP_UPDATE or origin is not None or raw is None or len(raw) > max_bytes:
                self._handle(m)
            else:
                try:
                    doc = unpack(raw, raw=False)
                except Exception:  # noqa: BLE001 - _handle dead-letters it as undecodable
                    self._handle(m)
                else:
                    meta = Meta(key, cas, vb, seqno, expiry, flags, "json", keyspace)
                    for b in rw:
                        b.begin(vb, seqno)
                    context.mutation = m
                    context.deadline = monotonic() + timeout_s
                    context.active = True
                    try:
                        on_update(doc, meta)
                        context.active = False
                    except BaseException as exc:
                        context.active = False
                        call = new_call(HandlerCall, ("on_update", on_update, (doc, meta), doc))
                        failure = runner.retry_after(
                            exc, m, call, epoch=epoch, attempts=self._attempts, backoff_s=self._backoff_s,
                            on_retry=self._count_retry,
                        )
                        self.counters[counter_names.MUTATIONS_SEEN] += 1
                        self._outcome(m, call, failure)
                    else:
                        if rw or timers.current:
                            runner.kept(epoch)
                        handled_ok += 1
            position = positions[vb] = seqno
        if handled_ok:
            c = self.counters
            c[counter_names.MUTATIONS_SEEN] += handled_ok
            c[self._success["on_update"]] += handled_ok
        return len(rows)

    def _handle_batched(self, vb: int, position: int, rows: list) -> int:
        """_handle_run for a handler that takes a run of updates in one call (a JavaScript OnUpdate, see
        eventing.execution.javascript, "Batches"): consecutive plain updates go to _run_batch together,
        anything else to _handle between them, so the order is the log's."""
        positions, max_bytes, unpack = self.positions, self.max_bytes, msgpack.unpackb
        batch: list[Mutation] = []
        docs: list = []
        for row in rows:
            m = _as_mutation(Mutation, row)
            seqno, raw = m[1], m[5]
            if seqno <= position:
                self._order_violation(vb, seqno, position)
            position = seqno
            if m[3] == OP_UPDATE and m[6] is None and raw is not None and len(raw) <= max_bytes:
                try:
                    docs.append(unpack(raw, raw=False))
                except Exception:  # noqa: BLE001 - _handle dead-letters it as undecodable
                    pass
                else:
                    batch.append(m)
                    continue
            if batch:
                self._run_batch(vb, batch, docs)
                batch, docs = [], []
            self._handle(m)
            positions[vb] = seqno
        if batch:
            self._run_batch(vb, batch, docs)
        return len(rows)

    def _run_batch(self, vb: int, batch: list[Mutation], docs: list) -> None:
        """Plain updates of one vBucket through the handler's batch call, with per-mutation outcomes: the
        writes of each mutation are kept under its own seqno (the handler reports, before a host call, which
        mutation makes it); the first that fails goes through the runner's failure path (retries, dead
        letter) and the batch goes on after it; a batch that stopped at its time slice goes on where it
        stopped."""
        runner, rw, timers, context, positions = self.runner, self.rw_bindings, self.timers, self.runner.context, self.positions
        assert self._batch is not None
        batch_fn, keyspace, epoch = self._batch, runner.keyspace, self.epochs[vb]
        budget_s = self.timeout_s + self._batch_slice_s
        context.epoch = epoch
        handled_ok = 0
        while batch:
            at = 0

            def on_start(i: int, part: list[Mutation] = batch) -> None:
                nonlocal at
                if rw or timers.current:
                    runner.kept(epoch)  # mutation `at` returned: the ones between made no host call
                m = part[i]
                for b in rw:
                    b.begin(vb, m[1])
                context.mutation = m
                at = i

            first = batch[0]
            for b in rw:
                b.begin(vb, first[1])
            context.mutation = first
            context.deadline = time.monotonic() + budget_s
            context.active = True
            try:
                done, failed = batch_fn(batch, docs, keyspace, on_start)
            except HandlerTimeout as exc:  # the worker's SIGALRM outside V8: the mutation in progress
                done, failed = at, exc
            finally:
                context.active = False
            if at < done and (rw or timers.current):
                runner.kept(epoch)
            if done:
                handled_ok += done
                positions[vb] = batch[done - 1][1]
            if failed is None:
                batch, docs = batch[done:], docs[done:]
                continue
            m, doc = batch[done], docs[done]
            meta = Meta(m[2], m[4], vb, m[1], m[7], m[8], "json", keyspace)
            call = new_call(HandlerCall, ("on_update", self.on_update, (doc, meta), doc))
            try:
                raise failed
            except BaseException as exc:  # noqa: BLE001 - the runner's failure path decides
                failure = runner.retry_after(
                    exc, m, call, epoch=epoch, attempts=self._attempts, backoff_s=self._backoff_s,
                    on_retry=self._count_retry,
                )
            self.counters[counter_names.MUTATIONS_SEEN] += 1
            self._outcome(m, call, failure)
            positions[vb] = m[1]
            context.epoch = epoch
            batch, docs = batch[done + 1:], docs[done + 1:]
        if handled_ok:
            c = self.counters
            c[counter_names.MUTATIONS_SEEN] += handled_ok
            c[self._success["on_update"]] += handled_ok

    def _order_violation(self, vb: int, seqno: int, position: int) -> None:
        raise OrderViolationError(
            f"vBucket {vb} of bucket '{self.source.name}' went backwards: seqno {seqno} after {position}"
        )

    def _take_window_batch(self, vb: int, position: int, limit: int) -> int:
        """For a window-only function (no on_update): buffer the rows of the next ``limit`` log entries
        of a vBucket whole, read in bulk, and count them as _handle would, when every entry is a plain
        update (or a delete without on_delete) that gives a row. Returns how many entries it took: 0, with
        nothing counted or buffered, leaves them to _handle one by one (dead letters, the function's own
        writes, float times, ...), with the same rows, counters and dead letters either way."""
        if self._lettered and any(lettered_vb == vb for lettered_vb, _ in self._lettered):
            return 0
        if not self.collections.source_is_default:
            return 0  # rows of other collections to pass over: one by one
        batch = self.source.read_vb_packed(
            vb, position, limit, self.name, exact_arrivals_over_ms=self.window_rows.arrival_gap_ms  # type: ignore[union-attr]
        )
        if batch is None or (batch.other_seqnos and self.on_delete is not None) or COLLECTION_MARK_BYTES in batch.keys:
            return 0
        # An oversize document is dead-lettered: only a batch larger than the limit can hold one.
        if len(batch.docs) > self.max_bytes and self.source.max_doc_bytes(vb, position, batch.last_seqno) > self.max_bytes:
            return 0
        if not self.window_rows.add_packed(batch):  # type: ignore[union-attr]
            return 0
        self.positions[vb] = batch.last_seqno
        c = self.counters
        c[counter_names.MUTATIONS_SEEN] += batch.count
        if batch.other_seqnos:  # as _handle, no zero entries: a counter appears once it counts something
            c[counter_names.NO_HANDLER] += len(batch.other_seqnos)
        return batch.count  # the updates count as window_rows_written once flushed, as in _handle

    def _handle(self, m: Mutation) -> None:
        c = self.counters
        c[counter_names.MUTATIONS_SEEN] += 1
        if m.origin == self.name:
            # Recursion guard: this function's own binding wrote it; handling it again would loop.
            c[counter_names.RECURSION_FILTERED] += 1
            if self.runner.previous is not None:
                self.runner.seen(m)
            return
        if self._lettered and (m.vb, m.seqno) in self._lettered:
            c[self._lettered[(m.vb, m.seqno)]] += 1  # this deployment dead-lettered it already (see assign_vbuckets)
            if self.runner.previous is not None:
                self.runner.seen(m)
            return
        if not self._drops and self.filter is not None and not self.filter.matches(m, _unpack):
            c[counter_names.FILTERED] += 1  # with previous_version: its version is still seen, in log order
            if self.runner.previous is not None:
                self.runner.seen(m)
            return
        call = self.runner.prepare(m)
        if type(call) is Rejection:
            if call is NO_HANDLER:
                c[counter_names.NO_HANDLER] += 1
            else:
                self._dead_letter(m, call.status, call.error, "", 0)
            return
        assert type(call) is HandlerCall
        if self.window_rows is not None and call.kind == "on_update":
            if not self.window_rows.add(m, call.doc):
                self._dead_letter(m, "bad_event_time", self.window_rows.rejection, "", 0)
                return
            if call.fn is None:  # a window-only function: the row is the whole effect
                return  # counted as window_rows_written (no handler ran, so no on_update_success)
        failure = self.runner.call(
            m, call, epoch=self.epochs[m.vb], attempts=self._attempts, backoff_s=self._backoff_s,
            on_retry=self._count_retry,
        )
        self._outcome(m, call, failure)

    def _outcome(self, m: Mutation, call: HandlerCall, failure: Failure | None) -> None:
        c = self.counters
        if failure is None:
            c[self._success[call.kind]] += 1
        elif failure.status == "timeout":
            c[counter_names.handler_outcome(call.kind, "timeout")] += 1
            self._dead_letter(m, "timeout", failure.error, "", failure.attempts)
        else:
            c[counter_names.handler_outcome(call.kind, "failure")] += 1
            self._dead_letter(m, "error", failure.error, failure.traceback, failure.attempts, failure.first_failed_at)

    def _count_retry(self) -> None:
        self.counters[counter_names.RETRIES] += 1

    def _hang_guard(self) -> None:
        """Last resort for a handler that SIGALRM cannot interrupt (blocked in C code, signals masked):
        once it overruns execution_timeout by HANG_GRACE_S, record its mutation as a `timeout` dead letter
        (fenced by this worker's epoch, checkpoint untouched) and end the process. The supervisor restarts
        the worker from its checkpoint; the restarted worker skips that mutation, so it cannot hang again.
        Only used where the worker has a process of its own (a Ray actor)."""
        store = None
        while not self._closed:
            time.sleep(0.25)
            context = self.runner.context
            m = context.mutation
            if not context.active or m is None:
                continue
            if time.monotonic() < context.deadline + HANG_GRACE_S:
                continue
            now = time.time()
            row = DlqRow(
                self.name, m.vb, m.seqno, m.key, "timeout",
                f"handler did not return within execution_timeout ({self.timeout_s}s) and could not be "
                "interrupted; the worker process was recycled",
                "", 1, now, now, pack_mutation(m), generation=self.spec.generation,
            )
            try:
                store = store or self.spec.data_access().metadata()
                vb = owner_vb(m.vb)  # a timer's dead letter is fenced by its vBucket
                store.commit(self.name, {vb: self.epochs.get(vb, -1)}, {}, [row], {counter_names.WORKERS_RECYCLED: 1})
            finally:
                os._exit(70)

    def _watchdog_tick(self, signum, frame) -> None:
        # Runs in the main thread between bytecodes; only a handler call that overran is interrupted.
        context = self.runner.context
        if context.active and time.monotonic() >= context.deadline:
            context.active = False
            raise HandlerTimeout()

    def _arm_watchdog(self) -> bool:
        """A periodic SIGALRM checks the running handler's age. Arming it once per step rather than per
        mutation keeps the cost to two attribute writes per call (per-call setitimer cost ~4 us).
        SIGALRM interrupts Python-level hangs (loops, sleeps) in the main thread, where Ray runs a
        synchronous actor's methods; a hang SIGALRM cannot break is left to _hang_guard."""
        if threading.current_thread() is not threading.main_thread():
            return False
        signal.signal(signal.SIGALRM, self._watchdog_tick)
        tick = max(0.01, min(0.25, self.timeout_s / 4))
        signal.setitimer(signal.ITIMER_REAL, tick, tick)
        return True

    @staticmethod
    def _disarm_watchdog() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    def _dead_letter(self, m: Mutation, reason: str, error: str, tb: str, attempts: int, first: float = 0.0) -> None:
        now = time.time()
        self.counters[counter_names.dlq(reason)] += 1
        self.dlq.append(
            DlqRow(
                self.name, m.vb, m.seqno, m.key, reason, error, tb, attempts, first or now, now, pack_mutation(m),
                generation=self.spec.generation,
            )
        )

    # -- durability ---------------------------------------------------------------------------------

    def flush_effects(self) -> set[int]:
        """Apply buffered binding writes to their buckets (deduplicated by source seqno, fenced by epoch)."""
        fenced: set[int] = set()
        try:
            for binding in self.rw_bindings:
                # Replayed writes dropped before the batch (BucketBinding.keep) count even when nothing is pending.
                if binding.replayed_writes:
                    self.counters[counter_names.EFFECTS_DUPLICATE] += binding.replayed_writes
                    binding.replayed_writes = 0
                if not binding.pending():
                    continue
                result = binding.bucket.apply_effects(self.name, binding.take_groups(), marks=self.marked)
                self.counters[counter_names.EFFECTS_APPLIED] += result.applied
                self.counters[counter_names.EFFECTS_DUPLICATE] += result.duplicates
                self.counters[counter_names.EFFECTS_FENCED] += result.fenced_writes
                fenced |= result.fenced_vbs
                if result.conflicts:
                    self._cas_conflicts(binding.bucket.name, result.conflicts)
            for binding in self.runner.bindings:
                if binding.buf.ops:
                    self.counters.update(binding.buf.ops)
                    binding.buf.ops.clear()
            if self.runner.curl.ops:
                self.counters.update(self.runner.curl.ops)
                self.runner.curl.ops.clear()
        except Exception:
            self._rewind()
            raise
        for vb in {owner_vb(v) for v in fenced}:
            self._forget(vb)
        return {owner_vb(v) for v in fenced}

    def _cas_conflicts(self, bucket: str, sources: list[tuple[int, int]]) -> None:
        """Calls whose cas condition failed when their writes were applied (another writer changed the
        document after the read): their writes to `bucket` were dropped; they become dead letters."""
        for vb, seqno in sources:
            self.counters["bkt_ops_cas_mismatch_count"] += 1
            if vb >= TIMER_VB_BASE:
                m = Mutation(vb, seqno, "", OP_TIMER, 0, None, None, 0, 0)
            else:
                found = self.source.read_vb(vb, seqno - 1, 1)
                m = found[0] if found and found[0].seqno == seqno else Mutation(vb, seqno, "", 0, 0, None, None, 0, 0)
            self._dead_letter(
                m, "cas_mismatch",
                f"a write to bucket '{bucket}' found the document changed since the handler read it (cas); "
                "the call's writes to that bucket were not applied; replay the dead letter to run it again", "", 1,
            )

    def _rewind(self) -> None:
        """A flush failed (disk full, a damaged bucket): the writes it took are gone from memory. Forget
        everything since the last checkpoint (positions, buffered writes, DLQ rows, counters) so that no
        later commit, not even the one at stop, checkpoints past effects that never became durable. The
        mutations are handled again; effects that did apply are skipped by the buckets' marks."""
        for binding in self.rw_bindings:
            binding.take_groups()
            binding.discard()
            binding.replayed_writes = 0
        self.dlq = []
        self.counters.clear()
        self.positions.update(self.committed)
        if self.runner.previous is not None:
            self.runner.previous.clear()  # the replay reads versions again from the log
        # Timer changes are made again by the replayed calls; fired timers are claimed again (same fire_seq).
        self.timers.discard()
        self.timers.committed(len(self.timers.kept))
        self.timers_done = []
        self._reclaim.update(self.epochs)
        for binding in self.rw_bindings if self.marked else ():
            marks = binding.bucket.effect_marks(self.name)
            for vb in self.epochs:
                binding.applied_upto[vb] = marks.get(vb, (0, 0))[1]
                binding.applied_upto[TIMER_VB_BASE + vb] = marks.get(TIMER_VB_BASE + vb, (0, 0))[1]

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
        moved = {vb: s for vb, s in self.positions.items() if s != self.committed.get(vb)}
        dlq, counters = self.dlq, dict(self.counters)
        changes, done = list(self.timers.kept), self.timers_done
        if changes:
            created = sum(1 for ch in changes if ch.due_ms is not None)
            counters[counter_names.TIMERS_CREATED] = counters.get(counter_names.TIMERS_CREATED, 0) + created
            counters[counter_names.TIMERS_CANCELLED] = counters.get(counter_names.TIMERS_CANCELLED, 0) + len(changes) - created
        if moved or dlq or counters or done:
            fenced |= self.store.commit(self.name, self.epochs, moved, dlq, counters, changes, done)
            self.dlq = []
            self.counters.clear()
            self.timers.committed(len(changes))
            self.timers_done = []
            for vb, seqno in moved.items():
                if vb not in fenced:
                    self.committed[vb] = seqno
        for vb in fenced:
            self._forget(vb)
        self.last_commit = time.monotonic()
        return fenced

    def close(self) -> None:
        self._closed = True  # ends the hang guard: a pooled worker process outlives its cores
        if self.app_log is not None:
            try:
                self.app_log.flush()
            except Exception:  # noqa: BLE001 - a worker being ended; the data service may be gone already
                pass
        self.store.close()
        self.runner.close()
