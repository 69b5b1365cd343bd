"""What a worker's parts share and its checkpoint takes (``WorkerProgress``, held by ``WorkerCore``,
eventing.workers.worker): each owned vBucket's position, checkpoint and epoch, the counters and dead letters
since the last checkpoint, the marks of mutations this deployment dead-lettered already, and the timers
fired since the last checkpoint; and the two things any part may do with them: write a dead letter
(``dead_letter``) and refuse a seqno that goes backwards (``order_violation``).

The reader, the handler and the timer firing (eventing.workers.source_reads, handling, timer_firing) and a
pool's or on_batch's calls all hold this one object. ``positions``, ``committed``, ``epochs`` and
``lettered`` are only ever changed in place, so a part may keep a reference to them; ``counters``, ``dlq``
and ``timers_done`` are replaced (a checkpoint takes them, a failed flush rewinds them, the writes set aside
are counted apart: WorkerCore.flush_set_aside), so they are read from here each time.
"""

from __future__ import annotations

import time
from collections import Counter

from eventing.core import counters as counter_names
from eventing.core.mutation import Mutation, pack_mutation
from eventing.errors import OrderViolationError
from metadata import DlqRow, TimerDone


class WorkerProgress:
    """The progress of one worker of one function (deployment `generation`) over source bucket `source`."""

    __slots__ = (
        "name",
        "generation",
        "source",
        "positions",
        "committed",
        "epochs",
        "counters",
        "dlq",
        "lettered",
        "timers_done",
    )

    def __init__(self, name: str, generation: int, source: str):
        self.name = name
        self.generation = generation
        self.source = source  # the source bucket's name, for the error of a seqno that goes backwards
        self.positions: dict[int, int] = {}  # vb -> last handled seqno
        self.committed: dict[int, int] = {}  # vb -> last checkpointed seqno
        self.epochs: dict[int, int] = {}  # vb -> this worker's epoch of it: the owned vBuckets
        self.counters: Counter[str] = Counter()
        self.dlq: list[DlqRow] = []
        self.lettered: dict[tuple[int, int], str] = {}  # (vb, seqno) -> the counter of its skip
        self.timers_done: list[TimerDone] = []  # fired since the last commit

    def dead_letter(
        self, m: Mutation, reason: str, error: str, tb: str, attempts: int, first: float = 0.0
    ) -> None:
        now = time.time()
        self.counters[counter_names.dlq(reason)] += 1
        self.dlq.append(
            DlqRow(
                self.name,
                m.vb,
                m.seqno,
                m.key,
                reason,
                error,
                tb,
                attempts,
                first or now,
                now,
                pack_mutation(m),
                generation=self.generation,
            )
        )

    def order_violation(self, vb: int, seqno: int, position: int) -> None:
        raise OrderViolationError(
            f"vBucket {vb} of bucket '{self.source}' went backwards: seqno {seqno} after {position}"
        )
