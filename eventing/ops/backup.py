"""Backing up and restoring the metadata store (function definitions, states, checkpoints, dead letters,
counters, nodes) of a data directory: the SQLite store by its online backup, the Couchbase store by
Couchbase's own tools. A state on a PostgreSQL server is backed up by the server's own tools, or copied
whole into a data directory (`eventing store copy`, eventing.ops.store_copy)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from eventing.errors import ConfigError, LifecycleError, NotFoundError, StoreCorruptError
from eventing.storage.factory import open_bucket
from eventing.storage.files import bucket_path, list_buckets
from eventing.storage.state import StateLike, as_state
from metadata import METADATA_URL_ENV
from metadata.factory import SQLITE_FILE, open_store
from metadata.sqlite import restore_sqlite_store
from metadata.sqlite_io import private_folder


def default_backup_path(data_dir: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path(data_dir) / "backups" / f"metadata-{stamp}.sqlite3"


def _data_dir(state: StateLike, what: str) -> str:
    """The data directory of a state held in files; one line naming the way for a state on a server."""
    state = as_state(state)
    if state.directory is None:
        raise ConfigError(
            f"{state.shown} is a PostgreSQL store: {what} with the server's own tools (pg_dump, a standby, "
            "point-in-time recovery), or copy it whole into a data directory with `eventing store copy "
            f"--from {state.shown} --to DIR` (and back with --from DIR --to URL)"
        )
    return str(state.directory)


def backup(state: StateLike, output: str | None = None, *, with_buckets: bool = False) -> dict:
    """Copy the metadata store to `output` (default <data_dir>/backups/metadata-<UTC time>.sqlite3); safe
    while `eventing run` works: the copy is one consistent snapshot.

    with_buckets: `output` is a folder laid out as a data directory (default
    <data_dir>/backups/backup-<UTC time>/): the metadata store, then each bucket (SQLite's online backup,
    every partition). The buckets are copied after the store, so they hold at least what its checkpoints
    cover: after a restore, mutations past the checkpoints are handled again and the binding buckets'
    effect marks skip the effects they already hold."""
    data_dir = _data_dir(state, "back it up")
    if with_buckets:
        folder = (
            Path(output)
            if output
            else default_backup_path(data_dir).with_name(
                default_backup_path(data_dir).name.replace("metadata-", "backup-").removesuffix(".sqlite3")
            )
        )
        if folder.exists() and any(folder.iterdir()):
            raise ConfigError(f"backup folder {folder} is not empty; name a new folder with -o")
        target = folder / SQLITE_FILE
    else:
        target = Path(output) if output else default_backup_path(data_dir)
    # Folders an explicit -o names that do not exist yet are made (0700), and reported.
    created = _missing_folders(target.parent) if output else []
    with open_store(data_dir, create=False) as store:
        store.backup(target)
        functions = len(store.list_functions())
    result: dict = {
        "file": str(target),
        "bytes": target.stat().st_size,
        "functions": functions,
        "created_folders": [str(f) for f in created],
    }
    if with_buckets:
        copied = []
        for name in list_buckets(data_dir):
            with open_bucket(data_dir, name) as bucket:
                bucket.copy_to(target.parent)
            copied.append(name)
        result.update(
            folder=str(target.parent),
            buckets=copied,
            bytes=sum(f.stat().st_size for f in target.parent.rglob("*") if f.is_file()),
        )
    return result


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and its parents that do not exist, outermost first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    return list(reversed(missing))


def _restore_buckets(data_dir: str, folder: Path) -> tuple[list[str], list[str]]:
    """Copy the buckets of a backup folder into the data directory; a bucket that exists there is kept."""
    restored, kept = [], []
    for name in list_buckets(folder):
        if bucket_path(data_dir, name).exists():
            kept.append(name)
            continue
        with open_bucket(folder, name) as bucket:
            bucket.copy_to(data_dir)
        restored.append(name)
    return restored, kept


def _missing_buckets(data_dir: str, functions: list) -> list[str]:
    """One warning per bucket a restored function reads or writes that this data directory lacks."""
    present = set(list_buckets(data_dir))
    warnings = []
    for record in functions:
        defn = record.definition
        wanted = [("source", defn.get("source_bucket"))] + [
            (f"binding '{b.get('alias')}'", b.get("bucket")) for b in defn.get("bindings", [])
        ]
        for role, name in wanted:
            if name and name not in present:
                warnings.append(
                    f"bucket '{name}' ({role} of function '{record.name}') is not in {data_dir}: a metadata "
                    "backup holds no buckets; copy its file into DATA_DIR/buckets/, or back up with "
                    "`eventing backup --with-buckets` and restore that folder"
                )
    return warnings


def restore(state: StateLike, backup_file: str) -> dict:
    """Replace the metadata store with a backup; the replaced file stays as metadata.sqlite3.bak.

    Refused while an eventing service runs. Functions resume after the restored checkpoints: mutations
    handled since the backup are handled again, and the binding buckets' effect marks skip their effects,
    so none applies twice (workers claim above the marks' epochs; see WorkerCore.assign_vbuckets).
    """
    from eventing.control.lifecycle import SERVICE_STALE_S

    data_dir = _data_dir(state, "restore it")
    if os.environ.get(METADATA_URL_ENV):
        raise ConfigError(
            f"the metadata store is in Couchbase ({METADATA_URL_ENV} is set); restore it with Couchbase's "
            "own tools (`cbbackupmgr restore`), not `eventing restore`"
        )
    target = Path(data_dir) / SQLITE_FILE
    if target.exists():
        services: list[str] = []
        try:
            with open_store(data_dir, create=False) as store:
                services = store.live_services(SERVICE_STALE_S)
        except (NotFoundError, StoreCorruptError):
            pass  # a damaged store is what a restore is for; its message said to stop every process first
        if services:
            raise LifecycleError(
                f"cannot restore the metadata store while an eventing service runs ({', '.join(services)}); "
                "stop it first (Ctrl-C on `eventing run`), then restore"
            )
    else:
        private_folder(data_dir)
    folder = Path(backup_file) if Path(backup_file).is_dir() else None
    kept = restore_sqlite_store(folder / SQLITE_FILE if folder else backup_file, target)
    restored_buckets, kept_buckets = _restore_buckets(data_dir, folder) if folder else ([], [])
    with open_store(data_dir, create=False) as restored:
        records = restored.list_functions()
    return {
        "restored": str(target),
        "from": backup_file,
        "previous": str(kept) if kept else None,
        "functions": [{"name": r.name, "state": r.state.value} for r in records],
        "buckets_restored": restored_buckets,
        "buckets_kept": kept_buckets,
        "warnings": _missing_buckets(data_dir, records),
    }
