"""`on_batch(batch)`: a handler that takes many mutations in one call (see docs/handler-api.md, "Batch
handlers").

A `Batch` is a sequence of `BatchItem`s, mutations of the worker's vBuckets in seqno order per vBucket; its
columns (`keys`, `docs`) are made in bulk when first asked for, so vectorised work (one bulk request for a
thousand documents) costs no Python object per mutation that it does not use. The handler returns the items
that failed (as Lambda's batchItemFailures), and only those, and the later mutations of the same documents,
are retried or dead-lettered.

Binding writes belong to the item they are made for: iterating the batch (`for item in batch:`) makes each
item in turn the current one, as does `with item:`; a write, a timer or a log line goes to the current item,
and curl sends its idempotency key. `BatchScope` holds each item's writes and timer changes apart, so the
caller keeps those of the items that succeeded (each under its own source seqno, as one call's) and drops the
others'. A write made while no item is current is refused (BindingError): it would belong to no mutation.
Reads see the writes of the items before in the call, a failed item's included (not a replayed one's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import msgpack

from eventing.core.idempotency import batch_key, mutation_key
from eventing.core.mutation import OP_EXPIRE, OP_UPDATE, Mutation
from eventing.core.xattrs import user_xattrs
from eventing.errors import BindingError, TimerError
from eventing.execution import batch_columns
from eventing.execution.bindings import held_keys
from eventing.handler import DeleteOptions

if TYPE_CHECKING:
    from eventing.execution.runner import HandlerRunner

_as_mutation = tuple.__new__


class BatchItemFailed(Exception):
    """The item of a batch of one (dlq replay, the debugger) was reported failed by on_batch."""


class _Segment:
    """The items of one vBucket's run: from log rows (Mutation's field order), or read in bulk (`packed`,
    eventing.storage.values.PackedUpdates: updates' keys and documents back to back, deletes' seqnos), whose
    rows are read only if an item's meta or mutation is asked for (`load`). `docs`: the decoded documents
    when the reader decoded them (a bulk read's: of its updates only), else None."""

    __slots__ = ("vb", "rows", "packed", "load", "start", "docs", "keyspace")

    def __init__(
        self,
        vb: int,
        rows: list | None,
        packed: Any = None,
        load: Callable[[], list] | None = None,
        keyspace: Any = None,
    ):
        self.vb, self.rows, self.packed, self.load, self.start = vb, rows, packed, load, 0
        self.docs: list | None = None
        self.keyspace = keyspace  # meta.keyspace of its items (None: the runner's)

    def full_rows(self) -> list:
        if self.rows is None:
            assert self.load is not None
            self.rows = self.load()
        return self.rows


class Batch(Sequence):
    """What on_batch(batch) gets: `len(batch)`, `batch[i]`, `for item in batch:` (each item current in
    turn), and the columns `batch.keys`, `batch.docs` (None for a deletion), `batch.deleted` and
    `batch.column(field)` made in bulk."""

    def __init__(
        self,
        runner: HandlerRunner,
        segments: list[_Segment],
        keys: list[str],
        ops: list[int],
        seqnos: list[int],
        vbs: list[int],
    ):
        self._runner = runner
        self._segments = segments
        self._keys, self._ops, self._seqnos, self._vbs = keys, ops, seqnos, vbs
        self._docs: list | None = None
        self._key: str | None = None
        # Items whose document cannot be decoded (None in `docs`), found when the documents are decoded: they
        # are dead-lettered as `undecodable`, whatever on_batch said of them.
        self.undecodable: dict[int, str] = {}
        self.scope: BatchScope | None = None  # the call in progress's (set while on_batch runs)

    # -- building ----------------------------------------------------------------------------------------

    @classmethod
    def build(cls, runner: HandlerRunner, segments: list[_Segment]) -> Batch:
        keys: list[str] = []
        ops: list[int] = []
        seqnos: list[int] = []
        vbs: list[int] = []
        for seg in segments:
            seg.start = len(keys)
            if seg.rows is not None:
                rows = seg.rows
                keys += [r[2] for r in rows]
                ops += [r[3] for r in rows]
                seqnos += [r[1] for r in rows]
            else:
                p = seg.packed
                run = range(p.after_seqno + 1, p.last_seqno + 1)
                updated = p.keys.decode().split("\0") if p.update_count else []
                if not p.other_seqnos:
                    keys += updated
                    ops += [OP_UPDATE] * len(updated)
                else:  # deletes and expiries among the updates, by seqno
                    at, prev = 0, p.after_seqno
                    for seqno, key, op in zip(
                        p.other_seqnos, p.other_keys.decode().split("\0"), p.other_ops, strict=True
                    ):
                        gap = seqno - prev - 1  # updates between the last delete and this one
                        keys += updated[at : at + gap]
                        ops += [OP_UPDATE] * gap
                        keys.append(key)
                        ops.append(op)
                        at, prev = at + gap, seqno
                    keys += updated[at:]
                    ops += [OP_UPDATE] * (len(updated) - at)
                seqnos += run
            vbs += [seg.vb] * (len(keys) - seg.start)
        return cls(runner, segments, keys, ops, seqnos, vbs)

    @classmethod
    def of_rows(cls, runner: HandlerRunner, runs: list[tuple[int, list]]) -> Batch:
        """A batch of log rows, per vBucket (vb, rows in seqno order)."""
        return cls.build(runner, [_Segment(vb, rows) for vb, rows in runs if rows])

    def subset(self, indexes: list[int]) -> Batch:
        """The items at `indexes` (in order) as a batch of their own (a retry's), from their full rows."""
        segments: dict[tuple[int, int], _Segment] = {}
        docs = self.docs
        for i in indexes:
            seg = self._segment(i)
            part = segments.get((id(seg), seg.vb))
            if part is None:
                part = segments[(id(seg), seg.vb)] = _Segment(seg.vb, [], keyspace=seg.keyspace)
                part.docs = []
            part.rows.append(self.mutation(i))  # type: ignore[union-attr]
            part.docs.append(docs[i])  # type: ignore[union-attr]
        return Batch.build(self._runner, list(segments.values()))

    # -- what the handler sees -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [BatchItem(self, i) for i in range(len(self._keys))[index]]
        n = len(self._keys)
        if not isinstance(index, int) or not -n <= index < n:
            raise IndexError(f"batch index {index!r} out of range (the batch has {n} items)")
        return BatchItem(self, index % n)

    def __iter__(self) -> Iterator[BatchItem]:
        return _Items(self)

    def __repr__(self) -> str:
        return f"<batch of {len(self._keys)} mutations>"

    @property
    def keys(self) -> list[str]:
        """The items' document ids, in order."""
        return self._keys

    @property
    def docs(self) -> list:
        """The items' documents, in order: None for a deletion or an expiry (decoded on first use, in
        bulk)."""
        if self._docs is None:
            self._docs = self._decode()
        return self._docs

    @property
    def deleted(self) -> list[bool]:
        """For each item, whether it is a deletion or an expiry."""
        return [op != OP_UPDATE for op in self._ops]

    def column(self, field: str, default: Any = None) -> list:
        """The top-level field `field` of each item's document: `default` for a deletion and for a document
        without it (or not an object), as `doc.get(field, default)` would give. Read in bulk without decoding
        the rest of the documents, unless they are decoded already."""
        if self._docs is not None:
            return [doc.get(field, default) if type(doc) is dict else default for doc in self._docs]
        out: list = []
        for seg in self._segments:
            p = seg.packed
            values = None
            if p is not None and seg.docs is None:
                values = batch_columns.field_of(p, field, default)
            if values is None:  # from the segment's documents (decoded by the reader, or now)
                docs = self._segment_docs(seg)
                out += [doc.get(field, default) if type(doc) is dict else default for doc in docs]
                continue
            _interleave(out, values, p, default)
        return out

    @property
    def idempotency_key(self) -> str:
        """The key of a request made outside any item: the same items (in the same order) give the same
        key."""
        if self._key is None:
            self._key = batch_key([self.key_of(i) for i in range(len(self._keys))])
        return self._key

    # -- per item ------------------------------------------------------------------------------------------

    def key_of(self, i: int) -> str:
        return mutation_key(self._runner.key_base, self._vbs[i], self._seqnos[i])

    def mutation(self, i: int) -> Mutation:
        """Item i's log row (read from the source when the batch was read in bulk)."""
        seg = self._segment(i)
        return _as_mutation(Mutation, seg.full_rows()[i - seg.start])

    def xattrs_of(self, i: int) -> dict:
        """Item i's user XATTRs as of its mutation (on_update's third argument): {} for a deletion. A bulk
        read holds no entry with XATTRs (read_vb_packed leaves those to the rows), so only rows are looked
        at, when asked: a batch without any costs nothing more."""
        if self._ops[i] != OP_UPDATE:
            return {}
        seg = self._segment(i)
        if seg.rows is None:
            return {}
        row = seg.rows[i - seg.start]
        return user_xattrs(row[10]) if len(row) > 10 else {}

    def where(self, i: int) -> tuple[int, int]:
        return self._vbs[i], self._seqnos[i]

    def op(self, i: int) -> int:
        return self._ops[i]

    def light_mutation(self, i: int) -> Mutation:
        """Item i as far as a call's context needs it (position, key, operation): no read for a bulk batch."""
        seg = self._segment(i)
        if seg.rows is not None:
            return _as_mutation(Mutation, seg.rows[i - seg.start])
        return Mutation(self._vbs[i], self._seqnos[i], self._keys[i], self._ops[i], 0, None, None, 0, 0)

    def meta(self, i: int) -> Any:
        m = self.mutation(i)
        runner = self._runner
        keyspace = self._segment(i).keyspace or runner.keyspace
        return runner.meta_type(m.key, m.cas, m.vb, m.seqno, m.expiry, m.flags, "json", keyspace)

    def _segment(self, i: int) -> _Segment:
        segments = self._segments
        lo, hi = 0, len(segments) - 1
        while lo < hi:  # the last segment starting at or before i
            mid = (lo + hi + 1) // 2
            if segments[mid].start <= i:
                lo = mid
            else:
                hi = mid - 1
        return segments[lo]

    def _decode(self) -> list:
        out: list = []
        for seg in self._segments:
            out += self._segment_docs(seg)
        return out

    def _segment_docs(self, seg: _Segment) -> list:
        """A segment's documents, one per item (None for a deletion)."""
        p = seg.packed
        if p is None:  # from rows: documents decoded by the reader, or here
            if seg.docs is not None:
                return seg.docs
            return [
                msgpack.unpackb(r[5], raw=False) if r[3] == OP_UPDATE and r[5] is not None else None
                for r in seg.rows or ()
            ]
        docs = seg.docs  # a bulk read's documents are its updates' (None for its deletes)
        if docs is None:
            docs, bad = batch_columns.docs_of(p)
            seg.docs = docs
            if bad:  # update j -> the item it is
                updates = [seg.start + k for k in range(p.count) if self._ops[seg.start + k] == OP_UPDATE]
                self.undecodable.update((updates[j], why) for j, why in bad.items())
        out: list = []
        _interleave(out, docs, p, None)
        return out


def _interleave(out: list, updates: list, p: Any, deleted: Any) -> None:
    """A bulk read's values of its updates onto `out`, with `deleted` at its deletes' and expiries' places."""
    at, prev = 0, p.after_seqno
    for seqno in p.other_seqnos:
        gap = seqno - prev - 1
        out += updates[at : at + gap]
        out.append(deleted)
        at, prev = at + gap, seqno
    out += updates[at:]


class BatchItem:
    """One mutation of a batch: `id`, `doc` (None for a deletion), `deleted`, `expired`, `meta` (as
    on_update's), `xattrs`, `idempotency_key`, `index`. `with item:` makes it the current item (writes go
    to it)."""

    __slots__ = ("_batch", "index")

    def __init__(self, batch: Batch, index: int):
        self._batch, self.index = batch, index

    @property
    def id(self) -> str:
        return self._batch._keys[self.index]

    @property
    def doc(self) -> Any:
        return self._batch.docs[self.index]

    @property
    def deleted(self) -> bool:
        """A deletion or an expiry: `doc` is None."""
        return self._batch._ops[self.index] != OP_UPDATE

    @property
    def expired(self) -> bool:
        return self._batch._ops[self.index] == OP_EXPIRE

    @property
    def options(self) -> DeleteOptions:
        return DeleteOptions(expired=self.expired)

    @property
    def meta(self) -> Any:
        return self._batch.meta(self.index)

    @property
    def xattrs(self) -> dict:
        """The document's user extended attributes as of this mutation, as on_update(doc, meta, xattrs)
        gets them: {} for a document without any and for a deletion."""
        return self._batch.xattrs_of(self.index)

    @property
    def idempotency_key(self) -> str:
        return self._batch.key_of(self.index)

    def __enter__(self) -> BatchItem:
        scope = self._batch.scope
        if scope is not None:
            scope.switch(self.index)
        return self

    def __exit__(self, *exc: Any) -> None:
        scope = self._batch.scope
        if scope is not None:
            scope.switch(None)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BatchItem) and other._batch is self._batch and other.index == self.index

    def __hash__(self) -> int:
        return hash((id(self._batch), self.index))

    def __repr__(self) -> str:
        return f"<batch item {self.index}: {self.id!r}{' (deleted)' if self.deleted else ''}>"


