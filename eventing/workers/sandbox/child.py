"""The sandboxed child process, forked by its host's zygote (zygote.py), runs `_child`: it confines itself
(eventing.workers.sandbox.confine) while it has one thread, then answers
the host's calls over its one socket (`_Line`, which also carries its data requests to the host): a
`WorkerCore` whose data access is that line (`_LineRef`), a handler runner for on_deploy, the debugger and
dlq replay whose writes and timer changes are sent back rather than applied (`_ChildRunner`), or a
handler validation.
"""

from __future__ import annotations

import _signal
import contextlib
import os
import pickle
import socket
import threading
from collections.abc import Callable
from typing import Any

from eventing.errors import EventingError
from eventing.workers.hosting import CORE_CALLS
from eventing.workers.sandbox.confine import confine
from eventing.workers.sandbox.landlock import _PR_SET_PDEATHSIG, _libc
from eventing.workers.sandbox.line import _error, _raise, _recv, _send

# What the host asks of the child's core, by name: a worker core's calls, and a runner's (_ChildRunner: a
# deploy's on_deploy, the debugger's run_once).
_CALLS: dict[str, Callable[[Any], Callable[..., Any]]] = {
    **CORE_CALLS,
    "on_deploy": lambda core: core.on_deploy,
    "run_once": lambda core: core.run_once,
}


# Rows the child's reads ahead ask its host for at a time (a worker on another node asks for 32,000): the
# host reads them from its files at once, and every row held costs each sandboxed worker memory. 16,000: a
# child peaks at 69-70 MB against 94-96 (docs/benchmarks.md); 8,000 saved 8 MB more and cost W1 3 points.
SANDBOX_READ_AHEAD = 16_000

_ALARM = (_signal.SIGALRM,)


