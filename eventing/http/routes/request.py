"""What every REST endpoint shares: the request an endpoint gets (`EndpointRequest`: data directory, path
and query parameters, body, and the checks of its parameters), the row of the endpoint table
(`Endpoint`), the path of one function, and the two shapes of an error: this API's `{"error", "fix"}`
with its HTTP status and the CLI's wording turned into endpoints (`error_body`, `rest_wording`), and
Couchbase's `{"name", "code", "description", ...}` for the endpoints shaped like Couchbase's
(`couchbase_error`), with the header that carries warnings beside a Couchbase-shaped body.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse, Response

from eventing.core.couchbase_format import InvalidSettingError
from eventing.core.function_names import full_name, function_scope, plain_name, split_name
from eventing.errors import (
    ConfigError,
    EventingError,
    FencedError,
    InvalidKeyError,
    LifecycleError,
    NotFoundError,
    OrderViolationError,
    StoreCorruptError,
    StoreError,
    StoreLockedError,
)
from eventing.http import auth
from eventing.storage.state import State

QUERY_TRUE = frozenset({"1", "true", "yes"})
QUERY_FALSE = frozenset({"0", "false", "no"})
FUNCTION_PATH = "/api/v1/functions/{name}"  # the path of one function; its endpoints extend it


@dataclass
class EndpointRequest:
    """What an endpoint gets: the data directory, path and query parameters, and the raw body."""

    state: State
    params: dict[str, str]
    query: dict[str, str]
    body: bytes
    role: str = "read"  # "admin" for a full admin (reads secrets on request), else "read"
    identity: auth.Identity = auth.LOCAL_IDENTITY  # the caller (eventing.http.auth), recorded as a deployer

    @property
    def name(self) -> str:
        return self.params["name"]

    def json(self, default: Any = None) -> Any:
        if not self.body.strip():
            if default is not None:
                return default
            raise ConfigError("this request needs a JSON body")
        try:
            return json.loads(self.body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"the request body is not valid JSON ({exc})") from None
        except RecursionError:
            raise ConfigError("the request body's JSON nests too deeply to read; flatten it") from None

    def json_object(self) -> dict[str, Any]:
        data = self.json(default={})
        if not isinstance(data, dict):
            raise ConfigError("the request body must be a JSON object")
        return data

    def text(self) -> str:
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"the request body is not UTF-8 text (byte {exc.start}); send the handler as UTF-8"
            ) from None

    def shown(self, source: dict[str, Any], key: str, value: Any) -> str:
        """A parameter as the caller wrote it: `size=-1` in a query string, `"all": "yes"` in a JSON body."""
        return f"{key}={value}" if source is self.query else f"{json.dumps(key)}: {json.dumps(value)}"

    def int_arg(self, source: dict[str, Any], key: str, minimum: int | None = None) -> int | None:
        """A whole-number parameter of the query string (`source` is `self.query`) or of a JSON body; None
        when absent. Anything else, or a number below `minimum`, is a 400 naming the parameter."""
        value = source.get(key)
        if value is None or value == "":
            return None
        number: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
            number = int(value)
        if number is None or (minimum is not None and number < minimum):
            accepted = "a whole number" + (f" >= {minimum}" if minimum is not None else "")
            raise ConfigError(f"{self.shown(source, key, value)} is not valid; give {accepted}")
        return number

    def flag(self, source: dict[str, Any], key: str) -> bool:
        """A yes/no parameter: in the query string true/false, 1/0 or yes/no; in a JSON body a JSON boolean
        only, so `{"all": "yes"}` is a 400 rather than a purge."""
        value = source.get(key)
        if value is None:
            return False
        if source is self.query:
            text = str(value).strip().lower()
            if text in QUERY_TRUE or text in QUERY_FALSE or text == "":
                return text in QUERY_TRUE
            raise ConfigError(f"{key}={value} is not valid; use {key}=true or {key}=false (or 1 and 0)")
        if isinstance(value, bool):
            return value
        raise ConfigError(
            f'{self.shown(source, key, value)} is not valid; "{key}" is a JSON boolean: true or false'
        )


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    group: str
    summary: str
    handler: Callable[[EndpointRequest], Any]
    status: int = 200
    couchbase: bool = False  # shaped like Couchbase Eventing's endpoint of the same path


# Couchbase's error names, codes and HTTP statuses (its REST response package) for the errors of this project.
COUCHBASE_ERRORS: list[tuple[type[BaseException], str, int]] = [
    (NotFoundError, "ERR_APP_NOT_FOUND_TS", 13),
    (InvalidSettingError, "ERR_INVALID_CONFIG", 38),
    (LifecycleError, "ERR_APP_NOT_UNDEPLOYED", 22),
    (EventingError, "ERR_READ_REQ", 15),
    (InvalidKeyError, "ERR_READ_REQ", 15),
]
ALREADY = {"deployed": ("ERR_APP_ALREADY_DEPLOYED", 20, 422), "undeployed": ("ERR_APP_NOT_DEPLOYED", 12, 406)}


class AlreadyInState(LifecycleError):
    """A deploy of a deployed function or an undeploy of an undeployed one: Couchbase answers it with its own
    code and HTTP status and the sentence its tools read as "already in that state" (couchbase-cli then
    reports success)."""

    def __init__(self, name: str, state: str, message: str, **kw: Any):
        super().__init__(message, **kw)
        self.couchbase_name, self.couchbase_code, self.couchbase_status = ALREADY[state]
        self.description = f"Invalid operation. Function: {name} already in {state} state."


def resolve_name(state: State, name: str, query: dict[str, str], *, creating: bool = False) -> str:
    """The full name of the function a request names: `NAME` with `?bucket=B&scope=S` is the function in that
    namespace (`B.S.NAME`; `*`/`*` is the global one), so a wrong scope finds nothing (404). Without them
    (or with both empty, as couchbase-cli sends them) it is the global function of that name, else the only
    function of that plain name in any namespace (one in several is a 400 asking for the namespace)."""
    bucket, scope = query.get("bucket", ""), query.get("scope", "")
    if bucket or scope:
        if not (bucket and scope):
            raise ConfigError("give both ?bucket= and ?scope= (the function's namespace), or neither")
        if split_name(name) is not None:
            if function_scope(name) != (bucket, scope):
                raise ConfigError(
                    f"function '{name}' names its namespace, which ?bucket={bucket}&scope={scope} "
                    "contradicts; leave them out or give the plain name"
                )
            return name
        return full_name(name, bucket, scope)
    if creating or split_name(name) is not None or not state.exists():
        return name
    with state.metadata as store:
        try:
            store.get_function(name)
            return name
        except NotFoundError:
            pass
        matches = sorted(
            r.name for r in store.list_functions() if split_name(r.name) and plain_name(r.name) == name
        )
    if len(matches) > 1:
        raise ConfigError(
            f"function '{name}' is in more than one namespace ({', '.join(matches)}); give ?bucket= "
            "and ?scope=, or the full name"
        )
    return matches[0] if matches else name


def couchbase_fields(exc: BaseException, message: str) -> tuple[int | None, dict[str, Any]]:
    """Couchbase's fields of an error (name, code, description, runtime_info) and, where its tools need
    Couchbase's HTTP status rather than this API's, that status."""
    if isinstance(exc, AlreadyInState):
        name, code, status, description = (
            exc.couchbase_name,
            exc.couchbase_code,
            exc.couchbase_status,
            exc.description,
        )
    else:
        name, code = next((n, k) for kind, n, k in COUCHBASE_ERRORS if isinstance(exc, kind))
        status, description = None, message
        if isinstance(exc, LifecycleError) and "undeployed" in message.split(";")[0]:
            name, code = "ERR_APP_NOT_DEPLOYED", 12
    return status, {
        "name": name,
        "code": code,
        "description": description,
        "attributes": [],
        "runtime_info": {"code": code, "info": description},
    }


def couchbase_error(exc: BaseException) -> Response:
    """An error as Couchbase's Eventing REST API gives it (name, code, description, runtime_info), with this
    API's `error` and `fix` beside them."""
    status, body = error_body(exc)
    override, fields = couchbase_fields(exc, body["error"])
    return JSONResponse({**fields, **body}, status_code=override or status)


