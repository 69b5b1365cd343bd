"""The disk a sandboxed child takes, watched by its host: Landlock and RLIMIT_FSIZE bound where a child
writes and how large each file grows, not how many files its private folder holds, so a handler could fill
the machine's disk a gigabyte at a time. Every `CHECK_EVERY_S` one thread of the host process sums what each
of its children's folders holds on disk (blocks, links not followed) with the files it was given open (its
call notes); past the limit (`EVENTING_SANDBOX_DISK_MB`, 1024 by default) it ends that child. The call in
flight then fails as a worker death does: the worker starts again with a new, empty folder, and a mutation
whose handler fills the disk each time is dead-lettered as `crashed` (eventing.workers.crash_guard). A child
writes at most what the disk takes in one interval past the limit."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from eventing.errors import ConfigError

DISK_ENV = "EVENTING_SANDBOX_DISK_MB"
DEFAULT_DISK_MB = 1024
CHECK_EVERY_S = 1.0

log = logging.getLogger(__name__)


def disk_limit_bytes() -> int:
    text = os.environ.get(DISK_ENV, "").strip()
    if not text:
        return DEFAULT_DISK_MB << 20
    try:
        mb = int(text)
    except ValueError:
        mb = 0
    if mb < 1:
        raise ConfigError(
            f"{DISK_ENV}={text!r} is not a number of megabytes; set it to a whole number such as 1024, or "
            "unset it for 1024"
        )
    return mb << 20


def over_disk(function: str, used: int) -> str:
    """Why a child past the limit was ended, for the error its worker's death raises."""
    return (
        f"the sandboxed handler of function '{function}' took {used >> 20} MB of disk, more than {DISK_ENV} "
        f"allows ({disk_limit_bytes() >> 20} MB): its process was ended"
    )


def used_bytes(folder: str, fds: list[int]) -> int:
    """What `folder` holds on disk (its files' blocks, links not followed) and the files open as `fds`."""
    total = 0
    pending = [folder]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue  # removed meanwhile
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                else:
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                pass
    for fd in fds:
        try:
            total += os.fstat(fd).st_blocks * 512
        except OSError:
            pass
    return total


class DiskWatch:
    """The host process's watcher (`WATCH`): `watch` a child's folder and files, `forget` it when the child
    ends; `on_over(used)` is called once, from the watcher's thread, for a child past the limit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[str, list[int], int, Callable[[int], None]]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def watch(self, folder: str, fds: list[int], on_over: Callable[[int], None]) -> int:
        """Watch `folder` and the files open as `fds` (this watcher closes them when it forgets them)."""
        limit = disk_limit_bytes()
        with self._lock:
            self._next += 1
            self._watched[self._next] = (folder, fds, limit, on_over)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sandbox-disk-watch", daemon=True)
                self._thread.start()
            return self._next

    def forget(self, key: int | None) -> None:
        with self._lock:
            watched = self._watched.pop(key, None) if key is not None else None
        for fd in watched[1] if watched else ():
            os.close(fd)

    def check(self) -> None:
        """One look at every watched child (the thread's loop; a test calls it directly)."""
        with self._lock:
            watched = list(self._watched.items())
        for key, (folder, fds, limit, on_over) in watched:
            used = used_bytes(folder, fds)
            if used > limit:
                with self._lock:
                    if self._watched.get(key, (None,))[0] != folder:
                        continue  # forgotten meanwhile
                try:
                    on_over(used)
                except Exception:  # noqa: BLE001 - the watcher serves every other child too
                    log.exception("ending a sandboxed child past its disk limit failed")

    def _run(self) -> None:
        while not self._wake.wait(CHECK_EVERY_S):
            self.check()


WATCH = DiskWatch()
