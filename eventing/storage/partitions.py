"""Partitioned buckets: one bucket's vBuckets spread over several SQLite files.

SQLite lets one connection write a file at a time, and a commit by one connection empties the page cache
of every other connection to that file. Workers that each own a range of vBuckets and write documents of
their own vBuckets (a handler that keeps one document per source document, say) therefore queue for one
file and read its pages again after each other's commits. Couchbase keeps a file per vBucket; a bucket
created with ``partitions=N`` keeps one per contiguous range of vBuckets, the same ranges a function with
N workers gives its workers (``sharding.plan.split_even``), so each of those workers writes a file of its
own.

Every vBucket lives in exactly one partition: its documents, its log and its high seqno. Partition 0 is the
bucket's own file (``buckets/<name>.sqlite3``, which records how many partitions there are); the others are
``buckets/<name>.partitions/<i>.sqlite3``. Each partition is a complete bucket file, so every read of one key
or one vBucket is a read of one file, and listings merge the partitions in key order.

What changes for writers: a batch that spans partitions is one transaction per partition, committed one
after another (Couchbase gives no atomicity across vBuckets either). Binding effects stay exactly-once:
each partition keeps the effect marks of the writes it received, in the same transaction as those writes,
so a worker killed between two partitions' commits replays its effects and each partition skips what it
already holds. A source whose cas condition fails has none of its writes *to that partition* applied
(see docs/handler-api.md).
"""

from __future__ import annotations

import heapq
import itertools
import os
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Self

from eventing.core.keyspaces import COLLECTION_MARK, vbucket_of_stored
from eventing.core.mutation import Mutation
from eventing.storage.bucket import LocalBucket
from eventing.storage.dumps import BucketMeta, FileLoader, merged_marks
from eventing.storage.protocol import NothingAhead
from eventing.storage.reads import scanned
from eventing.storage.values import (
    Changed,
    EffectGroup,
    EffectResult,
    PackedUpdates,
    Spans,
    StoredDocument,
    Write,
)
from sharding import NUM_VBUCKETS
from sharding.plan import split_even

if TYPE_CHECKING:
    from eventing.core.filters import Prefilter
    from eventing.storage.protocol import FileBucket


def vbucket_of_key(key: str) -> int:
    """The vBucket of a stored key (a collection's: of its own key), which names its partition."""
    if key.startswith(COLLECTION_MARK):  # a collection's stored key: the vBucket of its own key
        return vbucket_of_stored(key)
    return ((zlib.crc32(key.encode()) >> 16) & 0x7FFF) % NUM_VBUCKETS  # sharding.vbucket_of, inlined


_vb_of = vbucket_of_key


def _split_columns(group: EffectGroup, part_of_vb: Sequence[int]) -> list[tuple[int, EffectGroup]]:
    """A group holding its writes as columns (EffectGroup.columns), split by the partition of each key:
    the group itself where every key is in one partition, else a group of columns per partition (each
    in the order of the writes)."""
    columns = group.columns
    assert columns is not None
    parts = [part_of_vb[_vb_of(key)] for key in columns[1]]
    first = parts[0]
    if parts.count(first) == len(parts):
        return [(first, group)]
    where: dict[int, list[int]] = {}
    for i, part in enumerate(parts):
        where.setdefault(part, []).append(i)
    return [
        (
            part,
            EffectGroup.of_columns(
                group.vb,
                group.epoch,
                tuple(tuple(map(column.__getitem__, rows)) for column in columns),
                group.conditional,
                group.upto,
            ),
        )
        for part, rows in where.items()
    ]


def partition_ranges(partitions: int) -> list[range]:
    """The vBuckets of each partition: contiguous, as a function with that many workers splits them."""
    runs = split_even(range(NUM_VBUCKETS), partitions)
    return [range(run[0], run[-1] + 1) for run in runs]


