"""Whether a bucket file is usable, and the one line that says why not: the check of a file's header and
size before SQLite opens it (``header_problem``: SQLite would read a damaged bucket as empty or partial), the
count of connections this process has open per file, which keeps that check from costing a live
connection its locks, and the error lines for a damaged file, a full disk or a file unusable otherwise
(``bucket_file_error``), which ``maps_file_errors`` puts on a bucket's reads.
"""

from __future__ import annotations

import functools
import inspect
import os
import sqlite3
import threading
from pathlib import Path
from typing import Protocol

from eventing.errors import EventingError, StoreCorruptError, StoreError
from metadata.sqlite_io import no_space_left

_SQLITE_MAGIC = b"SQLite format 3\x00"


def bucket_name_of(path: Path) -> str:
    """The bucket a file belongs to: ``buckets/NAME.sqlite3`` or ``buckets/NAME.partitions/I.sqlite3``."""
    folder = path.parent.name
    return folder[: -len(".partitions")] if folder.endswith(".partitions") else path.stem


# Connections this process has open, per bucket file. SQLite locks its files with POSIX advisory locks,
# which the kernel drops when the process closes *any* descriptor of the file: reading a file's header with
# open() while one of our own connections holds it left that connection without its locks (another
# process then checkpointed and reset the WAL under it, and a running service stopped seeing new writes).
# Counted, not held weakly: held weakly, a Ray worker read a header under a connection that was still live
# and stopped seeing new writes (a connection can outlive the bucket object that opened it). A bucket never
# closed keeps the raw check of its file off in this process for good, leaving damage to SQLite's own
# checks: never unsafe.
_open_connections: dict[Path, int] = {}
_open_lock = threading.Lock()


class _OpenFile(Protocol):
    """A connection to a bucket file (eventing.storage.bucket_file.BucketFile)."""

    path: Path


def _connections_opened(bucket: _OpenFile) -> None:
    with _open_lock:
        _open_connections[bucket.path] = _open_connections.get(bucket.path, 0) + 1


def _connections_closed(bucket: _OpenFile) -> None:
    with _open_lock:
        left = _open_connections.get(bucket.path, 0) - 1
        if left > 0:
            _open_connections[bucket.path] = left
        else:
            _open_connections.pop(bucket.path, None)


def header_problem(path: Path) -> str | None:
    """What is wrong with a bucket file that its first 100 bytes and its size show (cut short, not a SQLite
    file), without opening it; None when nothing shows. SQLite itself would read an empty file as an empty
    database and a truncated one as zeros past the end, so a damaged bucket would look empty or partial.
    Not read while this process has a connection to the file (see _open_connections): SQLite's own checks
    and errors speak for it then."""
    if _open_connections.get(path):
        return None
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            header = f.read(100)
    except FileNotFoundError:
        return None  # the caller reports a missing file
    except OSError as exc:
        return f"cannot be read: {exc.strerror}"
    if size == 0:
        return "truncated to 0 bytes"
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        return (
            "not a SQLite file: its header is overwritten"
            if len(header) == 100
            else f"truncated to {size} bytes"
        )
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        return "its header is overwritten (page size)"
    pages = int.from_bytes(header[28:32], "big")
    # The page count is valid while the change counter matches (offsets 24 and 92): SQLite's own rule. A
    # checkpoint in another process writes the first page (the new count) before the pages that grow the
    # file, so the count is compared only while no WAL is there to be checkpointed.
    if header[24:28] == header[92:96] and pages and size < pages * page_size and not _has_wal(path):
        return f"truncated to {size:,} of {pages * page_size:,} bytes"
    if size % page_size:
        return f"truncated to {size:,} bytes, not a whole number of {page_size}-byte pages"
    return None


def _has_wal(path: Path) -> bool:
    try:
        return os.stat(f"{path}-wal").st_size > 0
    except OSError:
        return False


def damaged_bucket_error(path: Path, detail: object) -> StoreCorruptError:
    name = bucket_name_of(path)
    return StoreCorruptError(
        f"bucket file {path} is damaged ({_one_line(detail)}); stop eventing, then put back a backup copy of "
        f"the file, or drop the bucket (`eventing bucket drop {name}`) and create and load it again; "
        "see 'Faults and recovery' in docs/operations.md"
    )


def disk_full_error(path: Path, detail: object) -> StoreError:
    folder = path.parent
    return StoreError(
        f"cannot write {path}: the disk is full ({_one_line(detail)}); free space on the file system of "
        f"{folder} (see `df {folder}`), then run the command again (everything committed is kept)"
    )


def bucket_file_error(path: Path, exc: sqlite3.DatabaseError) -> EventingError:
    """One line for SQLite's error on a bucket file: damage (the way out), a full disk (free space: SQLite
    says "disk I/O error" when it cannot grow its shared-memory file), or the file unusable otherwise."""
    message = str(exc)
    if type(exc) is sqlite3.DatabaseError or "malformed" in message or "not a database" in message:
        return damaged_bucket_error(path, message)
    if "full" in message or no_space_left(path.parent):
        return disk_full_error(path, message)
    return StoreError(
        f"cannot use bucket file {path} ({_one_line(message)}); check the permissions and the free space of "
        f"{path.parent}, then run the command again"
    )


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


def maps_file_errors(method):
    """Make SQLite's errors in a read of a bucket file one line naming the file (bucket_file_error),
    wherever the read happens: a CLI command, a worker, the data service. For methods of the objects that
    read a LocalBucket's file (its reader, effect applier, info table, the bucket itself), each holding the
    file as ``self.file`` (eventing.storage.bucket_file)."""
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def generator(self, *args, **kwargs):
            try:
                yield from method(self, *args, **kwargs)
            except sqlite3.DatabaseError as exc:
                raise bucket_file_error(self.file.path, exc) from None

        return generator

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.DatabaseError as exc:
            raise bucket_file_error(self.file.path, exc) from None

    return wrapper
