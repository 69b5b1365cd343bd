"""The window coordinator's checkpoint: one JSON state per function, fenced, committed with its DLQ rows.

A coordinator ``claim``s a function's state, which bumps the function's fence; every ``commit`` names the
fence it claimed with and is refused once another coordinator has claimed since (a second service on
the same data directory, or a coordinator of an older deployment), so two coordinators never both move
the state. A commit writes the state, the late rows' DLQ entries (``INSERT OR IGNORE`` keyed by
function, vBucket and seqno, like the workers' dead letters) and counter increments in one transaction.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping
from typing import Any

from metadata.errors import ConfigError
from metadata.model import DlqRow
from metadata.sqlite_store import SqliteMetadataStore, _add_counters

SCHEMA = """
CREATE TABLE IF NOT EXISTS window_state(
    function TEXT PRIMARY KEY, fence INTEGER NOT NULL, state TEXT, updated_at REAL NOT NULL);
"""


def window_state_store(store: Any) -> Any:
    """The coordinator-state store of whichever metadata backend `store` is."""
    if WindowStateStore.supported(store):
        return WindowStateStore(store)
    from metadata.couchbase import CouchbaseMetadataStore, CouchbaseWindowStateStore

    if isinstance(store, CouchbaseMetadataStore):
        # No transaction spans documents there: dead letters (insert-once) go first, then the state under
        # its fence (CAS), then counters; a crash in between redoes the batch, and only counters can lag.
        return CouchbaseWindowStateStore(store)
    raise ConfigError(f"windowed functions cannot keep their state in a {type(store).__name__}")


class WindowStateStore:
    """Window coordinator state in the SQLite metadata store (its own table, the store's transactions)."""

    def __init__(self, store: Any):
        if not self.supported(store):
            raise ConfigError(
                f"windowed functions keep their coordinator checkpoint in the SQLite metadata store, and this "
                f"process uses {type(store).__name__}; unset EVENTING_METADATA_URL to run windowed functions"
            )
        self.store: SqliteMetadataStore = store
        store._retry(lambda: store._db.executescript(SCHEMA))

    @staticmethod
    def supported(store: Any) -> bool:
        return isinstance(store, SqliteMetadataStore)

    def claim(self, function: str) -> tuple[int, dict[str, Any] | None]:
        """Become the function's coordinator: returns the new fence and the last committed state (or None)."""

        def body(db: sqlite3.Connection) -> tuple[int, dict[str, Any] | None]:
            db.execute(
                "INSERT INTO window_state VALUES(?, 1, NULL, ?) "
                "ON CONFLICT(function) DO UPDATE SET fence=fence+1, updated_at=excluded.updated_at",
                (function, time.time()),
            )
            fence, state = db.execute(
                "SELECT fence, state FROM window_state WHERE function=?", (function,)
            ).fetchone()
            return int(fence), None if state is None else json.loads(state)

        return self.store._tx(body)

    def commit(
        self,
        function: str,
        fence: int,
        state: Mapping[str, Any],
        dlq_rows: Iterable[DlqRow] = (),
        counters: Mapping[str, int | float] | None = None,
    ) -> bool:
        """Write state, DLQ rows and counters at once if ``fence`` is still current; False if fenced."""
        text = json.dumps(state, separators=(",", ":"))
        rows = list(dlq_rows)

        def body(db: sqlite3.Connection) -> bool:
            row = db.execute("SELECT fence FROM window_state WHERE function=?", (function,)).fetchone()
            if row is None or int(row[0]) != fence:
                return False
            db.execute(
                "UPDATE window_state SET state=?, updated_at=? WHERE function=?", (text, time.time(), function)
            )
            db.executemany(
                "INSERT OR IGNORE INTO dlq(function, vb, seqno, key, reason, error, traceback, attempts,"
                " first_failed_at, last_failed_at, mutation) VALUES(?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (r.function, r.vb, r.seqno, r.key, r.reason, r.error, r.traceback, r.attempts,
                     r.first_failed_at, r.last_failed_at, r.mutation)
                    for r in rows
                ],
            )
            _add_counters(db, function, dict(counters or {}))
            return True

        return self.store._tx(body)

    def load(self, function: str) -> dict[str, Any] | None:
        """The last committed state, read-only (for inspection)."""
        rows = self.store._read("SELECT state FROM window_state WHERE function=?", (function,))
        return json.loads(rows[0][0]) if rows and rows[0][0] is not None else None

    def reset(self, function: str) -> None:
        """Forget the state (a new deployment starts its windows afresh) and fence its coordinator."""
        self.store._tx(
            lambda db: db.execute(
                "UPDATE window_state SET fence=fence+1, state=NULL, updated_at=? WHERE function=?",
                (time.time(), function),
            )
        )
