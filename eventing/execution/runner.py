"""The one way a function's stored handler runs on a mutation: for workers, the debugger and DLQ replay.

`HandlerRunner` loads the handler source with its real bindings (aliases of one bucket share one effect
buffer, so they see each other's writes and their writes reach the bucket in the order they were made),
decides what a mutation needs (`prepare`: a handler call, or a rejection such as an oversize or
undecodable document), and runs the call (`call`): the call's binding writes are held until it returns,
kept on success and discarded when it raises or times out, with retries and backoff as configured. What
happens next (counters and dead letters in a worker, a trace in the debugger, a replay mark in the DLQ)
belongs to the caller.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import msgpack

from eventing import handler as handler_api
from eventing.core.definition import FunctionDefinition
from eventing.core.idempotency import key_base, key_of
from eventing.core.keyspaces import key_prefix
from eventing.core.mutation import OP_EXPIRE, OP_TIMER, OP_UPDATE, Mutation
from eventing.core.retry import attempts_text, error_names
from eventing.core.xattrs import user_xattrs
from eventing.execution.bindings import BucketBinding, ConcurrentEffectBuffer, EffectBuffer
from eventing.execution.context import CallContext, HandlerTimeout  # noqa: F401 - HandlerTimeout: its older home
from eventing.execution.curl import CurlClient, url_bindings
from eventing.execution.handler_trace import error_text, handler_traceback
from eventing.execution.limits import Limits
from eventing.execution.loader import load_handler, takes_xattrs
from eventing.execution.refusals import refused_hint
from eventing.execution.timers import ConcurrentTimerTable, TimerTable
from eventing.execution.wildcard_bindings import WildcardBinding
from eventing.handler import DeleteOptions, Meta
from eventing.storage.keyspace import collection_id
from eventing.storage.protocol import BindingBucket
from eventing.storage.remote import AnyBucket
from eventing.storage.state import AppLogWriter as AppLogSink
from eventing.storage.state import StateLike, as_state

HandlerKind = Literal["on_update", "on_delete", "timer"]
FailureStatus = Literal["error", "timeout", "quit", "expired"]
Invoke = Callable[..., Any]  # invoke(fn, *args): a plain call, or pdb's runcall in the debugger


PREVIOUS_CACHE_KEYS = 1_000_000  # previous_version's cache of latest versions, cleared when it reaches this
_UNSEEN = object()


class HandlerQuit(Exception):
    """The user quit the debugger before the handler returned."""


class HandlerCall(NamedTuple):
    """A mutation that reaches a handler. `fn` is None for a windowed function without that entry point
    (its window row is the whole effect); `doc` is the decoded document of an update, else None."""

    kind: HandlerKind
    fn: Callable[..., Any] | None
    args: tuple
    doc: Any


class Rejection(NamedTuple):
    """A mutation that never reaches a handler: no handler for its operation, or a document that cannot
    be handled (`oversize`, `undecodable`: a dead-letter reason)."""

    status: Literal["no_handler", "oversize", "undecodable", "timer_error"]
    error: str = ""


NO_HANDLER = Rejection("no_handler")
# Builds a HandlerCall in C: HandlerCall(...) goes through a generated Python __new__, ~0.3 us a mutation on
# the hot path.
_new_call = new_call = tuple.__new__


@dataclass
class Failure:
    """A handler call that did not return: its writes were discarded. `traceback` ends with every attempt's
    error when there was more than one (eventing.core.retry.attempts_text)."""

    status: FailureStatus
    kind: HandlerKind
    error: str
    traceback: str
    attempts: int
    first_failed_at: float


class Tried:
    """The failed attempts of a call so far: when the first failed, each one's error, and how long to wait
    before the next (the retry policy's backoff, or a server's Retry-After)."""

    __slots__ = ("first_failed", "errors", "delay_s", "raised")

    def __init__(self, first_failed: float):
        self.first_failed = first_failed
        self.errors: list[tuple[int, float, str]] = []
        self.delay_s = 0.0
        # Each attempt's exception: a later attempt runs while an earlier one's is being handled, so Python
        # chains it to that one, which a dead letter lists under Attempts: rather than as its cause.
        self.raised: list[BaseException] = []


def _unchain(exc: BaseException, earlier: list[BaseException]) -> None:
    """Cut every link of `exc`'s chain (its causes and contexts) to an earlier attempt's exception, which a
    dead letter lists under Attempts: (see Tried); the handler's own causes stay."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        e = pending.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if any(e.__context__ is x for x in earlier):
            e.__context__ = None
        pending.extend(x for x in (e.__cause__, e.__context__) if x is not None)


