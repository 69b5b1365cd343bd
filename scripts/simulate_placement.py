"""Simulates packed placement (Atlas Stream Processing's workers, `placement: packed`) step by step.

Nothing runs: no Ray, no store. Each step starts or stops one function; the script prints which node and
slot it took or freed, which node was provisioned or released, and every node's slots after the step.

    python scripts/simulate_placement.py                 # the seed's example: proc01..proc10
    python scripts/simulate_placement.py --steps +a,+b,-a,+c --capacity 2 --json

Steps: ``+name`` (or ``start:name``) starts a function, ``-name`` (or ``stop:name``) stops it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from sharding.placement import PackedPlacement, PlacementError  # noqa: E402

# Seed 000: proc01-proc08 run on two workers; proc09 needs a third; proc03 stops; proc09 stops and restarts
# on the first worker, and the third is released. In the seed's other branch proc10 starts before proc09
# restarts and takes the slot proc03 left (SEED_BRANCH).
SEED_STEPS = [f"+proc{i:02d}" for i in range(1, 10)] + ["-proc03", "-proc09", "+proc09"]
SEED_BRANCH = [f"+proc{i:02d}" for i in range(1, 10)] + ["-proc03", "+proc10"]


def parse_steps(text: str) -> list[tuple[str, str]]:
    steps = []
    for raw in (part.strip() for part in text.split(",")):
        if not raw:
            continue
        if raw.startswith(("+", "-")):
            action, name = ("start" if raw[0] == "+" else "stop"), raw[1:]
        else:
            action, _, name = raw.partition(":")
        if action not in ("start", "stop") or not name:
            raise PlacementError(
                f"step {raw!r} is not '+name', '-name', 'start:name' or 'stop:name'; fix --steps"
            )
        steps.append((action, name))
    return steps


def simulate(steps: list[tuple[str, str]], capacity: int) -> list[dict]:
    placement = PackedPlacement(capacity=capacity)
    out = []
    for action, name in steps:
        placement, step = placement.start(name) if action == "start" else placement.stop(name)
        out.append(
            {
                "step": step.describe(),
                "action": action,
                "function": name,
                "node": step.node,
                "slot": step.slot,
                "provisioned": step.provisioned,
                "released": step.released,
                "nodes": placement.to_dict()["nodes"],
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", help="comma-separated +name/-name steps (default: the seed's example, both branches)"
    )
    parser.add_argument("--capacity", type=int, default=4, help="running functions a node hosts (default 4)")
    parser.add_argument("--json", action="store_true", help="print the steps as JSON")
    args = parser.parse_args(argv)
    try:
        if args.steps:
            runs = {"steps": parse_steps(args.steps)}
        else:
            runs = {
                "seed example": parse_steps(",".join(SEED_STEPS)),
                "seed example, proc10 before proc09 restarts": parse_steps(",".join(SEED_BRANCH)),
            }
        results = {title: simulate(steps, args.capacity) for title, steps in runs.items()}
    except PlacementError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for title, steps in results.items():
        print(f"== {title} (capacity {args.capacity})")
        for i, step in enumerate(steps, 1):
            nodes = "  |  ".join(
                f"{n['name']}: " + " ".join(f or "-" for f in n["slots"]) for n in step["nodes"]
            )
            print(f"{i:2d}. {step['step']}")
            print(f"    {nodes or '(no nodes)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
