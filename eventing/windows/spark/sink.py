"""Where closed-window results go: each window of each function is stored exactly once, surviving restarts.

A window is identified by ``(function, window_start_ms, window_end_ms)`` and each of its result rows by that
plus the group values. Windows closed per substream (``substream_key`` in ``group_by``,
docs/time-semantics.md) close at different times for different key values, so there the id is ``(start, end,
substream value)``: each ``write`` names the substream column. A window is written whole, in one call, or not
at all; writing it again (a replay after a crash) changes nothing. Two backends share the contract:
``ParquetWindowSink`` (default, one file per window) and ``SqliteWindowSink`` (one typed table per function).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from eventing.windows.batches import (
    WINDOW_END,
    WINDOW_START,
    atomic_write_many,
    result_group_by,
    sort_results,
)

WindowId = tuple  # (start, end), or (start, end, substream value) for windows closed per substream

_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_WINDOW_FILE = re.compile(r"^window_(-?\d+)_(-?\d+)(?:_s([0-9a-f]*))?\.parquet$")


class WindowSink(Protocol):
    """Stores closed-window results exactly once per window."""

    def write(
        self,
        function: str,
        results: pa.Table,
        *,
        windows: Iterable[WindowId] = (),
        substream: str | None = None,
    ) -> int:
        """Store every window in ``results`` not stored before and return how many were new.

        ``windows`` names closed windows that produced no rows, so they count as written too. With
        ``substream`` (a result column), windows are ``(start, end, value of that column)``.
        """
        ...

    def read(self, function: str) -> pa.Table:
        """All stored results of ``function``, ordered by window then group values."""
        ...

    def written_windows(self, function: str) -> set[WindowId]:
        """The ``(window_start_ms, window_end_ms)`` of every window stored for ``function``."""
        ...


def _check_function(function: str) -> str:
    if not isinstance(function, str) or not _FUNCTION_NAME.match(function):
        raise ValueError(
            f"function name {function!r} cannot key window results; use letters, digits, '_', '.' or '-' "
            "(at most 100, not starting with '.' or '_')"
        )
    return function


def split_by_window(
    results: pa.Table, extra_windows: Iterable[WindowId] = (), substream: str | None = None
) -> dict[WindowId, pa.Table]:
    """Split a result table into one slice per window (per window and ``substream`` value when given);
    ``extra_windows`` get empty slices."""
    if substream is not None:
        return _split_by_substream(results, extra_windows, substream)
    for column in (WINDOW_START, WINDOW_END):
        if column not in results.schema.names:
            raise ValueError(
                f"window results have no {column!r} column; produce them with aggregate_windows()"
            )
        if results[column].null_count:
            raise ValueError(f"window results column {column!r} has nulls; every result row needs its window")
    results = sort_results(results)
    starts = results[WINDOW_START].to_pylist()
    ends = results[WINDOW_END].to_pylist()
    group_by = result_group_by(results.schema)
    groups = list(zip(*(results[g].to_pylist() for g in group_by), strict=True)) if group_by else None
    parts: dict[WindowId, pa.Table] = {}
    first = 0
    for i in range(1, len(starts) + 1):
        if i == len(starts) or (starts[i], ends[i]) != (starts[first], ends[first]):
            window = (starts[first], ends[first])
            if groups is not None and len(set(groups[first:i])) != i - first:
                raise ValueError(f"window {window} has two result rows for the same group values")
            if groups is None and i - first > 1:
                raise ValueError(f"window {window} has {i - first} result rows but no group-by columns")
            parts[window] = results.slice(first, i - first)
            first = i
    for start, end in extra_windows:
        parts.setdefault((int(start), int(end)), results.slice(0, 0))
    return parts


def _split_by_substream(
    results: pa.Table, extra_windows: Iterable[WindowId], column: str
) -> dict[WindowId, pa.Table]:
    if column not in results.schema.names:
        raise ValueError(
            f"window results have no substream column {column!r}; it must be one of the group_by fields"
        )
    parts: dict[WindowId, pa.Table] = {}
    for (start, end), part in split_by_window(results).items():
        values = part[column].to_pylist()
        for value in dict.fromkeys(values):
            if value is None:
                raise ValueError(
                    f"window ({start}, {end}) has result rows without a substream ({column!r} is null)"
                )
            parts[(start, end, value)] = part.filter(pa.array([v == value for v in values], pa.bool_()))
    for start, end, value in extra_windows:
        parts.setdefault((int(start), int(end), str(value)), results.slice(0, 0))
    return parts


def _window_file(window: WindowId) -> str:
    if len(window) == 2:
        return f"window_{window[0]}_{window[1]}.parquet"
    return f"window_{window[0]}_{window[1]}_s{str(window[2]).encode().hex()}.parquet"


def _empty_results() -> pa.Table:
    return pa.table({WINDOW_START: pa.array([], pa.int64()), WINDOW_END: pa.array([], pa.int64())})


class ParquetWindowSink:
    """One Parquet file per window: ``<directory>/<function>/window_<start>_<end>.parquet``.

    Each file appears atomically (hidden temp file, fsync, hard link into place), and an existing file is
    never replaced, so the first complete write of a window wins, even between concurrent writers.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def _function_dir(self, function: str) -> Path:
        return self.directory / _check_function(function)

    def write(
        self,
        function: str,
        results: pa.Table,
        *,
        windows: Iterable[WindowId] = (),
        substream: str | None = None,
    ) -> int:
        folder = self._function_dir(function)
        folder.mkdir(parents=True, exist_ok=True)
        files = []
        for window, part in split_by_window(results, windows, substream).items():
            path = folder / _window_file(window)
            if path.exists():  # cheap skip for replays; atomic_write_many still refuses to overwrite
                continue
            files.append((path, functools.partial(pq.write_table, part)))
        return atomic_write_many(files, overwrite=False)

    def _window_files(self, function: str) -> list[tuple[WindowId, Path]]:
        folder = self._function_dir(function)
        if not folder.is_dir():
            return []
        found = []
        for entry in os.scandir(folder):
            match = _WINDOW_FILE.match(entry.name)
            if match:
                window: WindowId = (int(match[1]), int(match[2]))
                if match[3] is not None:  # a substream's window: the value is hex-encoded UTF-8
                    window = (*window, bytes.fromhex(match[3]).decode())
                found.append((window, Path(entry.path)))
        return sorted(found)

    def read(self, function: str) -> pa.Table:
        files = self._window_files(function)
        if not files:
            return _empty_results()
        tables = [pq.read_table(path) for _, path in files]
        # Windows written under an older definition of the function may lack newer columns: fill with nulls.
        return sort_results(pa.concat_tables(tables, promote_options="default"))

    def written_windows(self, function: str) -> set[WindowId]:
        return {window for window, _ in self._window_files(function)}


