"""The shared document access every part of the Couchbase store is given (``CasDocuments``): keys, reads that
report corruption, and the CAS loops that make each read-modify-write of one document atomic."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from metadata.couchbase.documents import Doc, Documents
from metadata.errors import StoreCorruptError, StoreError
from sharding import NUM_VBUCKETS

T = TypeVar("T")

# A CAS loop gives up after this many lost races (with backoff up to 50 ms: ~10 s of contention).
MAX_CAS_ATTEMPTS = 200


class CasDocuments:
    """The documents under one key prefix, read and changed through CAS loops. ``raw`` is the key-value
    operations themselves (metadata.couchbase.documents), for the writes that need no loop."""

    def __init__(self, documents: Documents, prefix: str):
        self.raw = documents
        self.prefix = prefix
        self.where = documents.where

    def corrupt(self, key: str, what: str) -> StoreCorruptError:
        return StoreCorruptError(
            f"metadata store {self.where}: document {key} {what}; restore the bucket from a backup "
            f"(cbbackupmgr), or remove the documents under prefix '{self.prefix}::' and deploy the functions "
            "again"
        )

    def get(self, key: str) -> tuple[Doc, int] | None:
        """`Documents.get`, with a value that is not a JSON object reported as corruption."""
        got = self.raw.get(key)
        if got is not None and not isinstance(got[0], dict):
            raise self.corrupt(key, f"is not a JSON object (a {type(got[0]).__name__})")
        return got

    def get_many(self, keys: Sequence[str]) -> dict[str, tuple[Doc, int]]:
        found = self.raw.get_many(keys)
        for key, (value, _) in found.items():
            if not isinstance(value, dict):
                raise self.corrupt(key, f"is not a JSON object (a {type(value).__name__})")
        return found

    def decode(self, key: str, decode: Callable[..., T], *args: Any) -> T:
        """Turn a stored document into a value; missing or mistyped fields are corruption, not a crash."""
        try:
            return decode(*args)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self.corrupt(key, f"lacks a valid field ({type(exc).__name__}: {exc})") from None

    # -- keys and CAS loops ---------------------------------------------------------------------------

    def key(self, *parts: object) -> str:
        return "::".join([self.prefix, *(str(p) for p in parts)])

    def cp_key(self, function: str, vb: int) -> str:
        return self.key("cp", function, vb)

    def cp_keys(self, function: str) -> dict[int, str]:
        return {vb: self.cp_key(function, vb) for vb in range(NUM_VBUCKETS)}

    def mutate(
        self,
        key: str,
        change: Callable[[Doc | None], Doc | None],
        *,
        expiry_s: float | None = None,
    ) -> Doc | None:
        """Read-check-write `key` until the write wins its CAS check; returns what was written.

        `change` gets a copy of the current document (None if absent) and returns the new one, or None
        to write nothing; it may raise, and it may be called again after a lost race, so it must only
        decide from its argument.
        """
        for attempt in range(MAX_CAS_ATTEMPTS):
            got = self.get(key)
            new = change(copy.deepcopy(got[0]) if got else None)
            if new is None:
                return None
            if got is None:
                if self.raw.insert(key, new, expiry_s=expiry_s):
                    return new
            elif self.raw.replace(key, new, got[1]):
                return new
            if attempt >= 3:
                time.sleep(min(0.001 * 2**attempt, 0.05))
        raise StoreError(
            f"metadata store {self.where}: document {key} kept changing under concurrent writers "
            f"({MAX_CAS_ATTEMPTS} attempts); check for a runaway process writing to it"
        )

    def mutate_many(self, changes: Mapping[str, Callable[[Doc | None], Doc | None]]) -> dict[str, Doc | None]:
        """`mutate` for many documents: one multi-get and one multi-replace, then each lost race alone."""
        current = self.get_many(list(changes))
        out: dict[str, Doc | None] = {}
        batch: dict[str, tuple[Doc, int]] = {}
        for key, change in changes.items():
            got = current.get(key)
            if got is None:
                out[key] = self.mutate(key, change)
                continue
            new = change(copy.deepcopy(got[0]))
            out[key] = new
            if new is not None:
                batch[key] = (new, got[1])
        for key in self.raw.replace_many(batch) if batch else set():
            out[key] = self.mutate(key, changes[key])
        return out

    def index_add(self, key: str, field: str, values: Iterable[Any]) -> None:
        wanted = list(values)

        def change(doc: Doc | None) -> Doc | None:
            doc = doc or {field: []}
            missing = [v for v in wanted if v not in doc[field]]
            if not missing:
                return None
            doc[field] = sorted(doc[field] + missing)
            return doc

        self.mutate(key, change)

    def index_remove(self, key: str, field: str, values: Iterable[Any]) -> None:
        unwanted = set(values)

        def change(doc: Doc | None) -> Doc | None:
            if doc is None or not unwanted & set(doc[field]):
                return None
            doc[field] = [v for v in doc[field] if v not in unwanted]
            return doc

        self.mutate(key, change)