class PartitionedBucket(NothingAhead):
    """A bucket whose vBuckets are spread over ``len(parts)`` files (``LocalBucket``s, partition 0 first):
    the ``FileBucket`` protocol (eventing.storage.protocol), each call sent to the partition that holds the
    key or vBucket, or to every partition and merged.

    ``path``, ``uuid`` and ``name`` are the main file's (partition 0). It holds its parts rather than
    extending LocalBucket, so no method reaches partition 0 alone by accident. Files: nothing to read
    ahead (NothingAhead)."""

    def __init__(self, parts: Sequence[LocalBucket]):
        self.parts = list(parts)
        main = self.parts[0]
        self.path, self.name, self.uuid = main.path, main.name, main.uuid
        self.ranges = partition_ranges(len(self.parts))
        self._part_of_vb = [i for i, vbs in enumerate(self.ranges) for _ in vbs]

    def _part_of_key(self, key: str) -> LocalBucket:
        return self.parts[self._part_of_vb[_vb_of(key)]]

    def _split(self, keys: Iterable[str]) -> dict[int, list[int]]:
        """Indices of the items of each partition, in the items' order."""
        by_part: dict[int, list[int]] = {}
        part_of_vb = self._part_of_vb
        for i, key in enumerate(keys):
            by_part.setdefault(part_of_vb[_vb_of(key)], []).append(i)
        return by_part

    # -- opening ------------------------------------------------------------------------------------

    def close(self) -> None:
        for part in self.parts:
            part.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- a copy of the whole bucket (eventing.storage.dumps) ------------------------------------------

    def dump_meta(self) -> BucketMeta:
        return self.parts[0].dump_meta()

    def dump_rows(self, table: str) -> Iterator[list[tuple]]:
        if table == "marks":
            yield merged_marks([part.dump_rows("marks") for part in self.parts])
            return
        for part, vbs in zip(self.parts, self.ranges, strict=True):
            for rows in part.dump_rows(table):
                # every file has a high seqno row for each of the 1,024 vBuckets; its own are those of its
                # range
                yield [r for r in rows if r[0] in vbs] if table == "high" else rows

    def load_dump(self, meta: BucketMeta, tables: Iterable[tuple[str, Iterable[list[tuple]]]]) -> None:
        """Each partition takes the rows of its vBuckets and every mark (a copy's marks hold for all of
        them)."""
        loaders = [FileLoader(part, vbuckets=vbs) for part, vbs in zip(self.parts, self.ranges, strict=True)]
        for loader in loaders:
            loader.meta(meta)
        for table, batches in tables:
            for rows in batches:
                for loader in loaders:
                    loader.rows(table, rows)
        self.uuid = meta.uuid

    def verify_integrity(self) -> None:
        for part in self.parts:
            part.verify_integrity()

    def copy_to(self, data_dir: str | os.PathLike[str]) -> Path:
        buckets = self.path.parent
        targets = [Path(data_dir) / "buckets" / part.path.relative_to(buckets) for part in self.parts]
        for part, target in itertools.islice(zip(self.parts, targets, strict=True), 1, None):
            part.copy_file_to(target)
        return self.parts[0].copy_file_to(targets[0])  # the main file last, as create does

    # -- writes -------------------------------------------------------------------------------------

    def write(
        self, writes: Iterable[Write], *, origin: str | None = None, arrival_ms: int | None = None
    ) -> list[tuple[int, int] | None]:
        writes = list(writes)
        arrival = (
            int(time.time() * 1000) if arrival_ms is None else arrival_ms
        )  # one time for the whole batch
        out: list[tuple[int, int] | None] = [None] * len(writes)
        for part, indices in self._split(w[0] for w in writes).items():
            placed = self.parts[part].write([writes[i] for i in indices], origin=origin, arrival_ms=arrival)
            for i, where in zip(indices, placed, strict=True):
                out[i] = where
        return out

    def load_rows(self, rows: Sequence[tuple], *, arrival_ms: int | None = None) -> int:
        arrival = int(time.time() * 1000) if arrival_ms is None else arrival_ms
        return sum(
            self.parts[part].load_rows([rows[i] for i in indices], arrival_ms=arrival)
            for part, indices in self._split(r[0] for r in rows).items()
        )

    def upsert(
        self,
        key: str,
        doc: dict,
        *,
        origin: str | None = None,
        expiry: int = 0,
        arrival_ms: int | None = None,
    ) -> tuple[int, int]:
        return self._part_of_key(key).upsert(key, doc, origin=origin, expiry=expiry, arrival_ms=arrival_ms)

    def delete(self, key: str, *, origin: str | None = None) -> tuple[int, int]:
        return self._part_of_key(key).delete(key, origin=origin)

    def expire_due(self, now_s: float | None = None) -> int:
        now = time.time() if now_s is None else now_s
        return sum(part.expire_due(now) for part in self.parts)

    # -- reads --------------------------------------------------------------------------------------

    def get(self, key: str) -> dict | None:
        return self._part_of_key(key).get(key)

    def get_raw(self, key: str) -> bytes | None:
        return self._part_of_key(key).get_raw(key)

    def get_doc(self, key: str) -> tuple[bytes, int, int] | None:
        return self._part_of_key(key).get_doc(key)

    def get_meta(self, key: str) -> dict | None:
        return self._part_of_key(key).get_meta(key)

    def previous_doc(self, key: str, before_seqno: int) -> bytes | None:
        return self._part_of_key(key).previous_doc(key, before_seqno)

    def ensure_key_index(self) -> None:
        for part in self.parts:
            part.ensure_key_index()

    def high_seqnos(self, *, prefetched: bool = False, spans: Spans | None = None) -> list[int]:
        return list(
            itertools.chain.from_iterable(
                part.high_seqnos(spans=spans)[vbs.start : vbs.stop]
                for part, vbs in zip(self.parts, self.ranges, strict=True)
            )
        )

    def read_vb(self, vb: int, after_seqno: int, limit: int) -> list[Mutation]:
        return self.parts[self._part_of_vb[vb]].read_vb(vb, after_seqno, limit)

    def read_vb_rows(self, vb: int, after_seqno: int, limit: int) -> list[tuple]:
        return self.parts[self._part_of_vb[vb]].read_vb_rows(vb, after_seqno, limit)

    def read_vb_matching(
        self, vb: int, after_seqno: int, limit: int, upto: int, prefilter: Prefilter, origin: str
    ) -> tuple[list[tuple], int, int]:
        return self.parts[self._part_of_vb[vb]].read_vb_matching(
            vb, after_seqno, limit, upto, prefilter, origin
        )

    def read_vb_columns(self, vb: int, after_seqno: int, limit: int) -> tuple | None:
        return self.parts[self._part_of_vb[vb]].read_vb_columns(vb, after_seqno, limit)

    def read_vb_packed(
        self, vb: int, after_seqno: int, limit: int, origin: str, *, exact_arrivals_over_ms: int | None = None
    ) -> PackedUpdates | None:
        return self.parts[self._part_of_vb[vb]].read_vb_packed(
            vb, after_seqno, limit, origin, exact_arrivals_over_ms=exact_arrivals_over_ms
        )

    def first_arrival_after(self, positions: dict[int, int]) -> int | None:
        by_part: dict[int, dict[int, int]] = {}
        for vb, after in positions.items():
            by_part.setdefault(self._part_of_vb[vb], {})[vb] = after
        found = [
            t for part, own in by_part.items() if (t := self.parts[part].first_arrival_after(own)) is not None
        ]
        return min(found) if found else None

    def max_doc_bytes(self, vb: int, after_seqno: int, last_seqno: int) -> int:
        return self.parts[self._part_of_vb[vb]].max_doc_bytes(vb, after_seqno, last_seqno)

    def scan_log(self, batch: int = 10_000) -> Iterable[list[Mutation]]:
        for part in self.parts:  # partitions hold ascending vBucket ranges: (vb, seqno) order overall
            yield from part.scan_log(batch)

    def log_index(self, batch: int = 50_000) -> Iterable[list[tuple[int, int, str, str | None]]]:
        for part in self.parts:
            yield from part.log_index(batch)

    def logged_writes(self, prefix: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for part in self.parts:
            for key, n in part.logged_writes(prefix).items():
                counts[key] = counts.get(key, 0) + n
        return counts

    def keys(self, prefix: str = "", limit: int | None = None) -> list[str]:
        return [key for key, *_ in self._live_docs(prefix, limit, with_docs=False)]

    def scan(self, prefix: str = "", limit: int | None = None) -> Iterator[tuple[str, dict, dict]]:
        return scanned(self._live_docs(prefix, limit, with_docs=True))

    def _live_docs(
        self, prefix: str, limit: int | None, *, with_docs: bool, batch: int = 1000
    ) -> Iterator[tuple]:
        merged = heapq.merge(
            *(part.live_docs(prefix, limit, with_docs=with_docs, batch=batch) for part in self.parts),
            key=lambda row: row[0],
        )
        return itertools.islice(merged, limit)

    def count(self, prefix: str = "") -> int:
        return sum(part.count(prefix) for part in self.parts)

    def change_document(
        self, key: str, change: Callable[[StoredDocument | None], Write | None], *, origin: str | None = None
    ) -> StoredDocument | None:
        return self._part_of_key(key).change_document(key, change, origin=origin)

    def change_documents(
        self,
        changes: Sequence[tuple[str, Callable[[StoredDocument | None], Write | None]]],
        *,
        origin: str | None = None,
    ) -> list[Changed | Exception]:
        """One transaction in each partition the changes touch (see LocalBucket.change_documents)."""
        groups: dict[int, tuple[LocalBucket, list[int]]] = {}
        for i, (key, _) in enumerate(changes):
            part = self._part_of_key(key)
            groups.setdefault(id(part), (part, []))[1].append(i)
        out: list[Changed | Exception] = [Changed(None)] * len(changes)
        for part, positions in groups.values():
            done = part.change_documents([changes[i] for i in positions], origin=origin)
            for i, result in zip(positions, done, strict=True):
                out[i] = result
        return out

    # The collection registry lives in the main file (partition 0); documents in the partition of their
    # vBucket.
    def collections(self) -> dict[tuple[str, str], int]:
        return self.parts[0].collections()

    def create_collection(self, scope: str, collection: str, *, mirror: str | None = None) -> int:
        return self.parts[0].create_collection(scope, collection, mirror=mirror)

    def mirrors(self) -> dict[int, str]:
        return self.parts[0].mirrors()

    def drop_collection(self, scope: str, collection: str) -> int:
        cid = self.collections().get((scope, collection))
        dropped = self.parts[0].drop_collection(scope, collection)
        if cid is not None:
            for part in self.parts[1:]:
                dropped += part.drop_collection_documents(cid)
        return dropped

    def stats(self) -> dict:
        each = [part.stats() for part in self.parts]
        summed = {
            k: sum(s[k] for s in each) for k in ("documents", "tombstones", "mutations", "vbuckets_with_data")
        }
        return {**each[0], **summed, "partitions": len(self.parts)}

    def flush(self, *, new_uuid: str | None = None) -> dict:
        new_uuid = new_uuid or uuid.uuid4().hex
        # The main file's uuid last: a flush cut short is done again. Each part reports what it emptied.
        went = [part.flush(new_uuid=new_uuid) for part in reversed(self.parts)]
        self.uuid = new_uuid
        return {
            **went[-1],  # the main file's: bucket name and old uuid
            **{k: sum(w[k] for w in went) for k in ("documents", "tombstones", "mutations")},
        }

    # -- effects from handler bindings ---------------------------------------------------------------

    def fence(self, function: str, epochs: dict[int, int]) -> None:
        for part in self.parts:
            part.fence(function, epochs)

    def apply_effects(
        self, function: str, groups: Sequence[EffectGroup], *, origin: str | None = None, marks: bool = True
    ) -> EffectResult:
        """Each partition applies (and marks) the writes to its vBuckets, in its own transaction. A group
        without writes goes to partition 0, which checks its epoch like any other."""
        per_part: dict[int, list[EffectGroup]] = {}
        part_of_vb = self._part_of_vb
        for g in groups:
            if g.columns is not None:  # crossed processes: split by its key column, no Write made
                for part, group in _split_columns(g, part_of_vb):
                    per_part.setdefault(part, []).append(group)
                continue
            if not g.writes:
                per_part.setdefault(0, []).append(g)
                continue
            split: dict[int, list[tuple[int, Write]]] = {}
            for item in g.writes:
                split.setdefault(part_of_vb[_vb_of(item[1].key)], []).append(item)
            for part, writes in split.items():
                per_part.setdefault(part, []).append(
                    EffectGroup(g.vb, g.epoch, writes, g.conditional, g.upto)
                )
        result = EffectResult()
        conflicts: set[tuple[int, int]] = set()
        for part, part_groups in sorted(per_part.items()):
            got = self.parts[part].apply_effects(function, part_groups, origin=origin, marks=marks)
            result.applied += got.applied
            result.duplicates += got.duplicates
            result.fenced_vbs |= got.fenced_vbs
            result.fenced_writes += got.fenced_writes
            conflicts.update(got.conflicts)
        result.conflicts = sorted(conflicts)
        return result

    def partition_marks(self, function: str) -> tuple[list[int], list[dict[int, int]]]:
        """The partition of each vBucket's keys, and each partition's effect mark (seqno) per source vBucket:
        after a crash between two partitions' commits, a replayed mutation's writes are held by some
        partitions and not others (eventing.execution.bindings.EffectBuffer.held_keys)."""
        return list(self._part_of_vb), [
            {vb: s for vb, (_, s) in part.effect_marks(function).items()} for part in self.parts
        ]

    def effect_marks(self, function: str) -> dict[int, tuple[int, int]]:
        """Per source vBucket: the highest epoch any partition holds, and the lowest seqno that every
        partition holds effects up to (a partition without the mark holds none: seqno 0). A worker skips
        writes at or below that seqno; each partition skips again what it holds above it."""
        each = [part.effect_marks(function) for part in self.parts]
        out: dict[int, tuple[int, int]] = {}
        for vb in set().union(*each):
            marks = [m.get(vb, (0, 0)) for m in each]
            out[vb] = (max(e for e, _ in marks), min(s for _, s in marks))
        return out

    def lower_effect_marks(self, function: str, seqnos: dict[int, int]) -> dict[int, int]:
        moved: dict[int, int] = {}
        for part in self.parts:
            for vb, old in part.lower_effect_marks(function, seqnos).items():
                moved[vb] = max(old, moved.get(vb, 0))
        return moved

    def seqnos_before(self, time_ns: int) -> dict[int, int]:
        out: dict[int, int] = {}
        for part in self.parts:  # each holds the log of its own vBuckets only
            out.update(part.seqnos_before(time_ns))
        return out

    def drop_effect_marks(self, function: str) -> None:
        for part in self.parts:
            part.drop_effect_marks(function)


if TYPE_CHECKING:

    def _implements_the_protocol(bucket: PartitionedBucket) -> FileBucket:
        return bucket  # mypy checks every FileBucket method is here with a compatible signature
