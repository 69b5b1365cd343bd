"""A worker whose handler defines `on_batch(batch)` (eventing.execution.batch): `BatchCalls`, attached to a
WorkerCore, built with the worker's parts it works with (its MutationHandler and SourceReader). Without
on_batch nothing here runs and the worker keeps its one-call-at-a-time path.

How a batch runs (see docs/handler-api.md, "Batch handlers"):

1. The worker reads its batch as it always does (SourceReader.process), but each run of rows is only sorted
   out (`take_run`): rows this deployment wrote (the recursion guard), rows it dead-lettered, rows the filter
   drops and documents that cannot be handled (oversize, undecodable) are counted or dead-lettered on the
   spot; the others join the batch, with their documents decoded. A plain run of a file source is read in
   bulk instead (`take_packed`: keys and documents back to back, no Python object per row).
2. Once the batch is read, on_batch runs on all of it (`_run`). Each item's binding writes and timer
   changes are held apart (BatchScope); the items that succeeded keep theirs, each under its own source
   (vBucket, seqno), so they apply exactly once like any call's.
3. The failed items, and the later items of the same documents (they ran after a failure), run again in a
   batch of their own after the retry policy's wait (eventing.core.retry); an item that fails with a
   non-retryable error, past max_event_age, or at the last attempt is dead-lettered, and the later items of
   its document keep what they did. A batch that raised fails every item; one past execution_timeout
   dead-letters every item as `timeout`.
4. Kept writes are put back in seqno order per vBucket once the batch is done (a retried item keeps its
   writes after the later ones of other documents), as the effect marks need; nothing is flushed before.
5. While on_batch runs, the worker's call notes (eventing.workers.crash_guard) name every vBucket's span of
   the batch, one note slot each. A handler that ends the process leaves those spans as suspects: the
   next start runs their items one at a time, each a batch of one with a note of its own (`run_alone`),
   so the item that kills the worker again has its death counted and is dead-lettered as `crashed`.
"""

from __future__ import annotations

import time
from functools import partial
from operator import itemgetter
from typing import Any

import msgpack

from eventing.core import counters as counter_names
from eventing.core.counters import HandlerKind
from eventing.core.mutation import OP_UPDATE, Mutation
from eventing.core.retry import attempts_text, error_names
from eventing.execution import batch_columns
from eventing.execution.batch import Batch, BatchScope, _Segment, failed_items
from eventing.execution.context import HandlerTimeout
from eventing.execution.handler_trace import error_text, handler_traceback
from eventing.workers.collections import COLLECTION_MARK_BYTES
from eventing.workers.handling import MutationHandler
from eventing.workers.source_reads import SourceReader

_as_mutation = partial(tuple.__new__, Mutation)
_by_seqno = itemgetter(0)
NOTE_SLOTS = 1024  # call-note slots a batch may fill: one per vBucket of the batch (slot 0 stays free)


