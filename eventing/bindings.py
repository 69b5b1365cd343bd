"""Bucket bindings: dict-like aliases a handler uses; writes are buffered and applied exactly once."""

from __future__ import annotations

from collections.abc import Callable

from eventing.bucket import EffectGroup, LocalBucket, Write
from eventing.errors import BindingError, InvalidDocumentError
from eventing.mutation import OP_DELETE, OP_UPDATE, decode_document, encode_document
from sharding import validate_key

Tracer = Callable[[str, str, str, object], None]  # (operation, alias, key, value)


class BucketBinding:
    """`alias[key]`, `alias.get(key)`, `key in alias`, and for read-write aliases `alias[key] = doc`, `del alias[key]`.

    Writes of the mutation being handled are held until the handler returns: if it raises or times
    out they are discarded, so a failed attempt leaves no partial effects. Successful writes join the
    current batch, are readable at once by later mutations (read-your-writes) and reach the bucket in
    the worker's next flush, tagged with the source (vBucket, seqno) that caused them.
    """

    def __init__(self, alias: str, bucket: LocalBucket, access: str, function: str):
        self.alias = alias
        self.bucket = bucket
        self.access = access
        self.function = function
        self.tracer: Tracer | None = None
        self._overlay: dict[str, bytes | None] = {}  # flushed-pending state, key -> doc bytes or None
        self._current: list[Write] = []
        self._current_overlay: dict[str, bytes | None] = {}
        self._groups: dict[int, EffectGroup] = {}
        self._source: tuple[int, int] = (0, 0)
        # Per source vBucket, the last source seqno whose effects this bucket already holds (read at
        # claim). A replayed mutation at or below it had its writes applied before a crash: they are
        # dropped here, so later mutations never read a replay's second copy (read-your-writes stays true).
        self.applied_upto: dict[int, int] = {}
        self.replayed_writes = 0

    # -- handler-facing ---------------------------------------------------------------------------

    def _lookup(self, key: str) -> dict | None:
        if key in self._current_overlay:
            raw = self._current_overlay[key]
        elif key in self._overlay:
            raw = self._overlay[key]
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
        self._current.append(Write(key, OP_UPDATE, data))
        self._current_overlay[key] = data

    def __delitem__(self, key: str) -> None:
        self._check_writable("delete")
        if self.tracer:
            self.tracer("delete", self.alias, key, None)
        self._current.append(Write(key, OP_DELETE))
        self._current_overlay[key] = None

    def _check_writable(self, what: str) -> None:
        if self.access != "rw":
            raise BindingError(
                f"cannot {what} through binding '{self.alias}' (bucket '{self.bucket.name}'): it is read-only; "
                "declare it with access 'rw' in the function definition"
            )

    def __repr__(self) -> str:
        return f"<binding {self.alias} -> bucket {self.bucket.name} ({self.access})>"

    # -- worker-facing ------------------------------------------------------------------------------

    def begin(self, vb: int, seqno: int) -> None:
        self._source = (vb, seqno)
        self._current = []
        self._current_overlay = {}

    def keep(self, epoch: int) -> None:
        """The handler returned: its writes join the batch."""
        if not self._current:
            return
        vb, seqno = self._source
        if seqno <= self.applied_upto.get(vb, 0):
            self.replayed_writes += len(self._current)
            self.discard()
            return
        group = self._groups.get(vb)
        if group is None:
            group = self._groups[vb] = EffectGroup(vb, epoch)
        group.writes.extend((seqno, w) for w in self._current)
        self._overlay.update(self._current_overlay)
        self._current = []
        self._current_overlay = {}

    def discard(self) -> None:
        self._current = []
        self._current_overlay = {}

    def pending(self) -> int:
        return sum(len(g.writes) for g in self._groups.values())

    def take_groups(self) -> list[EffectGroup]:
        groups = list(self._groups.values())
        self._groups = {}
        self._overlay = {}
        return groups
