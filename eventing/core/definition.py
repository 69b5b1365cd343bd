"""Function definitions: what a user declares about a handler, validated, with JSON import and export."""

from __future__ import annotations

import json
import keyword
import os
import re
import urllib.parse
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from eventing.core import durations, filters
from eventing.core.function_names import check_function_name
from eventing.core.keyspaces import DEFAULT, Keyspace
from eventing.core.names import check_bucket_name
from eventing.core.retry import RetryConfigError, RetryPolicy, legacy_policy, parse_retry, policy_of
from eventing.errors import ConfigError
from eventing.handler import RESERVED_NAMES

FUNCTION_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,99}$")  # a plain name (eventing.core.function_names)
ALIAS = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Boundary = Literal["everything", "from_now"]
Access = Literal["r", "rw"]
Placement = Literal["spread", "packed"]
Delivery = Literal["exactly_once", "at_least_once"]
PLACEMENTS = ("spread", "packed")
DELIVERIES = ("exactly_once", "at_least_once")
ISOLATIONS = ("none", "sandbox")  # the first is DEFAULT_ADMIN_ISOLATION, named as the default in errors
# What a function deployed by a full admin gets without an `isolation` setting, unless the machine's
# EVENTING_DEFAULT_ISOLATION says sandbox (eventing.workers.sandbox.default). Its throughput is within 5% on
# W1 and W3, but as everyone's default it was measured to break goals met unconfined: 20 functions take
# 3.2 GB of RSS (a child per worker) against the 2 GB goal, a write's median way to its effect is 30x
# longer, JavaScript concurrency and cluster mode fall below 0.8 (docs/benchmarks.md, "The sandbox as
# every function's default: switched, measured, not kept").
DEFAULT_ADMIN_ISOLATION = "none"


def parse_duration(value: Any, field_name: str, function: str) -> timedelta:
    """eventing.core.durations.parse_duration (the rule window sizes follow too), as a ConfigError."""
    try:
        return durations.parse_duration(value, field=field_name)
    except durations.DurationError as exc:
        raise ConfigError(f"function '{function}' {exc}") from None


@dataclass(frozen=True)
class Binding:
    """A bucket alias visible to the handler as a global, used like a dict."""

    alias: str
    bucket: str
    access: Access = "r"
    scope: str = DEFAULT  # with bucket and collection, the keyspace it binds (Couchbase's field names)
    collection: str = DEFAULT

    @property
    def keyspace(self) -> Keyspace:
        return Keyspace(self.bucket, self.scope, self.collection)


LANGUAGES = ("python", "javascript")
MAX_CONCURRENCY = 64  # handler calls in flight per worker (threads of its pool)


