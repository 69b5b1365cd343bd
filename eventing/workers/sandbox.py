"""Sandboxed workers: a function whose isolation is "sandbox" runs its worker core (and so its handler) in
a process of its own that cannot open the data directory, and reaches only its own bindings.

How (see docs/guarantees.md, "Sandboxed handlers", for why this mechanism):

- The worker host (a Ray actor, or the calling process in-process) starts a child process,
  ``python -m eventing.workers.sandbox``, with no descriptor but its stdio and one socket to the host,
  a minimal environment (no store credentials) and a private temporary directory as ``TMPDIR``.
- Before it imports anything that could start a thread, the child restricts itself with Landlock
  (``restrict``): reading is allowed everywhere except the data directory, the other sandboxes'
  temporary directories and ``/dev/shm``; writing only in its private temporary directory (and the null
  devices); TCP only to the ports of the function's URL bindings, no listening; no abstract Unix sockets
  or signals outside its domain. Landlock holds for the process and every child it starts (exec
  included) and cannot be lifted; it also refuses ptrace and ``/proc/<pid>/fd`` of processes outside it.
- The child runs ``WorkerCore`` with a ``DataAccess`` whose line goes through the socket. The host
  answers each request with ``ScopedService``: only the function's source and binding buckets (reads;
  effects on read-write bindings, under the function's own name), the metadata calls a worker makes for
  its own function, its own application log and window row files. What the child sends is unpickled
  with an allow-list of value classes, so it cannot run code in the host.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import socket
import struct
import sys
import threading
from collections.abc import Callable
from typing import Any

# -- Landlock -------------------------------------------------------------------------------------------

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on x86_64 and arm64
_VERSION = 1  # landlock_create_ruleset flag: answer the ABI version
_PR_SET_NO_NEW_PRIVS, _PR_SET_PDEATHSIG = 38, 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_MAKE = sum(1 << i for i in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
MIN_ABI = 4  # files (1), renames across folders (2), truncation (3) and TCP (4) are all handled
READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE  # what a rule on a file may hold
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when it has none (too old, or disabled at boot)."""
    version = _libc.syscall(ctypes.c_long(_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION))
    return max(int(version), 0)


