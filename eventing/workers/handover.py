"""A sandboxed worker's writes applied while it handles its next mutations (`HandOver`).

A worker whose data is the sandbox's line (eventing.workers.sandbox) would wait, at the end of each step
and at every EFFECT_FLUSH_MIN writes, for its host to apply the kept writes: work an unsandboxed worker
does in its own step. Instead, the kept writes are set aside (the bindings' reads still see them, as a
pool's do: BucketBinding.set_aside) and handed to a thread of the worker that asks the host to apply them,
while the worker goes on with its next batch; the host applies them on a thread of its own
(eventing.workers.sandbox.host), in the order they were handed over.

What keeps exactly-once and order:
- at most one hand-over is in flight: the next one, every flush (WorkerCore.flush_effects, so every
  checkpoint, revoke and stop) and a claim of vBuckets wait for it first, so a checkpoint never covers a
  write that is not durable, and what applying found (effect counts, cas conflicts as dead letters, fenced
  vBuckets) goes into the checkpoint that first covers those mutations;
- writes of one document are applied in the order they were made (one thread, one hand-over at a time);
- the hand-over that ends a caught-up step is sent on the worker's own thread, its answer taken later (a
  thread a step cost more than it saved): the host applies it before it reads the step's end, so a step
  that reports caught up has its writes durable, and the worker does not wait for the round trip;
- a document written by a handed-over write is read from the set-aside overlay until the host has applied
  it (`flushed`), then from the bucket: a later mutation sees its earlier writes;
- a hand-over that fails rewinds the worker to its last checkpoint (WorkerCore.rewind) when it is waited
  for: the mutations handled meanwhile are forgotten with it and handled again, and the buckets' marks
  skip what did apply. A worker or host ended in between replays from the last checkpoint as well.
"""

from __future__ import annotations

import threading
from typing import Any

from eventing.core import counters as counter_names
from eventing.core.mutation import OP_TIMER, Mutation
from metadata import TIMER_VB_BASE


class HandOver:
    """The one hand-over of kept writes a worker core may have in flight (see the module docstring)."""

    def __init__(self, core: Any):
        self.core = core
        self._thread: threading.Thread | None = None
        self._sent: list[tuple[Any, Any]] = []  # (binding, the wait for its answer) sent as a step ended
        self._found: list[tuple[Any, Any]] = []  # (binding, EffectResult) of the hand-over in flight
        self._error: BaseException | None = None

    def hand_over(self, *, at_step_end: bool = False) -> None:
        """Wait for the hand-over in flight, then hand every kept write over to be applied beside the next
        batch (`at_step_end`: sent on this thread, answered while the step ends). A failure of the one
        waited for rewinds the worker and is raised."""
        core = self.core
        try:
            self.settle()
        except BaseException:
            core.rewind()
            raise
        core.set_aside_effects(minimum=1)
        taken = [(b, g) for b in core.rw_bindings if (g := b.take_set_aside())]
        if taken and at_step_end:
            self._sent = [
                (b, b.bucket.apply_effects_later(core.name, g, origin=core.origin, marks=core.marked))
                for b, g in taken
            ]
            for b, _ in taken:
                b.buf.take_tail = self.take_tail
        elif taken:
            self._thread = threading.Thread(
                target=self._apply, args=(taken,), name="effects-handover", daemon=True
            )
            self._thread.start()

    def _apply(self, taken: list[tuple[Any, list[Any]]]) -> None:
        core = self.core
        self._collect(
            [
                (
                    b,
                    lambda b=b, g=g: b.bucket.apply_effects(
                        core.name, g, origin=core.origin, marks=core.marked
                    ),
                )
                for b, g in taken
            ]
        )

    def _collect(self, answers: list[tuple[Any, Any]], *, sent: bool = False) -> None:
        """Each binding's EffectResult from its callable. After a failure the others are not applied, or,
        when they were `sent` already (a tail), their answers are taken and dropped (the worker rewinds)."""
        for binding, answer in answers:
            try:
                if self._error is None:
                    self._found.append((binding, answer()))
                elif sent:
                    answer()
            except BaseException as exc:  # noqa: BLE001 - raised by settle(), on the worker's thread
                if self._error is None:
                    self._error = exc
            finally:
                binding.flushed()  # reads of these documents go to the bucket now (after a failure: rewound)

    def take_tail(self) -> None:
        """Take the answers of the writes sent as the last step ended, on the worker's thread: at the next
        settle, or sooner for a read of one of their documents that must wait for them
        (BucketBinding._visible). What they found is counted by settle()."""
        sent, self._sent = self._sent, []
        for binding, _ in sent:
            binding.buf.take_tail = None
        if sent:
            self._collect(sent, sent=True)

    def settle(self) -> None:
        """Wait for the hand-over in flight and count what applying it found into the worker's progress
        (its fenced vBuckets are forgotten by the worker's next look, as a pool's are); raise its failure
        (the caller rewinds)."""
        self.take_tail()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        found, self._found = self._found, []
        error, self._error = self._error, None
        if error is not None:
            raise error
        core = self.core
        for binding, result in found:
            core._fenced_aside |= count_applied(core.progress, core.source, binding.bucket.name, result)

    def close(self) -> None:
        """Wait for the hand-over in flight (a worker being ended): what failed is handled again later."""
        try:
            self.settle()
        except Exception:  # noqa: BLE001 - not checkpointed, so handled again by the next owner
            pass


def count_applied(progress: Any, source: Any, bucket: str, result: Any) -> set[int]:
    """Count what applying a worker's writes to `bucket` found (an EffectResult) into its progress; returns
    the vBuckets found fenced. Calls whose cas condition failed when their writes were applied (another
    writer changed the document after the read) had their writes to `bucket` dropped: they become dead
    letters."""
    counters = progress.counters
    counters[counter_names.EFFECTS_APPLIED] += result.applied
    counters[counter_names.EFFECTS_DUPLICATE] += result.duplicates
    counters[counter_names.EFFECTS_FENCED] += result.fenced_writes
    for vb, seqno in result.conflicts or ():
        counters["bkt_ops_cas_mismatch_count"] += 1
        if vb >= TIMER_VB_BASE:
            m = Mutation(vb, seqno, "", OP_TIMER, 0, None, None, 0, 0)
        else:
            found = source.read_vb(vb, seqno - 1, 1)
            m = (
                found[0]
                if found and found[0].seqno == seqno
                else Mutation(vb, seqno, "", 0, 0, None, None, 0, 0)
            )
        progress.dead_letter(
            m,
            "cas_mismatch",
            f"a write to bucket '{bucket}' found the document changed since the handler read it (cas); "
            "the call's writes to that bucket were not applied; replay the dead letter to run it again",
            "",
            1,
        )
    return result.fenced_vbs