class _Items:
    """Iterating a batch: each item is the current one while the loop's body runs; after the last, none is."""

    __slots__ = ("batch", "i")

    def __init__(self, batch: Batch):
        self.batch, self.i = batch, 0

    def __iter__(self) -> _Items:
        return self

    def __next__(self) -> BatchItem:
        batch, i = self.batch, self.i
        scope = batch.scope
        if i >= len(batch._keys):
            if scope is not None:
                scope.switch(None)
            raise StopIteration
        self.i = i + 1
        if scope is not None:
            scope.switch(i)
        return BatchItem(batch, i)


class _OutsideItems(list):
    """The writes of a buffer while no item of the batch is current: refused."""

    def append(self, item: Any) -> None:
        raise BindingError(
            "on_batch wrote through a binding while no item was current; make the write inside "
            "`for item in batch:` or `with item:`, so it belongs to the mutation it is for"
        )


class _OutsideItemsTimers(list):
    def append(self, item: Any) -> None:
        raise TimerError(
            "on_batch made a timer change while no item was current; make it inside `for item in batch:` or "
            "`with item:`, so it belongs to the mutation it is for"
        )


class _Held:
    __slots__ = ("writes", "overlay", "conditional", "timers")

    def __init__(self, buffers: int):
        self.writes: list[list] = [[] for _ in range(buffers)]
        self.overlay: list[dict] = [{} for _ in range(buffers)]
        self.conditional = [False] * buffers
        self.timers: list = []


