"""Simulates a sequence of node joins and leaves with the rebalance planner and draws the vBucket map of each
step.

Nothing runs: no Ray, no store. For each step it prints vBuckets per node and per worker, the moves
against the minimum, and writes a PNG of the map before and after the step.

    python scripts/simulate_rebalance.py                          # 1,2,3,2 nodes; fn_email:4, fn_score:3
    python scripts/simulate_rebalance.py --steps 1,3,n1+n3 --function fn_email:2 --json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Run from a checkout without installing the package.
REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from sharding import (  # noqa: E402
    NUM_VBUCKETS,
    FunctionAssignment,
    RebalanceError,
    RebalancePlan,
    VBucketPlan,
    WorkerId,
    assign_function,
    format_ranges,
    function_moves,
    minimum_moves,
    minimum_worker_moves,
    plan_rebalance,
)

DEFAULT_STEPS = "1,2,3,2"
DEFAULT_FUNCTIONS = ("fn_email:4", "fn_score:3")
DEFAULT_OUT = "rebalance-sim"
# Longer move descriptions (fragmented ranges) are cut so one step stays readable on a terminal.
MAX_RANGE_CHARS = 160


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    workers: int


@dataclass(frozen=True)
class FunctionStep:
    """One function's worker assignment after a step, and what changed to get there."""

    spec: FunctionSpec
    before: FunctionAssignment | None
    after: FunctionAssignment
    handoffs: int
    between_workers: int
    minimum_between_workers: int


@dataclass(frozen=True)
class Step:
    index: int
    plan: RebalancePlan
    minimum: int
    functions: tuple[FunctionStep, ...]

    @property
    def nodes_before(self) -> int:
        return 0 if self.plan.before is None else len(set(self.plan.before.owners))

    @property
    def label(self) -> str:
        if self.plan.before is None:
            return f"deploy on {_nodes_word(len(self.plan.nodes))}"
        return f"{self.nodes_before} -> {_nodes_word(len(self.plan.nodes))}"

    @property
    def file_stem(self) -> str:
        if self.plan.before is None:
            return f"step-{self.index:02d}-deploy-{_nodes_word(len(self.plan.nodes)).replace(' ', '-')}"
        return (
            f"step-{self.index:02d}-{self.nodes_before}-to-"
            f"{_nodes_word(len(self.plan.nodes)).replace(' ', '-')}"
        )


def _nodes_word(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def parse_function(text: str) -> FunctionSpec:
    name, sep, workers = text.rpartition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"function {text!r} must look like NAME:WORKERS, e.g. fn_email:4")
    try:
        count = int(workers)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"function {text!r} has worker count {workers!r}; give a whole number, e.g. {name}:4"
        ) from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"function {name!r} needs at least 1 worker per node, got {count}")
    return FunctionSpec(name, count)


def node_lists(steps: str) -> list[list[str]]:
    """Turn `1,2,3,2` (node counts) or `n1+n3` (explicit node lists) into the node list of each step.

    A count that grows adds the lowest unused names n1, n2, ...; a count that shrinks removes the nodes
    at the end of the current list (the ones that joined last).
    """
    out: list[list[str]] = []
    nodes: list[str] = []
    for token in (part.strip() for part in steps.split(",")):
        if not token:
            raise ValueError(
                f"empty step in {steps!r}; separate node counts with single commas, e.g. 1,2,3,2"
            )
        if token.isdigit():
            count = int(token)
            nodes = nodes[:count]
            number = 1
            while len(nodes) < count:
                name = f"n{number}"
                if name not in nodes:
                    nodes.append(name)
                number += 1
        else:
            nodes = [name.strip() for name in token.split("+")]
        out.append(list(nodes))
    return out


