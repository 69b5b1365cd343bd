"""The fence rule, written once for every backend (docs/architecture.md, 'Generations, epochs and fencing').

Each (function, vBucket) checkpoint stores the epoch of its current owner. A claim raises it above every
epoch handed out before (`next_epoch`), and every later write names the epoch its writer claimed with: it is
accepted only while the stored epoch is still that one (`holds`). A lower epoch is a zombie's (someone
claimed since); no stored epoch means the checkpoints are gone (undeployed); a higher one was never handed
out by this store (a store restored from an older backup: the next claim catches up with `floor`). All of
them are fenced. A window coordinator's fence number follows the same rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def holds(stored: int | None, claimed: int | None) -> bool:
    """True if a writer that claimed with epoch `claimed` may still write where `stored` is the stored
    epoch."""
    return stored is not None and claimed is not None and stored == claimed


def fenced_vbuckets(
    vbuckets: Iterable[int], stored: Mapping[int, int], claimed: Mapping[int, int]
) -> set[int]:
    """The vBuckets among `vbuckets` whose writes are rejected: the writer's epoch (`claimed`) is not the
    stored one (`stored`; a vBucket missing from it has no checkpoint)."""
    return {vb for vb in vbuckets if not holds(stored.get(vb), claimed.get(vb))}


def next_epoch(stored: int, floor: int = 0) -> int:
    """The epoch a claim takes: above the stored one (so every earlier owner is fenced), and at least
    `floor` (an epoch seen elsewhere, such as a binding bucket's effect mark, that this store fell behind)."""
    return max(stored + 1, floor)
