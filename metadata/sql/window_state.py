"""SqlWindowStateStore: the window coordinators' fenced state, in a SQL metadata store's database and
transactions (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from metadata.fencing import holds
from metadata.model import DlqRow
from metadata.sql.base import SqlBackend
from metadata.sql.rows import INSERT_DLQ_ONCE, SqlDb, dlq_values, write_counters


class SqlWindowStateStore:
    """Window coordinator state in a SQL metadata store (its own table, the store's transactions).

    The window coordinator's checkpoint: one JSON state per function, fenced, committed with its DLQ rows.

    A coordinator ``claim``s a function's state, which bumps the function's fence; every ``commit`` names the
    fence it claimed with and is refused once another coordinator has claimed since (a second service on
    the same data directory, or a coordinator of an older deployment), so two coordinators never both move
    the state. A commit writes the state, the late rows' DLQ entries (inserted once, keyed by function,
    vBucket and seqno, like the workers' dead letters) and counter increments in one transaction.
    """

    def __init__(self, store: SqlBackend):
        self.store = store

    def claim(self, function: str) -> tuple[int, dict[str, Any] | None]:
        """Become the function's coordinator: returns the new fence and the last committed state (or None)."""

        def body(db: SqlDb) -> tuple[int, dict[str, Any] | None]:
            db.execute(
                "INSERT INTO window_state VALUES(?, 1, NULL, ?) "
                "ON CONFLICT(function) DO UPDATE SET fence=window_state.fence+1, "
                "updated_at=excluded.updated_at",
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

        def body(db: SqlDb) -> bool:
            row = db.execute(
                f"SELECT fence FROM window_state WHERE function=?{self.store.LOCK}", (function,)
            ).fetchone()
            if row is None or not holds(int(row[0]), fence):
                return False
            db.execute(
                "UPDATE window_state SET state=?, updated_at=? WHERE function=?",
                (text, time.time(), function),
            )
            db.executemany(INSERT_DLQ_ONCE, [dlq_values(r) for r in rows])
            write_counters(db, function, dict(counters or {}))
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
