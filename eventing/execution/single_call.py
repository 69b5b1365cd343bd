"""One call of a stored handler on one mutation, in the foreground, as a worker makes it (same checks,
bindings and execution timeout; no retries): what the debugger runs, here and inside a sandboxed child
(eventing.workers.sandbox), the call under pdb (`pdb_runner`), and the log sink that turns the handler's
log lines into trace events."""

from __future__ import annotations

import bdb
import pdb
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from eventing.core.mutation import Mutation
from eventing.execution.runner import HandlerCall, HandlerQuit, HandlerRunner, Invoke, Rejection
from eventing.handler import Meta

Status = Literal[
    "ok",
    "no_handler",
    "filtered",
    "error",
    "timeout",
    "undecodable",
    "oversize",
    "quit",
    "timer_error",
    "expired",
]


@dataclass
class CallOutcome:
    """What one foreground call of the handler did."""

    status: Status
    kind: str = ""  # on_update | on_delete; "" when no handler was called
    doc: Any = None
    meta: Meta | None = None
    error: str = ""
    traceback: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """The handler returned (or there is none for this operation, which a worker also counts as done)."""
        return self.status in ("ok", "no_handler", "filtered")


def prepare_call(runner: HandlerRunner, m: Mutation) -> tuple[CallOutcome, HandlerCall | None]:
    """The runner's decision for `m` as an outcome so far, and the call to make (None: no handler call)."""
    call = runner.prepare(m)
    if isinstance(call, Rejection):
        return CallOutcome(call.status, error=call.error), None
    meta = call.args[0] if call.kind == "on_delete" else (call.args[1] if len(call.args) > 1 else None)
    if call.fn is None:  # a window-only function: no handler runs here
        return CallOutcome("no_handler", call.kind, doc=call.doc), None
    return CallOutcome("ok", call.kind, doc=call.doc, meta=meta), call


def run_once(
    runner: HandlerRunner,
    m: Mutation,
    *,
    invoke: Invoke | None = None,
    prepared: tuple[CallOutcome, HandlerCall | None] | None = None,
) -> CallOutcome:
    """Run the handler on `m` once, as a worker would (same checks, bindings and execution timeout; no
    retries), keeping the writes of a call that returned for `runner.take_writes()`. `invoke(fn, *args)`
    replaces the plain call (the debugger passes pdb's); under pdb there is no timeout."""
    outcome, call = prepared or prepare_call(runner, m)
    if call is None:
        return outcome
    start = time.perf_counter()
    failure = runner.call(m, call, timeout_s=None if invoke else runner.timeout_s, invoke=invoke)
    outcome.seconds = time.perf_counter() - start
    if failure is not None:
        outcome.status = failure.status
        outcome.error = failure.error
        outcome.traceback = failure.traceback
    return outcome


class EventSink(list):
    """The handler log's sink: each line becomes a trace event, in order with binding reads and writes."""

    def __init__(self, emit: Callable[[dict], None]):
        super().__init__()
        self._emit = emit

    def append(self, line: str) -> None:
        super().append(line)
        self._emit({"event": "log", "line": line})


class _QuitAwarePdb(pdb.Pdb):
    """pdb whose `runcall` reports a quit: Bdb.runcall swallows BdbQuit, so a quit looked like a return."""

    quit_requested = False

    def set_quit(self) -> None:
        self.quit_requested = True
        super().set_quit()


def pdb_runner(stdout: Any = None, stdin: Any = None) -> Invoke:
    """An invoke that calls the handler under pdb (commands from `stdin`, prompts on `stdout`: text streams
    with readline, or write and flush; default the terminal's). A sandboxed child passes streams that cross
    its line to the debugger's terminal."""

    def run(fn: Callable[..., Any], *args: Any) -> Any:
        debugger = _QuitAwarePdb(stdin=stdin, stdout=stdout)
        try:
            result = debugger.runcall(fn, *args)
        except bdb.BdbQuit:
            raise HandlerQuit() from None
        if debugger.quit_requested:
            raise HandlerQuit()
        return result

    return run
