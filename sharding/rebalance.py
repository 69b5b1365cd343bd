"""Minimal-move rebalance plans: which vBuckets change node when nodes join or leave, and which change
worker."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sharding.plan import NUM_VBUCKETS, VBucketPlan, format_ranges

__all__ = [
    "DuplicateNodeError",
    "FunctionAssignment",
    "InvalidOwnershipError",
    "InvalidWorkerCountError",
    "Move",
    "NoNodesError",
    "RebalanceError",
    "RebalancePlan",
    "WorkerId",
    "WorkerMove",
    "assign_function",
    "assign_workers",
    "function_moves",
    "minimum_moves",
    "minimum_worker_moves",
    "plan_rebalance",
    "worker_moves",
]

Owner = TypeVar("Owner", bound=Hashable)


class RebalanceError(ValueError):
    """A rebalance that cannot be planned.

    RebalanceError (ValueError)
     +-- NoNodesError            the new node list is empty (the last node would leave)
     +-- DuplicateNodeError      a node name appears twice in the new node list
     +-- InvalidOwnershipError   the current ownership does not give every vBucket exactly one owner
     +-- InvalidWorkerCountError a function asks for fewer than one worker per node
    """


class NoNodesError(RebalanceError):
    """The new node list is empty, so no node could own the vBuckets."""


class DuplicateNodeError(RebalanceError):
    """A node name appears more than once in the new node list."""


class InvalidOwnershipError(RebalanceError):
    """The current ownership misses vBuckets, names vBuckets out of range, or uses an empty node name."""


class InvalidWorkerCountError(RebalanceError):
    """A function's worker count per node is below one."""


# ---------------------------------------------------------------------------------------------------------
# The one balancing rule, shared by both levels.
# ---------------------------------------------------------------------------------------------------------


def _targets(total: int, owners: Sequence[Owner], held: Mapping[Owner, int]) -> dict[Owner, int]:
    """Balanced sizes: `total // len(owners)` each, and the +1 extras to the owners that hold the most now.

    Giving an extra to an owner that already holds more than the base size lets one more vBucket stay, so
    ranking by current size (ties by position in `owners`) maximises what stays; with nothing held yet the
    extras go to the first owners, which is Couchbase's 342/341/341 order.
    """
    base, extra = divmod(total, len(owners))
    position = {owner: i for i, owner in enumerate(owners)}
    ranked = sorted(owners, key=lambda owner: (-held[owner], position[owner]))
    larger = set(ranked[:extra])
    return {owner: base + (1 if owner in larger else 0) for owner in owners}


def _give_up(held: list[int], surplus: int, spread: Mapping[int, Hashable] | None) -> set[int]:
    """Which of an over-full owner's items leave: its highest ones, or, with `spread`, the highest item of
    whichever group (for example the worker a vBucket belongs to on that node) is largest, one at a time,
    so every group shrinks evenly and the workers left behind stay balanced without moving anything more.
    """
    if surplus <= 0:
        return set()
    if spread is None:
        return set(held[len(held) - surplus :])
    groups: dict[Hashable, list[int]] = {}
    for item in held:
        groups.setdefault(spread.get(item), []).append(item)
    order = {group: i for i, group in enumerate(groups)}
    gone: set[int] = set()
    for _ in range(surplus):
        group = max(groups, key=lambda g: (len(groups[g]), order[g]))
        gone.add(groups[group].pop())
    return gone


