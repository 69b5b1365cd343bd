"""Couchbase Eventing's function JSON (its export format and REST bodies) to this project's definition and
back.

Pure: no I/O. A Couchbase function (`appname`, `appcode`, `depcfg`, `settings`, `version`, `function_scope`)
becomes a JavaScript definition (`"language": "javascript"`, the appcode as handler source) plus the state its
`deployment_status`/`processing_status` ask for. Every field has one fate (FATES lists the settings'): mapped
to the setting that does the same here, refused with a ConfigError naming it, or accepted with a warning
naming it and saying why it changes nothing here. A field this module does not know (a newer Couchbase's) is
named in a warning too; nothing is dropped silently.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from eventing.core.definition import FunctionDefinition
from eventing.core.function_names import full_name, function_scope, plain_name
from eventing.errors import ConfigError

DEFAULT = "_default"
EXPORT_VERSION = "evt-7.6.0-0000-ce"  # the authoring tool an export names (Couchbase's pattern)
LANGUAGE_COMPATIBILITY = (
    "7.2.0"  # what an export declares: the JavaScript runtime follows Couchbase's current behaviour
)
MB = 1024 * 1024
COUCHBASE_CURL_MAX_MB = 100  # curl_max_allowed_resp_size when a Couchbase function does not set it

# Top-level fields: what each becomes.
TOP_LEVEL = {"appname", "appcode", "depcfg", "settings", "version", "function_scope"}
# Identifiers the exporting cluster generated for its own deployment; they mean nothing in another system.
GENERATED = {"handleruuid", "function_instance_id", "id", "enforce_schema", "using_timer", "metainfo"}
DEPCFG = {
    "source_bucket",
    "source_scope",
    "source_collection",
    "metadata_bucket",
    "metadata_scope",
    "metadata_collection",
    "buckets",
    "curl",
    "constants",
}
BUCKET_BINDING = {"alias", "bucket_name", "scope_name", "collection_name", "access"}
CURL_BINDING = {
    "hostname",
    "value",
    "auth_type",
    "username",
    "password",
    "bearer_key",
    "allow_cookies",
    "validate_ssl_certificate",
}
AUTH_TYPES = {"no-auth": "none", "basic": "basic", "bearer": "bearer", "digest": "digest"}

# Settings mapped to this project's (see _settings_from_couchbase for the unit conversions).
MAPPED = {
    "dcp_stream_boundary": "boundary",
    "worker_count": "worker_count",
    "execution_timeout": "execution_timeout",  # seconds
    "timer_context_size": "timer_context_size",
    "timer_context_max_size": "timer_context_size",  # the same limit under another name
    "description": "description",
    "checkpoint_interval": "checkpoint_interval",  # seconds
    "app_log_max_size": "app_log_max_size",
    "app_log_max_files": "app_log_max_files",
    "curl_max_allowed_resp_size": "curl_max_response_bytes",  # MB
    "deployment_status": "state",
    "processing_status": "state",
    "handler_headers": "handler source",  # prepended, as Couchbase does
    "handler_footers": "handler source",  # appended
}
# Settings accepted at Couchbase's default and warned about otherwise: tuning of Couchbase's own machinery
# (libcouchbase, DCP, its C++ workers, SQL++), which this system does not have. Value: (default, why).
NO_EFFECT: dict[str, tuple[Any, str]] = {
    "log_level": (
        "INFO",
        "handler log() lines always go to the application log; system logging is not per function",
    ),
    "language_compatibility": (None, "the JavaScript runtime follows Couchbase's current (7.2) behaviour"),
    "n1ql_consistency": ("none", "SQL++ is not available to handlers here"),
    "n1ql_prepare_all": (False, "SQL++ is not available to handlers here"),
    "lcb_inst_capacity": (10, "there is no libcouchbase connection pool"),
    "lcb_retry_count": (0, "there is no libcouchbase; bucket operations are local"),
    "lcb_timeout": (None, "there is no libcouchbase; bucket operations are local"),
    "bucket_cache_size": (67108864, "there is no bucket cache; reads see the bucket"),
    "bucket_cache_age": (1000, "there is no bucket cache; reads see the bucket"),
    "cpp_worker_thread_count": (2, "each worker runs one handler thread"),
    "sock_batch_size": (None, "there is no producer/consumer socket"),
    "tick_duration": (None, "statistics are written at every checkpoint"),
    "num_timer_partitions": (None, "timers are kept per vBucket in the metadata store"),
    "user_prefix": ("eventing", "metadata is kept in this system's metadata store"),
    "enable_applog_rotation": (
        True,
        "the application log always rotates (app_log_max_size, app_log_max_files)",
    ),
    "app_log_dir": (None, "the application log is <data-dir>/logs/FUNCTION.log"),
    "high_seq_check_interval": (None, "there is no DCP stream to poll"),
    "max_unacked_bytes": (None, "there is no DCP flow control"),
    "max_unacked_count": (None, "there is no DCP flow control"),
    "flush_timer": (None, "there is no DCP flow control"),
    "max_parallel_vb": (None, "each worker owns a range of vBuckets"),
    "allow_transaction_mutations": (False, "there are no transactions; every mutation reaches the handler"),
    "allow_sync_documents": (
        True,
        "Sync Gateway documents are not told apart; every mutation reaches the handler",
    ),
    "cursor_aware": (
        False,
        "every mutation of a document reaches the handler, in order, as cursor-aware functions promise",
    ),
    "dcp_gen_chan_size": (None, "there is no DCP stream"),
    "data_chan_size": (None, "there is no DCP stream"),
    "timer_queue_mem_cap": (None, "timers are kept in the metadata store"),
    "timer_queue_size": (None, "timers are kept in the metadata store"),
}
# This project's settings that Couchbase's format has no field for: named in an export's warnings when not
# at their default (an export is meant to load into Couchbase, which would refuse unknown settings).
PROJECT_ONLY = (
    "batch_size",
    "retries",
    "retry_backoff",
    "max_document_bytes",
    "window",
    "placement",
    "delivery",
    "previous_version",
    "js_heap_limit_mb",
    "concurrency",
    "filter",
    "isolation",
    "sandbox_writable",
)


@dataclass(frozen=True)
class Converted:
    """A Couchbase function as this project's definition, the state it asks for, and the warnings."""

    definition: FunctionDefinition
    source: str
    state: str  # undeployed | deployed | paused, from deployment_status and processing_status
    warnings: tuple[str, ...]


