"""The REST endpoints: Couchbase Eventing's shapes (port 8096 there) plus this project's own views.

Every endpoint calls the same functions the CLI calls (eventing.control.lifecycle, eventing.ops.*), so
the rules and the messages are the CLI's. Errors come back as `{"error": message, "fix": hint}` with
400 (bad input), 404 (unknown thing), 409 (illegal state) or 503 (store busy). One table, ENDPOINTS,
drives the routes, the OpenAPI description and the docs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from eventing.control import lifecycle
from eventing.control.nodes import Topology
from eventing.core import couchbase_format
from eventing.core.definition import FunctionDefinition, check_function_name
from eventing.core.secrets import mask_definition
from eventing.errors import (
    ConfigError,
    EventingError,
    FencedError,
    InvalidKeyError,
    LifecycleError,
    NotFoundError,
    OrderViolationError,
    StoreCorruptError,
    StoreLockedError,
)
from eventing.http import auth
from eventing.ops import dlq, stats
from eventing.ops import nodes as nodes_ops
from metadata.factory import open_store

STATIC_DIR = Path(__file__).parent / "static"
APP_LOG_DIR = "logs"  # <data-dir>/logs/<function>.log, the handlers' application log
DEFAULT_LOG_BYTES = 40_960  # like Couchbase's getAppLog: the newest part of the log
DEFAULT_WAIT_S = 60.0  # ?wait= of pause and undeploy: how long to wait for the running service
QUERY_TRUE = frozenset({"1", "true", "yes"})
QUERY_FALSE = frozenset({"0", "false", "no"})


@dataclass
class EndpointRequest:
    """What an endpoint gets: the data directory, path and query parameters, and the raw body."""

    data_dir: str
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

    def json_object(self) -> dict[str, Any]:
        data = self.json(default={})
        if not isinstance(data, dict):
            raise ConfigError("the request body must be a JSON object")
        return data

    def text(self) -> str:
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"the request body is not UTF-8 text (byte {exc.start}); send the handler as UTF-8") from None

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
        raise ConfigError(f"{self.shown(source, key, value)} is not valid; \"{key}\" is a JSON boolean: true or false")


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    group: str
    summary: str
    handler: Callable[[EndpointRequest], Any]
    status: int = 200
    couchbase: bool = False  # shaped like Couchbase Eventing's endpoint of the same path


# -- functions (Couchbase-shaped) --------------------------------------------------------------------


def _document(record: Any) -> dict[str, Any]:
    """A stored function as every role reads it: URL binding secrets masked (`*****`)."""
    return {**mask_definition(record.definition), "handler_source": record.source, "state": record.state.value,
            "generation": record.generation}


def list_functions(c: EndpointRequest) -> list[dict[str, Any]]:
    try:
        store = open_store(c.data_dir, create=False)
    except NotFoundError:
        return []
    try:
        return [_document(r) for r in store.list_functions()]
    finally:
        store.close()


def get_function(c: EndpointRequest) -> dict[str, Any] | Response:
    if _couchbase_format(c):  # ?format=couchbase: Couchbase's function JSON, errors in its shape
        return _couchbase_call(lambda: _with_warnings(*lifecycle.export_couchbase(c.data_dir, c.name)))
    with open_store(c.data_dir, create=False) as store:
        return _document(store.get_function(c.name))


def _couchbase_format(c: EndpointRequest) -> bool:
    fmt = c.query.get("format", "eventing")
    if fmt not in ("eventing", "couchbase"):
        raise ConfigError(f"format={fmt} is not valid; use format=couchbase or format=eventing (the default)")
    return fmt == "couchbase"


# Couchbase's error names and codes (its REST response package) for the errors of this project.
COUCHBASE_ERRORS: list[tuple[type[BaseException], str, int]] = [
    (NotFoundError, "ERR_APP_NOT_FOUND_TS", 13),
    (LifecycleError, "ERR_APP_NOT_UNDEPLOYED", 22),
    (EventingError, "ERR_READ_REQ", 15),
    (InvalidKeyError, "ERR_READ_REQ", 15),
]


def couchbase_error(exc: BaseException) -> Response:
    """An error as Couchbase's Eventing REST API gives it: name, code, description, runtime_info."""
    status, body = error_body(exc)
    name, code = next((n, k) for kind, n, k in COUCHBASE_ERRORS if isinstance(exc, kind))
    if isinstance(exc, LifecycleError) and "undeployed" in body["error"].split(";")[0]:
        name, code = "ERR_APP_NOT_DEPLOYED", 12
    return JSONResponse({"name": name, "code": code, "description": body["error"], "attributes": [],
                         "runtime_info": {"code": code, "info": body["error"]}}, status_code=status)


