"""Local buckets: a SQLite document store plus a per-vBucket mutation log with strictly increasing seqnos.

A local bucket is both the embedded source of mutations (workers stream their own vBuckets from it, as
Couchbase workers open DCP streams) and a target of handler bindings. WAL mode lets one writer and
readers in other processes work at once.

Every log entry keeps its **arrival time** (``arrival_ms``, epoch milliseconds UTC): when the bucket
assigned its seqno, one value per write transaction, never going backwards within a vBucket. It travels
with the mutation (``Mutation.arrival_ms``) so that time policies that depend on when data reached the
source (the window idle timeout) give the same answer on every replay, whenever the service happened to
run (docs/operations-run.md, 'Arrival time and the window idle timeout'). Bucket files written
before the column existed are upgraded when first opened: their entries get the time of their ``cas``
(nanoseconds since the epoch, taken at the same write), so no entry is left without an arrival time.

``LocalBucket`` is put together from parts, each in a module of its own: writes (eventing.storage.writes),
reads (eventing.storage.reads), the info table and collections (eventing.storage.info_table) and binding
effects (eventing.storage.effects), over the file-level concerns (paths, schema, connecting, upgrading old
files: eventing.storage.files; damaged files and full disks: eventing.storage.file_health) and the values
it takes and returns (eventing.storage.values). This module opens, checks, copies, empties and closes a
bucket file, and maps SQLite's errors on its reads to one line naming the file.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Self

from eventing.core.names import check_bucket_name
from eventing.errors import ConfigError, NotFoundError, StoreError
from eventing.storage import wake
from eventing.storage.dumps import BucketMeta, FileLoader, file_meta, file_rows
from eventing.storage.effects import BucketEffects
from eventing.storage.file_health import (
    _connections_closed,
    _connections_opened,
    _mapping_errors,
    bucket_file_error,
    damaged_bucket_error,
    header_problem,
)
from eventing.storage.files import (
    WAL_AUTOCHECKPOINT_PAGES,
    _connect,
    _retry_locked,
    _upgrade,
    bucket_path,
    create_files,
    partition_path,
)
from eventing.storage.info_table import BucketInfo
from eventing.storage.reads import BucketReads
from eventing.storage.values import Spans
from eventing.storage.writes import BucketWrites
from metadata.sqlite_io import private_file, private_folder

if TYPE_CHECKING:
    from eventing.storage.protocol import FileBucket


class LocalBucket(BucketEffects, BucketInfo, BucketWrites, BucketReads):
    """A bucket stored in one SQLite file under `<data_dir>/buckets/`."""

    def __init__(self, path: Path, name: str, db: sqlite3.Connection):
        self.path = path
        self.name = name
        self._db = db
        self._closed = False
        _connections_opened(self)  # before any read: a failing read still closes
        self.uuid = self._info("uuid")
        # Cached high seqnos and the (data_version, own commits) they were read at: SQLite's data_version
        # counts other connections' commits, _commits this connection's.
        self._highs: list[int] = []
        self._highs_read_at: tuple[int, int, Spans | None] = (-1, -1, None)
        self._commits = 0
        self._checkpoint_pages = WAL_AUTOCHECKPOINT_PAGES  # as _connect sets it        # vBuckets the current transaction logged writes in: once it commits, a running service is told
        # (eventing.storage.wake), so the workers owning them need not wait for their next poll.
        self._written: set[int] = set()
        self._wake_path = wake.socket_path(wake.data_dir_of_bucket_file(path))

    # -- opening ------------------------------------------------------------------------------------

    @classmethod
    def create(cls, data_dir: str | os.PathLike[str], name: str, *, exist_ok: bool = False) -> LocalBucket:
        """Create a one-file bucket (any bucket, partitioned too: eventing.storage.factory.create_bucket)."""
        create_files(data_dir, name, exist_ok=exist_ok)
        return cls.open(data_dir, name)

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str], name: str) -> LocalBucket:
        """Open a one-file bucket (any bucket, partitioned too: eventing.storage.factory.open_bucket)."""
        main = cls.open_main(data_dir, name)
        partitions = main.partitions()
        if partitions != 1:
            main.close()
            raise ConfigError(
                f"bucket '{name}' has {partitions} partitions; open it with eventing.storage.factory.open_bucket"
            )
        return main

    @classmethod
    def open_main(cls, data_dir: str | os.PathLike[str], name: str) -> LocalBucket:
        """A bucket's main file (partition 0 of a partitioned bucket; ``partitions`` says how many)."""
        check_bucket_name(name)
        path = bucket_path(data_dir, name)
        if not path.exists():
            raise NotFoundError(
                f"unknown bucket '{name}' (no {path}); create it with `eventing bucket create {name}`"
            )
        return cls._open_file(path, name)

    def partitions(self) -> int:
        """How many files the bucket of this main file has (1: this one)."""
        return int(self._info_or("partitions", "1"))

    @classmethod
    def open_partition(cls, data_dir: str | os.PathLike[str], name: str, part: int, partitions: int) -> LocalBucket:
        """Partition ``part`` (>= 1) of a bucket of ``partitions`` files."""
        part_path = partition_path(data_dir, name, part)
        if not part_path.exists():
            raise StoreError(
                f"bucket '{name}' has {partitions} partitions but {part_path} is missing; restore it "
                "from a backup or recreate the bucket"
            )
        return cls._open_file(part_path, name)

    @classmethod
    def _open_file(cls, path: Path, name: str) -> LocalBucket:
        problem = header_problem(path)
        if problem is not None:
            raise damaged_bucket_error(path, problem)

        def connect() -> sqlite3.Connection:
            db = _connect(path)
            try:
                _upgrade(db, path)
            except BaseException:
                db.close()
                raise
            return db

        # Opening writes too (the WAL and shared-memory files): on a full disk it waits for space as a
        # write does, then fails with the same line.
        return cls(path, name, _retry_locked(path, connect))

    def verify_integrity(self) -> None:
        """Fail with one line naming the file and the way out when the bucket file is damaged (SQLite's
        quick check: every page of the file is read, ~50 ms for 200,000 mutations)."""
        problem = header_problem(self.path)
        if problem is None:
            try:
                result = self._db.execute("PRAGMA quick_check").fetchone()[0]
            except sqlite3.DatabaseError as exc:
                raise bucket_file_error(self.path, exc) from None
            problem = None if result == "ok" else f"failed its integrity check: {result}"
        if problem is not None:
            raise damaged_bucket_error(self.path, problem)

    # -- a copy of the whole bucket (eventing.storage.dumps; `eventing store copy`) --------------------

    def dump_meta(self) -> BucketMeta:
        return file_meta(self)

    def dump_rows(self, table: str) -> Iterator[list[tuple]]:
        return file_rows(self, table)

    def load_dump(self, meta: BucketMeta, tables: Iterable[tuple[str, Iterable[list[tuple]]]]) -> None:
        loader = FileLoader(self)
        loader.meta(meta)
        for table, batches in tables:
            for rows in batches:
                loader.rows(table, rows)
        self._highs_read_at = (-1, -1, None)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _connections_closed(self)
        self._db.close()

    def checkpoint_wal(self) -> None:
        """Move the WAL's pages into the file and empty the WAL (before the file is deleted or copied)."""
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def copy_to(self, data_dir: str | os.PathLike[str]) -> Path:
        """Copy this bucket, consistently even while it is written (SQLite's online backup), into another
        data directory under the same name; returns the new file's path."""
        return self._copy_file_to(bucket_path(data_dir, self.name))

    def _copy_file_to(self, target: Path) -> Path:
        private_folder(target.parent)
        private_file(target)
        copy = sqlite3.connect(target)
        try:
            self._db.backup(copy)
        finally:
            copy.close()
        return target

    def flush(self, *, new_uuid: str | None = None) -> dict:
        """Empty the bucket: documents, mutation log, high seqnos and effect marks go, in one transaction,
        and the bucket gets a new identity (uuid), so checkpoints taken on its old contents never resume
        on the new ones (a worker refuses a checkpoint whose bucket uuid differs). Returns what went."""
        before = self.stats()
        new_uuid = new_uuid or uuid.uuid4().hex

        def body() -> None:
            for table in ("docs", "log", "effect_marks"):
                self._db.execute(f"DELETE FROM {table}")
            self._db.execute("UPDATE high SET seqno=0, arrival_ms=0")
            self._db.execute("UPDATE info SET value=? WHERE key='uuid'", (new_uuid,))

        _retry_locked(self.path, lambda: self._tx(body))
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.uuid = new_uuid
        return {
            "bucket": self.name, "documents": before["documents"], "tombstones": before["tombstones"],
            "mutations": before["mutations"], "old_uuid": before["uuid"], "uuid": new_uuid,
        }

    def stats(self) -> dict:
        docs, deleted = self._db.execute(
            "SELECT COALESCE(SUM(deleted=0),0), COALESCE(SUM(deleted=1),0) FROM docs"
        ).fetchone()
        mutations = self._db.execute("SELECT COALESCE(SUM(seqno),0) FROM high").fetchone()[0]
        return {
            "name": self.name,
            "uuid": self.uuid,
            "path": str(self.path),
            "documents": docs,
            "tombstones": deleted,
            "mutations": mutations,
            "vbuckets_with_data": self._db.execute("SELECT COUNT(*) FROM high WHERE seqno>0").fetchone()[0],
            "partitions": 1,
        }


if TYPE_CHECKING:

    def _implements_the_protocol(bucket: LocalBucket) -> FileBucket:
        return bucket  # mypy checks every FileBucket method is here with a compatible signature


for _name in (
    "get_raw", "get_doc", "get_meta", "previous_doc", "high_seqnos", "read_vb_rows", "read_vb_columns",
    "read_vb_packed", "first_arrival_after", "max_doc_bytes", "scan_log", "log_index", "logged_writes",
    "_live_docs", "count", "stats", "effect_marks", "seqnos_before", "expire_due", "_info", "_info_or",
):
    setattr(LocalBucket, _name, _mapping_errors(getattr(LocalBucket, _name)))