@dataclass(frozen=True)
class FunctionDefinition:
    name: str
    source_bucket: str
    # With source_bucket, the keyspace whose mutations the function handles (Couchbase's field names);
    # source_collection "*" takes every collection of the scope, and source_scope "*" with it every
    # collection of the bucket (Couchbase 7.1).
    source_scope: str = DEFAULT
    source_collection: str = DEFAULT
    handler: str = ""  # where the handler came from (file path or module), for humans
    bindings: tuple[Binding, ...] = ()
    constants: dict[str, Any] = field(default_factory=dict)  # constant bindings: alias -> JSON value
    worker_count: int = 1
    boundary: Boundary = "everything"
    checkpoint_interval: timedelta = timedelta(seconds=1)
    execution_timeout: timedelta = timedelta(seconds=60)
    batch_size: int = (
        1000  # mutations a worker handles before flushing their effects; a step takes one or more
    )
    # Handler calls a worker runs at once, each for a different document (one document's mutations still run
    # one after another, in seqno order); for handlers that wait on I/O. 1 runs them one at a time.
    concurrency: int = 1
    retries: int = 0  # extra attempts after a handler error before the mutation goes to the DLQ
    retry_backoff: timedelta = timedelta(milliseconds=100)  # doubles after each attempt
    # The retry policy (eventing.core.retry): max_attempts, initial_backoff, max_backoff, multiplier,
    # max_event_age, non_retryable; None: the policy retries and retry_backoff give.
    retry: dict[str, Any] | None = None
    max_document_bytes: int = 1024 * 1024  # larger documents go to the DLQ as `oversize`
    description: str = ""
    app_log_max_size: int = 40 * 1024 * 1024  # bytes of <data-dir>/logs/<function>.log before it rotates
    app_log_max_files: int = 10  # application log files kept (the current one and rotated ones)
    # curl targets: alias, url, auth none|basic|bearer, verify_tls; out of repr, which would show passwords
    url_bindings: tuple[dict[str, Any], ...] = field(default=(), repr=False)
    curl_max_response_bytes: int = 1024 * 1024  # a larger curl response is an error the handler sees
    previous_version: bool = False  # on_update's meta.previous holds the document's previous version
    timer_context_size: int = 1024  # bytes of a timer's context as JSON; larger is an error the handler sees
    window: dict[str, Any] | None = None  # event-time aggregation, see eventing.windows.semantics
    # spread: every eventing node runs the function's workers (Couchbase); packed: one node runs them all,
    # at most 4 running functions a node (Atlas; sharding.placement).
    placement: Placement = "spread"
    # exactly_once: effects are marked by (function, vBucket, seqno) so a replay never applies one twice;
    # at_least_once: no marks (cheaper writes), so a replay after a crash may apply an effect again.
    delivery: Delivery = "exactly_once"
    # The handler's language: python, or javascript (Couchbase's OnUpdate/OnDelete on V8, see
    # docs/javascript-handlers.md); a definition whose handler file ends in .js is javascript.
    language: str = "python"
    js_heap_limit_mb: int = 128  # a JavaScript handler's V8 heap; a call that passes it is stopped
    # Mutations that do not match are checkpointed without calling the handler (eventing.core.filters).
    filter: dict[str, Any] | None = None
    # sandbox: the worker runs in a process that cannot open the data directory (metadata store, bucket
    # files) and reaches only its own bindings through a scoped data service; none: the worker opens the
    # files. "" is the default: sandbox for a function a non-admin deployed, DEFAULT_ADMIN_ISOLATION else.
    isolation: str = ""
    # Folders (or files) outside its own where a sandboxed handler may write (a call log, an export), set by
    # a full admin only: Landlock opens them to the sandbox's writes. Absolute paths that exist; never the
    # data directory or one that holds it. Nothing for a function that runs with isolation none.
    sandbox_writable: tuple[str, ...] = ()
    # Couchbase's metadata keyspace (depcfg.metadata_*) of a function imported from Couchbase, as
    # BUCKET.SCOPE.COLLECTION: not used here (checkpoints and timers live in the metadata store), kept so an
    # export gives Couchbase back the keyspace it had. "" for a function made here.
    metadata_keyspace: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FunctionDefinition:
        if not isinstance(data, dict):
            raise ConfigError("a function definition must be a JSON object")
        known = set(cls.__dataclass_fields__) | {"handler_source"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown field(s) {', '.join(unknown)} in the definition of function "
                f"'{data.get('name', '?')}'; known fields: {', '.join(sorted(cls.__dataclass_fields__))}"
            )
        for required in ("name", "source_bucket"):
            if not data.get(required):
                raise ConfigError(f"function definition needs '{required}'")
        name = data["name"]
        check_function_name(name)
        check_bucket_name(data["source_bucket"])
        for key in ("source_scope", "source_collection"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise ConfigError(f"{key} of function '{name}' must be a name, not {data[key]!r}")
        source = Keyspace.of(data["source_bucket"], data.get("source_scope"), data.get("source_collection"))
        source.check(wildcard=True)  # `*.*` or `scope.*` (Couchbase 7.1); `*.collection` is refused
        bindings = []
        for raw in data.get("bindings", []):
            if isinstance(raw, str):  # "alias=bucket:rw"
                alias, _, rest = raw.partition("=")
                bucket, _, access = rest.partition(":")
                raw = {"alias": alias, "bucket": bucket, "access": access or "r"}
            if isinstance(raw, dict) and isinstance(raw.get("bucket"), str) and "scope" not in raw:
                named = Keyspace.parse(
                    raw["bucket"]
                )  # "alias=bucket.scope.collection:rw" or a keyspace as bucket
                raw = {**raw, "bucket": named.bucket, "scope": named.scope, "collection": named.collection}
            if not isinstance(raw, dict):
                raise ConfigError(
                    f"a binding of function '{name}' must be an object with alias, bucket and access"
                )
            b = Binding(
                raw.get("alias", ""),
                raw.get("bucket", ""),
                raw.get("access", "r"),
                raw.get("scope") or DEFAULT,
                raw.get("collection") or DEFAULT,
            )
            _check_alias("binding alias", b.alias, name)
            check_bucket_name(b.bucket)
            b.keyspace.check(wildcard=True)  # a wildcard binding: couchbase.* accessors with meta.keyspace
            if b.access not in ("r", "rw"):
                raise ConfigError(
                    f"binding '{b.alias}' of function '{name}' has access {b.access!r}; use 'r' or 'rw'"
                )
            bindings.append(b)
        url_bindings = parse_url_bindings(data.get("url_bindings", []), name)
        for u in url_bindings:
            _check_alias("url binding", u["alias"], name)
        aliases = [b.alias for b in bindings] + [u["alias"] for u in url_bindings]
        for alias in aliases:
            if aliases.count(alias) > 1:
                raise ConfigError(
                    f"function '{name}' binds the alias '{alias}' to two buckets or URLs; give each binding "
                    "its own alias"
                )
        constants = data.get("constants", {})
        if not isinstance(constants, dict):
            raise ConfigError(f"constants of function '{name}' must be a JSON object of name: value")
        for constant in constants:
            _check_alias("constant", constant, name)
            if constant in aliases:
                raise ConfigError(
                    f"constant '{constant}' of function '{name}' has the same name as the binding alias "
                    f"'{constant}'; rename the constant or the binding"
                )
        kwargs = dict(data)
        kwargs.pop("handler_source", None)
        kwargs["source_scope"], kwargs["source_collection"] = source.scope, source.collection
        kwargs["bindings"] = tuple(bindings)
        kwargs["url_bindings"] = url_bindings
        for key in ("checkpoint_interval", "execution_timeout", "retry_backoff"):
            if key in kwargs:
                kwargs[key] = parse_duration(kwargs[key], key, name)
        for key, low in (
            ("worker_count", 1),
            ("batch_size", 1),
            ("retries", 0),
            ("max_document_bytes", 1),
            ("timer_context_size", 1),
            ("app_log_max_size", 1),
            ("app_log_max_files", 1),
            ("curl_max_response_bytes", 1),
            ("js_heap_limit_mb", 16),
        ):
            value = kwargs.get(key, low)
            if isinstance(value, bool):  # True is an int to Python, not a count to anyone
                raise ConfigError(
                    f"{key} of function '{name}' is {json.dumps(value)}, a boolean; give a number >= {low}, "
                    f'for example "{key}": {max(low, 2) if key == "worker_count" else low}'
                )
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"{key} of function '{name}' must be an integer >= {low}, not {value!r}")
        if kwargs.get("worker_count", 1) > 64:
            raise ConfigError(
                f"worker_count of function '{name}' is {kwargs['worker_count']}; the maximum is 64"
            )
        concurrency = kwargs.get("concurrency", 1)
        if (
            isinstance(concurrency, bool)
            or not isinstance(concurrency, int)
            or not 1 <= concurrency <= MAX_CONCURRENCY
        ):
            raise ConfigError(
                f"concurrency of function '{name}' is {concurrency!r}; give an integer from 1 to "
                f"{MAX_CONCURRENCY} (handler calls a worker runs at once, for different documents)"
            )
        for key in ("window", "previous_version"):
            if concurrency > 1 and kwargs.get(key):
                raise ConfigError(
                    f"concurrency of function '{name}' is {concurrency}, which {key} does not take (it "
                    "follows the log one mutation at a time): use concurrency 1, or raise worker_count "
                    "instead"
                )
        if not isinstance(kwargs.get("previous_version", False), bool):
            raise ConfigError(f"previous_version of function '{name}' must be true or false")
        if kwargs.get("language", "python") not in LANGUAGES:
            raise ConfigError(
                f"language of function '{name}' is {kwargs['language']!r}; use one of "
                f"{', '.join(map(repr, LANGUAGES))}"
            )
        if kwargs.get("boundary", "everything") not in ("everything", "from_now"):
            raise ConfigError(f"boundary of function '{name}' must be 'everything' or 'from_now'")
        for key, allowed in (("placement", PLACEMENTS), ("delivery", DELIVERIES), ("isolation", ISOLATIONS)):
            if key in kwargs and kwargs[key] not in allowed:
                raise ConfigError(
                    f"{key} of function '{name}' is {kwargs[key]!r}; use one of "
                    f"{', '.join(map(repr, allowed))} (default {allowed[0]!r})"
                )
        if "sandbox_writable" in kwargs:
            kwargs["sandbox_writable"] = _writable_paths(name, kwargs["sandbox_writable"])
        if kwargs.get("filter") is not None:
            try:
                filters.check_filter(kwargs["filter"])
            except filters.FilterError as exc:
                raise ConfigError(f"function '{name}': {exc}") from None
        if kwargs.get("retry") is not None:
            if kwargs.get("retries", 0) != 0 or kwargs.get(
                "retry_backoff", timedelta(milliseconds=100)
            ) != timedelta(milliseconds=100):
                raise ConfigError(
                    f"function '{name}' sets both retry and retries/retry_backoff; give the policy in retry "
                    "alone "
                    '(retries N is "max_attempts": N + 1, retry_backoff is "initial_backoff")'
                )
            try:
                kwargs["retry"] = parse_retry(kwargs["retry"])
            except RetryConfigError as exc:
                raise ConfigError(f"function '{name}': {exc}") from None
        if kwargs.get("execution_timeout", timedelta(seconds=1)).total_seconds() <= 0:
            raise ConfigError(f"execution_timeout of function '{name}' must be positive")
        return cls(**kwargs)

    @property
    def retry_policy(self) -> RetryPolicy:
        """How a failed handler call is retried: the `retry` object, else retries and retry_backoff."""
        if self.retry is None:
            return legacy_policy(self.retries, self.retry_backoff)
        return policy_of(self.retry)

    @property
    def source_keyspace(self) -> Keyspace:
        return Keyspace(self.source_bucket, self.source_scope, self.source_collection)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        # A default collection is left out, so definitions from before collections read as they were.
        if self.source_keyspace.is_default:
            del out["source_scope"], out["source_collection"]
        if self.language == "python":  # Python definitions read as they did before JavaScript handlers
            del out["language"], out["js_heap_limit_mb"]
        out["bindings"] = [
            asdict(b)
            if not b.keyspace.is_default
            else {"alias": b.alias, "bucket": b.bucket, "access": b.access}
            for b in self.bindings
        ]
        out["url_bindings"] = [dict(u) for u in self.url_bindings]
        for key in ("checkpoint_interval", "execution_timeout", "retry_backoff"):
            out[key] = durations.format_duration(getattr(self, key))
        if out["window"] is None:
            del out["window"]
        if out["retry"] is None:  # definitions without a policy read as they did before it
            del out["retry"]
        else:  # the policy says it all
            del out["retries"], out["retry_backoff"]
        if out["filter"] is None:
            del out["filter"]
        if not self.isolation:  # the default reads as definitions did before the setting
            del out["isolation"]
        if self.sandbox_writable:
            out["sandbox_writable"] = list(self.sandbox_writable)
        else:
            del out["sandbox_writable"]
        if not self.metadata_keyspace:
            del out["metadata_keyspace"]
        return out

    def with_boundary(self, boundary: Boundary | None) -> FunctionDefinition:
        return self if boundary is None else replace(self, boundary=boundary)


