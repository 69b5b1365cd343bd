"""The endpoints that only Couchbase Eventing's REST API has, kept so that its clients and scripts work
here: `/api/v1/list/functions` (names, filtered), `/getDeployedApps`, `/getRunningApps`,
`/resetStatsCounters`, `/api/v1/config` (the eventing settings this system has) and `/getAppLog` (the
newest part of a function's application log). Their errors come back in Couchbase's shape.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.responses import JSONResponse, PlainTextResponse, Response

from eventing.core.definition import check_function_name
from eventing.core.function_names import function_scope
from eventing.errors import ConfigError, NotFoundError
from eventing.http import function_access
from eventing.http.routes.functions import list_functions, stored_function
from eventing.http.routes.request import EndpointRequest, _couchbase_call, resolve_name
from eventing.ops import stats

DEFAULT_LOG_BYTES = 40_960  # like Couchbase's getAppLog: the newest part of the log


def reset_stats(c: EndpointRequest) -> Response:
    """POST /resetStatsCounters?appName=FN: the function's counters start again from zero (dead-letter counts
    stay: they follow the queue, which `dlq purge` empties)."""

    def run() -> Response:
        name = c.query.get("appName") or c.query.get("name")
        if not name:
            raise ConfigError("resetStatsCounters needs ?appName=FUNCTION")
        check_function_name(name)
        name = resolve_name(c.state, name, c.query)
        with c.state.metadata as store:
            store.get_function(name)
            store.reset_counters(name, keep_prefixes=("dlq_",))
        return JSONResponse({"name": name, "reset": True})

    return _couchbase_call(run)


def list_function_names(c: EndpointRequest) -> dict[str, Any] | Response:
    """Couchbase's /api/v1/list/functions: {"functions": [names]} (a function in a namespace by its full
    name), filtered by ?source_bucket=, ?source_scope=, ?function_scope=BUCKET.SCOPE (or BUCKET/SCOPE; `*.*`
    is the global namespace) and ?deployed=."""

    def run() -> dict[str, Any]:
        deployed = c.flag(c.query, "deployed") if "deployed" in c.query else None
        scope = c.query.get("function_scope")
        wanted_scope = (
            tuple(re.split(r"[/]", scope, maxsplit=1) if "/" in scope else scope.rsplit(".", 1))
            if scope
            else None
        )
        names = []
        for f in list_functions(c):
            keyspace = function_access.function_keyspace(f)
            if c.query.get("source_bucket") and keyspace.bucket != c.query["source_bucket"]:
                continue
            if c.query.get("source_scope") and keyspace.scope != c.query["source_scope"]:
                continue
            if wanted_scope and wanted_scope != function_scope(f["name"]):
                continue
            if (
                deployed is not None
                and (f["state"] in ("deployed", "paused", "pausing", "deploying")) != deployed
            ):
                continue
            names.append(f["name"])
        return {"functions": names}

    return _couchbase_call(run)


def deployed_apps(c: EndpointRequest) -> dict[str, str]:
    """Couchbase's /getDeployedApps: the names of deployed (and paused) functions as keys."""
    return {
        f["name"]: ""
        for f in list_functions(c)
        if f["state"] in ("deployed", "paused", "pausing", "deploying")
    }


def running_apps(c: EndpointRequest) -> dict[str, str]:
    """Couchbase's /getRunningApps: the functions deployed and being processed by a running service."""
    try:
        views = stats.function_status(c.state, None)["functions"]
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
                raise ConfigError(
                    f"config {key} is not supported here; the settings are "
                    f"{', '.join(SUPPORTED_CONFIG)} (a function's own settings: "
                    "POST /api/v1/functions/NAME/settings)"
                )
            if value != SUPPORTED_CONFIG[key]:
                raise ConfigError(
                    f"config {key}={json.dumps(value)} is not supported: the debugger (`eventing debug`) "
                    f"is always available here; send {key}={json.dumps(SUPPORTED_CONFIG[key])} or leave it "
                    "out"
                )
        return JSONResponse({"restart_required": False, **SUPPORTED_CONFIG})

    return _couchbase_call(run)


def app_log(c: EndpointRequest) -> Response:
    name = c.query.get("name")
    if not name:
        raise ConfigError("getAppLog needs ?name=FUNCTION")
    check_function_name(name)
    name = resolve_name(c.state, name, c.query)
    size = c.int_arg(c.query, "size", minimum=1) or DEFAULT_LOG_BYTES
    data = c.state.app_logs.tail_bytes(name, size)
    if data is None:
        stored_function(EndpointRequest(c.state, {"name": name}, {}, b""))  # an unknown function is a 404
        return PlainTextResponse("")  # a known one that has not logged yet: an empty log, not an error
    return PlainTextResponse(data.decode("utf-8", errors="replace"))
