"""Which rows of a source bucket's log belong to a function's source keyspace (docs/architecture.md, 'The
path of a mutation'): the collections of a bucket share its log, so a worker passes over the rows of the
others, as Couchbase's DCP stream filtered by collection does, and hands the source's rows on with their
own keys and `meta.keyspace`."""

from __future__ import annotations

import time
from itertools import groupby
from operator import itemgetter

from eventing.core.keyspaces import COLLECTION_MARK, Keyspace, split_stored_key
from eventing.storage.protocol import BucketDocuments

COLLECTION_MARK_BYTES = COLLECTION_MARK.encode()
_ABOVE_MARK = chr(ord(COLLECTION_MARK) + 1)
_key_of = itemgetter(2)  # rows are (vb, seqno, key, ...)
# The registry is read again at least this often, so a collection dropped while the function runs stops
# reaching its handler within that time (a new one is found at its first row, without waiting).
REGISTRY_TTL_S = 1.0


class SourceCollections:
    """The source keyspace of one function over its bucket's collections (ids from the bucket's registry)."""

    def __init__(self, bucket: BucketDocuments, source: Keyspace):
        self.bucket = bucket
        self.source = source
        self.source_is_default = source.is_default
        self.default_meta = source.to_meta()
        self._ids: dict[int, Keyspace] = {}
        self._gone: set[int] = set()
        self._refresh()

    def _refresh(self) -> None:
        self._read_at = time.monotonic()
        self._ids = {
            cid: Keyspace(self.bucket.name, s, c) for (s, c), cid in self.bucket.collections().items()
        }

    def _wanted(self, cid: int) -> Keyspace | None:
        """The keyspace of collection `cid` if the function reads it, else None."""
        if cid == 0:
            default = Keyspace(self.bucket.name)
            return default if self.source.covers(default) else None
        keyspace = self._ids.get(cid)
        if keyspace is None and cid not in self._gone:
            # A collection is registered before any write to it, so a row's id unknown here was created
            # since the last read of the registry; still unknown after reading it again, it was dropped
            # (ids are never reused): remembered, so its rows cost no more reads.
            self._refresh()
            keyspace = self._ids.get(cid)
            if keyspace is None:
                self._gone.add(cid)
        # `scope.*` and `*.*` take the collections created while the function runs as well: a new id is
        # looked up above at its first row. A dropped collection's rows are passed over once the registry
        # read no longer lists it (the function is not undeployed, as in Couchbase; see eventing.ops.buckets).
        return keyspace if keyspace is not None and self.source.covers(keyspace) else None

    def mixed(self, rows: list) -> bool:
        """Whether a run holds rows that are not plain rows of the default collection, or the function reads
        another collection than the default: then split() must sort them (rows are (vb, seqno, key, ...))."""
        if not self.source_is_default:
            return True
        # Stored keys of collections start with \x01, below every plain key but one starting with \x00 or
        # \x01 (split() sorts even those out exactly): one comparison loop in C instead of one per row.
        return min(map(_key_of, rows)) < _ABOVE_MARK

    def split(self, rows: list) -> list[tuple[dict | None, list]]:
        """Consecutive groups of rows: (meta.keyspace, rows with their own keys) for the source's rows,
        (None, rows) for rows to pass over; in log order."""
        out: list[tuple[dict | None, list]] = []
        if self._ids and time.monotonic() - self._read_at > REGISTRY_TTL_S:
            self._refresh()
        for cid, group in groupby(rows, key=lambda row: split_stored_key(row[2])[0]):
            members = list(group)
            keyspace = self._wanted(cid)
            if keyspace is None:
                out.append((None, members))
            elif cid == 0:
                out.append((keyspace.to_meta(), members))
            else:
                prefix = len(f"{cid:x}") + 2
                out.append((keyspace.to_meta(), [(*row[:2], row[2][prefix:], *row[3:]) for row in members]))
        return out
