"""The Couchbase Python SDK (4.x) behind the `Documents` protocol: connecting, the calls, and turning the
SDK's exceptions into StoreError messages that name the thing and the fix.

Only a connection problem (no answer, a timeout, rejected credentials, a missing bucket) carries the hint
to check the URL, credentials and reachability; an oversize document, a locked document, a document that
is not a JSON object and a URL option the SDK refuses each get their own message.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, NoReturn
from urllib.parse import parse_qs, urlsplit

from metadata.couchbase.documents import Doc
from metadata.errors import StoreCorruptError, StoreError

CONNECT_FIX = "check EVENTING_METADATA_URL, credentials and that the cluster is reachable"
CORRUPT_FIX = (
    "restore the bucket from a backup (cbbackupmgr), or remove the document and deploy its function again"
)
# Couchbase refuses values over 20 MiB (the server's item size limit).
MAX_VALUE_MIB = 20
# SDK exceptions that mean the cluster cannot be reached or will not let us in: only these get CONNECT_FIX.
CONNECTION_ERRORS = (
    "AmbiguousTimeoutException",
    "AuthenticationException",
    "BucketNotFoundException",
    "MissingConnectionException",
    "RequestCanceledException",
    "ServiceUnavailableException",
    "TemporaryFailException",
    "TimeoutException",
    "UnAmbiguousTimeoutException",
)
# ClusterOptions the SDK knows but that take Python objects, which a URL cannot carry.
OBJECT_OPTIONS = frozenset(
    {
        "authenticator",
        "meter",
        "serializer",
        "span",
        "tracer",
        "transaction_config",
        "transcoder",
        "user_agent_extra",
    }
)


def check_connection_options(url: str) -> None:
    """Reject query parameters of a Couchbase connection string that the installed SDK does not know or
    will not take. The SDK drops unknown ones silently (a typo would be ignored), and it refuses a value
    of the wrong type (`kv_timeout=2500`: durations are timedeltas) only while connecting, where the failure
    used to read as a connection problem. Each is one line naming the option and the fix."""
    from couchbase.exceptions import CouchbaseException
    from couchbase.options import ClusterOptions, get_valid_args

    try:  # the SDK's own parsing of connection-string values (ints and booleans) and its legacy names
        from couchbase.logic.cluster_settings import (
            LEGACY_CONNSTR_QUERY_ARGS,
            parse_legacy_query_options,
            parse_query_string_value,
        )
    except ImportError:  # a later SDK moved them: check the names only
        LEGACY_CONNSTR_QUERY_ARGS, parse_legacy_query_options, parse_query_string_value = {}, None, None
    known = (set(ClusterOptions.get_valid_options()) - OBJECT_OPTIONS) | set(LEGACY_CONNSTR_QUERY_ARGS)
    for name, values in parse_qs(urlsplit(url).query, keep_blank_values=True).items():
        shown = f"{name}={','.join(values)}"
        if name not in known:
            near = sorted(k for k in known if k.split("_")[0] == name.split("_")[0])[:6]
            hint = f" (similar: {', '.join(near)})" if near else ""
            raise StoreError(
                f"EVENTING_METADATA_URL option '{name}' is not a Couchbase SDK connection option{hint}; "
                "remove it or fix its name (eventing's own options: username, password, timeout, prefix)"
            )
        try:
            if name in LEGACY_CONNSTR_QUERY_ARGS and parse_legacy_query_options is not None:
                parse_legacy_query_options(**{name: values[0] if len(values) == 1 else values})
            elif parse_query_string_value is not None:
                get_valid_args(ClusterOptions, {name: parse_query_string_value(values)})
        except (CouchbaseException, ValueError, TypeError) as exc:
            fix = "give a valid value or remove it"
            if name.endswith(("_timeout", "_interval", "_floor", "_backoff")) or name.startswith(
                "tracing_threshold"
            ):
                fix = (
                    "the SDK takes durations only from code, not from a URL; remove it "
                    "(eventing's ?timeout=SECONDS sets the connect and operation timeouts)"
                )
            raise StoreError(
                f"EVENTING_METADATA_URL option {shown} is refused by the Couchbase SDK ({_message(exc)}); "
                f"{fix}"
            ) from None


class SdkDocuments:
    """`Documents` on a bucket's default collection through the Couchbase Python SDK (4.x).

    The SDK is imported here, not at module import, so the package works without the optional
    dependency as long as no Couchbase URL is configured. After close(), every operation raises
    StoreError (the SDK itself would raise a plain RuntimeError).
    """

    def __init__(self, url: str, bucket: str, username: str, password: str, timeout_s: float):
        self.where = f"{url} bucket '{bucket}'"
        self._closed = False
        try:
            from couchbase import exceptions
            from couchbase.auth import PasswordAuthenticator
            from couchbase.cluster import Cluster
            from couchbase.options import ClusterOptions, ClusterTimeoutOptions, ReplaceOptions
        except ImportError:
            raise StoreError(
                f"cannot use the Couchbase metadata store at {url}: the couchbase Python SDK is not "
                "installed; install it (pip install 'eventing[couchbase]') or unset EVENTING_METADATA_URL"
            ) from None
        self._x: Any = exceptions
        self._replace_options: Any = ReplaceOptions
        check_connection_options(url)
        timeout = timedelta(seconds=timeout_s)
        # bootstrap_timeout bounds the whole eager connect (connect_timeout alone still waits ~10 s).
        timeouts = ClusterTimeoutOptions(
            bootstrap_timeout=timeout, connect_timeout=timeout, kv_timeout=timeout
        )
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
            if not self._is_connection_error(exc):
                raise StoreError(
                    f"cannot open the Couchbase metadata store at {url} (bucket '{bucket}'): {_reason(exc)}; "
                    "check the options in EVENTING_METADATA_URL"
                ) from None
            raise StoreError(
                f"cannot connect to the Couchbase metadata store at {url} (bucket '{bucket}') within "
                f"{timeout_s:g}s: {_reason(exc)}; {CONNECT_FIX}"
            ) from None

    @classmethod
    def on_collection(cls, collection: Any, where: str = "couchbase://test bucket 'test'") -> SdkDocuments:
        """The adapter over an already opened collection (or anything with the same methods, for tests)."""
        from couchbase import exceptions
        from couchbase.options import ReplaceOptions

        docs = cls.__new__(cls)
        docs.where, docs._closed, docs._cluster, docs._collection = where, False, None, collection
        docs._x, docs._replace_options = exceptions, ReplaceOptions
        return docs

    def _is_connection_error(self, exc: BaseException) -> bool:
        return type(exc).__name__ in CONNECTION_ERRORS or any(
            isinstance(exc, cls) for name in CONNECTION_ERRORS if (cls := getattr(self._x, name, None))
        )

    def _fail(self, op: str, key: str, exc: BaseException) -> NoReturn:
        """Raise the StoreError (or StoreCorruptError) that says what went wrong with `op` on `key`."""
        x, head = self._x, f"metadata store {self.where}: {op} {key} failed"
        if isinstance(exc, x.DocumentLockedException):
            raise StoreError(
                f"{head}: the document is locked by another client (get-and-lock); eventing never locks its "
                "documents, so stop the client that does, or wait for its lock to expire (at most 30 s)"
            )
        if _too_large(exc):
            raise StoreError(
                f"{head}: the document is over Couchbase's {MAX_VALUE_MIB} MiB value limit; make it smaller "
                "(for dead letters of huge documents: `eventing dlq purge`) or keep the metadata in SQLite "
                "(unset EVENTING_METADATA_URL)"
            )
        if isinstance(exc, (x.ValueFormatException, x.DocumentNotJsonException)):
            raise StoreCorruptError(f"{head}: the document is not JSON ({_reason(exc)}); {CORRUPT_FIX}")
        if isinstance(exc, RuntimeError):  # the SDK's own "no connection" errors are plain RuntimeErrors
            raise StoreError(f"{head}: {exc}; open the metadata store again")
        if self._is_connection_error(exc):
            raise StoreError(f"{head}: {_reason(exc)}; {CONNECT_FIX}")
        raise StoreError(f"{head}: {_reason(exc)}")

    @contextmanager
    def _guard(self, op: str, key: str) -> Iterator[None]:
        if self._closed:
            raise StoreError(
                f"metadata store {self.where} is closed; {op} {key} needs an open store (open it again)"
            )
        try:
            yield
        except (self._x.CouchbaseException, RuntimeError) as exc:
            self._fail(op, key, exc)

    def _check(self, result: Any, op: str, tolerated: tuple[type, ...]) -> set[str]:
        """Keys of a multi-operation that failed with a tolerated error; any other error raises."""
        failed = set()
        for key, exc in result.exceptions.items():
            if not isinstance(exc, tolerated):
                self._fail(op, key, exc)
            failed.add(key)
        return failed

    def _object(self, key: str, result: Any) -> tuple[Doc, int]:
        """The document as a dict with its CAS; a value under the prefix that is not a JSON object is
        corruption (a list or a string would otherwise fail later, far from its cause)."""
        try:
            value = result.value
        except (self._x.CouchbaseException, ValueError) as exc:
            raise StoreCorruptError(
                f"metadata store {self.where}: document {key} cannot be decoded ({_reason(exc)}); "
                f"{CORRUPT_FIX}"
            ) from None
        if not isinstance(value, dict):
            raise StoreCorruptError(
                f"metadata store {self.where}: document {key} is not a JSON object "
                f"(a {type(value).__name__}); {CORRUPT_FIX}"
            )
        return value, result.cas

    def get(self, key: str) -> tuple[Doc, int] | None:
        with self._guard("get", key):
            try:
                result = self._collection.get(key)
            except self._x.DocumentNotFoundException:
                return None
        return self._object(key, result)

    def get_many(self, keys: Sequence[str]) -> dict[str, tuple[Doc, int]]:
        if not keys:
            return {}
        with self._guard("get", f"{keys[0]} (+{len(keys) - 1})"):
            result = self._collection.get_multi(list(keys), return_exceptions=True)
        self._check(result, "get", (self._x.DocumentNotFoundException,))
        return {k: self._object(k, r) for k, r in result.results.items()}

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
            except (
                self._x.CasMismatchException,
                self._x.DocumentExistsException,
                self._x.DocumentNotFoundException,
            ):
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
        lost = (
            self._x.CasMismatchException,
            self._x.DocumentExistsException,
            self._x.DocumentNotFoundException,
        )
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
            except (
                self._x.CasMismatchException,
                self._x.DocumentExistsException,
                self._x.DocumentNotFoundException,
            ):
                return False
            return True

    def remove_many(self, keys: Sequence[str]) -> None:
        if keys:
            with self._guard("remove", f"{keys[0]} (+{len(keys) - 1})"):
                result = self._collection.remove_multi(list(keys), return_exceptions=True)
            self._check(result, "remove", (self._x.DocumentNotFoundException,))

    def close(self) -> None:
        if not self._closed and self._cluster is not None:
            self._cluster.close()
        self._closed = True


def _too_large(exc: BaseException) -> bool:
    """The server's "value too large" has no exception class of its own in SDK 4.x (error code 104)."""
    message = (_message(exc) or "").lower()
    return "too large" in message or "too_large" in message or getattr(exc, "error_code", None) == 104


def _message(exc: BaseException) -> str:
    try:
        return getattr(exc, "message", None) or str(exc)
    except Exception:  # an SDK exception without its native part cannot always describe itself
        return type(exc).__name__


def _reason(exc: BaseException) -> str:
    """The SDK's short message ('Failed to connect') with the exception's name, on one line."""
    message = _message(exc)
    return " ".join(f"{type(exc).__name__}: {message}".split())
