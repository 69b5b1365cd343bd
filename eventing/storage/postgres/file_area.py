"""A file area in a PostgreSQL store (``eventing.storage.file_area.FileArea``): one row per file in
``eventing_files``, keyed by (root, folder, name), its bytes a BYTEA. A write is one upsert, so a reader
sees the old file or the whole new one, and it is durable once the statement returns (committed);
every statement is safe to run again, so each is retried while the server restarts or fails over
(``PostgresDatabase.run``). Nothing is kept on this machine: ``local_path`` is None.

    area = PostgresArea(PostgresDatabase.open("postgresql://user@host/db"), "windows/fn_sales")
    area.write("incoming/g1-w0-1a2b-000000000.arrow", data)
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

from eventing.storage.file_area import Data, check_folder, split_name
from metadata.postgres.connection import PostgresDatabase, ensure_schema

TABLE = "eventing_files"
SCHEMA_VERSION = 1
DDL = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} ("
    " root TEXT NOT NULL, folder TEXT NOT NULL, name TEXT NOT NULL, data BYTEA NOT NULL,"
    " written_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (root, folder, name))",
    # Row files are Arrow (uncompressed, read as a whole) and partials Parquet (compressed already):
    # stored out of line without pglz, which would cost the server's CPU for little.
    f"ALTER TABLE {TABLE} ALTER COLUMN data SET STORAGE EXTERNAL",
)

_ready: set[tuple[str, str | None]] = set()
_ready_lock = threading.Lock()


def ensure_files_table(db: PostgresDatabase) -> None:
    """Create the files table on first use (once per process and store)."""
    key = (db.target.url, db.target.schema)
    if key in _ready:
        return
    with _ready_lock:
        if key not in _ready:
            ensure_schema(db, "files", SCHEMA_VERSION, DDL)
            _ready.add(key)


class PostgresArea:
    """The files under ``root`` (``windows/<function>``) in a PostgreSQL store (see the module docstring)."""

    def __init__(self, db: PostgresDatabase, root: str):
        check_folder(root)
        self.db = db
        self.root = root
        ensure_files_table(db)

    @classmethod
    def open(cls, url: str, root: str) -> PostgresArea:
        return cls(PostgresDatabase.open(url), root)

    def _run(self, sql: str, args: tuple) -> int:
        """One statement (autocommit, retried while the server is away); the rows it changed."""
        return self.db.run(lambda conn: conn.execute(sql, args).rowcount)

    def write(self, name: str, data: Data) -> None:
        folder, file = split_name(name)
        self._run(
            f"INSERT INTO {TABLE} (root, folder, name, data) VALUES (%s, %s, %s, %b)"
            " ON CONFLICT (root, folder, name) DO UPDATE SET data = excluded.data, written_at = now()",
            (self.root, folder, file, data),
        )

    def read(self, name: str) -> bytes:
        folder, file = split_name(name)
        row = self.db.run(
            lambda conn: conn.execute(
                f"SELECT data FROM {TABLE} WHERE root = %s AND folder = %s AND name = %s",
                (self.root, folder, file),
                binary=True,
            ).fetchone()
        )
        if row is None:
            raise FileNotFoundError(f"no file {self.describe(name)}")
        return bytes(row[0])

    def list(self, folder: str) -> list[str]:
        rows = self.db.run(
            lambda conn: conn.execute(
                f"SELECT name FROM {TABLE} WHERE root = %s AND folder = %s", (self.root, check_folder(folder))
            ).fetchall()
        )
        return sorted(name for (name,) in rows if not name.startswith("."))

    def exists(self, name: str) -> bool:
        folder, file = split_name(name)
        return (
            self.db.run(
                lambda conn: conn.execute(
                    f"SELECT 1 FROM {TABLE} WHERE root = %s AND folder = %s AND name = %s",
                    (self.root, folder, file),
                ).fetchone()
            )
            is not None
        )

    def delete(self, name: str) -> None:
        folder, file = split_name(name)
        self._run(
            f"DELETE FROM {TABLE} WHERE root = %s AND folder = %s AND name = %s", (self.root, folder, file)
        )

    def delete_many(self, names: Iterable[str]) -> None:
        pairs = [split_name(name) for name in names]
        if not pairs:
            return
        self._run(
            f"DELETE FROM {TABLE} WHERE root = %s AND (folder, name) IN"
            " (SELECT * FROM unnest(%s::text[], %s::text[]))",
            (self.root, [f for f, _ in pairs], [n for _, n in pairs]),
        )

    def delete_folder(self, folder: str) -> None:
        if not check_folder(folder):
            raise ValueError("delete_folder needs a folder inside the area, not its top")
        self._run(
            f"DELETE FROM {TABLE} WHERE root = %s AND (folder = %s OR starts_with(folder, %s))",
            (self.root, folder, folder + "/"),
        )

    def copy(self, source: str, target: str) -> None:
        src_folder, src_name = split_name(source)
        folder, file = split_name(target)
        copied = self._run(
            f"INSERT INTO {TABLE} (root, folder, name, data) SELECT root, %s, %s, data FROM {TABLE}"
            " WHERE root = %s AND folder = %s AND name = %s"
            " ON CONFLICT (root, folder, name) DO UPDATE SET data = excluded.data, written_at = now()",
            (folder, file, self.root, src_folder, src_name),
        )
        if not copied:
            raise FileNotFoundError(f"no file {self.describe(source)}")

    def local_path(self, name: str) -> Path | None:
        return None

    def describe(self, name: str) -> str:
        return f"{self.root}/{name} in {self.db.target.shown}"

    def __repr__(self) -> str:
        return f"<PostgresArea {self.root} in {self.db.target.shown}>"
