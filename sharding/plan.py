"""Balanced, contiguous vBucket plans for nodes and for a function's workers on a node."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

NUM_VBUCKETS = 1024


def split_even(items: Sequence[int], parts: int) -> list[list[int]]:
    """Split items into `parts` contiguous runs whose sizes differ by at most one, larger runs first.

    This is Couchbase's order: 1024 over 3 gives 342/341/341.
    """
    if parts < 1:
        raise ValueError(f"cannot split over {parts} parts; need at least 1")
    base, extra = divmod(len(items), parts)
    out: list[list[int]] = []
    start = 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(list(items[start : start + size]))
        start += size
    return out


def worker_plan(vbuckets: Sequence[int], worker_count: int) -> list[list[int]]:
    """vBuckets of one node split over a function's workers (1 node, 4 workers: 256 each)."""
    return split_even(sorted(vbuckets), worker_count)


@dataclass(frozen=True)
class VBucketPlan:
    """Which node owns which vBuckets; `owners[vb]` is the node name."""

    owners: tuple[str, ...]

    @classmethod
    def initial(cls, nodes: Sequence[str], num_vbuckets: int = NUM_VBUCKETS) -> VBucketPlan:
        """Contiguous first-deployment plan: 3 nodes -> 342/341/341."""
        owners: list[str] = []
        for node, vbs in zip(nodes, split_even(range(num_vbuckets), len(nodes)), strict=True):
            owners.extend([node] * len(vbs))
        return cls(tuple(owners))

    def vbuckets_of(self, node: str) -> list[int]:
        return [vb for vb, owner in enumerate(self.owners) if owner == node]

    def nodes(self) -> list[str]:
        return sorted(set(self.owners))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for owner in self.owners:
            out[owner] = out.get(owner, 0) + 1
        return out


def vbucket_spans(vbuckets: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """[0,1,2,5,7,8] -> ((0, 2), (5, 5), (7, 8)): (first, last) runs of consecutive vBuckets."""
    vbs = sorted(vbuckets)
    if not vbs:
        return ()
    spans: list[tuple[int, int]] = []
    start = prev = vbs[0]
    for vb in vbs[1:]:
        if vb == prev + 1:
            prev = vb
            continue
        spans.append((start, prev))
        start = prev = vb
    spans.append((start, prev))
    return tuple(spans)


def format_ranges(vbuckets: Iterable[int]) -> str:
    """[0,1,2,5,7,8] -> '0-2,5,7-8'."""
    spans = vbucket_spans(vbuckets)
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans) if spans else "-"
