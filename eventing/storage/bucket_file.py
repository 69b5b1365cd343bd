"""One open bucket file (``BucketFile``): what the parts of a ``LocalBucket`` share about it, in one place.

A ``LocalBucket`` (eventing.storage.bucket) is a facade over collaborators that each own one job on the
same file: the writer (eventing.storage.writes), the reader (eventing.storage.reads), the effect applier
(eventing.storage.effects) and the info table (eventing.storage.info_table). They are given this object
when they are made, and this is all they share: the file's path and the bucket's name, the connection, the
count of this connection's commits, the WAL checkpoint size the connection has now, the vBuckets the
current transaction logged writes in and where to tell a running service about them (eventing.storage.wake),
and the high seqnos last read with the (data_version, commits, spans) they were read at.

``transaction`` is the one way a part writes: a write transaction that waits its turn among the file's
writers (eventing.storage.write_turns), is retried while the file is locked or its disk is full, sizes the
WAL checkpoint to what it changed, and once committed tells a running service which vBuckets it wrote.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from eventing.storage import wake, write_turns
from eventing.storage.file_health import _connections_closed, _connections_opened
from eventing.storage.files import (
    SMALL_TX_CHECKPOINT_PAGES,
    SMALL_TX_ROWS,
    WAL_AUTOCHECKPOINT_PAGES,
    _retry_locked,
)
from eventing.storage.values import Spans
from metadata.sqlite_io import run_transaction

T = TypeVar("T")

# Workers writing one bucket wait for its write lock by trying every millisecond rather than in SQLite's
# busy handler, whose sleeps grow to 100 ms (see metadata.sqlite_io.begin_polling).
WRITE_LOCK_POLL_S = 0.001


class BucketFile:
    """An open bucket file and the state the parts of its LocalBucket share (see the module docstring)."""

    def __init__(self, path: Path, name: str, db: sqlite3.Connection):
        self.path = path
        self.name = name
        self.db = db
        self.closed = False
        _connections_opened(self)  # before any read: a failing read still closes
        # This connection's commits: SQLite's data_version counts only the other connections' ones.
        self.commits = 0
        self.checkpoint_pages = (
            WAL_AUTOCHECKPOINT_PAGES  # the connection's wal_autocheckpoint, as _connect sets it
        )
        # vBuckets the current transaction logged writes in: once it commits, a running service is told
        # (eventing.storage.wake), so the workers owning them need not wait for their next poll.
        self.written: set[int] = set()
        self.wake_path = wake.socket_path(wake.data_dir_of_bucket_file(path))
        # The high seqnos last read, and the (data_version, commits, spans) they were read at.
        self.highs: list[int] = []
        self.highs_read_at: tuple[int, int, Spans | None] = (-1, -1, None)

    def transaction(self, body: Callable[[], T]) -> T:
        """Run ``body`` in a write transaction of this file, again while the file is locked or its disk is
        full (``body`` must be safe to run again: a whole transaction, its inputs in memory)."""
        return _retry_locked(self.path, lambda: self._once(body))

    def _once(self, body: Callable[[], T]) -> T:
        written = self.written
        written.clear()  # a retried transaction logs again
        db = self.db

        def sized_body() -> T:
            before = db.total_changes
            out = body()
            pages = (
                SMALL_TX_CHECKPOINT_PAGES
                if db.total_changes - before < SMALL_TX_ROWS
                else WAL_AUTOCHECKPOINT_PAGES
            )
            if pages != self.checkpoint_pages:  # SQLite checkpoints (if due) right after this COMMIT
                db.execute(f"PRAGMA wal_autocheckpoint={pages}")
                self.checkpoint_pages = pages
            return out

        with write_turns.turn(self.path):
            try:
                result = run_transaction(db, self.path, sized_body, poll_lock_s=WRITE_LOCK_POLL_S)
            finally:
                self.commits += 1
                write_turns.keep_wal_short(self.db, self.path)
        if written:
            wake.notify(self.wake_path, self.name, written)
            written.clear()
        return result

    def forget_highs(self) -> None:
        """The next high_seqnos reads the table again (after a write that did not go through transaction)."""
        self.highs_read_at = (-1, -1, None)

    def checkpoint_wal(self) -> None:
        """Move the WAL's pages into the file and empty the WAL (before the file is deleted or copied)."""
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            _connections_closed(self)
        self.db.close()
