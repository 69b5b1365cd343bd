"""Eventing nodes and the node-level vBucket plan, kept in the metadata store.

On one machine a node is a named group of worker actors; on a Ray cluster a node may be pinned to a Ray
node (its workers are scheduled there). `node add` and `node remove` only record the wish (joining,
leaving); `rebalance` computes the minimal-move plan and, when a service runs, hands the moving vBuckets
over live (see FunctionSupervisor.start_rebalance); when none runs it just records the new plan.
A node the service failed over (its Ray node died; see eventing.control.failover) is `failed`: it owns
nothing and stays listed until it is added back (`node add` + `rebalance`) or removed.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from eventing.errors import ConfigError, LifecycleError, NotFoundError, fix
from metadata import FunctionState, MetadataStore
from sharding import NUM_VBUCKETS, VBucketPlan
from sharding.placement import PackedPlacement
from sharding.rebalance import FunctionAssignment, RebalancePlan, WorkerId, assign_function, plan_rebalance

DEFAULT_NODE = "local"
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
PLAN_KEY = "node_plan"
REQUEST_KEY = "rebalance_request"


class Topology:
    def __init__(self, store: MetadataStore):
        self.store = store

    # -- nodes --------------------------------------------------------------------------------------

    def nodes(self) -> list[dict[str, Any]]:
        nodes = self.store.nodes()
        if not nodes:
            self.store.put_node(DEFAULT_NODE, "active")
            nodes = self.store.nodes()
        return nodes

    def owning_nodes(self) -> list[str]:
        """Nodes that hold vBuckets in the current plan (active and leaving ones)."""
        return list(dict.fromkeys(self.node_plan().owners))

    def target_nodes(self) -> list[str]:
        """Nodes that should hold vBuckets after the next rebalance, in the order they were added."""
        return [n["name"] for n in self.nodes() if n["state"] not in ("leaving", "failed")]

    def add_node(self, name: str, ray_node_id: str | None = None) -> dict[str, Any]:
        if not NODE_NAME.match(name or ""):
            raise ConfigError(
                f"node name {name!r} is not valid; use letters, digits, '_', '-' or '.' (max 63)"
            )
        existing = {n["name"]: n for n in self.nodes()}
        if name in existing and existing[name]["state"] not in ("leaving", "failed"):
            raise ConfigError(f"node '{name}' is already {existing[name]['state']}; pick another name")
        # Re-adding a leaving node cancels its departure; a failed node comes back as joining (it owns
        # nothing).
        state = "active" if name in self.owning_nodes() else "joining"
        self.store.put_node(name, state, ray_node_id)
        return {n["name"]: n for n in self.store.nodes()}[name]

    def remove_node(self, name: str) -> dict[str, Any]:
        existing = {n["name"]: n for n in self.nodes()}
        if name not in existing:
            known = ", ".join(existing) or "none"
            raise NotFoundError(f"unknown node '{name}' (nodes: {known}); see `eventing node list`")
        staying = [n for n in self.target_nodes() if n != name]
        if not staying:
            raise ConfigError(
                f"cannot remove node '{name}': it is the last eventing node; add another node first"
            )
        if existing[name]["state"] in ("joining", "failed"):
            self.store.delete_node(name)  # it owns nothing: just forget it
            return {**existing[name], "state": "removed"}
        self.store.put_node(name, "leaving")
        return {**existing[name], "state": "leaving"}

    def placements(self) -> dict[str, str | None]:
        return {n["name"]: n["ray_node_id"] for n in self.nodes()}

    # -- plans --------------------------------------------------------------------------------------

    def node_plan(self) -> VBucketPlan:
        raw = self.store.get_kv(PLAN_KEY)
        if raw:
            owners = tuple(json.loads(raw))
            if len(owners) == NUM_VBUCKETS:
                return VBucketPlan(owners)
        active = [n["name"] for n in self.nodes() if n["state"] in ("active", "leaving")] or [DEFAULT_NODE]
        return VBucketPlan.initial(active)

    def plan(self, targets: list[str] | None = None) -> RebalancePlan:
        """Minimal-move node plan onto `targets` (default: target_nodes()); a node gives up vBuckets evenly
        across the workers of every function on it, so the workers that stay remain balanced without extra
        handoffs."""
        current = self.node_plan()
        owners: dict[int, list[str]] = {vb: [] for vb in range(NUM_VBUCKETS)}
        for record in self.store.list_functions():
            assignment = function_assignment(
                self.store, record.name, record.definition.get("worker_count", 1), current
            )
            for vb, worker in enumerate(assignment.owners):
                owners[vb].append(str(worker))
        spread = {vb: tuple(o) for vb, o in owners.items()}
        return plan_rebalance(current, self.target_nodes() if targets is None else targets, spread=spread)

    def check_can_rebalance(self) -> None:
        busy = [
            f"{r.name} is {r.state.value}"
            for r in self.store.list_functions()
            if r.state in (FunctionState.DEPLOYING, FunctionState.PAUSING, FunctionState.UNDEPLOYING)
        ]
        if busy:
            raise LifecycleError(
                f"cannot rebalance while {', '.join(busy)}; wait until it finishes (see {{fix}})",
                fix=fix("status"),
            )
        request = self.pending_request()
        if request is not None:
            raise LifecycleError(
                f"rebalance {request['id']} is still in progress; wait for it (see `eventing node list`)"
            )

    def request_rebalance(self, plan: RebalancePlan, **extra: Any) -> dict[str, Any]:
        request = {
            **extra,
            "id": uuid.uuid4().hex[:8],
            "status": "requested",
            "requested_at": time.time(),
            "nodes": list(plan.nodes),
            "owners": list(plan.after.owners),
            "moves": plan.move_count,
        }
        self.store.set_kv(REQUEST_KEY, json.dumps(request))
        return request

    def request(self) -> dict[str, Any] | None:
        raw = self.store.get_kv(REQUEST_KEY)
        return json.loads(raw) if raw else None

    def pending_request(self) -> dict[str, Any] | None:
        request = self.request()
        return request if request and request["status"] in ("requested", "running") else None

    def update_request(self, request: dict[str, Any], **fields: Any) -> dict[str, Any]:
        request = {**request, **fields}
        self.store.set_kv(REQUEST_KEY, json.dumps(request))
        return request

    def complete(self, owners: list[str]) -> None:
        """Record the new plan: joining nodes become active, leaving nodes are forgotten."""
        self.store.set_kv(PLAN_KEY, json.dumps(owners))
        holding = set(owners)
        for node in self.nodes():
            if node["state"] == "leaving" and node["name"] not in holding:
                self.store.delete_node(node["name"])
            elif node["state"] == "joining" and node["name"] in holding:
                self.store.put_node(node["name"], "active")


def worker_id_of(owner: str | None) -> WorkerId | None:
    """'node/w3' -> WorkerId('node', 3)."""
    if not owner or "/w" not in owner:
        return None
    node, _, index = owner.rpartition("/w")
    return WorkerId(node, int(index)) if index.isdigit() else None


PACKED_KEY = "packed_placement"


def packed_node_plan(node: str) -> VBucketPlan:
    """The node plan of a packed function: every vBucket on its one node, so all its workers run there."""
    return VBucketPlan.initial([node])


def save_packed_placement(store: MetadataStore, placement: PackedPlacement) -> None:
    """Publish the service's packed placement (for `eventing status` and tests); the service owns it."""
    store.set_kv(PACKED_KEY, json.dumps(placement.to_dict()))


def load_packed_placement(store: MetadataStore) -> PackedPlacement:
    raw = store.get_kv(PACKED_KEY)
    return PackedPlacement.from_dict(json.loads(raw)) if raw else PackedPlacement()


def function_assignment(
    store: MetadataStore, function: str, worker_count: int, node_plan: VBucketPlan
) -> FunctionAssignment:
    """The function's workers per node, keeping each vBucket on its last owner where the plan allows.
    For a packed function ``node_plan`` is ``packed_node_plan(its node)``: all its workers on that node."""
    previous: dict[int, WorkerId] = {}
    for vb, cp in store.checkpoints(function).items():
        worker = worker_id_of(cp.owner)
        if worker is not None and worker.index < worker_count:
            previous[vb] = worker
    return assign_function(node_plan, worker_count, previous)