class BatchCalls:
    """The on_batch path of one WorkerCore (eventing.workers.worker): what the worker's `reader` reads
    (eventing.workers.source_reads) goes to on_batch, with its `handler`'s counters and dead letters
    (eventing.workers.handling) and the worker's progress (eventing.workers.progress)."""

    def __init__(self, handler: MutationHandler, reader: SourceReader):
        self.handler = handler
        self.reader = reader
        self.progress = handler.progress
        self.runner = handler.runner
        self.notes = reader.crash_guard.notes
        assert handler.runner.on_batch is not None  # attach
        self.on_batch = handler.runner.on_batch
        self.segments: list[_Segment] = []
        self.spans: dict[int, tuple[int, int]] = {}  # vb -> (first, last) seqno of the segments taken
        # Plain runs of a file source read in bulk; through the data service, the rows read ahead instead.
        self.reads_packed = (
            not reader.reads_ahead and handler.filter is None and reader.collections.source_is_default
        )

    def process(self, work: list[int], limits: dict[int, int], budget: int) -> int:
        """SourceReader.process with on_batch run on what it read, returning once the batch is handled."""
        try:
            return self.reader.process(work, limits, budget)
        finally:
            # Even when reading raised: positions already moved past the rows taken, so they are handled.
            self.flush()

    def flush(self) -> None:
        """on_batch over the segments taken so far, with each vBucket's span of them in the call notes."""
        segments, spans, self.segments, self.spans = self.segments, self.spans, [], {}
        if not segments:
            return
        notes = self.notes
        noted = list(spans.items())[:NOTE_SLOTS]
        for slot, (vb, (first, last)) in enumerate(noted, 1):
            notes.note(slot, vb, first, last)
        try:
            self._run(Batch.build(self.runner, segments))
        finally:
            for slot in range(1, len(noted) + 1):
                notes.clear(slot)

    def run_alone(self, vb: int, position: int, row: Any) -> None:
        """One suspect (eventing.workers.crash_guard.handle_alone): what was taken before it runs first, then
        it alone, as a batch of one, noted alone (its death is counted against it)."""
        self.flush()
        notes = self.notes
        notes.note(0, vb, row[1], row[1])
        try:
            self.handler.handle_run(vb, position, [row], self.take_run)
            segments, self.segments, self.spans = self.segments, [], {}
            if segments:
                self._run(Batch.build(self.runner, segments))
        finally:
            notes.clear(0)

    def _span(self, vb: int, first: int, last: int) -> None:
        known = self.spans.get(vb)
        self.spans[vb] = (first, last) if known is None else (min(known[0], first), max(known[1], last))

    # -- reading ---------------------------------------------------------------------------------------

    def take_run(self, vb: int, position: int, rows: list) -> int:
        """The run handler for on_batch (MutationHandler.handle_run, past the filter): sorts a run of one
        vBucket's rows into the batch."""
        handler, progress = self.handler, self.progress
        positions, handle = progress.positions, handler.handle
        own, name, lettered, max_bytes = handler.origin, handler.name, progress.lettered, handler.max_bytes
        items: list = []
        docs: list = []
        for row in rows:
            seqno = row[1]
            if seqno <= position:
                progress.order_violation(vb, seqno, position)
            position = seqno
            origin, raw = row[6], row[5]
            if (origin is not None and (origin == own or origin == name)) or (
                lettered and (vb, seqno) in lettered
            ):
                handle(_as_mutation(row))  # the recursion guard, or a letter of this deployment: no call
                continue
            if row[3] == OP_UPDATE:
                try:
                    if raw is None or len(raw) > max_bytes:
                        raise ValueError
                    doc = msgpack.unpackb(raw, raw=False)
                except Exception:  # noqa: BLE001 - handle dead-letters it (oversize, undecodable)
                    handle(_as_mutation(row))
                    continue
            else:
                doc = None
            items.append(row)
            docs.append(doc)
        if items:
            seg = _Segment(vb, items, keyspace=self.runner.keyspace)
            seg.docs = docs
            self.segments.append(seg)
            self._span(vb, items[0][1], items[-1][1])
        if rows:
            positions[vb] = position
        return len(rows)

    def take_packed(self, vb: int, position: int, limit: int) -> int:
        """The next `limit` log entries of a vBucket read in bulk into the batch when they are plain (no
        write of this deployment, no letter of it, documents within max_document_bytes that decode); 0
        leaves them to the rows (take_run), which handle every case."""
        lettered, max_bytes = self.progress.lettered, self.handler.max_bytes
        if lettered and any(lettered_vb == vb for lettered_vb, _ in lettered):
            return 0
        if vb in self.reader.crash_guard.suspects:  # its rows go through handle_alone
            return 0
        source = self.reader.source
        p = source.read_vb_packed(vb, position, limit, self.handler.name)
        if (
            p is None
            or (p.other_seqnos and p.other_ops is None)
            or COLLECTION_MARK_BYTES in p.keys
            or COLLECTION_MARK_BYTES in p.other_keys
        ):
            return 0
        if len(p.docs) > max_bytes and source.max_doc_bytes(vb, position, p.last_seqno) > max_bytes:
            return 0
        # Each document one whole msgpack value; they are decoded when on_batch asks for them (eventing.
        # execution.batch_columns), all at once or a field at a time.
        if not batch_columns.well_formed(p):
            return 0  # a malformed document: the rows dead-letter it
        seg = _Segment(
            vb,
            None,
            packed=p,
            load=partial(source.read_vb_rows, vb, position, p.count),
            keyspace=self.runner.keyspace,
        )
        self.segments.append(seg)
        self._span(vb, position + 1, p.last_seqno)
        self.progress.positions[vb] = p.last_seqno
        return p.count

    # -- running ---------------------------------------------------------------------------------------

    def _run(self, batch: Batch) -> None:
        """on_batch over the batch, its failures retried as the retry policy says (see the module
        docstring)."""
        handler, runner = self.handler, self.runner
        policy, attempts, epochs = runner.policy, handler.attempts, self.progress.epochs
        c = self.progress.counters
        c[counter_names.MUTATIONS_SEEN] += len(batch)
        errors: dict[tuple[int, int], list[tuple[int, float, str]]] = {}
        traces: dict[tuple[int, int], str] = {}
        retried = False
        attempt = 1
        while True:
            scope, failed, raised, trace = self._call(batch)
            n = len(batch)
            now = time.time()
            if raised is not None and isinstance(raised, HandlerTimeout):
                scope.discard()
                error = f"on_batch ran longer than execution_timeout ({handler.timeout_s}s) on a batch of {n}"
                for i in range(n):
                    self._letter(batch, i, "timeout", error, "", attempt, errors, now)
                break
            if raised is not None:
                failed = dict.fromkeys(range(n), raised)
            undecodable = batch.undecodable  # what it did with a document it got as None is not kept
            for i in undecodable:
                failed.pop(i, None)
            statuses, retry_after = runner.context.seen()
            delay = policy.backoff(attempt, retry_after)
            retry: set[int] = set()
            letters: dict[int, tuple[str, str]] = {}
            for i, error in failed.items():
                text = _error_text(error)
                where = batch.where(i)
                errors.setdefault(where, []).append((attempt, now, text))
                if raised is not None and trace:
                    traces[where] = trace
                refused = policy.refuses(
                    error_names(error) if isinstance(error, BaseException) else (), statuses
                )
                if refused is not None:
                    letters[i] = ("error", f"{text} (non_retryable: {refused})")
                elif attempt >= attempts:
                    letters[i] = ("error", text)
                elif policy.expired(_event_ms(batch.mutation(i)), delay, now):
                    letters[i] = ("expired", f"{text} (older than retry.max_event_age, not retried)")
                else:
                    retry.add(i)
            for i, why in undecodable.items():
                letters[i] = ("undecodable", why)
            # The later items of a document whose item runs again ran after its failure: they run again too.
            if retry:
                first: dict[tuple[int, str], int] = {}
                for i in sorted(retry):
                    first.setdefault((batch.where(i)[0], batch.keys[i]), batch.where(i)[1])
                for i in range(n):
                    seqno = first.get((batch.where(i)[0], batch.keys[i]))
                    if seqno is not None and batch.where(i)[1] > seqno and i not in undecodable:
                        retry.add(i)
                        letters.pop(i, None)
            done = n - len(retry | letters.keys() | failed.keys())  # the items that keep what they did
            vbs, ops = batch._vbs, batch._ops
            if done == n:
                deletes = n - ops.count(OP_UPDATE)
                for i in sorted(scope.held):  # items without writes or timer changes have nothing to keep
                    scope.restore(i)
                    runner.kept(epochs[vbs[i]])
            else:
                deletes = 0
                for i in range(n):
                    if i in retry or i in letters or i in failed:
                        continue
                    deletes += ops[i] != OP_UPDATE
                    if i in scope.held:
                        scope.restore(i)
                        runner.kept(epochs[vbs[i]])
            scope.discard()
            if done - deletes:
                c[handler.success["on_update"]] += done - deletes
            if deletes:
                c[handler.success["on_delete"]] += deletes
            for i, (reason, text) in sorted(letters.items()):
                self._letter(batch, i, reason, text, traces.get(batch.where(i), ""), attempt, errors, now)
            if not retry:
                break
            retried = True
            c[counter_names.RETRIES] += len(retry)
            time.sleep(delay)
            batch = batch.subset(sorted(retry))
            attempt += 1
        if retried:  # writes kept in seqno order per vBucket again (see the module docstring, 4)
            for binding in runner.rw_bindings:
                for group in binding.buf.groups.values():
                    group.writes.sort(key=_by_seqno)

    def _call(self, batch: Batch) -> tuple[BatchScope, dict[int, Any], BaseException | None, str]:
        """One on_batch call: its scope (the items' held writes), the failed items, and what it raised."""
        runner = self.runner
        context = runner.context
        scope = BatchScope(runner, batch)
        failed: dict[int, Any] = {}
        raised: BaseException | None = None
        trace = ""
        context.mutation = batch.light_mutation(0)
        context.deadline = time.monotonic() + self.handler.timeout_s
        context.active = True
        try:
            result = self.on_batch(batch)
            context.active = False
            failed = failed_items(result, batch)
        except Exception as exc:  # HandlerTimeout included: the runner's failure path, per item
            context.active = False
            raised = exc
            trace = getattr(exc, "js_stack", None) or handler_traceback(exc)
        finally:
            context.active = False
            scope.end()
        return scope, failed, raised, trace

    def _letter(
        self,
        batch: Batch,
        i: int,
        reason: str,
        error: str,
        trace: str,
        attempt: int,
        errors: dict[tuple[int, int], list[tuple[int, float, str]]],
        now: float,
    ) -> None:
        """Item i of the batch as a dead letter, with every attempt's error."""
        progress = self.progress
        m = batch.mutation(i)
        kind: HandlerKind = "on_update" if m.op == OP_UPDATE else "on_delete"
        progress.counters[
            counter_names.handler_outcome(kind, "timeout" if reason == "timeout" else "failure")
        ] += 1
        tried = errors.get((m.vb, m.seqno), [])
        if len(tried) > 1:
            trace = f"{trace.rstrip()}\n{attempts_text(tried)}" if trace else attempts_text(tried)
        progress.dead_letter(m, reason, error, trace, attempt, tried[0][1] if tried else now)


def _error_text(error: Any) -> str:
    if isinstance(error, BaseException):
        return error_text(error)
    if error:
        return f"on_batch reported the item failed: {error}"
    return "on_batch reported the item failed"


def _event_ms(m: Mutation) -> int:
    return m.arrival_ms


def attach(handler: MutationHandler, reader: SourceReader) -> BatchCalls | None:
    """The on_batch path for a worker whose handler defines on_batch, else None (nothing changes)."""
    if handler.runner.on_batch is None:
        return None
    return BatchCalls(handler, reader)
