"""The SQLite metadata store's file: opened only when it holds a store, created whole, readable by its owner
alone.

A file that exists is a store someone made: one that is empty (truncated to 0 bytes) or holds no store's
tables is damaged, and is reported as such (StoreCorruptError, one line naming the way out), never made a
new, empty store: that would silently drop every function and user (and a server protected by users would
open to anonymous callers). Making a new store out of it is an explicit act: `eventing restore BACKUP`, or
moving the file aside. A new store is written beside its place with its schema and linked into place, so no
process ever sees it half made (another process's store, linked first, wins). Store files are 0600 in a
0700 folder: they hold password hashes and URL-binding secrets (SQLite gives its -wal and -shm files the
database file's permissions).
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from pathlib import Path

from metadata.errors import NotFoundError, StoreCorruptError, StoreError
from metadata.sqlite._rows import CORRUPT_RECOVERY, one_line
from metadata.sqlite.schema import REQUIRED_TABLES, apply_schema
from metadata.sqlite_io import private_file, private_folder


def connect_store_file(path: Path, *, create: bool, timeout_s: float) -> sqlite3.Connection:
    """A connection to the store file `path`, checked to hold a store; a missing file is created with the
    store's schema when `create`, else NotFoundError."""
    if not path.exists():
        if not create:
            raise NotFoundError(
                f"metadata store {path} does not exist; deploy a function first or pass the right --data-dir"
            )
        _create(path)
    try:
        empty = path.stat().st_size == 0
    except OSError as exc:
        raise StoreError(
            f"cannot open metadata store {path}: {exc}; check that the data directory is readable"
        ) from None
    if empty:
        raise _damaged(path, "truncated to 0 bytes")
    try:
        db = sqlite3.connect(path, timeout=timeout_s, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(
            f"cannot open metadata store {path}: {exc}; check that the data directory is writable"
        ) from None
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        db.close()
        if type(exc) is not sqlite3.DatabaseError and "locked" in str(exc):
            raise StoreError(
                f"cannot open metadata store {path}: {exc}; another process holds it, try again"
            ) from None
        raise StoreCorruptError(
            f"metadata store {path} is damaged (not a valid SQLite database: {one_line(exc)}); "
            f"{CORRUPT_RECOVERY}"
        ) from None
    if not REQUIRED_TABLES <= tables:
        db.close()
        raise _damaged(path, "a SQLite file without the store's tables")
    return db


def _damaged(path: Path, what: str) -> StoreCorruptError:
    return StoreCorruptError(
        f"metadata store {path} is damaged ({what}); it was not made a new, empty store; {CORRUPT_RECOVERY}"
    )


def _create(path: Path) -> None:
    """Write a new store beside `path` and link it into place (a store linked there first is kept)."""
    try:
        private_folder(path.parent)
        staging = path.with_name(f".{path.name}.new-{os.getpid()}-{secrets.token_hex(4)}")
        private_file(staging)
        try:
            db = sqlite3.connect(staging, isolation_level=None)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                apply_schema(db)
            finally:
                db.close()  # the last connection: SQLite folds the WAL in and removes it
            try:
                os.link(staging, path)
            except FileExistsError:
                pass  # another process made the store first
            except OSError:  # a file system without hard links
                if not path.exists():
                    os.replace(staging, path)
        finally:
            for leftover in (staging, Path(f"{staging}-wal"), Path(f"{staging}-shm")):
                leftover.unlink(missing_ok=True)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(
            f"cannot create metadata store {path}: {exc}; check that the data directory is writable"
        ) from None
