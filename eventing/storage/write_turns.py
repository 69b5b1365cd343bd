"""Writers of one bucket file take turns, and the writer whose turn it is keeps the WAL short.

SQLite lets one connection write at a time, but it does not keep the WAL short while several processes
write without pause. Its automatic checkpoint runs after a commit, outside the write lock, and the WAL
starts over only once every frame has been copied back into the database file. With four workers
committing one after another, the checkpoint never catches up. Over 1,000,000 effect writes the WAL grew
to 420 MB (one writer alone: 63 MB), and every page read searched a longer WAL index.

So the writers of a bucket file take turns here, with an flock on a side file (``<file>-wlock``). SQLite's
own checkpoint still runs (every ~40 MB, see bucket._connect), inside the commit and so inside the turn:
nobody appends while it runs, it completes, and the next write starts the WAL over (over 1M effect writes
by four workers the WAL file stayed at most 45 MB). Should the WAL file grow past ``WAL_LIMIT_BYTES`` all
the same (a reader on an old snapshot, say), the writer whose turn it is checkpoints it (TRUNCATE) before
it passes the turn on. (Truncating after every ~40 MB instead cost a writer alone 10% more CPU and 15%
more time, to grow the file again.)

The turns are only an arrangement between this project's processes; SQLite's own locks still decide who
writes, so a writer that does not take turns (the sqlite3 shell) is waited for as before. Within a process,
threads take turns on a lock of their own, and the process holds one descriptor per file: flock locks
belong to open file descriptions, so two descriptors of one process would exclude each other.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from pathlib import Path

from metadata.sqlite_io import PRIVATE_FILE, without_busy_wait

# Four times SQLite's own checkpoint interval (bucket.WAL_AUTOCHECKPOINT_PAGES). A writer alone never
# gets here: its WAL file peaks at 63-82 MB with transactions of 10,000 writes, and SQLite's checkpoint
# keeps it there. Writers that keep SQLite's checkpoint from catching up do get here.
WAL_LIMIT_BYTES = 160_000_000
TURN_SUFFIX = "-wlock"


class _Turn:
    """One bucket file's turn in this process: a thread lock, then the flock that other processes see."""

    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()
        self.fd: int | None = None
        self.flocked = False

    def __enter__(self) -> _Turn:
        self.lock.acquire()
        try:
            if self.fd is None:
                self.fd = os.open(
                    f"{self.path}{TURN_SUFFIX}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE
                )
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            self.flocked = True
        except OSError:
            # No side file (a read-only folder) or no flock (some network file systems): write without
            # turns. SQLite's locks still decide, and a write that cannot happen fails as it always did.
            pass
        except BaseException:
            self.lock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.flocked and self.fd is not None:
                self.flocked = False
                fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self.lock.release()

    def close(self) -> None:
        with self.lock:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None


_turns: dict[str, _Turn] = {}
_turns_lock = threading.Lock()


def turn(path: Path | str) -> _Turn:
    """The context manager that gives this thread the turn to write the bucket file at ``path``."""
    key = str(path)
    found = _turns.get(key)
    if found is None:
        with _turns_lock:
            found = _turns.setdefault(key, _Turn(key))
    return found


def forget(path: Path | str) -> None:
    """Close this process's descriptor of a file's turn (the bucket is being dropped)."""
    with _turns_lock:
        found = _turns.pop(str(path), None)
    if found is not None:
        found.close()


def _after_fork_in_child() -> None:
    # A forked child shares its parent's open file descriptions, hence its flocks: it opens its own.
    global _turns, _turns_lock
    _turns, _turns_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def keep_wal_short(db: sqlite3.Connection, path: Path | str) -> None:
    """Called by the writer whose turn it is, after its transaction: when the WAL file has grown past
    ``WAL_LIMIT_BYTES``, copy it back into the database file and truncate it.

    Never waits. A reader still on an older snapshot keeps the frames it needs, and the WAL is truncated
    at a later turn; meanwhile writers go on, because the busy timeout is 0 for the checkpoint. (The WAL's
    size is read from the file, never from SQLite's ``-shm`` index: closing any descriptor of a file drops
    the process's POSIX locks on it, SQLite's included, and other processes then reset the index under
    this one's mapping.)"""
    try:
        size = os.stat(f"{path}-wal").st_size
    except OSError:
        return
    if size <= WAL_LIMIT_BYTES:
        return
    try:
        with without_busy_wait(db):
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    except sqlite3.Error:
        pass  # best effort: the next turn tries again
