"""Runs the window coordinators of an EventingService: one per running windowed function, one Spark thread.

The service calls ``poll(supervisors)`` from its loop (each coordinator polls at most every ``POLL_S``),
``function_stopped(supervisor)`` after a function's workers stopped (their last rows are on disk), and
``close()`` at the end. Spark jobs run on one background thread so the service loop keeps pumping the
workers and writing heartbeats while a job (or Spark's ~10 s cold start) runs.

Options are a ``WindowOptions`` the service is given (``eventing run --spark-master/--close-windows``).
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventing.errors import EventingError, FencedError

if TYPE_CHECKING:  # imported when a windowed function first runs: pyarrow costs every command ~0.2 s
    import pyarrow as pa

    from eventing.windows.runtime.coordinator import WindowCoordinator
    from eventing.windows.runtime.emission import Aggregator
    from eventing.windows.runtime.row_writer import RowLayout

log = logging.getLogger("eventing.windows")

POLL_S = 0.25  # how often a coordinator consumes its workers' row files and closes windows
DRAIN_TIMEOUT_S = 600.0  # how long a stopping service waits for Spark to emit the last closed windows


@dataclass(frozen=True)
class WindowOptions:
    """How a service runs its windowed functions."""

    # With --until-caught-up: at the end of the input close every window still open (default: windows
    # close only by watermark and idle timeouts, and stay open for the next run).
    close_windows: bool = False
    spark_master: str | None = None  # None: $EVENTING_SPARK_MASTER or local[*]


class SparkAggregator:
    """Merges partial aggregates with ``eventing.windows.spark.spark_job.merge_partials`` on this process's
    shared SparkSession, started at the first closed window."""

    def __init__(self, master: str | None = None):
        self.master = master

    @property
    def local(self) -> bool:
        """Whether the merges run on this machine's Spark (``local[...]``, the default) rather than a
        cluster's, which gets every merge as a Spark job."""
        from eventing.windows.spark.spark_session import DEFAULT_MASTER, MASTER_ENV

        return (self.master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER).startswith("local")

    def __call__(self, partials_dir: Path, layout: RowLayout, windows: list[tuple]) -> pa.Table:
        spec = layout.spec
        if not spec.is_session and self.local:
            # A local master's merge of a few partial rows per window and group: Arrow, in this process.
            from eventing.windows.spark.partials import merge_on_driver

            merged = merge_on_driver(
                partials_dir,
                size_ms=spec.size_ms,
                group_by=list(layout.group_by),
                aggregates=layout.aggregates,
                windows=windows,
            )
            if merged is not None:
                return merged
        from eventing.windows.spark.spark_job import merge_partials, merge_session_partials
        from eventing.windows.spark.spark_session import get_spark

        if spec.is_session:
            return merge_session_partials(
                get_spark(self.master),
                partials_dir,
                gap_ms=spec.gap_ms,
                group_by=list(layout.group_by),
                aggregates=layout.aggregates,
                sessions=windows,
            )
        return merge_partials(
            get_spark(self.master),
            partials_dir,
            size_ms=spec.size_ms,
            slide_ms=spec.slide_ms,
            group_by=list(layout.group_by),
            aggregates=layout.aggregates,
            windows=windows,
        )


def make_aggregator(master: str | None = None) -> Aggregator:
    """The aggregator new hosts use (tests replace it with a pure-Python one)."""
    return SparkAggregator(master)