def _couchbase_call(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except (EventingError, InvalidKeyError) as exc:
        return couchbase_error(exc)


def _with_warnings(result: Any, warnings: list[str]) -> Response:
    """A JSON answer whose warnings (what Couchbase's format had that does nothing here) ride in a header,
    so the body keeps Couchbase's shape."""
    return JSONResponse(result, headers={"X-Eventing-Warnings": json.dumps(warnings)} if warnings else None)


def save_function(c: EndpointRequest) -> dict[str, Any] | Response:
    """The body is a definition as `eventing export` writes it (`appcode` is accepted for `handler_source`),
    or Couchbase's function JSON (then its deployment_status/processing_status are carried out)."""
    body = c.json_object()
    if couchbase_format.is_couchbase_function(body):
        return _couchbase_call(lambda: _save_couchbase(c, body))
    if "appcode" in body and "handler_source" not in body:
        body["handler_source"] = body.pop("appcode")
    if body.get("name", c.name) != c.name:
        raise ConfigError(f"the body names function {body['name']!r} but the URL names '{c.name}'; make them agree")
    source = body.get("handler_source")
    if not isinstance(source, str):
        raise ConfigError("the body needs 'handler_source': the handler's Python code as a string")
    defn = FunctionDefinition.from_dict({**body, "name": c.name})
    return stats.function_view(lifecycle.save_function(c.data_dir, defn, source))


def _save_couchbase(c: EndpointRequest, body: dict[str, Any]) -> Response:
    if body.get("appname", c.name) != c.name:
        raise ConfigError(f"the body names function {body['appname']!r} but the URL names '{c.name}'; make them agree")
    records, warnings = lifecycle.import_functions(c.data_dir, {**body, "appname": c.name}, deploying=_deploying(c))
    return _with_warnings({**stats.function_view(records[0]), "warnings": warnings}, warnings)


def _deploying(c: EndpointRequest) -> Callable[[str], Any]:
    return lambda name: auth.deploying_as(c.data_dir, name, c.identity)


def create_functions(c: EndpointRequest) -> Response:
    """POST /api/v1/functions: one function or a list, in Couchbase's format or this project's (as import)."""
    def run() -> Response:
        records, warnings = lifecycle.import_functions(c.data_dir, c.json(), deploying=_deploying(c))
        return _with_warnings({"functions": [stats.function_view(r) for r in records], "warnings": warnings}, warnings)

    return _couchbase_call(run)


def delete_function(c: EndpointRequest) -> dict[str, Any]:
    lifecycle.delete(c.data_dir, c.name)
    return {"name": c.name, "deleted": True}


def deploy(c: EndpointRequest) -> dict[str, Any]:
    boundary = c.json_object().get("boundary")
    if boundary not in (None, "everything", "from_now"):
        raise ConfigError(f"boundary {boundary!r} is not valid; use 'everything' or 'from_now'")
    with auth.deploying_as(c.data_dir, c.name, c.identity):  # a non-admin's handler runs sandboxed
        return stats.function_view(lifecycle.deploy(c.data_dir, c.name, boundary))


def _wait_s(c: EndpointRequest) -> float:
    """?wait=SECONDS, checked before the function's state is (a bad parameter is a 400 in every state)."""
    text = c.query.get("wait", "").strip()
    if not text:
        return DEFAULT_WAIT_S
    try:
        wait = float(text)
    except ValueError:
        wait = -1.0
    if not math.isfinite(wait) or wait < 0:
        raise ConfigError(f"wait={c.query['wait']} is not valid; give a number of seconds >= 0 "
                          f"(default {DEFAULT_WAIT_S:g})")
    return wait


def pause(c: EndpointRequest) -> dict[str, Any]:
    return stats.function_view(lifecycle.pause(c.data_dir, c.name, wait_s=_wait_s(c)))


def resume(c: EndpointRequest) -> dict[str, Any]:
    with auth.deploying_as(c.data_dir, c.name, c.identity):
        return stats.function_view(lifecycle.resume(c.data_dir, c.name))


def undeploy(c: EndpointRequest) -> dict[str, Any]:
    return stats.function_view(lifecycle.undeploy(c.data_dir, c.name, wait_s=_wait_s(c)))


def get_settings(c: EndpointRequest) -> dict[str, Any] | Response:
    if _couchbase_format(c):
        return _couchbase_call(lambda: lifecycle.export_couchbase(c.data_dir, c.name)[0]["settings"])
    doc = get_function(c)
    assert isinstance(doc, dict)
    return {k: v for k, v in doc.items() if k not in ("name", "handler_source", "state", "generation")}


def save_settings(c: EndpointRequest) -> dict[str, Any] | Response:
    """Merge the given fields into the stored definition; the handler is kept (an undeployed or paused
    function only, as for the CLI). A body in Couchbase's words (deployment_status, processing_status,
    dcp_stream_boundary, execution_timeout in seconds, ...) changes the settings it maps, then deploys,
    pauses, resumes or undeploys as its status flags ask."""
    body = c.json_object()
    if couchbase_format.is_couchbase_settings(body):
        return _couchbase_call(lambda: _save_couchbase_settings(c, body))
    for key in ("name", "handler_source", "appcode"):
        if key in body:
            raise ConfigError(f"settings cannot change '{key}'; use POST /api/v1/functions/{c.name}"
                              + ("/appcode" if key != "name" else ""))
    with open_store(c.data_dir, create=False) as store:
        record = store.get_function(c.name)
    defn = FunctionDefinition.from_dict({**record.definition, **body})
    return stats.function_view(lifecycle.save_function(c.data_dir, defn, record.source))


def _save_couchbase_settings(c: EndpointRequest, body: dict[str, Any]) -> Response:
    fields, state, warnings = couchbase_format.settings_from_couchbase(c.name, body)
    with open_store(c.data_dir, create=False) as store:
        record = store.get_function(c.name)
    changed = {k: v for k, v in fields.items() if k != "boundary"}
    updated = FunctionDefinition.from_dict({**record.definition, **changed})
    if updated != FunctionDefinition.from_dict(record.definition):  # only a change needs an undeployed or paused function
        record = lifecycle.save_function(c.data_dir, updated, record.source)
    if state is not None:
        record = lifecycle.set_state(c.data_dir, c.name, state, boundary=fields.get("boundary"), wait_s=_wait_s(c),
                                     deploying=_deploying(c))
    return _with_warnings({**stats.function_view(record), "warnings": warnings}, warnings)


def get_appcode(c: EndpointRequest) -> Response:
    doc = get_function(c)
    assert isinstance(doc, dict)
    return PlainTextResponse(doc["handler_source"])


def appcode_checksum(c: EndpointRequest) -> Response:
    """The handler source's SHA-256 (Couchbase's /appcode/checksum), text/plain."""
    def run() -> Response:
        doc = get_function(c)
        assert isinstance(doc, dict)
        return PlainTextResponse(couchbase_format.checksum(doc["handler_source"]))

    return _couchbase_call(run)


def save_appcode(c: EndpointRequest) -> dict[str, Any]:
    source = c.text()
    with open_store(c.data_dir, create=False) as store:
        record = store.get_function(c.name)
    defn = FunctionDefinition.from_dict(record.definition)
    return stats.function_view(lifecycle.save_function(c.data_dir, defn, source))


def _status_app(view: dict[str, Any], nodes: int) -> dict[str, Any]:
    state = view["state"]
    return {
        "name": view["name"],
        "composite_status": state,
        "deployment_status": state in ("deployed", "deploying", "pausing", "paused"),
        "processing_status": state == "deployed",
        "num_deployed_nodes": nodes if view["running"] else 0,
        "running": view["running"],  # false while deployed: no service runs it (see "hint")
        "vbuckets_leased": view["vbuckets_leased"],
        "workers": view["workers"],
        "source_bucket": view["source_bucket"],
        "windowed": view["windowed"],
        **({"hint": view["hint"]} if "hint" in view else {}),
    }


def status(c: EndpointRequest) -> dict[str, Any]:
    """Couchbase's shape: {"apps": [{"name", "composite_status", ...}], "num_eventing_nodes": N}."""
    name = c.params.get("name")
    try:
        data = stats.function_status(c.data_dir, name)
    except NotFoundError:
        if name:
            raise
        return {"apps": [], "num_eventing_nodes": 0, "services": []}
    with open_store(c.data_dir, create=False) as store:
        nodes = len([n for n in Topology(store).nodes() if n["state"] != "joining"])
    return {"apps": [_status_app(v, nodes) for v in data["functions"]], "num_eventing_nodes": nodes,
            "services": data["services"]}


def all_stats(c: EndpointRequest) -> list[dict[str, Any]]:
    """?type=full: Couchbase's per-function groups (event_processing_stats, execution_stats, failure_stats)."""
    kind = c.query.get("type")
    if kind not in (None, "", "full"):
        raise ConfigError(f"type={kind} is not valid; use type=full or leave it out")
    if kind == "full":
        return [stats.couchbase_full_stats(c.data_dir, f["name"]) for f in list_functions(c)]
    return [{"function_name": f["name"], **stats.function_stats(c.data_dir, f["name"])} for f in list_functions(c)]


def reset_stats(c: EndpointRequest) -> Response:
    """POST /resetStatsCounters?appName=FN: the function's counters start again from zero (dead-letter counts
    stay: they follow the queue, which `dlq purge` empties)."""
    def run() -> Response:
        name = c.query.get("appName") or c.query.get("name")
        if not name:
            raise ConfigError("resetStatsCounters needs ?appName=FUNCTION")
        check_function_name(name)
        with open_store(c.data_dir, create=False) as store:
            store.get_function(name)
            store.reset_counters(name, keep_prefixes=("dlq_",))
        return JSONResponse({"name": name, "reset": True})

    return _couchbase_call(run)


def list_function_names(c: EndpointRequest) -> dict[str, Any] | Response:
    """Couchbase's /api/v1/list/functions: {"functions": [names]}, filtered by ?source_bucket=, ?source_scope=,
    ?function_scope=BUCKET.SCOPE (or BUCKET/SCOPE; here a function's scope is its source's) and ?deployed=."""
    def run() -> dict[str, Any]:
        deployed = c.flag(c.query, "deployed") if "deployed" in c.query else None
        scope = c.query.get("function_scope")
        wanted_scope = tuple(re.split(r"[./]", scope, maxsplit=1)) if scope else None
        names = []
        for f in list_functions(c):
            keyspace = auth.function_keyspace(f)
            if c.query.get("source_bucket") and keyspace.bucket != c.query["source_bucket"]:
                continue
            if c.query.get("source_scope") and keyspace.scope != c.query["source_scope"]:
                continue
            if wanted_scope and wanted_scope != (keyspace.bucket, keyspace.scope):
                continue
            if deployed is not None and (f["state"] in ("deployed", "paused", "pausing", "deploying")) != deployed:
                continue
            names.append(f["name"])
        return {"functions": names}

    return _couchbase_call(run)


def deployed_apps(c: EndpointRequest) -> dict[str, str]:
    """Couchbase's /getDeployedApps: the names of deployed (and paused) functions as keys."""
    return {f["name"]: "" for f in list_functions(c) if f["state"] in ("deployed", "paused", "pausing", "deploying")}


def running_apps(c: EndpointRequest) -> dict[str, str]:
    """Couchbase's /getRunningApps: the functions deployed and being processed by a running service."""
    try:
        views = stats.function_status(c.data_dir, None)["functions"]
    except NotFoundError:
        return {}
    return {v["name"]: "" for v in views if v["state"] == "deployed" and v["running"]}


SUPPORTED_CONFIG = {"enable_debugger": True}  # the debugger (`eventing debug`) is always available here


def get_config(c: EndpointRequest) -> dict[str, Any]:
    return dict(SUPPORTED_CONFIG)


def save_config(c: EndpointRequest) -> Response:
    """Couchbase's /api/v1/config: what this system has is kept; every other key is refused by name."""
    def run() -> Response:
        body = c.json_object()
        for key, value in body.items():
            if key not in SUPPORTED_CONFIG:
                raise ConfigError(f"config {key} is not supported here; the settings are "
                                  f"{', '.join(SUPPORTED_CONFIG)} (a function's own settings: "
                                  "POST /api/v1/functions/NAME/settings)")
            if value != SUPPORTED_CONFIG[key]:
                raise ConfigError(f"config {key}={json.dumps(value)} is not supported: the debugger (`eventing debug`) "
                                  f"is always available here; send {key}={json.dumps(SUPPORTED_CONFIG[key])} or leave it out")
        return JSONResponse({"restart_required": False, **SUPPORTED_CONFIG})

    return _couchbase_call(run)


def function_stats(c: EndpointRequest) -> dict[str, Any]:
    return stats.function_stats(c.data_dir, c.name)


def import_functions(c: EndpointRequest) -> Response:
    """This project's export or Couchbase's (one function or a list); Couchbase's status flags are carried out."""
    records, warnings = lifecycle.import_functions(c.data_dir, c.json(), deploying=_deploying(c))
    return _with_warnings([stats.function_view(r) for r in records], warnings)


def export_functions(c: EndpointRequest) -> list[dict[str, Any]] | Response:
    """Secrets masked (`*****`), or in clear with ?secrets=true for the admin token only."""
    secrets = c.flag(c.query, "secrets")
    if secrets and c.role != "admin":
        return JSONResponse({"error": "secrets=true needs the admin token; the read-only token was given",
                             "fix": "send the admin token, or leave out secrets=true to get the secrets as *****"},
                            status_code=403)
    name = c.query.get("name")
    if _couchbase_format(c):  # Couchbase's export: JavaScript functions (a Python one is named in a warning)
        def run() -> Response:
            names = [name] if name else [f["name"] for f in list_functions(c)]
            out, warnings = [], []
            for n in names:
                check_function_name(n)
                try:
                    exported, more = lifecycle.export_couchbase(c.data_dir, n, with_secrets=secrets)
                except ConfigError as exc:
                    if name:
                        raise
                    warnings.append(str(exc))
                    continue
                out.append(exported)
                warnings.extend(more)
            return _with_warnings(out, warnings)

        return _couchbase_call(run)
    if name:
        check_function_name(name)
        return [lifecycle.export_function(c.data_dir, name, with_secrets=secrets)]
    return [lifecycle.export_function(c.data_dir, f["name"], with_secrets=secrets) for f in list_functions(c)]


def app_log(c: EndpointRequest) -> Response:
    name = c.query.get("name")
    if not name:
        raise ConfigError("getAppLog needs ?name=FUNCTION")
    check_function_name(name)
    size = c.int_arg(c.query, "size", minimum=1) or DEFAULT_LOG_BYTES
    path = Path(c.data_dir) / APP_LOG_DIR / f"{name}.log"
    if not path.is_file():
        get_function(EndpointRequest(c.data_dir, {"name": name}, {}, b""))  # an unknown function is a 404
        return PlainTextResponse("")  # a known one that has not logged yet: an empty log, not an error
    with path.open("rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - size))
        data = f.read()
    return PlainTextResponse(data.decode("utf-8", errors="replace"))


# -- this project's own -------------------------------------------------------------------------------


def vbmap(c: EndpointRequest) -> dict[str, Any]:
    return stats.vbucket_map(c.data_dir, c.name)


def checkpoints(c: EndpointRequest) -> dict[str, Any]:
    return stats.checkpoint_view(c.data_dir, c.name, vb=c.int_arg(c.query, "vb", minimum=0),
                                 backlog_only=c.flag(c.query, "backlog"))


def _topology_call(c: EndpointRequest, fn: Callable[[Topology], Any]) -> Any:
    with open_store(c.data_dir, create=False) as store:
        return fn(Topology(store))


def _request_view(request: dict[str, Any] | None) -> dict[str, Any] | None:
    """A rebalance request with its 1024 target owners summed per node (the full list is noise here)."""
    if request is None or "owners" not in request:
        return request
    view = {k: v for k, v in request.items() if k != "owners"}
    counts: dict[str, int] = {}
    for node in request["owners"]:
        counts[node] = counts.get(node, 0) + 1
    view["vbuckets_after"] = counts
    return view


def list_nodes(c: EndpointRequest) -> dict[str, Any]:
    listing = _topology_call(c, nodes_ops.node_list)
    return {**listing, "last_rebalance": _request_view(listing["last_rebalance"])}


def add_node(c: EndpointRequest) -> dict[str, Any]:
    body = c.json_object()
    return _topology_call(c, lambda t: t.add_node(str(body.get("name", "")), body.get("ray_node_id")))


def remove_node(c: EndpointRequest) -> dict[str, Any]:
    return _topology_call(c, lambda t: t.remove_node(c.params["node"]))


def rebalance_plan(c: EndpointRequest) -> dict[str, Any]:
    return _topology_call(c, lambda t: {"dry_run": True, **nodes_ops.describe_plan(t, nodes_ops.plan(t))})


def rebalance_start(c: EndpointRequest) -> dict[str, Any]:
    def start(t: Topology) -> dict[str, Any]:
        plan = nodes_ops.plan(t)
        described = nodes_ops.describe_plan(t, plan)
        if nodes_ops.nothing_to_do(plan):
            return {"status": "nothing to do", **described}
        request = nodes_ops.start_rebalance(t, plan)
        return {"status": request["status"], "request": _request_view(request), **described}

    return _topology_call(c, start)


def rebalance_progress(c: EndpointRequest) -> dict[str, Any]:
    progress = _topology_call(c, nodes_ops.rebalance_progress)
    return {**progress, "request": _request_view(progress["request"])}


def _selector(c: EndpointRequest, source: dict[str, Any], action: str) -> dlq.DlqSelector:
    """The rows a dead-letter request names, checked here so that errors speak of parameters, not flags."""
    key, reason = source.get("key"), source.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise ConfigError(f"{c.shown(source, 'reason', reason)} is not valid; give one of the reasons: "
                          + ", ".join(sorted(dlq.DLQ_REASONS)))
    selector = dlq.DlqSelector(
        vb=c.int_arg(source, "vb", minimum=0), seqno=c.int_arg(source, "seqno", minimum=0),
        key=str(key) if key not in (None, "") else None,
        reason=reason or None, everything=c.flag(source, "all"),
    )
    q = source is c.query
    vb, seqno, key_, all_, replayed = (("vb=N", "seqno=S", "key=KEY", "all=true", "replayed=true") if q else
                                       ('"vb"', '"seqno"', '"key"', '{"all": true}', '{"replayed": true}'))
    if selector.seqno is not None and selector.vb is None:
        raise ConfigError(f"{seqno} needs {vb} too: a seqno is only unique within its vBucket")
    if selector.everything and (selector.vb is not None or selector.key is not None):
        raise ConfigError(f"{all_} selects every row; send it without {vb}, {seqno} or {key_}")
    if action == "show" and selector.vb is None and selector.key is None:
        raise ConfigError(f"dlq/show needs ?{vb}&{seqno} or ?{key_}; GET {FUNCTION_PATH.format(name=c.name)}/dlq lists every row")
    if action == "replay" and not (selector.everything or selector.narrows):
        raise ConfigError(f"dlq/replay needs {all_} or a selector: {vb} (with {seqno}), {key_} or \"reason\"")
    if action == "purge" and not (selector.everything or selector.narrows or c.flag(source, "replayed")):
        raise ConfigError(f"dlq/purge needs {all_}, {replayed} or a selector: {vb} (with {seqno}), {key_} or "
                          "\"reason\"")
    return selector


def dlq_list(c: EndpointRequest) -> list[dict[str, Any]]:
    """`?limit=N&offset=M`: rows M+1..M+N in (vBucket, seqno) order, for paging."""
    limit, offset = c.int_arg(c.query, "limit", minimum=1), c.int_arg(c.query, "offset") or 0
    if offset < 0:
        raise ConfigError(f"offset={offset} is negative; give the number of rows to skip (>= 0)")
    rows = dlq.list_rows(c.data_dir, c.name, reason=c.query.get("reason") or None,
                         limit=None if limit is None else limit + offset,
                         include_replayed=c.flag(c.query, "all"))
    return [dlq.row_view(r) for r in rows[offset:]]


def dlq_show(c: EndpointRequest) -> list[dict[str, Any]]:
    return [dlq.row_view(r, full=True) for r in dlq.show_rows(c.data_dir, c.name, _selector(c, c.query, "show"))]


def dlq_replay(c: EndpointRequest) -> dict[str, Any]:
    return dlq.replay(c.data_dir, c.name, _selector(c, c.json_object(), "replay")).to_dict()


def dlq_purge(c: EndpointRequest) -> dict[str, Any]:
    body = c.json_object()
    removed = dlq.purge(c.data_dir, c.name, _selector(c, body, "purge"), replayed_only=c.flag(body, "replayed"))
    return {"function": c.name, "purged": removed}


def windows(c: EndpointRequest) -> dict[str, Any]:
    from eventing.ops.windows import window_report

    limit = c.int_arg(c.query, "limit", minimum=0)  # 0: every row
    report = window_report(c.data_dir, c.name)
    if limit:
        report["results"] = report["results"][-limit:]
    return report


def verify(c: EndpointRequest) -> dict[str, Any]:
    from eventing.ops.verify import verify_function

    report = verify_function(c.data_dir, c.name, ledger=c.query.get("ledger") or None)
    return {**report.to_dict(), "summary": report.summary()}


def _collection_keyspace(c: EndpointRequest) -> Any:
    from eventing.core.keyspaces import Keyspace

    return Keyspace(c.params["bucket"], c.params["scope"], c.params["collection"]).check()


def _admin_only(c: EndpointRequest, action: str) -> Response | None:
    if c.role == "admin":
        return None
    return JSONResponse({"error": f"{action} needs the admin role; the caller is not an admin",
                         "fix": "send the admin token or an admin user's credentials"}, status_code=403)


def list_collections(c: EndpointRequest) -> list[dict[str, Any]]:
    from eventing.ops import buckets

    return buckets.list_collections(c.data_dir, c.params["bucket"])


def create_collection(c: EndpointRequest) -> dict[str, Any] | Response:
    from eventing.ops import buckets

    return _admin_only(c, "creating a collection") or buckets.create_collection(c.data_dir, _collection_keyspace(c))


def drop_collection(c: EndpointRequest) -> dict[str, Any] | Response:
    from eventing.ops import buckets

    return _admin_only(c, "dropping a collection") or buckets.drop_collection(c.data_dir, _collection_keyspace(c))


def openapi(c: EndpointRequest) -> dict[str, Any]:
    from eventing.http.openapi import openapi_document

    return openapi_document(ENDPOINTS)


def metrics(c: EndpointRequest) -> Response:
    from eventing.http.metrics import CONTENT_TYPE, render

    return Response(render(c.data_dir), media_type=CONTENT_TYPE)


FUNCTION_PATH = "/api/v1/functions/{name}"  # the path of one function; its endpoints extend it
COLLECTION_PATH = "/api/v1/buckets/{bucket}/scopes/{scope}/collections/{collection}"
ENDPOINTS: list[Endpoint] = [
    Endpoint("GET", "/api/v1/functions", "functions", "every function: definition, handler source, state",
             list_functions, couchbase=True),
    Endpoint("GET", FUNCTION_PATH, "functions", "one function: definition, handler source, state", get_function, couchbase=True),
    Endpoint("POST", FUNCTION_PATH, "functions", "create or update a function (a definition with handler_source; "
             "undeployed or paused only)", save_function, couchbase=True),
    Endpoint("POST", "/api/v1/functions", "functions", "create or update functions: one or a list, in Couchbase's "
             "format or this project's (Couchbase's deployment_status/processing_status are carried out)",
             create_functions, couchbase=True),
    Endpoint("GET", "/api/v1/list/functions", "functions", "function names: {\"functions\": [...]} (?source_bucket=, "
             "?source_scope=, ?function_scope=BUCKET.SCOPE, ?deployed=)", list_function_names, couchbase=True),
    Endpoint("GET", "/getDeployedApps", "status", "deployed (and paused) functions, by name", deployed_apps,
             couchbase=True),
    Endpoint("GET", "/getRunningApps", "status", "functions a running service processes, by name", running_apps,
             couchbase=True),
    Endpoint("POST", "/resetStatsCounters", "status", "reset a function's counters (?appName=)", reset_stats,
             couchbase=True),
    Endpoint("GET", "/api/v1/config", "meta", "the eventing settings this system has (enable_debugger)", get_config,
             couchbase=True),
    Endpoint("POST", "/api/v1/config", "meta", "change them (other keys are refused by name)", save_config,
             couchbase=True),
    Endpoint("GET", FUNCTION_PATH + "/appcode/checksum", "functions", "the handler source's SHA-256", appcode_checksum,
             couchbase=True),
    Endpoint("DELETE", FUNCTION_PATH, "functions", "delete an undeployed function", delete_function, couchbase=True),
    Endpoint("POST", FUNCTION_PATH + "/deploy", "lifecycle", "deploy; optional body {\"boundary\": \"everything\"|\"from_now\"}",
             deploy, couchbase=True),
    Endpoint("POST", FUNCTION_PATH + "/pause", "lifecycle", "pause: workers checkpoint and stop (?wait=60 seconds)", pause,
             couchbase=True),
    Endpoint("POST", FUNCTION_PATH + "/resume", "lifecycle", "resume right after the checkpoints", resume, couchbase=True),
    Endpoint("POST", FUNCTION_PATH + "/undeploy", "lifecycle", "undeploy: workers stop, checkpoints are dropped (?wait=60)",
             undeploy, couchbase=True),
    Endpoint("GET", FUNCTION_PATH + "/settings", "functions", "the definition without name and handler", get_settings,
             couchbase=True),
    Endpoint("POST", FUNCTION_PATH + "/settings", "functions", "merge fields into the definition (undeployed or paused only)",
             save_settings, couchbase=True),
    Endpoint("GET", FUNCTION_PATH + "/appcode", "functions", "the handler source (text/plain)", get_appcode, couchbase=True),
    Endpoint("POST", FUNCTION_PATH + "/appcode", "functions", "replace the handler source (text body; validated first)",
             save_appcode, couchbase=True),
    Endpoint("GET", "/api/v1/status", "status", "states of every function, eventing nodes, live services", status,
             couchbase=True),
    Endpoint("GET", "/api/v1/status/{name}", "status", "state of one function", status, couchbase=True),
    Endpoint("GET", "/api/v1/stats", "status", "counters of every function", all_stats, couchbase=True),
    Endpoint("GET", FUNCTION_PATH + "/stats", "status", "counters of one function", function_stats),
    Endpoint("POST", "/api/v1/import", "functions", "import definitions (a list or one object, as exported)",
             import_functions, couchbase=True),
    Endpoint("GET", "/api/v1/export", "functions", "export every definition with its handler (?name= for one; URL "
             "binding secrets as *****, in clear with ?secrets=true for the admin token)",
             export_functions, couchbase=True),
    Endpoint("GET", "/getAppLog", "logs", "the newest part of a function's application log (?name=, ?size=bytes; "
             "empty until the handler logs)",
             app_log, couchbase=True),
    Endpoint("GET", FUNCTION_PATH + "/vbmap", "vbuckets", "which worker owns which vBucket ranges", vbmap),
    Endpoint("GET", FUNCTION_PATH + "/checkpoints", "vbuckets", "per vBucket: checkpoint, high seqno, backlog, owner, epoch "
             "(?vb=N for one, ?backlog=1 for those behind; 409 if not deployed)", checkpoints),
    Endpoint("GET", "/api/v1/nodes", "nodes", "eventing nodes, their vBucket counts, the last rebalance", list_nodes),
    Endpoint("POST", "/api/v1/nodes", "nodes", "add a node: {\"name\": ..., \"ray_node_id\": ...}", add_node),
    Endpoint("DELETE", "/api/v1/nodes/{node}", "nodes", "remove a node (it leaves at the next rebalance)",
             remove_node),
    Endpoint("GET", "/api/v1/rebalance", "nodes", "the last rebalance and its progress (0..1)", rebalance_progress),
    Endpoint("GET", "/api/v1/rebalance/plan", "nodes", "the minimal-move plan, changing nothing", rebalance_plan),
    Endpoint("POST", "/api/v1/rebalance", "nodes", "start a rebalance (the running service carries it out)",
             rebalance_start, status=202),
    Endpoint("GET", FUNCTION_PATH + "/dlq", "dlq", "dead letters (?reason=, ?limit=, ?offset= rows to skip, ?all=1 includes "
             "replayed)", dlq_list),
    Endpoint("GET", FUNCTION_PATH + "/dlq/show", "dlq", "dead letters in full (?vb=&seqno= or ?key=)", dlq_show),
    Endpoint("POST", FUNCTION_PATH + "/dlq/replay", "dlq", "replay with the current handler: {\"all\": true} or "
             "{\"vb\", \"seqno\", \"key\", \"reason\"}", dlq_replay),
    Endpoint("POST", FUNCTION_PATH + "/dlq/purge", "dlq", "delete dead letters: {\"all\": true}, {\"replayed\": true} or a "
             "selector", dlq_purge),
    Endpoint("GET", FUNCTION_PATH + "/windows", "windows", "window results with the watermark (?limit=N: the last N rows)",
             windows),
    Endpoint("GET", FUNCTION_PATH + "/verify", "verify", "check the function against its ledger bucket (?ledger=BUCKET)", verify),
    Endpoint("GET", "/api/v1/buckets/{bucket}/collections", "collections",
             "the collections of a bucket: keyspace, scope, collection, id, documents", list_collections),
    Endpoint("POST", COLLECTION_PATH, "collections", "create a collection (and its scope); admin only",
             create_collection, status=201),
    Endpoint("DELETE", COLLECTION_PATH, "collections", "drop a collection and its documents (409 while a deployed or "
             "paused function reads or binds it); admin only", drop_collection),
    Endpoint("GET", "/api/v1/openapi.json", "meta", "this API as OpenAPI 3.1", openapi),
    Endpoint("GET", "/metrics", "metrics", "Prometheus metrics (text format)", metrics),
]


# -- plumbing -------------------------------------------------------------------------------------------

STATUS_OF: list[tuple[type[BaseException], int]] = [
    (NotFoundError, 404),
    (LifecycleError, 409),
    (FencedError, 409),
    (OrderViolationError, 409),
    (StoreLockedError, 503),
    (StoreCorruptError, 500),
    (EventingError, 400),
    (InvalidKeyError, 400),
]


# The shared messages name CLI commands and flags where the CLI is the way; over HTTP the endpoint is.
REST_WORDING: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"`eventing dlq list ([\w-]+)`"), r"GET /api/v1/functions/\1/dlq"),
    (re.compile(r"`eventing dlq purge ([\w-]+) --replayed`"),
     r'POST /api/v1/functions/\1/dlq/purge with {"replayed": true}'),
    (re.compile(r"`eventing (deploy|undeploy|pause|resume) ([\w-]+)`"), r"POST /api/v1/functions/\2/\1"),
    (re.compile(r"`eventing status ([\w-]+)`"), r"GET /api/v1/status/\1"),
    (re.compile(r"`eventing status`"), "GET /api/v1/status"),
    (re.compile(r"`eventing stats ([\w-]+)`"), r"GET /api/v1/functions/\1/stats"),
    (re.compile(r"`eventing export ([\w-]+)`"), r"GET /api/v1/export?name=\1"),
    (re.compile(r"--ledger BUCKET"), "?ledger=BUCKET"),
    (re.compile(r"`eventing collection create ([^.`\s]+)\.([^.`\s]+)\.([^.`\s]+)`"),
     r"POST /api/v1/buckets/\1/scopes/\2/collections/\3"),
    (re.compile(r"`eventing collection list ([^`\s]+)`"), r"GET /api/v1/buckets/\1/collections"),
    (re.compile(r"--limit (-?\d+)"), r"limit=\1"),
    (re.compile(r"--wait\b"), "?wait="),
]


