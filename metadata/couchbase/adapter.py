"""The Couchbase Python SDK (4.x) behind the `Documents` protocol: connecting, the calls, and turning the
SDK's exceptions into StoreError messages that name the thing and the fix."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from metadata.couchbase.documents import Doc
from metadata.errors import StoreError

CONNECT_FIX = "check EVENTING_METADATA_URL, credentials and that the cluster is reachable"


class SdkDocuments:
    """`Documents` on a bucket's default collection through the Couchbase Python SDK (4.x).

    The SDK is imported here, not at module import, so the package works without the optional
    dependency as long as no Couchbase URL is configured.
    """

    def __init__(self, url: str, bucket: str, username: str, password: str, timeout_s: float):
        self.where = f"{url} bucket '{bucket}'"
        try:
            from couchbase import exceptions
            from couchbase.auth import PasswordAuthenticator
            from couchbase.cluster import Cluster
            from couchbase.options import ClusterOptions, ClusterTimeoutOptions, ReplaceOptions
        except ImportError:
            raise StoreError(
                f"cannot use the Couchbase metadata store at {url}: the couchbase Python SDK is not installed; "
                "install it (pip install 'eventing[couchbase]') or unset EVENTING_METADATA_URL"
            ) from None
        self._x: Any = exceptions
        self._replace_options: Any = ReplaceOptions
        timeout = timedelta(seconds=timeout_s)
        # bootstrap_timeout bounds the whole eager connect (connect_timeout alone still waits ~10 s).
        timeouts = ClusterTimeoutOptions(bootstrap_timeout=timeout, connect_timeout=timeout, kv_timeout=timeout)
        options = ClusterOptions(PasswordAuthenticator(username, password), timeout_options=timeouts)
        self._cluster: Any = None
        try:
            self._cluster = Cluster(url, options)
            self._collection: Any = self._cluster.bucket(bucket).default_collection()
            # Fail now, not at the first write, when the bucket is missing or the user may not read it.
            self._collection.exists("eventing-connect-probe")
        except exceptions.CouchbaseException as exc:
            if self._cluster is not None:
                self._cluster.close()
            raise StoreError(
                f"cannot connect to the Couchbase metadata store at {url} (bucket '{bucket}') within "
                f"{timeout_s:g}s: {_reason(exc)}; {CONNECT_FIX}"
            ) from None

    @contextmanager
    def _guard(self, op: str, key: str) -> Iterator[None]:
        try:
            yield
        except self._x.CouchbaseException as exc:
            raise StoreError(
                f"metadata store {self.where}: {op} {key} failed: {_reason(exc)}; {CONNECT_FIX}"
            ) from None

    def _check(self, result: Any, op: str, tolerated: tuple[type, ...]) -> set[str]:
        """Keys of a multi-operation that failed with a tolerated error; any other error raises."""
        failed = set()
        for key, exc in result.exceptions.items():
            if not isinstance(exc, tolerated):
                raise StoreError(f"metadata store {self.where}: {op} {key} failed: {_reason(exc)}; {CONNECT_FIX}")
            failed.add(key)
        return failed

    def get(self, key: str) -> tuple[Doc, int] | None:
        with self._guard("get", key):
            try:
                result = self._collection.get(key)
            except self._x.DocumentNotFoundException:
                return None
            return result.content_as[dict], result.cas

    def get_many(self, keys: Sequence[str]) -> dict[str, tuple[Doc, int]]:
        if not keys:
            return {}
        with self._guard("get", f"{keys[0]} (+{len(keys) - 1})"):
            result = self._collection.get_multi(list(keys), return_exceptions=True)
        self._check(result, "get", (self._x.DocumentNotFoundException,))
        return {k: (r.content_as[dict], r.cas) for k, r in result.results.items()}

    def insert(self, key: str, value: Doc, *, expiry_s: float | None = None) -> bool:
        with self._guard("insert", key):
            try:
                if expiry_s is None:
                    self._collection.insert(key, value)
                else:
                    self._collection.insert(key, value, expiry=timedelta(seconds=expiry_s))
            except self._x.DocumentExistsException:
                return False
            return True

    def replace(self, key: str, value: Doc, cas: int) -> bool:
        with self._guard("replace", key):
            try:
                # cas as a keyword argument: options passed as `opts=` are ignored by the SDK.
                self._collection.replace(key, value, cas=cas)
            except (self._x.CasMismatchException, self._x.DocumentExistsException, self._x.DocumentNotFoundException):
                return False
            return True

    def replace_many(self, items: Mapping[str, tuple[Doc, int]]) -> set[str]:
        if not items:
            return set()
        per_key = {k: self._replace_options(cas=cas) for k, (_, cas) in items.items()}
        with self._guard("replace", f"{next(iter(items))} (+{len(items) - 1})"):
            result = self._collection.replace_multi(
                {k: v for k, (v, _) in items.items()}, per_key_options=per_key, return_exceptions=True
            )
        lost = (self._x.CasMismatchException, self._x.DocumentExistsException, self._x.DocumentNotFoundException)
        return self._check(result, "replace", lost)

    def upsert(self, key: str, value: Doc, *, expiry_s: float | None = None) -> None:
        with self._guard("upsert", key):
            if expiry_s is None:
                self._collection.upsert(key, value)
            else:
                self._collection.upsert(key, value, expiry=timedelta(seconds=expiry_s))

    def upsert_many(self, items: Mapping[str, Doc]) -> None:
        if items:
            with self._guard("upsert", f"{next(iter(items))} (+{len(items) - 1})"):
                result = self._collection.upsert_multi(dict(items), return_exceptions=True)
            self._check(result, "upsert", ())

    def remove(self, key: str, cas: int | None = None) -> bool:
        with self._guard("remove", key):
            try:
                if cas is None:
                    self._collection.remove(key)
                else:
                    self._collection.remove(key, cas=cas)
            except (self._x.CasMismatchException, self._x.DocumentExistsException, self._x.DocumentNotFoundException):
                return False
            return True

    def remove_many(self, keys: Sequence[str]) -> None:
        if keys:
            with self._guard("remove", f"{keys[0]} (+{len(keys) - 1})"):
                result = self._collection.remove_multi(list(keys), return_exceptions=True)
            self._check(result, "remove", (self._x.DocumentNotFoundException,))

    def close(self) -> None:
        self._cluster.close()


def _reason(exc: BaseException) -> str:
    """The SDK's short message ('Failed to connect') with the exception's name, on one line."""
    message = getattr(exc, "message", None) or str(exc)
    return " ".join(f"{type(exc).__name__}: {message}".split())