class BatchScope:
    """Holds each item's binding writes and timer changes apart while on_batch runs (see the module
    docstring): `restore(i)` puts item i's back as a call's, for the runner to keep (`HandlerRunner.kept`).

    Reads during the call see the writes of the items before (as kept writes: the buffer's overlay, put
    back as it was when the call ends), except those of an item whose writes the bucket already holds (a
    replay after a crash: BucketBinding.keep drops them), as a call a mutation would."""

    def __init__(self, runner: HandlerRunner, batch: Batch):
        seen: dict[int, Any] = {}
        for b in runner.rw_bindings:
            seen.setdefault(id(b.buf), b)
        self.bindings = list(seen.values())
        self.buffers = [b.buf for b in self.bindings]
        self.timers = runner.timers
        self.context = runner.context
        self.batch = batch
        self.at: int | None = None
        self.held: dict[int, _Held] = {}
        self._overlays: list[dict | None] = [None] * len(
            self.buffers
        )  # each buffer's overlay before the call
        batch.scope = self
        self._outside()

    def _outside(self) -> None:
        for buf in self.buffers:
            buf.current = _OutsideItems()
            buf.current_overlay = {}
        self.timers.current = _OutsideItemsTimers()
        self.context.batch = self.batch

    def switch(self, i: int | None) -> None:
        if i == self.at:
            return
        self._park()
        self.at = i
        if i is None:
            self._outside()
            return
        vb, seqno = self.batch.where(i)
        for buf in self.buffers:
            buf.current = []
            buf.current_overlay = {}
            buf.source = (vb, seqno)
        self.timers.current = []
        context = self.context
        context.mutation = self.batch.light_mutation(i)
        context.batch = None

    def _park(self) -> None:
        i = self.at
        if i is None:
            return
        held = self.held.get(i)
        vb, seqno = self.batch.where(i)
        for k, buf in enumerate(self.buffers):
            current = buf.current
            if current or buf.conditional:
                if held is None:
                    held = self.held[i] = _Held(len(self.buffers))
                held.writes[k] += current
                written = buf.current_overlay
                if buf.partial and written:  # keys whose partition holds this item already: not visible
                    kept_keys = written.keys() - held_keys(buf, vb, seqno, written)
                    written = {key: written[key] for key in kept_keys}
                held.overlay[k].update(written)
                held.conditional[k] = held.conditional[k] or buf.conditional
                buf.conditional = False
                if written and seqno > buf.applied_upto.get(vb, 0):  # visible to the items after it
                    if self._overlays[k] is None:
                        self._overlays[k] = dict(buf.overlay)
                    buf.overlay.update(written)
            buf.current, buf.current_overlay = [], {}
        changes = self.timers.current
        if changes:
            if held is None:
                held = self.held[i] = _Held(len(self.buffers))
            held.timers += changes

    def end(self) -> None:
        """The call returned or raised: the current item's writes join its held ones; nothing is current,
        and the buffers' overlays are as before the call (the kept items' writes go back in as kept)."""
        try:
            self._park()
        finally:
            self.at = None
            self.batch.scope = None
            self.context.batch = None
            for k, buf in enumerate(self.buffers):
                buf.current = []
                buf.current_overlay = {}
                buf.conditional = False
                before = self._overlays[k]
                if before is not None:
                    buf.overlay = before
            self.timers.current = []

    def restore(self, i: int) -> None:
        """Item i's writes and timer changes as the call in progress's (empty if it made none)."""
        held = self.held.get(i)
        vb, seqno = self.batch.where(i)
        for k, buf in enumerate(self.buffers):
            buf.source = (vb, seqno)
            if held is None:
                buf.current, buf.current_overlay, buf.conditional = [], {}, False
            else:
                buf.current, buf.current_overlay = held.writes[k], held.overlay[k]
                buf.conditional = held.conditional[k]
        self.timers.current = held.timers if held is not None else []

    def discard(self) -> None:
        for buf in self.buffers:
            buf.current, buf.current_overlay, buf.conditional = [], {}, False
        self.timers.current = []


