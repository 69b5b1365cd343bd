"""The debugger: runs a deployed function's stored handler in the foreground on one mutation pulled from
its stream, under pdb or with a non-interactive trace of doc, meta, log lines, binding reads and writes,
and any exception with its traceback (docs/dlq-and-debugging.md, 'Debugging one mutation').

Guarantee, unlike Couchbase's debugger: **the mutation is never taken out of the stream.** The debugger
reads a copy from the source bucket and never writes a checkpoint, claims or releases a vBucket, or
touches an effect mark, so the worker that owns the vBucket still handles the mutation in its place, in
seqno order, whether the debug session finishes, fails, or is interrupted (Ctrl-C). It works the same
while `eventing run` is running in another process and when it is not.

Which mutation is pulled: the first one after the function's checkpoint, in the lowest vBucket with a
backlog (or in the given vBucket); for a key, the first mutation of that key after the checkpoint of the
key's vBucket. Mutations the worker skips (its own writes, by the recursion guard, and the rows of the source
bucket's collections other than the function's source collection) are passed over; a key is the document's
key in the source collection (its stored key is the collection's prefix + key), so is meta.id. The
checkpoint trails a running worker by up to `checkpoint_interval`, so the pulled mutation may be one the
worker has handled but not yet checkpointed; that changes nothing for the worker. With `wait_s`, the
source is polled until a mutation arrives.

Writes: binding writes made while debugging are shown and held, never applied, unless `apply` is set:
then the writes of a handler call that returned are written directly to their buckets with the
deployment's origin (eventing.storage.origins: the recursion guard still filters them), outside the effect
marks. The owning worker
still handles the mutation in its place, so with `apply` its effects may be applied twice.

The handler runs through `eventing.execution.runner.HandlerRunner`, the code a worker runs it with (same
bindings, shared effect buffers, document checks and execution timeout); `run_once` is also what
`eventing.ops.dlq` uses to replay dead letters. A function whose effective isolation is `sandbox` runs its
handler in a sandboxed child the same way (`eventing.workers.sandbox.SandboxedRunner`; under pdb, its
commands and prompts cross the child's line to this process's terminal); the trace events and held writes
come back to this process.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TextIO

import msgpack

from eventing import handler as handler_api
from eventing.core.definition import FunctionDefinition
from eventing.core.filters import compile_filter
from eventing.core.mutation import OP_NAMES, OP_UPDATE, Mutation
from eventing.errors import ConfigError, LifecycleError, NotFoundError, StoreError, fix
from eventing.execution.runner import (
    HandlerRunner,
    HeldWrite,
    writes_by_bucket,
)
from eventing.execution.single_call import CallOutcome, EventSink, pdb_runner, prepare_call, run_once
from eventing.storage.origins import deployment_origin, is_own
from eventing.storage.protocol import Bucket
from eventing.storage.state import StateLike, as_state
from eventing.workers.collections import SourceCollections
from eventing.workers.sandbox.host import SandboxedRunner, open_runner
from metadata import Checkpoint, MetadataStore
from sharding import NUM_VBUCKETS, validate_key, vbucket_of

Mode = Literal["trace", "pdb"]

POLL_S = 0.1  # how often --wait looks at the source again
READ_BATCH = 1000  # mutations read per query while looking for a key


# -- running a stored handler in this process ------------------------------------------------------------


# -- pulling a copy of one mutation -----------------------------------------------------------------------


@dataclass(frozen=True)
class Pulled:
    """A copy of the mutation the debugger runs; the stream still holds the original."""

    mutation: Mutation  # with the document's key in its collection
    checkpoint: Checkpoint  # the function's checkpoint of that vBucket when the copy was read
    keyspace: dict[str, str] | None = None  # meta.keyspace of the mutation's collection
    origin: str | None = (
        None  # the deployment's origin (eventing.storage.origins): of writes applied with `apply`
    )


def find_next(
    store: MetadataStore, source: Bucket, function: str, *, key: str | None = None, vb: int | None = None
) -> Pulled | None:
    """The next mutation of `function` after its checkpoint (see the module docstring), or None. Reads
    only."""
    cps = store.checkpoints(function)
    if not cps:
        state = store.get_function(function).state.value
        raise LifecycleError(
            f"function '{function}' is {state}, so it has no position in the stream to debug from; "
            "deploy it first ({fix}; it may stay paused)",
            fix=fix("deploy", function=function),
        )
    record = store.get_function(function)
    source_keyspace = FunctionDefinition.from_dict(record.definition).source_keyspace
    collections = SourceCollections(source, source_keyspace)
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
                f"source bucket '{source.name}' was recreated after function '{function}' was deployed, so "
                "its checkpoints do not apply; undeploy and deploy the function again"
            )
        after = cp.seqno
        while after < highs[v]:
            batch = source.read_vb(v, after, READ_BATCH if key is not None else 64)
            if not batch:
                break
            for keyspace, rows in collections.split(batch):
                if keyspace is None:  # another collection of the source bucket: the worker passes it over
                    continue
                for row in rows:
                    m = Mutation(*row)
                    if is_own(
                        m.origin, function, record.generation
                    ):  # the worker skips it too (recursion guard)
                        continue
                    if key is None or m.key == key:
                        return Pulled(m, cp, keyspace, deployment_origin(function, record.generation))
            after = batch[-1].seqno
    return None


def pull(
    state: StateLike,
    source: Bucket,
    function: str,
    *,
    key: str | None = None,
    vb: int | None = None,
    wait_s: float | None = None,
) -> Pulled:
    """Find the next mutation, polling the source for up to `wait_s` seconds; NotFoundError if none came."""
    state = as_state(state)
    deadline = time.monotonic() + (wait_s or 0)
    with state.metadata as store:
        while True:
            pulled = find_next(store, source, function, key=key, vb=vb)
            if pulled is not None:
                return pulled
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
    where = (
        f"of key '{key}'" if key is not None else f"in vBucket {vb}" if vb is not None else "in any vBucket"
    )
    waited = f" within {wait_s:g}s" if wait_s else ""
    hint = "; write one, or pass {fix} to wait for one" if not wait_s else "; write one, or wait longer"
    raise NotFoundError(
        f"function '{function}' has no pending mutation {where} after its checkpoint{waited}{hint}",
        fix=fix("option", flag="--wait", value="SECONDS"),
    )


# -- one debug session ------------------------------------------------------------------------------------


@dataclass
class DebugSession:
    """Pull one mutation of `function` and run its stored handler on it in the foreground.

    `on_event` receives trace events as they happen: `pulled`, `call` (kind, doc, meta), `log`, `read`,
    `write`, `delete`, then `result`. The session never consumes the mutation (see the module docstring).
    """

    state: StateLike
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
            raise ConfigError(
                "{fix} is negative; give seconds >= 0",
                fix=fix("option", flag="--wait", value=f"{self.wait_s:g}"),
            )
        # A sandboxed function's handler runs in a sandboxed child (eventing.workers.sandbox); the mutation
        # is pulled, and held writes applied, here.
        runtime = open_runner(self.state, self.function)
        try:
            self.pulled = pull(
                self.state, runtime.source, self.function, key=self.key, vb=self.vb, wait_s=self.wait_s
            )
            if self.pulled.keyspace is not None:
                runtime.keyspace = self.pulled.keyspace  # meta.keyspace, as the worker sets it
            self._emit(
                {
                    "event": "pulled",
                    "mutation": mutation_view(self.pulled.mutation),
                    "checkpoint": checkpoint_view(self.pulled.checkpoint),
                }
            )
            self.outcome = self._call(runtime)
            if self.outcome.ok:
                self.writes = runtime.take_writes()
                if self.apply and self.writes:
                    for bucket, writes in writes_by_bucket(self.writes):
                        bucket.write([w for _, w in writes], origin=self.pulled.origin or self.function)
                    self.applied = True
            self._emit(
                {
                    "event": "result",
                    "status": self.outcome.status,
                    "error": self.outcome.error or None,
                    "traceback": self.outcome.traceback or None,
                    "seconds": round(self.outcome.seconds, 6),
                    "writes": [write_view(h) for h in self.writes],
                    "applied": self.applied,
                }
            )
            return self.outcome
        finally:
            runtime.close()

    def _call(self, runtime: HandlerRunner | SandboxedRunner) -> CallOutcome:
        assert self.pulled is not None
        m = self.pulled.mutation
        flt = runtime.defn.filter
        if flt is not None and not compile_filter(flt).matches(m, partial(msgpack.unpackb, raw=False)):
            # The worker checkpoints it without calling the handler (counter `filtered`).
            self._emit({"event": "call", "kind": None, "doc": None, "meta": None, "filtered": True})
            return CallOutcome("filtered")
        if isinstance(runtime, SandboxedRunner):
            # `call` first, then log, read, write, delete; pdb's commands and prompts cross to this terminal.
            pdb_io = (sys.stdin, self.pdb_stdout or sys.stdout) if self.mode == "pdb" else None
            outcome, _ = runtime.run_once(m, trace=True, pdb_io=pdb_io, on_event=self._emit)  # emitted live
            return outcome
        prepared = prepare_call(runtime, m)
        outcome = prepared[0]
        self._emit(
            {
                "event": "call",
                "kind": outcome.kind or None,
                "doc": outcome.doc,
                "meta": outcome.meta.to_dict() if outcome.meta else None,
            }
        )
        runtime.set_tracer(self._trace)
        previous_sink = handler_api.log.sink
        handler_api.log.sink = EventSink(self._emit)
        try:
            if self.mode == "pdb":
                return run_once(runtime, m, invoke=pdb_runner(self.pdb_stdout), prepared=prepared)
            return run_once(runtime, m, prepared=prepared)
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
    return {
        "vb": m.vb,
        "seqno": m.seqno,
        "key": m.key,
        "op": OP_NAMES.get(m.op, str(m.op)),
        "cas": m.cas,
        "origin": m.origin,
        "expiry": m.expiry,
        "flags": m.flags,
        "bytes": len(m.doc) if m.doc else 0,
    }


def checkpoint_view(cp: Checkpoint) -> dict[str, Any]:
    return {"seqno": cp.seqno, "owner": cp.owner, "leased": cp.leased, "epoch": cp.epoch}


def write_view(h: HeldWrite) -> dict[str, Any]:
    doc = None
    if h.write.doc is not None:
        doc = msgpack.unpackb(h.write.doc, raw=False)
    return {
        "alias": h.alias,
        "bucket": h.bucket.name,
        "key": h.write.key,
        "op": "upsert" if h.write.op == OP_UPDATE else "delete",
        "doc": doc,
    }
