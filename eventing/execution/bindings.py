"""Bucket bindings: dict-like aliases a handler uses; writes are buffered and applied exactly once.

Besides the dict interface, every binding has Couchbase's advanced accessors (`get_result`, `insert`,
`upsert`, `replace`, `delete`, `increment`/`decrement`, `touch`, `lookup_in`, `mutate_in`), returning an
`OpResult`. The cas rule, since writes are held until the handler returns:
- a read returns the cas of the version this worker sees: the stored document's cas, or, for a document
  this function wrote earlier in the same batch (not yet applied), a provisional cas naming that write;
- `replace`/`delete`/`mutate_in`/`touch` with a cas fail at once (`cas_mismatch`) if that version has
  changed, and `insert` with `key_exists` if the document exists;
- the condition is checked again, atomically, when the batch is applied: if another writer (another
  vBucket's worker, another function, a client) changed the document in between, none of the call's
  writes to that bucket are applied and the mutation goes to the dead-letter queue as `cas_mismatch`
  (replay it to re-run it on the new version). A write made against a provisional cas holds only if
  the pending write it read was applied, so a chain of updates within a batch fails from its first
  broken link on.
- counters (`increment`/`decrement`) never conflict: the delta is added to the stored count when the batch
  is applied, so concurrent counters lose nothing; the value returned is the count this worker sees.
"""

from __future__ import annotations

import copy
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Any

from eventing.core import xattrs as xattr_codec
from eventing.core.keyspaces import check_user_key
from eventing.core.mutation import OP_DELETE, OP_UPDATE, decode_document, encode_document
from eventing.errors import BindingError, InvalidDocumentError
from eventing.execution import binding_xattrs
from eventing.execution.binding_xattrs import carried
from eventing.storage.protocol import BindingBucket
from eventing.storage.values import EffectGroup, Write
from eventing.storage.writes import CasSource
from sharding import validate_key

Tracer = Callable[[str, str, str, object], None]  # (operation, alias, key, value)
_new_write = tuple.__new__  # a Write's fields in order (values.Write), without its __new__'s Python frame
assert Write._fields[5:] == ("cas", "expect_cas", "delta", "xattrs"), (
    "BucketBinding.__setitem__ builds Writes field by field"
)


class EffectBuffer:
    """The pending writes of one bucket, shared by every alias bound to it, so two aliases of the same
    bucket see each other's writes and their writes reach the bucket in the order the handler made them."""

    def __init__(self) -> None:
        self.overlay: dict[str, Write] = {}  # batch writes not flushed yet, key -> its last write
        self.current: list[Write] = []  # writes of the handler call in progress
        self.current_overlay: dict[str, Write] = {}
        self.next_cas = CasSource()  # the cas of each write, known when the handler makes it
        self.groups: dict[int, EffectGroup] = {}
        # Kept writes set aside for a flush that runs while the next batch's calls do (concurrency > 1,
        # eventing.workers.concurrent_calls), and their overlay, read until that flush has committed.
        self.set_aside: list[EffectGroup] = []
        self.flushing: dict[str, Write] = {}
        self.flush_done = _DONE  # set once the writes in `flushing` are in the bucket (or were given up)
        # Set while those writes were sent as a sandboxed step ended (eventing.workers.handover): their
        # answer is taken on the worker's own thread, which a read of one of them would otherwise wait on.
        self.take_tail: Callable[[], None] | None = None
        self.source: tuple[int, int] = (0, 0)
        # Per source vBucket, the last source seqno whose effects this bucket already holds (read at
        # claim). A replayed mutation at or below it had its writes applied before a crash: they are
        # dropped here, so later mutations never read a replay's second copy (read-your-writes stays true).
        self.applied_upto: dict[int, int] = {}
        # A bucket in partitions whose marks differ for a source vBucket (a crash fell between two
        # partitions' commits): the partition of each vBucket's keys, and per source vBucket each
        # partition's mark. A replayed mutation's write to a partition that holds it is dropped alone.
        self.part_of_vb: list[int] = []
        self.partial: dict[int, tuple[int, list[int]]] = {}  # vb -> (highest mark, each partition's)
        self.replayed_writes = 0
        self.conditional = False  # the call in progress made a write with a cas condition or a delta
        self.expiries: dict[str, int] = {}  # expiry of pending writes that set one (advanced accessors)
        self.ops: Counter[str] = (
            Counter()
        )  # accessor outcomes (bkt_ops_cas_mismatch_count, ...), taken by the worker
        # A pending write sets a document's XATTRs (a mutate_in of XATTR paths): until the writes are
        # applied, later writes carry the XATTRs of the pending write before them (binding_xattrs.carried).
        self.xattr_writes = False


