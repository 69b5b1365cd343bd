"""More endpoints of Couchbase Eventing's REST API, in its shapes: one function's execution, failure and
latency statistics and its backlog (`/getExecutionStats`, `/getFailureStats`, `/getLatencyStats`,
`/getDcpEventsRemaining`: `?name=` with `?bucket=&scope=` for a function in a namespace; a function that is
not deployed is Couchbase's ERR_APP_NOT_DEPLOYED), the filtered names (`/api/v1/list/functions/query`), a
function's deployment config (`/api/v1/functions/NAME/config`) and the deletion of every undeployed function
(`DELETE /api/v1/functions`). Their errors carry Couchbase's name and code (routes.request).
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from eventing.control import lifecycle
from eventing.core import couchbase_format
from eventing.core import counters as counter_names
from eventing.core.definition import check_function_name
from eventing.core.keyspaces import Keyspace
from eventing.errors import ConfigError, LifecycleError, NotFoundError
from eventing.http.function_access import function_keyspace
from eventing.http.routes.functions import list_functions, stored_function
from eventing.http.routes.request import EndpointRequest, _with_warnings, resolve_name
from eventing.ops import stats
from eventing.security.users import FUNCTIONS_MANAGE

DEPLOYED = ("deployed", "paused", "pausing", "deploying")


def _deployed_function(c: EndpointRequest) -> tuple[str, dict[str, Any]]:
    """The function `?name=` (with `?bucket=&scope=`) names, which must be deployed (or paused), as
    Couchbase's statistics endpoints ask."""
    name = c.query.get("name") or c.query.get("appName")
    if not name:
        raise ConfigError(
            "this endpoint needs ?name=FUNCTION (and ?bucket=&scope= for a function in a namespace)"
        )
    check_function_name(name)
    name = resolve_name(c.state, name, c.query)
    doc = stored_function(EndpointRequest(c.state, {"name": name}, {}, b""))
    if doc["state"] not in DEPLOYED:
        raise LifecycleError(
            f"function '{name}' is undeployed; statistics are kept for a deployed or paused "
            f"function; deploy it first"
        )
    return name, doc


def execution_stats(c: EndpointRequest) -> dict[str, Any]:
    name, _ = _deployed_function(c)
    return stats.couchbase_full_stats(c.state, name)["execution_stats"]


def failure_stats(c: EndpointRequest) -> dict[str, Any]:
    name, _ = _deployed_function(c)
    return stats.couchbase_full_stats(c.state, name)["failure_stats"]


def latency_stats(c: EndpointRequest) -> dict[str, int]:
    """Couchbase's latency histogram: upper bound in microseconds -> handler calls (this system counts each
    batch's calls in the bucket of the batch's mean time per call; see docs/http.md, Metrics)."""
    name, _ = _deployed_function(c)
    with c.state.metadata as store:
        counters = store.counters(name)
    out = {
        str(bound): int(counters.get(f"latency_le_{bound}us", 0)) for bound in counter_names.LATENCY_BOUNDS_US
    }
    out["inf"] = int(counters.get("latency_le_inf", 0))
    return {k: v for k, v in out.items() if v}


def dcp_events_remaining(c: EndpointRequest) -> dict[str, int]:
    """{"dcp_backlog": N}: the source's mutations past the function's checkpoints."""
    name, _ = _deployed_function(c)
    lag = stats.function_stats(c.state, name)["checkpoint_lag"]
    return {"dcp_backlog": int(lag or 0)}


def list_functions_query(c: EndpointRequest) -> dict[str, list[str]]:
    """Couchbase's /api/v1/list/functions/query: names, filtered by ?deployed=, ?source_bucket= and
    ?function_type=sbm|notsbm (whether the function writes to its own source keyspace)."""
    kind = c.query.get("function_type")
    if kind not in (None, "", "sbm", "notsbm"):
        raise ConfigError(f"function_type={kind} is not valid; use sbm (writes to its own source) or notsbm")
    deployed = c.flag(c.query, "deployed") if "deployed" in c.query else None
    names = []
    for f in list_functions(c):
        source = function_keyspace(f)
        if c.query.get("source_bucket") and source.bucket != c.query["source_bucket"]:
            continue
        if deployed is not None and (f["state"] in DEPLOYED) != deployed:
            continue
        if kind:
            writes_source = any(
                b.get("access") == "rw"
                and _overlap(Keyspace.of(b["bucket"], b.get("scope"), b.get("collection")), source)
                for b in f.get("bindings", [])
            )
            if writes_source != (kind == "sbm"):
                continue
        names.append(f["name"])
    return {"functions": names}


def _overlap(a: Keyspace, b: Keyspace) -> bool:
    """Whether two keyspaces (either may have wildcards) share a collection."""
    if a.bucket != b.bucket:
        return False
    if "*" in (a.scope, b.scope):
        return True
    return a.scope == b.scope and ("*" in (a.collection, b.collection) or a.collection == b.collection)


def get_deployment_config(c: EndpointRequest) -> Response:
    """Couchbase's deployment config of a function: its `depcfg` (source, metadata keyspace, bindings)."""
    exported, warnings = lifecycle.export_couchbase(c.state, c.name)
    return _with_warnings(exported["depcfg"], warnings)


def save_deployment_config(c: EndpointRequest) -> Response:
    """Replace a function's `depcfg` (an undeployed or paused function, as for any change): the function is
    saved again in Couchbase's format with the new depcfg, its handler and settings kept."""
    depcfg = c.json_object()
    exported, _ = lifecycle.export_couchbase(c.state, c.name, with_secrets=True)
    exported["settings"] = {
        k: v for k, v in exported["settings"].items() if k not in ("deployment_status", "processing_status")
    }
    item = {**exported, "depcfg": depcfg}
    converted = couchbase_format.from_couchbase(item)
    if converted.definition.name != c.name:
        raise ConfigError(f"the deployment config cannot move function '{c.name}' to another namespace")
    with c.state.metadata as store:
        record = store.get_function(c.name)
    record = lifecycle.save_function(c.state, converted.definition, record.source, saved_by=c.identity)
    return _with_warnings(
        {**stats.function_view(record), "warnings": list(converted.warnings)}, list(converted.warnings)
    )


def delete_all(c: EndpointRequest) -> list[dict[str, Any]]:
    """DELETE /api/v1/functions: every undeployed function the caller manages is deleted (all of them for an
    admin); each gets Couchbase's runtime info (code 0, or ERR_APP_NOT_UNDEPLOYED's 22 for one that is
    deployed or paused, which stays)."""
    out: list[dict[str, Any]] = []
    for f in list_functions(c):
        if not c.identity.can(FUNCTIONS_MANAGE, function_keyspace(f)):
            continue  # another scope's: not this caller's to delete, nor to be told of
        try:
            lifecycle.delete(c.state, f["name"])
            out.append({"code": 0, "info": f"Function: {f['name']} deleted"})
        except LifecycleError as exc:
            out.append({"code": 22, "info": str(exc)})
        except NotFoundError:
            continue  # deleted meanwhile
    return out
