"""Bucket bindings: dict-like aliases a handler uses; writes are buffered and applied exactly once."""

from __future__ import annotations

from collections.abc import Callable

from eventing.core.mutation import OP_DELETE, OP_UPDATE, decode_document, encode_document
from eventing.errors import BindingError, InvalidDocumentError
from eventing.storage.bucket import EffectGroup, LocalBucket, Write
from eventing.storage.remote import RemoteBucket
from sharding import validate_key

Tracer = Callable[[str, str, str, object], None]  # (operation, alias, key, value)


class EffectBuffer:
    """The pending writes of one bucket, shared by every alias bound to it, so two aliases of the same
    bucket see each other's writes and their writes reach the bucket in the order the handler made them."""

    def __init__(self) -> None:
        self.overlay: dict[str, bytes | None] = {}  # batch writes not flushed yet, key -> doc bytes or None
        self.current: list[Write] = []  # writes of the handler call in progress
        self.current_overlay: dict[str, bytes | None] = {}
        self.groups: dict[int, EffectGroup] = {}
        self.source: tuple[int, int] = (0, 0)
        # Per source vBucket, the last source seqno whose effects this bucket already holds (read at
        # claim). A replayed mutation at or below it had its writes applied before a crash: they are
        # dropped here, so later mutations never read a replay's second copy (read-your-writes stays true).
        self.applied_upto: dict[int, int] = {}
        self.replayed_writes = 0


class BucketBinding:
    """`alias[key]`, `alias.get(key)`, `key in alias`, and for read-write aliases `alias[key] = doc`, `del alias[key]`.

    Writes of the mutation being handled are held until the handler returns: if it raises or times
    out they are discarded, so a failed attempt leaves no partial effects. Successful writes join the
    current batch, are readable at once by later mutations (read-your-writes) and reach the bucket in
    the worker's next flush, tagged with the source (vBucket, seqno) that caused them.
    """

    def __init__(
        self, alias: str, bucket: LocalBucket | RemoteBucket, access: str, function: str, buffer: EffectBuffer | None = None
    ):
        self.alias = alias
        self.bucket = bucket
        self.access = access
        self.function = function
        self.tracer: Tracer | None = None
        self.buf = buffer if buffer is not None else EffectBuffer()

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
        if key in buf.current_overlay:
            raw = buf.current_overlay[key]
        elif key in buf.overlay:
            raw = buf.overlay[key]
        else:
            raw = self.bucket.get_raw(key)
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
        try:
            data = encode_document(doc)
        except InvalidDocumentError as exc:
            raise BindingError(f"cannot write '{key}' through binding '{self.alias}': {exc}") from None
        if self.tracer:
            self.tracer("write", self.alias, key, doc)
        self.buf.current.append(Write(key, OP_UPDATE, data))
        self.buf.current_overlay[key] = data

    def __delitem__(self, key: str) -> None:
        self._check_writable("delete")
        if self.tracer:
            self.tracer("delete", self.alias, key, None)
        self.buf.current.append(Write(key, OP_DELETE))
        self.buf.current_overlay[key] = None

    def _check_writable(self, what: str) -> None:
        if self.access != "rw":
            raise BindingError(
                f"cannot {what} through binding '{self.alias}' (bucket '{self.bucket.name}'): it is read-only; "
                "declare it with access 'rw' in the function definition"
            )

    def __repr__(self) -> str:
        return f"<binding {self.alias} -> bucket {self.bucket.name} ({self.access})>"

    # -- worker-facing ------------------------------------------------------------------------------

    # Aliases sharing a buffer each get these calls; after the first one they find nothing left to do.

    def begin(self, vb: int, seqno: int) -> None:
        buf = self.buf
        buf.source = (vb, seqno)
        buf.current = []
        buf.current_overlay = {}

    def keep(self, epoch: int) -> None:
        """The handler returned: its writes join the batch."""
        buf = self.buf
        if not buf.current:
            return
        vb, seqno = buf.source
        if seqno <= buf.applied_upto.get(vb, 0):
            buf.replayed_writes += len(buf.current)
            self.discard()
            return
        group = buf.groups.get(vb)
        if group is None:
            group = buf.groups[vb] = EffectGroup(vb, epoch)
        group.writes.extend((seqno, w) for w in buf.current)
        buf.overlay.update(buf.current_overlay)
        buf.current = []
        buf.current_overlay = {}

    def discard(self) -> None:
        self.buf.current = []
        self.buf.current_overlay = {}

    def pending(self) -> int:
        return sum(len(g.writes) for g in self.buf.groups.values())

    def take_groups(self) -> list[EffectGroup]:
        groups = list(self.buf.groups.values())
        self.buf.groups = {}
        self.buf.overlay = {}
        return groups