def deployed_by_admin(deployed_by: dict | None) -> bool:
    """Whether a function's record says a full admin last deployed, resumed or saved it (``deployed_by``;
    None is the local CLI, trusted as an admin): what its sandbox, its grants and its sink path follow."""
    return deployed_by is None or deployed_by.get("admin") is True


def effective_isolation(defn: FunctionDefinition, deployed_by: dict | None, default: str) -> str:
    """How a deployed function runs: always "sandbox" when a user who is not a full admin deployed or
    resumed it (``deployed_by`` of its record; None is the local CLI, trusted as an admin), else its
    ``isolation`` setting, or without one `default`: the machine's (eventing.workers.sandbox.default:
    DEFAULT_ADMIN_ISOLATION where it can sandbox, "none" where it cannot)."""
    if not deployed_by_admin(deployed_by):
        return "sandbox"
    return defn.isolation or default


def _writable_paths(function: str, paths: Any) -> tuple[str, ...]:
    """`sandbox_writable` as absolute, normalized paths (existence and overlap with the data directory are
    checked where the sandbox starts: eventing.workers.sandbox.host)."""
    if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) and p for p in paths):
        raise ConfigError(
            f"sandbox_writable of function '{function}' must be a list of absolute paths, for example "
            '["/var/log/my-function"]'
        )
    out = []
    for path in paths:
        normal = os.path.normpath(path)
        if not os.path.isabs(path) or normal == "/":
            raise ConfigError(
                f"sandbox_writable of function '{function}' names {path!r}: give an absolute path of a "
                "folder or file below / (for example /var/log/my-function)"
            )
        out.append(normal)
    return tuple(dict.fromkeys(out))