def _rebalance(
    items: Sequence[int],
    previous: Mapping[int, Owner],
    owners: Sequence[Owner],
    spread: Mapping[int, Hashable] | None = None,
) -> dict[int, Owner]:
    """Assign sorted `items` to `owners`, balanced, keeping as many items on their previous owner as possible.

    An over-full owner keeps its lowest items and gives up its highest, so a node that halves keeps one
    contiguous half; the freed items (plus those of departed owners) go, lowest first, to the under-full
    owners in the order of `owners`, each taking one contiguous run of the pool. With no previous owners
    this is exactly `split_even` over `owners`.
    """
    known = set(owners)
    held: dict[Owner, list[int]] = {owner: [] for owner in owners}
    pool: list[int] = []
    for item in items:
        owner = previous.get(item)
        if owner is not None and owner in known:
            held[owner].append(item)
        else:
            pool.append(item)
    targets = _targets(len(items), owners, {owner: len(vbs) for owner, vbs in held.items()})
    result: dict[int, Owner] = {}
    for owner in owners:
        gone = _give_up(held[owner], len(held[owner]) - targets[owner], spread)
        for item in held[owner]:
            if item in gone:
                pool.append(item)
            else:
                result[item] = owner
    pool.sort()
    start = 0
    for owner in owners:
        need = targets[owner] - min(len(held[owner]), targets[owner])
        for item in pool[start : start + need]:
            result[item] = owner
        start += need
    return result


def _max_kept(held_counts: Iterable[int], total: int, parts: int) -> int:
    """Most items that can stay put when `total` items are spread over `parts` balanced owners.

    Each owner keeps at most min(held, its target); targets are `base` or `base + 1`, and an extra slot
    only helps an owner holding more than `base`, so the best is sum(min(held, base)) plus one per extra
    slot given to such an owner. Computed from counts alone, independently of `_rebalance`.
    """
    base, extra = divmod(total, parts)
    counts = list(held_counts)
    return sum(min(count, base) for count in counts) + min(extra, sum(1 for c in counts if c > base))


# ---------------------------------------------------------------------------------------------------------
# Node level.
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Move:
    """vBucket `vb` leaves `from_node` for `to_node`."""

    vb: int
    from_node: str
    to_node: str

    def __str__(self) -> str:
        return f"vb {self.vb}: {self.from_node} -> {self.to_node}"


@dataclass(frozen=True)
class RebalancePlan:
    """The node ownership before and after a rebalance and the vBuckets that change node, by vb.

    `before` is None at first deployment, where nothing moves: the contiguous initial layout is assigned.
    `nodes` is the new node list in the order given, including nodes that end up owning nothing.
    """

    before: VBucketPlan | None
    after: VBucketPlan
    moves: tuple[Move, ...]
    nodes: tuple[str, ...]

    @property
    def move_count(self) -> int:
        return len(self.moves)

    def joined(self) -> list[str]:
        """Nodes of the new list that owned nothing before, in list order."""
        owned = set(self.before.owners) if self.before is not None else set()
        return [node for node in self.nodes if node not in owned]

    def departed(self) -> list[str]:
        """Nodes that owned vBuckets before and are not in the new list, in order of their first vBucket."""
        if self.before is None:
            return []
        keep = set(self.nodes)
        return [node for node in dict.fromkeys(self.before.owners) if node not in keep]

    def counts_before(self) -> dict[str, int]:
        """vBuckets per node before: new nodes in list order (joining ones at 0), then departing nodes."""
        counts = {node: 0 for node in self.nodes}
        if self.before is not None:
            for owner in self.before.owners:
                counts[owner] = counts.get(owner, 0) + 1
        return counts

    def counts_after(self) -> dict[str, int]:
        """vBuckets per node after, in new list order; departed nodes are absent."""
        counts = {node: 0 for node in self.nodes}
        for owner in self.after.owners:
            counts[owner] += 1
        return counts

    def move_groups(self) -> dict[tuple[str, str], list[int]]:
        """Moved vBuckets grouped by (from_node, to_node), groups in order of their lowest vb."""
        groups: dict[tuple[str, str], list[int]] = {}
        for move in self.moves:
            groups.setdefault((move.from_node, move.to_node), []).append(move.vb)
        return groups

    def describe(self) -> list[str]:
        """One line per (from, to) pair, e.g. `n1 -> n2: 512 vBuckets 512-1023`, for printing."""
        if not self.moves:
            return ["no vBucket changes node"]
        return [
            f"{src} -> {dst}: {len(vbs)} vBuckets {format_ranges(vbs)}"
            for (src, dst), vbs in self.move_groups().items()
        ]


