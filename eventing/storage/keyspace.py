"""One collection of a bucket (a keyspace) as a document store: keys in, keys out, stored under the
collection's key prefix in the bucket's one file set (eventing.core.keyspaces says why).

`open_keyspace(state, "shop.sales.orders")` gives a `Collection`: what the CLI's bucket commands, the
Data API and the Python API use for documents. A bare bucket name is its `_default._default` collection,
whose documents are stored under their own keys, so every bucket from before collections reads the same.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Self

from eventing.core.keyspaces import COLLECTION_MARK, DEFAULT, WILDCARD, Keyspace, check_user_key, key_prefix
from eventing.core.mutation import OP_DELETE, OP_UPDATE, decode_document, encode_document
from eventing.errors import ConfigError, MirrorWriteError, NotFoundError, fix
from eventing.storage.protocol import BucketDocuments, FileBucket
from eventing.storage.state import State, StateLike, as_state
from eventing.storage.values import StoredDocument, Write
from sharding import validate_key


def parse_keyspace(state: StateLike, text: str | Keyspace) -> Keyspace:
    """A keyspace from its text; a name that is itself a bucket (one holding dots) stays a bucket name."""
    state = as_state(state)
    if isinstance(text, Keyspace):
        return text
    return Keyspace.parse(text, known_buckets=set(state.bucket_names()) if "." in text else set())


def collection_id(bucket: BucketDocuments, keyspace: Keyspace) -> int:
    """The id of a keyspace's collection in its bucket; NotFoundError naming it and the fix if unknown."""
    if keyspace.is_default:
        return 0
    keyspace.check()
    cid = bucket.collections().get((keyspace.scope, keyspace.collection))
    if cid is None:
        scopes = {scope for scope, _ in bucket.collections()} | {DEFAULT}
        what = "collection" if keyspace.scope in scopes else "scope"
        raise NotFoundError(
            f"{what} '{keyspace.scope if what == 'scope' else keyspace.collection}' of keyspace '{keyspace}' "
            f"does not exist; create it with {{fix}} (see `eventing collection list {keyspace.bucket}`)",
            fix=fix("collection_create", keyspace=str(keyspace)),
        )
    return cid


def check_keyspace_exists(bucket: BucketDocuments, keyspace: Keyspace) -> None:
    """NotFoundError naming the fix unless the keyspace's collection (for `*`, its scope) exists."""
    if keyspace.is_wildcard:
        keyspace.check(wildcard=True)
        if keyspace.scope not in (DEFAULT, WILDCARD) and not any(
            s == keyspace.scope for s, _ in bucket.collections()
        ):
            raise NotFoundError(
                f"scope '{keyspace.scope}' of keyspace '{keyspace}' does not exist; create a collection in "
                "it with {fix}",
                fix=fix("collection_create", keyspace=f"{keyspace.bucket}.{keyspace.scope}.NAME"),
            )
        return
    collection_id(bucket, keyspace)


def open_keyspace(state: StateLike, keyspace: str | Keyspace) -> Collection:
    """Open the collection a keyspace names (its bucket must exist, and its scope and collection)."""
    state = as_state(state)
    ks = parse_keyspace(state, keyspace)
    bucket = state.open_bucket(ks.bucket)
    try:
        cid = collection_id(bucket, ks)
        return Collection(bucket, ks, cid, mirror=bucket.mirrors().get(cid) if cid else None)
    except BaseException:
        bucket.close()
        raise


def list_collections(bucket: BucketDocuments) -> list[tuple[Keyspace, int]]:
    """Every collection of a bucket, `_default._default` first, with its id."""
    found = [(Keyspace(bucket.name), 0)]
    found += sorted((Keyspace(bucket.name, s, c), cid) for (s, c), cid in bucket.collections().items())
    return found


