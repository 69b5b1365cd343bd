"""The REST endpoints: Couchbase Eventing's shapes (port 8096 there) plus this project's own views.

Every endpoint calls the same functions the CLI calls (eventing.control.lifecycle, eventing.ops.*), so
the rules and the messages are the CLI's. Errors come back as `{"error": message, "fix": hint}` with
400 (bad input), 404 (unknown thing), 409 (illegal state) or 503 (store busy). One table, ENDPOINTS,
drives the routes, the OpenAPI description and the docs. This module owns that table and the ASGI side:
each endpoint's route (role checks, errors, 405s), the console page and the static files. The endpoints
themselves live by job: functions (functions and their lifecycle), couchbase (the
endpoints only Couchbase has), status (status, stats, metrics), ops (nodes, rebalance,
dead letters, windows, verify) and collections; request holds what they share.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from eventing.core.definition import check_function_name
from eventing.errors import ConfigError, EventingError, InvalidKeyError, NotFoundError
from eventing.http import auth, function_access
from eventing.http.dataapi.errors import retry_after
from eventing.http.routes.collections import (
    create_collection,
    drop_collection,
    list_collections,
    resync_collection,
)
from eventing.http.routes.couchbase import (
    app_log,
    deployed_apps,
    get_config,
    list_function_names,
    reset_stats,
    running_apps,
    save_config,
)
from eventing.http.routes.couchbase_stats import (
    dcp_events_remaining,
    delete_all,
    execution_stats,
    failure_stats,
    get_deployment_config,
    latency_stats,
    list_functions_query,
    save_deployment_config,
)
from eventing.http.routes.functions import (
    appcode_checksum,
    create_functions,
    delete_function,
    deploy,
    export_functions,
    get_appcode,
    get_function,
    get_settings,
    import_functions,
    list_functions_endpoint,
    pause,
    resume,
    save_appcode,
    save_function,
    save_settings,
    undeploy,
)
from eventing.http.routes.ops import (
    add_node,
    dlq_list,
    dlq_purge,
    dlq_replay,
    dlq_show,
    list_nodes,
    rebalance_plan,
    rebalance_progress,
    rebalance_start,
    remove_node,
    verify,
    windows,
)
from eventing.http.routes.pools import bucket, buckets, node_services, pools, pools_default
from eventing.http.routes.request import (
    FUNCTION_PATH,
    Endpoint,
    EndpointRequest,
    couchbase_error,
    error_body,
    resolve_name,
)
from eventing.http.routes.status import all_stats, checkpoints, function_stats, metrics, status, vbmap

STATIC_DIR = Path(__file__).parent.parent / "static"  # eventing/http/static


def openapi(c: EndpointRequest) -> dict[str, Any]:
    from eventing.http.openapi import openapi_document

    return openapi_document(ENDPOINTS)


COLLECTION_PATH = "/api/v1/buckets/{bucket}/scopes/{scope}/collections/{collection}"
ENDPOINTS: list[Endpoint] = [
    Endpoint(
        "GET",
        "/api/v1/functions",
        "functions",
        "every function in Couchbase's function JSON (?format=eventing: "
        "this project's definition, handler source, state)",
        list_functions_endpoint,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        FUNCTION_PATH,
        "functions",
        "one function in Couchbase's function JSON (?format=eventing: this "
        "project's shape); ?bucket=&scope= name its namespace",
        get_function,
        couchbase=True,
    ),
    Endpoint(
        "POST",
        FUNCTION_PATH,
        "functions",
        "create or update a function (a definition with handler_source; undeployed or paused only)",
        save_function,
        couchbase=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/functions",
        "functions",
        "create or update functions: one or a list, in Couchbase's "
        "format or this project's (Couchbase's deployment_status/processing_status are carried out)",
        create_functions,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/api/v1/list/functions",
        "functions",
        'function names: {"functions": [...]} (?source_bucket=, '
        "?source_scope=, ?function_scope=BUCKET.SCOPE, ?deployed=)",
        list_function_names,
        couchbase=True,
    ),
    Endpoint(
        "DELETE",
        "/api/v1/functions",
        "functions",
        "delete every undeployed function: Couchbase's "
        '[{"code", "info"}] per function (22 for one still deployed or paused, which stays)',
        delete_all,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/api/v1/list/functions/query",
        "functions",
        'function names: {"functions": [...]} '
        "(?deployed=, ?source_bucket=, ?function_type=sbm|notsbm: writes to its own source or not)",
        list_functions_query,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        FUNCTION_PATH + "/config",
        "functions",
        "the function's deployment config (Couchbase's depcfg: source, metadata keyspace, bindings)",
        get_deployment_config,
        couchbase=True,
    ),
    Endpoint(
        "POST",
        FUNCTION_PATH + "/config",
        "functions",
        "replace the deployment config (undeployed or paused only)",
        save_deployment_config,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/getExecutionStats",
        "status",
        "one function's execution statistics (?name=, ?bucket=&scope=; deployed or paused)",
        execution_stats,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/getFailureStats",
        "status",
        "one function's failure statistics (?name=, ?bucket=&scope=)",
        failure_stats,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/getLatencyStats",
        "status",
        "one function's handler latency histogram: microseconds -> calls (?name=, ?bucket=&scope=)",
        latency_stats,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/getDcpEventsRemaining",
        "status",
        'one function\'s backlog: {"dcp_backlog": N} (?name=, ?bucket=&scope=)',
        dcp_events_remaining,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/getDeployedApps",
        "status",
        "deployed (and paused) functions, by name",
        deployed_apps,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/getRunningApps",
        "status",
        "functions a running service processes, by name",
        running_apps,
        couchbase=True,
    ),
    Endpoint(
        "POST",
        "/resetStatsCounters",
        "status",
        "reset a function's counters (?appName=)",
        reset_stats,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/api/v1/config",
        "meta",
        "the eventing settings this system has (enable_debugger)",
        get_config,
        couchbase=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/config",
        "meta",
        "change them (other keys are refused by name)",
        save_config,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        FUNCTION_PATH + "/appcode/checksum",
        "functions",
        "the handler source's SHA-256",
        appcode_checksum,
        couchbase=True,
    ),
    Endpoint(
        "DELETE", FUNCTION_PATH, "functions", "delete an undeployed function", delete_function, couchbase=True
    ),
    Endpoint(
        "POST",
        FUNCTION_PATH + "/deploy",
        "lifecycle",
        'deploy; optional body {"boundary": "everything"|"from_now"}',
        deploy,
        couchbase=True,
    ),
    Endpoint(
        "POST",
        FUNCTION_PATH + "/pause",
        "lifecycle",
        "pause: workers checkpoint and stop (?wait=60 seconds)",
        pause,
        couchbase=True,
    ),
    Endpoint(
        "POST",
        FUNCTION_PATH + "/resume",
        "lifecycle",
        "resume right after the checkpoints",
        resume,
        couchbase=True,
    ),
    Endpoint(
        "POST",
        FUNCTION_PATH + "/undeploy",
        "lifecycle",
        "undeploy: workers stop, checkpoints are dropped (?wait=60)",
        undeploy,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        FUNCTION_PATH + "/settings",
        "functions",
        "the definition without name and handler",
        get_settings,
        couchbase=True,
    ),
    Endpoint(
        "POST",
        FUNCTION_PATH + "/settings",
        "functions",
        "merge fields into the definition (undeployed or paused only)",
        save_settings,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        FUNCTION_PATH + "/appcode",
        "functions",
        "the handler source (text/plain)",
        get_appcode,
        couchbase=True,
    ),
    Endpoint(
        "POST",
        FUNCTION_PATH + "/appcode",
        "functions",
        "replace the handler source (text body; validated first)",
        save_appcode,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/api/v1/status",
        "status",
        "states of every function, eventing nodes, live services",
        status,
        couchbase=True,
    ),
    Endpoint("GET", "/api/v1/status/{name}", "status", "state of one function", status, couchbase=True),
    Endpoint("GET", "/api/v1/stats", "status", "counters of every function", all_stats, couchbase=True),
    Endpoint("GET", FUNCTION_PATH + "/stats", "status", "counters of one function", function_stats),
    Endpoint(
        "POST",
        "/api/v1/import",
        "functions",
        "import definitions (a list or one object, as exported)",
        import_functions,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/api/v1/export",
        "functions",
        "export every definition with its handler (?name= for one; URL "
        "binding secrets as *****, in clear with ?secrets=true for the admin token)",
        export_functions,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/getAppLog",
        "logs",
        "the newest part of a function's application log (?name=, ?size=bytes; empty until the handler logs)",
        app_log,
        couchbase=True,
    ),
    Endpoint("GET", FUNCTION_PATH + "/vbmap", "vbuckets", "which worker owns which vBucket ranges", vbmap),
    Endpoint(
        "GET",
        FUNCTION_PATH + "/checkpoints",
        "vbuckets",
        "per vBucket: checkpoint, high seqno, backlog, owner, epoch "
        "(?vb=N for one, ?backlog=1 for those behind; 409 if not deployed)",
        checkpoints,
    ),
    Endpoint(
        "GET",
        "/api/v1/nodes",
        "nodes",
        "eventing nodes, their vBucket counts, the last rebalance",
        list_nodes,
    ),
    Endpoint("POST", "/api/v1/nodes", "nodes", 'add a node: {"name": ..., "ray_node_id": ...}', add_node),
    Endpoint(
        "DELETE",
        "/api/v1/nodes/{node}",
        "nodes",
        "remove a node (it leaves at the next rebalance)",
        remove_node,
    ),
    Endpoint(
        "GET", "/api/v1/rebalance", "nodes", "the last rebalance and its progress (0..1)", rebalance_progress
    ),
    Endpoint(
        "GET", "/api/v1/rebalance/plan", "nodes", "the minimal-move plan, changing nothing", rebalance_plan
    ),
    Endpoint(
        "POST",
        "/api/v1/rebalance",
        "nodes",
        "start a rebalance (the running service carries it out)",
        rebalance_start,
        status=202,
    ),
    Endpoint(
        "GET",
        FUNCTION_PATH + "/dlq",
        "dlq",
        "dead letters (?reason=, ?limit=, ?offset= rows to skip, ?all=1 includes replayed)",
        dlq_list,
    ),
    Endpoint(
        "GET", FUNCTION_PATH + "/dlq/show", "dlq", "dead letters in full (?vb=&seqno= or ?key=)", dlq_show
    ),
    Endpoint(
        "POST",
        FUNCTION_PATH + "/dlq/replay",
        "dlq",
        'replay with the current handler: {"all": true} or {"vb", "seqno", "key", "reason"}',
        dlq_replay,
    ),
    Endpoint(
        "POST",
        FUNCTION_PATH + "/dlq/purge",
        "dlq",
        'delete dead letters: {"all": true}, {"replayed": true} or a selector',
        dlq_purge,
    ),
    Endpoint(
        "GET",
        FUNCTION_PATH + "/windows",
        "windows",
        "window results with the watermark (?limit=N: the last N rows)",
        windows,
    ),
    Endpoint(
        "GET",
        FUNCTION_PATH + "/verify",
        "verify",
        "check the function against its ledger bucket (?ledger=BUCKET)",
        verify,
    ),
    Endpoint(
        "GET",
        "/api/v1/buckets/{bucket}/collections",
        "collections",
        "the collections of a bucket: keyspace, scope, collection, id, documents",
        list_collections,
    ),
    Endpoint(
        "POST",
        COLLECTION_PATH,
        "collections",
        "create a collection (and its scope); with a JSON body "
        '{"mirror": URL, "table": "schema.table"}, one that mirrors a PostgreSQL table; admin only',
        create_collection,
        status=201,
    ),
    Endpoint(
        "POST",
        COLLECTION_PATH + "/resync",
        "collections",
        "take a new snapshot of a mirror (a new slot); admin only",
        resync_collection,
    ),
    Endpoint(
        "DELETE",
        COLLECTION_PATH,
        "collections",
        "drop a collection and its documents; deployed or paused "
        "functions that read or bind it are undeployed first; admin only",
        drop_collection,
    ),
    Endpoint(
        "GET",
        "/pools",
        "cluster",
        "the cluster manager's pools (Couchbase's tools start here)",
        pools,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/pools/default",
        "cluster",
        "this node, its services and the buckets",
        pools_default,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/pools/default/nodeServices",
        "cluster",
        "the ports of this node's services (kv, mgmt, eventingAdminPort)",
        node_services,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/pools/default/buckets",
        "cluster",
        "every bucket with its vBucket map",
        buckets,
        couchbase=True,
    ),
    Endpoint(
        "GET",
        "/pools/default/buckets/{bucket}",
        "cluster",
        "a bucket and its vBucket map (1,024 vBuckets on this node)",
        bucket,
        couchbase=True,
    ),
    Endpoint(
        "GET", "/pools/default/b/{bucket}", "cluster", "the bucket map the SDKs read", bucket, couchbase=True
    ),
    Endpoint("GET", "/api/v1/openapi.json", "meta", "this API as OpenAPI 3.1", openapi),
    Endpoint("GET", "/metrics", "metrics", "Prometheus metrics (text format)", metrics),
]


# -- plumbing -------------------------------------------------------------------------------------------


def _endpoint(ep: Endpoint) -> Callable[[Request], Any]:
    async def run(request: Request) -> Response:
        config = request.app.state.config
        if auth.IDENTITY_SCOPE_KEY not in request.scope:  # fail closed: an endpoint the guard did not cover
            return JSONResponse(
                {"error": f"{ep.path} was reached without authentication", "fix": "report this as a bug"}, 500
            )
        identity = auth.caller_identity(request)
        call = EndpointRequest(
            config.state,
            dict(request.path_params),
            dict(request.query_params),
            await request.body(),
            "admin" if identity.is_admin else "read",
            identity,
        )
        try:
            if "name" in call.params:
                check_function_name(call.params["name"])
                call.params["name"] = await run_in_threadpool(
                    resolve_name,
                    config.state,
                    call.params["name"],
                    call.query,
                    creating=ep.method == "POST" and ep.path == FUNCTION_PATH,
                )
            if not identity.is_admin:  # each endpoint's role, against the keyspace of the function it acts on
                try:
                    body = (
                        call.json(default={})
                        if ep.method in auth.WRITE_METHODS and not ep.path.endswith("/appcode")
                        else None
                    )
                except ConfigError:
                    body = None  # the endpoint itself answers a bad body (400) once the caller may call it
                await run_in_threadpool(
                    function_access.authorize_endpoint,
                    identity,
                    ep.method,
                    ep.path,
                    call.params,
                    call.query,
                    body,
                    config.state,
                )
            result = await run_in_threadpool(ep.handler, call)
            if ep.path in function_access.LISTINGS and ep.method == "GET" and not identity.is_admin:
                visible = await run_in_threadpool(function_access.visible_functions, identity, config.state)
                if isinstance(result, JSONResponse) and result.status_code == 200:  # a listing with warnings:
                    # cut, without the warnings (they may name functions this caller does not cover)
                    result = JSONResponse(
                        function_access.filter_listing(json.loads(bytes(result.body)), visible)
                    )
                else:
                    result = function_access.filter_listing(result, visible)
        except auth.AuthError as refused:
            return JSONResponse(refused.body(), status_code=refused.status, headers=refused.headers)
        except (EventingError, InvalidKeyError) as exc:
            if isinstance(exc, NotFoundError) and not identity.can(auth.CLUSTER_READ):
                exc = NotFoundError(_KNOWN.sub("", str(exc)))  # functions it may not see stay unnamed
            if ep.couchbase:  # Couchbase's name, code and description beside this API's error and fix
                return couchbase_error(exc)
            code, body = error_body(exc)
            return JSONResponse(body, status_code=code, headers=retry_after(exc) or None)
        if isinstance(result, Response):
            return result
        return JSONResponse(result, status_code=ep.status)

    run.__name__ = ep.handler.__name__
    return run


_KNOWN = re.compile(r" \(known: [^)]*\)")  # the function names an unknown name's error lists


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
        return JSONResponse(
            {
                "error": f"{request.method} is not allowed on {request.url.path}; it answers {allow}",
                "fix": f"use {allow}"
                + (
                    " (POST creates and updates, as in Couchbase's API)"
                    if request.method in ("PUT", "PATCH") and "POST" in allow
                    else ""
                )
                + "; see GET /api/v1/openapi.json for the methods of each path",
            },
            status_code=405,
            headers={"Allow": allow},
        )
    return JSONResponse(
        {"error": f"no endpoint {request.url.path}", "fix": "see GET /api/v1/openapi.json for the endpoints"},
        status_code=exc.status_code,
    )


EXCEPTION_HANDLERS = {HTTPException: _http_error}


class _AnyMethod:
    """An ASGI endpoint that takes every method (a Route given a plain function would answer only the methods
    listed, and let a catch-all route answer the others), so that each path decides: its endpoints by method,
    and for any other method a 405 with an Allow header naming the methods it answers."""

    def __init__(
        self, handlers: dict[str, Callable[[Request], Any]], fallback: Callable[[Request], Any] | None = None
    ):
        self.handlers = handlers
        self.fallback = fallback
        self.allow = ", ".join(
            [*handlers, *(["HEAD"] if "GET" in handlers and "HEAD" not in handlers else [])]
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        handler = self.handlers.get(request.method) or (
            self.handlers.get("GET") if request.method == "HEAD" else None
        )
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