def _check_alias(kind: str, alias: Any, function: str) -> None:
    """A binding alias or constant becomes a global of the handler module: it must be a usable name that
    hides nothing the handler API provides."""
    if not isinstance(alias, str) or not ALIAS.match(alias):
        raise ConfigError(f"{kind} {alias!r} of function '{function}' is not a Python identifier; rename it")
    if keyword.iskeyword(alias):
        raise ConfigError(
            f"{kind} '{alias}' of function '{function}' is a Python keyword, which a handler cannot use as a "
            f"name; rename it (for example '{alias}_')"
        )
    if alias in RESERVED_NAMES:
        raise ConfigError(
            f"{kind} '{alias}' of function '{function}' would hide the handler API's "
            f"{RESERVED_NAMES[alias]}; rename it (for example '{alias}_bucket')"
        )


def parse_url_bindings(raw: Any, function: str) -> tuple[dict, ...]:
    """Validate the definition's url_bindings (alias, url http(s), auth none|basic|bearer|digest, verify_tls,
    allow_cookies)."""
    if not isinstance(raw, list | tuple):
        raise ConfigError(f"url_bindings of function '{function}' must be a list of objects")
    out = []
    for item in raw:
        if not isinstance(item, dict):
            raise ConfigError(f"a url binding of function '{function}' must be an object with alias and url")
        alias, url, auth = item.get("alias", ""), item.get("url", ""), item.get("auth", "none")
        scheme = urllib.parse.urlsplit(url).scheme if isinstance(url, str) else ""
        if scheme not in ("http", "https") or not urllib.parse.urlsplit(url).netloc:
            raise ConfigError(
                f"url binding '{alias}' of function '{function}' has url {url!r}; give http(s)://host[:port]/path"
            )
        if auth not in ("none", "basic", "bearer", "digest"):
            raise ConfigError(
                f"url binding '{alias}' of function '{function}' has auth {auth!r}; use none, basic, bearer "
                "or digest"
            )
        for flag in ("verify_tls", "allow_cookies"):
            if flag in item and not isinstance(item[flag], bool):
                raise ConfigError(
                    f"{flag} of url binding '{alias}' of function '{function}' must be true or false"
                )
        unknown = set(item) - URL_BINDING_FIELDS
        if unknown:
            raise ConfigError(
                f"url binding '{alias}' of function '{function}' has unknown field(s) "
                f"{', '.join(sorted(unknown))}"
            )
        _check_url_limits(item, f"url binding '{alias}' of function '{function}'")
        out.append(dict(item))
    return tuple(out)


