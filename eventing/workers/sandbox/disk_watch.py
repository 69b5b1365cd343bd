"""The disk a sandboxed child takes, watched by its host: Landlock and RLIMIT_FSIZE bound where a child
writes and how large each file grows, not how many files its private folder holds, so a handler could fill
the machine's disk a gigabyte at a time. Every `CHECK_EVERY_S` one thread of the host process sums what each
of its children's folders holds on disk (blocks, links not followed) with the files the child holds open
or mapped elsewhere (its call notes, a file it removed while open); past the limit
(`EVENTING_SANDBOX_DISK_MB`, 1024 by default) it ends that child. The call in flight then fails as a worker
death does: the worker starts again with a new, empty folder, and a mutation whose handler fills the disk
each time is dead-lettered as `crashed` (eventing.workers.crash_guard). A child writes at most what the
disk takes in one interval past the limit."""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
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


def used_bytes(folder: str, pid: int | None = None) -> int:
    """What `folder` holds on disk (its files' and folders' blocks, links not followed) and, for process
    `pid`, the files it holds open or mapped elsewhere: its call notes, and a file it removed while keeping
    it open (which no folder lists any more)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    pending = [folder]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue  # removed meanwhile
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif entry.is_symlink():
                    continue  # a package view's link: not the child's disk
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
            except OSError:
                pass
    return total + (_held_by(pid, seen) if pid is not None else 0)


def _held_by(pid: int, seen: set[tuple[int, int]]) -> int:
    total = 0
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0  # ended, or its /proc is not this process's to read
    for name in names:
        try:
            st = os.stat(f"/proc/{pid}/fd/{name}")  # the open file itself, removed or not
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:  # a removed file mapped after its descriptor was closed
                fields = line.split(maxsplit=5)
                if len(fields) < 6 or not fields[5].rstrip().endswith("(deleted)"):
                    continue
                major, minor = (int(x, 16) for x in fields[3].split(":"))
                key = (os.makedev(major, minor), int(fields[4]))
                if key not in seen:
                    seen.add(key)
                    low, high = (int(x, 16) for x in fields[0].split("-"))
                    total += high - low
    except (OSError, ValueError):
        pass
    return total


class DiskWatch:
    """The host process's watcher (`WATCH`): `watch` a child's folder and process, `forget` it before the
    child is ended and waited for; `on_over(used)` is called under the watcher's lock, so never for a child
    forgotten (whose pid may be another process's by then)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[str, int | None, int, Callable[[int], None]]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None

    def watch(self, folder: str, pid: int | None, limit: int, on_over: Callable[[int], None]) -> int:
        with self._lock:
            self._next += 1
            self._watched[self._next] = (folder, pid, limit, on_over)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sandbox-disk-watch", daemon=True)
                self._thread.start()
            return self._next

    def forget(self, key: int | None) -> None:
        with self._lock:
            self._watched.pop(key, None)  # type: ignore[arg-type]

    def check(self) -> None:
        """One look at every watched child (the thread's loop; a test calls it directly)."""
        with self._lock:
            watched = list(self._watched.items())
        for key, (folder, pid, limit, on_over) in watched:
            used = used_bytes(folder, pid)
            if used <= limit:
                continue
            with self._lock:
                if key not in self._watched:
                    continue  # forgotten meanwhile: its child is being ended already
                try:
                    on_over(used)
                except Exception:  # noqa: BLE001 - the watcher serves every other child too
                    log.exception("ending a sandboxed child past its disk limit failed")

    def _run(self) -> None:
        while True:
            time.sleep(CHECK_EVERY_S)
            self.check()


WATCH = DiskWatch()