def _couchbase_call(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except (EventingError, InvalidKeyError) as exc:
        return couchbase_error(exc)


def _with_warnings(result: Any, warnings: list[str]) -> Response:
    """A JSON answer whose warnings (what Couchbase's format had that does nothing here) ride in a header,
    so the body keeps Couchbase's shape."""
    return JSONResponse(result, headers={"X-Eventing-Warnings": json.dumps(warnings)} if warnings else None)


STATUS_OF: list[tuple[type[BaseException], int]] = [
    (NotFoundError, 404),
    (LifecycleError, 409),
    (FencedError, 409),
    (OrderViolationError, 409),
    (StoreLockedError, 503),
    (StoreCorruptError, 503),  # a damaged file: the CLI's line, which names the file and the way out
    (StoreError, 503),  # a full disk, a file unusable otherwise
    (EventingError, 400),
    (InvalidKeyError, 400),
]


# How the REST API words an error's way out (eventing.errors.Fix; the CLI's own words: CLI_WORDING).
REST_WORDING: dict[str, str] = {
    "deploy": "POST /api/v1/functions/{function}/deploy",
    "undeploy": "POST /api/v1/functions/{function}/undeploy",
    "pause": "POST /api/v1/functions/{function}/pause",
    "resume": "POST /api/v1/functions/{function}/resume",
    "status": "GET /api/v1/status",
    "stats": "GET /api/v1/functions/{function}/stats",
    "export": "GET /api/v1/export?name={function}",
    "dlq_list": "GET /api/v1/functions/{function}/dlq",
    "dlq_purge_replayed": 'POST /api/v1/functions/{function}/dlq/purge with {{"replayed": true}}',
    "collection_create": "POST /api/v1/keyspaces/{keyspace}/collection",
    "collection_list": "GET /api/v1/buckets/{bucket}/collections",
    "option": "the query parameter {option}={value}",
}


def rest_fix(error: BaseException) -> dict[str, Any] | None:
    """An error's way out as a field: its action, arguments and the request that takes it."""
    way = getattr(error, "fix", None)
    if way is None:
        return None
    return {
        "action": way.action,
        "args": {k: str(v) for k, v in way.args.items()},
        "request": _rest_words(way),
    }


def _rest_words(way: Any) -> str:
    if way.action == "option":
        return REST_WORDING["option"].format(
            option=str(way.args["flag"]).lstrip("-").replace("-", "_"), value=way.args["value"]
        )
    if way.action == "collection_create":
        bucket, _, rest = str(way.args["keyspace"]).partition(".")
        scope, _, collection = rest.partition(".")
        return f"POST /api/v1/buckets/{bucket}/scopes/{scope}/collections/{collection}"
    return way.worded(REST_WORDING)


def rest_message(error: BaseException) -> str:
    """The error's message with its way out worded as a request."""
    way = getattr(error, "fix", None)
    text = str(error.args[0]) if error.args else str(error)
    return text.replace("{fix}", _rest_words(way)) if way is not None else str(error)


def error_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The error in REST terms: its message with the way out worded as a request, the way out alone
    (`fix`: the message's last clause after '; '), and, where the error carries it as data, `fix_request`
    (action, arguments and the request)."""
    message = rest_message(exc)
    status = next(code for kind, code in STATUS_OF if isinstance(exc, kind))
    _, sep, fix = message.rpartition("; ")
    body: dict[str, Any] = {"error": message, "fix": fix if sep else None}
    structured = rest_fix(exc)
    if structured is not None:
        body["fix_request"] = structured
    return status, body
