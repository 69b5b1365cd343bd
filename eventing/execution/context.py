"""The state of the handler call in flight, shared by what a handler calls into (curl, timers, log) and what
watches the call (a worker's watchdog and hang guard, from a signal handler or another thread).

Whoever runs a handler sets it before the call (`begin`, or the same three fields written inline on a
worker's hot path) and clears `active` when the call returns or raises; everyone else only reads it.

A function with `concurrency` > 1 runs calls on a worker's pool threads too
(eventing.workers.concurrent_calls): each pool thread has a `LaneContext` of its own, bound to the thread, and
what a handler calls into asks `context.here()` for the call of the thread it runs on.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

from eventing.core.mutation import Mutation

_thread = threading.local()  # .context: the LaneContext of a pool thread (absent on every other thread)


class HandlerTimeout(Exception):
    """Raised inside a handler call that ran past execution_timeout."""


class CallContext:
    """The mutation a handler is running on, the epoch its writes are kept under, and when it must end."""

    __slots__ = (
        "mutation",
        "epoch",
        "deadline",
        "active",
        "timeout_s",
        "batch",
        "attempt_at",
        "sent",
        "statuses",
        "retry_after",
    )

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s  # execution_timeout of every call
        self.mutation: Mutation | None = (
            None  # of the call in flight, else of the last call (None before any)
        )
        self.epoch = 0  # the owner's epoch of the mutation's vBucket, under which the call's writes are kept
        self.deadline = 0.0  # time.monotonic() at which the call overruns execution_timeout
        self.active = False  # a handler call is running now
        # An on_batch call while none of its items is current: the batch, whose idempotency key a request
        # carries (eventing.execution.batch; else None).
        self.batch: Any = None
        # What curl saw in the attempt in flight (see `attempt`): requests sent per idempotency key, the HTTP
        # statuses answered, the longest Retry-After asked for (seconds).
        self.attempt_at = -1.0
        self.sent: dict[str, int] = {}
        self.statuses: set[int] = set()
        self.retry_after = 0.0

    def begin(self, m: Mutation, epoch: int) -> None:
        self.mutation, self.epoch = m, epoch
        self.deadline = time.monotonic() + self.timeout_s
        self.active = True

    def attempt(self) -> CallContext:
        """This context with curl's records of the attempt in flight: an attempt is told from the last by its
        deadline (set afresh at each), so the hot path that sets the deadline inline resets nothing."""
        if self.attempt_at != self.deadline:
            self.attempt_at = self.deadline
            self.sent, self.statuses, self.retry_after = {}, set(), 0.0
        return self

    def seen(self) -> tuple[set[int], float]:
        """The statuses and Retry-After curl saw in the call that just failed (empty if it made no
        request)."""
        if self.attempt_at != self.deadline:
            return set(), 0.0
        return self.statuses, self.retry_after

    def extend(self, seconds: float) -> None:
        """Move the call's deadline by `seconds` it spent waiting for a URL binding's limit (backpressure is
        not the handler's time), keeping the attempt's records."""
        if self.active and seconds > 0:
            moved = self.attempt_at == self.deadline
            self.deadline += seconds
            if moved:
                self.attempt_at = self.deadline

    def remaining_s(self) -> float:
        """Seconds left of execution_timeout for the call in flight (all of it outside a call)."""
        return self.deadline - time.monotonic() if self.active else self.timeout_s

    def here(self) -> CallContext:
        """The context of the call running on this thread: a pool thread's own, else this shared one."""
        return getattr(_thread, "context", None) or self


class LaneContext(CallContext):
    """The call in flight on one pool thread. Its execution_timeout is enforced by a watcher thread that
    raises HandlerTimeout inside the call (`interrupt`): SIGALRM reaches only the main thread. `lock` makes
    the watcher's decision and the call's end exclusive, so the exception is raised only while the call
    runs, and one raised as the call returned lands in `finish`, never in the worker's own code afterwards."""

    __slots__ = ("lock", "fired", "fired_at", "ident")

    def __init__(self, timeout_s: float):
        super().__init__(timeout_s)
        self.lock = threading.Lock()
        self.fired = False  # a timeout was raised into this call ...
        self.fired_at = 0.0  # ... at this time.monotonic()
        self.ident = 0  # the pool thread's id

    def bind(self) -> None:
        """Make this the context of the calling thread (the pool thread that runs its calls)."""
        self.ident = threading.get_ident()
        _thread.context = self

    def interrupt(self, now: float, exc: type[BaseException], repeat_s: float) -> bool:
        """From the watcher: raise `exc` in the call if it overran; True when it did. `active` stays set
        until the call ends, so one still running `repeat_s` after gets it again (it was raised in a
        __del__ or a weakref callback, where Python drops it, or the handler swallowed it), and the hang
        guard's recycling sees it."""
        with self.lock:
            if not self.active or now < self.deadline or (self.fired and now < self.fired_at + repeat_s):
                return False
            self.fired, self.fired_at = True, now
            _async_raise(self.ident, exc)
            return True

    def finish(self) -> None:
        """On the pool thread, when the call returned or raised: no timeout can land after this. A timeout
        raised into the call and not landed yet (the call returned first) lands here, in this thread's next
        bytecode check: raised out of finish, as from the call's end. It is never cancelled with
        PyThreadState_SetAsyncExc(ident, NULL): on CPython 3.11 that leaves the interpreter's pending
        async-exception flag set for good, and any tracer (pdb, a profiler, coverage) then loops forever."""
        with self.lock:
            self.active = False
            fired, self.fired = self.fired, False
        if fired:
            _checkpoint()


def _checkpoint() -> None:
    """Entering a Python function checks for a pending asynchronous exception: one raised into this thread
    lands here at the latest."""
    return None


def _async_raise(ident: int, exc: type[BaseException]) -> None:
    """Raise `exc` in thread `ident` at its next bytecode check. It does not break a blocking C call (a
    sleep, a read): the call sees it when that returns."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc))
