"""Binding effects applied exactly once (``EffectApplier``, a collaborator of ``LocalBucket``; see
docs/architecture.md, 'Exactly once'): per (function, source vBucket) a bucket keeps an effect mark, the
owner epoch and the last source seqno whose effects it holds, in the same transaction as the writes, so a
replay applies nothing twice and a stale owner's writes are rejected (fenced). Also the cas conditions and
counter deltas of a binding's advanced accessors, checked as the writes are applied, and lowering and
dropping the marks (a rewind that applies effects again, a new deployment that starts afresh).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from eventing.core.mutation import OP_UPDATE, decode_document, encode_document
from eventing.storage.bucket_file import BucketFile
from eventing.storage.file_health import maps_file_errors
from eventing.storage.reads import FileReader
from eventing.storage.values import EffectGroup, EffectResult, Write
from eventing.storage.writes import HEADS_BY_VB_MAX, FileWriter, _items, _plan, group_items


class EffectApplier:
    """Binding effects on one bucket file, written through its writer and checked against its documents
    (the reader). A collaborator of LocalBucket (eventing.storage.bucket)."""

    def __init__(self, file: BucketFile, writer: FileWriter, reader: FileReader):
        self.file = file
        self.writer = writer
        self.reader = reader

    def fence(self, function: str, epochs: dict[int, int]) -> None:
        """Raise the epoch mark of (function, vb) so that writes of any older owner are rejected."""

        def body() -> None:
            self.file.db.executemany(
                "INSERT INTO effect_marks VALUES(?,?,?,0) ON CONFLICT(function, vb) DO UPDATE SET "
                "epoch=MAX(epoch, excluded.epoch)",
                [(function, vb, e) for vb, e in epochs.items()],
            )

        self.file.transaction(body)

    def apply_effects(
        self, function: str, groups: Sequence[EffectGroup], *, origin: str | None = None, marks: bool = True
    ) -> EffectResult:
        """Apply binding writes exactly once: skip those at or below the (function, vb) mark, reject stale
        epochs.

        ``marks=False`` (a function with ``delivery: at_least_once``) applies every write as it comes, without
        reading or moving the marks: cheaper, but a replay applies its writes again and a zombie's are not
        rejected."""

        if not marks:
            items = group_items(groups)
            plan = _plan(items)

            def unmarked() -> EffectResult:
                self.writer.log(items, origin or function, None, plan)
                return EffectResult(applied=len(items))

            return self.file.transaction(unmarked)

        # Prepared before the lock for the usual case, where no group is fenced or holds a write already
        # applied: the writes as one planned batch, and each group's (vb, epoch, lowest and highest source
        # seqno). The transaction checks that case against the marks, else takes the general path below.
        conditional = any(g.conditional for g in groups)
        if not conditional:
            ready = group_items(groups)  # straight from the columns of groups that crossed processes
            ready_plan = _plan(ready)
            spans = [
                (g.vb, g.epoch, min(seqnos) if seqnos else None, max(max(seqnos, default=0), g.upto))
                for g in groups
                for seqnos in (g.seqnos(),)
            ]

        def body() -> EffectResult:
            if len(groups) > HEADS_BY_VB_MAX:  # one query for the function's marks (<= 2,048 rows)
                found = {
                    vb: (e, s)
                    for vb, e, s in self.file.db.execute(
                        "SELECT vb, epoch, seqno FROM effect_marks WHERE function=?", (function,)
                    )
                }
            else:
                found = {
                    g.vb: row
                    for g in groups
                    if (
                        row := self.file.db.execute(
                            "SELECT epoch, seqno FROM effect_marks WHERE function=? AND vb=?",
                            (function, g.vb),
                        ).fetchone()
                    )
                }
            if not conditional:
                marks = []
                for vb, epoch, lowest, highest in spans:
                    mark_epoch, mark_seqno = found.get(vb, (0, 0))
                    if mark_epoch > epoch or (lowest is not None and lowest <= mark_seqno):
                        break
                    marks.append((function, vb, epoch, max(mark_seqno, highest)))
                else:
                    self.writer.log(ready, origin or function, None, ready_plan)
                    self._set_marks(marks)
                    return EffectResult(applied=len(ready))
            return general(found)

        def general(found: dict[int, tuple[int, int]]) -> EffectResult:
            result = EffectResult()
            writes: list[Write] = []
            marks = []
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
                marks.append((function, g.vb, g.epoch, top))
            if conditional:  # every write goes through the check, in order, so chains of writes are followed
                writes, result.conflicts = self._resolve(pending)
            # The writes carry their origin, the writer's deployment (recursion guard, see
            # eventing.storage.origins; `function` when none is given); `function` also names the marks,
            # which a replay keeps apart from the live ones (its origin stays the deployment's).
            items = _items(writes)
            self.writer.log(items, origin or function, None, _plan(items))
            result.applied = len(writes)
            self._set_marks(marks)
            return result

        return self.file.transaction(body)

    def _set_marks(self, marks: list[tuple[str, int, int, int]]) -> None:
        self.file.db.executemany(
            "INSERT INTO effect_marks VALUES(?,?,?,?) ON CONFLICT(function, vb) DO UPDATE SET "
            "epoch=excluded.epoch, seqno=MAX(seqno, excluded.seqno)",
            marks,
        )

    def _resolve(self, pending: list[tuple[int, int, Write]]) -> tuple[list[Write], list[tuple[int, int]]]:
        """Check cas conditions and compute counter deltas against the stored documents, in this
        transaction (so no other writer can slip in between): see resolve_conditions."""
        return resolve_conditions(pending, self.reader.get_doc)

    @maps_file_errors
    def effect_marks(self, function: str) -> dict[int, tuple[int, int]]:
        rows = self.file.db.execute("SELECT vb, epoch, seqno FROM effect_marks WHERE function=?", (function,))
        return {vb: (epoch, seqno) for vb, epoch, seqno in rows}

    def lower_effect_marks(self, function: str, seqnos: dict[int, int]) -> dict[int, int]:
        """Lower the (function, vb) effect marks to at most the given seqnos, so effects of the function's
        mutations after them apply again (a rewind with --reapply-effects); epochs are kept. Returns the
        vBuckets whose mark moved, with their old seqno."""

        def body() -> dict[int, int]:
            old = self.effect_marks(function)
            moved = {vb: old[vb][1] for vb, s in seqnos.items() if vb in old and old[vb][1] > s}
            self.file.db.executemany(
                "UPDATE effect_marks SET seqno=? WHERE function=? AND vb=? AND seqno>?",
                [(seqnos[vb], function, vb, seqnos[vb]) for vb in moved],
            )
            return moved

        return self.file.transaction(body)

    def drop_effect_marks(self, function: str) -> None:
        db = self.file.db
        self.file.transaction(lambda: db.execute("DELETE FROM effect_marks WHERE function=?", (function,)))


def resolve_conditions(
    pending: list[tuple[int, int, Write]], get_doc: Callable[[str], tuple[bytes, int, int] | None]
) -> tuple[list[Write], list[tuple[int, int]]]:
    """The writes of ``pending`` ``(source vb, source seqno, write)`` to apply, and the sources whose cas
    condition or counter failed. ``get_doc`` reads a stored live document (``(doc, cas, expiry)`` or None)
    inside the applying transaction. A source whose condition fails has none of its writes here applied;
    the rest are checked again without it, until no new failure appears. Every bucket applies conditions
    with this one function."""
    conflicts: set[tuple[int, int]] = set()
    while True:
        # key -> (exists, version, doc): version is the stored cas, or for a document written earlier in
        # this transaction the cas that write carries.
        state: dict[str, tuple[bool, int, bytes | None]] = {}
        out: list[Write] = []
        failed: set[tuple[int, int]] = set()
        for vb, seqno, w in pending:
            source = (vb, seqno)
            if source in conflicts or source in failed:
                continue
            if w.key not in state:
                got = get_doc(w.key)
                state[w.key] = (True, got[1], got[0]) if got else (False, 0, None)
            exists, cas, doc = state[w.key]
            if w.expect_cas is not None and (
                (w.expect_cas == 0 and exists) or (w.expect_cas > 0 and (not exists or cas != w.expect_cas))
            ):
                failed.add(source)
                continue
            # the cas the write will have: a handler's carries it (CasSource); else the identity of its bytes,
            # which no handler saw (it was told the cas its write carries)
            version = w.cas if w.cas is not None else id(w.doc) if w.doc is not None else 0
            if w.delta is not None:
                count = decode_document(doc).get("count") if exists and doc is not None else 0
                if type(count) is not int:
                    failed.add(source)
                    continue
                w = Write(
                    w.key,
                    OP_UPDATE,
                    encode_document({"count": count + w.delta}),
                    w.expiry,
                    w.flags,
                    w.cas,
                    xattrs=w.xattrs,
                )
            elif w.expect_cas is not None:
                w = Write(w.key, w.op, w.doc, w.expiry, w.flags, w.cas, xattrs=w.xattrs)
            state[w.key] = (w.op == OP_UPDATE, version, w.doc)
            out.append(w)
        if not failed:
            return out, sorted(conflicts)
        # Start over without the failed sources: their earlier writes are dropped too, and later
        # conditions are checked against documents without them.
        conflicts |= failed
