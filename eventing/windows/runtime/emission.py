"""Emitting closed windows: the aggregator, sink and emitter a coordinator is given, the staging of one
Spark job's partial files, the job itself (aggregate, then write to the sink), its retry delays, and the
fault-injection points tests kill the process at.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from eventing.windows.runtime.coordinator_state import AcceptedBatch, PendingWindow
from eventing.windows.runtime.paths import WindowPaths
from eventing.windows.runtime.row_writer import RowLayout
from metadata.sqlite_io import private_folder

log = logging.getLogger("eventing.windows")

FAULT_ENV = "EVENTING_WINDOWS_FAULT"  # tests: "after_state_commit" or "after_sink_write" kills the process there
FAULT_EXIT_CODE = 97
EMIT_RETRY_S = (1.0, 5.0, 15.0, 30.0)
DRAIN_ATTEMPTS = 3  # a stopping service gives up emitting after this many failed Spark jobs in a row
DISK_FULL_RETRY_S = 1.0  # a sink on a full disk is tried again this often, up to $EVENTING_STORE_WAIT_S


def is_disk_full(error: BaseException) -> bool:
    """A sink write that met a full disk (``StoreError`` "cannot write ...: the disk is full ...")."""
    from eventing.errors import StoreError

    return isinstance(error, StoreError) and "the disk is full" in str(error)


class Aggregator(Protocol):
    """Computes the results of ``windows`` by merging every partial batch under ``partials_dir`` (layout of
    ``eventing.windows.spark.partials.partial_schema``; results in ``eventing.windows.batches.result_schema``)."""

    def __call__(self, partials_dir: Path, layout: RowLayout, windows: list[tuple]) -> pa.Table: ...


class Sink(Protocol):
    def write(self, function: str, results: pa.Table, *, windows: Any = (), substream: str | None = None) -> int: ...
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


def make_sink(paths: WindowPaths, layout: RowLayout) -> Sink:
    from eventing.windows.spark.sink import ParquetWindowSink, SqliteWindowSink

    sink = layout.spec.sink
    location = paths.sink_location(sink.kind, sink.path)
    if sink.kind == "sqlite":
        return SqliteWindowSink(location)
    return ParquetWindowSink(location)


def fault(point: str) -> None:
    """Exit the process at ``point`` when ``FAULT_ENV`` names it (crash tests)."""
    if os.environ.get(FAULT_ENV) == point:
        log.error("fault injection: exiting at %s", point)
        os._exit(FAULT_EXIT_CODE)


def stage(staged: Path, accepted_dir: Path, accepted: list[AcceptedBatch], group: list[PendingWindow]) -> None:
    """Link into ``staged`` the accepted files that hold rows of the windows ``group``."""
    private_folder(staged)
    lo = min(p.window.start_ms for p in group)
    hi = max(p.window.end_ms for p in group)
    limit = max(p.closed_at for p in group)
    for a in accepted:
        if a.seq <= limit and a.min_ms < hi and lo <= a.max_ms:
            source, target = accepted_dir / a.name, staged / a.name
            try:
                os.link(source, target)  # the job keeps its rows even if the file is pruned meanwhile
            except OSError:
                shutil.copyfile(source, target)


def emit(
    aggregator: Aggregator, sink: Sink, function: str, layout: RowLayout, staged: Path, windows: list[tuple],
    substream_ids: list[tuple] | None = None,
) -> int:
    """Runs on the emitter: aggregate the windows with Spark and write them to the sink. Windows closed
    per substream (``substream_ids``: start, end, substream) keep only their substream's rows: the
    others' windows of the same bounds may still be open."""
    try:
        results = aggregator(staged, layout, windows)
        if substream_ids is None:
            ids: list[tuple] = sorted({(w[0], w[1]) for w in windows})
            written = sink.write(function, results, windows=ids)
        else:
            column = layout.spec.substream_key
            assert column is not None
            results = only_windows(results, column, substream_ids)
            written = sink.write(function, results, windows=substream_ids, substream=column)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
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
        (s, e, v) in wanted for s, e, v in zip(results[WINDOW_START].to_pylist(), results[WINDOW_END].to_pylist(),
                                                 results[column].to_pylist(), strict=True)
    ]
    return results if all(keep) else results.filter(pa.array(keep, pa.bool_()))
