"""Keyspaces (`bucket.scope.collection`, as in Couchbase 7+) and how a collection's documents are kept in
their bucket's file.

A bucket holds scopes and collections; `_default._default` always exists, so a bare bucket name is its
default collection and every name and file from before collections keeps working. The collections of a
bucket share its 1,024 vBuckets and one seqno order per vBucket (as Couchbase's do): a document of
collection `cid` is stored under the key `"\\x01<cid in hex>\\x01<key>"` (the default collection's
documents under their plain key), so the log, the effect marks and the write path stay one per bucket.
Its vBucket is the one of its own key, the hash every Couchbase client uses, whatever its collection.
No user key starts with `\\x01` (sharding.validate_key's keys are refused below it: see `check_user_key`).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from eventing.errors import ConfigError, InvalidKeyError

DEFAULT = "_default"
WILDCARD = "*"
COLLECTION_MARK = "\x01"
NUM_VBUCKETS = 1024  # sharding.NUM_VBUCKETS (kept here so this module stays import-free for the hot path)
# Couchbase's rule for scope and collection names: 1-251 of A-Z a-z 0-9 _ - %, not starting with _ or %
# (the _default names excepted).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_%-]{0,250}$")
# A bucket name may hold dots; `bucket`.scope.collection quotes it as SQL++ does.
_QUOTED = re.compile(r"^`([^`]+)`(?:\.([^.`]+)\.([^.`]+))?$")


@dataclass(frozen=True, order=True)
class Keyspace:
    """`bucket.scope.collection`. For a source or a binding, `collection` may be `*` (every collection of the
    scope), and `scope` too when `collection` is (`bucket.*.*`: every collection of the bucket), as in
    Couchbase 7.1."""

    bucket: str
    scope: str = DEFAULT
    collection: str = DEFAULT

    @classmethod
    def parse(cls, text: str, *, known_buckets: frozenset[str] | set[str] = frozenset()) -> Keyspace:
        """`bucket` (its default collection), `bucket.scope.collection`, or `` `bu.cket`.scope.collection``.
        A name that is itself a known bucket (one holding dots) stays a bucket name."""
        if not isinstance(text, str) or not text:
            raise ConfigError(f"keyspace {text!r} is not valid; give BUCKET or BUCKET.SCOPE.COLLECTION")
        quoted = _QUOTED.match(text)
        if quoted:
            bucket, scope, collection = quoted.groups()
            return cls(bucket, scope or DEFAULT, collection or DEFAULT)
        if text in known_buckets or text.count(".") != 2:
            return cls(text)
        bucket, scope, collection = text.split(".")
        return cls(bucket, scope, collection)

    @classmethod
    def of(cls, bucket: str, scope: str | None = None, collection: str | None = None) -> Keyspace:
        """From Couchbase's separate fields (`source_bucket` + `source_scope` + `source_collection`)."""
        return cls(bucket, scope or DEFAULT, collection or DEFAULT)

    @property
    def is_default(self) -> bool:
        return self.scope == DEFAULT and self.collection == DEFAULT

    @property
    def is_wildcard(self) -> bool:
        return self.collection == WILDCARD

    def covers(self, other: Keyspace) -> bool:
        """Whether `other` (a collection) is this keyspace or one of the collections its wildcards take."""
        return (
            self.bucket == other.bucket
            and self.scope in (WILDCARD, other.scope)
            and (self.collection in (WILDCARD, other.collection))
        )

    def check(self, *, wildcard: bool = False) -> Keyspace:
        """Raise ConfigError naming the bad part unless scope and collection are valid names (with
        `wildcard`, `*` for the collection, or for both)."""
        if wildcard and self.scope == WILDCARD and self.collection != WILDCARD:
            raise ConfigError(
                f"keyspace '{self}' takes every scope but one collection name; use '{self.bucket}.*.*' "
                "or name the scope"
            )
        for kind, name in (("scope", self.scope), ("collection", self.collection)):
            if name == DEFAULT or (wildcard and name == WILDCARD):
                continue
            if not isinstance(name, str) or not _NAME.match(name):
                raise ConfigError(
                    f"{kind} name {name!r} of keyspace '{self}' is not valid; use 1-251 letters, digits, "
                    "'_', '-' or '%', starting with a letter or digit"
                )
        return self

    def __str__(self) -> str:
        bucket = f"`{self.bucket}`" if "." in self.bucket and not self.is_default else self.bucket
        return bucket if self.is_default else f"{bucket}.{self.scope}.{self.collection}"

    def to_meta(self) -> dict[str, str]:
        """As a handler's `meta.keyspace` (Couchbase's field names)."""
        return {"bucket_name": self.bucket, "scope_name": self.scope, "collection_name": self.collection}


def key_prefix(cid: int) -> str:
    """What a stored key of collection `cid` starts with ("" for the default collection, id 0)."""
    return f"{COLLECTION_MARK}{cid:x}{COLLECTION_MARK}" if cid else ""


def stored_key(cid: int, key: str) -> str:
    return f"{COLLECTION_MARK}{cid:x}{COLLECTION_MARK}{key}" if cid else key


def split_stored_key(stored: str) -> tuple[int, str]:
    """(collection id, user key) of a stored key."""
    if not stored.startswith(COLLECTION_MARK):
        return 0, stored
    end = stored.index(COLLECTION_MARK, 1)
    return int(stored[1:end], 16), stored[end + 1 :]


def vbucket_of_stored(stored: str) -> int:
    """The vBucket of a stored key: the one of its user key (sharding.vbucket_of), whatever its collection."""
    if stored.startswith(COLLECTION_MARK):
        stored = stored[stored.index(COLLECTION_MARK, 1) + 1 :]
    return ((zlib.crc32(stored.encode()) >> 16) & 0x7FFF) % NUM_VBUCKETS


def check_user_key(key: str) -> None:
    """Keys starting with the collection mark would read as another collection's: refuse them."""
    if isinstance(key, str) and key.startswith(COLLECTION_MARK):
        raise InvalidKeyError(
            f"key {key[:40]!r} starts with the byte 0x01, which is reserved; use another key"
        )
