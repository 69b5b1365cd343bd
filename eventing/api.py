"""The Python API: drive a deployment from Python as the CLI does (quix-streams' `Application`, bytewax's
`run_main`). Every method calls the same functions as the matching `eventing` command, with explicit
parameters instead of flags and environment variables.

    from eventing import Eventing

    app = Eventing("./.eventing", executor="in-process")
    app.create_bucket("customers"); app.create_bucket("emails")
    app.load("customers", documents=1_000, mutations=5_000, seed=1)
    app.deploy("functions/fn_email.json")
    summary = app.run(until_caught_up=True)
    print(app.stats("fn_email").on_update_success)

    running = app.run(until_caught_up=False)   # in a background thread until stopped
    app.upsert("customers", "customer::new", {"name": "Ada", "email": "ada@example.com"})
    running.wait_until_caught_up()             # that write handled, its effects applied
    running.stop(); summary = running.wait()

The CLI's demo (`eventing demo`) runs on this API.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

from eventing.control import lifecycle
from eventing.control.service import EventingService, RunSummary
from eventing.core.definition import Boundary, FunctionDefinition
from eventing.errors import ConfigError, EventingError, InvalidDocumentError
from eventing.ops import buckets as bucket_ops
from eventing.ops.jsonl import load_json_lines
from eventing.ops.stats import function_stats, vbucket_map
from eventing.ops.verify import VerifyReport, verify_function
from eventing.storage import loadgen
from eventing.storage.keyspace import Collection, open_keyspace
from eventing.storage.protocol import FileBucket
from eventing.storage.state import State, default_location, open_state
from eventing.storage.values import Write
from eventing.storage.writes import chunked
from eventing.windows.runtime.host import WindowOptions
from eventing.workers.executor import make_executor
from metadata import FunctionRecord, FunctionState
from metadata.sqlite_io import private_folder

ExecutorKind = Literal["ray", "in-process"]
CAUGHT_UP_POLL_S = 0.05  # how often RunningService.wait_until_caught_up looks at the checkpoints


@dataclass(frozen=True)
class FunctionStats:
    """A function's counters (`eventing stats`); `to_dict()` is the whole `eventing stats --json` view
    (timers, bucket and curl operations, Couchbase-named counters, the last run)."""

    function: str
    state: str
    mutations_seen: int
    on_update_success: int
    on_update_failure: int
    on_update_timeout: int
    on_delete_success: int
    on_delete_failure: int
    on_delete_timeout: int
    dlq: Mapping[str, int]  # dead letters by reason
    checkpoint_lag: int
    throughput_mps: float
    view: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, view: dict[str, Any]) -> FunctionStats:
        return cls(
            view["function"],
            view["state"],
            view["mutations_seen"],
            view["on_update_success"],
            view["on_update_failure"],
            view["on_update_timeout"],
            view["on_delete_success"],
            view["on_delete_failure"],
            view["on_delete_timeout"],
            dict(view["dlq"]),
            view["checkpoint_lag"],
            view["throughput_mps"],
            view,
        )

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(dict(self.view))


@dataclass(frozen=True)
class WorkerVBuckets:
    """The vBuckets one worker owns: how many, as ranges ("0-255,300"), and whether it runs now."""

    worker: str
    vbuckets: int
    ranges: str
    live: bool


@dataclass(frozen=True)
class VBucketMap:
    """Which worker owns which vBuckets (`eventing vbmap`), from the running service or the last owners."""

    function: str
    source: str  # where the owners were read
    workers: tuple[WorkerVBuckets, ...]

    @classmethod
    def of(cls, view: dict[str, Any]) -> VBucketMap:
        workers = tuple(
            WorkerVBuckets(w["worker"], w["vbuckets"], w["ranges"], w["live"]) for w in view["workers"]
        )
        return cls(view["function"], view["source"], workers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "source": self.source,
            "workers": [vars(w).copy() for w in self.workers],
        }


@dataclass(frozen=True)
class WindowReport:
    """A windowed function's results (`eventing windows`): one row per closed window and group (window
    start and end as ISO text and epoch ms, the group-by fields, the aggregates), the closing watermark,
    open and emitted windows and late rows; `to_dict()` is the `eventing windows --json` view."""

    function: str
    window: Mapping[str, Any]  # kind, size, ... of the definition's window
    group_by: tuple[str, ...]
    aggregates: tuple[str, ...]
    watermark_ms: int | None
    open_windows: int
    windows_emitted: int
    late_rows: int
    results: tuple[Mapping[str, Any], ...]
    view: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, view: dict[str, Any]) -> WindowReport:
        return cls(
            view["function"],
            view["window"],
            tuple(view["group_by"]),
            tuple(view["aggregates"]),
            view.get("watermark_ms"),
            view.get("open_windows", 0),
            view.get("windows_emitted", 0),
            view.get("late_rows", 0),
            tuple(view["results"]),
            view,
        )

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy({**self.view, "results": list(self.results)})


class RunningService:
    """A service started by `Eventing.run(until_caught_up=False)`, running in a background thread until
    stop(); wait_until_caught_up() waits for what the sources hold to be handled; wait() gives its
    RunSummary (and raises what ended it, if it failed to start)."""

    def __init__(self, service: EventingService):
        self._service = service
        self._summary: RunSummary | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="eventing-service", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._summary = self._service.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of wait()
            self._error = exc

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Ask the service to stop: every function checkpoints and its workers end (wait() for it)."""
        self._service.stop()

    def wait_until_caught_up(self, timeout: float = 60.0) -> None:
        """Block until every deployed function this service runs has handled and checkpointed every
        mutation its source bucket holds now (its high seqnos at this call): writes made before the call
        have then been handled and their effects applied. The service keeps running. TimeoutError after
        `timeout` seconds (naming the functions still behind); a function that failed, or a service that
        ended, raises what ended it."""
        service = self._service
        targets = {name: _high_seqnos(service.state, source) for name, source in self._deployed().items()}
        deadline = time.monotonic() + timeout
        while True:
            behind: dict[str, int] = {}
            for name, highs in targets.items():
                progress = service.summary.functions.get(name)
                if progress is not None and progress.error is not None:
                    raise EventingError(f"function '{name}' failed: {progress.error}")
                with service.state.metadata as store:
                    checkpoints = store.checkpoints(name)
                lag = sum(
                    max(0, high - (checkpoints[vb].seqno if vb in checkpoints else 0))
                    for vb, high in enumerate(highs)
                )
                if lag:
                    behind[name] = lag
            if not behind:
                return
            if not self.running:
                self.wait(0)  # raises what ended it
                raise EventingError("the eventing service stopped before its functions caught up")
            if time.monotonic() >= deadline:
                left = ", ".join(f"{name} {lag:,}" for name, lag in sorted(behind.items()))
                raise TimeoutError(
                    f"not caught up after {timeout} s; mutations not yet checkpointed: {left} "
                    "(the service keeps running: wait again, or stop() it)"
                )
            time.sleep(CAUGHT_UP_POLL_S)

    def _deployed(self) -> dict[str, str]:
        """The deployed functions this service runs, with their source keyspaces."""
        only = self._service.only
        with self._service.state.metadata as store:
            records = store.list_functions()
        return {
            r.name: r.definition["source_bucket"]
            for r in records
            if r.state is FunctionState.DEPLOYED and (only is None or r.name in only)
        }

    def wait(self, timeout: float | None = None) -> RunSummary:
        """The run's summary once the service has stopped; TimeoutError if it is still running after
        `timeout` seconds (it keeps running: stop() it, or wait again)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the eventing service is still running after {timeout} s; call stop() first")
        if self._error is not None:
            raise self._error
        assert self._summary is not None
        return self._summary


def _high_seqnos(state: State, source: str) -> list[int]:
    with state.open_bucket(source) as bucket:
        return bucket.high_seqnos()


class Eventing:
    """One deployment: its state (the buckets and metadata store in a data directory, or on a PostgreSQL
    server), run on Ray or in this process. ``Eventing(".eventing")`` or ``Eventing(store="postgresql://...")``;
    the state is opened once and kept until ``close()`` (or the end of a ``with`` block)."""

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        store: str | None = None,
        executor: ExecutorKind = "ray",
        ray_address: str | None = None,
        worker_processes: int | None = None,
    ):
        if data_dir is not None and store is not None:
            raise ConfigError("give Eventing a data directory or a store, not both")
        location = (
            store if store is not None else str(data_dir) if data_dir is not None else default_location()
        )
        self.state = open_state(location)
        if self.state.directory is not None:
            private_folder(self.state.directory)
        self.executor = executor
        self.ray_address = ray_address
        # Ray: the workers of every function share this many worker processes (`eventing run
        # --worker-processes`); None: $EVENTING_WORKER_PROCESSES, else one process per worker.
        self.worker_processes = worker_processes

    @property
    def location(self) -> str:
        """Where the state is (a data directory, or a PostgreSQL URL)."""
        return self.state.location

    @property
    def data_dir(self) -> str:
        """The location, under the name earlier versions gave it (a data directory then, always)."""
        return self.state.location

    def close(self) -> None:
        """Close the state (its metadata store's connections)."""
        self.state.close()

    def __enter__(self) -> Eventing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- buckets ----------------------------------------------------------------------------------------

    def create_bucket(self, name: str, *, exist_ok: bool = True, partitions: int = 1) -> FileBucket:
        """The bucket `name`, created empty if it does not exist (`eventing bucket create`); ``partitions``
        spreads its vBuckets over that many files (docs/everyday-commands.md, "Partitioned buckets")."""
        return self.state.create_bucket(name, exist_ok=exist_ok, partitions=partitions)

    def bucket(self, name: str) -> FileBucket:
        """An existing bucket; NotFoundError names the fix if there is none."""
        return self.state.open_bucket(name)

    # Where a method takes `bucket` for documents, a keyspace `bucket.scope.collection` names a collection of
    # it (a bare bucket name is its default collection): see eventing.core.keyspaces.

    def collection(self, keyspace: str) -> Collection:
        """The documents of a keyspace (a bucket's default collection, or `bucket.scope.collection`)."""
        return open_keyspace(self.state, keyspace)

    def create_collection(
        self,
        keyspace: str,
        *,
        mirror: str | None = None,
        table: str | None = None,
        publication: str | None = None,
        slot: str | None = None,
    ) -> int:
        """Create the collection `bucket.scope.collection` (`eventing collection create`); returns its id.
        With `mirror` (a PostgreSQL URL) and `table` ("schema.table"), its documents follow that table
        (docs/postgresql-mirror.md): the running service takes its snapshot and follows it."""
        if mirror is None:
            return int(bucket_ops.create_collection(self.state, keyspace)["id"])
        from eventing.ops import mirrors

        if not table:
            raise ConfigError("create_collection(mirror=...) needs table='schema.table'")
        return int(
            mirrors.create_mirror(
                self.state, keyspace, source=mirror, table=table, publication=publication, slot=slot
            )["id"]
        )

    def mirrors(self) -> list[dict[str, Any]]:
        """Every mirror (no password) with its health: state, lag and the WAL its slot holds back."""
        from eventing.ops import mirrors

        return mirrors.mirror_health(self.state)

    def drop_collection(self, keyspace: str) -> int:
        """Drop a collection and its documents (`eventing collection drop`); a deployed or paused function
        that reads or binds it is undeployed first, as in Couchbase. Returns how many documents went."""
        from eventing.ops import mirrors

        return int(mirrors.drop_collection(self.state, keyspace)["documents"])

    def collections(self, bucket: str) -> list[str]:
        """The keyspaces of a bucket's collections, its default collection (the bucket's name) first."""
        return [row["keyspace"] for row in bucket_ops.list_collections(self.state, bucket)]

    def get(self, bucket: str, key: str) -> dict[str, Any] | None:
        """One document, or None (`eventing bucket get`)."""
        with self.collection(bucket) as target:
            return target.get(key)

    def keys(self, bucket: str, prefix: str = "", limit: int | None = None) -> list[str]:
        """Document keys in key order (`eventing bucket keys`)."""
        with self.collection(bucket) as target:
            return target.keys(prefix, limit)

    def count(self, bucket: str) -> int:
        """Live documents (`eventing bucket count`)."""
        with self.collection(bucket) as target:
            return target.count()

    def upsert(self, bucket: str, key: str, doc: dict[str, Any], *, expiry: int = 0) -> tuple[int, int]:
        """Create or replace one document (`eventing bucket upsert`); returns its (vBucket, seqno)."""
        with self.collection(bucket) as target:
            return target.upsert(key, doc, expiry=expiry)

    def remove(self, bucket: str, key: str) -> tuple[int, int]:
        """Delete one document, a tombstone mutation (`eventing bucket delete`); returns its (vBucket,
        seqno)."""
        with self.collection(bucket) as target:
            return target.delete(key)

    def write(self, bucket: str, writes: Iterable[Write]) -> int:
        """Append mutations in bulk (`eventing bucket load`; a Write holds the document as msgpack bytes,
        eventing.core.mutation.encode_document, and its key is the document's key in the keyspace); returns
        how many were logged."""
        with self.collection(bucket) as target:
            written = 0
            for chunk in chunked(writes, 20_000):
                stored = [w._replace(key=target.stored(w.key)) for w in chunk] if target.cid else chunk
                written += sum(1 for r in target.bucket.write(stored) if r is not None)
            return written

    def load(
        self, bucket: str, *, documents: int, mutations: int, seed: int = 0, prefix: str = "customer"
    ) -> int:
        """Faker-generated customer mutations, deterministic per seed (`eventing bucket load`)."""
        if documents < 1 or mutations < documents:
            raise ConfigError("mutations must be >= documents >= 1 (each document is created once first)")
        return self.write(bucket, loadgen.generate(documents, mutations, seed=seed, prefix=prefix))

    def load_jsonl(self, bucket: str, path: str | Path, *, rejected: list[str] | None = None) -> int:
        """Import a JSON lines file (`eventing bucket load --file`): one `{"key": ..., "doc": {...}}` (with an
        optional "expiry") or `{"key": ..., "op": "delete"}` a line, committed 20,000 lines a transaction;
        returns how many mutations were logged (a delete of a missing document logs none). A bad line is
        not loaded: with `rejected`, each one is added to it ("line N: what is wrong"); without, the other
        lines are loaded and InvalidDocumentError names the first bad one."""
        bad: list[str] = [] if rejected is None else rejected
        before = len(bad)
        with self.collection(bucket) as target:
            target.bucket.verify_integrity()  # never add to a damaged file
            written = load_json_lines(target, str(path), bad).written
        if rejected is None and len(bad) > before:
            raise InvalidDocumentError(
                f"{len(bad) - before} line(s) of {path} were not loaded ({bad[before]}); the other "
                f"{written:,} mutations were: fix those lines and load them alone"
            )
        return written

    # -- functions --------------------------------------------------------------------------------------

    def deploy(
        self,
        definition: str | Path | FunctionDefinition | dict[str, Any],
        handler: str | None = None,
        *,
        boundary: Boundary | None = None,
    ) -> FunctionRecord:
        """Save and deploy a function: a definition file (its handler beside it), or a definition with the
        handler's source (`eventing deploy`)."""
        self.save(definition, handler)
        name = (
            definition.name
            if isinstance(definition, FunctionDefinition)
            else (definition["name"] if isinstance(definition, dict) else _definition_name(definition))
        )
        return lifecycle.deploy(self.state, name, boundary)

    def save(
        self, definition: str | Path | FunctionDefinition | dict[str, Any], handler: str | None = None
    ) -> FunctionRecord:
        """Create or update a function without deploying it (`eventing create`)."""
        if isinstance(definition, str | Path):
            if handler is not None:
                raise ConfigError("a definition file names its handler file; pass no handler source with it")
            return lifecycle.save_from_file(self.state, definition)
        if handler is None:
            raise ConfigError("a definition given as data needs the handler's source code")
        defn = (
            definition
            if isinstance(definition, FunctionDefinition)
            else FunctionDefinition.from_dict(definition)
        )
        return lifecycle.save_function(self.state, defn, handler)

    def pause(self, name: str, *, wait_s: float = 60.0) -> FunctionRecord:
        return lifecycle.pause(self.state, name, wait_s=wait_s)

    def resume(self, name: str) -> FunctionRecord:
        return lifecycle.resume(self.state, name)

    def undeploy(self, name: str, *, wait_s: float = 60.0) -> FunctionRecord:
        return lifecycle.undeploy(self.state, name, wait_s=wait_s)

    def delete(self, name: str) -> None:
        lifecycle.delete(self.state, name)

    # -- running and watching ---------------------------------------------------------------------------

    @overload
    def run(
        self,
        *,
        until_caught_up: Literal[True] = ...,
        functions: list[str] | None = ...,
        on_progress: Callable[[RunSummary], None] | None = ...,
        close_windows: bool = ...,
        spark_master: str | None = ...,
    ) -> RunSummary: ...

    @overload
    def run(
        self,
        *,
        until_caught_up: Literal[False],
        functions: list[str] | None = ...,
        on_progress: Callable[[RunSummary], None] | None = ...,
        close_windows: bool = ...,
        spark_master: str | None = ...,
    ) -> RunningService: ...

    def run(
        self,
        *,
        until_caught_up: bool = True,
        functions: list[str] | None = None,
        on_progress: Callable[[RunSummary], None] | None = None,
        close_windows: bool = False,
        spark_master: str | None = None,
    ) -> RunSummary | RunningService:
        """Run the deployed functions (`eventing run`). By default until the high seqnos seen at start are
        handled and checkpointed: blocks and returns the RunSummary. With `until_caught_up=False` the
        service runs in a background thread and follows new mutations and lifecycle changes until
        stopped: returns a RunningService (`wait_until_caught_up()` for the writes made so far to be
        handled, `stop()`, then `wait()` for the summary). Errors of a function are in the summary's
        `errors`. Windowed functions: `close_windows` closes every open window at the end of the input
        (with until_caught_up), `spark_master` sends merge jobs to a Spark cluster
        (default local[*])."""
        service = EventingService(
            self.state,
            make_executor(
                self.executor, self.ray_address, self.state, worker_processes=self.worker_processes
            ),
            until_caught_up=until_caught_up,
            functions=functions,
            on_progress=on_progress,
            windows=WindowOptions(close_windows=close_windows, spark_master=spark_master),
        )
        if until_caught_up:
            return service.run()
        return RunningService(service)

    def stats(self, name: str) -> FunctionStats:
        """A function's counters (`eventing stats`; `.to_dict()` is `eventing stats --json`)."""
        return FunctionStats.of(function_stats(self.state, name))

    def vbucket_map(self, name: str) -> VBucketMap:
        """Which worker owns which vBuckets (`eventing vbmap`; `.to_dict()` is `eventing vbmap --json`)."""
        return VBucketMap.of(vbucket_map(self.state, name))

    def windows(self, name: str, *, limit: int | None = None) -> WindowReport:
        """A windowed function's results (`eventing windows`; `.to_dict()` is `eventing windows --json`):
        one row per closed window and group, with the watermark, open and emitted windows and late rows;
        `limit` keeps the last N rows."""
        from eventing.ops.windows import window_report

        report = window_report(self.state, name)
        if limit:
            report["results"] = report["results"][-limit:]
        return WindowReport.of(report)

    def verify(self, name: str, *, ledger: str | None = None) -> VerifyReport:
        """Check a function against a ledger bucket (`eventing verify`)."""
        return verify_function(self.state, name, ledger=ledger)


def _definition_name(path: str | Path) -> str:
    from eventing.core.definition import load_definition_file

    return load_definition_file(path)[0].name
