"""The zygote's process (eventing.workers.sandbox.zygote says why and how), run as ``python -m
eventing.workers.sandbox.zygote_process <socket>``: it imports what every child imports (`PRELOADED`), then
forks a child for each request of its host (`_serve`); the child takes its own environment, folder and
import path and goes on as eventing.workers.sandbox.child (`_forked`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from typing import Any

from eventing.workers.sandbox.landlock import _PR_SET_PDEATHSIG, _libc
from eventing.workers.sandbox.zygote import CHILD_NAME, MESSAGE_MAX, PROFILE_ENV, ZYGOTE_NAME

# Imported by the zygote before it forks, so each child finds them loaded: what the child imports to confine
# itself and to run a worker core, a runner or a validation (eventing.workers.sandbox.child).
PRELOADED = (
    "ssl",
    "dataclasses",
    "numpy",
    "eventing.workers.sandbox.child",
    "eventing.workers.sandbox.confine",
    "eventing.workers.sandbox.seccomp",
    "eventing.workers.worker",
    "eventing.workers.handover",
    "eventing.execution.curl",
    "eventing.execution.loader",
)
_PR_SET_NAME = 15


def _name_process(name: bytes) -> None:
    _libc.prctl(_PR_SET_NAME, name, 0, 0, 0)


def _serve(fd: int) -> None:
    import gc
    import importlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the host's to handle
    _name_process(ZYGOTE_NAME)
    for name in PRELOADED:
        importlib.import_module(name)
    own_path = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path[1:] if os.path.abspath(p) not in own_path]
    gc.freeze()  # the collector leaves what is loaded alone: a child's collections write no shared page
    sock = socket.socket(fileno=fd)
    children: set[int] = set()

    def reap(*_: Any) -> None:
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not pid:
                return
            children.discard(pid)

    signal.signal(signal.SIGCHLD, reap)
    while True:
        try:
            message, fds, _flags, _addr = socket.recv_fds(sock, MESSAGE_MAX, 2)
        except OSError:
            message, fds = b"", []
        if not message:  # the host has ended: so do its children, and this process at once
            for pid in list(children):  # a copy: `reap` may change the set meanwhile
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os._exit(0)
        request = json.loads(message)
        # No reap between the fork and the pidfd: the pid cannot be another process's meanwhile.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        zygote = os.getpid()
        pid = os.fork()
        if pid == 0:
            _forked(zygote, sock, fds, request, base_path)  # never returns
        children.add(pid)
        pidfd = os.pidfd_open(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        for received in fds:
            os.close(received)
        try:
            socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
        finally:
            os.close(pidfd)


def _forked(
    zygote: int, zygote_sock: socket.socket, fds: list[int], request: dict, base_path: list[str]
) -> None:
    """The child, just forked: its own signals, descriptors, environment, folder and import path, then the
    child's work (eventing.workers.sandbox.child); it leaves without the zygote's exit handlers."""
    code = 1
    try:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # dies with the zygote...
        if os.getppid() != zygote:  # ...which may have gone before that was set
            os._exit(code)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        # SIGINT stays ignored: a terminal's Ctrl-C reaches the host too, which ends its child.
        _name_process(CHILD_NAME)
        zygote_sock.close()
        keep = set(fds)
        for name in os.listdir("/proc/self/fd"):
            if int(name) > 2 and int(name) not in keep:
                try:
                    os.close(int(name))
                except OSError:
                    pass  # the listing's own descriptor
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        import importlib
        import tempfile

        sys.path[:] = [request["cwd"], *request["path"], *base_path]
        sys.argv[:] = ["eventing.workers.sandbox.child", str(fds[0])]  # as a child started on its own had
        sys.path_importer_cache.clear()
        importlib.invalidate_caches()
        tempfile.tempdir = None  # TMPDIR is the child's folder now
        policy = request["policy"]
        if policy.get("notes_fd") is not None:
            policy["notes_fd"] = fds[1]
        from eventing.workers.sandbox.child import _child

        if request["env"].get(PROFILE_ENV):  # scripts/bench_sandbox_split.py --profile-child
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
            try:
                _child(fds[0], policy)
            finally:
                profiler.disable()
                profiler.dump_stats("child.prof")  # in the child's folder, the one it may write in
        else:
            _child(fds[0], policy)
        code = 0
    except BaseException:  # noqa: BLE001 - said on stderr, then the child ends (its host sees the line close)
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
