"""Window results in a PostgreSQL store: the default sink of a function whose state is on PostgreSQL,
with the contract of ``eventing.windows.spark.sink`` (a window is written whole or not at all, identified
by ``(function, start, end)`` or ``(function, start, end, substream value)``; a second write of a window
changes nothing).

Tables, beside the store's own: ``eventing_window_sink_functions`` (each function's results table and the
Arrow schema of its results), ``eventing_window_sink_windows`` and ``eventing_window_sink_substream_windows``
(one row per window written), and one typed results table per function, ``window_results_<function>``
(primary key: window and group values), which users may query directly:

    SELECT * FROM "window_results_fn_sales_per_minute" ORDER BY window_start_ms;

A ``write`` is one transaction: its windows' records are inserted first (a record that already exists,
even one another writer is committing at the same moment, is skipped once that writer commits), and the
rows of the windows whose record is new follow with COPY. A crash keeps every window of the call or none.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from eventing.windows.batches import result_group_by, sort_results
from eventing.windows.spark.sink import WindowId, _check_function, _empty_results, split_by_window
from metadata.postgres.connection import Cursor, PostgresDatabase, ensure_schema

FUNCTIONS = "eventing_window_sink_functions"
WINDOWS = "eventing_window_sink_windows"
SUBSTREAM_WINDOWS = "eventing_window_sink_substream_windows"
SCHEMA_VERSION = 1
DDL = (
    f"CREATE TABLE IF NOT EXISTS {FUNCTIONS} (function TEXT PRIMARY KEY, table_name TEXT NOT NULL,"
    " arrow_schema BYTEA NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {WINDOWS} (function TEXT NOT NULL, window_start_ms BIGINT NOT NULL,"
    " window_end_ms BIGINT NOT NULL, written_at_ms BIGINT NOT NULL,"
    " PRIMARY KEY (function, window_start_ms, window_end_ms))",
    f"CREATE TABLE IF NOT EXISTS {SUBSTREAM_WINDOWS} (function TEXT NOT NULL, window_start_ms BIGINT NOT "
    "NULL, window_end_ms BIGINT NOT NULL, substream TEXT NOT NULL, written_at_ms BIGINT NOT NULL,"
    " PRIMARY KEY (function, window_start_ms, window_end_ms, substream))",
)
MAX_IDENTIFIER = 63  # PostgreSQL cuts longer names

_ready: set[tuple[str, str | None]] = set()
_ready_lock = threading.Lock()


def results_table(function: str) -> str:
    """The results table of ``function``: ``window_results_<function>``, or, where that is longer than a
    PostgreSQL name may be, its start and a digest of the whole name."""
    name = f"window_results_{function}"
    if len(name.encode()) <= MAX_IDENTIFIER:
        return name
    return f"window_results_{function[:32]}_{hashlib.sha1(function.encode()).hexdigest()[:12]}"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_type(field: pa.Field) -> str:
    if pa.types.is_integer(field.type):
        return "BIGINT"
    if pa.types.is_floating(field.type):
        return "DOUBLE PRECISION"
    if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
        return "TEXT"
    raise ValueError(
        f"window result column {field.name!r} has type {field.type}; the PostgreSQL sink stores only ints, "
        "floats and strings"
    )


def _columns(schema: pa.Schema) -> list[tuple[str, pa.DataType]]:
    return [(f.name, f.type) for f in schema]


class PostgresWindowSink:
    """Window results in a PostgreSQL store (see the module docstring)."""

    def __init__(self, db: PostgresDatabase):
        self.db = db
        key = (db.target.url, db.target.schema)
        if key not in _ready:
            with _ready_lock:
                if key not in _ready:
                    ensure_schema(db, "window_sink", SCHEMA_VERSION, DDL)
                    _ready.add(key)

    @classmethod
    def open(cls, url: str) -> PostgresWindowSink:
        return cls(PostgresDatabase.open(url))

    def _table_for(
        self, cur: Cursor, function: str, schema: pa.Schema | None
    ) -> tuple[str, pa.Schema] | None:
        row = cur.execute(
            f"SELECT table_name, arrow_schema FROM {FUNCTIONS} WHERE function = %s", (function,)
        ).fetchone()
        if row is not None:
            stored = pa.ipc.read_schema(pa.py_buffer(bytes(row[1])))
            if schema is not None and _columns(stored) != _columns(schema):
                raise ValueError(
                    f"function {function!r} already has window results in {self.db.target.shown} ({row[0]}) "
                    f"with columns {stored.names} ({stored.types}); the new results have {schema.names} "
                    f"({schema.types}). Drop the table {row[0]} and delete the function's rows of "
                    f"{FUNCTIONS}, {WINDOWS} and {SUBSTREAM_WINDOWS} before changing the function's "
                    "aggregation, or give the window a sink path"
                )
            return row[0], stored
        if schema is None:
            return None
        table = results_table(function)
        columns = [f"{_quote(f.name)} {_sql_type(f)}" for f in schema]
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {_quote(table)} ({', '.join(columns)}, group_key TEXT NOT NULL,"
            f" PRIMARY KEY (window_start_ms, window_end_ms, group_key))"
        )
        cur.execute(
            f"INSERT INTO {FUNCTIONS} (function, table_name, arrow_schema) VALUES (%s, %s, %s)",
            (function, table, schema.serialize().to_pybytes()),
        )
        return table, schema

    def write(
        self,
        function: str,
        results: pa.Table,
        *,
        windows: Iterable[WindowId] = (),
        substream: str | None = None,
    ) -> int:
        _check_function(function)
        parts = split_by_window(results, windows, substream)
        group_by = result_group_by(results.schema)
        names = results.schema.names
        now_ms = int(time.time() * 1000)
        plain = [w for w in parts if len(w) == 2]
        split = [w for w in parts if len(w) == 3]

        def body(cur: Cursor) -> int:
            # Serialises a function's first write (its table is created once) with any other writer's.
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"window_sink:{function}",))
            found = self._table_for(cur, function, results.schema)
            assert found is not None
            new: list[WindowId] = []
            if plain:
                new += [
                    tuple(r)
                    for r in cur.execute(
                        f"INSERT INTO {WINDOWS} SELECT %s, s, e, %s FROM unnest(%s::bigint[], %s::bigint[]) "
                        "AS w(s, e) ON CONFLICT DO NOTHING RETURNING window_start_ms, window_end_ms",
                        (function, now_ms, [w[0] for w in plain], [w[1] for w in plain]),
                    ).fetchall()
                ]
            if split:
                new += [
                    tuple(r)
                    for r in cur.execute(
                        f"INSERT INTO {SUBSTREAM_WINDOWS} SELECT %s, s, e, v, %s FROM"
                        " unnest(%s::bigint[], %s::bigint[], %s::text[]) AS w(s, e, v)"
                        " ON CONFLICT DO NOTHING RETURNING window_start_ms, window_end_ms, substream",
                        (
                            function,
                            now_ms,
                            [w[0] for w in split],
                            [w[1] for w in split],
                            [str(w[2]) for w in split],
                        ),
                    ).fetchall()
                ]
            rows: list[tuple[Any, ...]] = []
            for window in new:
                for row in parts[window].to_pylist():
                    rows.append((*(row[n] for n in names), json.dumps([row[g] for g in group_by])))
            if rows:
                columns = ", ".join(map(_quote, [*names, "group_key"]))
                with cur.copy(f"COPY {_quote(found[0])} ({columns}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
            return len(new)

        return self.db.transaction(body)

    def read(self, function: str) -> pa.Table:
        _check_function(function)

        def body(cur: Cursor) -> tuple[pa.Schema, list[tuple]] | None:
            found = self._table_for(cur, function, None)
            if found is None:
                return None
            table, schema = found
            return schema, cur.execute(
                f"SELECT {', '.join(map(_quote, schema.names))} FROM {_quote(table)}"
            ).fetchall()

        got = self.db.transaction(body)
        if got is None:
            return _empty_results()
        schema, rows = got
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
        table = pa.Table.from_arrays(
            [pa.array(list(col), f.type) for col, f in zip(columns, schema, strict=True)], schema=schema
        )
        return sort_results(table)

    def written_windows(self, function: str) -> set[WindowId]:
        _check_function(function)
        rows = self.db.read(
            f"SELECT window_start_ms, window_end_ms FROM {WINDOWS} WHERE function = %s", (function,)
        )
        subs = self.db.read(
            f"SELECT window_start_ms, window_end_ms, substream FROM {SUBSTREAM_WINDOWS} WHERE function = %s",
            (function,),
        )
        return {(start, end) for start, end in rows} | {(start, end, value) for start, end, value in subs}