class Collection:
    """A collection's documents: the bucket's reads and writes with user keys. Its writes are mutations of
    the bucket (the next seqno of the key's vBucket), seen by every function whose source is this keyspace."""

    def __init__(self, bucket: FileBucket, keyspace: Keyspace, cid: int, *, mirror: str | None = None):
        self.bucket = bucket
        self.keyspace = keyspace
        self.cid = cid
        self.prefix = key_prefix(cid)
        self.mirror = mirror  # what this collection mirrors (eventing.storage.mirror): its writes are refused

    def check_writable(self) -> None:
        """MirrorWriteError (one line) when the collection mirrors a table: its documents follow the table."""
        if self.mirror is not None:
            raise MirrorWriteError(
                f"keyspace '{self.keyspace}' mirrors {self.mirror}: its documents follow the table and "
                "cannot be written here; change the rows in PostgreSQL instead (reads work as usual)"
            )

    @property
    def name(self) -> str:
        return str(self.keyspace)

    def close(self) -> None:
        self.bucket.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stored(self, key: str) -> str:
        validate_key(key)
        check_user_key(key)
        return self.prefix + key

    def user_key(self, stored: str) -> str:
        return stored[len(self.prefix) :]

    # -- reads ----------------------------------------------------------------------------------------

    def get(self, key: str) -> dict | None:
        raw = self.bucket.get_raw(self.stored(key))
        return None if raw is None else decode_document(raw)

    def get_doc(self, key: str) -> tuple[bytes, int, int] | None:
        return self.bucket.get_doc(self.stored(key))

    def get_meta(self, key: str) -> dict | None:
        return self.bucket.get_meta(self.stored(key))

    def keys(self, prefix: str = "", limit: int | None = None) -> list[str]:
        return (
            [key for key, _, _ in self.scan(prefix, limit)]
            if self._shared_default(prefix)
            else [self.user_key(k) for k in self.bucket.keys(self.prefix + prefix, limit)]
        )

    def scan(self, prefix: str = "", limit: int | None = None) -> Iterator[tuple[str, dict, dict]]:
        if self._shared_default(prefix):
            # The other collections' stored keys sort first (they start with \x01): skip them.
            rows = (row for row in self.bucket.scan("", None) if not row[0].startswith(COLLECTION_MARK))
            yield from itertools.islice(rows, limit)
            return
        for key, doc, meta in self.bucket.scan(self.prefix + prefix, limit):
            yield self.user_key(key), doc, meta

    def count(self) -> int:
        if self.cid:
            return self.bucket.count(self.prefix)
        others = sum(self.bucket.count(key_prefix(cid)) for cid in self.bucket.collections().values())
        return self.bucket.count() - others

    def _shared_default(self, prefix: str) -> bool:
        """The default collection listed from the start of a bucket that has other collections."""
        return not self.cid and not prefix and bool(self.bucket.collections())

    # -- writes ---------------------------------------------------------------------------------------

    def upsert(
        self, key: str, doc: object, *, expiry: int = 0, flags: int = 0, origin: str | None = None
    ) -> tuple[int, int]:
        self.check_writable()
        placed = self.bucket.write(
            [Write(self.stored(key), OP_UPDATE, encode_document(doc), expiry, flags)], origin=origin
        )[0]
        assert placed is not None
        return placed

    def delete(self, key: str, *, origin: str | None = None) -> tuple[int, int]:
        self.check_writable()
        placed = self.bucket.write([Write(self.stored(key), OP_DELETE)], origin=origin)[0]
        if placed is None:
            raise NotFoundError(f"document '{key}' does not exist in {self.keyspace_phrase()}")
        return placed

    def load_rows(self, rows: Sequence[tuple], *, arrival_ms: int | None = None) -> int:
        """`bucket load` rows `(key, op, doc, expiry)`, or with the XATTRs as a fifth element (keys
        validated by the caller)."""
        self.check_writable()
        if self.cid:
            for key, *_ in rows:
                check_user_key(key)
            rows = [(self.prefix + row[0], *row[1:]) for row in rows]
        return self.bucket.load_rows(rows, arrival_ms=arrival_ms)

    def change(
        self, key: str, change: Callable[[StoredDocument | None], Write | None], *, origin: str | None = None
    ) -> StoredDocument | None:
        """Read-check-write one document atomically (see FileBucket.change_document); `change` gets and
        returns versions and writes with the *stored* key (use `self.stored(key)` in the Write)."""
        self.check_writable()
        return self.bucket.change_document(self.stored(key), change, origin=origin)

    def keyspace_phrase(self) -> str:
        return (
            f"bucket '{self.keyspace.bucket}'" if self.keyspace.is_default else f"keyspace '{self.keyspace}'"
        )


def _no_collection(state: State, ks: Keyspace, which: str) -> ConfigError:
    """What `collection create` / `drop` says of a name that is a bucket's, not a collection's: `shop` is the
    bucket (its default collection `which`), `shop.sales` (no bucket of that name) is no keyspace at all."""
    if "." in ks.bucket and ks.bucket not in state.bucket_names():
        return ConfigError(
            f"'{ks.bucket}' names no collection: a collection is named by three parts, "
            f"BUCKET.SCOPE.COLLECTION (for example {ks.bucket}.COLLECTION for a collection of scope "
            f"'{ks.bucket.split('.')[-1]}')"
        )
    return ConfigError(
        f"'{ks}' is bucket '{ks.bucket}', whose default collection {which}; name a collection as "
        f"BUCKET.SCOPE.COLLECTION (for example {ks.bucket}.SCOPE.COLLECTION)"
    )


def create_collection(state: StateLike, keyspace: str | Keyspace) -> int:
    state = as_state(state)
    ks = parse_keyspace(state, keyspace)
    if ks.is_default:
        raise _no_collection(state, ks, "always exists")
    ks.check()
    with state.open_bucket(ks.bucket) as bucket:
        return bucket.create_collection(ks.scope, ks.collection)


def drop_collection(state: StateLike, keyspace: str | Keyspace) -> int:
    state = as_state(state)
    ks = parse_keyspace(state, keyspace)
    if ks.is_default:
        raise _no_collection(state, ks, "cannot be dropped (drop the bucket instead)")
    with state.open_bucket(ks.bucket) as bucket:
        return bucket.drop_collection(ks.scope, ks.collection)
