"""The endpoints that report how functions run: `/api/v1/status` (Couchbase's shape, with this project's
live services), `/api/v1/stats` and one function's counters, its vBucket map and per-vBucket checkpoints,
and the Prometheus `/metrics`. They read; they change nothing.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from eventing.control.nodes import Topology
from eventing.core.function_names import function_scope, plain_name
from eventing.errors import ConfigError, NotFoundError
from eventing.http.routes.functions import list_functions
from eventing.http.routes.request import EndpointRequest
from eventing.ops import stats


def _status_app(view: dict[str, Any], nodes: int) -> dict[str, Any]:
    state = view["state"]
    bucket, scope = function_scope(view["name"])
    return {
        "name": plain_name(view["name"]),
        "function_scope": {"bucket": bucket, "scope": scope},
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
    """Couchbase's shape: {"apps": [{"name", "function_scope", "composite_status", ...}],
    "num_eventing_nodes": N}; for one function (/api/v1/status/NAME) {"app": {...}, "num_eventing_nodes":
    N}."""
    name = c.params.get("name")
    try:
        data = stats.function_status(c.state, name)
    except NotFoundError:
        if name:
            raise
        return {"apps": [], "num_eventing_nodes": 0, "services": []}
    with c.state.metadata as store:
        nodes = len([n for n in Topology(store).nodes() if n["state"] != "joining"])
    apps = [_status_app(v, nodes) for v in data["functions"]]
    if name:
        return {"app": apps[0], "num_eventing_nodes": nodes, "services": data["services"]}
    return {"apps": apps, "num_eventing_nodes": nodes, "services": data["services"]}


def all_stats(c: EndpointRequest) -> list[dict[str, Any]]:
    """?type=full: Couchbase's per-function groups (event_processing_stats, execution_stats,
    failure_stats)."""
    kind = c.query.get("type")
    if kind not in (None, "", "full"):
        raise ConfigError(f"type={kind} is not valid; use type=full or leave it out")
    if kind == "full":
        return [stats.couchbase_full_stats(c.state, f["name"]) for f in list_functions(c)]
    return [
        {"function_name": f["name"], **stats.function_stats(c.state, f["name"])} for f in list_functions(c)
    ]


def function_stats(c: EndpointRequest) -> dict[str, Any]:
    return stats.function_stats(c.state, c.name)


def vbmap(c: EndpointRequest) -> dict[str, Any]:
    return stats.vbucket_map(c.state, c.name)


def checkpoints(c: EndpointRequest) -> dict[str, Any]:
    return stats.checkpoint_view(
        c.state, c.name, vb=c.int_arg(c.query, "vb", minimum=0), backlog_only=c.flag(c.query, "backlog")
    )


def metrics(c: EndpointRequest) -> Response:
    from eventing.http.metrics import CONTENT_TYPE, render

    return Response(render(c.state), media_type=CONTENT_TYPE)
