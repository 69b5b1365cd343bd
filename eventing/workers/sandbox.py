"""Sandboxed workers: a function whose isolation is "sandbox" runs its worker core (and so its handler) in
a process of its own that cannot open the data directory, and reaches only its own bindings.

How (see docs/guarantees.md, "Sandboxed handlers", for why this mechanism):

- The worker host (a Ray actor, or the calling process in-process) starts a child process,
  ``python -m eventing.workers.sandbox_child``, with no descriptor but its stdio and one socket to the host,
  a minimal environment (no store credentials) and a private temporary directory as ``TMPDIR``.
- Before it imports anything that could start a thread, the child restricts itself with Landlock
  (``restrict``): reading is allowed everywhere except the data directory, the other sandboxes'
  temporary directories, ``/dev/shm`` and, on a Ray worker, Ray's folders but the code it ships; writing only in its private temporary directory (and the null
  devices); TCP only to the ports of the function's URL bindings, no listening; no abstract Unix sockets
  or signals outside its domain. Landlock holds for the process and every child it starts (exec
  included) and cannot be lifted; it also refuses ptrace and ``/proc/<pid>/fd`` of processes outside it.
- The child runs ``WorkerCore`` with a ``DataAccess`` whose line goes through the socket. The host
  answers each request with ``ScopedService``: only the function's source and binding buckets (reads;
  effects on read-write bindings, under the function's own name), the metadata calls a worker makes for
  its own function, its own application log and window row files. What the child sends is unpickled
  with an allow-list of value classes, so it cannot run code in the host. The function's definition
  reaches the child with its URL bindings' secrets masked: the child's curl asks the host to make a
  request of a binding with credentials (on a thread of the host, so others go on meanwhile).

This module is the host's side: the process handle that starts the child and answers its data requests
while a call runs (`SandboxedCore` for a worker, `SandboxedRunner` for on_deploy, the debugger and dlq
replay, `validate_sandboxed` at deploy time, `open_runner` to pick a runner). Beside it:
sandbox_landlock (the ruleset, ``restrict``), sandbox_child (the child process), sandbox_line (the
framing and the value-only unpickler) and sandbox_scope (``ScopedService``).
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from eventing.storage.state import StateLike, as_state
from eventing.workers.sandbox_landlock import sandbox_unavailable
from eventing.workers.sandbox_line import _error, _raise, _recv, _send, _values
from eventing.workers.sandbox_scope import ScopedService

_SANDBOXES = "eventing-sandboxes"  # under the system temporary folder: one private folder per sandbox


def sandboxes_root() -> str:
    import tempfile

    root = os.path.join(tempfile.gettempdir(), _SANDBOXES)
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root


def ray_private_paths() -> list[str]:
    """On a Ray worker, Ray's folders on this node (every worker's logs, the sockets, spilled objects, other
    sessions), all but the code Ray ships to workers (the session's ``runtime_resources``, which a node
    that cannot see the checkout imports this project from). Empty where this process is not a Ray worker."""
    try:
        node = sys.modules["ray"]._private.worker.global_worker.node  # None in a driver not connected
        temp, session = node.get_temp_dir_path(), node.get_session_dir_path()
        paths = [e.path for e in os.scandir(temp) if e.path != session and not e.is_symlink()]
        paths += [e.path for e in os.scandir(session) if e.name != "runtime_resources" and not e.is_symlink()]
    except (KeyError, AttributeError, OSError):
        return []  # not a Ray process
    return paths


def url_ports(defn: Any) -> list[int]:
    import urllib.parse

    ports = []
    for u in defn.url_bindings:
        split = urllib.parse.urlsplit(u["url"])
        ports.append(split.port or (443 if split.scheme == "https" else 80))
    return ports


class _Sandboxed:
    """A sandboxed child process and the host's end of its line: each method call goes to the child,
    and the child's data requests are answered (scoped by `service`) while it runs."""

    own_process = False

    def _start(self, function: str, defn: Any, service: Any, *, private: list[str]) -> None:
        import json
        import shutil
        import subprocess
        import tempfile

        from eventing.errors import ConfigError

        why = sandbox_unavailable()
        if why:
            raise ConfigError(f"function '{function}' must run sandboxed, but {why}")
        self.service = service
        self._send_lock = threading.Lock()
        self._curl_pool: Any = None
        self._concurrency = max(1, int(getattr(defn, "concurrency", 1) or 1))
        self.tmp = tempfile.mkdtemp(prefix=f"{function}-", dir=sandboxes_root())
        self._rmtree = shutil.rmtree
        self._ended = False
        policy = {"deny": [*private, sandboxes_root(), "/dev/shm", *ray_private_paths()], "writable": [self.tmp],
                  "tcp_ports": url_ports(defn)}
        ours, theirs = socket.socketpair()
        env = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL", "PYTHONPATH") if name in os.environ}
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        env.update({"TMPDIR": self.tmp, "HOME": self.tmp, "PYTHONDONTWRITEBYTECODE": "1"})
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "eventing.workers.sandbox_child", str(theirs.fileno()), json.dumps(policy)],
                stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), env=env, cwd=self.tmp,
            )
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        finally:
            theirs.close()
        self.sock = ours


    def _rpc(self, method: str, args: tuple) -> Any:
        from eventing.workers.executor import WorkerDied

        if self._ended:
            raise WorkerDied("the sandboxed worker process has ended")
        try:
            self._send(("call", method, args))
            while True:
                kind, ident, ok, value = _values(_recv(self.sock))
                if kind == "done":
                    if not ok:
                        _raise(value)
                    return value
                if ok == "curl":  # a request of a URL binding with credentials: on a thread, others go on
                    self._curl_threads().submit(self._answer_later, ident, ok, value)
                    continue
                self._answer(ident, ok, value)
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            self._end()
            if self.own_process:  # a Ray actor ends with its sandbox, as a hung worker's process ends
                os._exit(70)
            raise WorkerDied(f"the sandboxed worker process ended ({exc})") from None

    def _answer(self, ident: Any, method: str, args: Any) -> None:
        try:
            answer = (True, self.service.call(method, *args))
        except Exception as exc:  # noqa: BLE001 - the child's call fails with it
            answer = (False, _error(exc))
        self._send(("ans", ident, *answer))

    def _answer_later(self, ident: Any, method: str, args: Any) -> None:
        try:
            self._answer(ident, method, args)
        except OSError:
            pass  # the sandbox ended meanwhile (a curl answered after its call was abandoned)

    def _send(self, message: tuple) -> None:
        data = pickle.dumps(message, protocol=5)
        with self._send_lock:
            _send(self.sock, data)

    def _curl_threads(self) -> Any:
        if self._curl_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._curl_pool = ThreadPoolExecutor(max_workers=self._concurrency, thread_name_prefix="sandbox-curl")
        return self._curl_pool

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._curl_pool is not None:
            self._curl_pool.shutdown(wait=False, cancel_futures=True)
        try:
            self.sock.close()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.service.backend.close() if hasattr(self.service.backend, "close") else None
            self._rmtree(self.tmp, ignore_errors=True)

    def close(self) -> None:
        if not self._ended:
            try:
                self._rpc("close", ())
            except Exception:  # noqa: BLE001 - ended all the same
                pass
        self._end()


