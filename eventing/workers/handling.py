"""How a worker handles the log rows it reads (``WorkerHandling``, one part of ``WorkerCore``,
eventing.workers.worker): a run of one vBucket's rows, less those the function's filter drops
(``_drop_filtered``), with the common case inlined (``_handle_run``) or through a handler that takes a run
of updates in one call (``_handle_batched``, ``_run_batch``); any other mutation one at a time
(``_handle``); a call's outcome counted or dead-lettered (``_outcome``, ``_dead_letter``); a seqno that goes
backwards refused (``_order_violation``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import msgpack

from eventing.core import counters as counter_names
from eventing.core.filters import CompiledFilter
from eventing.core.mutation import OP_DELETE, OP_EXPIRE, OP_UPDATE, Mutation
from eventing.execution.bindings import BucketBinding
from eventing.execution.runner import (
    NO_HANDLER,
    Failure,
    HandlerCall,
    HandlerRunner,
    HandlerTimeout,
    Rejection,
    new_call,
)
from eventing.execution.timers import TimerTable
from eventing.handler import DeleteOptions
from eventing.storage.protocol import Bucket
from eventing.windows.runtime.row_writer import WindowRowWriter
from eventing.workers.crash_guard import CRASHED, CrashGuard
from eventing.workers.progress import WorkerProgress
from metadata import DlqRow

_as_mutation = tuple.__new__  # a row tuple as a Mutation, built in C (Mutation(*row) is ~0.3 us)
_unpack = partial(msgpack.unpackb, raw=False)


class WorkerHandling:
    """Handling mutations. A part of WorkerCore (eventing.workers.worker), which sets these."""

    name: str
    origin: str  # this deployment's writes (eventing.storage.origins): the recursion guard
    spec: Any  # the core's WorkerSpec (eventing.workers.worker): a dead letter carries its generation
    source: Bucket
    runner: HandlerRunner
    rw_bindings: list[BucketBinding]
    timers: TimerTable
    window_rows: WindowRowWriter | None
    filter: CompiledFilter | None
    _drops: bool
    on_update: Any
    _batch: Any
    _batch_slice_s: float
    max_bytes: int
    timeout_s: float
    _attempts: int
    _success: dict[str, str]
    positions: dict[int, int]
    epochs: dict[int, int]
    counters: Counter[str]
    dlq: list[DlqRow]
    _lettered: dict[tuple[int, int], str]
    # The run handler chosen when the worker was built: _handle_serial, a pool's or on_batch's take_run.
    _take_run: Callable[[int, int, list], int]
    crash_guard: CrashGuard
    progress: WorkerProgress

    def _drop_filtered(self, vb: int, position: int, rows: list) -> list:
        """The rows of a run the filter matches, in order (the others counted as filtered). Rows this
        function wrote (recursion guard) and rows this deployment dead-lettered stay: _handle counts them."""
        flt = self.filter
        assert flt is not None
        match_update, match_delete, needs_doc, deletes_pass = (
            flt.update,
            flt.delete,
            flt.needs_doc,
            flt.deletes_pass,
        )
        name, lettered, unpack = self.name, self._lettered, msgpack.unpackb
        kept = []
        for row in rows:
            seqno = row[1]
            if seqno <= position:
                self._order_violation(vb, seqno, position)
            position = seqno
            if row[6] == name or (lettered and (vb, seqno) in lettered):
                kept.append(row)
                continue
            raw = row[5]
            if row[3] != OP_UPDATE or raw is None:
                ok = deletes_pass or match_delete(row)
            elif needs_doc:
                try:
                    ok = match_update(row, unpack(raw, raw=False))
                except Exception:  # noqa: BLE001 - undecodable: the handler path dead-letters it
                    ok = True
            else:
                ok = match_update(row, None)
            if ok:
                kept.append(row)
        dropped = len(rows) - len(kept)
        if dropped:
            c = self.counters
            c[counter_names.MUTATIONS_SEEN] += dropped
            c[counter_names.FILTERED] += dropped
        return kept

    def _handle_run(
        self, vb: int, position: int, rows: list, take: Callable[[int, int, list], int] | None = None
    ) -> int:
        """A run of one vBucket's log rows (tuples in Mutation's field order): the rows the function's filter
        drops are counted, the others go to the run handler the worker chose when it was built (`_take_run`:
        _handle_serial, a pool's or on_batch's), or to `take`."""
        take = take or self._take_run
        if self._drops and rows:
            kept = self._drop_filtered(vb, position, rows)
            if kept:
                take(vb, position, kept)
            self.positions[vb] = rows[-1][1]
            return len(rows)
        return take(vb, position, rows)

    def _handle_serial(self, vb: int, position: int, rows: list) -> int:
        """_handle over a run of one vBucket's log rows, one call a mutation on the worker's thread, with the common
        case inlined: an update of a decodable document within max_document_bytes for on_update, or a delete
        or expiry for on_delete, not written by any function. Anything else (dead letters, the recursion
        guard, window rows, previous_version, a failed call) goes through _handle or the runner's own failure
        path, so both ways give the same effects, counters and dead letters. Inlining saves ~1.5 us a mutation (no
        HandlerCall, no dispatch, counters added once a run): a third of a worker's cost on a trivial handler."""
        runner = self.runner
        positions = self.positions
        if (
            self.on_update is None
            or self.window_rows is not None
            or runner.previous is not None
            or self._lettered
        ):
            for row in rows:
                m = _as_mutation(Mutation, row)
                if m.seqno <= position:
                    self._order_violation(vb, m.seqno, position)
                self._handle(m)
                position = positions[vb] = m.seqno
            return len(rows)
        if self._batch is not None:
            return self._handle_batched(vb, position, rows)
        on_update, on_delete, rw, timers, meta_type = (
            self.on_update,
            runner.on_delete,
            self.rw_bindings,
            self.timers,
            runner.meta_type,
        )
        keyspace, max_bytes, epoch, unpack, monotonic = (
            runner.keyspace,
            self.max_bytes,
            self.epochs[vb],
            msgpack.unpackb,
            time.monotonic,
        )
        context, timeout_s = runner.context, self.timeout_s  # CallContext.begin, inlined below
        context.epoch = epoch
        updated = deleted = no_handler = 0
        for row in rows:
            m = _as_mutation(Mutation, row)
            _, seqno, key, op, cas, raw, origin, expiry, flags, _ = m
            if seqno <= position:
                self._order_violation(vb, seqno, position)
            fn = None
            if origin is not None:
                pass  # another function's write, or this one's (the recursion guard): _handle
            elif op == OP_UPDATE:
                if raw is not None and len(raw) <= max_bytes:
                    try:
                        doc = unpack(raw, raw=False)
                    except Exception:  # noqa: BLE001 - _handle dead-letters it as undecodable
                        pass
                    else:
                        kind, fn = "on_update", on_update
                        args: tuple = (doc, meta_type(key, cas, vb, seqno, expiry, flags, "json", keyspace))
            elif op == OP_DELETE or op == OP_EXPIRE:
                doc = None
                if on_delete is None:
                    no_handler += 1
                    position = positions[vb] = seqno
                    continue
                kind, fn = "on_delete", on_delete
                args = (
                    meta_type(key, cas, vb, seqno, expiry, flags, "json", keyspace),
                    DeleteOptions(expired=op == OP_EXPIRE),
                )
            if fn is None:
                self._handle(m)
            else:
                for b in rw:
                    b.begin(vb, seqno)
                context.mutation = m
                context.deadline = monotonic() + timeout_s
                context.active = True
                try:
                    fn(*args)
                    context.active = False
                except BaseException as exc:
                    context.active = False
                    call = new_call(HandlerCall, (kind, fn, args, doc))
                    failure = runner.retry_after(
                        exc,
                        m,
                        call,
                        epoch=epoch,
                        attempts=self._attempts,
                        on_retry=self._count_retry,
                    )
                    self.counters[counter_names.MUTATIONS_SEEN] += 1
                    self._outcome(m, call, failure)
                else:
                    if rw or timers.current:
                        runner.kept(epoch)
                    if doc is None:
                        deleted += 1
                    else:
                        updated += 1
            position = positions[vb] = seqno
        if updated or deleted or no_handler:
            c = self.counters
            c[counter_names.MUTATIONS_SEEN] += updated + deleted + no_handler
            if updated:
                c[self._success["on_update"]] += updated
            if deleted:
                c[self._success["on_delete"]] += deleted
            if no_handler:
                c[counter_names.NO_HANDLER] += no_handler
        return len(rows)

    def _handle_batched(self, vb: int, position: int, rows: list) -> int:
        """_handle_run for a handler that takes a run of updates in one call (a JavaScript OnUpdate, see
        eventing.execution.javascript, "Batches"): consecutive plain updates go to _run_batch together,
        anything else to _handle between them, so the order is the log's."""
        positions, max_bytes, unpack = self.positions, self.max_bytes, msgpack.unpackb
        batch: list[Mutation] = []
        docs: list = []
        for row in rows:
            m = _as_mutation(Mutation, row)
            seqno, raw = m[1], m[5]
            if seqno <= position:
                self._order_violation(vb, seqno, position)
            position = seqno
            if m[3] == OP_UPDATE and m[6] is None and raw is not None and len(raw) <= max_bytes:
                try:
                    docs.append(unpack(raw, raw=False))
                except Exception:  # noqa: BLE001 - _handle dead-letters it as undecodable
                    pass
                else:
                    batch.append(m)
                    continue
            if batch:
                self._run_batch(vb, batch, docs)
                batch, docs = [], []
            self._handle(m)
            positions[vb] = seqno
        if batch:
            self._run_batch(vb, batch, docs)
        return len(rows)

    def _run_batch(self, vb: int, batch: list[Mutation], docs: list) -> None:
        """Plain updates of one vBucket through the handler's batch call, with per-mutation outcomes: the
        writes of each mutation are kept under its own seqno (the handler reports, before a host call, which
        mutation makes it); the first that fails goes through the runner's failure path (retries, dead
        letter) and the batch goes on after it; a batch that stopped at its time slice goes on where it
        stopped."""
        runner, rw, timers, context, positions = (
            self.runner,
            self.rw_bindings,
            self.timers,
            self.runner.context,
            self.positions,
        )
        assert self._batch is not None
        batch_fn, keyspace, epoch = self._batch, runner.keyspace, self.epochs[vb]
        budget_s = self.timeout_s + self._batch_slice_s
        context.epoch = epoch
        handled_ok = 0
        while batch:
            at = 0

            def on_start(i: int, part: list[Mutation] = batch) -> None:
                nonlocal at
                if rw or timers.current:
                    runner.kept(epoch)  # mutation `at` returned: the ones between made no host call
                m = part[i]
                for b in rw:
                    b.begin(vb, m[1])
                context.mutation = m
                at = i

            first = batch[0]
            for b in rw:
                b.begin(vb, first[1])
            context.mutation = first
            context.deadline = time.monotonic() + budget_s
            context.active = True
            try:
                done, failed = batch_fn(batch, docs, keyspace, on_start)
            except HandlerTimeout as exc:  # the worker's SIGALRM outside V8: the mutation in progress
                done, failed = at, exc
            finally:
                context.active = False
            if at < done and (rw or timers.current):
                runner.kept(epoch)
            if done:
                handled_ok += done
                positions[vb] = batch[done - 1][1]
            if failed is None:
                batch, docs = batch[done:], docs[done:]
                continue
            m, doc = batch[done], docs[done]
            meta = runner.meta_type(m[2], m[4], vb, m[1], m[7], m[8], "json", keyspace)
            call = new_call(HandlerCall, ("on_update", self.on_update, (doc, meta), doc))
            try:
                raise failed
            except BaseException as exc:  # noqa: BLE001 - the runner's failure path decides
                failure = runner.retry_after(
                    exc,
                    m,
                    call,
                    epoch=epoch,
                    attempts=self._attempts,
                    on_retry=self._count_retry,
                )
            self.counters[counter_names.MUTATIONS_SEEN] += 1
            self._outcome(m, call, failure)
            positions[vb] = m[1]
            context.epoch = epoch
            batch, docs = batch[done + 1 :], docs[done + 1 :]
        if handled_ok:
            c = self.counters
            c[counter_names.MUTATIONS_SEEN] += handled_ok
            c[self._success["on_update"]] += handled_ok

    def _handle(self, m: Mutation) -> None:
        c = self.counters
        c[counter_names.MUTATIONS_SEEN] += 1
        if m.origin == self.origin or m.origin == self.name:
            # Recursion guard: this deployment's own binding wrote it (a bare name: written before origins
            # named the deployment, see eventing.storage.origins); handling it again would loop.
            c[counter_names.RECURSION_FILTERED] += 1
            if self.runner.previous is not None:
                self.runner.seen(m)
            return
        if self._lettered and (m.vb, m.seqno) in self._lettered:
            mark = self._lettered[(m.vb, m.seqno)]
            if mark == CRASHED:  # its worker died on it (eventing.workers.crash_guard): no call this time
                error, deaths = self.crash_guard.letter(m)
                self._dead_letter(m, "crashed", error, "", deaths)
            else:
                c[mark] += 1  # this deployment dead-lettered it already (see assign_vbuckets)
            if self.runner.previous is not None:
                self.runner.seen(m)
            return
        if not self._drops and self.filter is not None and not self.filter.matches(m, _unpack):
            c[counter_names.FILTERED] += 1  # with previous_version: its version is still seen, in log order
            if self.runner.previous is not None:
                self.runner.seen(m)
            return
        call = self.runner.prepare(m)
        if type(call) is Rejection:
            if call is NO_HANDLER:
                c[counter_names.NO_HANDLER] += 1
            else:
                self._dead_letter(m, call.status, call.error, "", 0)
            return
        assert type(call) is HandlerCall
        if self.window_rows is not None and call.kind == "on_update":
            if not self.window_rows.add(m, call.doc):
                self._dead_letter(m, "bad_event_time", self.window_rows.rejection, "", 0)
                return
            if call.fn is None:  # a window-only function: the row is the whole effect
                return  # counted as window_rows_written (no handler ran, so no on_update_success)
        failure = self.runner.call(
            m,
            call,
            epoch=self.epochs[m.vb],
            attempts=self._attempts,
            on_retry=self._count_retry,
        )
        self._outcome(m, call, failure)

    def _outcome(self, m: Mutation, call: HandlerCall, failure: Failure | None) -> None:
        c = self.counters
        if failure is None:
            c[self._success[call.kind]] += 1
        elif failure.status == "timeout":
            c[counter_names.handler_outcome(call.kind, "timeout")] += 1
            self._dead_letter(m, "timeout", failure.error, "", failure.attempts)
        else:  # error, or expired (retry.max_event_age)
            c[counter_names.handler_outcome(call.kind, "failure")] += 1
            self._dead_letter(
                m, failure.status, failure.error, failure.traceback, failure.attempts, failure.first_failed_at
            )

    def _count_retry(self) -> None:
        self.counters[counter_names.RETRIES] += 1

    def _dead_letter(
        self, m: Mutation, reason: str, error: str, tb: str, attempts: int, first: float = 0.0
    ) -> None:
        self.progress.dead_letter(m, reason, error, tb, attempts, first)

    def _order_violation(self, vb: int, seqno: int, position: int) -> None:
        self.progress.order_violation(vb, seqno, position)