URL_BINDING_FIELDS = frozenset(
    {
        "alias",
        "url",
        "auth",
        "username",
        "password",
        "token",
        "verify_tls",
        "allow_cookies",
        "idempotency_header",
        "rate_limit",
        "max_in_flight",
    }
)
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")  # an HTTP header name (a token)


def _check_url_limits(item: dict[str, Any], what: str) -> None:
    """idempotency_header (a header name, or false), rate_limit ({per_second, burst}) and max_in_flight."""
    header = item.get("idempotency_header", "Idempotency-Key")
    if header is not False and not (isinstance(header, str) and _HEADER_NAME.match(header)):
        raise ConfigError(
            f'idempotency_header of {what} is {header!r}; give a header name such as "Idempotency-Key", or '
            "false "
            "to send none"
        )
    rate = item.get("rate_limit")
    if rate is not None:
        per_second = rate.get("per_second") if isinstance(rate, dict) else None
        burst = rate.get("burst", 1) if isinstance(rate, dict) else None
        if (
            not isinstance(rate, dict)
            or set(rate) - {"per_second", "burst"}
            or isinstance(per_second, bool)
            or not isinstance(per_second, int | float)
            or per_second <= 0
            or isinstance(burst, bool)
            or not isinstance(burst, int)
            or burst < 1
        ):
            raise ConfigError(
                f"rate_limit of {what} is {rate!r}; give requests per second and a burst, for example "
                '{"per_second": 50, "burst": 10} (burst: requests that may start at once after a quiet time, '
                ">= 1)"
            )
    in_flight = item.get("max_in_flight")
    if in_flight is not None and (
        isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1
    ):
        raise ConfigError(
            f"max_in_flight of {what} is {in_flight!r}; give an integer >= 1 (requests at once)"
        )