def is_couchbase_function(item: Any) -> bool:
    """Couchbase's shape: `appname`/`appcode`/`depcfg` where this project's has `name`/`handler_source`."""
    return isinstance(item, dict) and ("appname" in item or "depcfg" in item or "appcode" in item)


def namespaced_name(item: dict[str, Any]) -> str:
    """The full name of a Couchbase function: its appname in the namespace of its function_scope (none, or
    `*`/`*`, is the global namespace: eventing.core.function_names)."""
    name = str(item.get("appname") or item.get("name") or "")
    scope = item.get("function_scope")
    if scope is None:
        return name
    if (
        not isinstance(scope, dict)
        or not isinstance(scope.get("bucket"), str)
        or not isinstance(scope.get("scope"), str)
    ):
        raise ConfigError(
            f'function \'{name}\': function_scope must be {{"bucket": ..., "scope": ...}} '
            '("*" and "*" for the global namespace)'
        )
    return full_name(name, scope["bucket"], scope["scope"])


def state_of(deployment_status: Any, processing_status: Any) -> str:
    """Couchbase's two flags as a state: deployed and processing is deployed, deployed and not processing is
    paused, not deployed is undeployed."""
    if not deployment_status:
        return "undeployed"
    return "deployed" if processing_status else "paused"


def from_couchbase(item: Any) -> Converted:
    """A Couchbase function JSON as a definition; ConfigError naming the field for what cannot be kept."""
    if not isinstance(item, dict):
        raise ConfigError(
            "a Couchbase function must be a JSON object with appname, appcode, depcfg and settings"
        )
    name = item.get("appname")
    if not isinstance(name, str) or not name:
        raise ConfigError("the Couchbase function has no 'appname'; add the function's name")
    warnings: list[str] = []
    where = f"function '{name}'"
    unknown = sorted(set(item) - TOP_LEVEL - GENERATED)
    if unknown:
        warnings.append(
            f"{where}: field(s) {', '.join(unknown)} are unknown here (from a newer Couchbase?) and "
            "were not imported"
        )
    appcode = item.get("appcode")
    if not isinstance(appcode, str) or not appcode.strip():
        raise ConfigError(f"{where} has no 'appcode'; the handler's JavaScript source is needed")
    depcfg = item.get("depcfg")
    if not isinstance(depcfg, dict) or not depcfg.get("source_bucket"):
        raise ConfigError(f"{where} has no depcfg.source_bucket; name the bucket whose mutations it handles")
    settings = item.get("settings") or {}
    if not isinstance(settings, dict):
        raise ConfigError(f"settings of {where} must be a JSON object")

    definition: dict[str, Any] = {"name": name, "language": "javascript"}
    definition.update(_depcfg_from_couchbase(depcfg, where, warnings))
    version = str(item.get("version") or "")
    if re.match(r"evt-5\.", version) and isinstance(settings.get("checkpoint_interval"), int | float):
        # Couchbase 5.x gave checkpoint_interval in milliseconds (6.0 and later: seconds)
        settings = {**settings, "checkpoint_interval": settings["checkpoint_interval"] / 1000}
    fields, state, source = _settings_from_couchbase(settings, where, warnings, appcode)
    fields.setdefault("curl_max_response_bytes", COUCHBASE_CURL_MAX_MB * MB)  # Couchbase's default, not 1 MiB
    definition.update(fields)
    definition["name"] = namespaced_name(item)
    try:
        defn = FunctionDefinition.from_dict(definition)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (imported from Couchbase's format)") from None
    return Converted(defn, source, state, tuple(warnings))


def _depcfg_from_couchbase(depcfg: dict[str, Any], where: str, warnings: list[str]) -> dict[str, Any]:
    unknown = sorted(set(depcfg) - DEPCFG)
    if unknown:
        warnings.append(
            f"{where}: depcfg field(s) {', '.join(unknown)} are unknown here and were not imported"
        )
    out: dict[str, Any] = {
        "source_bucket": depcfg["source_bucket"],
        "source_scope": depcfg.get("source_scope") or DEFAULT,
        "source_collection": depcfg.get("source_collection") or DEFAULT,
    }
    if any(depcfg.get(k) for k in ("metadata_bucket", "metadata_scope", "metadata_collection")):
        keyspace = ".".join(
            str(depcfg.get(k) or DEFAULT)
            for k in ("metadata_bucket", "metadata_scope", "metadata_collection")
        )
        warnings.append(
            f"{where}: depcfg.metadata_bucket/scope/collection ({keyspace}) is not used; checkpoints and "
            "timers are kept in this system's metadata store, not in a bucket (it is kept for an export)"
        )
        out["metadata_keyspace"] = keyspace
    bindings = []
    for raw in _list(depcfg.get("buckets"), "depcfg.buckets", where):
        extra = sorted(set(raw) - BUCKET_BINDING)
        if extra:
            warnings.append(
                f"{where}: bucket binding '{raw.get('alias')}' field(s) {', '.join(extra)} are unknown here"
            )
        bindings.append(
            {
                "alias": raw.get("alias", ""),
                "bucket": raw.get("bucket_name", ""),
                "scope": raw.get("scope_name") or DEFAULT,
                "collection": raw.get("collection_name") or DEFAULT,
                "access": raw.get("access", "rw"),
            }
        )  # Couchbase's default access is read-write
    urls = []
    for raw in _list(depcfg.get("curl"), "depcfg.curl", where):
        alias = raw.get("value", "")
        extra = sorted(set(raw) - CURL_BINDING)
        if extra:
            warnings.append(f"{where}: curl binding '{alias}' field(s) {', '.join(extra)} are unknown here")
        auth = AUTH_TYPES.get(raw.get("auth_type", "no-auth"))
        if auth is None:
            raise ConfigError(
                f"curl binding '{alias}' of {where} has auth_type {raw.get('auth_type')!r}; use no-auth, "
                "basic, bearer or digest"
            )
        url: dict[str, Any] = {"alias": alias, "url": raw.get("hostname", "")}
        if auth != "none":
            url["auth"] = auth
        if not raw.get("validate_ssl_certificate", True):
            url["verify_tls"] = False
        if raw.get("allow_cookies", True):  # Couchbase's default is true; this project's false
            url["allow_cookies"] = True
        if auth in ("basic", "digest"):
            url["username"], url["password"] = raw.get("username", ""), raw.get("password", "")
        elif auth == "bearer":
            url["token"] = raw.get("bearer_key", "")
        urls.append(url)
    constants = {}
    for raw in _list(depcfg.get("constants"), "depcfg.constants", where):
        alias = raw.get("value")
        constants[alias] = _literal(raw.get("literal"), alias, where)
    out.update({"bindings": bindings, "url_bindings": urls, "constants": constants})
    return out


def _list(value: Any, field: str, where: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"{field} of {where} must be a list of objects")
    return value


def _literal(text: Any, alias: Any, where: str) -> Any:
    """A constant's `literal` (JavaScript source: a number, true/false/null, a quoted string, an object) as a
    JSON value; a JavaScript expression that is not one is refused by name."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    quoted = re.fullmatch(r"'((?:[^'\\]|\\.)*)'", text.strip())
    if quoted:
        return json.loads('"' + quoted.group(1).replace("\\'", "'").replace('"', '\\"') + '"')
    raise ConfigError(
        f"constant '{alias}' of {where} has the literal {text!r}, which is not a JSON value or a quoted "
        'string; write its value as JSON (a number, a "string", true, false, null, an object)'
    )


class InvalidSettingError(ConfigError):
    """A setting Couchbase itself refuses (its ERR_INVALID_CONFIG): a status flag that is not a boolean, a
    count or interval that is not a positive whole number, a boundary or size out of its range."""


POSITIVE_WHOLE = (
    "worker_count",
    "checkpoint_interval",
    "execution_timeout",
    "app_log_max_size",
    "app_log_max_files",
    "curl_max_allowed_resp_size",
    "timer_context_size",
    "timer_context_max_size",
)
TIMER_CONTEXT_RANGE = (20, 19 * MB)  # Couchbase's limits of timer_context_size


def check_settings(settings: dict[str, Any], where: str) -> None:
    """Refuse what Couchbase's own settings check refuses (InvalidSettingError naming the setting)."""
    for key in ("deployment_status", "processing_status"):
        if key in settings and not isinstance(settings[key], bool):
            raise InvalidSettingError(
                f"{key} of {where} is {json.dumps(settings[key])}; Couchbase takes true or false"
            )
    for key in POSITIVE_WHOLE:
        value = settings.get(key)
        if key not in settings or key == "curl_max_allowed_resp_size" and value == 0:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or value <= 0
            or not float(value).is_integer()
        ):
            unit = " in seconds" if key in ("execution_timeout", "checkpoint_interval") else ""
            raise InvalidSettingError(
                f"{key} of {where} is {json.dumps(value)}; Couchbase gives it{unit}, a positive whole number"
            )
    for key in ("timer_context_size", "timer_context_max_size"):
        if key in settings and not TIMER_CONTEXT_RANGE[0] <= settings[key] <= TIMER_CONTEXT_RANGE[1]:
            raise InvalidSettingError(
                f"{key} of {where} is {settings[key]}; Couchbase takes {TIMER_CONTEXT_RANGE[0]} "
                f"to {TIMER_CONTEXT_RANGE[1]} bytes"
            )
    boundary = settings.get("dcp_stream_boundary")
    if boundary is not None and boundary not in ("everything", "from_now"):
        raise InvalidSettingError(
            f"dcp_stream_boundary of {where} is {boundary!r}; use 'everything' or "
            "'from_now' ('from_prior' was removed in Couchbase 6.6.2)"
        )


