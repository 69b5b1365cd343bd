"""SQLite write discipline shared by the SQLite metadata backend (metadata/sqlite/) and the local buckets
(eventing/storage): transactions that roll back cleanly, and retries while a file is locked by another process
or its disk is full. Not private to the backend, so it sits beside metadata/sqlite/, not in it."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from metadata.errors import StoreError, StoreLockedError

log = logging.getLogger("eventing.metadata")

T = TypeVar("T")

# How long a write waits, retrying, for a lock to be released or for disk space to come back before it
# fails: $EVENTING_STORE_WAIT_S seconds, 60 by default.
STORE_WAIT_ENV = "EVENTING_STORE_WAIT_S"
DEFAULT_STORE_WAIT_S = 60.0

# Files of a data directory are its owner's alone: the metadata store holds password hashes and URL-binding
# secrets, buckets and backups the documents. A SQLite file gets these modes when it is made (SQLite gives
# its -wal and -shm files the database file's mode); folders, parents included, are made 0700.
PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700


def private_folder(folder: str | os.PathLike[str]) -> Path:
    """Create `folder` and its missing parents as 0700 folders (existing ones are left as they are)."""
    path = missing = Path(folder)
    created = []
    while not missing.exists():
        created.append(missing)
        missing = missing.parent
    for each in reversed(created):
        each.mkdir(mode=PRIVATE_FOLDER, exist_ok=True)
    return path


def private_file(path: str | os.PathLike[str]) -> None:
    """Create `path` empty with mode 0600 when it does not exist, for SQLite to make a database of."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
    except FileExistsError:
        pass


# Fault injection for tests: when set, called with the file's path inside every write transaction of a
# metadata store or a local bucket, right before COMMIT. Raising there (for example
# sqlite3.OperationalError("database or disk is full")) fails the transaction as the storage would.
write_fault: Callable[[Path], None] | None = None


def retry_locked(path: Path, fn: Callable[[], T], lock_wait_s: float | None = None) -> T:
    """Run fn; while SQLite says the file is locked, or its disk is full, warn once and retry.

    Waits up to lock_wait_s (None: $EVENTING_STORE_WAIT_S, default 60s), then fails with StoreLockedError
    or StoreError naming the fix. fn must be safe to run again: a whole transaction, its inputs in memory.
    A caller that waits here is paused, not skipping: nothing moves past the write that failed.
    """
    started = time.monotonic()
    warned = False
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            msg = str(exc)
            # SQLITE_FULL says "database or disk is full"; SQLite says "disk I/O error" instead when it cannot
            # grow its WAL or shared-memory file, so that counts as full when the file system has no space.
            full = "full" in msg or ("disk I/O error" in msg and no_space_left(path.parent))
            if not full and not _is_lock_wait(msg):
                if "readonly" in msg or "unable to open" in msg or "disk" in msg:
                    raise StoreError(
                        f"cannot write {path}: {msg}; check permissions and free space of the data directory"
                    ) from None
                raise
            wait_s = store_wait_s() if lock_wait_s is None else lock_wait_s
            if time.monotonic() - started >= wait_s:
                if full:
                    raise StoreError(
                        f"cannot write {path}: the disk is full ({msg}) and stayed full for {wait_s:.0f}s; "
                        f"free space on the file system of {path.parent} (see `df {path.parent}`), then run "
                        "the command again (everything committed is kept: processing resumes after the last "
                        "checkpoint)"
                    ) from None
                raise StoreLockedError(
                    f"{path} stayed locked by another process for {wait_s:.0f}s; "
                    f"stop the process holding it (see `fuser {path}`)"
                ) from None
            if not warned:
                if full:
                    log.warning("%s: the disk is full; waiting for free space (up to %.0fs)", path, wait_s)
                else:
                    log.warning("%s is locked by another process; waiting (up to %.0fs)", path, wait_s)
                warned = True
            time.sleep(0.05 if not full else 0.2)


def run_transaction(
    db: sqlite3.Connection, path: Path, body: Callable[[], T], *, poll_lock_s: float | None = None
) -> T:
    """BEGIN IMMEDIATE, body, COMMIT; on any failure (the body, an injected fault, the COMMIT itself) roll
    back if SQLite has not already done so (it does on SQLITE_FULL), so a retry starts clean.

    ``poll_lock_s``: wait for the write lock by trying again every this many seconds (see
    begin_polling) instead of in SQLite's busy handler."""
    if poll_lock_s is None:
        db.execute("BEGIN IMMEDIATE")
    else:
        begin_polling(db, poll_lock_s)
    try:
        out = body()
        if write_fault is not None:
            write_fault(path)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return out


def begin_polling(db: sqlite3.Connection, poll_s: float) -> None:
    """BEGIN IMMEDIATE, waiting for the write lock by trying again every ``poll_s`` for as long as the
    connection's busy timeout (then "database is locked", as SQLite's own wait ends).

    SQLite's busy handler sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100 ms between tries, so a
    writer that has waited a while sleeps on through most of the next holder's transaction while the
    lock goes to whoever asks at the right moment. Several workers writing one bucket queue like that
    all the time: polling every millisecond took W3 (`scripts/bench.py --workload writing --runs 4`)
    from medians of 1.35-1.40 to 1.51-1.61.
    Other statements keep SQLite's busy handler (reads rarely wait; recovery after a crash does)."""
    with without_busy_wait(db) as timeout_ms:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            try:
                db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not _is_lock_wait(str(exc)) or time.monotonic() >= deadline:
                    raise
            time.sleep(poll_s)


@contextmanager
def without_busy_wait(db: sqlite3.Connection) -> Iterator[int]:
    """Statements inside fail at once on a lock instead of waiting in SQLite's busy handler; yields the
    connection's busy timeout (ms), which is restored after."""
    timeout_ms = db.execute("PRAGMA busy_timeout").fetchone()[0]
    db.execute("PRAGMA busy_timeout=0")
    try:
        yield timeout_ms
    finally:
        db.execute(f"PRAGMA busy_timeout={int(timeout_ms)}")


def _is_lock_wait(message: str) -> bool:
    """SQLITE_LOCKED or SQLITE_BUSY: another connection holds the lock ("database is locked")."""
    return "locked" in message or "busy" in message


def no_space_left(folder: Path) -> bool:
    """Less than a MB free on folder's file system: SQLite cannot grow its files."""
    try:
        stats = os.statvfs(folder)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < 1 << 20


def store_wait_s() -> float:
    raw = os.environ.get(STORE_WAIT_ENV)
    try:
        return float(raw) if raw else DEFAULT_STORE_WAIT_S
    except ValueError:
        log.warning("%s=%r is not a number of seconds; using %.0f", STORE_WAIT_ENV, raw, DEFAULT_STORE_WAIT_S)
        return DEFAULT_STORE_WAIT_S