def _check_nodes(nodes: Sequence[str]) -> tuple[str, ...]:
    if isinstance(nodes, str):
        # A bare string would be read as one node per character.
        raise RebalanceError(f"nodes must be a list of node names, not the string {nodes!r}")
    seen: set[str] = set()
    for node in nodes:
        if not isinstance(node, str) or not node:
            raise RebalanceError(f"node name {node!r} is not a non-empty string; name every node")
        if node in seen:
            raise DuplicateNodeError(
                f"node {node!r} is listed more than once; node names must be unique, remove the duplicate"
            )
        seen.add(node)
    return tuple(nodes)


def _current_owners(
    current: VBucketPlan | Mapping[int, str] | None, num_vbuckets: int | None
) -> tuple[str, ...] | None:
    """The current owner of every vBucket as a tuple indexed by vb, or None at first deployment."""
    if current is None:
        return None
    if isinstance(current, VBucketPlan):
        owners = tuple(current.owners)
    else:
        if not current:
            return None
        size = num_vbuckets if num_vbuckets is not None else len(current)
        bad = sorted(vb for vb in current if not isinstance(vb, int) or not 0 <= vb < size)
        if bad:
            raise InvalidOwnershipError(
                f"current ownership names vBuckets {bad[:10]} outside 0..{size - 1}; "
                f"pass exactly the vBuckets 0..{size - 1}"
            )
        missing = [vb for vb in range(size) if vb not in current]
        if missing:
            raise InvalidOwnershipError(
                f"current ownership misses vBuckets {format_ranges(missing)}; every vBucket needs an owner"
            )
        owners = tuple(current[vb] for vb in range(size))
    if not owners:
        return None
    if num_vbuckets is not None and len(owners) != num_vbuckets:
        raise InvalidOwnershipError(
            f"current ownership covers {len(owners)} vBuckets but the plan is for {num_vbuckets}; "
            "pass the ownership of every vBucket"
        )
    for vb, owner in enumerate(owners):
        if not isinstance(owner, str) or not owner:
            raise InvalidOwnershipError(f"vBucket {vb} has owner {owner!r}; every owner must be a node name")
    return owners


def _no_nodes_error(owners: tuple[str, ...] | None) -> NoNodesError:
    if owners is None:
        return NoNodesError("no eventing nodes given; add at least one node before deploying")
    current_nodes = list(dict.fromkeys(owners))
    if len(current_nodes) == 1:
        return NoNodesError(
            f"cannot remove node {current_nodes[0]!r}: it is the last eventing node; add another node first"
        )
    names = ", ".join(repr(node) for node in current_nodes)
    return NoNodesError(f"cannot remove every eventing node ({names}); keep at least one node")


def plan_rebalance(
    current: VBucketPlan | Mapping[int, str] | None,
    nodes: Sequence[str],
    num_vbuckets: int | None = None,
    *,
    spread: Mapping[int, Hashable] | None = None,
) -> RebalancePlan:
    """Plan node ownership for the new ordered node list, balanced and moving the fewest vBuckets possible.

    `current` maps every vBucket to its node (a VBucketPlan or a {vb: node} mapping); None or empty means
    first deployment and gives `VBucketPlan.initial(nodes)`. The result is balanced (node sizes differ by
    at most 1) and `move_count == minimum_moves(current, nodes)`. It depends only on its inputs, so every
    process that plans the same rebalance gets the same plan. `num_vbuckets` defaults to the size of
    `current`, or NUM_VBUCKETS at first deployment.

    `spread` (vb -> group, e.g. the tuple of workers that own it in each function) changes only *which*
    vBuckets a node gives up, never how many: they are taken evenly from its groups, so the workers that
    stay on the node remain balanced and the worker-level handoffs drop to the node-level moves
    (1 -> 2 nodes with 4 workers: 512 handoffs instead of 768).
    """
    node_list = _check_nodes(nodes)
    owners = _current_owners(current, num_vbuckets)
    if not node_list:
        raise _no_nodes_error(owners)
    if owners is None:
        size = num_vbuckets if num_vbuckets is not None else NUM_VBUCKETS
        return RebalancePlan(None, VBucketPlan.initial(node_list, size), (), node_list)
    assignment = _rebalance(range(len(owners)), dict(enumerate(owners)), node_list, spread)
    after = tuple(assignment[vb] for vb in range(len(owners)))
    moves = tuple(Move(vb, owners[vb], after[vb]) for vb in range(len(owners)) if owners[vb] != after[vb])
    return RebalancePlan(VBucketPlan(owners), VBucketPlan(after), moves, node_list)


