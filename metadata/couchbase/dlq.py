"""Dead letters in the Couchbase store: one document per (function, vBucket, seqno), inserted once, and
an index document per vBucket listing their seqnos."""

from __future__ import annotations

import base64
import functools
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence

from metadata.couchbase.cas import CasDocuments
from metadata.couchbase.documents import Doc
from metadata.model import DlqRow
from sharding import NUM_VBUCKETS

# Dead letters fetched per multi-get while filtering (bounds memory on large dead-letter queues).
DLQ_FETCH_CHUNK = 500


class DeadLetters:
    """The dead-letter queue of the MetadataStore protocol, and the deaths counted per mutation. A
    collaborator of CouchbaseMetadataStore (metadata.couchbase.store), over its documents."""

    def __init__(self, docs: CasDocuments):
        self.docs = docs

    # -- dead letters ---------------------------------------------------------------------------------

    def _dlq_key(self, function: str, vb: int, seqno: int) -> str:
        return self.docs.key("dlq", function, vb, seqno)

    def insert(self, rows: Sequence[DlqRow]) -> None:
        """Insert each dead letter once (a second insert of the same key is a no-op), then index it."""
        by_vb: dict[tuple[str, int], list[int]] = defaultdict(list)
        for r in rows:
            key = self._dlq_key(r.function, r.vb, r.seqno)
            if not self.docs.raw.insert(key, _encode_dlq(r)):
                self.docs.mutate(key, functools.partial(_revive_dlq, row=r))
            by_vb[(r.function, r.vb)].append(r.seqno)
        # Indexed after the rows: a crash in between is repaired when the batch is redone (the insert is
        # a no-op, the index entry is added then).
        for (function, vb), seqnos in by_vb.items():
            self.docs.index_add(self.docs.key("dlqix", function, vb), "seqnos", seqnos)

    def _dlq_positions(self, function: str, vb: int | None) -> list[tuple[int, int]]:
        vbs = range(2 * NUM_VBUCKETS) if vb is None else [vb]
        keys = {v: self.docs.key("dlqix", function, v) for v in vbs}
        docs = self.docs.get_many(list(keys.values()))
        return sorted((v, s) for v, key in keys.items() if key in docs for s in docs[key][0]["seqnos"])

    def dlq_rows(
        self, function: str, *, limit: int | None = None, include_replayed: bool = False
    ) -> list[DlqRow]:
        return self.find_dlq_rows(function, include_replayed=include_replayed, limit=limit)

    def dlq_row(self, function: str, vb: int, seqno: int) -> DlqRow | None:
        """The dead letter of (function, vBucket, seqno), replayed or not; None if there is none."""
        got = self.docs.get(self._dlq_key(function, vb, seqno))
        return _decode_dlq(got[0]) if got else None

    def find_dlq_rows(
        self,
        function: str,
        *,
        vb: int | None = None,
        seqno: int | None = None,
        key: str | None = None,
        reason: str | None = None,
        include_replayed: bool = False,
        replayed_only: bool = False,
        generation: int | None = None,
        limit: int | None = None,
    ) -> list[DlqRow]:
        """Dead letters matching every given filter, in (vBucket, seqno) order: per-document order.
        ``generation`` is checked on each fetched letter (the position index is per vBucket only)."""
        positions = [(v, s) for v, s in self._dlq_positions(function, vb) if seqno is None or s == seqno]
        found: list[DlqRow] = []
        for i in range(0, len(positions), DLQ_FETCH_CHUNK):
            keys = [self._dlq_key(function, v, s) for v, s in positions[i : i + DLQ_FETCH_CHUNK]]
            docs = self.docs.get_many(keys)
            for k in keys:
                if k not in docs:
                    continue  # removed after the index was read, or before its index entry was
                row = _decode_dlq(docs[k][0])
                if key is not None and row.key != key or reason is not None and row.reason != reason:
                    continue
                if generation is not None and row.generation != generation:
                    continue
                if replayed_only and row.replayed_at is None:
                    continue
                if not replayed_only and not include_replayed and row.replayed_at is not None:
                    continue
                found.append(row)
                if limit is not None and len(found) >= limit:
                    return found
        return found

    def mark_replayed(self, function: str, keys: Iterable[tuple[int, int]]) -> int:
        """Set replayed_at on the (vBucket, seqno) rows not yet replayed; returns how many changed."""
        now = time.time()

        def change(doc: Doc | None) -> Doc | None:
            if doc is None or doc["replayed_at"] is not None:
                return None
            return dict(doc, replayed_at=now)

        written = self.docs.mutate_many({self._dlq_key(function, vb, s): change for vb, s in keys})
        return sum(1 for doc in written.values() if doc is not None)

    def record_replay_failure(
        self, function: str, vb: int, seqno: int, reason: str, error: str, traceback: str
    ) -> None:
        """A replay of the row failed again: attempts + 1, and the newest reason, error and traceback."""

        def change(doc: Doc | None) -> Doc | None:
            if doc is None or doc["replayed_at"] is not None:
                return None
            return dict(
                doc,
                reason=reason,
                error=error,
                traceback=traceback,
                attempts=doc["attempts"] + 1,
                last_failed_at=time.time(),
            )

        self.docs.mutate(self._dlq_key(function, vb, seqno), change)

    def purge_dlq(
        self,
        function: str,
        reason: str | None = None,
        replayed_only: bool = False,
        *,
        keys: Iterable[tuple[int, int]] | None = None,
    ) -> int:
        """Delete dead letters (all of the function's, or those matching reason / replayed_only, or the
        given (vBucket, seqno) keys among them); returns how many rows were removed."""
        selected = None if keys is None else set(keys)
        rows = self.find_dlq_rows(function, reason=reason, include_replayed=True, replayed_only=replayed_only)
        removed: dict[int, list[int]] = defaultdict(list)
        for r in rows:
            if selected is not None and (r.vb, r.seqno) not in selected:
                continue
            if self.docs.raw.remove(self._dlq_key(function, r.vb, r.seqno)):
                removed[r.vb].append(r.seqno)
        for vb, seqnos in removed.items():
            self.docs.index_remove(self.docs.key("dlqix", function, vb), "seqnos", seqnos)
        if reason is None and not replayed_only and selected is None:
            # Everything went: drop the index documents too (entries whose row vanished included).
            self.docs.raw.remove_many(
                [self.docs.key("dlqix", function, vb) for vb in range(2 * NUM_VBUCKETS)]
            )
        return sum(len(s) for s in removed.values())

    # -- deaths on a mutation (eventing.workers.crash_guard) ------------------------------------------

    def count_death(self, function: str, vb: int, seqno: int) -> int:
        """One more death on (vb, seqno) in the function's deaths document; returns its count."""
        name = f"{vb}:{seqno}"

        def change(doc: Doc | None) -> Doc:
            counts = dict((doc or {}).get("counts", {}))
            counts[name] = int(counts.get(name, 0)) + 1
            return {"counts": counts}

        written = self.docs.mutate(self.docs.key("deaths", function), change)
        assert written is not None
        return int(written["counts"][name])

    def deaths(self, function: str) -> dict[tuple[int, int], int]:
        key = self.docs.key("deaths", function)
        got = self.docs.get(key)
        if got is None:
            return {}
        return self.docs.decode(key, _deaths_of, got[0])


