"""The data service on Ray: a few actors pinned to the node that holds the data directory (the driver's),
each a ``eventing.storage.remote.DataService`` over the same files.

Several actors, not one: each read is a SQLite scan plus a msgpack pack (~1.5 us a mutation), and one
process would serialise the reads of every remote worker. Ray restarts a dead actor (it reopens the
files, holding nothing else) and retries the calls that were in flight: ``max_restarts=-1`` and
``max_task_retries=-1``; every call is idempotent (see eventing.storage.remote).
"""

from __future__ import annotations

import os
from typing import Any

from eventing.errors import ConfigError, EventingError
from eventing.storage.remote import DataService, DataServiceRef
from eventing.storage.state import AppLogWriter, StateLike

ACTORS_ENV = "EVENTING_DATA_SERVICE_ACTORS"
DEFAULT_ACTORS = 2
START_TIMEOUT_S = 60.0


class ServedData(DataService):
    """The data service as it runs in its actors: also the application logs of remote workers (they
    cannot write ``<data-dir>/logs/<function>.log`` themselves)."""

    def __init__(self, state: StateLike):
        super().__init__(state)
        self._logs: dict[str, AppLogWriter] = {}
        self._limits: dict[str, tuple[int, int]] = {}
        self.calls["app_log"] = self.do_app_log

    def do_app_log(self, function: str, lines: list[str], max_size: int, max_files: int) -> int:
        """Append a batch of stamped lines to the function's application log (rotated as a local writer
        rotates it; safe beside other writers of the same file). A repeated call writes the lines again:
        the log is a diagnostic, not an effect."""
        if not function or "/" in function or function.startswith("."):
            raise ConfigError(f"{function!r} is not a function name")
        writer = self._logs.get(function)
        if writer is None or self._limits.get(function) != (max_size, max_files):
            if writer is not None:
                writer.close()
            writer = self._logs[function] = self.state.app_logs.writer(function, max_size, max_files)
            self._limits[function] = (max_size, max_files)
        writer.write_lines(lines)
        return len(lines)

    def close(self) -> None:
        for writer in self._logs.values():
            writer.close()
        self._logs.clear()
        super().close()


def start_data_service(data_dir: str, *, actors: int | None = None, wait: bool = False) -> DataServiceRef:
    """Start the data-service actors on this process's Ray node and return their handle.

    They start in the background (a worker's first call waits for them); ``wait`` blocks until they answer."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    count = actors or int(os.environ.get(ACTORS_ENV, DEFAULT_ACTORS))
    node_id = ray.get_runtime_context().get_node_id()
    cls = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(ServedData)
    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    handles = [
        cls.options(scheduling_strategy=strategy).remote(os.path.abspath(data_dir)) for _ in range(count)
    ]
    ref = DataServiceRef(handles, node_id, os.path.abspath(data_dir))
    if wait:
        ping(ref)
    return ref


def ping(ref: DataServiceRef, timeout: float = START_TIMEOUT_S) -> list[dict[str, Any]]:
    """Every actor's answer (pid, data dir); EventingError naming the data service if they do not answer."""
    import ray

    try:
        return ray.get([a.call.remote("ping") for a in ref.actors], timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - any failure here means the service is not up
        raise EventingError(
            f"the data service for {ref.data_dir} did not start on Ray node {ref.node_id[:12]}… "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); check `ray status` and "
            "the Ray logs of that node"
        ) from None


def stop_data_service(ref: DataServiceRef | None) -> None:
    if ref is None:
        return
    import ray

    for actor in ref.actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone is fine
            pass