def rest_wording(message: str) -> str:
    for pattern, replacement in REST_WORDING:
        message = pattern.sub(replacement, message)
    return message


def error_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The CLI's message in REST terms; its last clause after '; ' is the fix when the message has one."""
    message = rest_wording(str(exc))
    status = next(code for kind, code in STATUS_OF if isinstance(exc, kind))
    _, sep, fix = message.rpartition("; ")
    return status, {"error": message, "fix": fix if sep else None}


def _endpoint(ep: Endpoint) -> Callable[[Request], Any]:
    async def run(request: Request) -> Response:
        config = request.app.state.config
        identity = auth.caller_identity(request) if auth.IDENTITY_SCOPE_KEY in request.scope else auth.LOCAL_IDENTITY
        call = EndpointRequest(config.data_dir, dict(request.path_params), dict(request.query_params), await request.body(),
                               "admin" if identity.is_admin else "read", identity)
        try:
            if "name" in call.params:
                check_function_name(call.params["name"])
            if not identity.is_admin:  # each endpoint's role, against the keyspace of the function it acts on
                try:
                    body = call.json(default={}) if ep.method in auth.WRITE_METHODS and not ep.path.endswith("/appcode") else None
                except ConfigError:
                    body = None  # the endpoint itself answers a bad body (400) once the caller may call it
                await run_in_threadpool(auth.authorize_endpoint, identity, ep.method, ep.path, call.params, call.query,
                                        body, config.data_dir)
            result = await run_in_threadpool(ep.handler, call)
            if ep.path in auth.LISTINGS and not identity.is_admin:
                result = auth.filter_listing(result, await run_in_threadpool(auth.visible_functions, identity, config.data_dir))
        except auth.AuthError as refused:
            return JSONResponse(refused.body(), status_code=refused.status, headers=refused.headers)
        except (EventingError, InvalidKeyError) as exc:
            code, body = error_body(exc)
            return JSONResponse(body, status_code=code)
        if isinstance(result, Response):
            return result
        return JSONResponse(result, status_code=ep.status)

    run.__name__ = ep.handler.__name__
    return run


