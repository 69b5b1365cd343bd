"""Backing up and restoring the SQLite metadata store file."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from metadata.errors import NotFoundError, StoreCorruptError, StoreError
from metadata.sqlite._rows import one_line
from metadata.sqlite.schema import REQUIRED_TABLES
from metadata.sqlite_io import private_file, private_folder


def write_backup(
    db: sqlite3.Connection,
    source: Path,
    target: str | os.PathLike[str],
    retry: Callable[[Callable[[], None]], None],
) -> None:
    """Copy the store open on `db` (file `source`) to `target` with SQLite's online backup: a consistent
    snapshot even while other processes write. It copies in one step, inside one read transaction, which in
    WAL mode never blocks a writer (copying in several steps would restart whenever another process
    commits). The copy is written beside `target` and renamed into place once it passed its integrity
    check. `retry` runs the copy again while the file is locked."""
    path = Path(target)
    staging = path.with_name(path.name + ".partial")
    try:
        private_folder(path.parent)
        staging.unlink(missing_ok=True)
        private_file(staging)
        copy = sqlite3.connect(staging)
        try:
            retry(lambda: db.backup(copy))
            check = copy.execute("PRAGMA quick_check").fetchone()[0]
            # A file of its own (no WAL): reading it later, even read-only, leaves no -wal or -shm beside it.
            copy.execute("PRAGMA journal_mode=DELETE")
        finally:
            copy.close()
        if check != "ok":
            raise StoreCorruptError(
                f"the backup copy of {source} failed its integrity check ({one_line(check)})"
            )
        os.replace(staging, path)
    except (OSError, sqlite3.Error) as exc:
        staging.unlink(missing_ok=True)
        raise StoreError(f"cannot write the backup {path}: {exc}; pick a writable path with -o") from None


def restore_sqlite_store(backup: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path | None:
    """Put a backup made by SqliteMetadataStore.backup in place of the store file `target`; the file it
    replaces is kept as `<target>.bak` (returned; None if there was none). The backup is checked first
    (a SQLite file that passes its integrity check and holds a metadata store), and copied in beside
    the target before anything is moved, so a failure leaves the current store as it was. The caller
    makes sure no process uses the store (eventing.ops.backup refuses while a service runs)."""
    source, path = Path(backup), Path(target)
    if not source.is_file():
        raise NotFoundError(f"backup file {source} does not exist; pass the file `eventing backup` wrote")
    # immutable: nothing writes the backup, so SQLite needs no -wal or -shm beside it (a backup written in WAL
    # mode would otherwise get both, left behind in the backup's folder).
    uri = f"file:{quote(str(source.resolve()))}?mode=ro&immutable=1"
    try:
        db = sqlite3.connect(uri, uri=True)
        try:
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise StoreCorruptError(
            f"backup file {source} is not a SQLite database ({one_line(exc)}); pick another backup"
        ) from None
    if check != "ok":
        raise StoreCorruptError(
            f"backup file {source} failed its integrity check ({one_line(check)}); pick another backup"
        )
    if not REQUIRED_TABLES <= tables:
        raise StoreCorruptError(
            f"backup file {source} is a SQLite database but not an eventing metadata store"
        )
    staging = path.with_name(path.name + ".restoring")
    staging.unlink(missing_ok=True)
    private_file(staging)
    src, copy = sqlite3.connect(uri, uri=True), sqlite3.connect(staging)
    try:
        src.backup(copy)
    finally:
        src.close()
        copy.close()
    kept = None
    if path.exists():
        current = sqlite3.connect(path)
        try:  # fold the WAL into the file, so the .bak is whole on its own
            current.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            current.close()
        kept = path.with_name(path.name + ".bak")
        os.replace(path, kept)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    os.replace(staging, path)
    return kept
