"""The plain values a bucket takes and returns: a document write (``Write``), a live document and the outcome
of a check-and-set (``StoredDocument``, ``Changed``), log entries read in bulk (``PackedUpdates``), and a
function's binding writes with what applying them did (``EffectGroup``, ``EffectResult``). Every
implementation of the Bucket protocol (eventing.storage.protocol) speaks them, the data service ships them
and a sandboxed worker may send them, so they live apart from the classes that make and use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

# (first, last) vBucket ranges, both ends included: the vBuckets a worker owns, as high_seqnos reads them.
Spans = tuple[tuple[int, int], ...]


class StoredDocument(NamedTuple):
    """A live document as change_document sees and leaves it."""

    key: str
    doc: bytes
    cas: int
    expiry: int
    flags: int
    vb: int
    seqno: int
    xattrs: bytes | None = None  # its extended attributes (eventing.core.xattrs), None: none


class Changed(NamedTuple):
    """One document's outcome in change_documents: its live version afterwards (None: none) and, when a
    write was logged (a delete too), that write's cas, vBucket and seqno (else 0)."""

    after: StoredDocument | None
    cas: int = 0
    vb: int = 0
    seqno: int = 0


class Write(NamedTuple):
    """One document write: an upsert (doc is msgpack bytes) or a delete (doc is None).

    A binding's advanced accessors add conditions checked when the write is applied (apply_effects):
    `cas`: the cas the document gets, reserved when a handler made the write
    (eventing.storage.writes.CasSource) so the handler can be told its document's real cas at once; None: the
    bucket gives a fresh one when it applies the write. `expect_cas` > 0: the document must still have that
    cas; 0: it must not exist (insert). `delta`: a
    counter update, `{"count": current + delta}` computed from the stored document at that moment.

    A named tuple rather than a frozen dataclass: one is made per handler write, and a frozen dataclass's
    __init__ (one object.__setattr__ a field) cost ~0.6 us of a writing handler's ~12 us.
    """

    key: str
    op: int
    doc: bytes | None = None
    expiry: int = 0
    flags: int = 0
    cas: int | None = (
        None  # the cas the write gets (a handler's write reserves it when made), else a fresh one
    )
    expect_cas: int | None = None
    delta: int | None = None
    # The document's extended attributes as they are to be after the write (eventing.core.xattrs.encode;
    # xattrs.NONE: none). None keeps those the live document has, as Couchbase's full-document writes do
    # (a set, add or replace: kv_engine copies the XATTRs into the new value); a delete drops them.
    xattrs: bytes | None = None


@dataclass(frozen=True)
class PackedUpdates:
    """Log entries ``(after_seqno, last_seqno]`` of one vBucket (contiguous seqnos) in bulk: the seqnos of
    its deletes and expirations (with their keys and operations), then its updates' keys (UTF-8, joined by NUL
    bytes) and documents (msgpack values back to back), in seqno order."""

    vb: int
    after_seqno: int
    last_seqno: int
    other_seqnos: list[int]
    update_count: int
    keys: bytes
    docs: bytes
    # The updates' arrival times (epoch ms): their least and greatest, and each one in seqno order when
    # the reader asked for them (``read_vb_packed(exact_arrivals_over_ms=...)``), else None.
    arrival_min_ms: int = 0
    arrival_max_ms: int = 0
    arrivals: list[int] | None = None
    # The deletes' and expirations' keys (joined by NUL bytes) and operations, as other_seqnos orders them;
    # None where the reader does not give them (a batch handler then reads the rows).
    other_keys: bytes = b""
    other_ops: list[int] | None = None

    @property
    def count(self) -> int:
        return self.last_seqno - self.after_seqno