def _encode_dlq(row: DlqRow) -> Doc:
    return {
        "function": row.function,
        "vb": row.vb,
        "seqno": row.seqno,
        "key": row.key,
        "reason": row.reason,
        "error": row.error,
        "traceback": row.traceback,
        "attempts": row.attempts,
        "first_failed_at": row.first_failed_at,
        "last_failed_at": row.last_failed_at,
        "mutation": base64.b64encode(row.mutation).decode("ascii"),
        "replayed_at": row.replayed_at,
        "generation": row.generation,
    }


def _revive_dlq(doc: Doc | None, row: DlqRow) -> Doc | None:
    """A mutation that fails again after its dead letter was replayed, or under a later deployment, gets the
    letter back (as SQLite's upsert does); an unreplayed letter of the same deployment stays as it is (a
    second insert after a crash is a no-op)."""
    if doc is None or (doc.get("replayed_at") is None and doc.get("generation", 0) >= row.generation):
        return None
    return dict(
        _encode_dlq(row),
        attempts=doc["attempts"] + row.attempts,
        first_failed_at=doc["first_failed_at"],
        replayed_at=None,
    )


def _deaths_of(doc: Doc) -> dict[tuple[int, int], int]:
    return {(int(k.split(":")[0]), int(k.split(":")[1])): int(n) for k, n in doc["counts"].items()}


def _decode_dlq(doc: Doc) -> DlqRow:
    return DlqRow(**dict(doc, mutation=base64.b64decode(doc["mutation"])))
