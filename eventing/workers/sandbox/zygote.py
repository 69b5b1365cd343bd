"""Sandboxed children forked from a prepared process: each worker host (a Ray worker process, or the calling
process in-process) starts one *zygote* the first time it needs a sandbox, ``python -m
eventing.workers.sandbox.zygote_process``, with the environment a child gets and no secret in it. The
zygote imports what every child imports (the worker's modules, numpy, ssl, the sandbox's own), then waits;
for each child the host sends its policy, environment and folder with the child's socket, and the zygote
forks. The child takes its environment, folder and import path, closes every descriptor but its own, and
goes on as ``eventing.workers.sandbox.child`` does: it confines itself (it has one thread, the fork's) and
serves its host.

Why: a child started as a new interpreter would import ~45 MB of modules itself (0.26 s of CPU), one copy
for each sandboxed worker; forked children share the zygote's pages until they write to them
(docs/benchmarks.md, "Sandboxed children forked from a zygote").
What children of one zygote share besides: the layout of the zygote's memory and its hash seed (no secret of
any function is in either). Each child is in its own Landlock domain, which neither the others nor the
zygote can enter.

The zygote ends when its host does (its socket to the host closes), and kills its children then; a child
also dies with the zygote (PR_SET_PDEATHSIG). The host holds a pidfd of
each child (`ForkedChild`): it sees the child end and kills it without a race on its pid.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

PROFILE_ENV = "EVENTING_PROFILE_CHILD"  # in a child's environment: its calls profiled into its folder
MESSAGE_MAX = 1 << 20  # a request: a policy, an environment, a folder
# The process names (/proc/<pid>/comm, what ps and top show) of a zygote and of a child forked by it.
ZYGOTE_NAME, CHILD_NAME = b"sandbox-zygote", b"sandboxed-child"


def is_sandboxed_child(pid: int) -> bool:
    """Whether process `pid` is a sandboxed child (forked by a zygote)."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip() == CHILD_NAME
    except OSError:
        return False


class ForkedChild:
    """The host's handle on a child forked by its zygote (as a ``subprocess.Popen`` is on its own child):
    `pid`, `poll`, `wait`, `kill`. Not the host's child, so no exit status: `returncode` says only that it
    ended (-9 when this handle killed it, else 0)."""

    def __init__(self, pid: int, pidfd: int):
        self.pid = pid
        self._pidfd = pidfd
        self._killed = False
        self.returncode: int | None = None

    def _ended(self, timeout: float | None) -> bool:
        if self.returncode is None:
            poll = select.poll()  # not select(): a host with many sockets has descriptors past 1024
            poll.register(self._pidfd, select.POLLIN)
            if not poll.poll(None if timeout is None else timeout * 1000):
                return False
            self.returncode = -signal.SIGKILL if self._killed else 0
            os.close(self._pidfd)
        return self.returncode is not None

    def poll(self) -> int | None:
        self._ended(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended(timeout):
            raise subprocess.TimeoutExpired(f"sandboxed child {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            self._killed = True
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass  # ended meanwhile

    def __del__(self) -> None:
        if self.returncode is None:
            os.close(self._pidfd)


class Zygote:
    """The host's end: the zygote process and its socket (one request at a time)."""

    def __init__(self, folder: str, env: dict[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "eventing.workers.sandbox.zygote_process", str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=folder,
                pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.lock = threading.Lock()

    def fork(self, request: dict[str, Any], fds: list[int]) -> ForkedChild:
        """A child for `request` (policy, env, cwd, path; notes_fd set when `fds` holds a second one) with
        `fds` (its socket first): OSError when the zygote is gone."""
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
            answer, got, _flags, _addr = socket.recv_fds(self.sock, MESSAGE_MAX, 1)
        if not answer or not got:
            for fd in got:
                os.close(fd)
            raise OSError(f"the sandbox's zygote ended ({answer.decode(errors='replace') or 'no answer'})")
        return ForkedChild(json.loads(answer)["pid"], got[0])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# This process's zygote: started with its first sandbox, replaced when it has ended.
_ZYGOTE: Zygote | None = None
_ZYGOTE_LOCK = threading.Lock()


def _forget_zygote() -> None:
    """In a process forked from this one: the zygote is its parent's (it must see the parent end)."""
    global _ZYGOTE
    if _ZYGOTE is not None:
        _ZYGOTE.sock.close()
    _ZYGOTE = None


os.register_at_fork(after_in_child=_forget_zygote)


def fork_child(policy: dict, env: dict[str, str], folder: str, fds: list[int]) -> ForkedChild:
    """A sandboxed child forked by this process's zygote (started, or started again, when needed)."""
    from eventing.workers.sandbox.folders import project_packages, sandbox_env

    global _ZYGOTE
    request = {"policy": policy, "env": env, "cwd": folder, "path": env["PYTHONPATH"].split(os.pathsep)}
    with _ZYGOTE_LOCK:
        for attempt in range(2):
            if _ZYGOTE is not None and not _ZYGOTE.alive():
                _ZYGOTE.close()
                _ZYGOTE = None
            if _ZYGOTE is None:
                root, _packages = project_packages()
                # The project's root on its import path: a child sets its own before it confines itself.
                _ZYGOTE = Zygote(root, sandbox_env(root, root))
            try:
                return _ZYGOTE.fork(request, fds)
            except OSError:
                if attempt:
                    raise
                _ZYGOTE.proc.kill()  # replaced at the next turn
                _ZYGOTE.proc.wait()
    raise AssertionError("unreachable")
