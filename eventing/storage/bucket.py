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

``LocalBucket`` is a facade over collaborators, one module each, that share the open file
(eventing.storage.bucket_file.BucketFile: the path, the connection, the commit count, the cached high
seqnos, the write transaction): the writer (eventing.storage.writes), the reader (eventing.storage.reads:
documents and the log), the effect applier (eventing.storage.effects) and the info table with the
collections (eventing.storage.info_table). Each method here says which of them answers it. Beneath them,
eventing.storage.files holds the file-level concerns (paths, schema, creating, connecting, upgrading old
files), eventing.storage.file_health damaged files and full disks (and ``maps_file_errors``, which makes
SQLite's errors on a read one line naming the file, put on each reading method of the collaborators and on
``stats`` here), and eventing.storage.values the values a bucket takes and returns. This module opens,
checks, copies, empties and closes a bucket file.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Self

from eventing.core.filters import Prefilter
from eventing.core.mutation import Mutation
from eventing.core.names import check_bucket_name
from eventing.errors import ConfigError, NotFoundError, StoreError
from eventing.storage.bucket_file import BucketFile
from eventing.storage.dumps import BucketMeta, FileLoader, file_meta, file_rows
from eventing.storage.effects import EffectApplier
from eventing.storage.file_health import (
    bucket_file_error,
    damaged_bucket_error,
    header_problem,
    maps_file_errors,
)
from eventing.storage.files import (
    _connect,
    _retry_locked,
    _upgrade,
    bucket_path,
    create_files,
    partition_path,
)
from eventing.storage.info_table import InfoTable
from eventing.storage.protocol import NothingAhead
from eventing.storage.reads import FileReader
from eventing.storage.values import (
    Changed,
    EffectGroup,
    EffectResult,
    PackedUpdates,
    Spans,
    StoredDocument,
    Write,
)
from eventing.storage.writes import FileWriter
from metadata.sqlite_io import private_file, private_folder

if TYPE_CHECKING:
    from eventing.storage.protocol import FileBucket


