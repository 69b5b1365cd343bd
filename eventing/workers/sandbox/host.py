"""Sandboxed workers: a function whose isolation is "sandbox" runs its worker core (and so its handler) in
a process of its own that cannot open the data directory, and reaches only its own bindings.

How (see docs/guarantees.md, "Sandboxed handlers", for why this mechanism):

- The worker host (a Ray actor, or the calling process in-process) has its zygote fork a child process
  (zygote.py: a process per host that has imported the worker's modules; the child runs
  eventing.workers.sandbox.child), with no descriptor but its stdio and one socket to the host,
  a minimal environment (no store credentials), a private folder as ``TMPDIR`` and ``HOME`` (links in it to
  the project's packages are its import path) and a policy: the project's package folders, the folders
  no read may reach (the data directory, a checkout, the home folder, Ray's folder, the other sandboxes),
  the URL bindings' ports and a memory limit (`memory_mb`).
- Before it imports anything that could start a thread, the child confines itself (confine.py): no
  capabilities, limits on memory and open files, Landlock (reads by allow-list, writes in its folder, TCP
  to the URL bindings' ports, nothing executable) and a seccomp filter (no process, no Unix socket, no
  signal to another process). Both hold for every thread and cannot be lifted.
- The child runs ``WorkerCore`` with a ``DataAccess`` whose line goes through the socket. The host
  answers each request with ``ScopedService``: only the function's source and binding buckets (reads;
  effects on read-write bindings, under the function's own name), the metadata calls a worker makes for
  its own function, its own application log and window row files. What the child sends is unpickled
  with an allow-list of value classes, so it cannot run code in the host. The function's definition
  reaches the child with its URL bindings' secrets masked: the child's curl asks the host to make a
  request of a binding with credentials (on a thread of the host, so others go on meanwhile).
- The host holds a lock beside the private folder while it lives; the folder goes when the sandbox ends
  (a worker's stop ends it), and one whose host was killed goes with the next sandbox started or ended
  on the machine (`sweep_sandboxes`).

This module is the host's side: the process handle that starts the child and answers its data requests
while a call runs (`SandboxedCore` for a worker, `SandboxedRunner` for on_deploy, the debugger and dlq
replay, `validate_sandboxed` at deploy time, `open_runner` to pick a runner). Beside it in this package:
confine, landlock and seccomp (what the child does to itself), child (the child process), zygote and
zygote_process (the process children are forked from), folders (their private folders and environment),
line (the framing and the value-only unpickler) and scope (``ScopedService``).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from eventing.storage.state import StateLike, as_state
from eventing.workers.sandbox.default import granted_writes
from eventing.workers.sandbox.disk_watch import WATCH, disk_limit_bytes, over_disk
from eventing.workers.sandbox.folders import (
    child_env,
    claim_folder,
    package_view,
    project_packages,
    sandboxes_root,
    sweep_sandboxes,
)
from eventing.workers.sandbox.landlock import sandbox_unavailable
from eventing.workers.sandbox.line import _error, _raise, _recv, _send, _values
from eventing.workers.sandbox.scope import ScopedService
from eventing.workers.sandbox.zygote import fork_child

MEMORY_MB = 1024  # a sandboxed process's memory (RLIMIT_DATA); a JavaScript function's isolates besides
# What RLIMIT_DATA counts of a V8 isolate besides its heap: V8 reserves its code range writable and executable
# (512 MiB on x86_64, 128 MiB on arm64), untouched until code is compiled into it.
V8_CODE_RANGE_MB = 512


def ray_folders() -> list[str]:
    """On a Ray worker, Ray's folder on this node (every worker's logs, the raylet's sockets, spilled
    objects, every session). Empty where this process is not a Ray worker. The code Ray ships to workers
    stays importable (a folder on the import path beneath it is allowed)."""
    try:
        node = sys.modules["ray"]._private.worker.global_worker.node  # None in a driver not connected
        return [node.get_temp_dir_path()]
    except (KeyError, AttributeError, OSError):
        return []  # not a Ray process


def url_ports(defn: Any) -> list[int]:
    import urllib.parse

    ports = []
    for u in defn.url_bindings:
        split = urllib.parse.urlsplit(u["url"])
        ports.append(split.port or (443 if split.scheme == "https" else 80))
    return ports


def memory_mb(defn: Any) -> int:
    """A sandboxed process's memory limit: MEMORY_MB, and for a JavaScript function, per V8 isolate (one
    per pool thread and the main thread's), its code range and twice js_heap_limit_mb (the heap and its
    ArrayBuffers, which eventing.execution.javascript stops a call at)."""
    if getattr(defn, "language", "python") == "javascript":
        return MEMORY_MB + (defn.concurrency + 1) * (V8_CODE_RANGE_MB + 2 * defn.js_heap_limit_mb)
    return MEMORY_MB


class _Sandboxed:
    """A sandboxed child process and the host's end of its line: each method call goes to the child,
    and the child's data requests are answered (scoped by `service`) while it runs."""

    own_process = False
    _tail_failed: Any = None  # the error of a step's last writes that failed to apply (`_note_tail`)
    _disk, _disk_error = None, None  # its key in the disk watch, and why that ended the child

    def _start(
        self,
        function: str,
        defn: Any,
        service: Any,
        *,
        private: list[str],
        notes_fd: int | None = None,
        writable: tuple[str, ...] = (),
    ) -> None:
        import shutil
        import site

        from eventing.errors import ConfigError

        why = sandbox_unavailable()
        if why:
            raise ConfigError(f"function '{function}' must run sandboxed, but {why}")
        disk_limit = disk_limit_bytes()  # a bad EVENTING_SANDBOX_DISK_MB: refused before anything is made
        self.service = service
        self._send_lock = threading.Lock()
        self._curl_pool: Any = None
        self._writer_pool: Any = None  # applies the child's effects, in the order they came (_writer)
        self._concurrency = max(1, int(getattr(defn, "concurrency", 1) or 1))
        self._ended = False
        # Effects handed to the writer thread (counted by this thread) and applied (by the writer's).
        self._handed = self._applied = 0
        self._held: list[tuple] = []  # requests answered just before the next call (`_answer_held`)
        self.held_answered = 0
        self._rmtree = shutil.rmtree
        self.tmp, self._lock = claim_folder(f"{function}-")
        ours, theirs = socket.socketpair()
        try:
            root, packages = project_packages()
            site_dirs = {os.path.realpath(p) for p in (*site.getsitepackages(), site.getusersitepackages())}
            avoid = [*private, sandboxes_root(), os.path.expanduser("~"), *ray_folders()]
            if os.path.realpath(root) not in site_dirs:
                avoid.append(
                    root
                )  # a checkout: its packages are read, nothing else in it (a data directory...)
            policy = {
                "code": packages,
                "avoid": avoid,
                "writable": [self.tmp, *_granted(function, writable, avoid)],
                "tcp_ports": url_ports(defn),
                "memory_mb": memory_mb(defn),
                "notes_fd": notes_fd,
            }
            env = child_env(self.tmp, package_view(self.tmp, packages), root)
            fds = [theirs.fileno()] if notes_fd is None else [theirs.fileno(), notes_fd]
            self.proc = fork_child(policy, env, self.tmp, fds)
        except BaseException:
            ours.close()
            self._remove()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self._disk = WATCH.watch(self.tmp, self.proc.pid, disk_limit, lambda n: self._over_disk(function, n))

    def _over_disk(self, function: str, used: int) -> None:
        self._disk_error = over_disk(function, used)
        self.proc.kill()

    def _remove(self) -> None:
        """Remove this sandbox's folder and lock, then any folder a host that ended left behind."""
        self._rmtree(self.tmp, ignore_errors=True)
        try:
            os.unlink(self.tmp + ".lock")
        except OSError:
            pass
        os.close(self._lock)
        try:
            sweep_sandboxes()
        except OSError:
            pass

    def _rpc(self, method: str, args: tuple) -> Any:
        from eventing.workers.worker_died import WorkerDied

        if self._ended:
            raise WorkerDied("the sandboxed worker process has ended")
        finished = False  # the child answered the call: an error raised after that leaves the line sound
        try:
            self._answer_held()
            self._send(("call", method, args))
            tail_handed = False
            while True:
                kind, ident, ok, value = _values(_recv(self.sock))
                if kind == "done":
                    finished = True
                    if tail_handed:  # the step's last writes are durable when it reports
                        self._writer().submit(int).result()
                    failed, self._tail_failed = self._tail_failed, None
                    if not ok:
                        _raise(value)
                    if failed is not None:
                        # The child takes that answer now and rewinds to its checkpoint: the step fails, once.
                        self._rpc("flush_effects", ())
                        _raise(failed)
                    return value
                if kind == "ahead":  # answered before the next call (the child's _Line.submit_ahead)
                    self._held.append((ident, ok, value))
                    continue
                if kind == "now":  # a request held is waited for after all
                    self._answer_held(ident)
                    continue
                if ok == "curl":  # a request of a URL binding with credentials: on a thread, others go on
                    self._curl_threads().submit(self._answer_later, ident, ok, value)
                    continue
                if (
                    ok == "bucket"
                    and isinstance(value, tuple)
                    and value[1:2] == ("apply_effects",)
                    and (kind not in ("wait", "tail") or self._handed != self._applied)
                ):
                    # Writes handed over (eventing.workers.handover): applied while the child goes on. Those
                    # the child's own thread waits for (a flush), or sent as its step ends (a tail), are
                    # applied here, one thread hand-off less on a write's way to its effect, unless others
                    # are still being applied (in order).
                    tail_handed = tail_handed or kind == "tail"
                    self._handed += 1
                    self._writer().submit(self._apply_later, ident, ok, value, kind == "tail")
                    continue
                answer = self._answer(ident, ok, value)
                if kind == "tail":
                    self._note_tail(answer)
        except KeyboardInterrupt:  # Ctrl-C mid-call (a debug session): the child's call is abandoned
            self._end()
            raise
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            self._end()
            if self.own_process:  # a Ray actor ends with its sandbox, as a hung worker's process ends
                print(self._disk_error or "", file=sys.stderr, flush=True)  # why, in the worker's log
                os._exit(70)
            raise WorkerDied(self._disk_error or f"the sandboxed worker process ended ({exc})") from None
        except Exception:
            if not finished:  # mid-call, the child waits for an answer it will never get: end it
                self._end()
            raise

    def _answer_held(self, ident: Any = None) -> None:
        """Answer the requests held for the next call (all of them, or the one `ident` names)."""
        if ident is not None:
            answering = [r for r in self._held if r[0] == ident]
            self._held = [r for r in self._held if r[0] != ident]
        else:
            answering, self._held = self._held, []
            self.held_answered += len(answering)
        for request in answering:
            self._send(("ans", *self._answer_ahead(*request)))

    def _answer_ahead(self, ident: Any, method: str, args: Any) -> tuple:
        """A request held for the next call, answered now: (ident, ok, value)."""
        return (ident, *self._served(method, args))

    def _answer(self, ident: Any, method: str, args: Any) -> tuple[bool, Any]:
        answer = self._served(method, args)
        self._send(("ans", ident, *answer))
        return answer

    def _served(self, method: str, args: Any) -> tuple[bool, Any]:
        try:
            return True, self.service.call(method, *args)
        except Exception as exc:  # noqa: BLE001 - the child's call fails with it
            return False, _error(exc)

    def _answer_later(self, ident: Any, method: str, args: Any) -> tuple[bool, Any] | None:
        try:
            return self._answer(ident, method, args)
        except OSError:
            return None  # the sandbox ended meanwhile (a curl answered after its call was abandoned)

    def _send(self, message: tuple) -> None:
        data = pickle.dumps(message, protocol=5)
        with self._send_lock:
            _send(self.sock, data)

    def _apply_later(self, ident: Any, method: str, args: Any, tail: bool = False) -> None:
        try:
            answer = self._answer_later(ident, method, args)
            if tail:
                self._note_tail(answer)
        finally:
            self._applied += 1

    def _note_tail(self, answer: tuple[bool, Any] | None) -> None:
        """A step's last writes that failed to apply: the step fails with it (its report would say the
        writes are durable)."""
        if answer is not None and not answer[0]:
            self._tail_failed = answer[1]

    def _curl_threads(self) -> Any:
        if self._curl_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._curl_pool = ThreadPoolExecutor(
                max_workers=self._concurrency, thread_name_prefix="sandbox-curl"
            )
        return self._curl_pool

    def _writer(self) -> Any:
        """One thread that applies the child's effects, one request after the other: the child hands its
        writes over and handles its next batch meanwhile; it waits for them before any checkpoint."""
        if self._writer_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._writer_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-effects")
        return self._writer_pool

    def _end(self) -> None:
        try:
            self._end_child()
        finally:
            self._close_backend()

    def _end_child(self) -> None:
        """End the child and remove its folder; the host's own connections (`_close_backend`) stay."""
        if self._ended:
            return
        self._ended = True
        WATCH.forget(self._disk)  # first: the watcher then never signals a pid waited for below
        if self._curl_pool is not None:
            self._curl_pool.shutdown(wait=False, cancel_futures=True)
        if self._writer_pool is not None:  # effects not started are dropped (no checkpoint covers them)
            self._writer_pool.shutdown(wait=True, cancel_futures=True)
        try:
            self.sock.close()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self._remove()

    def _close_backend(self) -> None:
        """Close the host's connections to the function's buckets and store (once). Closing the last
        connection to a bucket file that was written moves its WAL into the file (0.3-0.4 s for W3's output
        at a run's end), so a stopped worker leaves it to a later close, as an unsandboxed one does."""
        backend, self.service.backend = self.service.backend, None
        if backend is not None and hasattr(backend, "close"):
            backend.close()

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
            record = store.get_function(spec.function)
            defn = FunctionDefinition.from_dict(record.definition)
        finally:
            store.close()
        from eventing.workers.crash_guard import open_notes_file

        backend: Any = ServedData(access.state) if access.local else spec.data_service.client(spec.worker_id)
        # The worker's call notes (eventing.workers.crash_guard): the child cannot open the data directory.
        notes_fd = open_notes_file(
            spec.location, spec.function, spec.worker_id, access.state.directory if access.local else None
        )
        try:
            service = ScopedService(spec.function, defn, backend, limit_share=1 / max(1, spec.machines))
            self._start(
                spec.function,
                defn,
                service,
                private=_private(spec.location),
                notes_fd=notes_fd,
                writable=granted_writes(defn, record.deployed_by),
            )
        finally:
            if notes_fd is not None:
                os.close(notes_fd)  # the child has its own

        # The child cannot listen for writes (no Unix socket, no credentials): its host waits for them, in
        # a step whose child found nothing to do (`step`), as an unsandboxed worker waits in its own step.
        self._owned: set[int] = set(spec.vbuckets)
        self.waiter: Any = None
        # The owned vBuckets' high seqnos at the last look made for the child (`_answer_ahead`), when the
        # next look at all of them is due, and which vBuckets the waiter announced since.
        self._highs: list[int] | None = None
        self._full_due = 0.0
        self._announced: set[int] | None = None
        try:
            # Not the data service's actor handle of a node without the data directory: the child is no
            # Ray process (it could not unpickle one) and asks its host instead.
            self.pid = self._rpc("__init__", (spec.function, dataclasses.replace(spec, data_service=None)))
            if spec.wake_address and access.local:
                from eventing.workers.write_waiter import open_waiter

                self.waiter = open_waiter(access.state, spec.wake_address, defn.source_bucket, self._owned)
        except BaseException:
            self.close()
            raise

    def step(self, budget: int | None = None, idle_wait_s: float = 0.0) -> Any:
        """The child's step; with `idle_wait_s` and a waiter, a step that left the child caught up waits up
        to that long (from its start) for a write to its vBuckets and steps the child again at once, as
        WorkerCore.step does with its own waiter: one call from the service per wait, not one per write."""
        waiter = self.waiter
        if waiter is None or idle_wait_s <= 0:
            return self._rpc("step", (budget, 0.0))
        ends = time.monotonic() + idle_wait_s
        waiter.drain()  # every write notified so far is seen by the child's first look
        waiter.take_woken()
        report = self._rpc("step", (budget, 0.0))
        while report.caught_up and not report.fenced:
            left = ends - time.monotonic()
            if left <= 0:
                break
            report.waited = True
            if not waiter.wait(left):
                break
            self._announced = waiter.take_woken()
            report = _merged(report, self._rpc("step", (budget, 0.0)))
        return report

    def _answer_ahead(self, ident: Any, method: str, args: Any) -> tuple:
        """The read a caught-up step asked for as it ended (RemoteBucket.read_changed), made as the next step
        is called: at the owned vBuckets' high seqnos, or, after a wait whose waiter named the vBuckets
        written (a server's notifications), at those alone, the others' kept from the last look (as
        eventing.workers.looks does for an unsandboxed worker: a look at every owned vBucket at least every
        FULL_LOOK_S, for a write whose notification was lost)."""
        if method != "read_changed" or len(args) != 3:
            return super()._answer_ahead(ident, method, args)
        from eventing.workers.looks import FULL_LOOK_S
        from sharding import vbucket_spans

        name, positions, limit = args
        announced, self._announced = self._announced, None
        highs = self._highs
        if announced and highs is not None and time.monotonic() < self._full_due:
            positions = [(vb, at) for vb, at in positions if vb in announced]
            ok, value = self._served(method, (name, positions, limit, vbucket_spans(announced)))
            if ok:
                blob, found, runs = value
                highs = list(highs)
                for vb in announced:
                    highs[vb] = found[vb]
                self._highs, value = highs, (blob, highs, runs)
            return ident, ok, value
        ok, value = self._served(method, (name, positions, limit, vbucket_spans(self._owned)))
        if ok:
            self._highs, self._full_due = value[1], time.monotonic() + FULL_LOOK_S
        return ident, ok, value

    def assign_vbuckets(self, vbuckets: Any) -> Any:
        vbs = list(vbuckets)
        answer = self._rpc("assign_vbuckets", (vbs,))
        self._owned.update(vbs)
        self._highs = None
        return answer

    def revoke_vbuckets(self, vbuckets: Any) -> Any:
        vbs = list(vbuckets)
        answer = self._rpc("revoke_vbuckets", (vbs,))
        self._owned.difference_update(vbs)
        self._highs = None
        return answer

    def _close_backend(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter.close()
        super()._close_backend()

    def stop(self) -> Any:
        """The worker's last call (it checkpoints and releases its vBuckets): the sandbox ends with it, so
        its process and folder are gone before the host is ended (Ray ends a stopped worker's process with
        SIGKILL, which leaves nothing to clean up after). The host's own connections stay until close()."""
        try:
            return self._rpc("stop", ())
        finally:
            if not self._ended:
                try:
                    self._rpc("close", ())
                except Exception:  # noqa: BLE001 - ended all the same
                    pass
            # The child and its folder go now; the host's connections with close() (a kept or shared
            # process, the in-process executor) or with the process (Ray ends it), as an unsandboxed
            # worker's do: their close checkpoints a written bucket's WAL, which is no part of a stop.
            self._end_child()

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args: self._rpc(method, args)


def _merged(first: Any, then: Any) -> Any:
    """One report for two steps of a child in a row (`SandboxedCore.step`): counts added, the state the
    second left."""
    then.handled += first.handled
    then.timers_fired += first.timers_fired
    then.fenced = sorted({*first.fenced, *then.fenced})
    if first.first_handled_at and (
        not then.first_handled_at or first.first_handled_at < then.first_handled_at
    ):
        then.first_handled_at = first.first_handled_at
    then.waited = True
    return then


class _NoData:
    """The backend of a sandbox that needs no data (deploy-time validation): every request is refused."""

    def call(self, method: str, *args: Any) -> Any:
        from eventing.errors import ConfigError

        raise ConfigError(
            f"a handler being validated may not call {method}: bindings are not usable at import"
        )


def _granted(function: str, paths: tuple[str, ...], avoid: list[str]) -> list[str]:
    """`paths` resolved, each checked: it exists, and it neither lies in nor holds a folder the sandbox
    keeps closed (the data directory, the checkout, the home folder, Ray's, the other sandboxes)."""
    from eventing.errors import ConfigError

    out = []
    for path in paths:
        real = os.path.realpath(path)
        if not os.path.exists(real):
            raise ConfigError(
                f"sandbox_writable of function '{function}' names {path}, which does not exist; create it "
                "(the sandbox opens existing folders and files only)"
            )
        for closed in avoid:
            shut = os.path.realpath(closed)
            if (
                real == shut
                or real.startswith(shut.rstrip("/") + "/")
                or shut.startswith(real.rstrip("/") + "/")
            ):
                raise ConfigError(
                    f"sandbox_writable of function '{function}' names {path}, which would open {closed} to "
                    "its handler; name a folder outside it"
                )
        out.append(real)
    return out


def _private(location: str) -> list[str]:
    """What a sandboxed child may never open: the data directory of a state held in files (a state on a
    server is reached through the host only: the child has no credentials)."""
    from eventing.storage.state import is_server_location

    return [] if is_server_location(location) else [location]


def validate_sandboxed(state: StateLike, defn: Any, source: str, writable: tuple[str, ...] = ()) -> None:
    """``eventing.execution.loader.validate_handler`` for `defn` run in a sandboxed child: the handler
    module's top-level code runs there, and a HandlerLoadError comes back as one. `writable`
    (granted_writes) is checked as a worker's sandbox will check it."""
    sandbox = _Sandboxed()
    sandbox._start(
        defn.name,
        defn,
        ScopedService(defn.name, defn, _NoData()),
        private=_private(as_state(state).location),
        writable=writable,
    )
    try:
        sandbox._rpc(
            "validate",
            (
                defn.name,
                source,
                [b.alias for b in defn.bindings],
                dict(defn.constants),
                defn.window is not None,
                defn.language,
            ),
        )
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
        self._pdb_io: tuple[Any, Any] | None = None  # the debugger's streams while a call runs under pdb
        self._on_event: Callable[[dict], None] | None = None  # the debugger's, while a traced call runs
        self._start(
            self.function,
            self.defn,
            ScopedService(self.function, self.defn, ServedData(state.location)),
            private=_private(state.location),
            writable=granted_writes(self.defn, record.deployed_by),
        )
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
            if (
                not self.service._allowed(bucket, getattr(write, "key", None), write=True)
                or bucket not in self.service.writable
            ):
                raise ConfigError(
                    f"function '{self.function}' runs sandboxed and wrote outside its read-write "
                    f"bindings (bucket {bucket!r})"
                )
            self._held.append(HeldWrite(alias, self._bucket(bucket), int(seqno), write))
        for change in answer.get("timers", ()):
            if not isinstance(change, TimerChange):
                raise ConfigError(
                    f"function '{self.function}' runs sandboxed and sent a timer change that is not one"
                )
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

    def run_once(
        self,
        m: Any,
        *,
        trace: bool = False,
        pdb_io: tuple[Any, Any] | None = None,
        on_event: Callable[[dict], None] | None = None,
    ) -> tuple[Any, list[dict]]:
        """``eventing.execution.single_call.run_once`` in the child, with the trace events (`trace`) it
        made, or each passed to `on_event` as the child makes it (then none are returned); with `pdb_io`
        (the debugger's input and output streams) under pdb, whose commands and prompts the child reads
        and writes through this process (`_served`)."""
        from eventing.execution.single_call import CallOutcome
        from eventing.handler import Meta

        self._pdb_io, self._on_event = pdb_io, on_event
        live = trace and on_event is not None
        try:
            answer = self._rpc("run_once", (tuple(m), self.keyspace, trace, pdb_io is not None, live))
        finally:
            self._pdb_io = self._on_event = None
        meta = answer.pop("meta")
        outcome = CallOutcome(
            **{k: answer[k] for k in ("status", "kind", "doc", "error", "traceback", "seconds")}
        )
        if isinstance(meta, dict):
            outcome.meta = Meta(*(meta.get(k) for k in Meta.__slots__[:8]))
            outcome.meta.previous = meta.get("previous")
        if outcome.ok:
            self._returned(answer)
        return outcome, [_trace_event(self.function, (event,)) for event in answer.get("events", ())]

    def _served(self, method: str, args: Any) -> tuple[bool, Any]:
        """The debugger's requests while a call runs under it (its trace events, pdb's input and output;
        a failure is the child's, whose call fails with it), else the scoped data service's answers."""
        try:
            if method == "debug_event" and self._on_event is not None:
                self._on_event(_trace_event(self.function, args))
                return True, None
            if method in ("debug_input", "debug_output") and self._pdb_io is not None:
                stdin, stdout = self._pdb_io
                if method == "debug_input":
                    return True, str(stdin.readline())
                (text,) = args
                stdout.write(_printable(str(text)))
                stdout.flush()
                return True, None
        except Exception as exc:  # noqa: BLE001 - the child's call fails with it
            return False, _error(exc)
        return super()._served(method, args)

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


# The debugger's trace events a sandboxed child may send, with the fields each must have.
_TRACE_FIELDS = {
    "call": ("kind", "doc", "meta"),
    "log": ("line",),
    "read": ("alias", "key", "value"),
    "write": ("alias", "key", "value"),
    "delete": ("alias", "key"),
}


def _trace_event(function: str, args: Any) -> dict:
    """The one trace event in `args`, as the debugger prints it; a child's event of another shape (its
    handler, which runs in the child, could send anything) is refused."""
    from eventing.errors import ConfigError

    event: Any = args[0] if isinstance(args, tuple) and len(args) == 1 else None
    fields = _TRACE_FIELDS.get(str(event.get("event"))) if isinstance(event, dict) else None
    if fields is None or not all(f in event for f in fields):
        raise ConfigError(f"function '{function}' runs sandboxed and sent a trace event that is not one")
    return {"event": event["event"], **{f: event[f] for f in fields}}


def _printable(text: str) -> str:
    """pdb's output from a sandboxed child, without the control characters (escape sequences) a handler's
    text could carry to the debugger's terminal; lines and tabs stay."""
    return "".join(c for c in text if c in "\n\t" or c >= " " and c != "\x7f")


def open_runner(state: StateLike, function: str, record: Any = None) -> Any:
    """The runner a caller outside a worker runs `function`'s handler with: a SandboxedRunner when its
    effective isolation is "sandbox", else a HandlerRunner in this process."""
    from eventing.core.definition import FunctionDefinition
    from eventing.execution.runner import HandlerRunner
    from eventing.workers.sandbox.default import isolation_of

    state = as_state(state)
    if record is None:
        record = state.metadata.get_function(function)
    if isolation_of(FunctionDefinition.from_dict(record.definition), record.deployed_by) == "sandbox":
        return SandboxedRunner(state, record)
    return HandlerRunner.open(state, function)