@dataclass(frozen=True)
class HeldWrite:
    """A kept binding write not applied anywhere yet (the debugger and DLQ replay apply them themselves)."""

    alias: str
    bucket: BindingBucket
    seqno: int  # the source seqno that caused it
    write: Any  # eventing.storage.values.Write


class HandlerRunner:
    """A function's stored handler, loaded in this process with its bindings."""

    def __init__(
        self,
        function: str,
        defn: FunctionDefinition,
        source_code: str,
        source: AnyBucket,
        open_bucket: Callable[[str], AnyBucket],
        app_log: AppLogSink | None = None,
        *,
        limit_share: float = 1.0,
    ):
        self.function = function
        self.defn = defn
        self.policy = defn.retry_policy
        self.source = source
        # Idempotency keys (eventing.core.idempotency): meta.idempotency_key, and curl's header.
        self.key_base = key_base(function, source.uuid)
        self.meta_type: type[Meta] = type("Meta", (Meta,), {"__slots__": (), "key_base": self.key_base})
        self.buckets: dict[str, AnyBucket] = {source.name: source}
        self.bindings: list[BucketBinding] = []
        injected: dict[str, object] = dict(defn.constants)
        buffers: dict[str, EffectBuffer] = {}
        # Several calls at once (concurrency > 1, eventing.workers.concurrent_calls): the call in progress is
        # per thread. concurrency 1 keeps the plain classes, whose hot path has no thread-local lookups.
        self.concurrent = defn.concurrency > 1
        buffer_class = ConcurrentEffectBuffer if self.concurrent else EffectBuffer
        for b in defn.bindings:
            if b.bucket not in self.buckets:
                self.buckets[b.bucket] = open_bucket(b.bucket)
            buffer = buffers.setdefault(b.bucket, buffer_class())  # aliases of one bucket share writes
            bucket = self.buckets[b.bucket]
            if b.keyspace.is_wildcard:  # several collections, reached with the document's keyspace
                binding: BucketBinding = WildcardBinding(
                    b.alias, bucket, b.access, function, buffer, b.keyspace
                )
            else:
                cid = collection_id(bucket, b.keyspace)  # the binding's collection (a NotFoundError names it)
                # A read-write binding of a mirror's collection (a definition stored before its collection was
                # made a mirror under the same name) refuses every write: the mutation is dead-lettered,
                # nothing is applied.
                mirror = bucket.mirrors().get(cid) if cid and b.access == "rw" else None
                binding = BucketBinding(b.alias, bucket, b.access, function, buffer, key_prefix(cid), mirror)
            injected[b.alias] = binding
            self.bindings.append(binding)
        self.rw_bindings = [b for b in self.bindings if b.access == "rw"]
        self.windowed = defn.window is not None
        self.timeout_s = defn.execution_timeout.total_seconds()
        # The call in flight: read by curl, timers and log(), and by a worker's watchdog and hang guard
        # (another thread or a signal handler).
        self.context = CallContext(self.timeout_s)
        self.timers = (ConcurrentTimerTable if self.concurrent else TimerTable)(
            function, defn.timer_context_size, self.context
        )
        # The state's application log (a worker behind the data service passes one that sends its lines
        # there).
        self.app_log = app_log
        injected["log"] = FunctionLog(function, self.app_log, self.context)
        urls, secrets = url_bindings(defn.url_bindings)  # the handler sees no secret: curl adds it
        # The URL bindings' limits, shared with every process running the function on this machine, which
        # takes `limit_share` of them (eventing.execution.limits).
        self.limits = Limits(function, source.uuid, limit_share)
        self.curl = CurlClient(
            self.context, urls, defn.curl_max_response_bytes, secrets, keys=self.call_key, limits=self.limits
        )
        injected["curl"] = self.curl
        injected.update({u.alias: u for u in urls})
        injected["create_timer"] = self.timers.create_timer
        injected["cancel_timer"] = self.timers.cancel_timer
        module = load_handler(
            function,
            source_code,
            injected,
            windowed=self.windowed,
            language=defn.language,
            context=self.context,
            timeout_s=self.timeout_s,
            heap_limit_mb=defn.js_heap_limit_mb,
        )
        self.module = module
        js = module.__dict__.get("__js_handler__")
        if js is not None:
            js.key_base = self.key_base  # a JavaScript meta's idempotency_key
        self.timers.module = module.__dict__
        self.on_update = module.__dict__.get("on_update")
        # on_update(doc, meta, xattrs): a third parameter gets the document's user extended attributes as
        # of the mutation (Couchbase 7.6's OnUpdate(doc, meta, xattrs)); a handler of two gets none.
        self.xattrs_arg = takes_xattrs(self.on_update)
        self.on_delete = module.__dict__.get("on_delete")
        # on_batch(batch) instead of on_update and on_delete (eventing.execution.batch): a worker hands it
        # many mutations at once (eventing.workers.batch_calls); anyone else calls it with a batch of one.
        self.on_batch = module.__dict__.get("on_batch")
        if self.on_batch is not None and (self.concurrent or defn.previous_version):
            from eventing.errors import HandlerLoadError

            raise HandlerLoadError(
                f"handler of function '{function}' defines on_batch(batch), which "
                f"{'concurrency > 1' if self.concurrent else 'previous_version'} does not take; use "
                "on_update/on_delete, or remove that setting"
            )
        self.keyspace = (
            defn.source_keyspace.to_meta()
        )  # meta.keyspace (the worker sets it per collection for `*`)
        self.max_bytes = defn.max_document_bytes
        # previous_version: key -> the bytes of its latest version seen here (None: deleted), so only the
        # first mutation of a key since start asks the source's log. Cleared on rewind; capped.
        self.previous: dict[str, bytes | None] | None = None
        if defn.previous_version:
            source.ensure_key_index()
            self.previous = {}

    @classmethod
    def open(cls, state: StateLike, function: str) -> HandlerRunner:
        """The function's current stored handler with bindings on the buckets of `state`."""
        state = as_state(state)
        record = state.metadata.get_function(function)
        defn = FunctionDefinition.from_dict(record.definition)
        source = state.open_bucket(defn.source_bucket)
        app_log = state.app_logs.writer(function, defn.app_log_max_size, defn.app_log_max_files)
        return cls(function, defn, record.source, source, state.open_bucket, app_log)

    # -- one mutation ---------------------------------------------------------------------------------

    def meta(self, m: Mutation) -> Meta:
        return self.meta_type(m.key, m.cas, m.vb, m.seqno, m.expiry, m.flags, "json", self.keyspace)

    def call_key(self, context: CallContext) -> str | None:
        """The idempotency key of the call running in `context`: its mutation's or fired timer's, an
        on_batch call's outside its items, None outside a call of a mutation (on_deploy)."""
        if context.batch is not None:
            return context.batch.idempotency_key
        m = context.mutation
        if m is None or not m.key:
            return None
        return key_of(self.key_base, m)

    def prepare(self, m: Mutation, keyspace: Any = None) -> HandlerCall | Rejection:
        """What `m` needs: the handler call with its arguments, or why it gets none. Updates are decoded
        here, once, and checked against max_document_bytes. `keyspace` is meta.keyspace when it is not
        the runner's current one (a call prepared on another thread than the one reading the source)."""
        if self.on_batch is not None and m.op != OP_TIMER:
            return self._prepare_batch_of_one(m)
        if m.op == OP_UPDATE:
            if self.on_update is None and not self.windowed:
                return NO_HANDLER
            if m.doc is not None and len(m.doc) > self.max_bytes:
                if self.previous is not None:
                    self.previous[m.key] = None  # a dead-lettered version is never anyone's previous
                return Rejection(
                    "oversize", f"document is {len(m.doc)} bytes; max_document_bytes is {self.max_bytes}"
                )
            try:
                doc = msgpack.unpackb(m.doc, raw=False)
            except Exception as exc:  # noqa: BLE001 - any decode failure is the document's fault
                return Rejection("undecodable", f"{type(exc).__name__}: {exc}")
            if self.on_update is None:
                return _new_call(HandlerCall, ("on_update", None, (), doc))
            meta = self.meta_type(
                m.key, m.cas, m.vb, m.seqno, m.expiry, m.flags, "json", keyspace or self.keyspace
            )
            if self.previous is not None:
                meta.previous = self._previous_version(m)
            if self.xattrs_arg:
                args: tuple = (doc, meta, user_xattrs(m[10] if len(m) > 10 else None))
                return _new_call(HandlerCall, ("on_update", self.on_update, args, doc))
            return _new_call(HandlerCall, ("on_update", self.on_update, (doc, meta), doc))
        if m.op == OP_TIMER:
            return self._timer_call(m)
        previous = None
        if self.previous is not None:  # the deleted document's last version (a mirror's deleted row)
            if self.on_delete is not None:
                previous = self._previous_version(m)
            else:
                self.seen(m)
        if self.on_delete is None:
            return NO_HANDLER
        meta = self.meta_type(
            m.key, m.cas, m.vb, m.seqno, m.expiry, m.flags, "json", keyspace or self.keyspace
        )
        if self.previous is not None:
            meta.previous = previous
        args = (meta, DeleteOptions(expired=m.op == OP_EXPIRE))
        return _new_call(HandlerCall, ("on_delete", self.on_delete, args, None))

    def _prepare_batch_of_one(self, m: Mutation) -> HandlerCall | Rejection:
        """An on_batch handler's call on one mutation (the same checks as on_update's)."""
        if m.op != OP_UPDATE:
            return _new_call(HandlerCall, ("on_delete", self._batch_of_one, (m,), None))
        if m.doc is not None and len(m.doc) > self.max_bytes:
            return Rejection(
                "oversize", f"document is {len(m.doc)} bytes; max_document_bytes is {self.max_bytes}"
            )
        try:
            doc = msgpack.unpackb(m.doc, raw=False)
        except Exception as exc:  # noqa: BLE001 - any decode failure is the document's fault
            return Rejection("undecodable", f"{type(exc).__name__}: {exc}")
        return _new_call(HandlerCall, ("on_update", self._batch_of_one, (m,), doc))

    def _batch_of_one(self, m: Mutation) -> None:
        """on_batch with a batch of `m` alone, as a call: it raises when the item is reported failed, and
        leaves the item's writes as the call's (to be kept or discarded by the caller)."""
        from eventing.execution.batch import Batch, BatchItemFailed, BatchScope, failed_items

        batch = Batch.of_rows(self, [(m.vb, [m])])
        scope = BatchScope(self, batch)
        try:
            failed = failed_items(self.on_batch(batch), batch)  # type: ignore[misc]
        finally:
            scope.end()
        if failed:
            scope.discard()
            error = failed[0]
            if isinstance(error, Exception):
                raise error
            raise BatchItemFailed(str(error) if error else "on_batch reported the item failed")
        scope.restore(0)

    def _previous_version(self, m: Mutation) -> dict | None:
        cache = self.previous
        assert cache is not None
        raw = cache.get(m.key, _UNSEEN)
        if raw is _UNSEEN:
            raw = self.source.previous_doc(m.key, m.seqno)
        if len(cache) >= PREVIOUS_CACHE_KEYS:
            cache.clear()
        cache[m.key] = m.doc
        if raw is None:
            return None
        try:
            return msgpack.unpackb(raw, raw=False)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - a previous version that was itself undecodable reads as None
            return None

    def seen(self, m: Mutation) -> None:
        """A mutation of the source that got no on_update call (a delete, or one the worker skipped): it is
        the previous version of the key's next update."""
        if self.previous is not None and m.op != OP_TIMER:
            self.previous[m.key] = m.doc if m.op == OP_UPDATE else None

    def _timer_call(self, m: Mutation) -> HandlerCall | Rejection:
        """A fired timer: its callback (looked up by name in the current handler) with its context."""
        try:
            fired = msgpack.unpackb(m.doc, raw=False) if m.doc is not None else {}
            name, context = fired["callback"], fired.get("context")
        except Exception as exc:  # noqa: BLE001 - a damaged record is the timer's fault
            return Rejection("timer_error", f"timer record cannot be decoded ({type(exc).__name__}: {exc})")
        fn = self.module.__dict__.get(name)
        if not callable(fn):
            return Rejection(
                "timer_error",
                f"timer callback '{name}' is not a function of the handler any more; restore it and replay "
                "the dead letter",
            )
        return HandlerCall("timer", fn, (context,), None)

    def call(
        self,
        m: Mutation,
        call: HandlerCall,
        *,
        epoch: int = 0,
        attempts: int = 1,
        timeout_s: float | None = None,
        invoke: Invoke | None = None,
        on_retry: Callable[[], None] | None = None,
        first_attempt: int = 1,
        tried: Tried | None = None,
    ) -> Failure | None:
        """Run the handler; None when it returned (its writes kept under `epoch`), else the failure.

        An error is retried up to `attempts` times in all, as the function's retry policy says (the wait
        between attempts, the errors not worth another, the age past which the mutation expires); a
        timeout is not retried (a handler that hung once will likely hang again). With `timeout_s` a
        one-shot SIGALRM bounds the call; a worker passes None and arms its own per-step watchdog, which
        reads the call context (`context`). A KeyboardInterrupt discards the call's writes and propagates.
        `first_attempt`/`tried` continue the attempts of a call whose first one ran elsewhere (see
        retry_after).
        """
        assert call.fn is not None
        fn, args = call.fn, call.args
        context = self.context
        for attempt in range(first_attempt, attempts + 1):
            for b in self.rw_bindings:
                b.begin(m.vb, m.seqno)
            context.begin(m, epoch)
            try:
                if invoke is None and not timeout_s:
                    fn(*args)  # the worker's path: no context manager per call (~1 us)
                else:
                    with _deadline(timeout_s):
                        (invoke or _plain_call)(fn, *args)
            except BaseException as exc:
                context.active = False
                outcome = self.failed(exc, m, call, attempt, attempts, tried)
                if isinstance(outcome, Failure):
                    return outcome
                tried = outcome
                if on_retry is not None:
                    on_retry()
                time.sleep(outcome.delay_s)
                continue
            finally:
                context.active = False
            self.kept(epoch)
            return None
        raise AssertionError("unreachable: attempts >= 1")

    def kept(self, epoch: int) -> None:
        """The call in progress returned: its binding writes and timer changes join the batch."""
        for b in self.rw_bindings:
            b.keep(epoch)
        if self.timers.current:
            self.timers.keep()

    def retry_after(
        self,
        exc: BaseException,
        m: Mutation,
        call: HandlerCall,
        *,
        epoch: int,
        attempts: int,
        on_retry: Callable[[], None] | None = None,
    ) -> Failure | None:
        """`call`'s first attempt, made by the caller itself (a worker's inlined hot loop), raised `exc`:
        what call() would have done from there. Call it inside the `except` block (for the traceback)."""
        outcome = self.failed(exc, m, call, 1, attempts, None)
        if isinstance(outcome, Failure):
            return outcome
        if on_retry is not None:
            on_retry()
        time.sleep(outcome.delay_s)
        return self.call(
            m,
            call,
            epoch=epoch,
            attempts=attempts,
            on_retry=on_retry,
            first_attempt=2,
            tried=outcome,
        )

    def failed(
        self,
        exc: BaseException,
        m: Mutation,
        call: HandlerCall,
        attempt: int,
        attempts: int,
        tried: Tried | None,
    ) -> Failure | Tried:
        """Attempt `attempt` raised `exc` (inside its `except` block): its writes are discarded; the
        Failure to report, or the attempts so far (with the wait before the next) when another is due. The
        retry policy decides (eventing.core.retry): an error it names non-retryable (or an HTTP status curl
        got in the attempt) fails at once, and a mutation past max_event_age fails as `expired`."""
        self._discard()
        now = time.time()
        if isinstance(exc, HandlerQuit):
            return Failure("quit", call.kind, "", "", attempt, now)
        if isinstance(exc, HandlerTimeout):
            error, stack = f"{call.kind} ran longer than execution_timeout ({self.timeout_s}s)", ""
        elif not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: not the handler's data
            raise exc
        else:
            if tried is not None:
                _unchain(exc, tried.raised)
            # A JavaScript handler's error carries JavaScript's stack (eventing.execution.javascript).
            error, stack = (
                error_text(exc) + refused_hint(exc),
                getattr(exc, "js_stack", None) or handler_traceback(exc),
            )
        tried = tried or Tried(now)
        tried.errors.append((attempt, now, error))
        tried.raised.append(exc)
        status: FailureStatus = "timeout" if isinstance(exc, HandlerTimeout) else "error"
        if status == "error":
            policy = self.policy
            statuses, retry_after = self.context.here().seen()
            refused = policy.refuses(error_names(exc), statuses)
            if refused is not None:
                error += f" (non_retryable: {refused})"
            elif attempt < attempts:
                tried.delay_s = policy.backoff(attempt, retry_after)
                if not policy.expired(m.cas if m.op == OP_TIMER else m.arrival_ms, tried.delay_s, now):
                    return tried
                status = "expired"
                error = f"{error} (older than retry.max_event_age, not retried)"
        if len(tried.errors) > 1:
            stack = (
                f"{stack.rstrip()}\n{attempts_text(tried.errors)}" if stack else attempts_text(tried.errors)
            )
        return Failure(status, call.kind, error, stack, attempt, tried.first_failed)

    def _discard(self) -> None:
        for b in self.rw_bindings:
            b.discard()
        self.timers.discard()

    # -- kept writes, for callers that apply them themselves ------------------------------------------

    def take_writes(self) -> list[HeldWrite]:
        """The kept writes since the last take, per bucket in the order they were made; clears them.
        (A bucket bound under two aliases has one buffer: its writes are listed once, under the first.)"""
        held: list[HeldWrite] = []
        for b in self.rw_bindings:
            for group in b.take_groups():
                held.extend(HeldWrite(b.alias, b.bucket, seqno, w) for seqno, w in group.writes)
        return held

    def set_tracer(self, tracer: Callable[[str, str, str, object], None] | None) -> None:
        for b in self.bindings:
            b.tracer = tracer

    def prepare_thread(self) -> None:
        """Ready the handler for calls from the calling thread (a worker's pool thread): a JavaScript handler
        makes the thread's V8 context now, not inside its first call's execution_timeout."""
        js = self.module.__dict__.get("__js_handler__")
        if js is not None:
            js.context_here()

    def close(self) -> None:
        js = self.module.__dict__.get("__js_handler__")  # a JavaScript handler's V8 context and watchdog
        if js is not None:
            js.close()
        for bucket in self.buckets.values():
            bucket.close()
        self.limits.close()
        if self.app_log is not None:
            self.app_log.close()


