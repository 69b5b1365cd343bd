"""Emitting closed windows: the aggregator, sink and emitter a coordinator is given, the staging of one
Spark job's partial files, the job itself (aggregate, then write to the sink), its retry delays, and the
fault-injection points tests kill the process at.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from eventing.errors import ConfigError
from eventing.windows.runtime.coordinator_state import AcceptedBatch, PendingWindow
from eventing.windows.runtime.paths import ACCEPTED, WindowPaths, window_area
from eventing.windows.runtime.row_writer import RowLayout
from metadata.sqlite_io import private_folder, store_wait_s

if TYPE_CHECKING:
    from eventing.storage.file_area import FileArea
    from eventing.storage.state import State

log = logging.getLogger("eventing.windows")

FAULT_ENV = (
    "EVENTING_WINDOWS_FAULT"  # tests: "after_state_commit" or "after_sink_write" kills the process there
)
FAULT_EXIT_CODE = 97
EMIT_RETRY_S = (1.0, 5.0, 15.0, 30.0)
DRAIN_ATTEMPTS = 3  # a stopping service gives up emitting after this many failed Spark jobs in a row
DISK_FULL_RETRY_S = 1.0  # a sink on a full disk is tried again this often, up to $EVENTING_STORE_WAIT_S


class EmitRetries:
    """When a coordinator's next Spark job may start after failed ones: after a growing delay for a failed
    job, and every DISK_FULL_RETRY_S while the sink's disk is full, as a metadata write waits for free
    space; a disk full for $EVENTING_STORE_WAIT_S stops the function (the windows stay pending in the
    committed state, so the next run writes them)."""

    def __init__(self, function: str):
        self.function = function
        self.failures = 0  # failed jobs in a row (a full disk not counted)
        self.retry_at = 0.0  # time.monotonic() before which no job starts
        self.last_error: BaseException | None = None
        self._disk_full_since: float | None = None  # when the sink first met a full disk, in this streak

    def failed(self, error: BaseException, windows: int) -> None:
        self.last_error = error
        now = time.monotonic()
        if is_disk_full(error):
            if self._disk_full_since is None:
                self._disk_full_since = now
                log.warning(
                    "function %s: %s; waiting for free space (up to %.0fs)",
                    self.function,
                    error,
                    store_wait_s(),
                )
            if now - self._disk_full_since >= store_wait_s():
                raise error
            self.retry_at = now + DISK_FULL_RETRY_S
            return
        delay = EMIT_RETRY_S[min(self.failures, len(EMIT_RETRY_S) - 1)]
        self.failures += 1
        self.retry_at = now + delay
        log.error(
            "function %s: computing %d closed window(s) failed (%s: %s); retrying in %.0fs",
            self.function,
            windows,
            type(error).__name__,
            error,
            delay,
        )

    def succeeded(self) -> None:
        self.failures = 0
        self._disk_full_since = None


def is_disk_full(error: BaseException) -> bool:
    """A sink write that met a full disk (``StoreError`` "cannot write ...: the disk is full ...")."""
    from eventing.errors import StoreError

    return isinstance(error, StoreError) and "the disk is full" in str(error)


class Aggregator(Protocol):
    """Computes the results of ``windows`` by merging every partial batch under ``partials_dir`` (layout of
    ``eventing.windows.spark.partials.partial_schema``; results in
    ``eventing.windows.batches.result_schema``)."""

    def __call__(self, partials_dir: Path, layout: RowLayout, windows: list[tuple]) -> pa.Table: ...


class Sink(Protocol):
    def write(
        self, function: str, results: pa.Table, *, windows: Any = (), substream: str | None = None
    ) -> int: ...
    def read(self, function: str) -> pa.Table: ...
    def written_windows(self, function: str) -> set[tuple]: ...


class Emitter(Protocol):
    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future: ...


class InlineEmitter:
    """Runs emission jobs in the calling thread (tests, and the final flush when no thread is given)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(exc)
        return future