def minimum_moves(
    current: VBucketPlan | Mapping[int, str] | None,
    nodes: Sequence[str],
    num_vbuckets: int | None = None,
) -> int:
    """Fewest vBuckets any balanced plan over `nodes` must move: total minus the most that can stay.

    Derived from the per-node counts alone, not from the planner, so it checks the planner.
    """
    node_list = _check_nodes(nodes)
    owners = _current_owners(current, num_vbuckets)
    if not node_list:
        raise _no_nodes_error(owners)
    if owners is None:
        return 0
    held = [sum(1 for owner in owners if owner == node) for node in node_list]
    return len(owners) - _max_kept(held, len(owners), len(node_list))


# ---------------------------------------------------------------------------------------------------------
# Worker level: one function's workers on one node, then on every node.
# ---------------------------------------------------------------------------------------------------------


def _check_worker_count(worker_count: int) -> None:
    if not isinstance(worker_count, int) or isinstance(worker_count, bool) or worker_count < 1:
        raise InvalidWorkerCountError(
            f"worker count {worker_count!r} is invalid; a function needs at least 1 worker per node"
        )


def _node_vbuckets(vbuckets: Iterable[int]) -> list[int]:
    items = sorted(vbuckets)
    for vb, following in zip(items, items[1:], strict=False):
        if vb == following:
            raise InvalidOwnershipError(f"vBucket {vb} is listed twice for one node; list each vBucket once")
    if items and (not isinstance(items[0], int) or items[0] < 0):
        raise InvalidOwnershipError(f"vBucket {items[0]!r} is not a vBucket number (0 or more)")
    return items


def assign_workers(
    vbuckets: Iterable[int], previous: Mapping[int, int] | None, worker_count: int
) -> dict[int, int]:
    """Map a node's vBuckets to worker indices 0..worker_count-1, balanced and keeping the most in place.

    `previous` maps vBuckets to the worker that held them on this node; entries for vBuckets no longer on
    the node are ignored, and vBuckets of a worker index that no longer exists must move. With nothing
    previous this is `worker_plan` (4 workers over 1024: 256 each; 3 workers: 342/341/341). Worker sizes
    differ by at most 1 and the number of vBuckets that change worker equals `minimum_worker_moves`.
    """
    _check_worker_count(worker_count)
    items = _node_vbuckets(vbuckets)
    return _rebalance(items, dict(previous or {}), range(worker_count))


def worker_moves(previous: Mapping[int, int] | None, assignment: Mapping[int, int]) -> int:
    """vBuckets of `assignment` that had a worker on this node before and now have a different one."""
    prev = previous or {}
    return sum(1 for vb, worker in assignment.items() if vb in prev and prev[vb] != worker)


def minimum_worker_moves(
    vbuckets: Iterable[int], previous: Mapping[int, int] | None, worker_count: int
) -> int:
    """Fewest vBuckets any balanced worker split must move off their previous worker on this node."""
    _check_worker_count(worker_count)
    items = _node_vbuckets(vbuckets)
    prev = previous or {}
    had_worker = [vb for vb in items if vb in prev]
    held = [sum(1 for vb in had_worker if prev[vb] == worker) for worker in range(worker_count)]
    return len(had_worker) - _max_kept(held, len(items), worker_count)


@dataclass(frozen=True, order=True)
class WorkerId:
    """One worker of a function: worker `index` (0-based) on `node`."""

    node: str
    index: int

    def __str__(self) -> str:
        return f"{self.node}/w{self.index}"