class SandboxedCore(_Sandboxed):
    """The host's stand-in for a WorkerCore running in a sandboxed child."""

    def __init__(self, spec: Any, *, own_process: bool = False):
        from eventing.core.definition import FunctionDefinition
        from eventing.storage.remote import DataAccess
        from eventing.workers.data_service import ServedData

        self.own_process = own_process
        access = DataAccess(spec.location, spec.data_service, key=spec.worker_id)
        store = access.metadata()
        try:
            defn = FunctionDefinition.from_dict(store.get_function(spec.function).definition)
        finally:
            store.close()
        backend: Any = ServedData(access.state) if access.local else spec.data_service.client(spec.worker_id)
        service = ScopedService(spec.function, defn, backend, limit_share=1 / max(1, spec.machines))
        self._start(spec.function, defn, service, private=_private(spec.location))
        self.pid = self._rpc("__init__", (spec.function, spec))

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args: self._rpc(method, args)

class _NoData:
    """The backend of a sandbox that needs no data (deploy-time validation): every request is refused."""

    def call(self, method: str, *args: Any) -> Any:
        from eventing.errors import ConfigError

        raise ConfigError(f"a handler being validated may not call {method}: bindings are not usable at import")


def _private(location: str) -> list[str]:
    """What a sandboxed child may never open: the data directory of a state held in files (a state on a
    server is reached through the host only: the child has no credentials)."""
    from eventing.storage.state import is_server_location

    return [] if is_server_location(location) else [location]


def validate_sandboxed(state: StateLike, defn: Any, source: str) -> None:
    """``eventing.execution.loader.validate_handler`` for `defn` run in a sandboxed child: the handler
    module's top-level code runs there, and a HandlerLoadError comes back as one."""
    sandbox = _Sandboxed()
    sandbox._start(defn.name, defn, ScopedService(defn.name, defn, _NoData()),
                   private=_private(as_state(state).location))
    try:
        sandbox._rpc("validate", (defn.name, source, [b.alias for b in defn.bindings], dict(defn.constants),
                                  defn.window is not None, defn.language))
    finally:
        sandbox.close()


class _HeldTimers:
    """The host's copy of a sandboxed runner's kept timer changes (TimerTable's kept/discard/committed)."""

    def __init__(self) -> None:
        self.kept: list[Any] = []
        self.lookup: Any = None  # the sandboxed process asks the metadata store itself, scoped

    def discard(self) -> None:
        pass  # a call's changes reach the host only once it returned

    def committed(self, count: int) -> None:
        del self.kept[:count]


