"""Durable timers in the Couchbase store: one document per (function, vBucket) holding its timers,
written fenced by their vBucket's epoch and claimed with a CAS loop per document."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from metadata.couchbase.cas import CasDocuments
from metadata.couchbase.documents import Doc
from metadata.fencing import holds
from metadata.model import TimerChange, TimerDone, TimerRecord
from sharding import NUM_VBUCKETS, vbucket_of


class Timers:
    """The durable timers of the MetadataStore protocol (the store's commit writes them through ``write``). A
    collaborator of CouchbaseMetadataStore (metadata.couchbase.store), over its documents."""

    def __init__(self, docs: CasDocuments):
        self.docs = docs

    # -- timers ---------------------------------------------------------------------------------------

    def _timer_key(self, function: str, vb: int) -> str:
        return self.docs.key("tmr", function, vb)

    def write(
        self, function: str, changes: list[TimerChange], done: list[TimerDone], fenced: set[int], now: float
    ) -> None:
        """As SqliteMetadataStore: fired timers (if they still hold their fire_seq) first, then creates and
        cancels in order; one CAS loop per vBucket document touched."""
        per_vb: dict[int, list[Callable[[Doc], None]]] = defaultdict(list)
        for d in done:
            if d.vb in fenced:
                continue

            def finish(doc: Doc, d: TimerDone = d) -> None:
                tid = _timer_id(d.callback, d.reference)
                if doc["timers"].get(tid, {}).get("fire_seq") == d.fire_seq:
                    del doc["timers"][tid]

            per_vb[d.vb].append(finish)
        for c in changes:
            if c.source_vb in fenced:
                continue

            def apply(doc: Doc, c: TimerChange = c) -> None:
                tid = _timer_id(c.callback, c.reference)
                if c.due_ms is None:
                    doc["timers"].pop(tid, None)
                else:
                    doc["timers"][tid] = {
                        "callback": c.callback,
                        "reference": c.reference,
                        "due_ms": c.due_ms,
                        "context": c.context,
                        "created_at": now,
                        "fire_seq": None,
                    }

            per_vb[c.vb].append(apply)

        def run(steps: list[Callable[[Doc], None]]) -> Callable[[Doc | None], Doc | None]:
            def change(doc: Doc | None) -> Doc | None:
                doc = doc or {"seq": 0, "timers": {}}
                for step in steps:
                    step(doc)
                return doc

            return change

        for vb, steps in per_vb.items():
            self.docs.mutate(self._timer_key(function, vb), run(steps))

    def claim_timers(
        self,
        function: str,
        epochs: Mapping[int, int],
        now_ms: int,
        limit: int,
        *,
        reclaim: Iterable[int] = (),
    ) -> list[TimerRecord]:
        """As SqliteMetadataStore.claim_timers; each vBucket's document is claimed with its own CAS loop."""
        vbs = sorted(epochs)
        again = set(reclaim) & set(vbs)
        docs = self.docs.raw.get_many([self._timer_key(function, vb) for vb in vbs])
        candidates: list[tuple[int, int, str]] = []
        for vb in vbs:
            got = docs.get(self._timer_key(function, vb))
            if got is None:
                continue
            for tid, t in got[0]["timers"].items():
                if t["fire_seq"] is None and t["due_ms"] <= now_ms:
                    candidates.append((t["due_ms"], vb, tid))
        candidates.sort()
        wanted: dict[int, set[str]] = defaultdict(set)
        for _, vb, tid in candidates[:limit]:
            wanted[vb].add(tid)
        if not wanted and not again:
            return []
        cps = self.docs.raw.get_many([self.docs.cp_key(function, vb) for vb in set(wanted) | again])
        out: list[TimerRecord] = []
        for vb in sorted(set(wanted) | again):
            cp = cps.get(self.docs.cp_key(function, vb))
            if cp is None or not holds(cp[0]["epoch"], epochs[vb]):
                continue
            claimed: list[TimerRecord] = []

            def take(doc: Doc | None, vb: int = vb, claimed: list[TimerRecord] = claimed) -> Doc | None:
                claimed.clear()
                if doc is None:
                    return None
                if vb in again:
                    old = sorted(
                        (t for t in doc["timers"].values() if t["fire_seq"] is not None),
                        key=lambda t: t["fire_seq"],
                    )
                    claimed.extend(_timer(function, vb, t) for t in old)
                fresh = sorted(
                    (
                        t
                        for tid, t in doc["timers"].items()
                        if tid in wanted.get(vb, ()) and t["fire_seq"] is None and t["due_ms"] <= now_ms
                    ),
                    key=lambda t: (t["due_ms"], t["callback"], t["reference"]),
                )
                for t in fresh:
                    doc["seq"] += 1
                    t["fire_seq"] = doc["seq"]
                    claimed.append(_timer(function, vb, t))
                return doc if fresh else None

            self.docs.mutate(self._timer_key(function, vb), take)
            out.extend(claimed)
        return out

    def get_timer(self, function: str, callback: str, reference: str) -> TimerRecord | None:
        vb = vbucket_of(reference)
        got = self.docs.raw.get(self._timer_key(function, vb))
        t = got[0]["timers"].get(_timer_id(callback, reference)) if got else None
        return None if t is None else _timer(function, vb, t)

    def timer_backlog(self, function: str, now_ms: int) -> dict[str, int]:
        docs = self.docs.raw.get_many([self._timer_key(function, vb) for vb in range(NUM_VBUCKETS)])
        timers = [t for doc, _ in docs.values() for t in doc["timers"].values()]
        return {"pending": len(timers), "due": sum(1 for t in timers if t["due_ms"] <= now_ms)}

    def drop_timers(self, function: str) -> None:
        self.docs.raw.remove_many([self._timer_key(function, vb) for vb in range(NUM_VBUCKETS)])


def _timer_id(callback: str, reference: str) -> str:
    return f"{callback}\u0000{reference}"


def _timer(function: str, vb: int, t: Doc) -> TimerRecord:
    return TimerRecord(
        function, t["callback"], t["reference"], vb, t["due_ms"], t["context"], t["created_at"], t["fire_seq"]
    )
