"""SqliteMetadataStore: the embedded default metadata store, one WAL file shared by every process.

The store's logic is metadata/sql/ (shared with the PostgreSQL store); this is SQLite's part of it: the
file, its transactions (BEGIN IMMEDIATE: one writer at a time, so no row locks), IN lists in chunks, the
integrity check and the online backup.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from metadata.errors import StoreCorruptError
from metadata.sql.rows import SqlDb
from metadata.sql.store import SqlMetadataStore
from metadata.sqlite._rows import CORRUPT_RECOVERY, one_line
from metadata.sqlite.backup import write_backup
from metadata.sqlite.schema import apply_schema
from metadata.sqlite.store_file import connect_store_file
from metadata.sqlite.window_state import SqliteWindowStateStore
from metadata.sqlite_io import retry_locked, run_transaction

T = TypeVar("T")

# How long one statement waits for another process's write lock before we log and retry.
BUSY_TIMEOUT_MS = 2000


class SqliteMetadataStore(SqlMetadataStore):
    """MetadataStore on one SQLite file in WAL mode: a writer and readers in other processes at once.

    Writes that find the file locked for longer than BUSY_TIMEOUT_MS are retried with a warning for up to
    `lock_wait_s`, then fail with StoreLockedError: processing waits, it never skips a checkpoint.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, lock_wait_s: float | None = None, create: bool = True
    ):
        self.path = Path(path)
        self.lock_wait_s = lock_wait_s  # None: $EVENTING_STORE_WAIT_S, default 60s (see retry_locked)
        self._update_sql: dict[tuple[str, tuple[str, ...]], str] = {}
        # A file without a store is damaged, never made a new one (metadata.sqlite.store_file).
        self._db = connect_store_file(self.path, create=create, timeout_s=BUSY_TIMEOUT_MS / 1000)
        try:
            self._retry(self._setup)
        except sqlite3.DatabaseError as exc:
            raise StoreCorruptError(
                f"metadata store {self.path} is damaged (not a valid SQLite database: {one_line(exc)}); "
                f"{CORRUPT_RECOVERY}"
            ) from None

    def _setup(self) -> None:
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        apply_schema(self._db)

    def verify_integrity(self) -> None:
        """Fail closed on a truncated or corrupted file rather than resume from a wrong checkpoint."""
        try:
            result = self._db.execute("PRAGMA quick_check").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            result = str(exc)
        if result != "ok":
            raise StoreCorruptError(
                f"metadata store {self.path} failed its integrity check ({one_line(result)}); "
                f"{CORRUPT_RECOVERY}"
            )

    # -- transactions -------------------------------------------------------------------------------

    def _retry(self, fn: Callable[[], T]) -> T:
        try:
            return retry_locked(self.path, fn, self.lock_wait_s)
        except sqlite3.DatabaseError as exc:
            if type(exc) is not sqlite3.DatabaseError:  # a subclass: a bug or a constraint, not damage
                raise
            raise StoreCorruptError(
                f"metadata store {self.path} is damaged ({one_line(exc)}); {CORRUPT_RECOVERY}"
            ) from None

    def _tx(self, body: Callable[[sqlite3.Connection], T]) -> T:
        return self._retry(lambda: run_transaction(self._db, self.path, lambda: body(self._db)))

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        return self._retry(lambda: self._db.execute(sql, args).fetchall())

    # -- SQLite's dialect (see metadata.sql.base) -----------------------------------------------------

    def _in_vbs(self, vbs: Sequence[int]) -> tuple[str, tuple]:
        return ",".join("?" * len(vbs)), tuple(vbs)

    def _select_vbs(
        self, db: SqlDb, sql: str, function: str, vbs: list[int], *, lock: bool = False
    ) -> list[tuple]:
        """IN lists in chunks that stay under SQLite's variable limit; no row locks (one writer at a time)."""
        out: list[tuple] = []
        for i in range(0, len(vbs), 500):
            chunk = vbs[i : i + 500]
            out.extend(db.execute(sql.format(",".join("?" * len(chunk))), (function, *chunk)).fetchall())
        return out

    def _update_checkpoints(
        self, db: SqlDb, function: str, columns: Sequence[str], rows: list[tuple]
    ) -> None:
        # Each row as it comes, (vb, values...), by numbered parameters; the function is a quoted literal, so
        # no row is copied to add it (a commit of 256 vBuckets made 256 tuples for nothing).
        key = (function, tuple(columns))
        sql = self._update_sql.get(key)
        if sql is None:
            sets = ", ".join(f"{c}=?{i}" for i, c in enumerate(columns, start=2))
            literal = function.replace("'", "''")
            sql = f"UPDATE checkpoints SET {sets} WHERE function='{literal}' AND vb=?1"
            if len(self._update_sql) < 256:
                self._update_sql[key] = sql
        db.executemany(sql, rows)

    def _label_moves(self, db: SqlDb, how: str) -> int:
        # The trigger logs every backwards UPDATE as 'applied'; the rows it adds from here are relabelled.
        return int(db.execute("SELECT COALESCE(MAX(rowid), 0) FROM checkpoint_regressions").fetchone()[0])

    def _relabel_moves(self, db: SqlDb, mark: int, how: str, now: float, function: str) -> None:
        db.execute(
            "UPDATE checkpoint_regressions SET how=?, at=? WHERE rowid>? AND function=?",
            (how, now, mark, function),
        )

    # -- the file -------------------------------------------------------------------------------------

    def window_states(self) -> SqliteWindowStateStore:
        """The window coordinators' fenced state, in this store's file and transactions."""
        return SqliteWindowStateStore(self)

    def close(self) -> None:
        self._db.close()

    def backup(self, target: str | os.PathLike[str]) -> None:
        """A consistent copy of the store at `target`, even while other processes write (see write_backup)."""
        write_backup(self._db, self.path, target, self._retry)