def sandbox_unavailable() -> str | None:
    """Why this machine cannot run sandboxed functions (one line), or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"sandboxed functions need Linux with Landlock (ABI {MIN_ABI}+, kernel 6.7+); this is {sys.platform}"
    abi = landlock_abi()
    if abi < MIN_ABI:
        found = f"ABI {abi}" if abi else "no Landlock (kernel too old, or `lsm=` at boot leaves it out)"
        return (f"sandboxed functions need Landlock ABI {MIN_ABI}+ (Linux 6.7+); this kernel has {found}: "
                "enable Landlock, or have an admin deploy the function with \"isolation\": \"none\"")
    return None


def _read_rules(deny: list[str]) -> list[str]:
    """Paths to allow reading beneath so that everything is readable except `deny`: the entries of every
    folder on the way to a denied path, less the denied paths (Landlock rules only allow)."""
    denied = {os.path.realpath(d) for d in deny}
    on_the_way = set()
    for d in denied:
        while d != "/":
            d = os.path.dirname(d)
            on_the_way.add(d)
    if not denied:
        return ["/"]
    allowed, folders = [], ["/"]
    while folders:
        folder = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            path = entry.path
            if path in denied:
                continue
            if path in on_the_way:
                folders.append(path)
            elif not entry.is_symlink():  # a link is reached through what it points to, judged there
                allowed.append(path)
    return allowed


def restrict(*, deny: list[str], writable: list[str], tcp_ports: list[int]) -> int:
    """Landlock this process (every thread it starts later, every child): read everywhere but `deny`,
    write only beneath `writable`, connect over TCP only to `tcp_ports`, bind none. Call it before any
    thread exists. Returns the ABI used; OSError when the kernel refuses."""
    abi = landlock_abi()
    if abi < MIN_ABI:
        raise OSError(sandbox_unavailable())
    handled_fs = READ | FS_WRITE_FILE | FS_MAKE | FS_REFER | FS_TRUNCATE
    attr = struct.pack("=QQQ", handled_fs, NET_BIND_TCP | NET_CONNECT_TCP,
                       SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL if abi >= 6 else 0)
    size = len(attr) if abi >= 6 else 16
    ruleset = _libc.syscall(ctypes.c_long(_CREATE_RULESET), attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        rules = [(p, READ) for p in _read_rules(deny)]
        rules += [(p, handled_fs) for p in writable] + [(p, READ | FS_WRITE_FILE) for p in WRITABLE_DEVICES]
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue  # gone meanwhile, or not ours to open: left unreadable
            try:
                if not os.path.isdir(f"/proc/self/fd/{fd}"):
                    rights &= FILE_RIGHTS
                rule = struct.pack("=Qi", rights, fd)
                if _libc.syscall(ctypes.c_long(_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                                 rule, ctypes.c_uint32(0)) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
            finally:
                os.close(fd)
        for port in sorted(set(tcp_ports)):
            rule = struct.pack("=QQ", NET_CONNECT_TCP, port)
            if _libc.syscall(ctypes.c_long(_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(_RULE_NET_PORT),
                             rule, ctypes.c_uint32(0)) < 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for TCP port {port}")
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if _libc.syscall(ctypes.c_long(_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi


# -- framing --------------------------------------------------------------------------------------------

_HEADER = struct.Struct("!Q")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other end of the sandbox line closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> bytes:
    return _recv_exact(sock, _HEADER.unpack(_recv_exact(sock, _HEADER.size))[0])


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_HEADER.pack(len(payload)) + payload)


# What the host accepts from a sandboxed process: plain values and these classes (no callables).
_SAFE_BUILTINS = frozenset({"set", "frozenset", "bytearray", "complex", "slice", "range"})
_SAFE_CLASSES = {
    "eventing.workers.worker": frozenset({"StepReport"}),
    "eventing.storage.bucket": frozenset({"Write", "EffectGroup", "EffectResult"}),
    "eventing.core.mutation": frozenset({"Mutation"}),
    "collections": frozenset({"Counter", "OrderedDict"}),
    "datetime": frozenset({"timedelta", "datetime", "date", "timezone"}),
}


class _ValuesOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return super().find_class(module, name)
        if name in _SAFE_CLASSES.get(module, ()) or (module == "metadata.model" and name[:1].isupper()):
            found = super().find_class(module, name)
            if isinstance(found, type) and not issubclass(found, BaseException):
                return found
        raise pickle.UnpicklingError(f"a sandboxed worker sent a {module}.{name}, which is not a plain value")


def _values(data: bytes) -> Any:
    import io

    return _ValuesOnly(io.BytesIO(data)).load()


def _error(exc: BaseException) -> tuple[str, str]:
    return type(exc).__name__, str(exc)


def _raise(error: tuple[str, str]) -> None:
    from eventing import errors

    name, text = str(error[0]), str(error[1])
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.EventingError):
        raise cls(text)
    raise errors.EventingError(f"{name}: {text}" if text else name)


# -- the host's side ------------------------------------------------------------------------------------

READ_CALLS = frozenset({
    "high_seqnos", "read_vb_packed", "max_doc_bytes", "get_raw", "get", "get_meta", "get_doc", "previous_doc",
    "ensure_key_index", "keys", "scan", "count", "collection_list",
})
EFFECT_CALLS = frozenset({"apply_effects", "effect_marks", "fence"})
# What a worker asks of the metadata store, each with the function's name as first argument.
META_CALLS = frozenset({"get_function", "claim", "release", "commit", "claim_timers", "get_timer", "find_dlq_rows"})


class ScopedService:
    """Answers a sandboxed worker of `function`: `backend` is a DataService over the files or a line to
    the cluster's data service; anything beyond the function's own data is refused."""

    def __init__(self, function: str, defn: Any, backend: Any):
        self.function = function
        self.backend = backend
        self.readable = {defn.source_bucket} | {b.bucket for b in defn.bindings}
        self.writable = {b.bucket for b in defn.bindings if b.access == "rw"}

    def call(self, method: str, *args: Any) -> Any:
        self.check(method, args)
        return self.backend.call(method, *args)

    def check(self, method: str, args: tuple) -> None:
        from eventing.errors import ConfigError

        fn = self.function
        if method == "ping":
            return
        if method in ("bucket_info", "read_vb", "read_many") and args and args[0] in self.readable:
            return
        if method == "bucket" and len(args) == 4 and args[0] in self.readable:
            name, call, call_args, kwargs = args
            if call in READ_CALLS:
                return
            if (call in EFFECT_CALLS and name in self.writable and call_args and call_args[0] == fn
                    and isinstance(kwargs, dict) and kwargs.get("origin") in (None, fn)):
                return
        if method == "meta" and len(args) == 3 and args[0] in META_CALLS and args[1] and args[1][0] == fn:
            return
        if method == "app_log" and args and args[0] == fn:
            return
        if method == "put_file" and args and isinstance(args[0], str):
            parts = os.path.normpath(args[0]).split(os.sep)
            if len(parts) >= 4 and parts[:3] == ["windows", fn, "incoming"] and ".." not in parts:
                return
        raise ConfigError(f"function '{fn}' runs sandboxed and may not call {method} {str(args[:2])[:120]}: "
                          "it reaches only its own source, bindings, timers and log")


_SANDBOXES = "eventing-sandboxes"  # under the system temporary folder: one private folder per sandbox


def sandboxes_root() -> str:
    import tempfile

    root = os.path.join(tempfile.gettempdir(), _SANDBOXES)
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root


def url_ports(defn: Any) -> list[int]:
    import urllib.parse

    ports = []
    for u in defn.url_bindings:
        split = urllib.parse.urlsplit(u["url"])
        ports.append(split.port or (443 if split.scheme == "https" else 80))
    return ports


class SandboxedCore:
    """The host's stand-in for a WorkerCore running in a sandboxed child: each method call goes to the
    child, and the child's data requests are answered (scoped) while it runs."""

    def __init__(self, spec: Any, *, own_process: bool = False):
        import shutil
        import subprocess
        import tempfile

        from eventing.core.definition import FunctionDefinition
        from eventing.errors import ConfigError
        from eventing.storage.remote import DataAccess
        from eventing.workers.data_service import ServedData

        why = sandbox_unavailable()
        if why:
            raise ConfigError(f"function '{spec.function}' must run sandboxed, but {why}")
        self.own_process = own_process
        access = DataAccess(spec.data_dir, spec.data_service, key=spec.worker_id)
        store = access.metadata()
        try:
            defn = FunctionDefinition.from_dict(store.get_function(spec.function).definition)
        finally:
            store.close()
        backend: Any = ServedData(spec.data_dir) if access.local else spec.data_service.client(spec.worker_id)
        self.service = ScopedService(spec.function, defn, backend)
        self.tmp = tempfile.mkdtemp(prefix=f"{spec.function}-", dir=sandboxes_root())
        self._rmtree = shutil.rmtree
        policy = {"deny": [spec.data_dir, sandboxes_root(), "/dev/shm"], "writable": [self.tmp],
                  "tcp_ports": url_ports(defn)}
        ours, theirs = socket.socketpair()
        env = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL", "PYTHONPATH") if name in os.environ}
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        env.update({"TMPDIR": self.tmp, "HOME": self.tmp, "PYTHONDONTWRITEBYTECODE": "1"})
        import json

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eventing.workers.sandbox", str(theirs.fileno()), json.dumps(policy)],
            stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), env=env, cwd=self.tmp,
        )
        theirs.close()
        self.sock = ours
        self._ended = False
        self.pid = self._rpc("__init__", (spec.function, spec))

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args: self._rpc(method, args)

    def _rpc(self, method: str, args: tuple) -> Any:
        from eventing.workers.executor import WorkerDied

        if self._ended:
            raise WorkerDied("the sandboxed worker process has ended")
        try:
            _send(self.sock, pickle.dumps(("call", method, args), protocol=5))
            while True:
                kind, ident, ok, value = _values(_recv(self.sock))
                if kind == "done":
                    if not ok:
                        _raise(value)
                    return value
                try:
                    answer = (True, self.service.call(ok, *value))
                except Exception as exc:  # noqa: BLE001 - the child's call fails with it
                    answer = (False, _error(exc))
                _send(self.sock, pickle.dumps(("ans", ident, *answer), protocol=5))
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            self._end()
            if self.own_process:  # a Ray actor ends with its sandbox, as a hung worker's process ends
                os._exit(70)
            raise WorkerDied(f"the sandboxed worker process ended ({exc})") from None

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
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


