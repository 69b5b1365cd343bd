"""Bindings over several collections (`bucket.scope.*`, `bucket.*.*`), as Couchbase 7.1 has them: the alias
names no one collection, so its documents are reached only through the advanced accessors with the
document's keyspace (`couchbase.get(alias, {"id": k, "keyspace": {...}})`, or `couchbase.get(alias, meta)`
with the meta a handler was given); a bucket-map access (`alias[k]`) is an error, as in Couchbase. In Python,
`alias.in_keyspace(meta.keyspace)` is the binding of that collection.

Each collection reached is a BucketBinding of its own over the same effect buffer, so its writes join the
batch of the mutation in progress like any other binding's and apply exactly once.
"""

from __future__ import annotations

import time
from typing import Any

from eventing.core.keyspaces import DEFAULT, Keyspace, key_prefix
from eventing.errors import BindingError, fix
from eventing.execution.bindings import BucketBinding, EffectBuffer
from eventing.storage.protocol import BindingBucket

# The bucket's collections are read again at least this often (and whenever a keyspace is not known), so a
# collection dropped while the function runs is found gone within that time.
REGISTRY_TTL_S = 1.0


class WildcardBinding(BucketBinding):
    """A binding whose keyspace holds a `*`: the worker-facing calls (begin, keep, take_groups, ...) act on
    the shared buffer as for any binding; the handler reaches a collection through in_keyspace()."""

    def __init__(
        self,
        alias: str,
        bucket: BindingBucket,
        access: str,
        function: str,
        buffer: EffectBuffer | None,
        keyspace: Keyspace,
    ):
        super().__init__(alias, bucket, access, function, buffer)
        self.keyspace = keyspace
        self._ids: dict[tuple[str, str], int] = {}
        self._read_at = -REGISTRY_TTL_S
        self._members: dict[int, BucketBinding] = {}
        self._mirrors: dict[int, str] = {}

    def in_keyspace(self, keyspace: Any) -> BucketBinding:
        """The binding of one collection this binding covers; `keyspace` as a meta gives it
        (`{"bucket_name", "scope_name", "collection_name"}`) or a Keyspace. BindingError when it is not
        given, not covered, or does not exist."""
        ks = _keyspace_of(keyspace, self.alias, self.keyspace)
        if not self.keyspace.covers(ks):
            raise BindingError(
                f"keyspace '{ks}' is not in binding '{self.alias}' ('{self.keyspace}'); pass the keyspace of "
                "a collection the binding covers"
            )
        cid = 0 if ks.is_default else self._collection_id(ks)
        member = self._members.get(cid)
        if member is None:
            member = self._members[cid] = BucketBinding(
                self.alias,
                self.bucket,
                self.access,
                self.function,
                self.buf,
                key_prefix(cid),
                self._mirrors.get(cid),  # a mirror's collection refuses this binding's writes
            )
        member.tracer = self.tracer
        return member

    def _collection_id(self, ks: Keyspace) -> int:
        now = time.monotonic()
        if now - self._read_at > REGISTRY_TTL_S or (ks.scope, ks.collection) not in self._ids:
            self._ids = dict(self.bucket.collections())
            # Read after the ids: a collection is a mirror from its creation on (ids are never reused), so
            # every id just read has its mirror here.
            self._mirrors = self.bucket.mirrors() if self.access == "rw" else {}
            self._read_at = now
        cid = self._ids.get((ks.scope, ks.collection))
        if cid is None:
            raise BindingError(
                f"collection '{ks}' of binding '{self.alias}' does not exist; create it with {{fix}}",
                fix=fix("collection_create", keyspace=str(ks)),
            )
        return cid

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise BindingError(
            f"binding '{self.alias}' is over '{self.keyspace}', several collections: name the document's "
            "keyspace, with couchbase.get/insert/upsert/...(alias, {id, keyspace}) (or the handler's meta) "
            "in JavaScript, alias.in_keyspace(meta.keyspace) in Python"
        )

    # A bucket-map access or an accessor without a keyspace names no collection.
    _lookup = _visible = _append = _refuse

    def __setitem__(self, key: str, doc: dict) -> None:
        self._refuse()

    def __delitem__(self, key: str) -> None:
        self._refuse()

    def __repr__(self) -> str:
        return f"<binding {self.alias} -> keyspace {self.keyspace} ({self.access})>"


def _keyspace_of(value: Any, alias: str, bound: Keyspace) -> Keyspace:
    if isinstance(value, Keyspace):
        return value
    if isinstance(value, dict) and isinstance(value.get("collection_name", DEFAULT), str):
        return Keyspace(
            str(value.get("bucket_name", bound.bucket)),
            str(value.get("scope_name") or DEFAULT),
            str(value.get("collection_name") or DEFAULT),
        )
    raise BindingError(
        f"binding '{alias}' is over '{bound}', several collections: give the document's keyspace as "
        '{"bucket_name": ..., "scope_name": ..., "collection_name": ...}'
    )