def _columns(schema: pa.Schema) -> list[tuple[str, pa.DataType]]:
    return [(f.name, f.type) for f in schema]


def _sql_type(field: pa.Field) -> str:
    if pa.types.is_integer(field.type):
        return "INTEGER"
    if pa.types.is_floating(field.type):
        return "REAL"
    if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
        return "TEXT"
    raise ValueError(
        f"window result column {field.name!r} has type {field.type}; the SQLite sink stores only ints, "
        "floats and strings"
    )


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SqliteWindowSink:
    """Window results in SQLite: a typed table per function, primary key (window, group values).

    A window is recorded in ``window_sink_windows`` in the same transaction as its rows, and its rows are
    inserted only if that record is new, so a replayed window adds nothing. One ``write`` call is one
    transaction: a crash keeps all of its windows or none. SQLite stores NaN as NULL.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._disk_full(), self._connect() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS window_sink_functions ("
                " function TEXT PRIMARY KEY, table_name TEXT NOT NULL, arrow_schema BLOB NOT NULL)"
            )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS window_sink_windows ("
                " function TEXT NOT NULL, window_start_ms INTEGER NOT NULL, window_end_ms INTEGER NOT NULL,"
                " written_at_ms INTEGER NOT NULL,"
                " PRIMARY KEY (function, window_start_ms, window_end_ms)) WITHOUT ROWID"
            )
            conn.execute(  # windows closed per substream: one record per (window, substream value)
                "CREATE TABLE IF NOT EXISTS window_sink_substream_windows ("
                " function TEXT NOT NULL, window_start_ms INTEGER NOT NULL, window_end_ms INTEGER NOT NULL,"
                " substream TEXT NOT NULL, written_at_ms INTEGER NOT NULL,"
                " PRIMARY KEY (function, window_start_ms, window_end_ms, substream)) WITHOUT ROWID"
            )

    def _connect(self) -> sqlite3.Connection:
        # 30 s: a concurrent writer holds the lock for one write() call, which is milliseconds.
        return sqlite3.connect(self.path, timeout=30)

    @contextlib.contextmanager
    def _disk_full(self) -> Iterator[None]:
        """SQLite's error on a full disk as one line naming the file and the fix (SQLite says "disk I/O
        error" when it cannot grow its shared-memory file, "database or disk is full" when a page does not
        fit). The transaction was rolled back: the sink holds every window of a call or none."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "full" not in str(exc) and not _no_space_left(self.path.parent):
                raise
            from eventing.errors import StoreError

            folder = self.path.parent
            raise StoreError(
                f"cannot write {self.path}: the disk is full ({exc}); free space on the file system of "
                f"{folder} (see `df {folder}`), then run the command again (everything committed is kept: "
                "windows not written yet are written then)"
            ) from None

    def _table_for(
        self, conn: sqlite3.Connection, function: str, schema: pa.Schema | None
    ) -> tuple[str, pa.Schema] | None:
        row = conn.execute(
            "SELECT table_name, arrow_schema FROM window_sink_functions WHERE function = ?", (function,)
        ).fetchone()
        if row is not None:
            stored = pa.ipc.read_schema(pa.py_buffer(row[1]))
            if schema is not None and _columns(stored) != _columns(schema):
                raise ValueError(
                    f"function {function!r} already has window results in {self.path} with columns "
                    f"{stored.names} ({stored.types}); the new results have {schema.names} ({schema.types}). "
                    "Use a new sink path or delete the old results before changing the function's aggregation"
                )
            return row[0], stored
        if schema is None:
            return None
        table_name = f"window_results_{function}"
        columns = [f"{_quote(f.name)} {_sql_type(f)}" for f in schema]
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {_quote(table_name)} ({', '.join(columns)}, group_key TEXT NOT NULL,"
            f" PRIMARY KEY ({_quote(WINDOW_START)}, {_quote(WINDOW_END)}, group_key))"
        )
        conn.execute(
            "INSERT INTO window_sink_functions (function, table_name, arrow_schema) VALUES (?, ?, ?)",
            (function, table_name, schema.serialize().to_pybytes()),
        )
        return table_name, schema

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
        now_ms = int(time.time() * 1000)
        with self._disk_full():
            return self._write(function, results.schema, parts, group_by, now_ms)

    def _write(
        self,
        function: str,
        schema: pa.Schema,
        parts: dict[WindowId, pa.Table],
        group_by: list[str],
        now_ms: int,
    ) -> int:
        names = schema.names
        written = 0
        conn = self._connect()
        try:
            with conn:  # one transaction for the whole call
                found = self._table_for(conn, function, schema)
                assert found is not None
                table_name = found[0]
                insert = (
                    f"INSERT OR IGNORE INTO {_quote(table_name)} ({', '.join(map(_quote, names))}, group_key)"
                    f" VALUES ({', '.join('?' * (len(names) + 1))})"
                )
                for window, part in parts.items():
                    if len(window) == 2:
                        cur = conn.execute(
                            "INSERT OR IGNORE INTO window_sink_windows VALUES (?, ?, ?, ?)",
                            (function, window[0], window[1], now_ms),
                        )
                    else:
                        cur = conn.execute(
                            "INSERT OR IGNORE INTO window_sink_substream_windows VALUES (?, ?, ?, ?, ?)",
                            (function, window[0], window[1], str(window[2]), now_ms),
                        )
                    if cur.rowcount == 0:
                        continue
                    written += 1
                    rows = part.to_pylist()
                    conn.executemany(
                        insert,
                        [(*(row[n] for n in names), json.dumps([row[g] for g in group_by])) for row in rows],
                    )
        finally:
            conn.close()
        return written

    def read(self, function: str) -> pa.Table:
        _check_function(function)
        conn = self._connect()
        try:
            found = self._table_for(conn, function, None)
            if found is None:
                return _empty_results()
            table_name, schema = found
            rows = conn.execute(
                f"SELECT {', '.join(map(_quote, schema.names))} FROM {_quote(table_name)}"
            ).fetchall()
        finally:
            conn.close()
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
        table = pa.Table.from_arrays(
            [pa.array(list(col), f.type) for col, f in zip(columns, schema, strict=True)], schema=schema
        )
        return sort_results(table)

    def written_windows(self, function: str) -> set[WindowId]:
        _check_function(function)
        with self._disk_full():
            return self._written_windows(function)

    def _written_windows(self, function: str) -> set[WindowId]:
        conn = self._connect()
        try:
            rows = conn.execute(
                "SELECT window_start_ms, window_end_ms FROM window_sink_windows WHERE function = ?",
                (function,),
            ).fetchall()
            subs = conn.execute(
                "SELECT window_start_ms, window_end_ms, substream FROM window_sink_substream_windows"
                " WHERE function = ?",
                (function,),
            ).fetchall()
        finally:
            conn.close()
        return {(start, end) for start, end in rows} | {(start, end, value) for start, end, value in subs}


def _no_space_left(folder: Path) -> bool:
    """True when the file system of ``folder`` has no block left for an unprivileged writer."""
    try:
        stats = os.statvfs(folder)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < 1 << 20  # less than a MB: SQLite cannot grow its files
