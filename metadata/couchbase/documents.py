"""The key-value operations the Couchbase store needs, as a protocol: the SDK adapter implements them on a
real bucket, tests implement them in memory with the same CAS rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

Doc = dict[str, Any]


class Documents(Protocol):
    """The key-value operations the store needs. CAS values are opaque; a failed CAS check returns False."""

    where: str  # "couchbase://host bucket 'meta'", for messages

    def get(self, key: str) -> tuple[Doc, int] | None: ...
    def get_many(self, keys: Sequence[str]) -> dict[str, tuple[Doc, int]]: ...  # missing keys left out
    def insert(self, key: str, value: Doc, *, expiry_s: float | None = None) -> bool: ...  # False: exists
    def replace(self, key: str, value: Doc, cas: int) -> bool: ...  # False: changed or gone since `cas`
    def replace_many(self, items: Mapping[str, tuple[Doc, int]]) -> set[str]: ...  # keys whose CAS failed
    def upsert(self, key: str, value: Doc, *, expiry_s: float | None = None) -> None: ...
    def upsert_many(self, items: Mapping[str, Doc]) -> None: ...
    def remove(self, key: str, cas: int | None = None) -> bool: ...  # False: gone, or changed since `cas`
    def remove_many(self, keys: Sequence[str]) -> None: ...  # missing keys are fine
    def close(self) -> None: ...
