"""The bucket protocols: what workers, bindings, ops, the data service and the CLI may call on a bucket.

Four classes implement it (docs/architecture.md, 'Buckets: one interface'):

- ``LocalBucket`` (eventing.storage.bucket): one SQLite file;
- ``PartitionedBucket`` (eventing.storage.partitions): a bucket's vBuckets spread over several such files,
  each call sent to the file that holds the key or vBucket, or to every file and merged;
- ``RemoteBucket`` (eventing.storage.remote): a bucket served by the data service to a worker that cannot
  see the data directory;
- ``PostgresBucket`` (eventing.storage.postgres): a bucket of a PostgreSQL store, rows on the server.

They are cut by who calls what, and combine into the two wide ones:

- ``LogSource``: the log a worker reads (high seqnos, a vBucket's entries, reading ahead);
  ``DirectLogSource`` adds the reads only a process reaching the storage itself makes (a prefiltered read,
  columns for the data service, the earliest arrival for the window coordinator);
- ``BucketDocuments``: the documents bindings read and write, and writes of mutations;
  ``DocumentChanges`` adds the Data API's check-and-set and bulk loads (eventing.storage.keyspace.Collection);
- ``EffectTarget``: the effects a worker's flush applies (fences, effect groups, marks); ``BindingBucket``
  is a binding's bucket: documents and effects;
- ``Maintenance``: integrity checks, stats, copies and dumps, scans of the whole log for verify and stats,
  expirations, rewinds' lowering of effect marks, collections;
- ``Bucket`` (``LogSource`` + ``BindingBucket`` + ``flush``) is what all four answer; ``FileBucket`` adds
  ``DirectLogSource``, ``DocumentChanges`` and ``Maintenance``: what only a process that opens the files (or
  the server) can do.

A caller annotates what it uses with the narrowest of them. ``open_bucket`` and ``create_bucket``
(eventing.storage.factory) pick the class for a data directory's bucket. Capabilities a caller used to
probe for are methods every implementation answers: reading ahead (``reads_ahead``, ``prefetch``,
``has_ahead``, ``forget_prefetched``) is a no-op where reads cost no round trip (``NothingAhead``, the one
set of no-ops every such bucket uses). ``tests/unit/test_bucket_contract.py`` runs one suite over the four
and checks that it calls every method of these protocols.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Self

from eventing.core.mutation import Mutation

if TYPE_CHECKING:
    from eventing.core.filters import Prefilter
    from eventing.storage.dumps import BucketMeta
    from eventing.storage.values import (
        Changed,
        EffectGroup,
        EffectResult,
        PackedUpdates,
        Spans,
        StoredDocument,
        Write,
    )

Run = tuple[int, int, int]  # (vb, after_seqno, limit): a run of one vBucket's log to read


class BucketHandle(Protocol):
    """What every bucket protocol starts from: the bucket's identity, and closing it."""

    @property
    def name(self) -> str: ...
    @property
    def uuid(self) -> str:
        """The bucket's identity; a flush gives it a new one, so old checkpoints never resume on it."""
        ...

    @property
    def path(self) -> Path | None:
        """The main file (``<data-dir>/buckets/<name>.sqlite3``), None when the files are elsewhere (behind
        the data service) or there are none (a PostgreSQL store: eventing.storage.postgres)."""
        ...

    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> None: ...


class LogSource(BucketHandle, Protocol):
    """The per-vBucket mutation log, as a worker reads it (strictly increasing seqnos per vBucket)."""

    def high_seqnos(self, *, prefetched: bool = False, spans: Spans | None = None) -> list[int]:
        """High seqno of every vBucket (index = vBucket). ``prefetched``: those read along with the last
        read ahead may be answered (never older than the caller's previous read ahead). ``spans``: the
        caller reads only these (first, last) vBucket ranges; the others may answer 0."""
        ...

    def read_vb(self, vb: int, after_seqno: int, limit: int) -> list[Mutation]: ...
    def read_vb_rows(self, vb: int, after_seqno: int, limit: int) -> list[tuple]: ...
    def read_vb_packed(
        self, vb: int, after_seqno: int, limit: int, origin: str, *, exact_arrivals_over_ms: int | None = None
    ) -> PackedUpdates | None: ...
    def max_doc_bytes(self, vb: int, after_seqno: int, last_seqno: int) -> int: ...

    # reading ahead (a round trip saved per batch where reads cross the network)
    @property
    def reads_ahead(self) -> bool:
        """Whether ``prefetch`` does anything (the caller then plans its runs ahead)."""
        ...

    def prefetch(self, runs: list[Run], *, partial: bool = False) -> None:
        """Start reading the runs' rows; ``partial``: the runs are a few of the reader's vBuckets, the rows
        held for the others stay."""
        ...

    def read_changed(
        self, positions: list[tuple[int, int]], limit: int, *, for_next_step: bool = False
    ) -> None:
        """Start reading the high seqnos, and the rows that follow these ``(vb, position)`` pairs where there
        are any, in one round trip (``high_seqnos(prefetched=True)`` answers with them)."""
        ...

    def has_ahead(self, vb: int) -> bool: ...
    def forget_prefetched(self, positions: dict[int, int]) -> None: ...


class NothingAhead:
    """The reading-ahead part of ``LogSource`` for a bucket whose reads cost no round trip (a file, or a
    statement on a pooled connection): nothing is read ahead. Written once, used by every such bucket."""

    reads_ahead = False

    def prefetch(self, runs: list[Run], *, partial: bool = False) -> None:
        pass

    def read_changed(
        self, positions: list[tuple[int, int]], limit: int, *, for_next_step: bool = False
    ) -> None:
        pass

    def has_ahead(self, vb: int) -> bool:
        return False

    def forget_prefetched(self, positions: dict[int, int]) -> None:
        pass