class WindowHost:
    def __init__(
        self,
        state: Any,
        *,
        errors: list[str] | None = None,
        options: WindowOptions | None = None,
        aggregator: Aggregator | None = None,
    ):
        self.state = state
        self.errors = errors if errors is not None else []
        self.options = options = options or WindowOptions()
        self.close_windows = options.close_windows
        self._aggregator = aggregator
        self.coordinators: dict[str, WindowCoordinator] = {}
        self.draining: list[tuple[str, WindowCoordinator]] = []  # stopped functions still emitting windows
        self._last_poll: dict[str, float] = {}
        self._failed_functions: set[tuple[str, int]] = (
            set()
        )  # (function, generation) whose coordinator failed
        self._store: Any = None
        self._emitter: ThreadPoolExecutor | None = None

    @property
    def store(self) -> Any:
        if self._store is None:
            self._store = self.state.metadata
        return self._store

    @property
    def emitter(self) -> ThreadPoolExecutor:
        if self._emitter is None:
            self._emitter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eventing-windows-spark")
        return self._emitter

    def _coordinator(self, sup: Any) -> WindowCoordinator | None:
        name = sup.name
        existing = self.coordinators.get(name)
        if existing is not None and existing.generation == sup.record.generation:
            return existing
        if existing is not None:
            self._drop(name)
        if self._aggregator is None:
            self._aggregator = make_aggregator(self.options.spark_master)
        from eventing.windows.runtime.coordinator import WindowCoordinator

        coordinator = WindowCoordinator(
            self.state,
            name,
            sup.record.generation,
            sup.defn.window,
            self.store,
            aggregator=self._aggregator,
            emitter=self.emitter,
            close_windows=self.close_windows,
            source_bucket=sup.defn.source_bucket,
        )
        self.coordinators[name] = coordinator
        return coordinator

    def poll(self, supervisors: dict[str, Any]) -> None:
        """Poll the coordinator of every running windowed function that is due, and move the emission of
        stopped ones along."""
        now = time.monotonic()
        if self.draining:
            self._drain(wait=False)
        for name, sup in supervisors.items():
            if sup.defn.window is None or sup.error is not None:
                continue
            if now - self._last_poll.get(name, 0.0) < POLL_S:
                continue
            self._last_poll[name] = now
            self._guard(sup, lambda sup=sup: self._poll_one(sup), stopping=False)

    def _poll_one(self, sup: Any) -> None:
        coordinator = self._coordinator(sup)
        if coordinator is not None:
            coordinator.poll()

    def function_stopped(self, sup: Any) -> None:
        """The function's workers have stopped and flushed: consume their last rows, close what the semantics
        allow (at the end of input, every open window if ``close_windows`` is set) and start emitting. The
        emission finishes in the background (``poll`` keeps it going) or in ``close``: the service loop never
        waits for Spark, so it keeps pumping other functions and writing its heartbeat."""
        if sup.defn.window is None or (sup.name, sup.record.generation) in self._failed_functions:
            return
        end_of_input = bool(sup.until_caught_up and sup.done and sup.error is None)

        def finish() -> None:
            coordinator = self._coordinator(sup)
            if coordinator is not None:
                coordinator.final_poll(end_of_input=end_of_input)
                self.coordinators.pop(sup.name, None)
                self._last_poll.pop(sup.name, None)
                self.draining.append((sup.name, coordinator))

        self._guard(sup, finish, stopping=True)

    def _drain(self, *, wait: bool) -> None:
        for item in list(self.draining):
            name, coordinator = item
            try:
                done = coordinator.drain(DRAIN_TIMEOUT_S) if wait else coordinator.drain_step()
                if wait and not done:
                    self.errors.append(
                        f"{name}: windows: {len(coordinator.pending)} closed window(s) could not be emitted "
                        f"({coordinator.retries.last_error or 'timed out'}); the next `eventing run` emits "
                        "them"
                    )
            except FencedError:
                done = True  # the function runs again under a newer coordinator, which emits what is left
            except EventingError as exc:  # a full disk, a store that failed: its own one line says what to do
                log.error("function %s: windows: %s", name, exc)
                self.errors.append(_error_line(name, exc))
                done = True
            except Exception as exc:  # noqa: BLE001 - the committed state keeps the windows for the next run
                log.exception("window coordinator of function %s failed while emitting", name)
                self.errors.append(f"{name}: windows: {type(exc).__name__}: {exc}")
                done = True
            if done or wait:
                self.draining.remove(item)
                coordinator.close()

    def _guard(self, sup: Any, body: Any, *, stopping: bool) -> None:
        try:
            body()
        except EventingError as exc:
            self._failed(sup, exc, stopping)
        except Exception as exc:  # noqa: BLE001 - reported as the function's error, the service goes on
            log.exception("window coordinator of function %s failed", sup.name)
            self._failed(
                sup, EventingError(f"window coordinator failed: {type(exc).__name__}: {exc}"), stopping
            )

    def _failed(self, sup: Any, exc: EventingError, stopping: bool) -> None:
        log.error("function %s: windows: %s", sup.name, exc)
        self._failed_functions.add((sup.name, sup.record.generation))
        if not stopping and sup.error is None:
            sup.error = exc  # the service stops the function and reports the error as its own
        else:
            self.errors.append(_error_line(sup.name, exc))
        self._drop(sup.name)

    def _drop(self, name: str) -> None:
        coordinator = self.coordinators.pop(name, None)
        self._last_poll.pop(name, None)
        if coordinator is not None:
            coordinator.close()

    def close(self) -> None:
        """Wait for the stopped functions' closed windows to be emitted (the service's workers are all
        stopped by now), then release everything."""
        self._drain(wait=True)
        for name in list(self.coordinators):
            self._drop(name)
        if self._emitter is not None:
            self._emitter.shutdown(wait=True)
            self._emitter = None
        if self._store is not None:
            self._store.close()
            self._store = None


def _error_line(function: str, exc: EventingError) -> str:
    """A run's error line for a failure of a function's windows: a full disk reads as every other full disk
    does (``FN: cannot write PATH: the disk is full ...``, the path naming the window file or sink)."""
    from eventing.windows.runtime.emission import is_disk_full

    return f"{function}: {exc}" if is_disk_full(exc) else f"{function}: windows: {exc}"