def load_definition_file(path: str | Path) -> tuple[FunctionDefinition, str]:
    """Read a definition JSON; its `handler` is a path relative to the JSON file, or `handler_source`
    inline."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"definition file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"definition file {path} is not valid JSON ({exc})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"definition file {path} is not UTF-8 text ({_decode_error(exc)}); save it as UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(f"definition file {path} cannot be read ({exc.strerror})") from None
    if isinstance(data, dict) and "handler_source" in data:
        source = data["handler_source"]
    else:
        handler = data.get("handler") if isinstance(data, dict) else None
        if not handler:
            raise ConfigError(
                f'definition file {path} names no \'handler\' file; add "handler": "my_handler.py"'
            )
        handler_path = (path.parent / handler).resolve()
        if handler_path.suffix == ".js" and "language" not in data:
            data = {**data, "language": "javascript"}
        try:
            source = handler_path.read_text()
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"handler file {handler_path} of definition {path} is not UTF-8 text ({_decode_error(exc)}); "
                "save it as UTF-8"
            ) from None
        except OSError as exc:
            raise ConfigError(
                f"handler file {handler_path} of definition {path} cannot be read ({exc.strerror}); fix "
                "'handler'"
            ) from None
    return FunctionDefinition.from_dict(data), source


def _decode_error(exc: UnicodeDecodeError) -> str:
    return f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
