"""How a worker fires timers (``TimerFiring``, a part of ``WorkerCore``, eventing.workers.worker, built by
it): the due timers of its owned vBuckets are claimed, fenced by their epochs, and their callbacks run
(``fire_timers``, ``fire``); timers a previous owner claimed but never recorded as done fire first
(``reclaim``); and ``creates_due`` tells whether a timer created since the last commit is due already.
"""

from __future__ import annotations

import time

from eventing.core import counters as counter_names
from eventing.execution.runner import HandlerCall, HandlerRunner, Rejection
from eventing.execution.timers import delay_counter, timer_mutation
from eventing.workers.crash_guard import CRASHED, CrashGuard
from eventing.workers.handling import MutationHandler
from eventing.workers.hang_guard import HangGuard
from eventing.workers.progress import WorkerProgress
from metadata import TimerDone, TimerRecord, WorkerMetadata

# After a claim that found no due timer, a worker whose claims are round trips waits this long before the
# next.
TIMER_CLAIM_IDLE_S = 0.05


class TimerFiring:
    """Fires a worker's due timers (see the module docstring). Built by WorkerCore (eventing.workers.worker)
    with what it needs; the worker's `progress` (eventing.workers.progress) is shared with its other parts."""

    def __init__(
        self,
        progress: WorkerProgress,
        store: WorkerMetadata,
        runner: HandlerRunner,
        handler: MutationHandler,
        hang_guard: HangGuard,
        crash_guard: CrashGuard,
        *,
        batch_size: int,
        claims_travel: bool = False,
    ):
        self.progress = progress
        self.name = progress.name
        self.store = store
        self.runner = runner
        self.handler = handler  # its retry policy's attempts, and its count of retries
        self.hang_guard = hang_guard
        self.crash_guard = crash_guard
        self.batch_size = batch_size  # timers claimed at most at once
        self.reclaim: set[int] = set()  # newly owned vBuckets: timers a previous owner claimed fire first
        # Where a claim is a round trip (the data service, a server's store, a sandbox's line), a claim that
        # found none is not made again before `claim_after` (time.monotonic()); the worker sets it back to 0
        # once it checkpointed timers it created.
        self.claims_travel = claims_travel
        self.claim_after = 0.0

    def fire_timers(self) -> int:
        """Claim the due timers of owned vBuckets (fenced by their epochs) and run their callbacks; their
        effects join the batch keyed by (TIMER_VB_BASE + vb, fire_seq), and each timer is recorded as done
        with the next commit. Timers a previous owner claimed but never recorded fire first, with their
        old fire_seq, so the effects they already applied are skipped."""
        epochs = self.progress.epochs
        reclaim = self.reclaim & set(epochs)
        if not reclaim and self.claims_travel and time.monotonic() < self.claim_after:
            return 0
        now_ms = int(time.time() * 1000)
        timers = self.store.claim_timers(self.name, epochs, now_ms, self.batch_size, reclaim=reclaim)
        self.reclaim -= reclaim
        if not timers:
            # Where a claim is a round trip, one a step cost a busy worker's step a fifth of its time
            # (docs/benchmarks.md, "Cluster mode"): none due now, the next look is a little later. Timers
            # this worker creates are looked for at once after their checkpoint (WorkerCore._write_commit).
            self.claim_after = time.monotonic() + TIMER_CLAIM_IDLE_S
            return 0
        self.claim_after = 0.0
        armed = self.hang_guard.arm()
        try:
            for t in timers:
                if t.vb in epochs:
                    self.fire(t)
        finally:
            if armed:
                self.hang_guard.disarm()
        return len(timers)

    def fire(self, t: TimerRecord) -> None:
        progress = self.progress
        c, lettered = progress.counters, progress.lettered
        c[delay_counter(time.time() * 1000 - t.due_ms)] += 1
        m = timer_mutation(t)
        call = self.runner.prepare(m)
        if lettered and (m.vb, m.seqno) in lettered:
            if lettered[(m.vb, m.seqno)] == CRASHED:  # its worker died on it (see crash_guard)
                c[counter_names.TIMERS_FAILED] += 1
                error, deaths = self.crash_guard.letter(m)
                progress.dead_letter(m, "crashed", error, "", deaths)
            else:
                c[counter_names.HUNG_SKIPPED] += 1  # its dead letter was written when it hung
        elif type(call) is Rejection:
            c[counter_names.TIMERS_FAILED] += 1
            progress.dead_letter(m, "timer_error", call.error, "", 0)
        else:
            assert type(call) is HandlerCall
            notes = self.crash_guard.notes
            notes.note(0, m.vb, m.seqno, m.seqno)
            try:
                failure = self.runner.call(
                    m,
                    call,
                    epoch=progress.epochs[t.vb],
                    attempts=self.handler.attempts,
                    on_retry=self.handler.count_retry,
                )
            finally:
                notes.clear(0)
            if failure is None:
                c[counter_names.TIMERS_FIRED] += 1
            else:
                c[counter_names.TIMERS_FAILED] += 1
                reason = failure.status if failure.status in ("timeout", "expired") else "timer_error"
                progress.dead_letter(
                    m, reason, failure.error, failure.traceback, failure.attempts, failure.first_failed_at
                )
        assert t.fire_seq is not None
        progress.timers_done.append(TimerDone(t.vb, t.callback, t.reference, t.fire_seq))

    def creates_due(self) -> bool:
        """Whether a timer created since the last commit is already due (it cannot be claimed before then)."""
        kept = self.runner.timers.kept
        if not kept:
            return False
        now_ms = time.time() * 1000
        return any(c.due_ms is not None and c.due_ms <= now_ms for c in kept)
