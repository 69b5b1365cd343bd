"""``PostgresBucket``: a bucket of a PostgreSQL store, the ``FileBucket`` protocol (eventing.storage.protocol)
with the bucket files' semantics (docs/architecture.md, 'Buckets: one interface').

A thin facade over its collaborators, one module each: the writer (eventing.storage.postgres.writer: seqnos,
cas, arrival times, the Data API's check-and-set, expirations, imports), the log reader (log_reader: high
seqnos, a vBucket's entries in every shape, scans), the documents (documents: keys, scans, counts, versions),
the effect applier (effects: fences, marks, binding writes exactly once) and the collections (keyspaces).
They share the bucket's ``BucketRef`` (registry: the database and the bucket's id), and the writer tells
the store's listeners what it wrote (wake).

What has no meaning on a server: ``path`` is None; ``copy_to`` and the file-only upkeep raise a StoreError
naming what to use instead; ``partitions`` is recorded when the bucket is created and reported by
``stats``, nothing more (PostgreSQL takes concurrent writers of one table: writers of different vBuckets
never wait for each other). Reading ahead (``prefetch``) is a worker's look at its vBuckets: their high
seqnos and next rows in one round trip (eventing.storage.postgres.read_ahead), which ``read_vb_rows`` and
``high_seqnos(prefetched=True)`` then answer from.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Self

from eventing.core.filters import Prefilter
from eventing.core.mutation import OP_DELETE, OP_UPDATE, Mutation, encode_document
from eventing.errors import NotFoundError, StoreError
from eventing.storage.dumps import BucketMeta
from eventing.storage.postgres import dump, wake
from eventing.storage.postgres.documents import DocumentReader
from eventing.storage.postgres.effects import EffectApplier
from eventing.storage.postgres.keyspaces import Keyspaces
from eventing.storage.postgres.log_reader import LogReader
from eventing.storage.postgres.read_ahead import ReadAhead
from eventing.storage.postgres.registry import BucketRef
from eventing.storage.postgres.writer import LogWriter, Written
from eventing.storage.values import (
    Changed,
    EffectGroup,
    EffectResult,
    PackedUpdates,
    Spans,
    StoredDocument,
    Write,
)
from metadata.postgres.connection import Cursor
from sharding import NUM_VBUCKETS, validate_key

if TYPE_CHECKING:
    from eventing.storage.protocol import FileBucket


class PostgresBucket:
    """One bucket of a PostgreSQL store (open it with eventing.storage.postgres.open_bucket)."""

    path = None  # no file: the rows are on the server
    reads_ahead = True  # a worker reaching the store directly looks ahead with `prefetch` (see the docstring)

    def __init__(self, ref: BucketRef, bucket_uuid: str, partitions: int = 1):
        self.ref = ref
        self.name = ref.name
        self.uuid = bucket_uuid
        self._partitions = partitions
        self._writer = LogWriter(ref, wake.sender_for(ref.db))
        self._log = LogReader(ref)
        self._docs = DocumentReader(self._log)
        self._effects = EffectApplier(ref, self._writer)
        self._keyspaces = Keyspaces(ref, self._writer)
        self._ahead = ReadAhead(ref)

    def __repr__(self) -> str:
        return f"<PostgreSQL bucket {self.name} at {self.ref.shown}>"

    def partitions(self) -> int:
        """The partitions given when the bucket was created (recorded; no meaning on a server)."""
        return self._partitions

    def close(self) -> None:
        pass  # the connections are the process's pool (metadata.postgres.PostgresDatabase)

    # -- a copy of the whole bucket (eventing.storage.dumps; `eventing store copy`) --------------------

    def dump_meta(self) -> BucketMeta:
        return dump.meta_of(self.ref)

    def dump_rows(self, table: str) -> Iterator[list[tuple]]:
        return dump.rows_of(self.ref, table)

    def load_dump(self, meta: BucketMeta, tables: Iterable[tuple[str, Iterable[list[tuple]]]]) -> None:
        dump.load(self.ref, meta, tables)
        self.uuid = meta.uuid

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes ---------------------------------------------------------------------------------------

    def write(
        self, writes: Iterable[Write], *, origin: str | None = None, arrival_ms: int | None = None
    ) -> list[tuple[int, int] | None]:
        """Apply writes in one transaction; each gets the next seqno of its vBucket, a fresh cas and the
        transaction's arrival time. (vb, seqno) per write, None for a delete of a missing document."""
        return self._writer.write(writes, origin, arrival_ms)

    def load_rows(self, rows: Sequence[tuple], *, arrival_ms: int | None = None) -> int:
        return self._writer.load_rows(rows, arrival_ms)

    def upsert(
        self,
        key: str,
        doc: dict,
        *,
        origin: str | None = None,
        expiry: int = 0,
        arrival_ms: int | None = None,
    ) -> tuple[int, int]:
        validate_key(key)
        placed = self.write(
            [Write(key, OP_UPDATE, encode_document(doc), expiry)], origin=origin, arrival_ms=arrival_ms
        )[0]
        assert placed is not None
        return placed

    def delete(self, key: str, *, origin: str | None = None) -> tuple[int, int]:
        validate_key(key)
        placed = self.write([Write(key, OP_DELETE)], origin=origin)[0]
        if placed is None:
            raise NotFoundError(f"document '{key}' does not exist in bucket '{self.name}'")
        return placed

    def expire_due(self, now_s: float | None = None) -> int:
        return self._writer.expire_due(now_s)

    def change_document(
        self, key: str, change: Callable[[StoredDocument | None], Write | None], *, origin: str | None = None
    ) -> StoredDocument | None:
        """Read ``key``'s live document and write what ``change`` makes of it, in one transaction (see
        LocalBucket.change_document; ``change`` may run more than once)."""
        done = self._writer.change_documents([(key, change)], origin)[0]
        if isinstance(done, Exception):
            raise done
        return done.after

    def change_documents(
        self,
        changes: Sequence[tuple[str, Callable[[StoredDocument | None], Write | None]]],
        *,
        origin: str | None = None,
    ) -> list[Changed | Exception]:
        return self._writer.change_documents(changes, origin)

    def flush(self, *, new_uuid: str | None = None) -> dict:
        """Empty the bucket (documents, log, high seqnos, effect marks) and give it a new uuid, in one
        transaction; returns what went."""
        new_uuid = new_uuid or uuid.uuid4().hex
        bucket = self.ref.id

        def body(cur: Cursor, written: Written) -> tuple:
            # Locks in the order every writer takes them: marks, then high seqnos.
            cur.execute(
                "SELECT 1 FROM bucket_effect_marks WHERE bucket = %s ORDER BY function, vb FOR UPDATE",
                (bucket,),
            )
            cur.execute("SELECT 1 FROM bucket_high WHERE bucket = %s ORDER BY vb FOR UPDATE", (bucket,))
            row = cur.execute(
                "SELECT uuid FROM bucket_registry WHERE id = %s FOR UPDATE", (bucket,)
            ).fetchone()
            if row is None:
                raise self.ref.gone()
            docs, deleted, mutations = cur.execute(
                "SELECT count(*) FILTER (WHERE NOT deleted), count(*) FILTER (WHERE deleted), "
                "(SELECT coalesce(sum(seqno), 0) FROM bucket_high WHERE bucket = %s) FROM bucket_docs "
                "WHERE bucket = %s",
                (bucket, bucket),
            ).fetchall()[0]
            for table in ("bucket_docs", "bucket_log", "bucket_effect_marks"):
                cur.execute(f"DELETE FROM {table} WHERE bucket = %s", (bucket,))
            cur.execute("UPDATE bucket_high SET seqno = 0, arrival_ms = 0 WHERE bucket = %s", (bucket,))
            cur.execute("UPDATE bucket_registry SET uuid = %s WHERE id = %s", (new_uuid, bucket))
            return row[0], int(docs), int(deleted), int(mutations)

        old_uuid, docs, deleted, mutations = self._writer.run(body)
        self.uuid = new_uuid
        return {
            "bucket": self.name,
            "documents": docs,
            "tombstones": deleted,
            "mutations": mutations,
            "old_uuid": old_uuid,
            "uuid": new_uuid,
        }

    # -- documents ------------------------------------------------------------------------------------

    def get(self, key: str) -> dict | None:
        return self._docs.get(key)

    def get_raw(self, key: str) -> bytes | None:
        return self._docs.get_raw(key)

    def get_doc(self, key: str) -> tuple[bytes, int, int] | None:
        return self._docs.get_doc(key)

    def get_meta(self, key: str) -> dict | None:
        return self._docs.get_meta(key)

    def previous_doc(self, key: str, before_seqno: int) -> bytes | None:
        return self._docs.previous_doc(key, before_seqno)

    def ensure_key_index(self) -> None:
        self._docs.ensure_key_index()

    def keys(self, prefix: str = "", limit: int | None = None) -> list[str]:
        return self._docs.keys(prefix, limit)

    def scan(self, prefix: str = "", limit: int | None = None) -> Iterator[tuple[str, dict, dict]]:
        return self._docs.scan(prefix, limit)

    def count(self, prefix: str = "") -> int:
        return self._docs.count(prefix)

    def collections(self) -> dict[tuple[str, str], int]:
        return self._keyspaces.collections()

    def create_collection(self, scope: str, collection: str, *, mirror: str | None = None) -> int:
        return self._keyspaces.create_collection(scope, collection, mirror)

    def mirrors(self) -> dict[int, str]:
        return self._keyspaces.mirrors()

    def drop_collection(self, scope: str, collection: str) -> int:
        return self._keyspaces.drop_collection(scope, collection)

    # -- the mutation log -----------------------------------------------------------------------------

    def high_seqnos(self, *, prefetched: bool = False, spans: Spans | None = None) -> list[int]:
        """With ``prefetched``, those the last ``prefetch`` read (once; they cover its runs' vBuckets)."""
        if prefetched and self._ahead.highs is not None:
            highs, self._ahead.highs = self._ahead.highs, None
            return highs
        return self._log.high_seqnos(spans)

    def read_vb(self, vb: int, after_seqno: int, limit: int) -> list[Mutation]:
        return self._log.read_vb(vb, after_seqno, limit)

    def read_vb_rows(self, vb: int, after_seqno: int, limit: int) -> list[tuple]:
        """The rows read ahead when they follow ``after_seqno`` (the rest, if any, read on the spot), else one
        statement."""
        if limit <= 0:
            return []
        found = self._ahead.take(vb, after_seqno, limit) if self._ahead.runs else None
        if found is None:
            return self._log.read_vb_rows(vb, after_seqno, limit)
        rows, covered = found
        if covered:
            return rows
        after = rows[-1][1] if rows else after_seqno
        return rows + self._log.read_vb_rows(vb, after, limit - len(rows))

    def read_vb_columns(self, vb: int, after_seqno: int, limit: int) -> tuple | None:
        return self._log.read_vb_columns(vb, after_seqno, limit)

    def read_vb_packed(
        self, vb: int, after_seqno: int, limit: int, origin: str, *, exact_arrivals_over_ms: int | None = None
    ) -> PackedUpdates | None:
        return self._log.read_vb_packed(
            vb, after_seqno, limit, origin, exact_arrivals_over_ms=exact_arrivals_over_ms
        )

    def read_vb_matching(
        self, vb: int, after_seqno: int, limit: int, upto: int, prefilter: Prefilter, origin: str
    ) -> tuple[list[tuple], int, int]:
        return self._log.read_vb_matching(vb, after_seqno, limit, upto, prefilter, origin)

    def max_doc_bytes(self, vb: int, after_seqno: int, last_seqno: int) -> int:
        return self._log.max_doc_bytes(vb, after_seqno, last_seqno)

    def first_arrival_after(self, positions: dict[int, int]) -> int | None:
        return self._log.first_arrival_after(positions)

    def scan_log(self, batch: int = 10_000) -> Iterable[list[Mutation]]:
        return self._log.scan_log(batch)

    def log_index(self, batch: int = 50_000) -> Iterable[list[tuple[int, int, str, str | None]]]:
        return self._log.log_index(batch)

    def logged_writes(self, prefix: str) -> dict[str, int]:
        return self._log.logged_writes(prefix)

    def seqnos_before(self, time_ns: int) -> dict[int, int]:
        return self._log.seqnos_before(time_ns)

    def prefetch(self, runs: list[tuple[int, int, int]], *, partial: bool = False) -> None:
        """A look at the runs' vBuckets (vb, after_seqno, limit), in the order they will be read: their high
        seqnos, and the next rows of those with any, in one round trip
        (eventing.storage.postgres.read_ahead; ``partial``: a few of the worker's vBuckets)."""
        self._ahead.look(runs, partial=partial)

    def read_changed(
        self, positions: list[tuple[int, int]], limit: int, *, for_next_step: bool = False
    ) -> None:
        self._ahead.look([(vb, position, limit) for vb, position in positions])

    def has_ahead(self, vb: int) -> bool:
        return self._ahead.has(vb)

    def forget_prefetched(self, positions: dict[int, int]) -> None:
        self._ahead.forget(positions)

    # -- effects of handler bindings ------------------------------------------------------------------

    def fence(self, function: str, epochs: dict[int, int]) -> None:
        self._effects.fence(function, epochs)

    def apply_effects(
        self, function: str, groups: Sequence[EffectGroup], *, origin: str | None = None, marks: bool = True
    ) -> EffectResult:
        return self._effects.apply_effects(function, groups, origin, marks)

    def effect_marks(self, function: str) -> dict[int, tuple[int, int]]:
        return self._effects.effect_marks(function)

    def lower_effect_marks(self, function: str, seqnos: dict[int, int]) -> dict[int, int]:
        return self._effects.lower_effect_marks(function, seqnos)

    def drop_effect_marks(self, function: str) -> None:
        self._effects.drop_effect_marks(function)

    # -- upkeep ---------------------------------------------------------------------------------------

    def stats(self) -> dict:
        docs, deleted, mutations, with_data = self._log.counts()
        return {
            "name": self.name,
            "uuid": self.uuid,
            "path": None,
            "store": self.ref.shown,
            "documents": docs,
            "tombstones": deleted,
            "mutations": mutations,
            "vbuckets_with_data": with_data,
            "partitions": self._partitions,
        }

    def verify_integrity(self) -> None:
        """A bucket file's integrity check has no counterpart here (the server checks its own pages); what
        can be checked is that the bucket is still registered with its 1,024 high seqno rows."""
        found = self._log.one("SELECT count(*) FROM bucket_high WHERE bucket = %s", (self.ref.id,))[0]
        if found != NUM_VBUCKETS:
            raise self.ref.missing_rows()

    def copy_to(self, data_dir: str | os.PathLike[str]) -> Path:
        raise StoreError(
            f"bucket '{self.name}' is in the PostgreSQL store at {self.ref.shown}, not in a file to copy; "
            f"move it to a data directory with `eventing store copy --from {self.ref.shown} --to "
            f"{os.fspath(data_dir)}`, or back it up with the server's own tools (pg_dump)"
        )


if TYPE_CHECKING:

    def _implements_the_protocol(bucket: PostgresBucket) -> FileBucket:
        return bucket  # mypy checks every FileBucket method is here with a compatible signature
