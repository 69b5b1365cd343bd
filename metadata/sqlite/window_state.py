"""SqliteWindowStateStore: the window coordinators' fenced state, in the SQLite metadata store's file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from metadata.sql.window_state import SqlWindowStateStore
from metadata.sqlite.schema import WINDOW_STATE_SCHEMA

if TYPE_CHECKING:
    from metadata.sqlite.store import SqliteMetadataStore


class SqliteWindowStateStore(SqlWindowStateStore):
    """Window coordinator state in the SQLite metadata store (metadata.sql.window_state says how); its
    table is created by the first of them to open on a file."""

    def __init__(self, store: SqliteMetadataStore):
        super().__init__(store)
        store._retry(lambda: store._db.executescript(WINDOW_STATE_SCHEMA))
