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

from metadata.errors import NotFoundError, StoreCorruptError, StoreError
from metadata.postgres.connection import SCHEMA_TABLE, Cursor, PostgresDatabase, ensure_schema
from metadata.postgres.schema import CHECKPOINT_TYPES, COMPONENT, DDL, MOVE_SETTING, OWN_COLUMNS, VERSION
from metadata.sql.rows import SqlDb
from metadata.sql.store import SqlMetadataStore
from metadata.sql.tables import TABLES
from metadata.sql.window_state import SqlWindowStateStore

T = TypeVar("T")

_ARRAY = "SELECT unnest(?::bigint[])"
MIN_SERVER_VERSION = 140000


def _array(values: Sequence[Any], kind: str) -> str:
    """An array as PostgreSQL's text literal, cast by the statement (`?::bigint[]`): made with one join,
    where psycopg's list adapter checks every element (a tenth of a commit's time for 256 vBuckets)."""
    if kind == "bigint":
        return "{" + ",".join([str(int(v)) for v in values]) + "}"
    if kind == "float8":
        return "{" + ",".join([repr(float(v)) for v in values]) + "}"
    quoted = [
        '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"' if v is not None else "NULL"
        for v in values
    ]
    return "{" + ",".join(quoted) + "}"


class PostgresMetadataStore(SqlMetadataStore):
    """MetadataStore on PostgreSQL; `location` is a libpq URL (see metadata.postgres.connection for what it
    takes, `schema=` included) or an open PostgresDatabase. The schema is created on first use."""

    LOCK = " FOR UPDATE"
    LEAST = "LEAST"

    def __init__(self, location: str | PostgresDatabase, *, create: bool = True):
        # A database handed in stays its owner's to close; one opened here from a URL is closed with the
        # store.
        self._owns_db = not isinstance(location, PostgresDatabase)
        self.db = location if isinstance(location, PostgresDatabase) else PostgresDatabase.open(str(location))
        self.where = f"PostgreSQL store {self.db.target.shown}"
        try:
            version = self.db.run(lambda conn: conn.info.server_version)
            if version < MIN_SERVER_VERSION:
                raise StoreError(
                    f"{self.where}: the server runs PostgreSQL {version // 10000}; the store needs "
                    f"{MIN_SERVER_VERSION // 10000} or later (CREATE OR REPLACE TRIGGER); upgrade the server"
                )
            if not create and not self._created():
                raise NotFoundError(
                    f"there is no metadata store at {self.db.target.shown} yet; deploy a function first or "
                    "pass the right --store"
                )
            ensure_schema(self.db, COMPONENT, VERSION, DDL)
        except BaseException:
            self.close()
            raise

    def _created(self) -> bool:
        return self.exists_in(self.db)

    @staticmethod
    def exists_in(db: PostgresDatabase) -> bool:
        """Whether a metadata store was ever created in this database (or schema)."""
        if not db.read(f"SELECT to_regclass('{SCHEMA_TABLE}') IS NOT NULL")[0][0]:
            return False
        return bool(db.read(f"SELECT 1 FROM {SCHEMA_TABLE} WHERE component=?", (COMPONENT,)))

    # -- transactions -----------------------------------------------------------------------------------

    def _tx(self, body: Callable[[Cursor], T]) -> T:
        return self.db.transaction(body, pipeline=True)

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        return self.db.read(sql, args)

    # -- PostgreSQL's dialect (see metadata.sql.base) ---------------------------------------------------

    def _in_vbs(self, vbs: Sequence[int]) -> tuple[str, tuple]:
        return _ARRAY, (_array(vbs, "bigint"),)

    def _select_vbs(
        self, db: SqlDb, sql: str, function: str, vbs: list[int], *, lock: bool = False
    ) -> list[tuple]:
        """One statement for any number of vBuckets; `lock` takes the rows' locks in vBucket order (so two
        transactions locking overlapping sets wait for each other rather than deadlock)."""
        if not vbs:
            return []
        sql = sql.format(_ARRAY) + (" ORDER BY vb FOR UPDATE" if lock else "")
        return list(db.execute(sql, (function, _array(vbs, "bigint"))).fetchall())

    def _update_checkpoints(
        self, db: SqlDb, function: str, columns: Sequence[str], rows: list[tuple]
    ) -> None:
        """One UPDATE ... FROM unnest(...): the vBuckets and each column that differs between rows as arrays,
        a column with one value for all (the time, the owner) as that value."""
        if not rows:
            return
        values = list(zip(*rows, strict=True))
        sets, constants, names, arrays = [], [], ["vb"], [_array(values[0], "bigint")]
        for column, column_values in zip(columns, values[1:], strict=True):
            kind = CHECKPOINT_TYPES[column]
            if all(v == column_values[0] for v in column_values):
                sets.append(f"{column}=?::{kind}")
                constants.append(column_values[0])
            else:
                sets.append(f"{column}=v.{column}")
                names.append(column)
                arrays.append(_array(column_values, kind))
        types = ", ".join(["?::bigint[]", *(f"?::{CHECKPOINT_TYPES[n]}[]" for n in names[1:])])
        db.execute(
            f"UPDATE checkpoints AS c SET {', '.join(sets)} FROM unnest({types}) AS v({', '.join(names)}) "
            "WHERE c.function=? AND c.vb=v.vb",
            (*constants, *arrays, function),
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
            "SELECT table_name, column_name FROM information_schema.columns WHERE "
            "table_schema=current_schema() ORDER BY table_name, ordinal_position"
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
                problems.append(
                    "the trigger checkpoint_moved_backwards on checkpoints is missing or disabled"
                )
        if problems:
            raise StoreCorruptError(
                f"{self.where} failed its integrity check ({'; '.join(problems)}); stop every eventing "
                "process, then restore the database from a backup (pg_restore), or drop its tables and "
                "redeploy the functions (they restart from their feed boundary)"
            )

    def backup(self, target: str | os.PathLike[str]) -> None:
        """Not done here: a server's database is backed up with the server's tools."""
        schema = f" -n {self.db.target.schema}" if self.db.target.schema else ""
        raise StoreError(
            f"the metadata store is in PostgreSQL ({self.db.target.shown}); back it up with PostgreSQL's own "
            f"tools, e.g. `pg_dump -Fc{schema} -f {os.fspath(target)} <the store's URL>` (and the server's "
            "WAL archiving for point-in-time recovery), or copy it into a data directory with "
            "`eventing store copy --to DIR`; not `eventing backup`"
        )

    def close(self) -> None:
        if self._owns_db:
            self._owns_db = False
            self.db.close()
