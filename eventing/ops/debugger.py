"""The debugger: runs a deployed function's stored handler in the foreground on one mutation pulled from
its stream, under pdb or with a non-interactive trace of doc, meta, log lines, binding reads and writes,
and any exception with its traceback (DESIGN 3.7).

Guarantee, unlike Couchbase's debugger: **the mutation is never taken out of the stream.** The debugger
reads a copy from the source bucket and never writes a checkpoint, claims or releases a vBucket, or
touches an effect mark, so the worker that owns the vBucket still handles the mutation in its place, in
seqno order, whether the debug session finishes, fails, or is interrupted (Ctrl-C). It works the same
while `eventing run` is running in another process and when it is not.

Which mutation is pulled: the first one after the function's checkpoint, in the lowest vBucket with a
backlog (or in the given vBucket); for a key, the first mutation of that key after the checkpoint of the
key's vBucket. Mutations the worker skips (its own writes, by the recursion guard) are passed over. The
checkpoint trails a running worker by up to `checkpoint_interval`, so the pulled mutation may be one the
worker has handled but not yet checkpointed; that changes nothing for the worker. With `wait_s`, the
source is polled until a mutation arrives.

Writes: binding writes made while debugging are shown and held, never applied, unless `apply` is set:
then the writes of a handler call that returned are written directly to their buckets with origin = the
function's name (so the recursion guard still filters them), outside the effect marks. The owning worker
still handles the mutation in its place, so with `apply` its effects may be applied twice.

`ForegroundHandler`, the stored handler loaded in this process with its real bindings, is also what
`eventing.ops.dlq` uses to replay dead letters.
"""

from __future__ import annotations

import bdb
import copy
import pdb
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

import msgpack

from eventing import handler as handler_api
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_EXPIRE, OP_NAMES, OP_UPDATE, Mutation
from eventing.errors import ConfigError, LifecycleError, NotFoundError, StoreError
from eventing.handler import DeleteOptions, Meta
from eventing.runtime.bindings import BucketBinding
from eventing.runtime.loader import load_handler
from eventing.runtime.worker import HandlerTimeout
from eventing.storage.bucket import LocalBucket, Write
from eventing.storage.metadata import open_metadata
from metadata import Checkpoint, MetadataStore
from sharding import NUM_VBUCKETS, validate_key, vbucket_of

Status = Literal["ok", "no_handler", "error", "timeout", "undecodable", "oversize", "quit"]
Mode = Literal["trace", "pdb"]

POLL_S = 0.1  # how often --wait looks at the source again
READ_BATCH = 1000  # mutations read per query while looking for a key


# -- running a stored handler in this process ------------------------------------------------------------


@dataclass
class CallOutcome:
    """What one foreground call of the handler did."""

    status: Status
    kind: str = ""  # on_update | on_delete; "" when no handler was called
    doc: Any = None
    meta: Meta | None = None
    error: str = ""
    traceback: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """The handler returned (or there is none for this operation, which a worker also counts as done)."""
        return self.status in ("ok", "no_handler")


@dataclass(frozen=True)
class HeldWrite:
    """A binding write of a call that returned, not yet applied anywhere."""

    alias: str
    bucket: LocalBucket
    seqno: int  # the source seqno that caused it
    write: Write


