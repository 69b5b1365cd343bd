"""A worker's looks at its source (``SourceLooks``): the high seqnos of its vBuckets, with the next rows read
ahead in the same round trip where its source is a server's bucket (PostgresBucket.prefetch).

On a server a look is a round trip and costs the server a statement, so a caught-up worker whose waiter
names the vBuckets each notification announces (eventing.storage.postgres.wake_wait) looks, once it has
handled all that a look found, only at the vBuckets announced as written since, in that step and the next
ones (``resume`` carries the high seqnos over), and at all of its vBuckets every FULL_LOOK_S, for a write
whose notification was lost. A look after every pass of a step, and at every owned vBucket at every step,
was about half of a worker's time at 1,000 writes/s (docs/benchmarks.md).
"""

from __future__ import annotations

import time
from typing import Any

from eventing.storage.values import Spans
from sharding import vbucket_spans

LOOK_AHEAD_PER_VB = 4000  # rows of one vBucket a look reads ahead at most
FULL_LOOK_S = 1.0  # a look at every owned vBucket at least this often (see the module docstring)


class SourceLooks:
    """One worker's looks at its source."""

    def __init__(self, source: Any, progress: Any, reader: Any, targets: tuple[int, ...] | None):
        self.source = source
        self.progress = progress
        self.reader = reader
        self.targets = targets
        self._spans: Spans | None = None  # the owned vBuckets as ranges, made again when ownership changes
        self._seen: list[int] | None = None  # high seqnos a step that handled all it found left (keep)
        self._full_due = 0.0  # when the next look at every owned vBucket is due

    def changed(self) -> None:
        """The owned vBuckets or their positions changed: the next look is at all of them."""
        self._spans = self._seen = None

    def owned_spans(self) -> Spans:
        """The owned vBuckets as (first, last) ranges, for high_seqnos to read only those."""
        if self._spans is None:
            self._spans = vbucket_spans(self.progress.epochs)
        return self._spans

    def high_seqnos(self) -> list[int]:
        return self.source.high_seqnos(spans=self.owned_spans())

    def look(self, budget: int, only: set[int] | None = None, highs: list[int] | None = None) -> list[int]:
        """The high seqnos of the owned vBuckets, with the next rows of those that have any read ahead in
        the same round trip, in the order SourceReader.process takes them: from where it stopped, each
        vBucket up to its target. ``only``: a look at those of the owned vBuckets alone, whose high seqnos
        are written into ``highs`` (the others keep theirs)."""
        epochs = self.progress.epochs
        order = list(epochs) if only is None else [vb for vb in epochs if vb in only]
        resume_vb = self.reader.resume_vb
        if resume_vb in order:
            at = order.index(resume_vb)
            order = order[at:] + order[:at]
        positions, targets = self.progress.positions, self.targets
        cap = max(budget, LOOK_AHEAD_PER_VB)
        runs = [
            (vb, positions[vb], min(cap, targets[vb] - positions[vb]) if targets else cap) for vb in order
        ]
        if only is None or highs is None:
            self.source.prefetch(runs)
            self._full_due = time.monotonic() + FULL_LOOK_S
            return self.source.high_seqnos(prefetched=True, spans=self.owned_spans())
        if runs:
            self.source.prefetch(runs, partial=True)
            found = self.source.high_seqnos(prefetched=True)
            for vb in order:
                highs[vb] = found[vb]
        return highs

    def look_announced(self, budget: int, highs: list[int], waiter: Any) -> list[int]:
        """After a pass that handled all its look found: a look at the owned vBuckets announced as written
        since (none: no round trip), or at all of them where any may have been written unannounced."""
        waiter.drain()
        only = waiter.take_woken()
        if only is None:
            return self.look(budget)
        return self.look(budget, only, highs) if only else highs

    def resume(self) -> list[int] | None:
        """The high seqnos a step left (``keep``), while a look at every vBucket is not due; taken once."""
        seen, self._seen = self._seen, None
        return seen if seen is not None and time.monotonic() < self._full_due else None

    def keep(self, highs: list[int]) -> None:
        """A step that handled all it found ends: the next may look at the announced vBuckets alone."""
        self._seen = highs


__all__ = ["FULL_LOOK_S", "LOOK_AHEAD_PER_VB", "SourceLooks"]
