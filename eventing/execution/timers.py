"""Durable timers on the handler side: `create_timer` / `cancel_timer` as a handler sees them, and the
mutation-shaped record a fired timer travels as (so dead letters, DLQ replay and the debugger treat a
timer callback like any other handler call).

Rules (Couchbase's createTimer/cancelTimer, written down where Couchbase is vague):
- A timer is identified by (callback, reference); creating it again overwrites it (new time, new context).
  `reference=None` makes one from the call's source position, so a replayed call makes the same one.
- It lives in the partition of vbucket_of(reference); the owner of that vBucket fires it at or after its
  time, once: the callback's binding writes are keyed by (TIMER_VB_BASE + vb, fire_seq) like any effect.
- Creates and cancels are held like binding writes: kept when the call returns, dropped when it fails,
  and durable with the commit that moves the checkpoint of the mutation (or timer) that made them.
- `cancel_timer` returns True when the timer existed (pending, or created earlier and not yet fired).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgpack

from eventing.core.mutation import OP_TIMER, Mutation
from eventing.errors import TimerError
from eventing.execution.context import CallContext
from metadata import TIMER_VB_BASE, TimerChange, TimerRecord, owner_vb
from sharding import InvalidKeyError, validate_key, vbucket_of

# Firing delay histogram (fire time minus due time), upper bounds in ms; counters add across workers.
DELAY_BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)


def delay_counter(delay_ms: float) -> str:
    for bound in DELAY_BOUNDS_MS:
        if delay_ms <= bound:
            return f"timer_delay_le_{bound}ms"
    return "timer_delay_gt_60000ms"


def delay_percentile(counters: dict[str, float], q: float) -> float | None:
    """The histogram bucket bound (ms) under which `q` of the firing delays fell; None without firings."""
    counts: list[tuple[float, float]] = [
        (b, counters.get(f"timer_delay_le_{b}ms", 0)) for b in DELAY_BOUNDS_MS
    ]
    counts.append((math.inf, counters.get("timer_delay_gt_60000ms", 0)))
    total = sum(c for _, c in counts)
    if not total:
        return None
    seen = 0.0
    for bound, c in counts:
        seen += c
        if seen >= q * total:
            return bound
    return math.inf


def timer_mutation(t: TimerRecord) -> Mutation:
    """A claimed timer as the record its firing runs from (and its dead letter keeps)."""
    assert t.fire_seq is not None
    doc = msgpack.packb({"callback": t.callback, "context": json.loads(t.context)}, use_bin_type=True)
    return Mutation(TIMER_VB_BASE + t.vb, t.fire_seq, t.reference, OP_TIMER, t.due_ms, doc, None, 0, 0)


class TimerTable:
    """One handler's timer calls: validates them and holds the changes until the caller commits them."""

    def __init__(self, function: str, context_limit: int, call_context: CallContext):
        self.function = function
        self.context_limit = context_limit
        self.in_flight = call_context  # its mutation names a timer's source vBucket and default reference
        self.module: dict[str, Any] = {}  # the handler module's globals (callbacks must live there)
        self.current: list[TimerChange] = []  # made by the call in progress
        self.kept: list[TimerChange] = []  # of calls that returned, not committed yet
        self.lookup: Callable[[str, str], TimerRecord | None] | None = None  # the store's view

    # -- handler-facing ---------------------------------------------------------------------------------

    def create_timer(
        self, callback: Any, when: Any, reference: str | None = None, context: Any = None
    ) -> str:
        """Fire `callback(context)` at or after `when`; returns the reference (generated if None)."""
        name = self._callback_name(callback, "create_timer")
        due_ms = _due_ms(when)
        try:
            text = json.dumps(context, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise TimerError(
                f"create_timer context is not a JSON value ({exc}); pass dicts, lists, strings, numbers"
            ) from None
        size = len(text.encode())
        if size > self.context_limit:
            raise TimerError(
                f"create_timer context is {size} bytes as JSON; timer_context_size is {self.context_limit}; "
                "store the data in a document and pass its key, or raise timer_context_size"
            )
        m = self.in_flight.here().mutation
        source = owner_vb(m.vb) if m is not None else 0
        if reference is None:
            where = f"{m.vb}:{m.seqno}" if m is not None else "deploy"
            reference = f"{self.function}:{where}:{len(self.current)}"
        self._check_reference(reference, "create_timer")
        self.current.append(TimerChange(source, name, reference, vbucket_of(reference), due_ms, text))
        return reference

    def cancel_timer(self, callback: Any, reference: str) -> bool:
        """Cancel the timer (callback, reference); True if there was one to cancel."""
        name = self._callback_name(callback, "cancel_timer")
        self._check_reference(reference, "cancel_timer")
        exists = self._exists(name, reference)
        if exists:
            m = self.in_flight.here().mutation
            source = owner_vb(m.vb) if m is not None else 0
            self.current.append(TimerChange(source, name, reference, vbucket_of(reference), None))
        return exists

    def _exists(self, name: str, reference: str) -> bool:
        for change in reversed(self.current):
            if (change.callback, change.reference) == (name, reference):
                return change.due_ms is not None
        for change in reversed(self._kept_now()):
            if (change.callback, change.reference) == (name, reference):
                return change.due_ms is not None
        return self.lookup is not None and self.lookup(name, reference) is not None

    def _kept_now(self) -> list[TimerChange]:
        return self.kept

    def _callback_name(self, callback: Any, what: str) -> str:
        name = getattr(callback, "__name__", None)
        if not callable(callback) or name is None or self.module.get(name) is not callback:
            raise TimerError(
                f"{what} callback {callback!r} is not a function defined in the handler module; "
                "pass a top-level function, for example create_timer(on_timer, when)"
            )
        return name

    @staticmethod
    def _check_reference(reference: Any, what: str) -> None:
        if not isinstance(reference, str):
            raise TimerError(f"{what} reference {reference!r} is not a string; pass a document key or a name")
        try:
            validate_key(reference)
        except InvalidKeyError as exc:
            raise TimerError(f"{what} reference: {exc}") from None

    # -- runner- and worker-facing ----------------------------------------------------------------------

    def keep(self) -> None:
        self.kept.extend(self.current)
        self.current = []

    def discard(self) -> None:
        self.current = []

    def committed(self, count: int) -> None:
        """The first `count` kept changes are durable (or were fenced): forget them."""
        del self.kept[:count]


class _CallChanges(threading.local):
    def __init__(self) -> None:
        self.current: list[TimerChange] = []


class ConcurrentTimerTable(TimerTable):
    """The timer table of a function whose worker runs several calls at once (`concurrency` > 1): each
    thread's call holds its own changes; kept ones join one list (list.extend is atomic)."""

    def __init__(self, function: str, context_limit: int, call_context: CallContext):
        self._call = _CallChanges()
        super().__init__(function, context_limit, call_context)

    @property  # type: ignore[override]
    def current(self) -> list[TimerChange]:
        return self._call.current

    @current.setter
    def current(self, value: list[TimerChange]) -> None:
        self._call.current = value

    def _kept_now(self) -> list[TimerChange]:
        # A copy: the worker's thread may drop committed changes from the front meanwhile (a checkpoint
        # written beside the calls), and an iterator over the list itself could then skip one. A change
        # dropped before the copy is durable already, so the store's lookup finds it.
        return self.kept[:]


def _due_ms(when: Any) -> int:
    if isinstance(when, datetime):
        seconds = when.timestamp()  # a naive datetime is local time, as datetime.now() gives it
    elif isinstance(when, int | float) and not isinstance(when, bool):
        seconds = float(when)
    else:
        raise TimerError(
            f"create_timer when={when!r} is not a time; pass a datetime or epoch seconds (int or float)"
        )
    if not math.isfinite(seconds):
        raise TimerError(f"create_timer when={when!r} is not a finite time")
    return int(round(seconds * 1000))
