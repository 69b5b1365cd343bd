"""The state of the handler call in flight, shared by what a handler calls into (curl, timers, log) and what
watches the call (a worker's watchdog and hang guard, from a signal handler or another thread).

Whoever runs a handler sets it before the call (`begin`, or the same three fields written inline on a
worker's hot path) and clears `active` when the call returns or raises; everyone else only reads it.
"""

from __future__ import annotations

import time

from eventing.core.mutation import Mutation


class CallContext:
    """The mutation a handler is running on, the epoch its writes are kept under, and when it must end."""

    __slots__ = ("mutation", "epoch", "deadline", "active", "timeout_s")

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s  # execution_timeout of every call
        self.mutation: Mutation | None = None  # of the call in flight, else of the last call (None before any)
        self.epoch = 0  # the owner's epoch of the mutation's vBucket, under which the call's writes are kept
        self.deadline = 0.0  # time.monotonic() at which the call overruns execution_timeout
        self.active = False  # a handler call is running now

    def begin(self, m: Mutation, epoch: int) -> None:
        self.mutation, self.epoch = m, epoch
        self.deadline = time.monotonic() + self.timeout_s
        self.active = True

    def remaining_s(self) -> float:
        """Seconds left of execution_timeout for the call in flight (all of it outside a call)."""
        return self.deadline - time.monotonic() if self.active else self.timeout_s
