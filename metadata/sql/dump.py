"""The metadata store whole, as rows of its tables (metadata/sql/tables.py): what `eventing store copy` moves
between a data directory and a PostgreSQL store. The service's live records (heartbeats, leases) are left
out: they belong to running processes, not to the deployment."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from metadata.errors import ConfigError
from metadata.sql.tables import TABLES

COPIED = tuple(t for t in TABLES if t not in ("services", "leases"))
BATCH = 5_000


def dump_tables(store: Any) -> Iterator[tuple[str, list[tuple]]]:
    """(table, rows) of every copied table, a batch at a time (a table's rows in its key order)."""
    for table in COPIED:
        columns = TABLES[table]
        rows = store._read(f"SELECT {', '.join(columns)} FROM {table} ORDER BY {', '.join(columns[:2])}")
        for start in range(0, len(rows), BATCH):
            yield (
                table,
                [
                    tuple(bytes(v) if isinstance(v, memoryview) else v for v in r)
                    for r in rows[start : start + BATCH]
                ],
            )


def load_tables(store: Any, tables: Iterable[tuple[str, list[tuple]]]) -> dict[str, int]:
    """Load dumped rows into an empty store (one without functions or users); returns rows per table."""
    if store._read("SELECT 1 FROM functions LIMIT 1") or store._read("SELECT 1 FROM users LIMIT 1"):
        raise ConfigError(
            "the target metadata store already holds functions or users; a copy goes into an empty store"
        )
    counts: dict[str, int] = {}
    for table, rows in tables:
        if table not in COPIED:
            raise ConfigError(f"a metadata dump holds no table {table!r}")
        columns = TABLES[table]
        sql = f"INSERT INTO {table}({', '.join(columns)}) VALUES({','.join('?' * len(columns))})" + (
            " ON CONFLICT(key) DO UPDATE SET value=excluded.value" if table == "kv" else ""
        )
        store._tx(lambda db, s=sql, r=rows: db.executemany(s, r))
        counts[table] = counts.get(table, 0) + len(rows)
    return counts