class FunctionLog:
    """`log(...)` of one function: the shared handler log (worker log, debugger trace) plus the function's
    application log file, one line per call: ``<time> [INFO] <function> <vb>:<seqno> <key> <text>`` with the
    mutation being handled (``-:- -`` outside a call, e.g. in on_deploy) and newlines written as ``\\n``."""

    def __init__(self, function: str, writer: AppLogSink | None, context: CallContext):
        self.function = function
        self.writer = writer
        self.context = context

    def __call__(self, *parts: object) -> None:
        line = " ".join(str(p) for p in parts)
        handler_api.log(line)
        if self.writer is not None:
            m = self.context.here().mutation
            where = f"{m.vb}:{m.seqno} {m.key}" if m is not None else "-:- -"
            text = line.replace("\r", "\\r").replace("\n", "\\n")
            self.writer.write(f"{self.function} {where} {text}")


def writes_by_bucket(held: list[HeldWrite]) -> list[tuple[BindingBucket, list[tuple[int, Any]]]]:
    """Held writes grouped per bucket, each in the order they were made."""
    out: dict[str, tuple[BindingBucket, list[tuple[int, Any]]]] = {}
    for h in held:
        out.setdefault(h.bucket.name, (h.bucket, []))[1].append((h.seqno, h.write))
    return list(out.values())


def _plain_call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


@contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise HandlerTimeout in the block after `seconds` (SIGALRM: main thread only, Python-level hangs)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return
    armed = True

    def expire(signum, frame) -> None:
        nonlocal armed
        if armed:
            armed = False
            raise HandlerTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