class SandboxedRunner(_Sandboxed):
    """A function's stored handler loaded in a sandboxed child with its bindings (reads through the scoped
    line), for the callers that run a handler outside a worker: ``on_deploy``, the debugger and ``dlq
    replay``. It stands where a HandlerRunner would for them: a call returns its outcome, and the writes
    and timer changes of a call that returned come back to this process as held writes
    (``take_writes``) and ``timers.kept``, which the caller applies under its own effect marks, as it
    does a HandlerRunner's. The child applies nothing."""

    def __init__(self, state: StateLike, record: Any):
        from eventing.core.definition import FunctionDefinition
        from eventing.core.secrets import mask_definition
        from eventing.workers.data_service import ServedData

        state = as_state(state)
        self.function = record.name
        self.defn = FunctionDefinition.from_dict(record.definition)
        self.state = state
        self.timeout_s = self.defn.execution_timeout.total_seconds()
        self.keyspace = self.defn.source_keyspace.to_meta()
        self.timers = _HeldTimers()
        self._held: list[Any] = []
        self._buckets: dict[str, Any] = {}
        self._start(self.function, self.defn, ScopedService(self.function, self.defn, ServedData(state.location)),
                    private=_private(state.location))
        try:
            self._rpc("__runner__", (self.function, mask_definition(record.definition), record.source))
            self.source = state.open_bucket(self.defn.source_bucket)  # this process's: the debugger pulls
        except BaseException:
            self.close()
            raise

    def _bucket(self, name: str) -> Any:
        if name not in self._buckets:
            self._buckets[name] = self.state.open_bucket(name)
        return self._buckets[name]

    def _returned(self, answer: dict) -> None:
        """Take a returned call's writes and timer changes, each checked against the function's scope."""
        from eventing.errors import ConfigError
        from eventing.execution.runner import HeldWrite
        from metadata import TimerChange

        for bucket, alias, seqno, write in answer.get("writes", ()):
            if not self.service._allowed(bucket, getattr(write, "key", None), write=True) or \
                    bucket not in self.service.writable:
                raise ConfigError(f"function '{self.function}' runs sandboxed and wrote outside its read-write "
                                  f"bindings (bucket {bucket!r})")
            self._held.append(HeldWrite(alias, self._bucket(bucket), int(seqno), write))
        for change in answer.get("timers", ()):
            if not isinstance(change, TimerChange):
                raise ConfigError(f"function '{self.function}' runs sandboxed and sent a timer change that is not one")
            self.timers.kept.append(change)

    def on_deploy(self, reason: str, delay: int) -> tuple[bool, Any]:
        """Run the handler's on_deploy(action): (whether it defines one, the failure or None)."""
        from eventing.execution.runner import Failure

        answer = self._rpc("on_deploy", (reason, delay))
        if not answer["found"]:
            return False, None
        if answer["failure"] is not None:
            return True, Failure(*answer["failure"])
        self._returned(answer)
        return True, None

    def run_once(self, m: Any, *, trace: bool = False) -> tuple[Any, list[dict]]:
        """``eventing.execution.single_call.run_once`` in the child, with the trace events (`trace`) it made."""
        from eventing.execution.single_call import CallOutcome
        from eventing.handler import Meta

        answer = self._rpc("run_once", (tuple(m), self.keyspace, trace))
        meta = answer.pop("meta")
        outcome = CallOutcome(**{k: answer[k] for k in ("status", "kind", "doc", "error", "traceback", "seconds")})
        if isinstance(meta, dict):
            outcome.meta = Meta(*(meta.get(k) for k in Meta.__slots__[:8]))
            outcome.meta.previous = meta.get("previous")
        if outcome.ok:
            self._returned(answer)
        return outcome, list(answer.get("events", ()))

    def take_writes(self) -> list[Any]:
        held, self._held = self._held, []
        return held

    def close(self) -> None:
        super().close()
        for bucket in self._buckets.values():
            bucket.close()
        self._buckets.clear()
        if getattr(self, "source", None) is not None:
            self.source.close()


def open_runner(state: StateLike, function: str, record: Any = None) -> Any:
    """The runner a caller outside a worker runs `function`'s handler with: a SandboxedRunner when its
    effective isolation is "sandbox", else a HandlerRunner in this process."""
    from eventing.core.definition import FunctionDefinition, effective_isolation
    from eventing.execution.runner import HandlerRunner

    state = as_state(state)
    if record is None:
        record = state.metadata.get_function(function)
    if effective_isolation(FunctionDefinition.from_dict(record.definition), record.deployed_by) == "sandbox":
        return SandboxedRunner(state, record)
    return HandlerRunner.open(state, function)