class _Line:
    """The child's end: data requests out (from any thread), answers and host calls in (a reader thread)."""

    def __init__(self, sock: socket.socket):
        import queue

        self.sock = sock
        self.calls: queue.Queue = queue.Queue()
        self._answers: dict[int, tuple] = {}
        self._cond = threading.Condition()
        self._lock = threading.Lock()
        self._next = 0
        threading.Thread(target=self._read, name="sandbox-line", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                message = pickle.loads(_recv(self.sock))  # from the host, which is trusted
                if message[0] == "call":
                    self.calls.put(message[1:])
                else:
                    with self._cond:
                        self._answers[message[1]] = message[2:]
                        self._cond.notify_all()
        except Exception:  # noqa: BLE001 - the host is gone: so is this process
            os._exit(0)

    def send(self, message: tuple) -> None:
        data = pickle.dumps(message, protocol=5)
        # A SIGALRM (execution_timeout) raising mid-write would cut a frame: hold it until the frame is out.
        # (_signal's own call: signal.pthread_sigmask turns each answer into a set of enums, ~5 us a send.)
        masked = threading.current_thread() is threading.main_thread()
        if masked:
            _signal.pthread_sigmask(_signal.SIG_BLOCK, _ALARM)
        try:
            with self._lock:
                _send(self.sock, data)
        finally:
            if masked:
                _signal.pthread_sigmask(_signal.SIG_UNBLOCK, _ALARM)

    def call(self, method: str, *args: Any) -> Any:
        # "wait": the worker's own thread waits for the answer and asks nothing meanwhile (its flush of
        # effects: the host may apply them on its own thread, eventing.workers.sandbox.host).
        main = threading.current_thread() is threading.main_thread()
        return self._submit("wait" if main else "req", method, args)()

    def submit(self, method: str, *args: Any) -> Callable[[], Any]:
        return self._submit("req", method, args)

    def submit_ahead(self, method: str, *args: Any) -> Callable[[], Any]:
        """A request whose answer is wanted by the host's next call (a caught-up step's read of the rows to
        come): the host answers it just before it makes that call, with what has been written by then,
        instead of at once with what will be stale. Waited for sooner, it is asked for now."""
        return self._submit("ahead", method, args)

    def submit_tail(self, method: str, *args: Any) -> Callable[[], Any]:
        """A step's last flush of effects: the host applies it before it reads the rest of the step (so
        the step's end finds it durable), while the worker ends its step instead of waiting for it."""
        return self._submit("tail", method, args)

    def _submit(self, kind: str, method: str, args: tuple) -> Callable[[], Any]:
        with self._lock:
            self._next += 1
            ident = self._next
        self.send((kind, ident, method, args))

        def wait() -> Any:
            with self._cond:
                if kind == "ahead" and ident not in self._answers:
                    self.send(("now", ident, None, None))
                while ident not in self._answers:
                    self._cond.wait()
                ok, value = self._answers.pop(ident)
            if not ok:
                _raise(value)
            return value

        return wait


class _LineRef:
    """Stands where a DataServiceRef would: every worker line is the one socket to the host."""

    remote_only = True  # never open the files, even where they seem visible

    def __init__(self, line: _Line, location: str):
        self.line, self.location, self.node_id = line, location, ""

    def client(self, key: str) -> _Line:
        return self.line


class _LiveEvents(list):
    """A debugged call's trace events, each sent to the debugger (through the host) as it is made."""

    def __init__(self, line: _Line):
        super().__init__()
        self.line = line

    def append(self, event: Any) -> None:
        self.line.call("debug_event", event)


class _DebuggerStream:
    """pdb's input and output in the child: a line read from, or text written to, the debugger's terminal
    through the host (eventing.workers.sandbox.host.SandboxedRunner), which holds it; the child has none."""

    encoding = "utf-8"

    def __init__(self, line: _Line):
        self.line = line
        self._out: list[str] = []

    def readline(self, size: int = -1) -> str:
        self.flush()
        return str(self.line.call("debug_input"))

    def write(self, text: str) -> int:
        self._out.append(text)
        return len(text)

    def flush(self) -> None:
        if self._out:
            text, self._out = "".join(self._out), []
            self.line.call("debug_output", text)

    def isatty(self) -> bool:
        return False


class _ChildRunner:
    """The sandboxed process's side of a SandboxedRunner: a HandlerRunner whose buckets, timers lookup
    and application log go through the line; writes and timer changes are sent back, never applied."""

    def __init__(self, line: _Line, function: str, definition: dict, source_code: str):
        from eventing.core.definition import FunctionDefinition
        from eventing.execution.app_log import RemoteAppLog
        from eventing.execution.runner import HandlerRunner
        from eventing.storage.remote import RemoteBucket, RemoteMetadataStore

        defn = FunctionDefinition.from_dict(definition)
        store = RemoteMetadataStore(line)
        app_log = RemoteAppLog(
            lambda lines: line.submit(
                "app_log", function, lines, defn.app_log_max_size, defn.app_log_max_files
            )
        )
        self.runner = HandlerRunner(
            function,
            defn,
            source_code,
            RemoteBucket(line, defn.source_bucket),
            lambda name: RemoteBucket(line, name),
            app_log,
        )
        self.runner.timers.lookup = lambda callback, reference: store.get_timer(function, callback, reference)
        self.app_log = app_log
        self.line = line

    def _returned(self) -> dict:
        runner = self.runner
        writes = [(h.bucket.name, h.alias, h.seqno, h.write) for h in runner.take_writes()]
        timers = list(runner.timers.kept)
        runner.timers.committed(len(timers))
        self.app_log.flush()  # the call's log lines are on disk when the caller reports it
        return {"writes": writes, "timers": timers}

    def on_deploy(self, reason: str, delay: int) -> dict:
        from eventing.core.mutation import OP_UPDATE, Mutation
        from eventing.execution.runner import HandlerCall
        from eventing.handler import DeployAction

        runner = self.runner
        fn = runner.module.__dict__.get("on_deploy")
        if fn is None:
            return {"found": False}
        m = Mutation(0, 1, "", OP_UPDATE, 0, None, None, 0, 0)
        failure = runner.call(
            m, HandlerCall("on_update", fn, (DeployAction(reason, delay),), None), timeout_s=runner.timeout_s
        )
        if failure is not None:
            return {
                "found": True,
                "failure": (
                    failure.status,
                    failure.kind,
                    failure.error,
                    failure.traceback,
                    failure.attempts,
                    failure.first_failed_at,
                ),
            }
        return {"found": True, "failure": None, **self._returned()}

    def run_once(
        self, fields: tuple, keyspace: dict, trace: bool, under_pdb: bool = False, live: bool = False
    ) -> dict:
        import copy

        from eventing import handler as handler_api
        from eventing.core.mutation import Mutation
        from eventing.execution.single_call import EventSink, pdb_runner, prepare_call, run_once

        # live: each trace event is sent to the debugger as it happens (a long call shows its progress).
        runner, events = self.runner, (_LiveEvents(self.line) if live else [])
        m = Mutation(*fields)
        runner.keyspace = keyspace
        prepared = prepare_call(runner, m)
        first = prepared[0]
        events.append(
            {
                "event": "call",
                "kind": first.kind or None,
                "doc": first.doc,
                "meta": first.meta.to_dict() if first.meta else None,
            }
        )
        previous_sink = handler_api.log.sink
        if trace:
            runner.set_tracer(
                lambda op, alias, key, value: events.append(
                    {"event": op, "alias": alias, "key": key, "value": copy.deepcopy(value)}
                )
            )
            handler_api.log.sink = EventSink(events.append)
        # Under pdb, its commands and prompts cross the line to the debugger's terminal (the host's streams).
        streams = (_DebuggerStream(self.line), _DebuggerStream(self.line)) if under_pdb else ()
        invoke = pdb_runner(*streams) if streams else None
        try:
            outcome = run_once(runner, m, invoke=invoke, prepared=prepared)
        finally:
            handler_api.log.sink = previous_sink
            runner.set_tracer(None)
            for stream in streams:  # what pdb wrote last (a quit's newline) reaches the terminal too
                with contextlib.suppress(Exception):  # best effort: the call's outcome is what counts
                    stream.flush()
        answer = {
            "status": outcome.status,
            "kind": outcome.kind,
            "doc": outcome.doc,
            "meta": outcome.meta.to_dict() if outcome.meta else None,
            "error": outcome.error,
            "traceback": outcome.traceback,
            "seconds": outcome.seconds,
            "events": [] if live else events,
        }
        if outcome.ok:
            answer.update(self._returned())
        return answer

    def close(self) -> None:
        self.runner.close()


def _child(fd: int, policy: dict) -> None:
    # SIGKILL when its zygote goes, which goes with the host (kill -9 of a worker); a line closed ends it too.
    _libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)
    sock = socket.socket(fileno=fd)
    try:
        confine(policy)
    except OSError as exc:
        _send(
            sock, pickle.dumps(("done", None, False, ("ConfigError", f"cannot sandbox this process: {exc}")))
        )
        return
    from dataclasses import replace

    from eventing.execution import refusals

    refusals.SANDBOXED = True  # a handler's PermissionError now comes from the sandbox: its error says so
    line = _Line(sock)
    from eventing.execution.curl import through_host

    # The child has no URL binding secret (its definition comes masked): the host makes those requests.
    through_host(lambda *request: line.call("curl", *request))
    core: Any = None
    while True:
        method, args = line.calls.get()
        try:
            if method == "__init__":
                from eventing.workers.worker import WorkerCore

                function, spec = args
                spec = replace(spec, data_service=_LineRef(line, spec.location))
                core = WorkerCore(spec, recycle_on_hang=True, notes_fd=policy.get("notes_fd"))
                core.reader.read_ahead = SANDBOX_READ_AHEAD
                if core.calls is None:  # a pool applies its writes beside its calls already
                    from eventing.workers.handover import HandOver

                    core.handover = HandOver(core)  # the host applies its writes beside its next batch
                import numpy  # noqa: F401 - the read ahead's decoding (rows_of_columns): at start, not in a step

                result: tuple = (True, os.getpid())
            elif method == "__runner__":
                core = _ChildRunner(line, *args)
                result = (True, os.getpid())
            elif method == "validate":
                from eventing.execution.loader import validate_handler

                function, source, aliases, constants, windowed, language = args
                validate_handler(function, source, aliases, constants, windowed=windowed, language=language)
                result = (True, None)
            elif method == "close" and core is None:
                result = (True, None)
            else:
                served = _CALLS.get(method)
                if served is None:
                    raise EventingError(f"{method!r} is not a call a sandboxed worker serves")
                result = (True, served(core)(*args))
        except Exception as exc:  # noqa: BLE001 - answered to the host, which raises it
            result = (False, _error(exc))
        line.send(("done", None, *result))
        if method == "close":
            return