def failed_items(result: Any, batch: Batch) -> dict[int, Any]:
    """What on_batch returned, as {item index: its error (an exception, a text, or None)}: None or an empty
    list (every item succeeded), or the failed items, their indexes, or (item or index, error) pairs, or
    Lambda's {"batchItemFailures": [{"itemIdentifier": <item.idempotency_key or index>}]}. Anything else
    raises TypeError naming what to return."""
    if result is None:
        return {}
    if isinstance(result, dict) and set(result) == {"batchItemFailures"}:
        keys: dict[Any, int] = {batch.key_of(i): i for i in range(len(batch))}
        result = [
            keys.get(f.get("itemIdentifier"), f.get("itemIdentifier")) if isinstance(f, dict) else f
            for f in result["batchItemFailures"] or []
        ]
    if isinstance(result, str | bytes | dict) or not hasattr(result, "__iter__"):
        raise TypeError(_RETURN_HELP.format(got=type(result).__name__))
    out: dict[int, Any] = {}
    for entry in result:
        error: Any = None
        if isinstance(entry, tuple) and len(entry) == 2:
            entry, error = entry
        if isinstance(entry, BatchItem) and entry._batch is batch:
            index = entry.index
        elif isinstance(entry, int) and not isinstance(entry, bool) and 0 <= entry < len(batch):
            index = entry
        else:
            raise TypeError(_RETURN_HELP.format(got=repr(entry)[:80]))
        out[index] = error
    return out


_RETURN_HELP = (
    "on_batch returned {got}; return None when every item succeeded, else the failed items (a list of items, "
    "their indexes, or (item, error) pairs)"
)
