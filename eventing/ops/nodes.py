"""Nodes and rebalance as the CLI and the HTTP API drive them: the node list, the plan, starting a
rebalance and its progress. The metadata store holds the request; a running service carries it out."""

from __future__ import annotations

from typing import Any

from eventing.control.lifecycle import SERVICE_STALE_S
from eventing.control.nodes import Topology, function_assignment, worker_id_of
from eventing.errors import ConfigError
from sharding import NUM_VBUCKETS, format_ranges
from sharding.rebalance import RebalanceError, RebalancePlan, assign_function


def node_list(topology: Topology) -> dict[str, Any]:
    counts = topology.node_plan().counts()
    nodes = [{**n, "vbuckets": counts.get(n["name"], 0)} for n in topology.nodes()]
    return {"nodes": nodes, "last_rebalance": topology.request()}


def plan(topology: Topology) -> RebalancePlan:
    try:
        return topology.plan()
    except RebalanceError as exc:
        raise ConfigError(str(exc)) from None


def describe_plan(topology: Topology, plan: RebalancePlan) -> dict[str, Any]:
    """Per node and per worker counts before and after, and the list of moves, for every function."""
    functions = {}
    for record in topology.store.list_functions():
        count = record.definition.get("worker_count", 1)
        before = function_assignment(topology.store, record.name, count, plan.before or plan.after)
        after = assign_function(plan.after, count, before, nodes=list(plan.nodes))
        functions[record.name] = {
            "before": {str(w): n for w, n in before.counts().items() if n},
            "after": {str(w): n for w, n in after.counts().items()},
            "worker_moves": sum(1 for a, b in zip(before.owners, after.owners, strict=True) if a != b),
        }
    return {
        "nodes_before": plan.counts_before(),
        "nodes_after": plan.counts_after(),
        "moves": plan.move_count,
        "move_groups": [
            {"from": a, "to": b, "vbuckets": len(vbs), "ranges": format_ranges(vbs)}
            for (a, b), vbs in plan.move_groups().items()
        ],
        "functions": functions,
    }


def nothing_to_do(plan: RebalancePlan) -> bool:
    return plan.move_count == 0 and not plan.joined() and not plan.departed()


def start_rebalance(topology: Topology, plan: RebalancePlan) -> dict[str, Any]:
    """Record the request; with no service running the new plan simply applies at the next start.
    Returns the request (status `done` then, else `requested` for the running service to carry out)."""
    topology.check_can_rebalance()
    request = topology.request_rebalance(plan)
    if not topology.store.live_services(SERVICE_STALE_S):
        topology.complete(request["owners"])
        request = topology.update_request(
            request,
            status="done",
            seconds=0.0,
            longest_unowned_ms=0.0,
            note="no service was running; the plan applies at the next start",
        )
    return request


def rebalance_progress(topology: Topology) -> dict[str, Any]:
    """The last request and how far it got: the share of the moving vBuckets whose checkpoints every
    deployed function already records on their target node (1.0 once done, 0.0 before any moved)."""
    request = topology.request()
    if request is None:
        return {"request": None, "progress": 1.0, "moved": 0, "moves": 0}
    if request["status"] == "done":
        return {
            "request": request,
            "progress": 1.0,
            "moved": request.get("moves", 0),
            "moves": request.get("moves", 0),
        }
    target = request["owners"]
    before = topology.node_plan().owners
    moving = [vb for vb in range(NUM_VBUCKETS) if before[vb] != target[vb]]
    cps = [topology.store.checkpoints(r.name) for r in topology.store.list_functions()]
    cps = [c for c in cps if c]
    moved = 0
    for vb in moving:
        nodes = {getattr(worker_id_of(c[vb].owner if vb in c else None), "node", None) for c in cps}
        moved += nodes == {target[vb]}
    progress = moved / len(moving) if moving else 0.0
    return {"request": request, "progress": round(progress, 4), "moved": moved, "moves": len(moving)}
