"""How a worker handles the log rows it reads (``MutationHandler``, a part of ``WorkerCore``,
eventing.workers.worker, built by it): a run of one vBucket's rows (``handle_run``), less those the
function's filter drops (``drop_filtered``), goes to the run handler chosen when the worker was built
(``take_run``): one call a mutation with the common case inlined (``handle_serial``) or through a handler
that takes a run of updates in one call (``handle_batched``, ``run_batch``), else a pool's or on_batch's
(eventing.workers.concurrent_calls, batch_calls); any other mutation one at a time (``handle``); a call's
outcome counted or dead-lettered (``outcome``; the dead letters, counters and positions are the worker's
``WorkerProgress``, eventing.workers.progress).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import msgpack

from eventing.core import counters as counter_names
from eventing.core.filters import CompiledFilter
from eventing.core.mutation import OP_DELETE, OP_EXPIRE, OP_UPDATE, Mutation
from eventing.core.xattrs import user_xattrs
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
from eventing.windows.runtime.row_writer import WindowRowWriter
from eventing.workers.crash_guard import CRASHED, CrashGuard
from eventing.workers.progress import WorkerProgress

_as_mutation = tuple.__new__  # a row tuple as a Mutation, built in C (Mutation(*row) is ~0.3 us)
_unpack = partial(msgpack.unpackb, raw=False)


class MutationHandler:
    """Handles the rows a worker read, one vBucket's run at a time (see the module docstring). Built by
    WorkerCore (eventing.workers.worker) with what it needs; the worker's `progress` (positions, epochs,
    counters, dead letters, letters: eventing.workers.progress) is shared with the worker's other parts."""

    def __init__(
        self,
        progress: WorkerProgress,
        runner: HandlerRunner,
        *,
        origin: str,
        filter: CompiledFilter | None,
        window_rows: WindowRowWriter | None,
        max_bytes: int,
        crash_guard: CrashGuard,
    ):
        self.progress = progress
        self.name = progress.name
        self.origin = origin  # this deployment's writes (eventing.storage.origins): the recursion guard
        self.runner = runner
        # The function's filter (eventing.core.filters): rows it does not match are dropped before any
        # handler path (drop_filtered), or, with previous_version (whose versions follow the log order), one
        # by one in handle.
        self.filter = filter
        self.drops = filter is not None and runner.previous is None
        self.window_rows = window_rows  # rows of a windowed function, else None
        self.max_bytes = max_bytes
        self.crash_guard = crash_guard
        # Changed in place only (eventing.workers.progress): held here for the loops below.
        self.positions, self.epochs, self.lettered = progress.positions, progress.epochs, progress.lettered
        self.on_update = runner.on_update
        self.rw_bindings: list[BucketBinding] = runner.rw_bindings
        self.timers: TimerTable = runner.timers
        self.timeout_s = runner.timeout_s
        self.attempts = runner.policy.max_attempts  # the retry policy's (eventing.core.retry)
        # A handler taking a run of updates in one call (JavaScript: see handle_batched), else None.
        self.batch: Any = getattr(self.on_update, "batch", None)
        self.batch_slice_s: float = getattr(getattr(self.on_update, "handler", None), "slice_s", 0.0)
        self.success = {
            kind: counter_names.handler_outcome(kind, "success") for kind in ("on_update", "on_delete")
        }
        # The run handler, chosen when the worker is built: handle_serial, or a pool's or on_batch's take_run.
        self.take_run: Callable[[int, int, list], int] = self.handle_serial

    def drop_filtered(self, vb: int, position: int, rows: list) -> list:
        """The rows of a run the filter matches, in order (the others counted as filtered). Rows this
        function wrote (recursion guard) and rows this deployment dead-lettered stay: handle counts them."""
        flt = self.filter
        assert flt is not None
        match_update, match_delete, needs_doc, deletes_pass = (
            flt.update,
            flt.delete,
            flt.needs_doc,
            flt.deletes_pass,
        )
        name, lettered, unpack = self.name, self.lettered, msgpack.unpackb
        kept = []
        for row in rows:
            seqno = row[1]
            if seqno <= position:
                self.progress.order_violation(vb, seqno, position)
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
            c = self.progress.counters
            c[counter_names.MUTATIONS_SEEN] += dropped
            c[counter_names.FILTERED] += dropped
        return kept

    def handle_run(
        self, vb: int, position: int, rows: list, take: Callable[[int, int, list], int] | None = None
    ) -> int:
        """A run of one vBucket's log rows (tuples in Mutation's field order): the rows the function's filter
        drops are counted, the others go to the run handler the worker chose when it was built (`take_run`:
        handle_serial, a pool's or on_batch's), or to `take`."""
        take = take or self.take_run
        if self.drops and rows:
            kept = self.drop_filtered(vb, position, rows)
            if kept:
                take(vb, position, kept)
            self.positions[vb] = rows[-1][1]
            return len(rows)
        return take(vb, position, rows)

    def handle_serial(self, vb: int, position: int, rows: list) -> int:
        """handle over a run of one vBucket's log rows, one call a mutation on the worker's thread, with the
        common case inlined: an update of a decodable document within max_document_bytes for on_update, or a
        delete or expiry for on_delete, not written by any function. Anything else (dead letters, the
        recursion guard, window rows, previous_version, a failed call) goes through handle or the runner's
        own failure path, so both ways give the same effects, counters and dead letters. Inlining saves
        ~1.5 us a mutation (no HandlerCall, no dispatch, counters added once a run): a third of a worker's
        cost on a trivial handler."""
        runner = self.runner
        positions = self.positions
        if (
            self.on_update is None
            or self.window_rows is not None
            or runner.previous is not None
            or self.lettered
        ):
            for row in rows:
                m = _as_mutation(Mutation, row)
                if m.seqno <= position:
                    self.progress.order_violation(vb, m.seqno, position)
                self.handle(m)
                position = positions[vb] = m.seqno
            return len(rows)
        if self.batch is not None:
            return self.handle_batched(vb, position, rows)
        on_update, on_delete, rw, timers, meta_type, with_xattrs = (
            self.on_update,
            runner.on_delete,
            self.rw_bindings,
            self.timers,
            runner.meta_type,
            runner.xattrs_arg,
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
            _, seqno, key, op, cas, raw, origin, expiry, flags, _, xattrs = m
            if seqno <= position:
                self.progress.order_violation(vb, seqno, position)
            fn = None
            if origin is not None:
                pass  # another function's write, or this one's (the recursion guard): handle
            elif op == OP_UPDATE:
                if raw is not None and len(raw) <= max_bytes:
                    try:
                        doc = unpack(raw, raw=False)
                    except Exception:  # noqa: BLE001 - handle dead-letters it as undecodable
                        pass
                    else:
                        kind, fn = "on_update", on_update
                        args: tuple = (doc, meta_type(key, cas, vb, seqno, expiry, flags, "json", keyspace))
                        if with_xattrs:  # on_update(doc, meta, xattrs): the user XATTRs as of this mutation
                            args = (*args, user_xattrs(xattrs))
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
                self.handle(m)
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
                        attempts=self.attempts,
                        on_retry=self.count_retry,
                    )
                    self.progress.counters[counter_names.MUTATIONS_SEEN] += 1
                    self.outcome(m, call, failure)
                else:
                    if rw or timers.current:
                        runner.kept(epoch)
                    if doc is None:
                        deleted += 1
                    else:
                        updated += 1
            position = positions[vb] = seqno
        if updated or deleted or no_handler:
            c = self.progress.counters
            c[counter_names.MUTATIONS_SEEN] += updated + deleted + no_handler
            if updated:
                c[self.success["on_update"]] += updated
            if deleted:
                c[self.success["on_delete"]] += deleted
            if no_handler:
                c[counter_names.NO_HANDLER] += no_handler
        return len(rows)

    def handle_batched(self, vb: int, position: int, rows: list) -> int:
        """handle_run for a handler that takes a run of updates in one call (a JavaScript OnUpdate, see
        eventing.execution.javascript, "Batches"): consecutive plain updates (and deletions and expiries, for
        a handler with OnDelete) go to run_batch together, anything else to handle between them, so the order
        is the log's."""
        positions, max_bytes, unpack = self.positions, self.max_bytes, msgpack.unpackb
        with_xattrs = self.runner.xattrs_arg
        deletes = self.runner.on_delete is not None  # OnDelete runs in the batch too
        batch: list[Mutation] = []
        docs: list = []
        for row in rows:
            m = _as_mutation(Mutation, row)
            seqno, raw = m[1], m[5]
            if seqno <= position:
                self.progress.order_violation(vb, seqno, position)
            position = seqno
            if m[3] != OP_UPDATE and deletes and m[6] is None:
                batch.append(m)
                docs.append(None)
                continue
            if (
                m[3] == OP_UPDATE
                and m[6] is None
                and raw is not None
                and len(raw) <= max_bytes
                and not (with_xattrs and m[10] is not None)  # OnUpdate's xattrs: one call of its own
            ):
                try:
                    docs.append(unpack(raw, raw=False))
                except Exception:  # noqa: BLE001 - handle dead-letters it as undecodable
                    pass
                else:
                    batch.append(m)
                    continue
            if batch:
                self.run_batch(vb, batch, docs)
                batch, docs = [], []
            self.handle(m)
            positions[vb] = seqno
        if batch:
            self.run_batch(vb, batch, docs)
        return len(rows)

    def run_batch(self, vb: int, batch: list[Mutation], docs: list) -> None:
        """Plain updates (and deletions) of one vBucket through the handler's batch call, with per-mutation
        outcomes: the writes of each mutation are kept under its own seqno (the handler reports, before a host
        call, which mutation makes it); the first that fails goes through the runner's failure path (retries,
        dead letter) and the batch goes on after it; a batch that stopped at its time slice goes on where it
        stopped."""
        runner, rw, timers, context, positions = (
            self.runner,
            self.rw_bindings,
            self.timers,
            self.runner.context,
            self.positions,
        )
        assert self.batch is not None
        batch_fn, keyspace, epoch = self.batch, runner.keyspace, self.epochs[vb]
        budget_s = self.timeout_s + self.batch_slice_s
        context.epoch = epoch
        handled_ok = deleted_ok = 0
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
                deleted_ok += sum(1 for m in batch[:done] if m[3] != OP_UPDATE)
                positions[vb] = batch[done - 1][1]
            if failed is None:
                batch, docs = batch[done:], docs[done:]
                continue
            m, doc = batch[done], docs[done]
            meta = runner.meta_type(m[2], m[4], vb, m[1], m[7], m[8], "json", keyspace)
            if m[3] == OP_UPDATE:
                call = new_call(HandlerCall, ("on_update", self.on_update, (doc, meta), doc))
            else:
                options = DeleteOptions(expired=m[3] == OP_EXPIRE)
                call = new_call(HandlerCall, ("on_delete", runner.on_delete, (meta, options), None))
            try:
                raise failed
            except BaseException as exc:  # noqa: BLE001 - the runner's failure path decides
                failure = runner.retry_after(
                    exc,
                    m,
                    call,
                    epoch=epoch,
                    attempts=self.attempts,
                    on_retry=self.count_retry,
                )
            self.progress.counters[counter_names.MUTATIONS_SEEN] += 1
            self.outcome(m, call, failure)
            positions[vb] = m[1]
            context.epoch = epoch
            batch, docs = batch[done + 1 :], docs[done + 1 :]
        if handled_ok:
            c = self.progress.counters
            c[counter_names.MUTATIONS_SEEN] += handled_ok
            if handled_ok - deleted_ok:
                c[self.success["on_update"]] += handled_ok - deleted_ok
            if deleted_ok:
                c[self.success["on_delete"]] += deleted_ok

    def handle(self, m: Mutation) -> None:
        c = self.progress.counters
        c[counter_names.MUTATIONS_SEEN] += 1
        if m.origin == self.origin or m.origin == self.name:
            # Recursion guard: this deployment's own binding wrote it (a bare name: written before origins
            # named the deployment, see eventing.storage.origins); handling it again would loop.
            c[counter_names.RECURSION_FILTERED] += 1
            if self.runner.previous is not None:
                self.runner.seen(m)
            return
        if self.lettered and (m.vb, m.seqno) in self.lettered:
            mark = self.lettered[(m.vb, m.seqno)]
            if mark == CRASHED:  # its worker died on it (eventing.workers.crash_guard): no call this time
                error, deaths = self.crash_guard.letter(m)
                self.progress.dead_letter(m, "crashed", error, "", deaths)
            else:
                c[mark] += 1  # this deployment dead-lettered it already (see assign_vbuckets)
            if self.runner.previous is not None:
                self.runner.seen(m)
            return
        if not self.drops and self.filter is not None and not self.filter.matches(m, _unpack):
            c[counter_names.FILTERED] += 1  # with previous_version: its version is still seen, in log order
            if self.runner.previous is not None:
                self.runner.seen(m)
            return
        call = self.runner.prepare(m)
        if type(call) is Rejection:
            if call is NO_HANDLER:
                c[counter_names.NO_HANDLER] += 1
            else:
                self.progress.dead_letter(m, call.status, call.error, "", 0)
            return
        assert type(call) is HandlerCall
        if self.window_rows is not None and call.kind == "on_update":
            if not self.window_rows.add(m, call.doc):
                self.progress.dead_letter(m, "bad_event_time", self.window_rows.rejection, "", 0)
                return
            if call.fn is None:  # a window-only function: the row is the whole effect
                return  # counted as window_rows_written (no handler ran, so no on_update_success)
        failure = self.runner.call(
            m,
            call,
            epoch=self.epochs[m.vb],
            attempts=self.attempts,
            on_retry=self.count_retry,
        )
        self.outcome(m, call, failure)

    def outcome(self, m: Mutation, call: HandlerCall, failure: Failure | None) -> None:
        c = self.progress.counters
        if failure is None:
            c[self.success[call.kind]] += 1
        elif failure.status == "timeout":
            c[counter_names.handler_outcome(call.kind, "timeout")] += 1
            self.progress.dead_letter(m, "timeout", failure.error, "", failure.attempts)
        else:  # error, or expired (retry.max_event_age)
            c[counter_names.handler_outcome(call.kind, "failure")] += 1
            self.progress.dead_letter(
                m, failure.status, failure.error, failure.traceback, failure.attempts, failure.first_failed_at
            )

    def count_retry(self) -> None:
        self.progress.counters[counter_names.RETRIES] += 1