class DirectLogSource(LogSource, Protocol):
    """The log reads only a process that reaches the storage itself makes: a worker's read less what its
    filter rules out, the columns the data service ships, the earliest arrival the window coordinator waits
    for."""

    def read_vb_matching(
        self, vb: int, after_seqno: int, limit: int, upto: int, prefilter: Prefilter, origin: str
    ) -> tuple[list[tuple], int, int]: ...
    def read_vb_columns(self, vb: int, after_seqno: int, limit: int) -> tuple | None: ...
    def first_arrival_after(self, positions: dict[int, int]) -> int | None: ...


class BucketDocuments(BucketHandle, Protocol):
    """The documents, as bindings read them and writers write them (each write gets the next seqno of its
    vBucket)."""

    def write(
        self, writes: Iterable[Write], *, origin: str | None = None, arrival_ms: int | None = None
    ) -> list[tuple[int, int] | None]: ...
    def upsert(
        self,
        key: str,
        doc: dict,
        *,
        origin: str | None = None,
        expiry: int = 0,
        arrival_ms: int | None = None,
    ) -> tuple[int, int]: ...
    def delete(self, key: str, *, origin: str | None = None) -> tuple[int, int]: ...

    def get(self, key: str) -> dict | None: ...
    def get_raw(self, key: str) -> bytes | None: ...
    def get_doc(self, key: str) -> tuple[bytes, int, int] | None: ...
    def get_meta(self, key: str) -> dict | None: ...
    def previous_doc(self, key: str, before_seqno: int) -> bytes | None: ...
    def ensure_key_index(self) -> None: ...
    def keys(self, prefix: str = "", limit: int | None = None) -> list[str]: ...
    def scan(self, prefix: str = "", limit: int | None = None) -> Iterator[tuple[str, dict, dict]]: ...
    def count(self, prefix: str = "") -> int: ...
    def collections(self) -> dict[tuple[str, str], int]: ...
    def mirrors(self) -> dict[int, str]: ...


class DocumentChanges(BucketDocuments, Protocol):
    """The documents as the Data API, the CLI's document commands and the Python API use them
    (eventing.storage.keyspace.Collection): also the check-and-set writes and bulk loads."""

    def change_document(
        self, key: str, change: Callable[[StoredDocument | None], Write | None], *, origin: str | None = None
    ) -> StoredDocument | None: ...
    def change_documents(
        self,
        changes: Sequence[tuple[str, Callable[[StoredDocument | None], Write | None]]],
        *,
        origin: str | None = None,
    ) -> list[Changed | Exception]: ...
    def load_rows(self, rows: Sequence[tuple], *, arrival_ms: int | None = None) -> int: ...


class EffectTarget(BucketHandle, Protocol):
    """The effects of handler bindings a worker's flush applies, exactly once (docs/architecture.md,
    'Exactly once'): fences, effect groups under the (function, vBucket) marks, and the marks."""

    def fence(self, function: str, epochs: dict[int, int]) -> None: ...
    def apply_effects(
        self, function: str, groups: Sequence[EffectGroup], *, origin: str | None = None, marks: bool = True
    ) -> EffectResult: ...
    def effect_marks(self, function: str) -> dict[int, tuple[int, int]]: ...


class BindingBucket(BucketDocuments, EffectTarget, Protocol):
    """A handler binding's bucket: its documents read, its writes applied as effects."""


class Bucket(LogSource, BindingBucket, Protocol):
    """A bucket: documents, a per-vBucket mutation log with strictly increasing seqnos, effect marks."""

    def flush(self, *, new_uuid: str | None = None) -> dict: ...


class Maintenance(BucketHandle, Protocol):
    """What ops and the CLI do to a whole bucket: integrity checks, stats, copies and dumps, scans of the
    whole log (verify, stats, rewinds), expirations, lowering and dropping effect marks, collections."""

    def verify_integrity(self) -> None: ...
    def copy_to(self, data_dir: str | os.PathLike[str]) -> Path: ...
    def stats(self) -> dict: ...
    def expire_due(self, now_s: float | None = None) -> int: ...
    def scan_log(self, batch: int = 10_000) -> Iterable[list[Mutation]]: ...
    def log_index(self, batch: int = 50_000) -> Iterable[list[tuple[int, int, str, str | None]]]: ...
    def logged_writes(self, prefix: str) -> dict[str, int]: ...
    def seqnos_before(self, time_ns: int) -> dict[int, int]: ...
    def lower_effect_marks(self, function: str, seqnos: dict[int, int]) -> dict[int, int]: ...
    def drop_effect_marks(self, function: str) -> None: ...
    def create_collection(self, scope: str, collection: str, *, mirror: str | None = None) -> int: ...
    def mirrors(self) -> dict[int, str]:
        """Collections mirroring a table (eventing.storage.mirror): id -> what they mirror; writes other
        than their mirror's are refused by the faces (Data API, KV port, bucket commands)."""
        ...

    def drop_collection(self, scope: str, collection: str) -> int: ...

    # the whole bucket as portable rows (eventing.storage.dumps): `eventing store copy`
    def dump_meta(self) -> BucketMeta: ...
    def dump_rows(self, table: str) -> Iterator[list[tuple]]: ...
    def load_dump(self, meta: BucketMeta, tables: Iterable[tuple[str, Iterable[list[tuple]]]]) -> None: ...


class FileBucket(Bucket, DirectLogSource, DocumentChanges, Maintenance, Protocol):
    """A bucket whose storage this process reaches itself (its files, or its PostgreSQL store): what ops,
    the CLI and the data service also call. ``path`` is None for a PostgreSQL bucket, whose ``copy_to``
    raises StoreError naming what to use instead."""