async def _unknown_function_path(request: Request) -> Response:
    """Anything else under /api/v1/functions/: a bad name gets the naming rule, a good one a 404."""
    first = request.path_params["rest"].split("/", 1)[0]
    try:
        check_function_name(first)
    except ConfigError as exc:
        code, body = error_body(exc)
        return JSONResponse(body, status_code=code)
    raise HTTPException(404)


async def _console(request: Request) -> Response:
    return FileResponse(STATIC_DIR / "index.html", headers={"cache-control": "no-store"})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")
        return JSONResponse({"error": f"{request.method} is not allowed on {request.url.path}; it answers {allow}",
                             "fix": f"use {allow}" + (" (POST creates and updates, as in Couchbase's API)"
                                                      if request.method in ("PUT", "PATCH") and "POST" in allow else "")
                             + "; see GET /api/v1/openapi.json for the methods of each path"},
                            status_code=405, headers={"Allow": allow})
    return JSONResponse({"error": f"no endpoint {request.url.path}",
                         "fix": "see GET /api/v1/openapi.json for the endpoints"}, status_code=exc.status_code)


EXCEPTION_HANDLERS = {HTTPException: _http_error}


class _AnyMethod:
    """An ASGI endpoint that takes every method (a Route given a plain function would answer only the methods
    listed, and let a catch-all route answer the others), so that each path decides: its endpoints by method,
    and for any other method a 405 with an Allow header naming the methods it answers."""

    def __init__(self, handlers: dict[str, Callable[[Request], Any]], fallback: Callable[[Request], Any] | None = None):
        self.handlers = handlers
        self.fallback = fallback
        self.allow = ", ".join([*handlers, *(["HEAD"] if "GET" in handlers and "HEAD" not in handlers else [])])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        handler = self.handlers.get(request.method) or (self.handlers.get("GET") if request.method == "HEAD" else None)
        handler = handler or self.fallback
        if handler is None:
            raise HTTPException(405, headers={"Allow": self.allow})
        response = await handler(request)
        await response(scope, receive, send)


def routes() -> list[BaseRoute]:
    by_path: dict[str, dict[str, Endpoint]] = {}
    for ep in ENDPOINTS:
        by_path.setdefault(ep.path, {})[ep.method] = ep
    out: list[BaseRoute] = [Route("/", _console, methods=["GET"])]
    for path, methods in by_path.items():
        out.append(Route(path, _AnyMethod({m: _endpoint(ep) for m, ep in methods.items()})))
    # Any method under /api/v1/functions/ that no route above has: a bad name's rule, or a 404.
    out.append(Route("/api/v1/functions/{rest:path}", _AnyMethod({}, fallback=_unknown_function_path)))
    out.append(Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"))
    return out
