"""How a worker fires timers (``WorkerTimers``, one part of ``WorkerCore``, eventing.workers.worker): the due
timers of its owned vBuckets are claimed, fenced by their epochs, and their callbacks run
(``fire_timers``, ``_fire``); timers a previous owner claimed but never recorded as done fire first; and
``_creates_due`` tells whether a timer created since the last commit is due already.
"""

from __future__ import annotations

import time
from typing import Any

from eventing.core import counters as counter_names
from eventing.core.definition import FunctionDefinition
from eventing.execution.runner import HandlerCall, Rejection
from eventing.execution.timers import delay_counter, timer_mutation
from eventing.workers.crash_guard import CRASHED
from eventing.workers.handling import MutationHandler
from eventing.workers.hang_guard import HangGuard
from eventing.workers.progress import WorkerProgress
from metadata import TimerDone, TimerRecord, WorkerMetadata


class WorkerTimers:
    """Firing timers. A part of WorkerCore (eventing.workers.worker), which sets these."""

    name: str
    runner: Any
    timers: Any
    epochs: dict[int, int]
    counters: Any
    _lettered: dict[tuple[int, int], str]
    crash_guard: Any
    handler: MutationHandler
    progress: WorkerProgress
    defn: FunctionDefinition
    store: WorkerMetadata
    hang_guard: HangGuard
    timers_done: list[TimerDone]
    _reclaim: set[int]

    def fire_timers(self) -> int:
        """Claim the due timers of owned vBuckets (fenced by their epochs) and run their callbacks; their
        effects join the batch keyed by (TIMER_VB_BASE + vb, fire_seq), and each timer is recorded as done
        with the next commit. Timers a previous owner claimed but never recorded fire first, with their
        old fire_seq, so the effects they already applied are skipped."""
        reclaim = self._reclaim & set(self.epochs)
        now_ms = int(time.time() * 1000)
        timers = self.store.claim_timers(
            self.name, self.epochs, now_ms, self.defn.batch_size, reclaim=reclaim
        )
        self._reclaim -= reclaim
        if not timers:
            return 0
        armed = self.hang_guard.arm()
        try:
            for t in timers:
                if t.vb in self.epochs:
                    self._fire(t)
        finally:
            if armed:
                self.hang_guard.disarm()
        return len(timers)

    def _fire(self, t: TimerRecord) -> None:
        c = self.counters
        c[delay_counter(time.time() * 1000 - t.due_ms)] += 1
        m = timer_mutation(t)
        call = self.runner.prepare(m)
        if self._lettered and (m.vb, m.seqno) in self._lettered:
            if self._lettered[(m.vb, m.seqno)] == CRASHED:  # its worker died on it (see crash_guard)
                c[counter_names.TIMERS_FAILED] += 1
                error, deaths = self.crash_guard.letter(m)
                self.progress.dead_letter(m, "crashed", error, "", deaths)
            else:
                c[counter_names.HUNG_SKIPPED] += 1  # its dead letter was written when it hung
        elif type(call) is Rejection:
            c[counter_names.TIMERS_FAILED] += 1
            self.progress.dead_letter(m, "timer_error", call.error, "", 0)
        else:
            assert type(call) is HandlerCall
            notes = self.crash_guard.notes
            notes.note(0, m.vb, m.seqno, m.seqno)
            try:
                failure = self.runner.call(
                    m,
                    call,
                    epoch=self.epochs[t.vb],
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
                self.progress.dead_letter(
                    m, reason, failure.error, failure.traceback, failure.attempts, failure.first_failed_at
                )
        assert t.fire_seq is not None
        self.timers_done.append(TimerDone(t.vb, t.callback, t.reference, t.fire_seq))

    def _creates_due(self) -> bool:
        """Whether a timer created since the last commit is already due (it cannot be claimed before then)."""
        if not self.timers.kept:
            return False
        now_ms = time.time() * 1000
        return any(c.due_ms is not None and c.due_ms <= now_ms for c in self.timers.kept)
