"""Binding effects on a PostgreSQL bucket, exactly once (``EffectApplier``; docs/architecture.md, 'Exactly
once'): fences, the effect marks, and a batch of binding writes applied in one transaction with the marks
that cover it, as a bucket file applies them (eventing.storage.effects).

A bucket file's writers take turns, so reading a mark and moving it cannot be split by another writer. On
PostgreSQL the transaction locks the (function, vBucket) mark rows it reads (``FOR UPDATE``, in vBucket
order) before it decides anything: a fence raised by a new owner either commits before (and this batch is
rejected) or waits for this batch's commit (and the next one of the old owner is rejected). Then the high
seqno rows of the vBuckets written are locked, as every write does (eventing.storage.postgres.writer), so
cas conditions and counter deltas are resolved against documents nobody else can change meanwhile. Locks
are always taken marks first, then high seqnos, each in vBucket order, so appliers, fences and writers
never wait for each other in a cycle.

A transaction cut by a lost connection is run again whole (its writes and marks went together or not at
all); one whose COMMIT got no answer raises StoreUnavailableError(ambiguous=True), and the worker's replay
from its checkpoint is deduplicated by the marks.

Effects commit waiting for the server's disk, as every transaction of the store does (ASYNC_EFFECTS off).
Committing them without waiting (``synchronous_commit`` off) was tried: it saves one disk flush per flush
of effects, but a worker that outlives a server crash does not replay: it writes its checkpoint once the
server is back, and that checkpoint then covers effects the crash lost (tests/integration/
test_postgres_outage.py found effects missing after a kill -9 of the server).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from eventing.storage.effects import resolve_conditions
from eventing.storage.postgres.registry import BucketRef
from eventing.storage.postgres.writer import (
    BY_KEYS,
    Item,
    LogWriter,
    Written,
    items_of,
    plain_updates,
    send,
    update_columns,
    vb_of,
)
from eventing.storage.values import EffectGroup, EffectResult, Write
from eventing.storage.writes import group_items
from metadata.postgres.arrays import Int2s, Int8s
from metadata.postgres.connection import Cursor

Marks = dict[int, tuple[int, int]]  # vb -> (epoch, seqno)
_APPLY_USUAL = (
    "SELECT eventing_apply_effects(%s, %s, %s, %s, %s, %b::int2[], %b::int8[], %b::int8[], %b::int2[], "
    "%b::int8[], %b::int8[], %b::int2[], %b::text[], %b::bytea[], %b::int8[], %b::int8[], %b::int8[])"
)
ASYNC_EFFECTS = False  # see the module docstring: on only where a lost commit makes the worker replay
_ASYNC = "SET LOCAL synchronous_commit TO off"


class EffectApplier:
    """Effects of functions' bindings on one bucket, through its writer."""

    def __init__(self, ref: BucketRef, writer: LogWriter):
        self.ref = ref
        self.writer = writer

    # -- marks ----------------------------------------------------------------------------------------

    # The marks of the vBuckets (a sorted array), then the bucket and the function: each found by the primary
    # key and locked in the array's order. Not ``vb = ANY(array)``: before the table's statistics exist the
    # planner took (bucket, function) for one row and scanned all of the function's marks (1,024, with their
    # dead versions), keeping those asked for, ~0.7 ms a commit of effects at 1,000 writes/s
    # (eventing.storage.postgres.writer.BY_KEYS does the same for documents).
    _SELECT_MARKS = (
        "SELECT m.vb, m.epoch, m.seqno FROM unnest(%b::int2[]) AS k(vb) CROSS JOIN LATERAL "
        "(SELECT vb, epoch, seqno FROM bucket_effect_marks WHERE bucket = %s AND function = %s AND vb = k.vb "
        "FOR UPDATE) m"
    )

    def _lock_marks(self, cur: Cursor, function: str, vbs: Iterable[int]) -> Marks:
        """Lock the marks of (function, vb) for ``vbs``, in vBucket order; those that did not exist are made
        (epoch 0, seqno 0: what a missing mark means) so they are locked too. Their values."""
        return self._marks_of(cur, function, self._send_lock_marks(cur, function, vbs))

    def _send_lock_marks(self, cur: Cursor, function: str, vbs: Iterable[int]) -> tuple[list[int], object]:
        wanted = sorted(set(vbs))
        return wanted, send(cur, self._SELECT_MARKS, (wanted, self.ref.id, function)) if wanted else None

    def _marks_of(self, cur: Cursor, function: str, sent: tuple[list[int], object]) -> Marks:
        wanted, answer = sent
        if answer is None:
            return {}
        select = self._SELECT_MARKS
        found: Marks = {vb: (epoch, seqno) for vb, epoch, seqno in answer.fetchall()}  # type: ignore[attr-defined]
        missing = [vb for vb in wanted if vb not in found]
        if missing:
            made = {
                r[0]
                for r in cur.execute(
                    "INSERT INTO bucket_effect_marks(bucket, function, vb, epoch, seqno) "
                    "SELECT %s, %s, vb, 0, 0 FROM unnest(%b::int2[]) AS vb ON CONFLICT DO NOTHING RETURNING "
                    "vb",
                    (self.ref.id, function, missing),
                ).fetchall()
            }
            raced = [vb for vb in missing if vb not in made]  # made by another transaction meanwhile
            if raced:
                found.update(
                    {
                        vb: (epoch, seqno)
                        for vb, epoch, seqno in cur.execute(select, (raced, self.ref.id, function)).fetchall()
                    }
                )
        return found

    def _set_marks(self, cur: Cursor, function: str, marks: list[tuple[int, int, int]]) -> None:
        """(vb, epoch, seqno) marks: the epoch given, the greater seqno (several groups of one vBucket in a
        batch: the last one's epoch, as applying them one by one would leave)."""
        merged: dict[int, tuple[int, int]] = {}
        for vb, epoch, seqno in marks:
            seqno = max(seqno, merged[vb][1]) if vb in merged else seqno
            merged[vb] = (epoch, seqno)
        if not merged:
            return
        vbs = sorted(merged)
        cur.execute(
            "INSERT INTO bucket_effect_marks(bucket, function, vb, epoch, seqno) "
            "SELECT %s, %s, m.vb, m.epoch, m.seqno FROM unnest(%b::int2[], %b::int8[], %b::int8[]) AS m(vb, "
            "epoch, seqno) ON CONFLICT (bucket, function, vb) DO UPDATE SET epoch = excluded.epoch, "
            "seqno = GREATEST(bucket_effect_marks.seqno, excluded.seqno)",
            (self.ref.id, function, vbs, [merged[vb][0] for vb in vbs], [merged[vb][1] for vb in vbs]),
        )

    def fence(self, function: str, epochs: dict[int, int]) -> None:
        """Raise the epoch mark of (function, vb) so that writes of any older owner are rejected."""
        vbs = sorted(epochs)

        def body(cur: Cursor, written: Written) -> None:
            cur.execute(
                "INSERT INTO bucket_effect_marks(bucket, function, vb, epoch, seqno) "
                "SELECT %s, %s, m.vb, m.epoch, 0 FROM unnest(%b::int2[], %b::int8[]) AS m(vb, epoch) ORDER "
                "BY m.vb ON CONFLICT (bucket, function, vb) DO UPDATE SET epoch = "
                "GREATEST(bucket_effect_marks.epoch, excluded.epoch)",
                (self.ref.id, function, vbs, [epochs[vb] for vb in vbs]),
            )

        if vbs:
            self.writer.run(body)

    def effect_marks(self, function: str) -> dict[int, tuple[int, int]]:
        rows = self.ref.db.read(
            "SELECT vb, epoch, seqno FROM bucket_effect_marks WHERE bucket = %s AND function = %s",
            (self.ref.id, function),
        )
        return {vb: (epoch, seqno) for vb, epoch, seqno in rows}

    def lower_effect_marks(self, function: str, seqnos: dict[int, int]) -> dict[int, int]:
        """Lower the marks to at most the given seqnos (a rewind with --reapply-effects; epochs kept).
        Returns the vBuckets whose mark moved, with their old seqno."""

        def body(cur: Cursor, written: Written) -> dict[int, int]:
            old = self._lock_marks_present(cur, function, seqnos)
            moved = {vb: old[vb][1] for vb, s in seqnos.items() if vb in old and old[vb][1] > s}
            if moved:
                vbs = sorted(moved)
                cur.execute(
                    "UPDATE bucket_effect_marks m SET seqno = u.seqno FROM unnest(%b::int2[], %b::int8[]) AS "
                    "u(vb, seqno) WHERE m.bucket = %s AND m.function = %s AND m.vb = u.vb",
                    (vbs, [seqnos[vb] for vb in vbs], self.ref.id, function),
                )
            return moved

        return self.writer.run(body)

    def _lock_marks_present(self, cur: Cursor, function: str, vbs: Iterable[int]) -> Marks:
        rows = cur.execute(self._SELECT_MARKS, (sorted(set(vbs)), self.ref.id, function)).fetchall()
        return {vb: (epoch, seqno) for vb, epoch, seqno in rows}

    def drop_effect_marks(self, function: str) -> None:
        self.writer.run(
            lambda cur, written: cur.execute(
                "DELETE FROM bucket_effect_marks WHERE bucket = %s AND function = %s", (self.ref.id, function)
            )
        )

    # -- applying -------------------------------------------------------------------------------------

    def apply_effects(
        self, function: str, groups: Sequence[EffectGroup], origin: str | None, marks: bool
    ) -> EffectResult:
        """LocalBucket.apply_effects: skip writes at or below the (function, vb) mark, reject stale epochs,
        apply the rest with the marks that cover them in one transaction. ``marks=False``
        (``delivery: at_least_once``) applies every write as it comes, without reading or moving marks."""
        who = origin or function  # the writes' origin (eventing.storage.origins); `function` names the marks
        writer = self.writer
        if not marks:
            items = group_items(groups)

            def unmarked(cur: Cursor, written: Written) -> EffectResult:
                if ASYNC_EFFECTS:
                    cur.execute(_ASYNC)
                writer.log_in(cur, written, items, who, None)
                return EffectResult(applied=len(items))

            return writer.run(unmarked, pipeline=True)

        # Prepared before the transaction for the usual case, where no group is fenced or holds a write
        # already applied: the writes as one batch and each group's (vb, epoch, lowest and highest seqno).
        conditional = any(g.conditional for g in groups)
        ready = group_items(groups)  # straight from the columns of groups that crossed processes
        spans = [
            (g.vb, g.epoch, min(seqnos) if seqnos else None, max(max(seqnos, default=0), g.upto))
            for g in groups
            for seqnos in (g.seqnos(),)
        ]

        targets = [vb_of(item[0]) for item in ready]
        if not conditional and plain_updates(ready):
            applied = self._apply_usual(function, spans, ready, targets, who)
            if applied is not None:
                return applied

        def body(cur: Cursor, written: Written) -> EffectResult:
            # The marks, then the high seqnos of every vBucket the writes may go to, locked in that order
            # (pipelined: one round trip with BEGIN); the writes and marks go with COMMIT.
            if ASYNC_EFFECTS:
                cur.execute(_ASYNC)
            asked = self._send_lock_marks(cur, function, (g.vb for g in groups))
            locked = writer.send_lock(cur, targets)
            holds = writer.send_holds(cur)  # whether any document has XATTRs the writes may keep
            found = self._marks_of(cur, function, asked)
            heads = writer.heads_of(locked)
            if not conditional:
                new_marks = []
                for vb, epoch, lowest, highest in spans:
                    mark_epoch, mark_seqno = found.get(vb, (0, 0))
                    if mark_epoch > epoch or (lowest is not None and lowest <= mark_seqno):
                        break
                    new_marks.append((vb, epoch, max(mark_seqno, highest)))
                else:
                    writer.log_in(cur, written, ready, who, None, heads=heads, holds=holds)
                    self._set_marks(cur, function, new_marks)
                    return EffectResult(applied=len(ready))
            return general(cur, written, found, heads, holds)

        def general(
            cur: Cursor,
            written: Written,
            found: Marks,
            heads: tuple[dict[int, int], dict[int, int]],
            holds: object,
        ) -> EffectResult:
            result = EffectResult()
            writes: list[Write] = []
            new_marks = []
            pending: list[tuple[int, int, Write]] = []
            for g in groups:
                mark_epoch, mark_seqno = found.get(g.vb, (0, 0))
                if mark_epoch > g.epoch:
                    result.fenced_vbs.add(g.vb)
                    result.fenced_writes += len(g.writes)
                    continue
                top = max(mark_seqno, g.upto)
                for src_seqno, w in g.writes:
                    if src_seqno <= mark_seqno:
                        result.duplicates += 1
                        continue
                    if conditional:
                        pending.append((g.vb, src_seqno, w))
                    else:
                        writes.append(w)
                    top = max(top, src_seqno)
                new_marks.append((g.vb, g.epoch, top))
            if conditional and pending:
                # Every write goes through the check, in order, against the documents as they are under
                # the locks of their vBuckets (taken with the marks).
                stored = self._docs_in(cur, {w.key for _, _, w in pending})
                writes, result.conflicts = resolve_conditions(pending, stored.get)
            writer.log_in(cur, written, items_of(writes), who, None, heads=heads, holds=holds)
            result.applied = len(writes)
            self._set_marks(cur, function, new_marks)
            return result

        return writer.run(body, pipeline=True)

    def _apply_usual(
        self,
        function: str,
        spans: list[tuple[int, int, int | None, int]],
        ready: list[Item],
        targets: list[int],
        who: str,
    ) -> EffectResult | None:
        """The usual flush as one statement, the transaction of its own (eventing.storage.postgres.functions).
        ``spans``: each group's (vb, epoch, lowest source seqno or None, highest to mark). None where the
        server found a group fenced or a write applied already (it changed no document): the general path
        sorts those out."""
        last: dict[int, tuple[int, int]] = {}  # vb -> (the last group's epoch, the highest seqno to mark)
        for vb, epoch, _, highest in spans:
            last[vb] = (epoch, max(highest, last[vb][1]) if vb in last else highest)
        marked = sorted(last)
        args = (
            self.ref.id,
            function,
            who,
            int(time.time() * 1000),
            Int2s([vb for vb, _, _, _ in spans]),
            Int8s([epoch for _, epoch, _, _ in spans]),
            Int8s([lowest for _, _, lowest, _ in spans]),
            Int2s(marked),
            Int8s([last[vb][0] for vb in marked]),
            Int8s([last[vb][1] for vb in marked]),
            *update_columns(ready, targets),
        )
        if not self.ref.db.call(_APPLY_USUAL, args, committed=lambda: True):
            return None
        if targets:
            self.writer.wake.notify(self.ref.name, set(targets))
        return EffectResult(applied=len(ready))

    def _docs_in(self, cur: Cursor, keys: set[str]) -> dict[str, tuple[bytes, int, int]]:
        rows = cur.execute(
            BY_KEYS.format(columns="d.key, d.doc, d.cas, d.expiry") + " WHERE NOT d.deleted",
            ([k for k in keys if "\x00" not in k], self.ref.id),
        ).fetchall()
        return {key: (doc, cas, expiry) for key, doc, cas, expiry in rows}


__all__ = ["EffectApplier"]
