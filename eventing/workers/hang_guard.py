"""A worker's guard against a handler call that overruns execution_timeout (``HangGuard``, held by
``WorkerCore``, eventing.workers.worker): a periodic SIGALRM, armed around each batch of calls, interrupts
the call in flight, and where the worker has a process of its own, a thread ends the process when SIGALRM
cannot (the call's mutation is dead-lettered as `timeout` and skipped after the restart).
"""

from __future__ import annotations

import _signal
import os
import threading
import time
from collections.abc import Callable, Sequence

from eventing.core import counters as counter_names
from eventing.core.mutation import Mutation, pack_mutation
from eventing.execution.context import CallContext
from eventing.execution.runner import HandlerTimeout
from metadata import DlqRow, WorkerMetadata, owner_vb

HANG_GRACE_S = 2.0  # past execution_timeout, how long a handler SIGALRM could not stop may still run
# How long after raising HandlerTimeout into a call that is still running it is raised again: one raised in a
# __del__ or a weakref callback the call ran is printed as unraisable and lost, and a handler may swallow it.
# The runner clears `active` as soon as the exception reaches it, so a call still active this long after
# never saw it. Below HANG_GRACE_S: the call gets another chance before its process is recycled.
TIMEOUT_REPEAT_S = 0.5


class HangGuard:
    """Watches the runner's call in flight (its CallContext) for a worker whose calls have `timeout_s`."""

    def __init__(self, context: CallContext, timeout_s: float):
        self.context = context
        self.timeout_s = timeout_s
        self.closed = False  # ends the recycling thread: a pooled worker process outlives its cores
        # The calls of a worker's pool threads (concurrency > 1, eventing.workers.concurrent_calls): their
        # timeouts are raised by the pool's own watcher; one that cannot be interrupted is recycled here.
        self.lanes: Sequence[CallContext] = []
        self._raised_for = 0.0  # the deadline of the call HandlerTimeout was last raised into ...
        self._raised_at = 0.0  # ... and when

    def _tick(self, signum, frame) -> None:
        # Runs in the main thread between bytecodes; only a handler call that overran is interrupted. The
        # call stays `active` until the runner sees the exception, so one that never reached the runner is
        # raised again (TIMEOUT_REPEAT_S) and the recycling below still sees the call.
        context = self.context
        if not context.active:
            return
        now = time.monotonic()
        if now < context.deadline or (
            self._raised_for == context.deadline and now < self._raised_at + TIMEOUT_REPEAT_S
        ):
            return
        self._raised_for, self._raised_at = context.deadline, now
        raise HandlerTimeout()

    def arm(self) -> bool:
        """A periodic SIGALRM checks the running handler's age. Arming it once per step rather than per
        mutation keeps the cost to two attribute writes per call (per-call setitimer cost ~4 us).
        SIGALRM interrupts Python-level hangs (loops, sleeps) in the main thread, where Ray runs a
        synchronous actor's methods; a hang SIGALRM cannot break is left to recycle_on_hang."""
        if threading.current_thread() is not threading.main_thread():
            return False
        # _signal's own calls: signal.signal turns its arguments and answer into enums (~5 us a step).
        _signal.signal(_signal.SIGALRM, self._tick)
        tick = max(0.01, min(0.25, self.timeout_s / 4))
        _signal.setitimer(_signal.ITIMER_REAL, tick, tick)
        return True

    @staticmethod
    def disarm() -> None:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _signal.signal(_signal.SIGALRM, _signal.SIG_DFL)

    def recycle_on_hang(
        self, function: str, generation: int, epochs: dict[int, int], open_store: Callable[[], WorkerMetadata]
    ) -> None:
        """Start the thread that ends the process of a worker whose handler hangs (see _watch). `epochs` is
        the worker's own dict of owned vBuckets' epochs (kept up to date in place); `open_store` opens the
        metadata store, only once a handler hangs."""
        threading.Thread(
            target=self._watch,
            args=(function, generation, epochs, open_store),
            name="hang-guard",
            daemon=True,
        ).start()

    def _watch(
        self, function: str, generation: int, epochs: dict[int, int], open_store: Callable[[], WorkerMetadata]
    ) -> None:
        """Last resort for a handler that SIGALRM cannot interrupt (blocked in C code, signals masked):
        once it overruns execution_timeout by HANG_GRACE_S, record its mutation as a `timeout` dead letter
        (fenced by this worker's epoch, checkpoint untouched) and end the process. The supervisor restarts
        the worker from its checkpoint; the restarted worker skips that mutation, so it cannot hang again.
        Only used where the worker has a process of its own (a Ray actor)."""
        store = None
        while not self.closed:
            time.sleep(0.25)
            m = self._hung()
            if m is None:
                continue
            now = time.time()
            row = DlqRow(
                function,
                m.vb,
                m.seqno,
                m.key,
                "timeout",
                f"handler did not return within execution_timeout ({self.timeout_s}s) and could not be "
                "interrupted; the worker process was recycled",
                "",
                1,
                now,
                now,
                pack_mutation(m),
                generation=generation,
            )
            try:
                store = store or open_store()
                vb = owner_vb(m.vb)  # a timer's dead letter is fenced by its vBucket
                store.commit(
                    function, {vb: epochs.get(vb, -1)}, {}, [row], {counter_names.WORKERS_RECYCLED: 1}
                )
            finally:
                os._exit(70)

    def _hung(self) -> Mutation | None:
        """The mutation of a call (the main thread's or a pool thread's) past execution_timeout + grace."""
        now = time.monotonic()
        for context in (self.context, *self.lanes):
            m = context.mutation
            if context.active and m is not None and now >= context.deadline + HANG_GRACE_S:
                return m
        return None

    def close(self) -> None:
        self.closed = True
