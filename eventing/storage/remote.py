"""The data service: one data directory's buckets, metadata store and window row files served to workers
that cannot open its files (another machine of a Ray cluster), and the handles those workers use.

Couchbase splits its data service (vBuckets, DCP streams over the network) from its eventing service; this
module is that split on one data directory. ``DataService`` is a plain class that runs where the files are
(``eventing.workers.data_service`` wraps it in Ray actors pinned to that node); ``DataAccess`` is what a
worker holds: it opens the files directly when it can see them on the data service's node (the locality
fast path, like HDFS short-circuit reads) and otherwise gives ``RemoteBucket`` and ``RemoteMetadataStore``,
which implement the ``Bucket`` protocol and ``MetadataStore`` by forwarding the calls.

What crosses the wire is batched: a log read returns up to a whole batch (>= 1,000 mutations) as one
msgpack blob of row tuples (documents stay msgpack bytes inside it), decoded once in the worker. Effects,
checkpoints and fences carry the same epochs as on one machine, so a remote worker is fenced exactly like a
local one. Every call is safe to repeat after the service restarted (Ray retries it): effects are
deduplicated by their source seqnos, checkpoints are conditional on epochs, dead letters are keyed by
(function, vBucket, seqno) and row files by name.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self, cast

import msgpack

from eventing.core.mutation import Mutation
from eventing.errors import ConfigError, EventingError
from eventing.storage.app_logs import RemoteAppLog
from eventing.storage.protocol import Bucket, FileBucket
from eventing.storage.rows_ahead import Ahead
from eventing.storage.state import AppLogWriter, State, StateLike, as_state, is_server_location, open_state
from eventing.storage.values import EffectGroup, EffectResult, PackedUpdates, Spans, Write
from metadata import MetadataStore
from metadata.factory import SQLITE_FILE
from metadata.model import Checkpoint, DlqRow, FunctionRecord, TimerChange, TimerDone, TimerRecord
from metadata.protocol import WorkerMetadata

LOCALITY_ENV = "EVENTING_DATA_LOCALITY"  # "0": workers on the data node still go through the service

# What a remote worker may ask of a bucket (a ``bucket`` call): the Bucket protocol
# (eventing.storage.protocol) beyond the log reads, which have calls of their own (read_vb, read_many). Each
# name served, and the method it calls; nothing else is. An iterator (scan) is answered as a list, and
# collection_list is collections() as (scope, collection, id) tuples (a dict with tuple keys does not
# travel through msgpack).
BUCKET_CALLS: dict[str, Callable[[Bucket], Callable[..., Any]]] = {
    "high_seqnos": lambda bucket: bucket.high_seqnos,
    "read_vb_packed": lambda bucket: bucket.read_vb_packed,
    "max_doc_bytes": lambda bucket: bucket.max_doc_bytes,
    "get_raw": lambda bucket: bucket.get_raw,
    "get": lambda bucket: bucket.get,
    "get_meta": lambda bucket: bucket.get_meta,
    "get_doc": lambda bucket: bucket.get_doc,
    "previous_doc": lambda bucket: bucket.previous_doc,
    "ensure_key_index": lambda bucket: bucket.ensure_key_index,
    "apply_effects": lambda bucket: bucket.apply_effects,
    "effect_marks": lambda bucket: bucket.effect_marks,
    "fence": lambda bucket: bucket.fence,
    "write": lambda bucket: bucket.write,
    "upsert": lambda bucket: bucket.upsert,
    "delete": lambda bucket: bucket.delete,
    "flush": lambda bucket: bucket.flush,
    "keys": lambda bucket: bucket.keys,
    "scan": lambda bucket: bucket.scan,
    "count": lambda bucket: bucket.count,
    "collection_list": lambda bucket: lambda: _collection_list(bucket),
    "mirror_list": lambda bucket: lambda: sorted(bucket.mirrors().items()),  # pairs: msgpack keys are strings
    "partition_marks": lambda bucket: partial(_partition_marks, bucket),
}


def _partition_marks(bucket: Bucket, function: str) -> tuple[list[int], list[list[tuple[int, int]]]] | None:
    """A bucket in partitions' marks per partition (PartitionedBucket.partition_marks) as pairs; None for
    a bucket in one piece."""
    by_partition = getattr(bucket, "partition_marks", None)
    if by_partition is None:
        return None
    part_of_vb, marks = by_partition(function)
    return part_of_vb, [sorted(m.items()) for m in marks]


# What a remote worker may ask of the metadata store (a ``meta`` call): WorkerMetadata (metadata.protocol),
# each name served and the method it calls; nothing else is.
META_CALLS: dict[str, Callable[[WorkerMetadata], Callable[..., Any]]] = {
    "get_function": lambda store: store.get_function,
    "claim": lambda store: store.claim,
    "release": lambda store: store.release,
    "commit": lambda store: store.commit,
    "claim_timers": lambda store: store.claim_timers,
    "get_timer": lambda store: store.get_timer,
    "find_dlq_rows": lambda store: store.find_dlq_rows,
    "count_death": lambda store: store.count_death,
    "deaths": lambda store: store.deaths,
}


# A read of this many vBuckets of a server's bucket or fewer is one statement, its partial look
# (DataService.do_read_changed); more are read as a file's are: their high seqnos, then each run's rows (a
# look at the 256 vBuckets of a worker with nothing new took 430 us where the high seqnos alone take 220).
PARTIAL_LOOK = 64


def _read_runs(bucket: FileBucket, runs: list[tuple[int, int, int]]) -> bytes:
    answers = []
    for vb, after, limit in runs:
        columns = bucket.read_vb_columns(vb, after, limit)
        answers.append((1, *columns) if columns is not None else (0, bucket.read_vb_rows(vb, after, limit)))
    return msgpack.packb(answers, use_bin_type=True)


def _collection_list(bucket: Bucket) -> list[tuple[str, str, int]]:
    return [(scope, collection, cid) for (scope, collection), cid in bucket.collections().items()]


class DataService:
    """Serves one state (buckets, metadata store, window row files) to workers that cannot reach it
    themselves: workers on other machines of a data directory, and sandboxed children.

    Every answer comes from the state, so a restarted service (a new process) answers exactly as the old
    one would have: nothing is held only in memory."""

    def __init__(self, state: StateLike):
        self.state = as_state(state)
        self.data_dir = self.state.location  # what `ping` reports
        self._buckets: dict[str, FileBucket] = {}
        # The calls served, by name (a subclass serves more: eventing.workers.data_service.ServedData).
        self.calls: dict[str, Callable[..., Any]] = {
            "ping": self.do_ping,
            "bucket_info": self.do_bucket_info,
            "bucket": self.do_bucket,
            "collection_list": self.do_collection_list,
            "read_vb": self.do_read_vb,
            "read_many": self.do_read_many,
            "read_changed": self.do_read_changed,
            "meta": self.do_meta,
            "put_file": self.do_put_file,
        }

    def _bucket(self, name: str) -> FileBucket:
        bucket = self._buckets.get(name)
        if bucket is None:
            bucket = self._buckets[name] = self.state.open_bucket(name)
        return bucket

    @property
    def store(self) -> MetadataStore:
        return self.state.metadata

    # -- calls (one entry point, so the Ray actor is a thin shell) -------------------------------------

    def call(self, method: str, *args: Any) -> Any:
        served = self.calls.get(method)
        if served is None:
            raise ConfigError(f"{method!r} is not a call the data service serves")
        return served(*args)

    def do_ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "data_dir": self.data_dir}

    def do_bucket_info(self, name: str) -> tuple[str, str]:
        bucket = self._bucket(name)
        return bucket.name, bucket.uuid

    def do_bucket(self, name: str, method: str, args: tuple, kwargs: dict) -> Any:
        served = BUCKET_CALLS.get(method)
        if served is None:
            raise ConfigError(f"bucket method {method!r} is not served to remote workers")
        answer = served(self._bucket(name))(*args, **kwargs)
        return list(answer) if isinstance(answer, Iterator) else answer

    def do_collection_list(self, name: str) -> list[tuple[str, str, int]]:
        return _collection_list(self._bucket(name))

    def do_read_vb(self, name: str, vb: int, after_seqno: int, limit: int) -> bytes:
        """``LocalBucket.read_vb`` as one msgpack blob of row tuples (no Mutation objects made here)."""
        return msgpack.packb(self._bucket(name).read_vb_rows(vb, after_seqno, limit), use_bin_type=True)

    def do_read_many(self, name: str, runs: list[tuple[int, int, int]]) -> tuple[bytes, list[int]]:
        """Several ``(vb, after_seqno, limit)`` reads in one call: one blob with an answer per run, and the
        bucket's high seqnos read after them (what a worker asks next). A run's answer is its columns as
        SQLite concatenates them, ``(1, *LocalBucket.read_vb_columns)``, or where they are not the plain
        case, ``(0, rows)``: the columns cost this process about half as much, the worker a little more
        (``rows_of_columns``)."""
        bucket = self._bucket(name)
        return _read_runs(bucket, runs), bucket.high_seqnos()

    def do_read_changed(
        self, name: str, positions: list[tuple[int, int]], limit: int, spans: Spans | None = None
    ) -> tuple[bytes, list[int], list[Run]]:
        """The rows that follow ``(vb, position)`` in the vBuckets that have any, up to ``limit`` rows in all,
        with the bucket's high seqnos read before them: ``read_many``'s answer, and the runs it read (a
        worker that is caught up asks this at the end of a step, and does not know which vBuckets changed).
        ``spans``: the high seqnos of these vBucket ranges alone (the others answer 0).

        A few vBuckets of a server's bucket (a sandboxed worker's host on a PostgreSQL store, asking for those
        a notification named) are looked at instead: their high seqnos and next rows in one statement
        (PostgresBucket.prefetch, partial), the runs then taken from the rows it holds; read one by one, a
        woken step's few rows cost a statement each after the high seqnos'."""
        bucket = self._bucket(name)
        looked = bucket.reads_ahead and len(positions) <= PARTIAL_LOOK
        if looked:
            bucket.prefetch([(vb, at, max(1, limit)) for vb, at in positions], partial=True)
            highs = bucket.high_seqnos(prefetched=True)
        else:
            highs = bucket.high_seqnos(spans=spans)
        runs: list[Run] = []
        left = limit
        for vb, position in positions:
            backlog = highs[vb] - position
            if backlog > 0 and left > 0:
                runs.append((vb, position, min(backlog, left)))
                left -= backlog
        if looked:
            answers = [(0, bucket.read_vb_rows(vb, after, n)) for vb, after, n in runs]
            return msgpack.packb(answers, use_bin_type=True), highs, runs
        return _read_runs(bucket, runs), highs, runs

    def do_meta(self, method: str, args: tuple, kwargs: dict) -> Any:
        served = META_CALLS.get(method)
        if served is None:
            raise ConfigError(f"metadata method {method!r} is not served to remote workers")
        return served(self.store)(*args, **kwargs)

    def do_put_file(self, relative: str, data: bytes) -> None:
        """Write ``data`` durably and atomically at ``relative`` (``windows/<fn>/incoming/<file>``) in the
        state's file area (the data directory's folder or a server's files): window row batches of remote
        and sandboxed workers, written before their checkpoint moves."""
        parts = relative.split("/")
        try:
            if len(parts) < 3 or parts[0] != "windows":
                raise ValueError("not a file of a windowed function's area (windows/<fn>/...)")
            self.state.file_area("/".join(parts[:2])).write("/".join(parts[2:]), data)
        except ValueError as exc:
            raise ConfigError(f"{relative!r} is not a path inside the state's file area: {exc}") from None

    def close(self) -> None:
        for bucket in self._buckets.values():
            bucket.close()
        self._buckets.clear()
        self.state.close()


class DataServiceRef:
    """A picklable handle on a running data service: its Ray actors and the Ray node that holds the files.

    A worker talks to one actor (chosen by its worker id, so several workers spread over them); Ray
    restarts a dead actor from the files and retries the call."""

    def __init__(self, actors: Sequence[Any], node_id: str, data_dir: str):
        self.actors = tuple(actors)
        self.node_id = node_id
        self.data_dir = data_dir

    def client(self, key: str) -> DataClient:
        """The line of worker ``key`` ("node/wN"): consecutive workers of a node go to different actors
        (a plain hash of the ids sent all four workers of a node to one actor)."""
        node, _, index = key.rpartition("/w")
        spread = int(index) if index.isdigit() else 0
        return _RayClient(self.actors[(zlib.crc32(node.encode()) + spread) % len(self.actors)])


class DataClient(Protocol):
    """A worker's line to the data service: ``call`` waits for the answer, ``submit`` returns a thunk that
    waits for it later (a read issued before it is needed)."""

    def call(self, method: str, *args: Any) -> Any: ...
    def submit(self, method: str, *args: Any) -> Callable[[], Any]: ...


class _RayClient:
    def __init__(self, actor: Any):
        self.actor = actor

    def call(self, method: str, *args: Any) -> Any:
        return self.submit(method, *args)()

    def submit(self, method: str, *args: Any) -> Callable[[], Any]:
        import ray

        ref = self.actor.call.remote(method, *args)

        def wait() -> Any:
            try:
                return ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                cause = exc.as_instanceof_cause()
                if isinstance(cause, EventingError):
                    raise _again(cause) from None
                raise

        return wait


Run = tuple[int, int, int]  # (vb, after_seqno, limit)


class RemoteBucket:
    """The ``Bucket`` protocol (eventing.storage.protocol), answered by the data service.

    Log reads can be asked for ahead (``prefetch``): the worker names runs of the batches to come, many
    batches' worth in one call, while it handles the current one, so the service reads while the worker
    computes and each call carries thousands of mutations (a call across nodes costs milliseconds of CPU
    whatever its size). The rows are kept per vBucket and ``read_vb`` takes them from the front: a run's
    rows never change once written (the log only grows), so the rows that follow seqno ``after`` are the
    answer ``read_vb`` would give; a read that does not start where the rows read ahead start is made on
    the spot, so a wrong guess costs a round trip, never a wrong answer."""

    path = None  # the files are where the data service runs
    reads_ahead = True

    def __init__(self, client: DataClient, name: str):
        self._client = client
        self._call = client.call
        self.name, self.uuid = client.call("bucket_info", name)
        # The read ahead in flight: its runs (None: a read_changed, whose runs come with its answer).
        self._pending: tuple[list[Run] | None, Callable[[], Any]] | None = None
        self._pending_vbs: frozenset[int] = frozenset()
        self._ahead: dict[int, Ahead] = {}
        self._highs: list[int] | None = None  # read by the service right after the last prefetched runs

    def _bucket(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._call("bucket", self.name, method, args, kwargs)

    def high_seqnos(self, *, prefetched: bool = False, spans: Spans | None = None) -> list[int]:
        """The high seqnos; with ``prefetched``, those read along with the last prefetched runs if any
        (never older than this worker's previous read ahead: safe wherever a slightly older answer is)."""
        if prefetched and self._pending is not None and self._pending[0] is None:
            self._settle()  # read_changed: its high seqnos are what it was asked for
        if prefetched and self._highs is not None:
            highs, self._highs = self._highs, None
            return highs
        return cast(list[int], self._bucket("high_seqnos", spans=spans))

    def prefetch(self, runs: list[Run], *, partial: bool = False) -> None:
        """Start reading these runs in the background (one call; a call still in flight is settled
        first), leaving out vBuckets already read ahead or in flight."""
        if self._pending is not None and self._pending[0] is None:
            self._settle()  # a read_changed: which vBuckets it reads is known once it is answered
        wanted = [r for r in runs if r[2] > 0 and r[0] not in self._ahead and r[0] not in self._pending_vbs]
        if not wanted:
            return
        self._settle()
        self._pending = (wanted, self._client.submit("read_many", self.name, wanted))
        self._pending_vbs = frozenset(r[0] for r in wanted)

    def highs_ahead(self) -> bool:
        """Whether ``high_seqnos(prefetched=True)`` answers without a round trip of its own."""
        return self._highs is not None or (self._pending is not None and self._pending[0] is None)

    def read_changed(
        self, positions: list[tuple[int, int]], limit: int, *, for_next_step: bool = False
    ) -> None:
        """Start reading, in one call, the high seqnos and the rows that follow these ``(vb, position)``
        pairs where there are any: ``high_seqnos(prefetched=True)`` answers with them and the rows are read
        ahead. Rows already read ahead are kept and count against ``limit``: a worker behind asks at each
        step for the high seqnos, and rows asked for on top of those it holds would pile up faster than it
        handles them (a whole backlog in memory). ``for_next_step``: asked as a step
        ends, for the next; a sandbox's host reads them when it makes that call (its ``submit_ahead``)."""
        self._settle()
        limit = max(0, limit - self.ahead()[0])
        submit = getattr(self._client, "submit_ahead", None) if for_next_step else None
        self._pending = (None, (submit or self._client.submit)("read_changed", self.name, positions, limit))

    def ahead(self) -> tuple[int, bool]:
        """(rows read ahead and not taken yet, whether a read ahead is in flight)."""
        return sum(a.count - a.i for a in self._ahead.values()), self._pending is not None

    def has_ahead(self, vb: int) -> bool:
        return vb in self._ahead or vb in self._pending_vbs

    def holds_ahead(self) -> bool:
        """Whether any vBucket has rows read ahead or in flight (``has_ahead`` is false for all otherwise)."""
        return bool(self._ahead or self._pending_vbs)

    def _settle(self) -> None:
        if self._pending is None:
            return
        runs, wait = self._pending
        self._pending, self._pending_vbs = None, frozenset()
        if runs is None:
            blob, self._highs, runs = wait()
        else:
            blob, self._highs = wait()
        for (vb, after, limit), answer in zip(
            runs, msgpack.unpackb(blob, raw=False, use_list=False), strict=True
        ):
            if answer[0] == 0:
                if answer[1]:
                    self._ahead[vb] = Ahead(after, len(answer[1]), len(answer[1]) < limit, rows=answer[1])
                continue
            count, keys = answer[1], answer[4]
            if count and keys.count(b"\0") == count - 1:  # else a key holds a NUL: read on the spot
                self._ahead[vb] = Ahead(after, count, count < limit, columns=(vb, after, answer[1:]))

    def read_vb(self, vb: int, after_seqno: int, limit: int) -> list[Mutation]:
        return list(map(Mutation._make, self.read_vb_rows(vb, after_seqno, limit)))

    def read_vb_rows(self, vb: int, after_seqno: int, limit: int) -> list[tuple]:
        """read_vb's rows as plain tuples in Mutation's field order (a worker builds what it needs)."""
        if limit <= 0:
            return []
        if vb in self._pending_vbs:
            self._settle()
        ahead = self._ahead.get(vb)
        if ahead is None or ahead.after != after_seqno:
            return list(
                msgpack.unpackb(
                    self._call("read_vb", self.name, vb, after_seqno, limit), raw=False, use_list=False
                )
            )
        taken = list(ahead.rows[ahead.i : ahead.i + limit])
        ahead.i += len(taken)
        if ahead.i >= ahead.count:
            del self._ahead[vb]
        else:
            ahead.after = taken[-1][1]
        if len(taken) < limit and not ahead.complete:  # read ahead up to its own limit: the rest on the spot
            taken += self.read_vb_rows(vb, taken[-1][1], limit - len(taken))
        return taken

    def forget_prefetched(self, positions: dict[int, int]) -> None:
        """Drop rows read ahead that no longer follow the worker's positions (a rewind, a vBucket that
        left)."""
        for vb in [vb for vb, a in self._ahead.items() if positions.get(vb) != a.after]:
            del self._ahead[vb]

    def read_vb_packed(
        self, vb: int, after_seqno: int, limit: int, origin: str, *, exact_arrivals_over_ms: int | None = None
    ) -> PackedUpdates | None:
        return cast(
            "PackedUpdates | None",
            self._bucket(
                "read_vb_packed",
                vb,
                after_seqno,
                limit,
                origin,
                exact_arrivals_over_ms=exact_arrivals_over_ms,
            ),
        )

    def max_doc_bytes(self, vb: int, after_seqno: int, last_seqno: int) -> int:
        return cast(int, self._bucket("max_doc_bytes", vb, after_seqno, last_seqno))

    def get_raw(self, key: str) -> bytes | None:
        return cast("bytes | None", self._bucket("get_raw", key))

    def get(self, key: str) -> dict | None:
        return cast("dict | None", self._bucket("get", key))

    def get_meta(self, key: str) -> dict | None:
        return cast("dict | None", self._bucket("get_meta", key))

    def get_doc(self, key: str) -> tuple[bytes, int, int] | None:
        return cast("tuple[bytes, int, int] | None", self._bucket("get_doc", key))

    def previous_doc(self, key: str, before_seqno: int) -> bytes | None:
        return cast("bytes | None", self._bucket("previous_doc", key, before_seqno))

    def ensure_key_index(self) -> None:
        self._bucket("ensure_key_index")

    def apply_effects(
        self, function: str, groups: Sequence[EffectGroup], *, origin: str | None = None, marks: bool = True
    ) -> EffectResult:
        return cast(
            EffectResult, self._bucket("apply_effects", function, list(groups), origin=origin, marks=marks)
        )

    def apply_effects_later(
        self, function: str, groups: Sequence[EffectGroup], *, origin: str | None = None, marks: bool = True
    ) -> Callable[[], EffectResult]:
        """apply_effects sent now; calling what this returns waits for its answer. A sandbox's line sends it
        as a step's last flush (`submit_tail`), which its host applies before it reads on."""
        submit = getattr(self._client, "submit_tail", self._client.submit)
        return submit(
            "bucket", self.name, "apply_effects", (function, list(groups)), {"origin": origin, "marks": marks}
        )

    def effect_marks(self, function: str) -> dict[int, tuple[int, int]]:
        return cast("dict[int, tuple[int, int]]", self._bucket("effect_marks", function))

    def partition_marks(self, function: str) -> tuple[list[int], list[dict[int, int]]] | None:
        """PartitionedBucket.partition_marks of the served bucket; None when it is in one piece."""
        answer = self._bucket("partition_marks", function)
        if answer is None:
            return None
        part_of_vb, marks = answer
        return list(part_of_vb), [{int(vb): int(seqno) for vb, seqno in pairs} for pairs in marks]

    def fence(self, function: str, epochs: dict[int, int]) -> None:
        self._bucket("fence", function, dict(epochs))

    def write(
        self, writes: Iterable[Write], *, origin: str | None = None, arrival_ms: int | None = None
    ) -> list[tuple[int, int] | None]:
        return cast(
            "list[tuple[int, int] | None]",
            self._bucket("write", list(writes), origin=origin, arrival_ms=arrival_ms),
        )

    def upsert(
        self,
        key: str,
        doc: dict,
        *,
        origin: str | None = None,
        expiry: int = 0,
        arrival_ms: int | None = None,
    ) -> tuple[int, int]:
        return cast(
            "tuple[int, int]",
            self._bucket("upsert", key, doc, origin=origin, expiry=expiry, arrival_ms=arrival_ms),
        )

    def delete(self, key: str, *, origin: str | None = None) -> tuple[int, int]:
        return cast("tuple[int, int]", self._bucket("delete", key, origin=origin))

    def flush(self, *, new_uuid: str | None = None) -> dict:
        """Empty the bucket (LocalBucket.flush); what was read ahead went with it."""
        self._settle()
        self._ahead.clear()
        self._highs = None
        went = cast(dict, self._bucket("flush", new_uuid=new_uuid))
        self.uuid = went["uuid"]
        return went

    def keys(self, prefix: str = "", limit: int | None = None) -> list[str]:
        return cast("list[str]", self._bucket("keys", prefix, limit))

    def scan(self, prefix: str = "", limit: int | None = None) -> Iterator[tuple[str, dict, dict]]:
        return iter(cast("list[tuple[str, dict, dict]]", self._bucket("scan", prefix, limit)))

    def count(self, prefix: str = "") -> int:
        return cast(int, self._bucket("count", prefix))

    def collections(self) -> dict[tuple[str, str], int]:
        listed = cast("list[tuple[str, str, int]]", self._bucket("collection_list"))
        return {(scope, name): cid for scope, name, cid in listed}

    def mirrors(self) -> dict[int, str]:
        return {int(cid): shown for cid, shown in cast("list[tuple[int, str]]", self._bucket("mirror_list"))}

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<remote bucket {self.name}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if TYPE_CHECKING:

    def _implements_the_protocol(bucket: RemoteBucket) -> Bucket:
        return bucket  # mypy checks every Bucket method is here with a compatible signature


# What a worker's bindings and runner read and write through: the files, or the data service.
AnyBucket = Bucket


class RemoteMetadataStore:
    """``WorkerMetadata`` (metadata.protocol), answered by the data service (its META_CALLS)."""

    def __init__(self, client: DataClient):
        self._call = client.call

    def _meta(self, method: str, *args: Any, **kwargs: Any) -> Any:
        # Iterables (generators of DLQ rows, dict views) become lists: they must survive pickling.
        args = tuple(list(a) if _lazy(a) else a for a in args)
        kwargs = {k: list(v) if _lazy(v) else v for k, v in kwargs.items()}
        return self._call("meta", method, args, kwargs)

    def get_function(self, name: str) -> FunctionRecord:
        return cast(FunctionRecord, self._meta("get_function", name))

    def claim(
        self,
        function: str,
        vbuckets: Iterable[int],
        owner: str,
        *,
        min_epochs: Mapping[int, int] | None = None,
    ) -> dict[int, Checkpoint]:
        return cast(
            "dict[int, Checkpoint]", self._meta("claim", function, vbuckets, owner, min_epochs=min_epochs)
        )

    def commit(
        self,
        function: str,
        epochs: Mapping[int, int],
        seqnos: Mapping[int, int],
        dlq_rows: Iterable[DlqRow] = (),
        counters: Mapping[str, int] | None = None,
        timer_changes: Iterable[TimerChange] = (),
        timers_done: Iterable[TimerDone] = (),
    ) -> set[int]:
        return cast(
            "set[int]",
            self._meta("commit", function, epochs, seqnos, dlq_rows, counters, timer_changes, timers_done),
        )

    def release(self, function: str, epochs: Mapping[int, int]) -> set[int]:
        return cast("set[int]", self._meta("release", function, epochs))

    def claim_timers(
        self,
        function: str,
        epochs: Mapping[int, int],
        now_ms: int,
        limit: int,
        *,
        reclaim: Iterable[int] = (),
    ) -> list[TimerRecord]:
        return cast(
            "list[TimerRecord]", self._meta("claim_timers", function, epochs, now_ms, limit, reclaim=reclaim)
        )

    def get_timer(self, function: str, callback: str, reference: str) -> TimerRecord | None:
        return cast("TimerRecord | None", self._meta("get_timer", function, callback, reference))

    def find_dlq_rows(
        self,
        function: str,
        *,
        vb: int | None = None,
        seqno: int | None = None,
        key: str | None = None,
        reason: str | None = None,
        include_replayed: bool = False,
        replayed_only: bool = False,
        generation: int | None = None,
        limit: int | None = None,
    ) -> list[DlqRow]:
        return cast(
            "list[DlqRow]",
            self._meta(
                "find_dlq_rows",
                function,
                vb=vb,
                seqno=seqno,
                key=key,
                reason=reason,
                include_replayed=include_replayed,
                replayed_only=replayed_only,
                generation=generation,
                limit=limit,
            ),
        )

    def count_death(self, function: str, vb: int, seqno: int) -> int:
        return cast(int, self._meta("count_death", function, vb, seqno))

    def deaths(self, function: str) -> dict[tuple[int, int], int]:
        return cast("dict[tuple[int, int], int]", self._meta("deaths", function))

    def close(self) -> None:
        pass


if TYPE_CHECKING:

    def _serves_the_worker_protocol(store: RemoteMetadataStore) -> WorkerMetadata:
        return store  # mypy checks every WorkerMetadata method is here with a compatible signature


def _lazy(value: Any) -> bool:
    return not isinstance(
        value, str | bytes | dict | list | tuple | set | int | float | type(None)
    ) and hasattr(value, "__iter__")


class DataAccess:
    """How a worker reaches its state: directly (the files, or the database server), or through the data
    service.

    ``local`` is True when there is no data service (embedded, in-process), when the state is on a server
    every machine reaches itself, or when this process runs on the service's Ray node and sees the files;
    then buckets and the metadata store are opened directly, exactly as without a service, so a co-located
    worker pays nothing for the split."""

    def __init__(self, location: str, service: DataServiceRef | None = None, *, key: str = ""):
        self.location = location
        self.data_dir = location  # the name workers and the window row writer know it by
        self.service = service
        # A sandboxed child's line is `remote_only`: it never opens the state itself, even one on a server.
        self.local = (
            service is None
            or not getattr(service, "remote_only", False)
            and (is_server_location(location) or _sees_files(location, service))
        )
        self._client = None if self.local or service is None else service.client(key)
        self._state: State | None = None

    @property
    def state(self) -> State:
        """The state opened directly (``local`` only)."""
        if self._state is None:
            # A worker's: its service reached the store, so a server away now is waited for.
            self._state = open_state(self.location, reached_before=True)
        return self._state

    def bucket(self, name: str) -> Bucket:
        if self._client is None:
            return self.state.open_bucket(name)
        return RemoteBucket(self._client, name)

    def metadata(self) -> WorkerMetadata:
        """The metadata store as a worker uses it: its own connection, or the data service's answers."""
        if self._client is None:
            return self.state.open_metadata()
        return RemoteMetadataStore(self._client)

    def app_log_writer(self, function: str, max_size: int, max_files: int) -> AppLogWriter:
        """The function's application log: the state's own where it is reached directly, else batches of
        stamped lines sent to the data service (which appends them with the same rotation)."""
        client = self._client
        if client is None:
            return self.state.app_logs.writer(function, max_size, max_files)
        return RemoteAppLog(lambda lines: client.submit("app_log", function, lines, max_size, max_files))

    def put_file(self, relative: str, data: bytes) -> None:
        """Durably write a file under the data directory through the service (remote workers only)."""
        if self._client is None:
            raise RuntimeError("put_file is for workers without the data directory; write the file directly")
        self._client.call("put_file", relative, data)


def _sees_files(data_dir: str, service: DataServiceRef) -> bool:
    if os.environ.get(LOCALITY_ENV, "1") == "0" or getattr(service, "remote_only", False):
        return False
    try:
        import ray

        if ray.is_initialized() and ray.get_runtime_context().get_node_id() != service.node_id:
            return False
    except Exception:  # noqa: BLE001 - no Ray context: judge by the files alone
        pass
    return (Path(data_dir) / "buckets").is_dir() and (
        bool(os.environ.get("EVENTING_METADATA_URL")) or (Path(data_dir) / SQLITE_FILE).exists()
    )


def _again(error: BaseException) -> BaseException:
    """An error that crossed from a Ray actor, raised again as its own class (its way out kept)."""
    again = type(error)(*error.args)
    again.fix = getattr(error, "fix", None)  # type: ignore[attr-defined]
    return again