def simulate(
    steps: Sequence[Sequence[str]], functions: Sequence[FunctionSpec], num_vbuckets: int
) -> list[Step]:
    current: VBucketPlan | None = None
    assignments: dict[str, FunctionAssignment | None] = {spec.name: None for spec in functions}
    out: list[Step] = []
    for index, nodes in enumerate(steps):
        plan = plan_rebalance(current, nodes, num_vbuckets)
        minimum = minimum_moves(current, nodes, num_vbuckets)
        function_steps = []
        for spec in functions:
            before = assignments[spec.name]
            after = assign_function(plan.after, spec.workers, before, nodes=plan.nodes)
            function_steps.append(_function_step(spec, before, after, plan))
            assignments[spec.name] = after
        out.append(Step(index, plan, minimum, tuple(function_steps)))
        current = plan.after
    return out


def _function_step(
    spec: FunctionSpec, before: FunctionAssignment | None, after: FunctionAssignment, plan: RebalancePlan
) -> FunctionStep:
    if before is None:
        return FunctionStep(spec, None, after, 0, 0, 0)
    moves = function_moves(before, after)
    between = sum(1 for m in moves if m.from_worker is not None and m.from_worker.node == m.to_worker.node)
    minimum = 0
    for node in plan.nodes:
        vbs = plan.after.vbuckets_of(node)
        previous = {vb: before.owners[vb].index for vb in vbs if before.owners[vb].node == node}
        minimum += minimum_worker_moves(vbs, previous, spec.workers)
    return FunctionStep(spec, before, after, len(moves), between, minimum)


# ---------------------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------------------


def _cut(text: str) -> str:
    return text if len(text) <= MAX_RANGE_CHARS else text[: MAX_RANGE_CHARS - 3] + "..."


def print_text(steps: Sequence[Step], pictures: dict[int, Path], num_vbuckets: int) -> None:
    print(f"{num_vbuckets} vBuckets; moves are vBuckets that change node, handoffs those that change worker")
    for step in steps:
        plan = step.plan
        print()
        changes = []
        if plan.joined() and plan.before is not None:
            changes.append("joined " + ", ".join(plan.joined()))
        if plan.departed():
            changes.append("left " + ", ".join(plan.departed()))
        suffix = f" ({'; '.join(changes)})" if changes else ""
        print(f"step {step.index}: {step.label}{suffix}")
        before, after = plan.counts_before(), plan.counts_after()
        if plan.before is None:
            print("  nodes: " + ", ".join(f"{node} {count}" for node, count in after.items()))
        else:
            print(
                "  nodes: " + ", ".join(f"{node} {before[node]} -> {after.get(node, 0)}" for node in before)
            )
            verdict = "minimal" if plan.move_count == step.minimum else "NOT minimal"
            print(f"  node moves: {plan.move_count} (minimum {step.minimum}, {verdict})")
            for line in plan.describe():
                print(f"    {_cut(line)}")
        for fn in step.functions:
            header = f"  {fn.spec.name}, {fn.spec.workers} workers per node"
            if fn.before is None:
                print(f"{header}: first assignment")
            else:
                with_node = fn.handoffs - fn.between_workers
                print(
                    f"{header}: {fn.handoffs} handoffs = {with_node} with their node"
                    f" + {fn.between_workers} between workers of a node"
                    f" (minimum {fn.minimum_between_workers})"
                )
            counts = fn.after.counts()
            for node in fn.after.nodes:
                cells = "  ".join(
                    f"w{worker.index} {count}" for worker, count in counts.items() if worker.node == node
                )
                print(f"    {node}: {cells}")
        if step.index in pictures:
            print(f"  picture: {pictures[step.index]}")