def make_sink(
    state: State | str | os.PathLike[str], function: str, layout: RowLayout, area: FileArea | None = None
) -> Sink:
    """The function's sink: the one its definition names at a path (a local path: the user's output,
    relative to the data directory, or to the working directory on a server state), else the default
    one beside its files: under ``windows/<fn>/`` of a data directory, or a table of the PostgreSQL store
    (``eventing.windows.spark.postgres_sink``)."""
    from eventing.storage.file_area import DirectoryArea
    from eventing.storage.state import as_state
    from eventing.windows.spark.sink import ParquetWindowSink, SqliteWindowSink

    sink = layout.spec.sink
    if sink.path is not None and not _sink_path_trusted(state, function):
        log.warning(
            "function %s: its window sink path %r is left unused, as the function was saved or deployed by a "
            "user who is not a full admin; its results go to its own area (an admin's deploy uses the path)",
            function,
            sink.path,
        )
        sink = type(sink)(sink.kind, None)
    area = area if area is not None else window_area(state, function)
    if sink.path is None and not isinstance(area, DirectoryArea):
        from eventing.storage.postgres.file_area import PostgresArea
        from eventing.windows.spark.postgres_sink import PostgresWindowSink

        if not isinstance(area, PostgresArea):
            raise ConfigError(
                f"function '{function}': no default window sink for {area!r}; give the sink a path"
            )
        return PostgresWindowSink(area.db)
    directory = as_state(state).directory
    if directory is None and sink.path is not None:  # a server state: the user's path as given
        location = Path(sink.path).expanduser()
    elif directory is None:
        raise ConfigError(f"function '{function}': its state has no directory for a default window sink")
    else:
        location = WindowPaths.of(directory, function).sink_location(sink.kind, sink.path)
    if sink.kind == "sqlite":
        return SqliteWindowSink(location)
    return ParquetWindowSink(location)


def _sink_path_trusted(state: State | str | os.PathLike[str], function: str) -> bool:
    """Whether a full admin (or the local CLI) last saved or deployed the function: only then does the
    service write its window results where the sink's path says, anywhere it may write (as a sandbox
    honours `sandbox_writable`). A function with no record (a window run without one) is the caller's."""
    from eventing.errors import NotFoundError
    from eventing.storage.state import as_state

    opened = as_state(state)
    if not opened.exists():
        return True
    store = opened.open_metadata()
    try:
        record = store.get_function(function)
    except NotFoundError:
        return True
    finally:
        store.close()
    from eventing.core.definition import deployed_by_admin

    return deployed_by_admin(record.deployed_by)


def fault(point: str) -> None:
    """Exit the process at ``point`` when ``FAULT_ENV`` names it (crash tests)."""
    if os.environ.get(FAULT_ENV) == point:
        log.error("fault injection: exiting at %s", point)
        os._exit(FAULT_EXIT_CODE)


def stage(area: FileArea, staged: str, accepted: list[AcceptedBatch], group: list[PendingWindow]) -> None:
    """Copy (link, on a directory) into the folder ``staged`` of the area the accepted files that hold rows
    of the windows ``group``."""
    local = area.local_path(staged)
    if local is not None:
        private_folder(local)
    lo = min(p.window.start_ms for p in group)
    hi = max(p.window.end_ms for p in group)
    limit = max(p.closed_at for p in group)
    for a in accepted:
        if a.seq <= limit and a.min_ms < hi and lo <= a.max_ms:
            # The job keeps its rows even if the file is pruned meanwhile.
            area.copy(f"{ACCEPTED}/{a.name}", f"{staged}/{a.name}")


def emit(
    aggregator: Aggregator,
    sink: Sink,
    function: str,
    layout: RowLayout,
    area: FileArea,
    staged: str,
    windows: list[tuple],
    substream_ids: list[tuple] | None = None,
) -> int:
    """Runs on the emitter: aggregate the windows with Spark and write them to the sink. Windows closed
    per substream (``substream_ids``: start, end, substream) keep only their substream's rows: the
    others' windows of the same bounds may still be open. Where the area is not a folder of this machine,
    the staged files are read from it into a temporary folder for the job (Spark takes them from there as
    Arrow from the driver, or reads them when they are many); the durable copies stay in the area."""
    local = area.local_path(staged)
    scratch = None
    try:
        if local is None:
            local = scratch = Path(tempfile.mkdtemp(prefix=f"eventing-partials-{function}-"))
            for file in area.list(staged):
                (scratch / file).write_bytes(area.read(f"{staged}/{file}"))
        results = aggregator(local, layout, windows)
        if substream_ids is None:
            ids: list[tuple] = sorted({(w[0], w[1]) for w in windows})
            written = sink.write(function, results, windows=ids)
        else:
            column = layout.spec.substream_key
            assert column is not None
            results = only_windows(results, column, substream_ids)
            written = sink.write(function, results, windows=substream_ids, substream=column)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        area.delete_folder(staged)
    fault("after_sink_write")
    return written


def job_sort_key(key: tuple) -> tuple:
    if len(key) == 2:
        return key
    return (key[0], key[1], tuple((0, "") if v is None else (1, v) for v in key[2]))


def only_windows(results: pa.Table, column: str, ids: list[tuple]) -> pa.Table:
    """The result rows of the ``(start, end, substream)`` windows ``ids``."""
    from eventing.windows.batches import WINDOW_END, WINDOW_START

    wanted = set(ids)
    keep = [
        (s, e, v) in wanted
        for s, e, v in zip(
            results[WINDOW_START].to_pylist(),
            results[WINDOW_END].to_pylist(),
            results[column].to_pylist(),
            strict=True,
        )
    ]
    return results if all(keep) else results.filter(pa.array(keep, pa.bool_()))