@dataclass(frozen=True)
class WorkerMove:
    """vBucket `vb` goes from `from_worker` (None at first deployment) to `to_worker`."""

    vb: int
    from_worker: WorkerId | None
    to_worker: WorkerId

    def __str__(self) -> str:
        return f"vb {self.vb}: {self.from_worker or '-'} -> {self.to_worker}"


@dataclass(frozen=True)
class FunctionAssignment:
    """Which worker of one function owns each vBucket; `owners[vb]` is a WorkerId.

    `nodes` lists the nodes in plan order, including nodes that own nothing, so every worker is reported.
    """

    worker_count: int
    nodes: tuple[str, ...]
    owners: tuple[WorkerId, ...]

    def workers(self) -> list[WorkerId]:
        return [WorkerId(node, index) for node in self.nodes for index in range(self.worker_count)]

    def counts(self) -> dict[WorkerId, int]:
        """vBuckets per worker, every worker listed (node order, then index), idle ones at 0."""
        counts = dict.fromkeys(self.workers(), 0)
        for owner in self.owners:
            counts[owner] += 1
        return counts

    def vbuckets_of(self, worker: WorkerId) -> list[int]:
        return [vb for vb, owner in enumerate(self.owners) if owner == worker]

    def as_mapping(self) -> dict[int, WorkerId]:
        return dict(enumerate(self.owners))

    def node_plan(self) -> VBucketPlan:
        return VBucketPlan(tuple(owner.node for owner in self.owners))


def assign_function(
    node_plan: VBucketPlan,
    worker_count: int,
    previous: FunctionAssignment | Mapping[int, WorkerId] | None = None,
    *,
    nodes: Sequence[str] | None = None,
) -> FunctionAssignment:
    """Assign every vBucket of `node_plan` to a worker (node, index) of one function.

    Each node's vBuckets are split by `assign_workers`, reusing `previous` for the vBuckets that stay on
    the same node; a vBucket that changed node gets a worker on its new node. `nodes` gives the node
    order for reporting (default: order of each node's first vBucket) and may list nodes owning nothing.
    """
    _check_worker_count(worker_count)
    owning = list(dict.fromkeys(node_plan.owners))
    node_order = owning
    if nodes is not None:
        node_order = list(_check_nodes(nodes))
        listed = set(node_order)
        missing = [node for node in owning if node not in listed]
        if missing:
            raise InvalidOwnershipError(
                f"node plan uses nodes {missing} that are not in the node list; list every owning node"
            )
    prev: Mapping[int, WorkerId] = (
        previous.as_mapping() if isinstance(previous, FunctionAssignment) else (previous or {})
    )
    owners: dict[int, WorkerId] = {}
    for node in owning:
        vbs = node_plan.vbuckets_of(node)
        on_node = {vb: prev[vb].index for vb in vbs if vb in prev and prev[vb].node == node}
        for vb, index in assign_workers(vbs, on_node, worker_count).items():
            owners[vb] = WorkerId(node, index)
    return FunctionAssignment(
        worker_count, tuple(node_order), tuple(owners[vb] for vb in range(len(node_plan.owners)))
    )


def function_moves(before: FunctionAssignment | None, after: FunctionAssignment) -> tuple[WorkerMove, ...]:
    """vBuckets whose worker changes, by vb; at first deployment (`before` None) every vBucket is listed.

    Each one is a handoff: the old worker checkpoints and releases, the new one claims with a higher epoch.
    """
    if before is None:
        return tuple(WorkerMove(vb, None, worker) for vb, worker in enumerate(after.owners))
    if len(before.owners) != len(after.owners):
        raise InvalidOwnershipError(
            f"assignments cover {len(before.owners)} and {len(after.owners)} vBuckets; compare equal sizes"
        )
    return tuple(
        WorkerMove(vb, old, new)
        for vb, (old, new) in enumerate(zip(before.owners, after.owners, strict=True))
        if old != new
    )
