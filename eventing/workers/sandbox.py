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
KEY_CALLS = frozenset({"get_raw", "get", "get_meta", "get_doc", "previous_doc"})  # first argument: a stored key
LIST_CALLS = frozenset({"keys", "scan", "count"})  # first argument: a stored-key prefix
EFFECT_CALLS = frozenset({"apply_effects", "effect_marks", "fence"})
# What a worker asks of the metadata store, each with the function's name as first argument.
META_CALLS = frozenset({"get_function", "claim", "release", "commit", "claim_timers", "get_timer", "find_dlq_rows"})


class ScopedService:
    """Answers a sandboxed worker of `function`: `backend` is a DataService over the files or a line to
    the cluster's data service; anything beyond the function's own data is refused.

    Scoped by collection: a document is read only in a collection the function's source or one of its
    bindings names (by its stored-key prefix, eventing.core.keyspaces), written only in a read-write
    binding's collection; log rows of the source bucket's other collections reach the worker without
    their key's user part, document or origin (it passes them over, as it would anyway)."""

    def __init__(self, function: str, defn: Any, backend: Any):
        self.function = function
        self.backend = backend
        self.readable = {defn.source_bucket} | {b.bucket for b in defn.bindings}
        self.writable = {b.bucket for b in defn.bindings if b.access == "rw"}
        self.read_keyspaces: dict[str, list[Any]] = {}
        for keyspace in [defn.source_keyspace, *(b.keyspace for b in defn.bindings)]:
            self.read_keyspaces.setdefault(keyspace.bucket, []).append(keyspace)
        self.write_keyspaces: dict[str, list[Any]] = {}
        for b in defn.bindings:
            if b.access == "rw":
                self.write_keyspaces.setdefault(b.bucket, []).append(b.keyspace)
        self._registry: dict[str, dict[int, tuple[str, str]]] = {}

    def call(self, method: str, *args: Any) -> Any:
        self.check(method, args)
        answer = self.backend.call(method, *args)
        if method == "read_vb":
            return self._redact_blob(args[0], answer)
        if method == "read_many":
            return self._redact_many(args[0], args[1], answer)
        if method == "bucket":
            name, call = args[0], args[1]
            if call == "read_vb_packed" and answer is not None and not self._plain_default(name, answer.keys):
                return None  # the worker reads these rows with read_vb, redacted there
            if call in ("keys", "scan"):
                return [item for item in answer if self._allowed(name, item if call == "keys" else item[0])]
        return answer

    # -- collections ------------------------------------------------------------------------------------

    def _collection(self, bucket: str, cid: int) -> tuple[str, str] | None:
        from eventing.core.keyspaces import DEFAULT

        if cid == 0:
            return DEFAULT, DEFAULT
        known = self._registry.get(bucket)
        if known is None or cid not in known:  # created since the last look (ids are never reused)
            listed = self.backend.call("bucket", bucket, "collection_list", (), {})
            known = self._registry[bucket] = {c: (s, n) for s, n, c in listed}
        return known.get(cid)

    def _allowed(self, bucket: str, key: Any, *, write: bool = False) -> bool:
        from eventing.core.keyspaces import split_stored_key

        if not isinstance(key, str):
            return False
        named = self._collection(bucket, split_stored_key(key)[0])
        if named is None:
            return False
        scope, collection = named
        keyspaces = (self.write_keyspaces if write else self.read_keyspaces).get(bucket, [])
        return any(k.scope == scope and (k.is_wildcard or k.collection == collection) for k in keyspaces)

    def _prefix_allowed(self, bucket: str, prefix: Any) -> bool:
        from eventing.core.keyspaces import COLLECTION_MARK

        if not isinstance(prefix, str):
            return False
        if prefix.startswith(COLLECTION_MARK) and COLLECTION_MARK in prefix[1:]:
            return self._allowed(bucket, prefix)
        return self._allowed(bucket, "")  # the default collection's keys: others' are left out of the answer

    def _plain_default(self, bucket: str, keys: bytes) -> bool:
        """Whether log rows whose keys are `keys` (joined) are all of the default collection, which the
        function reads."""
        from eventing.core.keyspaces import COLLECTION_MARK

        return COLLECTION_MARK.encode() not in keys and self._allowed(bucket, "")

    def _redact(self, bucket: str, rows: Any) -> tuple[list, bool]:
        from eventing.core.keyspaces import key_prefix, split_stored_key

        out, changed = [], False
        for row in rows:
            if self._allowed(bucket, row[2]):
                out.append(row)
            else:
                changed = True
                out.append((row[0], row[1], key_prefix(split_stored_key(row[2])[0]), row[3], 0, None, None, 0, 0,
                            *row[9:]))
        return out, changed

    def _redact_blob(self, bucket: str, blob: bytes) -> bytes:
        import msgpack

        rows, changed = self._redact(bucket, msgpack.unpackb(blob, raw=False))
        return msgpack.packb(rows, use_bin_type=True) if changed else blob

    def _redact_many(self, bucket: str, runs: list, answer: tuple) -> tuple:
        import msgpack

        from eventing.storage.remote import rows_of_columns

        blob, highs = answer
        answers, changed = msgpack.unpackb(blob, raw=False), False
        for i, ((vb, after, _), run) in enumerate(zip(runs, answers, strict=True)):
            if run[0] == 1:
                if self._plain_default(bucket, run[4]):
                    continue
                rows = rows_of_columns(vb, after, tuple(run[1:]))
                if rows is None:
                    raise EOFError("a log read cannot be scoped to the function's collections")
            else:
                rows = run[1]
            redacted, _ = self._redact(bucket, rows)
            answers[i], changed = (0, redacted), True
        return (msgpack.packb(answers, use_bin_type=True), highs) if changed else answer

    # -- what may be asked ------------------------------------------------------------------------------

    def check(self, method: str, args: tuple) -> None:
        from eventing.errors import ConfigError

        fn = self.function
        if method == "ping":
            return
        if method in ("bucket_info", "read_vb", "read_many") and args and args[0] in self.readable:
            return
        if method == "bucket" and len(args) == 4 and args[0] in self.readable:
            name, call, call_args, kwargs = args
            if call in KEY_CALLS and call_args and self._allowed(name, call_args[0]):
                return
            prefix = call_args[0] if call_args else ""
            if call in LIST_CALLS and self._prefix_allowed(name, prefix):
                if call != "count" or str(prefix).startswith("\x01") or not self._others(name):
                    return
            if call in READ_CALLS and call not in KEY_CALLS and call not in LIST_CALLS:
                return
            if (call in EFFECT_CALLS and name in self.writable and call_args and call_args[0] == fn
                    and isinstance(kwargs, dict) and kwargs.get("origin") in (None, fn)
                    and (call != "apply_effects" or self._effects_allowed(name, call_args))):
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

    def _others(self, bucket: str) -> bool:
        """Whether the bucket has named collections the function does not read (a count of the default
        collection's prefix "" would include their documents)."""
        listed = self.backend.call("bucket", bucket, "collection_list", (), {})
        self._registry[bucket] = {c: (s, n) for s, n, c in listed}
        return any(not self._allowed(bucket, f"\x01{cid:x}\x01") for cid in self._registry[bucket])

    def _effects_allowed(self, bucket: str, call_args: tuple) -> bool:
        groups = call_args[1] if len(call_args) > 1 else ()
        return all(self._allowed(bucket, getattr(w, "key", None), write=True)
                   for g in groups for _, w in getattr(g, "writes", ()))


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


