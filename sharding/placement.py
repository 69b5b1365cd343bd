"""Packed placement (Atlas Stream Processing's workers): which node runs each running function. Pure, no I/O.

Rules, as seed 000 states them:

- a packed function runs on one node; a node hosts at most ``capacity`` (4) running functions, one a slot;
- a function that starts goes to an existing node with a free slot before a new node is provisioned: the
  first such node in provisioning order, in its lowest free slot (so it takes the slot a stopped function
  left);
- a function that stops frees its slot; a node left with no running function is released;
- only running functions count: a defined function that is not running holds nothing.

``PackedPlacement`` is immutable: ``start`` and ``stop`` return the new placement and a ``PlacementStep``
saying what happened, so a simulation can print every step (``scripts/simulate_placement.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

DEFAULT_CAPACITY = 4
NODE_PREFIX = "packed-"


class PlacementError(ValueError):
    """A start or stop that the placement cannot apply (the message names the function and the fix)."""


@dataclass(frozen=True)
class PackedNode:
    """One provisioned node: ``slots[i]`` is the function running in slot i, or None."""

    name: str
    slots: tuple[str | None, ...]

    @property
    def functions(self) -> tuple[str, ...]:
        return tuple(f for f in self.slots if f is not None)

    @property
    def free(self) -> int:
        return sum(1 for f in self.slots if f is None)


@dataclass(frozen=True)
class PlacementStep:
    """What one start or stop did: ``action`` is start or stop; ``provisioned``/``released`` name a node
    that was added or given back by this step."""

    action: str
    function: str
    node: str
    slot: int
    provisioned: str | None = None
    released: str | None = None

    def describe(self) -> str:
        text = f"{self.action} {self.function}: node {self.node} slot {self.slot}"
        if self.provisioned:
            text += f" (node {self.provisioned} provisioned)"
        if self.released:
            text += f" (node {self.released} released: nothing left on it)"
        return text


@dataclass(frozen=True)
class PackedPlacement:
    """Running packed functions on their nodes, in provisioning order."""

    nodes: tuple[PackedNode, ...] = ()
    capacity: int = DEFAULT_CAPACITY
    provisioned: int = field(default=0)  # nodes ever provisioned: new nodes get fresh names

    def __post_init__(self) -> None:
        if not isinstance(self.capacity, int) or self.capacity < 1:
            raise PlacementError(f"node capacity {self.capacity!r} must be a positive number of functions")

    def node_of(self, function: str) -> str | None:
        for node in self.nodes:
            if function in node.slots:
                return node.name
        return None

    @property
    def running(self) -> tuple[str, ...]:
        return tuple(f for node in self.nodes for f in node.functions)

    def start(self, function: str) -> tuple[PackedPlacement, PlacementStep]:
        """Place a function that starts running. Starting one that already runs is an error."""
        if not function:
            raise PlacementError("a function to place needs a name")
        where = self.node_of(function)
        if where is not None:
            raise PlacementError(f"function '{function}' is already running on node {where}; stop it first")
        nodes = list(self.nodes)
        for i, node in enumerate(nodes):
            if node.free:
                slot = node.slots.index(None)
                nodes[i] = replace(node, slots=_set(node.slots, slot, function))
                return replace(self, nodes=tuple(nodes)), PlacementStep("start", function, node.name, slot)
        name = f"{NODE_PREFIX}{self.provisioned + 1}"
        fresh = PackedNode(name, _set((None,) * self.capacity, 0, function))
        placement = replace(self, nodes=(*nodes, fresh), provisioned=self.provisioned + 1)
        return placement, PlacementStep("start", function, name, 0, provisioned=name)

    def stop(self, function: str) -> tuple[PackedPlacement, PlacementStep]:
        """Free the slot of a function that stopped; its node is released when nothing runs there any more."""
        for i, node in enumerate(self.nodes):
            if function in node.slots:
                slot = node.slots.index(function)
                left = replace(node, slots=_set(node.slots, slot, None))
                nodes = list(self.nodes)
                if left.functions:
                    nodes[i] = left
                    return replace(self, nodes=tuple(nodes)), PlacementStep("stop", function, node.name, slot)
                del nodes[i]
                step = PlacementStep("stop", function, node.name, slot, released=node.name)
                return replace(self, nodes=tuple(nodes)), step
        raise PlacementError(f"function '{function}' is not running in the packed placement; nothing to stop")

    def describe(self) -> list[str]:
        """One line per node: ``packed-1: proc01 proc02 - proc04``, ``-`` for a free slot."""
        return [f"{node.name}: " + " ".join(f or "-" for f in node.slots) for node in self.nodes]

    def to_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "provisioned": self.provisioned,
            "nodes": [{"name": n.name, "slots": list(n.slots)} for n in self.nodes],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PackedPlacement:
        nodes = tuple(PackedNode(str(n["name"]), tuple(n["slots"])) for n in data.get("nodes", ()))
        return cls(
            nodes, int(data.get("capacity", DEFAULT_CAPACITY)), int(data.get("provisioned", len(nodes)))
        )


def _set(slots: tuple[str | None, ...], index: int, value: str | None) -> tuple[str | None, ...]:
    return slots[:index] + (value,) + slots[index + 1 :]