@dataclass
class EffectGroup:
    """Binding writes of one function caused by one source vBucket, in source seqno order.

    A group that crossed processes (a sandbox's line, the data service) arrives with its writes packed as
    columns (``__reduce__``) and keeps them so (`columns`: the source seqnos, then each field of Write):
    applying it reads its items, seqnos and keys from the columns, and the `Write` objects of `writes`
    are made only when something reads `writes` (a conditional write, a replayed one), which drops the
    columns (the list may then change)."""

    vb: int
    epoch: int
    writes: list[tuple[int, Write]] = field(default_factory=list)  # (source seqno, write)
    conditional: bool = False  # holds writes with a cas condition or a counter delta
    # A source position the group covers even where it has no write there (a mirror's transaction that
    # changed nothing, a snapshot's end): the mark moves to at least this, with the writes (0: none).
    upto: int = 0
    # The writes as they crossed, until `writes` is read: columns of the source seqnos and of each field of
    # Write (tuples of equal lengths, at least one write). None: `writes` holds them.
    columns: tuple[tuple, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        writes = self.writes
        if type(writes) is bytes:  # unpickled (__reduce__): the writes packed as columns
            columns = _unpacked(writes)
            if columns and columns[0]:
                self.columns = columns
                del self.writes  # made from the columns when first read (__getattr__)
            else:
                self.writes = []
        elif writes and type(writes[0][1]) is tuple:  # unpickled (__reduce__): the writes as plain tuples
            self.writes = [(seqno, _as_write(write)) for seqno, write in writes]

    def __getattr__(self, name: str) -> list[tuple[int, Write]]:
        # Only `writes` of a group holding its columns is missing: its Write objects, made once.
        columns = self.__dict__.get("columns")
        if name != "writes" or columns is None:
            raise AttributeError(name)
        made = map(tuple.__new__, repeat(Write), zip(*columns[1:], strict=True))
        self.writes = list(zip(columns[0], made, strict=True))
        self.columns = None
        return self.writes

    @classmethod
    def of_columns(
        cls, vb: int, epoch: int, columns: tuple[tuple, ...], conditional: bool = False, upto: int = 0
    ) -> EffectGroup:
        """A group holding its writes as columns (`columns`, at least one write)."""
        group = cls(vb, epoch, [], conditional, upto)
        group.columns = columns
        del group.writes
        return group

    def seqnos(self) -> Sequence[int]:
        """The source seqnos of the group's writes, in order."""
        columns = self.columns
        return columns[0] if columns is not None else [seqno for seqno, _ in self.writes]

    def keys(self) -> Sequence[Any]:
        """The keys of the group's writes, in order (as sent: a key that is no str is refused where read)."""
        columns = self.columns
        return columns[1] if columns is not None else [w[0] for _, w in self.writes]

    def __reduce__(self) -> tuple:
        # A batch's effects cross processes (a sandbox's line, Ray) with the writes packed as one msgpack
        # array of columns, the source seqnos then each of a write's fields (~0.15 us a write to pack; the
        # receiver applies them from the columns, no Write made; a msgpack array a write cost ~0.35 and
        # ~0.45 us, pickled plain tuples ~0.7 and ~0.5 us): W3's writes were most of what the sandbox cost
        # (docs/benchmarks.md, "Sandboxed functions"); a value msgpack cannot carry (a key that is no UTF-8)
        # goes as plain tuples.
        try:
            columns = self.columns
            writes: bytes | list = _packb(list(columns) if columns is not None else _columns(self.writes))
        except (TypeError, ValueError, OverflowError):
            writes = [(seqno, tuple(write)) for seqno, write in self.writes]
        return (EffectGroup, (self.vb, self.epoch, writes, self.conditional, self.upto))


_WRITE_FIELDS = len(Write._fields)


def _as_write(value: tuple) -> Write:
    if len(value) != _WRITE_FIELDS:
        raise TypeError(f"a write has {_WRITE_FIELDS} fields, not {len(value)}")
    return tuple.__new__(Write, value)


def _columns(writes: list[tuple[int, Write]]) -> list:
    """``(source seqno, write)`` pairs as columns: the seqnos, then each field of the writes (C-level
    transposition, no object a write)."""
    if not writes:
        return []
    seqnos, rows = zip(*writes, strict=True)
    columns = [seqnos, *zip(*rows, strict=True)]  # ValueError: writes of unequal shapes
    if len(columns) != _WRITE_FIELDS + 1:
        raise TypeError("a write of the wrong shape")  # sent as tuples: the receiver names it
    return columns


def _packb(columns: list) -> bytes:
    import msgpack

    return msgpack.packb(columns, use_bin_type=True)


def _unpacked(packed: bytes) -> tuple[tuple, ...]:
    """The columns of packed writes (_columns): the source seqnos, then each field of Write; () for none."""
    import msgpack

    columns = msgpack.unpackb(packed, raw=False, use_list=False)
    if columns == ():
        return ()
    if (
        type(columns) is not tuple
        or len(columns) != _WRITE_FIELDS + 1
        or not all(type(c) is tuple and len(c) == len(columns[0]) for c in columns)
    ):
        raise TypeError(
            f"packed writes are not columns of source seqnos and of a write's {_WRITE_FIELDS} fields"
        )
    return columns


@dataclass
class EffectResult:
    applied: int = 0
    duplicates: int = 0  # already applied by an earlier attempt (replay after a crash)
    fenced_vbs: set[int] = field(default_factory=set)  # rejected: a newer owner holds the vBucket
    fenced_writes: int = 0
    # Sources (vb, seqno) whose cas condition failed when applied: none of their writes to this bucket
    # were applied (the caller dead-letters them as `cas_mismatch`).
    conflicts: list[tuple[int, int]] = field(default_factory=list)