class _Sandboxed:
    """A sandboxed child process and the host's end of its line: each method call goes to the child,
    and the child's data requests are answered (scoped by `service`) while it runs."""

    own_process = False

    def _start(self, function: str, defn: Any, service: Any, *, data_dir: str) -> None:
        import json
        import shutil
        import subprocess
        import tempfile

        from eventing.errors import ConfigError

        why = sandbox_unavailable()
        if why:
            raise ConfigError(f"function '{function}' must run sandboxed, but {why}")
        self.service = service
        self.tmp = tempfile.mkdtemp(prefix=f"{function}-", dir=sandboxes_root())
        self._rmtree = shutil.rmtree
        self._ended = False
        policy = {"deny": [data_dir, sandboxes_root(), "/dev/shm"], "writable": [self.tmp],
                  "tcp_ports": url_ports(defn)}
        ours, theirs = socket.socketpair()
        env = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL", "PYTHONPATH") if name in os.environ}
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        env.update({"TMPDIR": self.tmp, "HOME": self.tmp, "PYTHONDONTWRITEBYTECODE": "1"})
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "eventing.workers.sandbox", str(theirs.fileno()), json.dumps(policy)],
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


class SandboxedCore(_Sandboxed):
    """The host's stand-in for a WorkerCore running in a sandboxed child."""

    def __init__(self, spec: Any, *, own_process: bool = False):
        from eventing.core.definition import FunctionDefinition
        from eventing.storage.remote import DataAccess
        from eventing.workers.data_service import ServedData

        self.own_process = own_process
        access = DataAccess(spec.data_dir, spec.data_service, key=spec.worker_id)
        store = access.metadata()
        try:
            defn = FunctionDefinition.from_dict(store.get_function(spec.function).definition)
        finally:
            store.close()
        backend: Any = ServedData(spec.data_dir) if access.local else spec.data_service.client(spec.worker_id)
        self._start(spec.function, defn, ScopedService(spec.function, defn, backend), data_dir=spec.data_dir)
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


