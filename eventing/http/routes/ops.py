"""The endpoints of this project's operations, each calling the eventing.ops module the CLI command
calls: eventing nodes and rebalance (list, add, remove, plan, start, progress), the dead-letter queue
(list, show, replay, purge; a selector checked here so that errors speak of parameters), window results
and `verify` against a ledger bucket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventing.control.nodes import Topology
from eventing.errors import ConfigError
from eventing.http.routes.request import FUNCTION_PATH, EndpointRequest
from eventing.ops import dlq
from eventing.ops import nodes as nodes_ops


def _topology_call(c: EndpointRequest, fn: Callable[[Topology], Any]) -> Any:
    with c.state.metadata as store:
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
        raise ConfigError(
            f"{c.shown(source, 'reason', reason)} is not valid; give one of the reasons: "
            + ", ".join(sorted(dlq.DLQ_REASONS))
        )
    selector = dlq.DlqSelector(
        vb=c.int_arg(source, "vb", minimum=0),
        seqno=c.int_arg(source, "seqno", minimum=0),
        key=str(key) if key not in (None, "") else None,
        reason=reason or None,
        everything=c.flag(source, "all"),
    )
    q = source is c.query
    vb, seqno, key_, all_, replayed = (
        ("vb=N", "seqno=S", "key=KEY", "all=true", "replayed=true")
        if q
        else ('"vb"', '"seqno"', '"key"', '{"all": true}', '{"replayed": true}')
    )
    if selector.seqno is not None and selector.vb is None:
        raise ConfigError(f"{seqno} needs {vb} too: a seqno is only unique within its vBucket")
    if selector.everything and (selector.vb is not None or selector.key is not None):
        raise ConfigError(f"{all_} selects every row; send it without {vb}, {seqno} or {key_}")
    if action == "show" and selector.vb is None and selector.key is None:
        raise ConfigError(
            f"dlq/show needs ?{vb}&{seqno} or ?{key_}; GET {FUNCTION_PATH.format(name=c.name)}/dlq lists "
            "every row"
        )
    if action == "replay" and not (selector.everything or selector.narrows):
        raise ConfigError(f'dlq/replay needs {all_} or a selector: {vb} (with {seqno}), {key_} or "reason"')
    if action == "purge" and not (selector.everything or selector.narrows or c.flag(source, "replayed")):
        raise ConfigError(
            f'dlq/purge needs {all_}, {replayed} or a selector: {vb} (with {seqno}), {key_} or "reason"'
        )
    return selector


def dlq_list(c: EndpointRequest) -> list[dict[str, Any]]:
    """`?limit=N&offset=M`: rows M+1..M+N in (vBucket, seqno) order, for paging."""
    limit, offset = c.int_arg(c.query, "limit", minimum=1), c.int_arg(c.query, "offset") or 0
    if offset < 0:
        raise ConfigError(f"offset={offset} is negative; give the number of rows to skip (>= 0)")
    rows = dlq.list_rows(
        c.state,
        c.name,
        reason=c.query.get("reason") or None,
        limit=None if limit is None else limit + offset,
        include_replayed=c.flag(c.query, "all"),
    )
    return [dlq.row_view(r) for r in rows[offset:]]


def dlq_show(c: EndpointRequest) -> list[dict[str, Any]]:
    return [dlq.row_view(r, full=True) for r in dlq.show_rows(c.state, c.name, _selector(c, c.query, "show"))]


def dlq_replay(c: EndpointRequest) -> dict[str, Any]:
    return dlq.replay(c.state, c.name, _selector(c, c.json_object(), "replay")).to_dict()


def dlq_purge(c: EndpointRequest) -> dict[str, Any]:
    body = c.json_object()
    removed = dlq.purge(c.state, c.name, _selector(c, body, "purge"), replayed_only=c.flag(body, "replayed"))
    return {"function": c.name, "purged": removed}


def windows(c: EndpointRequest) -> dict[str, Any]:
    from eventing.ops.windows import window_report

    limit = c.int_arg(c.query, "limit", minimum=0)  # 0: every row
    report = window_report(c.state, c.name)
    if limit:
        report["results"] = report["results"][-limit:]
    return report


def verify(c: EndpointRequest) -> dict[str, Any]:
    from eventing.ops.verify import verify_function

    report = verify_function(c.state, c.name, ledger=c.query.get("ledger") or None)
    return {**report.to_dict(), "summary": report.summary()}