class ForegroundHandler:
    """The current stored handler of one function, loaded in this process with its real bindings.

    `call` runs it on one mutation as a worker does (same document checks, meta, delete options and
    execution timeout), but applies nothing: the writes of a call that returned are held until
    `take_writes`, and a call that raised or timed out has them discarded. Nothing here reads or writes
    checkpoints, ownership or effect marks.
    """

    def __init__(self, data_dir: str, function: str):
        store = open_metadata(data_dir, create=False)
        try:
            record = store.get_function(function)
        finally:
            store.close()
        self.function = function
        self.record = record
        self.defn = FunctionDefinition.from_dict(record.definition)
        self.source = LocalBucket.open(data_dir, self.defn.source_bucket)
        buckets = {self.source.name: self.source}
        self.bindings: list[BucketBinding] = []
        injected: dict[str, object] = dict(self.defn.constants)
        for b in self.defn.bindings:
            if b.bucket not in buckets:
                buckets[b.bucket] = LocalBucket.open(data_dir, b.bucket)
            binding = BucketBinding(b.alias, buckets[b.bucket], b.access, function)
            injected[b.alias] = binding
            self.bindings.append(binding)
        self._buckets = list(buckets.values())
        self.rw_bindings = [b for b in self.bindings if b.access == "rw"]
        module = load_handler(function, record.source, injected, windowed=self.defn.window is not None)
        self.on_update = module.__dict__.get("on_update")
        self.on_delete = module.__dict__.get("on_delete")
        self.keyspace = {"bucket_name": self.defn.source_bucket, "scope_name": "_default", "collection_name": "_default"}
        self.timeout_s = self.defn.execution_timeout.total_seconds()

    def set_tracer(self, tracer: Callable[[str, str, str, object], None] | None) -> None:
        for b in self.bindings:
            b.tracer = tracer

    def meta(self, m: Mutation) -> Meta:
        return Meta(m.key, m.cas, m.vb, m.seqno, m.expiry, m.flags, "json", self.keyspace)

    def prepare(self, m: Mutation) -> tuple[CallOutcome, Callable[..., Any] | None, tuple]:
        """Decode and check `m` as a worker does; returns the outcome so far, the handler and its arguments
        (no handler when the mutation never reaches one: no handler for the operation, oversize, undecodable)."""
        if m.op == OP_UPDATE:
            if self.on_update is None:
                return CallOutcome("no_handler"), None, ()
            limit = self.defn.max_document_bytes
            if m.doc is not None and len(m.doc) > limit:
                error = f"document is {len(m.doc)} bytes; max_document_bytes is {limit}"
                return CallOutcome("oversize", error=error), None, ()
            try:
                doc = msgpack.unpackb(m.doc, raw=False)
            except Exception as exc:  # noqa: BLE001 - any decode failure is the document's fault
                return CallOutcome("undecodable", error=f"{type(exc).__name__}: {exc}"), None, ()
            meta = self.meta(m)
            return CallOutcome("ok", "on_update", doc=doc, meta=meta), self.on_update, (doc, meta)
        if self.on_delete is None:
            return CallOutcome("no_handler"), None, ()
        meta = self.meta(m)
        options = DeleteOptions(expired=m.op == OP_EXPIRE)
        return CallOutcome("ok", "on_delete", meta=meta), self.on_delete, (meta, options)

    def call(
        self,
        m: Mutation,
        *,
        timeout_s: float | None = None,
        runner: Callable[..., Any] | None = None,
        prepared: tuple[CallOutcome, Callable[..., Any] | None, tuple] | None = None,
    ) -> CallOutcome:
        """Run the handler on `m`. `runner(fn, *args)` replaces the plain call (the debugger passes pdb's).

        A KeyboardInterrupt discards the call's writes and propagates.
        """
        outcome, fn, args = prepared or self.prepare(m)
        if fn is None:
            return outcome
        for b in self.rw_bindings:
            b.begin(m.vb, m.seqno)
        start = time.perf_counter()
        try:
            with _deadline(timeout_s):
                (runner or _plain_call)(fn, *args)
        except HandlerTimeout:
            self._discard()
            outcome.status = "timeout"
            outcome.error = f"{outcome.kind} ran longer than execution_timeout ({timeout_s}s)"
        except _DebuggerQuit:
            self._discard()
            outcome.status = "quit"
        except KeyboardInterrupt:
            self._discard()
            raise
        except Exception as exc:  # noqa: BLE001 - a handler error is the outcome, not a crash
            self._discard()
            outcome.status = "error"
            outcome.error = f"{type(exc).__name__}: {exc}"
            outcome.traceback = traceback.format_exc()
        else:
            for b in self.rw_bindings:
                b.keep(0)
        outcome.seconds = time.perf_counter() - start
        return outcome

    def take_writes(self) -> list[HeldWrite]:
        """The held writes of the calls that returned since the last take, in binding order; clears them."""
        held: list[HeldWrite] = []
        for b in self.rw_bindings:
            for group in b.take_groups():
                held.extend(HeldWrite(b.alias, b.bucket, seqno, w) for seqno, w in group.writes)
        return held

    def _discard(self) -> None:
        for b in self.rw_bindings:
            b.discard()

    def close(self) -> None:
        for bucket in self._buckets:
            bucket.close()


def writes_by_bucket(held: list[HeldWrite]) -> list[tuple[LocalBucket, list[tuple[int, Write]]]]:
    """Held writes grouped per bucket (two aliases may name one bucket), each in the order they were made."""
    out: dict[str, tuple[LocalBucket, list[tuple[int, Write]]]] = {}
    for h in held:
        out.setdefault(h.bucket.name, (h.bucket, []))[1].append((h.seqno, h.write))
    return list(out.values())


def _plain_call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class _DebuggerQuit(Exception):
    """The user quit pdb before the handler returned."""