def held_keys(buf: EffectBuffer, vb: int, seqno: int, keys: Any) -> set[str]:
    """The keys among `keys` whose partition already holds the effects of source (vb, seqno) (empty unless
    the bucket's partitions were left with different marks for vb)."""
    partial = buf.partial.get(vb) if buf.partial else None
    if partial is None or seqno > partial[0]:
        return set()
    from eventing.storage.partitions import vbucket_of_key

    marks, part_of_vb = partial[1], buf.part_of_vb
    return {key for key in keys if seqno <= marks[part_of_vb[vbucket_of_key(key)]]}


def learn_partition_marks(buf: EffectBuffer, bucket: Any, function: str, vbs: Any) -> None:
    """Where `bucket` is in partitions, the source vBuckets among `vbs` whose partitions hold different
    marks (see EffectBuffer.partial)."""
    by_partition = getattr(bucket, "partition_marks", None)
    if by_partition is None:
        return
    answer = by_partition(function)
    if answer is None:  # a bucket in one piece behind the data service
        return
    part_of_vb, marks = answer
    buf.part_of_vb = part_of_vb
    for vb in vbs:
        each = [m.get(vb, 0) for m in marks]
        if min(each) < max(each):
            buf.partial[vb] = (max(each), each)
        else:
            buf.partial.pop(vb, None)


_DONE = threading.Event()
_DONE.set()


class _CallWrites(threading.local):
    """What EffectBuffer holds for the call in progress, one copy per thread."""

    def __init__(self) -> None:
        self.current: list[Write] = []
        self.current_overlay: dict[str, Write] = {}
        self.source: tuple[int, int] = (0, 0)
        self.conditional = False


def _per_thread(name: str) -> Any:
    return property(
        lambda self: getattr(self._call, name), lambda self, value: setattr(self._call, name, value)
    )


class ConcurrentEffectBuffer(EffectBuffer):
    """An EffectBuffer for a function whose worker runs several calls at once (`concurrency` > 1), one per
    thread: the call in progress is the thread's own; what calls keep is shared (the pool keeps one call's
    writes at a time).
    Calls of different documents keep their writes in the order they return, not their source seqnos, so
    `in_seqno_order` sorts them back once the batch's calls are done: a vBucket's effect mark moves to the
    highest seqno applied, and a lower seqno applied after it would be skipped as a duplicate."""

    current = _per_thread("current")
    current_overlay = _per_thread("current_overlay")
    source = _per_thread("source")
    conditional = _per_thread("conditional")

    def __init__(self) -> None:
        self._call = _CallWrites()
        super().__init__()

    def in_seqno_order(self) -> None:
        """Each vBucket's kept writes by source seqno (stable: one call's writes stay in the order made)."""
        by_seqno = itemgetter(0)
        for group in self.groups.values():
            group.writes.sort(key=by_seqno)


# Couchbase reads an expiry below 30 days as relative seconds, above as an absolute epoch time.
RELATIVE_EXPIRY_LIMIT_S = 30 * 24 * 3600
SUBDOC_PATH = re.compile(r"^[A-Za-z0-9_$-]+(\.[A-Za-z0-9_$-]+)*(\[\d+\])?$")  # [i]: array_insert's position
ARRAY_OPS = ("array_append", "array_prepend", "array_insert", "array_add_unique")


@dataclass(frozen=True)
class DocMeta:
    """A document's meta as the advanced accessors return it."""

    id: str
    cas: int
    expiry: int  # epoch seconds, 0 = never


@dataclass(frozen=True)
class OpResult:
    """The outcome of an advanced accessor: `success`, or `error` = cas_mismatch | key_not_found |
    key_exists | path_not_found | path_exists (Couchbase's outcomes), with the document and its meta
    where there is one; `value` holds a counter's count or lookup_in's results."""

    success: bool
    doc: Any = None
    meta: DocMeta | None = None
    error: str | None = None
    value: Any = None

    @property
    def cas_mismatch(self) -> bool:
        return self.error == "cas_mismatch"

    @property
    def key_not_found(self) -> bool:
        return self.error == "key_not_found"

    @property
    def key_exists(self) -> bool:
        return self.error == "key_exists"