# -- the sandboxed process's side -----------------------------------------------------------------------


class _Line:
    """The child's end: data requests out (from any thread), answers and host calls in (a reader thread)."""

    def __init__(self, sock: socket.socket):
        import queue
        import signal

        self.sock = sock
        self._signal = signal
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
        masked = threading.current_thread() is threading.main_thread()
        if masked:
            self._signal.pthread_sigmask(self._signal.SIG_BLOCK, {self._signal.SIGALRM})
        try:
            with self._lock:
                _send(self.sock, data)
        finally:
            if masked:
                self._signal.pthread_sigmask(self._signal.SIG_UNBLOCK, {self._signal.SIGALRM})

    def call(self, method: str, *args: Any) -> Any:
        return self.submit(method, *args)()

    def submit(self, method: str, *args: Any) -> Callable[[], Any]:
        with self._lock:
            self._next += 1
            ident = self._next
        self.send(("req", ident, method, args))

        def wait() -> Any:
            with self._cond:
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

    def __init__(self, line: _Line, data_dir: str):
        self.line, self.data_dir, self.node_id = line, data_dir, ""

    def client(self, key: str) -> _Line:
        return self.line


def _child(fd: int, policy: dict) -> None:
    _libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # SIGKILL when the host goes (kill -9 of a worker)
    sock = socket.socket(fileno=fd)
    try:
        restrict(deny=policy["deny"], writable=policy["writable"], tcp_ports=policy["tcp_ports"])
    except OSError as exc:
        _send(sock, pickle.dumps(("done", None, False, ("ConfigError", f"cannot sandbox this process: {exc}"))))
        return
    from dataclasses import replace

    line = _Line(sock)
    core: Any = None
    while True:
        method, args = line.calls.get()
        try:
            if method == "__init__":
                from eventing.workers.worker import WorkerCore

                function, spec = args
                spec = replace(spec, data_service=_LineRef(line, spec.data_dir))
                core = WorkerCore(spec, recycle_on_hang=True)
                result: tuple = (True, os.getpid())
            else:
                result = (True, getattr(core, method)(*args))
        except Exception as exc:  # noqa: BLE001 - answered to the host, which raises it
            result = (False, _error(exc))
        line.send(("done", None, *result))
        if method == "close":
            return


if __name__ == "__main__":
    import json

    _child(int(sys.argv[1]), json.loads(sys.argv[2]))