class LocalBucket(NothingAhead):
    """A bucket stored in one SQLite file under `<data_dir>/buckets/`: the ``FileBucket`` protocol
    (eventing.storage.protocol), each call answered by one of its collaborators. A read of the file costs
    no round trip: nothing is read ahead (NothingAhead)."""

    def __init__(self, path: Path, name: str, db: sqlite3.Connection):
        self.path = path
        self.name = name
        self.file = BucketFile(path, name, db)
        self.info = InfoTable(self.file)
        self._reader = FileReader(self.file)
        self._writer = FileWriter(self.file)
        self._effects = EffectApplier(self.file, self._writer, self._reader)
        try:
            self.uuid = self.info.get("uuid")
        except BaseException:
            self.file.close()
            raise

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
                f"bucket '{name}' has {partitions} partitions; open it with "
                "eventing.storage.factory.open_bucket"
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
        return int(self.info.get_or("partitions", "1"))

    @classmethod
    def open_partition(
        cls, data_dir: str | os.PathLike[str], name: str, part: int, partitions: int
    ) -> LocalBucket:
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
                result = self.file.db.execute("PRAGMA quick_check").fetchone()[0]
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

    def close(self) -> None:
        self.file.close()

    def checkpoint_wal(self) -> None:
        """Move the WAL's pages into the file and empty the WAL (before the file is deleted or copied)."""
        self.file.checkpoint_wal()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def copy_to(self, data_dir: str | os.PathLike[str]) -> Path:
        """Copy this bucket, consistently even while it is written (SQLite's online backup), into another
        data directory under the same name; returns the new file's path."""
        return self.copy_file_to(bucket_path(data_dir, self.name))

    def copy_file_to(self, target: Path) -> Path:
        """An online backup of this file at ``target`` (a partition's share of PartitionedBucket.copy_to)."""
        private_folder(target.parent)
        private_file(target)
        copy = sqlite3.connect(target)
        try:
            self.file.db.backup(copy)
        finally:
            copy.close()
        return target

    def flush(self, *, new_uuid: str | None = None) -> dict:
        """Empty the bucket: documents, mutation log, high seqnos and effect marks go, in one transaction,
        and the bucket gets a new identity (uuid), so checkpoints taken on its old contents never resume
        on the new ones (a worker refuses a checkpoint whose bucket uuid differs). Returns what went."""
        before = self.stats()
        new_uuid = new_uuid or uuid.uuid4().hex

        db = self.file.db

        def body() -> None:
            for table in ("docs", "log", "effect_marks"):
                db.execute(f"DELETE FROM {table}")
            db.execute("UPDATE high SET seqno=0, arrival_ms=0")
            db.execute("UPDATE info SET value=? WHERE key='uuid'", (new_uuid,))

        self.file.transaction(body)
        self.file.checkpoint_wal()
        self.uuid = new_uuid
        return {
            "bucket": self.name,
            "documents": before["documents"],
            "tombstones": before["tombstones"],
            "mutations": before["mutations"],
            "old_uuid": before["uuid"],
            "uuid": new_uuid,
        }

    @maps_file_errors
    def stats(self) -> dict:
        db = self.file.db
        docs, deleted = db.execute(
            "SELECT COALESCE(SUM(deleted=0),0), COALESCE(SUM(deleted=1),0) FROM docs"
        ).fetchone()
        mutations = db.execute("SELECT COALESCE(SUM(seqno),0) FROM high").fetchone()[0]
        return {
            "name": self.name,
            "uuid": self.uuid,
            "path": str(self.path),
            "documents": docs,
            "tombstones": deleted,
            "mutations": mutations,
            "vbuckets_with_data": db.execute("SELECT COUNT(*) FROM high WHERE seqno>0").fetchone()[0],
            "partitions": 1,
        }

    # -- writes (the writer) ----------------------------------------------------------------------------

    def write(
        self, writes: Iterable[Write], *, origin: str | None = None, arrival_ms: int | None = None
    ) -> list[tuple[int, int] | None]:
        """Apply writes in one transaction; each gets the next seqno of its vBucket (see FileWriter.write)."""
        return self._writer.write(writes, origin=origin, arrival_ms=arrival_ms)

    def load_rows(self, rows: Sequence[tuple], *, arrival_ms: int | None = None) -> int:
        return self._writer.load_rows(rows, arrival_ms=arrival_ms)

    def upsert(
        self,
        key: str,
        doc: dict,
        *,
        origin: str | None = None,
        expiry: int = 0,
        arrival_ms: int | None = None,
    ) -> tuple[int, int]:
        return self._writer.upsert(key, doc, origin=origin, expiry=expiry, arrival_ms=arrival_ms)

    def delete(self, key: str, *, origin: str | None = None) -> tuple[int, int]:
        return self._writer.delete(key, origin=origin)

    def change_document(
        self, key: str, change: Callable[[StoredDocument | None], Write | None], *, origin: str | None = None
    ) -> StoredDocument | None:
        return self._writer.change_document(key, change, origin=origin)

    def change_documents(
        self,
        changes: Sequence[tuple[str, Callable[[StoredDocument | None], Write | None]]],
        *,
        origin: str | None = None,
    ) -> list[Changed | Exception]:
        return self._writer.change_documents(changes, origin=origin)

    def expire_due(self, now_s: float | None = None) -> int:
        return self._writer.expire_due(now_s)

    # -- documents (the reader) ---------------------------------------------------------------------------

    def get(self, key: str) -> dict | None:
        return self._reader.get(key)

    def get_raw(self, key: str) -> bytes | None:
        return self._reader.get_raw(key)

    def get_doc(self, key: str) -> tuple[bytes, int, int] | None:
        return self._reader.get_doc(key)

    def get_meta(self, key: str) -> dict | None:
        return self._reader.get_meta(key)

    def previous_doc(self, key: str, before_seqno: int) -> bytes | None:
        return self._reader.previous_doc(key, before_seqno)

    def ensure_key_index(self) -> None:
        self._reader.ensure_key_index()

    def keys(self, prefix: str = "", limit: int | None = None) -> list[str]:
        return self._reader.keys(prefix, limit)

    def scan(self, prefix: str = "", limit: int | None = None) -> Iterator[tuple[str, dict, dict]]:
        return self._reader.scan(prefix, limit)

    def live_docs(
        self, prefix: str, limit: int | None, *, with_docs: bool, batch: int = 1000
    ) -> Iterator[tuple]:
        """Live documents' rows in key order (a partition's share of PartitionedBucket's listings)."""
        return self._reader.live_docs(prefix, limit, with_docs=with_docs, batch=batch)

    def count(self, prefix: str = "") -> int:
        return self._reader.count(prefix)

    # -- the mutation log (the reader) --------------------------------------------------------------------

    def high_seqnos(self, *, prefetched: bool = False, spans: Spans | None = None) -> list[int]:
        """High seqno of every vBucket; ``prefetched`` changes nothing: nothing is read ahead."""
        return self._reader.high_seqnos(spans)

    def read_vb(self, vb: int, after_seqno: int, limit: int) -> list[Mutation]:
        return self._reader.read_vb(vb, after_seqno, limit)

    def read_vb_rows(self, vb: int, after_seqno: int, limit: int) -> list[tuple]:
        return self._reader.read_vb_rows(vb, after_seqno, limit)

    def read_vb_matching(
        self, vb: int, after_seqno: int, limit: int, upto: int, prefilter: Prefilter, origin: str
    ) -> tuple[list[tuple], int, int]:
        return self._reader.read_vb_matching(vb, after_seqno, limit, upto, prefilter, origin)

    def read_vb_columns(self, vb: int, after_seqno: int, limit: int) -> tuple | None:
        return self._reader.read_vb_columns(vb, after_seqno, limit)

    def read_vb_packed(
        self, vb: int, after_seqno: int, limit: int, origin: str, *, exact_arrivals_over_ms: int | None = None
    ) -> PackedUpdates | None:
        return self._reader.read_vb_packed(
            vb, after_seqno, limit, origin, exact_arrivals_over_ms=exact_arrivals_over_ms
        )

    def first_arrival_after(self, positions: dict[int, int]) -> int | None:
        return self._reader.first_arrival_after(positions)

    def max_doc_bytes(self, vb: int, after_seqno: int, last_seqno: int) -> int:
        return self._reader.max_doc_bytes(vb, after_seqno, last_seqno)

    def scan_log(self, batch: int = 10_000) -> Iterable[list[Mutation]]:
        return self._reader.scan_log(batch)

    def log_index(self, batch: int = 50_000) -> Iterable[list[tuple[int, int, str, str | None]]]:
        return self._reader.log_index(batch)

    def logged_writes(self, prefix: str) -> dict[str, int]:
        return self._reader.logged_writes(prefix)

    def seqnos_before(self, time_ns: int) -> dict[int, int]:
        return self._reader.seqnos_before(time_ns)

    # -- effects of handler bindings (the effect applier) -------------------------------------------------

    def fence(self, function: str, epochs: dict[int, int]) -> None:
        self._effects.fence(function, epochs)

    def apply_effects(
        self, function: str, groups: Sequence[EffectGroup], *, origin: str | None = None, marks: bool = True
    ) -> EffectResult:
        return self._effects.apply_effects(function, groups, origin=origin, marks=marks)

    def effect_marks(self, function: str) -> dict[int, tuple[int, int]]:
        return self._effects.effect_marks(function)

    def lower_effect_marks(self, function: str, seqnos: dict[int, int]) -> dict[int, int]:
        return self._effects.lower_effect_marks(function, seqnos)

    def drop_effect_marks(self, function: str) -> None:
        self._effects.drop_effect_marks(function)

    # -- collections (the info table) ---------------------------------------------------------------------

    def collections(self) -> dict[tuple[str, str], int]:
        return self.info.collections()

    def mirrors(self) -> dict[int, str]:
        return self.info.mirrors()

    def create_collection(self, scope: str, collection: str, *, mirror: str | None = None) -> int:
        return self.info.create_collection(scope, collection, mirror=mirror)

    def drop_collection(self, scope: str, collection: str) -> int:
        return self.info.drop_collection(scope, collection)

    def drop_collection_documents(self, cid: int) -> int:
        """The documents of collection ``cid`` go (a partition's share of
        PartitionedBucket.drop_collection)."""
        return self.info.drop_collection_documents(cid)


if TYPE_CHECKING:

    def _implements_the_protocol(bucket: LocalBucket) -> FileBucket:
        return bucket  # mypy checks every FileBucket method is here with a compatible signature