_MISSING = object()


class BucketBinding:
    """`alias[key]`, `alias.get(key)`, `key in alias`, and for read-write aliases `alias[key] = doc`, `del
    alias[key]`.

    Writes of the mutation being handled are held until the handler returns: if it raises or times
    out they are discarded, so a failed attempt leaves no partial effects. Successful writes join the
    current batch, are readable at once by later mutations (read-your-writes) and reach the bucket in
    the worker's next flush, tagged with the source (vBucket, seqno) that caused them.
    """

    def __init__(
        self,
        alias: str,
        bucket: BindingBucket,
        access: str,
        function: str,
        buffer: EffectBuffer | None = None,
        prefix: str = "",
        mirror: str | None = None,
    ):
        self.alias = alias
        self.bucket = bucket
        self.access = access
        self.function = function
        self.tracer: Tracer | None = None
        self.buf = buffer if buffer is not None else EffectBuffer()
        # The stored-key prefix of the bound collection ("" for a bucket's default collection): aliases of
        # several collections of one bucket share its buffer, which holds stored keys
        # (eventing.core.keyspaces).
        self.prefix = prefix
        # What the bound collection mirrors (eventing.storage.mirror), else None: its documents follow the
        # table and are written by the mirror alone, so every write through this binding is refused.
        self.mirror = mirror

    @property
    def applied_upto(self) -> dict[int, int]:
        return self.buf.applied_upto

    @property
    def replayed_writes(self) -> int:
        return self.buf.replayed_writes

    @replayed_writes.setter
    def replayed_writes(self, value: int) -> None:
        self.buf.replayed_writes = value

    # -- handler-facing ---------------------------------------------------------------------------

    def _lookup(self, key: str) -> dict | None:
        buf = self.buf
        stored = self.prefix + key if self.prefix else key
        flushing = buf.flushing  # replaced, never changed in place, by the flush that commits it
        if stored in buf.current_overlay:
            raw = buf.current_overlay[stored].doc
        elif stored in buf.overlay:
            raw = buf.overlay[stored].doc
        elif stored in flushing:
            raw = flushing[stored].doc
        else:
            raw = self.bucket.get_raw(stored)
        value = None if raw is None else decode_document(raw)
        if self.tracer:
            self.tracer("read", self.alias, key, value)
        return value

    def get(self, key: str, default=None):
        value = self._lookup(key)
        return default if value is None else value

    def __getitem__(self, key: str) -> dict:
        value = self._lookup(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._lookup(key) is not None

    def __setitem__(self, key: str, doc: dict) -> None:
        self._check_writable("write")
        validate_key(key)
        check_user_key(key)
        try:
            data = encode_document(doc)
        except InvalidDocumentError as exc:
            raise BindingError(f"cannot write '{key}' through binding '{self.alias}': {exc}") from None
        if self.tracer:
            self.tracer("write", self.alias, key, doc)
        stored = self.prefix + key if self.prefix else key
        buf = self.buf
        try:  # the write's cas (CasSource), inline: this is the path of every `b[key] = doc`
            cas = buf.next_cas.next()
        except StopIteration:
            cas = buf.next_cas.refill()
        xattrs = carried(buf, stored) if buf.xattr_writes else None
        w = _new_write(
            Write, (stored, OP_UPDATE, data, 0, 0, cas, None, None, xattrs)
        )  # Write(...) minus a frame
        buf.current.append(w)
        buf.current_overlay[stored] = w

    def __delitem__(self, key: str) -> None:
        self._check_writable("delete")
        if self.tracer:
            self.tracer("delete", self.alias, key, None)
        stored = self.prefix + key
        buf = self.buf
        w = Write(stored, OP_DELETE, None, 0, 0, buf.next_cas())
        buf.current.append(w)
        buf.current_overlay[stored] = w

    # -- advanced accessors (Couchbase's couchbase.* API) -----------------------------------------

    def _visible(self, key: str) -> tuple[Any, DocMeta] | None:
        """The version of `key` this worker sees (pending writes first) with its cas, else None."""
        buf = self.buf
        stored = self.prefix + key
        if stored not in buf.current_overlay and stored not in buf.overlay and stored in buf.flushing:
            # Being written beside this call (set aside): read once that write is in (or was given up).
            if buf.take_tail is not None:
                buf.take_tail()
            buf.flush_done.wait()
        if stored in buf.current_overlay:
            pending = buf.current_overlay[stored]
        elif stored in buf.overlay:
            pending = buf.overlay[stored]
        else:
            got = self.bucket.get_doc(stored)
            if got is None:
                return None
            return decode_document(got[0]), DocMeta(key, got[1], got[2])
        if pending.doc is None:
            return None
        # The cas the pending write carries: the document's once the write is applied.
        return decode_document(pending.doc), DocMeta(key, pending.cas or 0, buf.expiries.get(stored, 0))

    def _outcome(self, error: str) -> OpResult:
        self.buf.ops[f"bkt_ops_{error}_count"] += 1
        return OpResult(False, error=error)

    def get_result(self, key: str) -> OpResult:
        """The document with its meta (cas, expiry), or `key_not_found`."""
        _check_key(key, self.alias)
        seen = self._visible(key)
        if self.tracer:
            self.tracer("read", self.alias, key, seen[0] if seen else None)
        if seen is None:
            return self._outcome("key_not_found")
        return OpResult(True, seen[0], seen[1])

    def insert(self, key: str, doc: dict, *, expiry: Any = 0) -> OpResult:
        """Create the document; `key_exists` if it exists."""
        self._check_writable("insert")
        _check_key(key, self.alias)
        if self._visible(key) is not None:
            return self._outcome("key_exists")
        return self._written(key, doc, self._write(key, doc, _expiry(expiry, self.alias), 0))

    def upsert(self, key: str, doc: dict, *, expiry: Any = 0) -> OpResult:
        self._check_writable("upsert")
        _check_key(key, self.alias)
        return self._written(key, doc, self._write(key, doc, _expiry(expiry, self.alias), None))

    def replace(self, key: str, doc: dict, *, cas: int | None = None, expiry: Any = 0) -> OpResult:
        """Replace an existing document; with `cas`, only if it is still the version read with that cas."""
        self._check_writable("replace")
        _check_key(key, self.alias)
        _check_cas(cas, self.alias)
        seen = self._visible(key)
        if seen is None:
            return self._outcome("key_not_found")
        if cas is not None and cas != seen[1].cas:
            return self._outcome("cas_mismatch")
        return self._written(
            key,
            doc,
            self._write(key, doc, _expiry(expiry, self.alias), self._condition(key, seen[1].cas, cas)),
        )

    def delete(self, key: str, *, cas: int | None = None) -> OpResult:
        """Delete an existing document; with `cas`, only if it is still that version."""
        self._check_writable("delete")
        _check_key(key, self.alias)
        _check_cas(cas, self.alias)
        seen = self._visible(key)
        if seen is None:
            return self._outcome("key_not_found")
        if cas is not None and cas != seen[1].cas:
            return self._outcome("cas_mismatch")
        w = Write(
            self.prefix + key,
            OP_DELETE,
            None,
            0,
            0,
            self.buf.next_cas(),
            expect_cas=self._condition(key, seen[1].cas, cas),
        )
        self._append(w, key, None, 0)
        return OpResult(True, meta=DocMeta(key, w.cas or 0, 0))

    def increment(self, key: str, delta: int = 1) -> OpResult:
        """Add `delta` to the counter document `{"count": n}` (created at 0); `value` is the new count."""
        return self._count(key, delta, "increment")

    def decrement(self, key: str, delta: int = 1) -> OpResult:
        return self._count(key, -delta if type(delta) is int else delta, "decrement")

    def _count(self, key: str, delta: Any, what: str) -> OpResult:
        self._check_writable(what)
        _check_key(key, self.alias)
        if type(delta) is not int:
            raise BindingError(
                f"{what} of '{key}' through binding '{self.alias}': delta {delta!r} is not an integer"
            )
        seen = self._visible(key)
        count: Any = 0
        if seen is not None:
            count = seen[0].get("count") if isinstance(seen[0], dict) else None
            if type(count) is not int:
                raise BindingError(
                    f"{what} of '{key}' through binding '{self.alias}': the document is not a counter "
                    f"(no integer 'count' field); counters are documents like {{\"count\": 5}}"
                )
        doc = {"count": count + delta}
        data = encode_document(doc)
        stored = self.prefix + key
        buf = self.buf
        xattrs = carried(buf, stored) if buf.xattr_writes else None
        w = Write(stored, OP_UPDATE, data, 0, 0, buf.next_cas(), delta=delta, xattrs=xattrs)
        self._append(w, key, data, 0)
        return OpResult(True, doc, DocMeta(key, w.cas or 0, 0), value=doc["count"])

    def touch(self, key: str, expiry: Any) -> OpResult:
        """Give an existing document a new expiry."""
        self._check_writable("touch")
        _check_key(key, self.alias)
        seen = self._visible(key)
        if seen is None:
            return self._outcome("key_not_found")
        return self._written(
            key,
            seen[0],
            self._write(
                key, seen[0], _expiry(expiry, self.alias), self._condition(key, seen[1].cas, seen[1].cas)
            ),
        )

    def lookup_in(self, key: str, specs: list) -> OpResult:
        """Read parts of a document: specs ("get", path) and ("exists", path), each with an optional options
        dict (`{"xattrs": True}`: a path of the document's user XATTRs, eventing.execution.binding_xattrs);
        `value` lists the results (the value, or None for a missing path; True/False for exists)."""
        _check_key(key, self.alias)
        seen = self._visible(key)
        if seen is None:
            return self._outcome("key_not_found")
        values = []
        xattrs: dict | None = None
        for spec in specs:
            op, path, _, xattr = _spec(spec, ("get", "exists"), self.alias)
            if xattr and xattrs is None:
                xattrs = binding_xattrs.visible(self, self.prefix + key)
            found = _path_get(xattrs if xattr else seen[0], path)
            values.append(found is not _MISSING if op == "exists" else (None if found is _MISSING else found))
        return OpResult(True, seen[0], seen[1], value=values)

    def mutate_in(self, key: str, specs: list, *, cas: int | None = None, expiry: Any = 0) -> OpResult:
        """Change parts of an existing document: ("insert" | "upsert" | "replace", path, value),
        ("remove", path), ("array_append" | "array_prepend" | "array_add_unique", path, value),
        ("array_insert", "path[i]", value), each with an optional options dict (`{"xattrs": True}`: a path
        of the document's user XATTRs); all or nothing."""
        self._check_writable("mutate_in")
        _check_key(key, self.alias)
        _check_cas(cas, self.alias)
        seen = self._visible(key)
        if seen is None:
            return self._outcome("key_not_found")
        if cas is not None and cas != seen[1].cas:
            return self._outcome("cas_mismatch")
        doc = copy.deepcopy(seen[0])
        xattrs: dict | None = None
        for spec in specs:
            op, path, value, xattr = _spec(
                spec, ("insert", "upsert", "replace", "remove", *ARRAY_OPS), self.alias
            )
            if xattr and xattrs is None:
                xattrs = copy.deepcopy(binding_xattrs.visible(self, self.prefix + key))
            error = _path_set(xattrs if xattr else doc, op, path, value)  # type: ignore[arg-type]
            if error:
                return self._outcome(error)
        # The whole document is written back: conditional on the version read, even without a cas, so a
        # concurrent change of another field is never overwritten.
        return self._written(
            key,
            doc,
            self._write(
                key,
                doc,
                _expiry(expiry, self.alias),
                self._condition(key, seen[1].cas, seen[1].cas),
                None if xattrs is None else xattr_codec.for_write(xattrs),
            ),
        )

    @staticmethod
    def _condition(key: str, seen_cas: int, cas: int | None) -> int | None:
        """The version a held write must still find when applied: the cas it read, the stored document's or
        the one a pending write carries (which must then be applied before it)."""
        return None if cas is None else seen_cas

    def _write(
        self, key: str, doc: Any, expiry: int, expect_cas: int | None, xattrs: bytes | None = None
    ) -> Write:
        """A full-document write (keeping the document's XATTRs), or with `xattrs` the document with those."""
        try:
            data = encode_document(doc)
        except InvalidDocumentError as exc:
            raise BindingError(f"cannot write '{key}' through binding '{self.alias}': {exc}") from None
        stored = self.prefix + key
        buf = self.buf
        if xattrs is not None:
            buf.xattr_writes = True
        elif buf.xattr_writes:
            xattrs = carried(buf, stored)
        w = Write(stored, OP_UPDATE, data, expiry, 0, buf.next_cas(), expect_cas=expect_cas, xattrs=xattrs)
        self._append(w, key, data, expiry)
        return w

    @staticmethod
    def _written(key: str, doc: Any, w: Write) -> OpResult:
        """A write's outcome with its meta: the cas the document has once the write is applied."""
        return OpResult(True, doc, DocMeta(key, w.cas or 0, w.expiry))

    def _append(self, w: Write, key: str, data: bytes | None, expiry: int) -> None:
        """Hold write `w` (made with the stored key) of the handler's `key`."""
        buf = self.buf
        if self.tracer:
            self.tracer(
                "write" if data is not None else "delete", self.alias, key, data and decode_document(data)
            )
        buf.current.append(w)
        stored = w.key
        buf.current_overlay[stored] = w
        if expiry or stored in buf.expiries:
            buf.expiries[stored] = expiry
        if w.expect_cas is not None or w.delta is not None:
            buf.conditional = True

    def _check_writable(self, what: str) -> None:
        if self.mirror is not None:
            raise BindingError(
                f"cannot {what} through binding '{self.alias}' (bucket '{self.bucket.name}'): its collection "
                f"mirrors {self.mirror} and is written by the mirror alone; bind it read-only (access 'r') "
                "and change the rows in PostgreSQL"
            )
        if self.access != "rw":
            raise BindingError(
                f"cannot {what} through binding '{self.alias}' (bucket '{self.bucket.name}'): it is "
                "read-only; declare it with access 'rw' in the function definition"
            )

    def __repr__(self) -> str:
        return f"<binding {self.alias} -> bucket {self.bucket.name} ({self.access})>"

    # -- worker-facing ------------------------------------------------------------------------------

    # Aliases sharing a buffer each get these calls; after the first one they find nothing left to do.

    def begin(self, vb: int, seqno: int) -> None:
        buf = self.buf
        buf.source = (vb, seqno)
        # keep and discard leave both empty: new ones only when a call ended some other way.
        if buf.current:
            buf.current = []
        if buf.current_overlay:
            buf.current_overlay = {}

    def keep(self, epoch: int) -> None:
        """The handler returned: its writes join the batch."""
        buf = self.buf
        current = buf.current
        if not current:
            return
        vb, seqno = buf.source
        if seqno <= buf.applied_upto.get(vb, 0):
            buf.replayed_writes += len(current)
            self.discard()
            return
        if buf.partial:
            held = held_keys(buf, vb, seqno, buf.current_overlay)
            if held:  # held by their partitions already: dropped, so later calls read the bucket's version
                kept = [w for w in current if w.key not in held]
                buf.replayed_writes += len(current) - len(kept)
                for key in held:
                    del buf.current_overlay[key]
                if not kept:
                    self.discard()
                    return
                buf.current = current = kept
        group = buf.groups.get(vb)
        if group is None:
            group = buf.groups[vb] = EffectGroup(vb, epoch)
        if buf.conditional:
            group.conditional = True
            buf.conditional = False
        if len(current) == 1:  # the common case, without a generator per call
            group.writes.append((seqno, current[0]))
        else:
            group.writes.extend([(seqno, w) for w in current])
        buf.overlay.update(buf.current_overlay)
        buf.current = []
        buf.current_overlay = {}

    def discard(self) -> None:
        self.buf.current = []
        self.buf.current_overlay = {}
        self.buf.conditional = False

    def pending(self, set_aside: bool = True) -> int:
        """Kept writes not applied yet; with ``set_aside=False``, only those not set aside."""
        buf = self.buf
        kept = sum(len(g.writes) for g in buf.groups.values())
        return kept + sum(len(g.writes) for g in buf.set_aside) if set_aside else kept

    def take_groups(self) -> list[EffectGroup]:
        """Every kept write, those set aside first (they were kept first)."""
        buf = self.buf
        groups = buf.set_aside + list(buf.groups.values())
        buf.groups = {}
        buf.set_aside = []
        buf.overlay = {}
        self.flushed()
        if buf.expiries:
            buf.expiries = {}
        buf.xattr_writes = False  # nothing pending: a write keeps what the bucket holds
        return groups

    def set_aside(self) -> None:
        """The kept writes wait for take_set_aside, while reads still see them and new ones are kept."""
        buf = self.buf
        if not buf.groups:
            return
        buf.set_aside = buf.set_aside + list(buf.groups.values())
        buf.groups = {}
        buf.flushing = {**buf.flushing, **buf.overlay} if buf.flushing else buf.overlay
        buf.overlay = {}
        if buf.flush_done.is_set():
            buf.flush_done = threading.Event()

    def take_set_aside(self) -> list[EffectGroup]:
        """The writes set aside, for a flush; reads see them until `flushed()`."""
        groups, self.buf.set_aside = self.buf.set_aside, []
        return groups

    def flushed(self) -> None:
        """The writes taken by take_set_aside have committed (reads find them in the bucket now), or were
        given up (the worker rewinds): a read waiting for them goes on."""
        buf = self.buf
        buf.flushing = {}
        buf.flush_done.set()


def _check_key(key: Any, alias: str) -> None:
    if not isinstance(key, str):
        raise BindingError(f"binding '{alias}': key {key!r} is not a string")
    check_user_key(key)


def _check_cas(cas: Any, alias: str) -> None:
    if cas is not None and (type(cas) is not int or cas <= 0):
        raise BindingError(
            f"binding '{alias}': cas {cas!r} is not a cas; pass meta.cas from get_result(...).meta, or None"
        )


def _expiry(value: Any, alias: str) -> int:
    """Epoch seconds (0: never) from a datetime, a timedelta, or seconds (relative below 30 days)."""
    if isinstance(value, datetime):
        return int(value.timestamp())
    if isinstance(value, timedelta):
        return int(time.time() + value.total_seconds())
    if type(value) is int or type(value) is float:
        if value <= 0:
            return 0
        return int(time.time() + value) if value < RELATIVE_EXPIRY_LIMIT_S else int(value)
    raise BindingError(
        f"binding '{alias}': expiry {value!r} is not a time; pass seconds, a datetime or a timedelta"
    )


def _spec(spec: Any, allowed: tuple[str, ...], alias: str) -> tuple[str, str, Any, bool]:
    """(op, path, value, whether the path is an XATTR's) of a spec, with or without an options dict."""
    if not isinstance(spec, tuple | list) or not spec or spec[0] not in allowed:
        raise BindingError(
            f"binding '{alias}': sub-document spec {spec!r} is not one of {', '.join(allowed)}"
        )
    op = spec[0]
    needs_value = op not in ("get", "exists", "remove")
    size = 3 if needs_value else 2
    if len(spec) not in (size, size + 1) or not isinstance(spec[1], str) or not SUBDOC_PATH.match(spec[1]):
        shape = f"({op!r}, 'path', value)" if needs_value else f"({op!r}, 'path')"
        raise BindingError(
            f"binding '{alias}': sub-document spec {spec!r} should be {shape} with a dotted path, and "
            "optionally its options, {'xattrs': True}"
        )
    xattr = binding_xattrs.spec_options(tuple(spec), needs_value, alias)
    return op, spec[1], spec[2] if needs_value else None, xattr


def _path_get(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return _MISSING
        doc = doc[part]
    return doc


def _path_set(doc: dict, op: str, path: str, value: Any) -> str | None:
    """Apply one mutation spec in place; an error name (path_not_found, path_exists) or None."""
    index: int | None = None
    if path.endswith("]"):  # array_insert's "path[i]"; any other op with an index is not a path it knows
        if op != "array_insert":
            return "path_not_found"
        path, _, digits = path[:-1].rpartition("[")
        index = int(digits)
    elif op == "array_insert":
        return "path_not_found"
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        if not isinstance(node, dict):
            return "path_not_found"
        if part not in node:
            if op in ("upsert", "array_append", "array_prepend", "array_add_unique"):
                node[part] = {}
            else:
                return "path_not_found"
        node = node[part]
    if not isinstance(node, dict):
        return "path_not_found"
    if op == "insert":
        if last in node:
            return "path_exists"
        node[last] = value
    elif op == "upsert":
        node[last] = value
    elif op == "replace":
        if last not in node:
            return "path_not_found"
        node[last] = value
    elif op == "remove":
        if last not in node:
            return "path_not_found"
        del node[last]
    else:  # the array operations
        current = node.get(last) if op == "array_insert" else node.setdefault(last, [])
        if not isinstance(current, list):
            return "path_not_found"
        if op == "array_append":
            current.append(value)
        elif op == "array_prepend":
            current.insert(0, value)
        elif op == "array_insert":
            assert index is not None
            if index > len(current):
                return "path_not_found"
            current.insert(index, value)
        else:  # array_add_unique: primitives, once each
            if isinstance(value, (dict, list)) or any(type(v) is type(value) and v == value for v in current):
                return "path_exists"
            current.append(value)
    return None