def json_report(steps: Sequence[Step], pictures: dict[int, Path], num_vbuckets: int) -> dict[str, Any]:
    out_steps = []
    for step in steps:
        plan = step.plan
        out_steps.append(
            {
                "step": step.index,
                "nodes": list(plan.nodes),
                "joined": plan.joined() if plan.before is not None else [],
                "departed": plan.departed(),
                "first_deployment": plan.before is None,
                "node_counts_before": plan.counts_before() if plan.before is not None else {},
                "node_counts_after": plan.counts_after(),
                "moves": plan.move_count,
                "minimum_moves": step.minimum,
                "move_groups": [
                    {"from": src, "to": dst, "count": len(vbs), "ranges": format_ranges(vbs), "vbuckets": vbs}
                    for (src, dst), vbs in plan.move_groups().items()
                ],
                "functions": {
                    fn.spec.name: {
                        "workers_per_node": fn.spec.workers,
                        "worker_counts": {str(w): c for w, c in fn.after.counts().items()},
                        "handoffs": fn.handoffs,
                        "between_workers": fn.between_workers,
                        "minimum_between_workers": fn.minimum_between_workers,
                    }
                    for fn in step.functions
                },
                "picture": str(pictures[step.index]) if step.index in pictures else None,
            }
        )
    return {
        "num_vbuckets": num_vbuckets,
        "functions": {fn.spec.name: fn.spec.workers for fn in steps[0].functions} if steps else {},
        "steps": out_steps,
    }


# ---------------------------------------------------------------------------------------------------------
# Pictures
# ---------------------------------------------------------------------------------------------------------


def _changed(before, after) -> list[bool] | None:
    """Per vBucket, whether its owner changed; None at a first deployment (nothing before)."""
    if before is None:
        return None
    return [a != b for a, b in zip(before.owners, after.owners, strict=True)]


