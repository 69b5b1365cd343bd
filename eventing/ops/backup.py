"""Backing up and restoring the metadata store (function definitions, states, checkpoints, dead letters,
counters, nodes): the SQLite store by its online backup, the Couchbase store by Couchbase's own tools."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from eventing.errors import ConfigError, LifecycleError, NotFoundError, StoreCorruptError
from eventing.storage.metadata import METADATA_FILE, open_metadata
from metadata import METADATA_URL_ENV
from metadata.sqlite_store import restore_sqlite_store


def default_backup_path(data_dir: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path(data_dir) / "backups" / f"metadata-{stamp}.sqlite3"


def backup(data_dir: str, output: str | None = None) -> dict:
    """Copy the metadata store to `output` (default <data_dir>/backups/metadata-<UTC time>.sqlite3); safe
    while `eventing run` works: the copy is one consistent snapshot."""
    store = open_metadata(data_dir, create=False)
    try:
        target = Path(output) if output else default_backup_path(data_dir)
        store.backup(target)
        functions = len(store.list_functions())
    finally:
        store.close()
    return {"file": str(target), "bytes": target.stat().st_size, "functions": functions}


def restore(data_dir: str, backup_file: str) -> dict:
    """Replace the metadata store with a backup; the replaced file stays as metadata.sqlite3.bak.

    Refused while an eventing service runs. Functions resume after the restored checkpoints: mutations
    handled since the backup are handled again, and the binding buckets' effect marks skip their effects,
    so none applies twice (workers claim above the marks' epochs; see WorkerCore.assign_vbuckets).
    """
    from eventing.runtime.lifecycle import SERVICE_STALE_S

    if os.environ.get(METADATA_URL_ENV):
        raise ConfigError(
            f"the metadata store is in Couchbase ({METADATA_URL_ENV} is set); restore it with Couchbase's own "
            "tools (`cbbackupmgr restore`), not `eventing restore`"
        )
    target = Path(data_dir) / METADATA_FILE
    if target.exists():
        services: list[str] = []
        try:
            store = open_metadata(data_dir, create=False)
            try:
                services = store.live_services(SERVICE_STALE_S)
            finally:
                store.close()
        except (NotFoundError, StoreCorruptError):
            pass  # a damaged store is what a restore is for; its message said to stop every process first
        if services:
            raise LifecycleError(
                f"cannot restore the metadata store while an eventing service runs ({', '.join(services)}); "
                "stop it first (Ctrl-C on `eventing run`), then restore"
            )
    else:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
    kept = restore_sqlite_store(backup_file, target)
    restored = open_metadata(data_dir, create=False)
    try:
        functions = [{"name": r.name, "state": r.state.value} for r in restored.list_functions()]
    finally:
        restored.close()
    return {"restored": str(target), "from": backup_file, "previous": str(kept) if kept else None,
            "functions": functions}