class _QuitAwarePdb(pdb.Pdb):
    """pdb whose `runcall` reports a quit: Bdb.runcall swallows BdbQuit, so a quit looked like a return."""

    quit_requested = False

    def set_quit(self) -> None:
        self.quit_requested = True
        super().set_quit()


def pdb_runner(stdout: TextIO | None = None) -> Callable[..., Any]:
    """A runner that calls the handler under pdb (prompts on `stdout`, default the terminal's stdout)."""

    def run(fn: Callable[..., Any], *args: Any) -> Any:
        debugger = _QuitAwarePdb(stdout=stdout)
        try:
            result = debugger.runcall(fn, *args)
        except bdb.BdbQuit:
            raise _DebuggerQuit() from None
        if debugger.quit_requested:
            raise _DebuggerQuit()
        return result

    return run


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


# -- pulling a copy of one mutation -----------------------------------------------------------------------


@dataclass(frozen=True)
class Pulled:
    """A copy of the mutation the debugger runs; the stream still holds the original."""

    mutation: Mutation
    checkpoint: Checkpoint  # the function's checkpoint of that vBucket when the copy was read


def find_next(
    store: MetadataStore, source: LocalBucket, function: str, *, key: str | None = None, vb: int | None = None
) -> Pulled | None:
    """The next mutation of `function` after its checkpoint (see the module docstring), or None. Reads only."""
    cps = store.checkpoints(function)
    if not cps:
        state = store.get_function(function).state.value
        raise LifecycleError(
            f"function '{function}' is {state}, so it has no position in the stream to debug from; "
            f"deploy it first (`eventing deploy {function}`; it may stay paused)"
        )
    highs = source.high_seqnos()
    if key is not None:
        vbs = [vbucket_of(key)]
    elif vb is not None:
        vbs = [vb]
    else:
        vbs = [v for v in range(NUM_VBUCKETS) if highs[v] > cps[v].seqno]
    for v in vbs:
        cp = cps[v]
        if cp.bucket_uuid != source.uuid:
            raise StoreError(
                f"source bucket '{source.name}' was recreated after function '{function}' was deployed, so its "
                "checkpoints do not apply; undeploy and deploy the function again"
            )
        after = cp.seqno
        while after < highs[v]:
            batch = source.read_vb(v, after, READ_BATCH if key is not None else 64)
            if not batch:
                break
            for m in batch:
                if m.origin == function:  # the worker skips it too (recursion guard)
                    continue
                if key is None or m.key == key:
                    return Pulled(m, cp)
            after = batch[-1].seqno
    return None


def pull(
    data_dir: str,
    source: LocalBucket,
    function: str,
    *,
    key: str | None = None,
    vb: int | None = None,
    wait_s: float | None = None,
) -> Pulled:
    """Find the next mutation, polling the source for up to `wait_s` seconds; NotFoundError if none came."""
    deadline = time.monotonic() + (wait_s or 0)
    store = open_metadata(data_dir, create=False)
    try:
        while True:
            pulled = find_next(store, source, function, key=key, vb=vb)
            if pulled is not None:
                return pulled
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
    finally:
        store.close()
    where = f"of key '{key}'" if key is not None else f"in vBucket {vb}" if vb is not None else "in any vBucket"
    waited = f" within {wait_s:g}s" if wait_s else ""
    hint = "; write one, or pass --wait SECONDS to wait for one" if not wait_s else "; write one, or wait longer"
    raise NotFoundError(
        f"function '{function}' has no pending mutation {where} after its checkpoint{waited}{hint}"
    )


# -- one debug session ------------------------------------------------------------------------------------


class _EventSink(list):
    """The handler log's sink: each line becomes a trace event, in order with binding reads and writes."""

    def __init__(self, emit: Callable[[dict], None]):
        super().__init__()
        self._emit = emit

    def append(self, line: str) -> None:
        super().append(line)
        self._emit({"event": "log", "line": line})


