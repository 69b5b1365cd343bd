"""Opening the metadata store of a data directory (SQLite by default, Couchbase by environment)."""

from __future__ import annotations

from pathlib import Path

from metadata import MetadataStore

METADATA_FILE = "metadata.sqlite3"


def open_metadata(data_dir: str | Path, *, create: bool = True) -> MetadataStore:
    """SQLite under data_dir, or Couchbase when $EVENTING_METADATA_URL is set (one contract suite runs
    against both)."""
    from metadata.factory import open_store

    return open_store(data_dir, create=create)
