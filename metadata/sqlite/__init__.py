"""SQLite backend of the metadata store: the embedded default, one WAL file shared by every process.

store.py is the store (SqliteMetadataStore), window_state.py the window coordinators' fenced state,
schema.py every table, backup.py backup and restore of the file; _rows.py holds the helpers they share.
Code outside this folder imports from `metadata.sqlite` only. The SQLite write discipline it shares with
the local buckets is metadata/sqlite_io.py.
"""

from metadata.sqlite.backup import restore_sqlite_store
from metadata.sqlite.store import SqliteMetadataStore
from metadata.sqlite.window_state import SqliteWindowStateStore

__all__ = ["SqliteMetadataStore", "SqliteWindowStateStore", "restore_sqlite_store"]