def _settings_from_couchbase(
    settings: dict[str, Any], where: str, warnings: list[str], appcode: str
) -> tuple[dict[str, Any], str, str]:
    check_settings(settings, where)
    out: dict[str, Any] = {}
    for key in settings:
        if key in MAPPED or key in NO_EFFECT:
            continue
        warnings.append(
            f"{where}: setting {key} is unknown here (from a newer Couchbase?) and was not imported"
        )
    for key, (default, why) in NO_EFFECT.items():
        if (
            key in settings
            and settings[key] != default
            and not (key == "language_compatibility" and settings[key] in ("6.6.2", "7.2.0"))
        ):
            warnings.append(f"{where}: setting {key}={json.dumps(settings[key])} has no effect here; {why}")
    boundary = settings.get("dcp_stream_boundary")
    if boundary is not None:
        if boundary not in ("everything", "from_now"):
            raise ConfigError(
                f"dcp_stream_boundary of {where} is {boundary!r}; use 'everything' or 'from_now' "
                "('from_prior' was removed in Couchbase 6.6.2)"
            )
        out["boundary"] = boundary
    for key, target in (
        ("worker_count", "worker_count"),
        ("description", "description"),
        ("app_log_max_size", "app_log_max_size"),
        ("app_log_max_files", "app_log_max_files"),
    ):
        if key in settings:
            out[target] = settings[key]
    for key in ("timer_context_size", "timer_context_max_size"):
        if key in settings:
            out["timer_context_size"] = settings[key]
    for key in ("execution_timeout", "checkpoint_interval"):
        if key in settings:
            value = settings[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(
                    f"{key} of {where} is {value!r}; Couchbase gives it in seconds, a number >= 1"
                )
            value = int(value) if float(value).is_integer() else value
            out[key] = value
    if "curl_max_allowed_resp_size" in settings:
        size = settings["curl_max_allowed_resp_size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ConfigError(
                f"curl_max_allowed_resp_size of {where} is {size!r}; give megabytes, a whole number"
            )
        if size == 0:
            warnings.append(
                f"{where}: curl_max_allowed_resp_size=0 (no limit) is not kept; a curl response is "
                "limited to 1024 MB here"
            )
            size = 1024
        out["curl_max_response_bytes"] = size * MB
    headers, footers = settings.get("handler_headers") or [], settings.get("handler_footers") or []
    for key, lines in (("handler_headers", headers), ("handler_footers", footers)):
        if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
            raise ConfigError(f"{key} of {where} must be a list of lines of JavaScript")
    source = "\n".join([*headers, appcode, *footers]) if headers or footers else appcode
    state = state_of(settings.get("deployment_status"), settings.get("processing_status"))
    return out, state, source


def to_couchbase(
    definition: dict[str, Any], source: str, state: str = "undeployed"
) -> tuple[dict[str, Any], list[str]]:
    """A stored definition (as `FunctionDefinition.to_dict()` writes it, secrets masked or not: the caller
    decides) with its handler source as Couchbase's function JSON, and the warnings: project settings that
    Couchbase's format cannot carry, and the metadata keyspace Couchbase needs."""
    defn = FunctionDefinition.from_dict(definition)
    name = plain_name(defn.name)
    where = f"function '{defn.name}'"
    if defn.language != "javascript":
        raise ConfigError(
            f"{where} has a Python handler; Couchbase runs JavaScript handlers only, so it cannot be "
            "exported in Couchbase's format; export it without format couchbase"
        )
    warnings: list[str] = []
    default = FunctionDefinition(name=name, source_bucket=defn.source_bucket)
    for key in PROJECT_ONLY:
        if getattr(defn, key) != getattr(default, key):
            value = definition.get(key, getattr(defn, key))
            warnings.append(
                f"{where}: {key}={json.dumps(value, default=str)} has no field in Couchbase's format and "
                "was left out"
            )
    metadata = _metadata_keyspace(defn, where, warnings)
    curl = []
    for u in definition.get("url_bindings") or []:
        auth = u.get("auth", "none")
        binding: dict[str, Any] = {
            "hostname": u["url"],
            "value": u["alias"],
            "auth_type": {v: k for k, v in AUTH_TYPES.items()}[auth],
            "allow_cookies": bool(u.get("allow_cookies", False)),
            "validate_ssl_certificate": bool(u.get("verify_tls", True)),
        }
        if auth in ("basic", "digest"):
            binding.update(username=u.get("username", ""), password=u.get("password", ""))
        elif auth == "bearer":
            binding["bearer_key"] = u.get("token", "")
        curl.append(binding)
    depcfg = {
        "source_bucket": defn.source_bucket,
        "source_scope": defn.source_scope,
        "source_collection": defn.source_collection,
        "metadata_bucket": metadata[0],
        "metadata_scope": metadata[1],
        "metadata_collection": metadata[2],
        "buckets": [
            {
                "alias": b.alias,
                "bucket_name": b.bucket,
                "scope_name": b.scope,
                "collection_name": b.collection,
                "access": b.access,
            }
            for b in defn.bindings
        ],
        "curl": curl,
        "constants": [{"value": k, "literal": json.dumps(v)} for k, v in defn.constants.items()],
    }
    settings = {
        "dcp_stream_boundary": defn.boundary,
        "deployment_status": state in ("deployed", "deploying", "paused", "pausing"),
        "processing_status": state in ("deployed", "deploying"),
        "description": defn.description,
        "worker_count": defn.worker_count,
        "execution_timeout": _seconds(defn.execution_timeout, "execution_timeout", where, warnings),
        "checkpoint_interval": _seconds(defn.checkpoint_interval, "checkpoint_interval", where, warnings),
        "timer_context_size": defn.timer_context_size,
        "app_log_max_size": defn.app_log_max_size,
        "app_log_max_files": defn.app_log_max_files,
        "curl_max_allowed_resp_size": math.ceil(defn.curl_max_response_bytes / MB),
        "language_compatibility": LANGUAGE_COMPATIBILITY,
        "log_level": "INFO",
    }
    if defn.curl_max_response_bytes % MB:
        warnings.append(
            f"{where}: curl_max_response_bytes={defn.curl_max_response_bytes} is rounded up to "
            f"{settings['curl_max_allowed_resp_size']} MB (Couchbase gives it in whole megabytes)"
        )
    out = {
        "appname": name,
        "appcode": source,
        "depcfg": depcfg,
        "settings": settings,
        "version": EXPORT_VERSION,
        "function_scope": dict(zip(("bucket", "scope"), function_scope(defn.name), strict=True)),
    }
    return out, warnings


def _metadata_keyspace(defn: FunctionDefinition, where: str, warnings: list[str]) -> tuple[str, str, str]:
    """The metadata keyspace an export names: the one the function was imported with, else the source
    bucket's _default collection, or, when that is the source itself (which Couchbase refuses:
    ERR_SRC_MB_SAME), a collection `eventing` beside it, which must exist in Couchbase."""
    if defn.metadata_keyspace:
        parts = defn.metadata_keyspace.rsplit(".", 2)
        if len(parts) == 3:
            return parts[0], parts[1], parts[2]
    source = (defn.source_bucket, defn.source_scope, defn.source_collection)
    chosen = (defn.source_bucket, DEFAULT, DEFAULT)
    if source == chosen:
        chosen = (defn.source_bucket, DEFAULT, "eventing")
    warnings.append(
        f"{where}: depcfg.metadata_* is set to {'.'.join(chosen)}: Couchbase needs a metadata keyspace "
        "other than the source; create it (or change it) before importing into Couchbase"
    )
    return chosen


def _seconds(value: timedelta, key: str, where: str, warnings: list[str]) -> int:
    seconds = value.total_seconds()
    whole = max(1, math.ceil(seconds))
    if whole != seconds:
        warnings.append(
            f"{where}: {key}={seconds:g}s is rounded up to {whole}s (Couchbase gives it in whole seconds)"
        )
    return whole


def settings_from_couchbase(
    name: str, settings: dict[str, Any]
) -> tuple[dict[str, Any], str | None, list[str]]:
    """A Couchbase settings body (POST /api/v1/functions/NAME/settings): the definition fields it changes,
    the state it asks for (None when it names neither deployment_status nor processing_status), warnings."""
    warnings: list[str] = []
    fields, state, _ = _settings_from_couchbase(
        {k: v for k, v in settings.items() if k not in ("handler_headers", "handler_footers")},
        f"function '{name}'",
        warnings,
        "",
    )
    for key in ("handler_headers", "handler_footers"):
        if key in settings:
            raise ConfigError(
                f"settings cannot change {key} of function '{name}'; put the lines in the handler "
                f"source (POST /api/v1/functions/{name}/appcode)"
            )
    for key in ("execution_timeout", "checkpoint_interval"):
        if key in fields:
            fields[key] = f"{fields[key]}s"
    asked = "deployment_status" in settings or "processing_status" in settings
    return fields, state if asked else None, warnings


def is_couchbase_settings(body: dict[str, Any]) -> bool:
    """A settings body in Couchbase's words (it names a Couchbase-only setting or the status flags)."""
    own = set(FunctionDefinition.__dataclass_fields__)
    return any(k in MAPPED or k in NO_EFFECT for k in body if k not in own) or "dcp_stream_boundary" in body


def checksum(source: str) -> str:
    """The handler source's SHA-256, hex (Couchbase's /appcode/checksum)."""
    return hashlib.sha256(source.encode()).hexdigest()


def keyspace_fields(item: dict[str, Any]) -> dict[str, Any]:
    """The name and source keyspace of a function in either shape, in this project's field names (for the
    role check made before a body is converted)."""
    if not is_couchbase_function(item):
        return item
    depcfg: dict[str, Any] = item["depcfg"] if isinstance(item.get("depcfg"), dict) else {}
    try:
        name = namespaced_name(item)
    except ConfigError:
        name = str(item.get("appname", ""))
    return {
        "name": name,
        "source_bucket": depcfg.get("source_bucket", ""),
        "source_scope": depcfg.get("source_scope") or DEFAULT,
        "source_collection": depcfg.get("source_collection") or DEFAULT,
    }
