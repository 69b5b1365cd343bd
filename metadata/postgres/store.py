"""PostgresMetadataStore: the metadata store on a PostgreSQL server, for deployments whose state lives on a
database server rather than in a data directory.

The store's logic is metadata/sql/ (shared with the SQLite store); this is PostgreSQL's part of it: the
connections (metadata.postgres.connection: a pool per process, transactions retried whole while the server
restarts or fails over), vBucket lists as arrays (one statement for any number of vBuckets), bulk updates
of checkpoints as one UPDATE ... FROM unnest(...), row locks where SQLite's single writer needed none
(SELECT ... FOR UPDATE in vBucket order), the regression trigger in PL/pgSQL, and an integrity check of
the tables. Transactions run at READ COMMITTED: every read-then-write locks what it read first, so two
writers of the same rows queue as they do on SQLite's write lock, and writers of different vBuckets do not.

    store = PostgresMetadataStore("postgresql://eventing@db.example.com/eventing")
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from metadata.errors import StoreCorruptError, StoreError
from metadata.postgres.connection import Cursor, PostgresDatabase, ensure_schema
from metadata.postgres.schema import CHECKPOINT_TYPES, COMPONENT, DDL, MOVE_SETTING, OWN_COLUMNS, VERSION
from metadata.sql.rows import SqlDb
from metadata.sql.store import SqlMetadataStore
from metadata.sql.tables import TABLES
from metadata.sql.window_state import SqlWindowStateStore

T = TypeVar("T")

_ARRAY = "SELECT unnest(?::bigint[])"


class PostgresMetadataStore(SqlMetadataStore):
    """MetadataStore on PostgreSQL; `location` is a libpq URL (see metadata.postgres.connection for what it
    takes, `schema=` included) or an open PostgresDatabase. The schema is created on first use."""

    LOCK = " FOR UPDATE"
    LEAST = "LEAST"

    def __init__(self, location: str | PostgresDatabase):
        self.db = location if isinstance(location, PostgresDatabase) else PostgresDatabase.open(str(location))
        self.where = f"PostgreSQL store {self.db.target.shown}"
        ensure_schema(self.db, COMPONENT, VERSION, DDL)

    # -- transactions -----------------------------------------------------------------------------------

    def _tx(self, body: Callable[[Cursor], T]) -> T:
        return self.db.transaction(body)

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        return self.db.read(sql, args)

    # -- PostgreSQL's dialect (see metadata.sql.base) ---------------------------------------------------

    def _in_vbs(self, vbs: Sequence[int]) -> tuple[str, tuple]:
        return _ARRAY, (list(vbs),)

    def _select_vbs(self, db: SqlDb, sql: str, function: str, vbs: list[int], *, lock: bool = False) -> list[tuple]:
        """One statement for any number of vBuckets; `lock` takes the rows' locks in vBucket order (so two
        transactions locking overlapping sets wait for each other rather than deadlock)."""
        if not vbs:
            return []
        sql = sql.format(_ARRAY) + (" ORDER BY vb FOR UPDATE" if lock else "")
        return list(db.execute(sql, (function, list(vbs))).fetchall())

    def _update_checkpoints(self, db: SqlDb, function: str, columns: Sequence[str], rows: list[tuple]) -> None:
        if not rows:
            return
        sets = ", ".join(f"{c}=v.{c}" for c in columns)
        arrays = ", ".join(f"?::{CHECKPOINT_TYPES[c]}[]" for c in columns)
        db.execute(
            f"UPDATE checkpoints AS c SET {sets} FROM unnest(?::bigint[], {arrays}) AS v(vb, {', '.join(columns)}) "
            "WHERE c.function=? AND c.vb=v.vb",
            (*(list(column) for column in zip(*rows, strict=True)), function),
        )

    def _label_moves(self, db: SqlDb, how: str) -> None:
        # The trigger labels the moves of this transaction with the setting, instead of 'applied'.
        db.execute("SELECT set_config(?, ?, true)", (MOVE_SETTING, how))

    def _relabel_moves(self, db: SqlDb, mark: Any, how: str, now: float, function: str) -> None:
        pass  # labelled as they were logged

    # -- the server -------------------------------------------------------------------------------------

    def window_states(self) -> SqlWindowStateStore:
        """The window coordinators' fenced state, in this store's database and transactions."""
        return SqlWindowStateStore(self)

    def verify_integrity(self) -> None:
        """Every table of the schema is there with its columns, readable, and the regression trigger is in
        place; StoreCorruptError naming what is not. (The server checks its own pages: data checksums.)"""
        found: dict[str, list[str]] = {}
        for table, column in self._read(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema=current_schema() "
            "ORDER BY table_name, ordinal_position"
        ):
            found.setdefault(table, []).append(column)
        problems = []
        for table, columns in TABLES.items():
            expected = [*columns, *OWN_COLUMNS.get(table, ())]
            if table not in found:
                problems.append(f"table {table} is missing")
            elif found[table] != expected:
                problems.append(f"table {table} has columns {found[table]}, not {expected}")
        if not problems:
            try:
                self._read(" UNION ALL ".join(f"(SELECT 1 FROM {t} LIMIT 1)" for t in TABLES))
            except StoreError as exc:
                problems.append(f"its tables cannot be read ({exc})")
            trigger = self._read(
                "SELECT tgenabled FROM pg_trigger WHERE tgrelid='checkpoints'::regclass AND "
                "tgname='checkpoint_moved_backwards'"
            )
            if not trigger or trigger[0][0] == "D":
                problems.append("the trigger checkpoint_moved_backwards on checkpoints is missing or disabled")
        if problems:
            raise StoreCorruptError(
                f"{self.where} failed its integrity check ({'; '.join(problems)}); stop every eventing process, "
                "then restore the database from a backup (pg_restore), or drop its tables and redeploy the "
                "functions (they restart from their feed boundary)"
            )

    def backup(self, target: str | os.PathLike[str]) -> None:
        """Not done here: a server's database is backed up with the server's tools."""
        schema = f" -n {self.db.target.schema}" if self.db.target.schema else ""
        raise StoreError(
            f"the metadata store is in PostgreSQL ({self.db.target.shown}); back it up with PostgreSQL's own "
            f"tools, e.g. `pg_dump -Fc{schema} -f {os.fspath(target)} <the store's URL>` (and the server's WAL "
            "archiving for point-in-time recovery), or copy it into a data directory with "
            "`eventing store copy --to DIR`; not `eventing backup`"
        )

    def close(self) -> None:
        self.db.close()