@dataclass
class DebugSession:
    """Pull one mutation of `function` and run its stored handler on it in the foreground.

    `on_event` receives trace events as they happen: `pulled`, `call` (kind, doc, meta), `log`, `read`,
    `write`, `delete`, then `result`. The session never consumes the mutation (see the module docstring).
    """

    data_dir: str
    function: str
    key: str | None = None
    vb: int | None = None
    mode: Mode = "trace"
    apply: bool = False
    wait_s: float | None = None
    on_event: Callable[[dict], None] | None = None
    pdb_stdout: TextIO | None = None  # where pdb prompts go (stderr when stdout carries JSON)
    pulled: Pulled | None = None
    outcome: CallOutcome | None = None
    events: list[dict] = field(default_factory=list)
    writes: list[HeldWrite] = field(default_factory=list)
    applied: bool = False

    def run(self) -> CallOutcome:
        if self.key is not None:
            validate_key(self.key)
        if self.vb is not None and not 0 <= self.vb < NUM_VBUCKETS:
            raise ConfigError(f"vBucket {self.vb} does not exist; use 0..{NUM_VBUCKETS - 1}")
        if self.wait_s is not None and self.wait_s < 0:
            raise ConfigError(f"--wait {self.wait_s:g} is negative; give seconds >= 0")
        runtime = ForegroundHandler(self.data_dir, self.function)
        try:
            self.pulled = pull(
                self.data_dir, runtime.source, self.function, key=self.key, vb=self.vb, wait_s=self.wait_s
            )
            self._emit({"event": "pulled", "mutation": mutation_view(self.pulled.mutation),
                        "checkpoint": checkpoint_view(self.pulled.checkpoint)})
            self.outcome = self._call(runtime)
            if self.outcome.ok:
                self.writes = runtime.take_writes()
                if self.apply and self.writes:
                    for bucket, writes in writes_by_bucket(self.writes):
                        bucket.write([w for _, w in writes], origin=self.function)
                    self.applied = True
            self._emit({"event": "result", "status": self.outcome.status, "error": self.outcome.error or None,
                        "traceback": self.outcome.traceback or None, "seconds": round(self.outcome.seconds, 6),
                        "writes": [write_view(h) for h in self.writes], "applied": self.applied})
            return self.outcome
        finally:
            runtime.close()

    def _call(self, runtime: ForegroundHandler) -> CallOutcome:
        assert self.pulled is not None
        m = self.pulled.mutation
        prepared = runtime.prepare(m)
        outcome = prepared[0]
        self._emit({"event": "call", "kind": outcome.kind or None, "doc": outcome.doc,
                    "meta": outcome.meta.to_dict() if outcome.meta else None})
        runtime.set_tracer(self._trace)
        previous_sink = handler_api.log.sink
        handler_api.log.sink = _EventSink(self._emit)
        try:
            if self.mode == "pdb":
                return runtime.call(m, runner=pdb_runner(self.pdb_stdout), prepared=prepared)
            return runtime.call(m, timeout_s=runtime.timeout_s, prepared=prepared)
        finally:
            handler_api.log.sink = previous_sink
            runtime.set_tracer(None)

    def _trace(self, op: str, alias: str, key: str, value: object) -> None:
        self._emit({"event": op, "alias": alias, "key": key, "value": copy.deepcopy(value)})

    def _emit(self, event: dict) -> None:
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    def report(self) -> dict[str, Any]:
        """The session as JSON-able data; `consumed` is always false: the stream still holds the mutation."""
        call = next((e for e in self.events if e["event"] == "call"), {})
        outcome = self.outcome
        return {
            "function": self.function,
            "mode": self.mode,
            "mutation": mutation_view(self.pulled.mutation) if self.pulled else None,
            "checkpoint": checkpoint_view(self.pulled.checkpoint) if self.pulled else None,
            "kind": call.get("kind"),
            "doc": call.get("doc"),
            "meta": call.get("meta"),
            "events": [e for e in self.events if e["event"] in ("log", "read", "write", "delete")],
            "outcome": outcome.status if outcome else "interrupted",
            "error": (outcome.error or None) if outcome else None,
            "traceback": (outcome.traceback or None) if outcome else None,
            "seconds": round(outcome.seconds, 6) if outcome else None,
            "writes": [write_view(h) for h in self.writes],
            "applied": self.applied,
            "consumed": False,
        }


def mutation_view(m: Mutation) -> dict[str, Any]:
    return {"vb": m.vb, "seqno": m.seqno, "key": m.key, "op": OP_NAMES.get(m.op, str(m.op)), "cas": m.cas,
            "origin": m.origin, "expiry": m.expiry, "flags": m.flags, "bytes": len(m.doc) if m.doc else 0}


def checkpoint_view(cp: Checkpoint) -> dict[str, Any]:
    return {"seqno": cp.seqno, "owner": cp.owner, "leased": cp.leased, "epoch": cp.epoch}


def write_view(h: HeldWrite) -> dict[str, Any]:
    doc = None
    if h.write.doc is not None:
        doc = msgpack.unpackb(h.write.doc, raw=False)
    return {"alias": h.alias, "bucket": h.bucket.name, "key": h.write.key,
            "op": "upsert" if h.write.op == OP_UPDATE else "delete", "doc": doc}
