"""The metadata store's logic over SQL, shared by the SQLite backend (metadata/sqlite/) and the PostgreSQL
backend (metadata/postgres/): store.py (functions, users, checkpoints, commits, rewinds), records.py
(timers, counters, dead letters, services, leases, nodes, settings), window_state.py (the window
coordinators' fenced state), base.py (what a backend supplies: its transactions and the places where the
two dialects differ), rows.py (row conversions and shared writes), tables.py (every table's columns).
"""

from metadata.sql.base import SqlBackend
from metadata.sql.store import SqlMetadataStore
from metadata.sql.tables import TABLES
from metadata.sql.window_state import SqlWindowStateStore

__all__ = ["TABLES", "SqlBackend", "SqlMetadataStore", "SqlWindowStateStore"]