def draw_step(step: Step, num_vbuckets: int, path: Path) -> None:
    """One PNG: a 'before' block over an 'after' block; each has a node section and one per function.

    Every row is one node or one worker and every column one vBucket, colored by the node that owns it
    (a worker row uses its node's color). In the 'after' block a black 'changed' row marks the vBuckets
    whose owner changed in this step at that level.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    plan = step.plan
    # Same rows before and after so the eye can compare straight down: new nodes, then departed ones.
    nodes = list(plan.nodes) + plan.departed()
    palette = plt.get_cmap("tab10")
    color = {node: np.array(palette(i % 10)[:3]) for i, node in enumerate(nodes)}
    white = np.ones(3)

    def section(
        rows: list[tuple[str, Any]], owners: Sequence[Any] | None, changed: list[bool] | None
    ) -> tuple[Any, list[str]]:
        labels = []
        grid = np.tile(white, (len(rows) + (1 if changed is not None else 0), num_vbuckets, 1))
        offset = 0
        if changed is not None:
            grid[0, np.array(changed, dtype=bool)] = 0.0
            labels.append(f"changed ({sum(changed)})")
            offset = 1
        row_of = {key: offset + i for i, (_, key) in enumerate(rows)}
        counts = [0] * len(rows)
        if owners is not None:
            for vb, owner in enumerate(owners):
                r = row_of[owner]
                grid[r, vb] = color[owner if isinstance(owner, str) else owner.node]
                counts[r - offset] += 1
        labels += [f"{label} ({count})" for (label, _), count in zip(rows, counts, strict=True)]
        return grid, labels

    blocks: list[tuple[str, Any, list[str]]] = []
    node_rows = [(node, node) for node in nodes]
    before_nodes = plan.before.owners if plan.before is not None else None
    for when in ("before", "after"):
        if when == "before":
            grid, labels = section(node_rows, before_nodes, None)
            title = "before: nodes" if before_nodes is not None else "before: nothing deployed yet"
        else:
            grid, labels = section(node_rows, plan.after.owners, _changed(plan.before, plan.after))
            title = (
                f"after: nodes, {plan.move_count} moves (minimum {step.minimum})"
                if plan.before is not None
                else "after: nodes, first deployment (contiguous)"
            )
        blocks.append((title, grid, labels))
        for fn in step.functions:
            rows = [(f"{node}/w{i}", WorkerId(node, i)) for node in nodes for i in range(fn.spec.workers)]
            if when == "before":
                owners = fn.before.owners if fn.before is not None else None
                grid, labels = section(rows, owners, None)
                title = f"before: {fn.spec.name} ({fn.spec.workers} workers per node)"
            else:
                grid, labels = section(rows, fn.after.owners, _changed(fn.before, fn.after))
                title = (
                    f"after: {fn.spec.name}, {fn.handoffs} handoffs"
                    f" ({fn.between_workers} between workers of a node, minimum {fn.minimum_between_workers})"
                    if fn.before is not None
                    else f"after: {fn.spec.name}, first assignment"
                )
            blocks.append((title, grid, labels))

    row_inches = 0.17
    heights = [grid.shape[0] for _, grid, _ in blocks]
    fig_height = sum(heights) * row_inches + 0.6 * len(blocks) + 0.6
    fig = plt.figure(figsize=(14, fig_height), dpi=120, layout="constrained")
    grid_spec = fig.add_gridspec(len(blocks), 1, height_ratios=heights)
    tick_step = max(1, num_vbuckets // 8)
    for i, (title, grid, labels) in enumerate(blocks):
        ax = fig.add_subplot(grid_spec[i])
        ax.imshow(grid, aspect="auto", interpolation="nearest", extent=(0, num_vbuckets, grid.shape[0], 0))
        ax.set_yticks([r + 0.5 for r in range(grid.shape[0])], labels, fontsize=7)
        ax.set_xticks(range(0, num_vbuckets + 1, tick_step))
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(title, fontsize=9, loc="left", fontweight="bold" if title.startswith("after") else None)
        for r in range(1, grid.shape[0]):
            ax.axhline(r, color="0.85", linewidth=0.4)
    fig.suptitle(
        f"step {step.index}: {step.label} - vBucket map (columns are vBuckets 0..{num_vbuckets - 1})"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simulate_rebalance.py",
        description=(
            "Plan a sequence of eventing node joins and leaves without running anything. For each step, "
            "print vBuckets per node and per function worker, the vBuckets that move against the fewest "
            "possible, and draw the vBucket map before and after as a PNG."
        ),
        epilog=(
            "Steps are node counts (a growing count adds n1, n2, ...; a shrinking one removes the nodes "
            "that joined last) or explicit node lists joined by '+', e.g. --steps 1,2,3,n1+n3. "
            "The first step is the first deployment."
        ),
    )
    parser.add_argument(
        "--steps",
        default=DEFAULT_STEPS,
        help=f"comma-separated node counts or node lists, one per step (default: {DEFAULT_STEPS})",
    )
    parser.add_argument(
        "--function",
        dest="functions",
        action="append",
        type=parse_function,
        metavar="NAME:WORKERS",
        help="a function and its workers per node; repeat for several (default: "
        f"{' '.join(DEFAULT_FUNCTIONS)})",
    )
    parser.add_argument(
        "--vbuckets", type=int, default=NUM_VBUCKETS, help=f"number of vBuckets (default: {NUM_VBUCKETS})"
    )
    parser.add_argument(
        "--out", type=Path, default=Path(DEFAULT_OUT), help=f"folder for the PNGs (default: ./{DEFAULT_OUT})"
    )
    parser.add_argument("--no-pictures", action="store_true", help="skip the PNGs")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of text")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    functions: list[FunctionSpec] = args.functions or [parse_function(f) for f in DEFAULT_FUNCTIONS]
    names = [fn.name for fn in functions]
    if len(set(names)) != len(names):
        parser.error(f"function names must be unique, got {names}")
    if args.vbuckets < 1:
        parser.error(f"--vbuckets must be at least 1, got {args.vbuckets}")
    try:
        steps = simulate(node_lists(args.steps), functions, args.vbuckets)
    except (RebalanceError, ValueError) as exc:
        print(f"simulate_rebalance: {exc}", file=sys.stderr)
        return 1
    pictures: dict[int, Path] = {}
    if not args.no_pictures:
        for step in steps:
            path = args.out / f"{step.file_stem}.png"
            draw_step(step, args.vbuckets, path)
            pictures[step.index] = path
    if args.json:
        print(json.dumps(json_report(steps, pictures, args.vbuckets), indent=2))
    else:
        print_text(steps, pictures, args.vbuckets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