def validate_sandboxed(data_dir: str, defn: Any, source: str) -> None:
    """``eventing.execution.loader.validate_handler`` for `defn` run in a sandboxed child: the handler
    module's top-level code runs there, and a HandlerLoadError comes back as one."""
    sandbox = _Sandboxed()
    sandbox._start(defn.name, defn, ScopedService(defn.name, defn, _NoData()), data_dir=data_dir)
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

    def __init__(self, data_dir: str, record: Any):
        from eventing.core.definition import FunctionDefinition
        from eventing.storage.factory import open_bucket
        from eventing.workers.data_service import ServedData

        self.function = record.name
        self.defn = FunctionDefinition.from_dict(record.definition)
        self.data_dir = data_dir
        self.timeout_s = self.defn.execution_timeout.total_seconds()
        self.keyspace = self.defn.source_keyspace.to_meta()
        self.timers = _HeldTimers()
        self._held: list[Any] = []
        self._buckets: dict[str, Any] = {}
        self._start(self.function, self.defn, ScopedService(self.function, self.defn, ServedData(data_dir)),
                    data_dir=data_dir)
        try:
            self._rpc("__runner__", (self.function, record.definition, record.source, data_dir))
            self.source = open_bucket(data_dir, self.defn.source_bucket)  # this process's: the debugger pulls
        except BaseException:
            self.close()
            raise

    def _bucket(self, name: str) -> Any:
        from eventing.storage.factory import open_bucket

        if name not in self._buckets:
            self._buckets[name] = open_bucket(self.data_dir, name)
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


def open_runner(data_dir: str, function: str, record: Any = None) -> Any:
    """The runner a caller outside a worker runs `function`'s handler with: a SandboxedRunner when its
    effective isolation is "sandbox", else a HandlerRunner in this process."""
    from eventing.core.definition import FunctionDefinition, effective_isolation
    from eventing.execution.runner import HandlerRunner

    if record is None:
        from metadata.factory import open_store

        store = open_store(data_dir, create=False)
        try:
            record = store.get_function(function)
        finally:
            store.close()
    if effective_isolation(FunctionDefinition.from_dict(record.definition), record.deployed_by) == "sandbox":
        return SandboxedRunner(data_dir, record)
    return HandlerRunner.open(data_dir, function)


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


class _ChildRunner:
    """The sandboxed process's side of a SandboxedRunner: a HandlerRunner whose buckets, timers lookup
    and application log go through the line; writes and timer changes are sent back, never applied."""

    def __init__(self, line: _Line, function: str, definition: dict, source_code: str, data_dir: str):
        from eventing.core.definition import FunctionDefinition
        from eventing.execution.app_log import RemoteAppLog
        from eventing.execution.runner import HandlerRunner
        from eventing.storage.remote import RemoteBucket, RemoteMetadataStore

        defn = FunctionDefinition.from_dict(definition)
        store = RemoteMetadataStore(line)
        app_log = RemoteAppLog(lambda lines: line.submit("app_log", function, lines, defn.app_log_max_size,
                                                         defn.app_log_max_files))
        self.runner = HandlerRunner(function, defn, source_code, RemoteBucket(line, defn.source_bucket),
                                    lambda name: RemoteBucket(line, name), app_log)
        self.runner.timers.lookup = lambda callback, reference: store.get_timer(function, callback, reference)
        self.app_log = app_log

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
        failure = runner.call(m, HandlerCall("on_update", fn, (DeployAction(reason, delay),), None),
                              timeout_s=runner.timeout_s)
        if failure is not None:
            return {"found": True, "failure": (failure.status, failure.kind, failure.error, failure.traceback,
                                               failure.attempts, failure.first_failed_at)}
        return {"found": True, "failure": None, **self._returned()}

    def run_once(self, fields: tuple, keyspace: dict, trace: bool) -> dict:
        import copy

        from eventing import handler as handler_api
        from eventing.core.mutation import Mutation
        from eventing.execution.single_call import EventSink, prepare_call, run_once

        runner, events = self.runner, []
        m = Mutation(*fields)
        runner.keyspace = keyspace
        prepared = prepare_call(runner, m)
        first = prepared[0]
        events.append({"event": "call", "kind": first.kind or None, "doc": first.doc,
                       "meta": first.meta.to_dict() if first.meta else None})
        previous_sink = handler_api.log.sink
        if trace:
            runner.set_tracer(lambda op, alias, key, value: events.append(
                {"event": op, "alias": alias, "key": key, "value": copy.deepcopy(value)}))
            handler_api.log.sink = EventSink(events.append)
        try:
            outcome = run_once(runner, m, prepared=prepared)
        finally:
            handler_api.log.sink = previous_sink
            runner.set_tracer(None)
        answer = {"status": outcome.status, "kind": outcome.kind, "doc": outcome.doc,
                  "meta": outcome.meta.to_dict() if outcome.meta else None, "error": outcome.error,
                  "traceback": outcome.traceback, "seconds": outcome.seconds, "events": events}
        if outcome.ok:
            answer.update(self._returned())
        return answer

    def close(self) -> None:
        self.runner.close()


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
                result = (True, getattr(core, method)(*args))
        except Exception as exc:  # noqa: BLE001 - answered to the host, which raises it
            result = (False, _error(exc))
        line.send(("done", None, *result))
        if method == "close":
            return


if __name__ == "__main__":
    import json

    _child(int(sys.argv[1]), json.loads(sys.argv[2]))
