"""`eventing node add|remove|list` and `eventing rebalance [--dry-run]`."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from eventing.cli.output import emit_json, table
from eventing.core.wording import counted
from eventing.errors import ConfigError, LifecycleError

if TYPE_CHECKING:
    from eventing.control.nodes import Topology


def _topology(args: argparse.Namespace) -> Topology:
    from eventing.cli.common import writable_state
    from eventing.control.nodes import Topology

    return Topology(writable_state(args).metadata)


def cmd_node_add(args: argparse.Namespace) -> int:
    if args.ray_node_id is not None and not args.ray_node_id.strip():
        raise ConfigError(
            "--ray-node-id is empty; give a Ray node id (`ray list nodes`), or leave the option out for a "
            "node whose workers go on any Ray node"
        )
    topology = _topology(args)
    was_failed = any(n["name"] == args.name and n["state"] == "failed" for n in topology.nodes())
    node = topology.add_node(args.name, args.ray_node_id)
    if args.json:
        emit_json(node)
    else:
        print(f"node '{args.name}' is {node['state']}; run `eventing rebalance` to give it vBuckets")
        if was_failed and not args.ray_node_id and node["ray_node_id"]:
            print(
                f"note: it stays pinned to Ray node {node['ray_node_id']}, the one that failed; if that node "
                "was restarted it has a new id: add it again with --ray-node-id NEW_ID"
            )
    return 0


def cmd_node_remove(args: argparse.Namespace) -> int:
    node = _topology(args).remove_node(args.name)
    if args.json:
        emit_json(node)
    elif node["state"] == "removed":
        print(f"node '{args.name}' owned nothing and is removed")
    else:
        print(f"node '{args.name}' is leaving; run `eventing rebalance` to move its vBuckets away")
    return 0


def cmd_node_list(args: argparse.Namespace) -> int:
    from eventing.ops import nodes as nodes_ops

    listing = nodes_ops.node_list(_topology(args))
    nodes, request = listing["nodes"], listing["last_rebalance"]
    if args.json:
        emit_json({"nodes": nodes, "last_rebalance": request})
        return 0
    print(
        table(
            ["node", "state", "vBuckets", "ray node"],
            [[n["name"], n["state"], n["vbuckets"], n["ray_node_id"]] for n in nodes],
        )
    )
    if request:
        failover = request.get("failover")
        extra = ""
        if failover:
            extra = f" (failover of {', '.join(failover['nodes'])}"
            if "failover_unowned_s" in request:
                extra += f": its vBuckets had no live owner for {request['failover_unowned_s']:.1f}s"
            extra += ")"
        print(f"last rebalance {request['id']}: {request['status']}{extra}")
    failed = [n["name"] for n in nodes if n["state"] == "failed"]
    if failed:
        print(
            f"failed over: {', '.join(failed)}; to bring one back, start its Ray node, then "
            "`eventing node add NAME --ray-node-id NEW_ID` and `eventing rebalance`"
        )
    return 0


def cmd_rebalance(args: argparse.Namespace) -> int:
    from eventing.ops import nodes as nodes_ops

    topology = _topology(args)
    plan = nodes_ops.plan(topology)
    described = nodes_ops.describe_plan(topology, plan)
    if not args.dry_run:
        topology.check_can_rebalance()
    if not args.json:
        _print_plan(described)
    if args.dry_run:
        if args.json:
            emit_json({"dry_run": True, **described})
        return 0
    if nodes_ops.nothing_to_do(plan):
        if args.json:
            emit_json({"status": "nothing to do", **described})
        else:
            print("nothing to move")
        return 0
    request = nodes_ops.start_rebalance(topology, plan)
    if request["status"] != "done":
        if not args.json:
            print(f"rebalance {request['id']} handed to the running service; waiting", flush=True)
        deadline = time.monotonic() + args.wait
        while True:
            request = topology.request() or request
            if request["status"] == "done":
                break
            if time.monotonic() > deadline:
                raise LifecycleError(
                    f"rebalance {request['id']} is still {request['status']} after {args.wait:.0f}s; "
                    "the service carries on; check `eventing node list`"
                )
            time.sleep(0.1)
    if args.json:
        emit_json({**described, "result": request})
    else:
        print(
            f"rebalance {request['id']} done in {request.get('seconds', 0):.2f}s; "
            f"longest time a vBucket had no owner: {request.get('longest_unowned_ms', 0):.0f} ms"
        )
    return 0


def _print_plan(d: dict[str, Any]) -> None:
    print("nodes (vBuckets before -> after):")
    for node, before in d["nodes_before"].items():
        print(f"  {node}: {before} -> {d['nodes_after'].get(node, 0)}")
    print(f"moves: {counted(d['moves'], 'vBucket')}")
    for g in d["move_groups"]:
        print(f"  {g['from']} -> {g['to']}: {g['vbuckets']} ({g['ranges']})")
    for name, f in d["functions"].items():
        after = ", ".join(f"{w}={n}" for w, n in f["after"].items())
        print(f"  {name}: {f['worker_moves']} worker handoffs; after: {after}")


def register(sub: Any, add: Any) -> None:
    node = sub.add_parser("node", help="eventing nodes: add, remove, list", description="Eventing nodes.")
    nsub = node.add_subparsers(dest="node_command", metavar="ACTION", required=True)
    p = add("add", cmd_node_add, "add a node (it joins at the next rebalance)", nsub)
    p.add_argument("name")
    p.add_argument("--ray-node-id", help="pin this node's workers to a Ray node (see `ray list nodes`)")
    p = add("remove", cmd_node_remove, "remove a node (it leaves at the next rebalance)", nsub)
    p.add_argument("name")
    add("list", cmd_node_list, "nodes, their states and vBucket counts", nsub)
    p = add(
        "rebalance",
        cmd_rebalance,
        "plan (and without --dry-run carry out) the minimal-move vBucket rebalance",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument(
        "--wait", type=float, default=120.0, help="seconds to wait for a running service (default 120)"
    )


__all__ = ["register"]
