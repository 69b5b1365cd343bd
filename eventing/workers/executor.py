"""Where worker cores run: Ray actors (the real runtime) or in-process (fast unit tests), one interface."""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Any, Protocol

from eventing.errors import EventingError
from eventing.workers.hosting import (  # noqa: F401 - POOL_*, PooledWorkerHost, missing_dependency: their old home
    POOL_NAMESPACE,
    POOL_PREFIX,
    POOL_STALE_S,
    PooledWorkerHost,
    WorkerHost,
    _Done,
    missing_dependency,
)
from eventing.workers.ray_session import (  # noqa: F401 - as importable from here as they always were
    FORWARDED_ENV,
    INLINE_LIMIT_ENV,
    INLINE_REPLY_BYTES,
    POOL_ADOPT_TIMEOUT_S,
    check_ray_address,
    fill_pool,
    init_ray,
    light_worker_env,
    project_modules,
)
from eventing.workers.worker_died import WorkerDied

if TYPE_CHECKING:
    from eventing.storage.state import State
    from eventing.workers.worker import WorkerSpec


class WorkerHandle(Protocol):
    def call(self, method: str, *args: Any) -> Any: ...


class Executor(Protocol):
    """What the service and its supervisors call on the place where workers run."""

    name: str
    # The data service serving the data directory to workers on other nodes, once serve() started one
    # (None: workers open the files themselves); a worker's spec carries it.
    data_service: Any
    # SharedHosts when the workers of several functions share processes (eventing.workers.shared_host),
    # else None: each worker is a process of its own (Ray) or a core in this process (in-process).
    shared: Any

    def start_worker(self, spec: WorkerSpec, ray_node_id: str | None = None) -> Any: ...
    def wait(self, futures: list[Any], timeout: float) -> list[Any]: ...
    def result(self, future: Any) -> Any: ...
    def kill(self, handle: Any) -> None: ...
    def release(self, handle: Any) -> None:
        """A worker that stopped cleanly (checkpointed, vBuckets released) is done with: kept for a later
        run where the executor keeps workers, else ended."""

    def check_placements(self, placements: dict[str, str | None]) -> None:
        """Refuse (EventingError) eventing nodes pinned to a place this executor cannot start workers on."""

    def serve(self, state: State) -> None:
        """Start what workers elsewhere need to reach `state` (the data service), if anything; idempotent."""

    def close(self) -> None:
        """Stop what serve() started; idempotent."""


# -- in-process ---------------------------------------------------------------------------------------


class _LocalHandle:
    def __init__(self, host: WorkerHost):
        self.host = host
        self.dead = False

    def call(self, method: str, *args: Any) -> _Done:
        if self.dead:
            return _Done(error=WorkerDied("worker was killed"))
        try:
            return _Done(self.host.call(method, *args))
        except Exception as exc:  # noqa: BLE001 - delivered to the caller through result()
            return _Done(error=exc)


class InProcessExecutor:
    """Runs worker cores in the calling process, one call at a time: deterministic and fast to start.
    ``worker_processes``: place the cores in that many shared hosts, as RayExecutor does, each an object
    standing in for a process (tests of eventing.workers.shared_host's bookkeeping)."""

    name = "in-process"
    data_service: Any = None  # every worker sees the data directory: no data service
    shared: Any = None  # SharedHosts when workers share (stand-in) processes

    def __init__(self, worker_processes: int = 0):
        if worker_processes:
            from eventing.workers.shared_host import LocalHostBackend, SharedHosts

            self.shared = SharedHosts(worker_processes, LocalHostBackend())

    def start_worker(self, spec: WorkerSpec, ray_node_id: str | None = None) -> Any:
        if self.shared is not None:
            return self.shared.start_worker(spec, spec, ray_node_id)
        return _LocalHandle(WorkerHost(spec))

    def wait(self, futures: list[Any], timeout: float) -> list[Any]:
        return list(futures)

    def result(self, future: _Done) -> Any:
        if future.error is not None:
            raise future.error
        return future.value

    def kill(self, handle: Any) -> None:
        if self.shared is not None:
            self.shared.kill(handle)
            return
        handle.dead = True
        if handle.host.core is not None:
            handle.host.core.close()

    def release(self, handle: Any) -> None:
        """No pool to go back to: a worker that stopped cleanly is ended as kill() ends it."""
        self.kill(handle)

    def check_placements(self, placements: dict[str, str | None]) -> None:
        """Every worker runs in this process, wherever its node is pinned."""

    def serve(self, state: State) -> None:
        """Workers in this process open the data directory themselves."""

    def close(self) -> None:
        """serve() started nothing."""


# -- Ray ----------------------------------------------------------------------------------------------


class _RayHandle:
    def __init__(self, actor: Any):
        self.actor = actor
        self.pool_name = ""  # set for a worker of a kept instance's pool

    def call(self, method: str, *args: Any) -> Any:
        return self.actor.call.remote(method, *args)


class RayExecutor:
    """Each worker is a Ray actor with num_cpus=0, so more workers than cores can run (4 on 2 cores).
    With ``worker_processes`` N (default: $EVENTING_WORKER_PROCESSES, else 0), the workers of every function
    share at most N actors per Ray node instead (eventing.workers.shared_host)."""

    name = "ray"
    shared: Any = None  # SharedHosts when workers share processes

    def __init__(
        self,
        address: str | None = None,
        *,
        join_local: str | None = None,
        worker_processes: int | None = None,
        windows: bool = False,
    ):
        import ray

        from eventing.workers.shared_host import worker_processes_setting

        processes = worker_processes_setting(worker_processes)  # a bad value fails before Ray starts
        init_ray(address, join_local=join_local, windows=windows)
        self.joined = join_local  # the `eventing ray start` instance joined, if any
        self._ray = ray
        self._actor_cls = ray.remote(num_cpus=0, max_restarts=0)(WorkerHost)
        # On a kept instance, workers come from (and go back to) its pool of worker processes.
        self._pool_cls = ray.remote(num_cpus=0, max_restarts=0)(PooledWorkerHost) if join_local else None
        self._owner = uuid.uuid4().hex
        self._adopted: set[str] = set()
        self.address = address
        self.data_service: Any = None  # DataServiceRef once serve() ran
        if processes:
            from eventing.workers.shared_host import RayHostBackend, SharedHosts

            self.shared = SharedHosts(processes, RayHostBackend(ray))

    def serve(self, state: State) -> None:
        """On a cluster (``--ray-address``, or ``EVENTING_DATA_SERVICE=1``), start the data service on this
        node so workers on other nodes reach the data directory through it. A local instance has no
        other node: its workers open the files, as without a service. A state on a server needs none:
        every worker connects to the server itself."""
        if self.data_service is not None or state.directory is None:
            return
        if not (self.address or os.environ.get("EVENTING_DATA_SERVICE") == "1"):
            return
        from eventing.workers.data_service import start_data_service

        self.data_service = start_data_service(state.location)

    def close(self) -> None:
        from eventing.workers.data_service import stop_data_service

        stop_data_service(self.data_service)
        self.data_service = None

    def shutdown(self) -> None:
        """Leave Ray (end a run's own instance) now: ~0.3 s, where Ray's exit hook takes ~0.8 s."""
        self._ray.shutdown()

    def check_placements(self, placements: dict[str, str | None]) -> None:
        """Every Ray node id an eventing node is pinned to must be one this cluster knows."""
        pinned = {name: rid for name, rid in placements.items() if rid}
        if not pinned:
            return
        known = {n["NodeID"]: n for n in self._ray.nodes()}
        for name, rid in pinned.items():
            if rid not in known:
                alive = ", ".join(
                    f"{nid[:12]}… ({n.get('NodeManagerAddress')})"
                    for nid, n in known.items()
                    if n.get("Alive")
                )
                raise EventingError(
                    f"eventing node '{name}' is pinned to Ray node {rid!r}, which is not in this Ray cluster "
                    f"(alive: {alive or 'none'}); see `ray list nodes`, then `eventing node remove {name}` "
                    f"and `eventing node add {name} --ray-node-id <id>`"
                )

    def start_worker(self, spec: WorkerSpec, ray_node_id: str | None = None) -> Any:
        """Start a worker actor; pinned to a Ray node when its eventing node names one."""
        if self.shared is not None:
            from ray import cloudpickle

            return self.shared.start_worker(spec, cloudpickle.dumps(spec), ray_node_id)
        if self._pool_cls is not None and not ray_node_id:
            return self._pooled_worker(spec)
        options: dict[str, Any] = {}
        if ray_node_id:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=ray_node_id, soft=False)
        from ray import cloudpickle

        return _RayHandle(self._actor_cls.options(**options).remote(cloudpickle.dumps(spec), True))

    def wait(self, futures: list[Any], timeout: float) -> list[Any]:
        if self.shared is not None:
            self.shared.check()  # a host that does not answer a drop is ended
        if not futures:
            return []
        # Back as soon as one call is done (and with every other one done by then): the supervisor refills
        # that worker's credit at once instead of after the whole timeout, so a busy worker never idles.
        ready, rest = self._ray.wait(futures, num_returns=1, timeout=timeout)
        if ready and rest:
            more, _ = self._ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        return ready

    def result(self, future: Any) -> Any:
        from ray.exceptions import (
            ActorDiedError,
            ActorUnavailableError,
            ActorUnschedulableError,
            RayActorError,
            RayTaskError,
            WorkerCrashedError,
        )

        try:
            return self._ray.get(future)
        except (
            RayActorError,
            ActorDiedError,
            ActorUnavailableError,
            ActorUnschedulableError,  # pinned to a node that is dead: the worker is, until failover moves it
            WorkerCrashedError,
        ) as exc:
            missing = missing_dependency(str(exc))
            if missing is not None:
                raise missing from None
            if self.shared is not None:
                self.shared.died(future)  # every core of that process is gone: none is placed there again
            raise WorkerDied(str(exc).splitlines()[0]) from None
        except RayTaskError as exc:
            original = getattr(exc, "cause", None)
            if isinstance(original, EventingError):
                raise original from None  # the worker's own error: its one line, its way out, its fields
            cause = exc.as_instanceof_cause()
            if isinstance(cause, EventingError):
                raise _again(cause) from None
            if isinstance(
                original, WorkerDied
            ):  # one core of a shared process (its sandbox ended, or dropped)
                raise WorkerDied(str(original)) from None
            missing = missing_dependency(str(exc)) if isinstance(cause, ImportError) else None
            if missing is not None:
                raise missing from None
            raise

    def kill(self, handle: Any) -> None:
        if self.shared is not None:
            self.shared.kill(handle)
            return
        try:
            self._ray.kill(handle.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead is fine
            pass
        self._adopted.discard(getattr(handle, "pool_name", ""))

    def release(self, handle: Any) -> None:
        """A worker that stopped cleanly: back to the kept instance's pool, else ended (a shared process
        ends with its last worker)."""
        if self.shared is not None:
            self.shared.release(handle)
            return
        name = getattr(handle, "pool_name", "")
        if not name:
            self.kill(handle)
            return
        try:  # waited for: a release still in flight when the driver exits would keep it from the next run
            self._ray.get(handle.actor.release.remote(self._owner), timeout=POOL_ADOPT_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a pooled worker that cannot release is ended instead
            self.kill(handle)
        self._adopted.discard(name)

    def _pooled_worker(self, spec: WorkerSpec) -> _RayHandle:
        """A free worker process of the kept instance's pool, adopted for `spec`; a new pooled one if none is
        free (it stays in the pool after this run). Calls to an actor run in order, so `start` follows."""
        from ray import cloudpickle

        blob = cloudpickle.dumps(spec)
        names = sorted(n for n in self._ray.util.list_named_actors() if n.startswith(POOL_PREFIX))
        for name in names:
            if name in self._adopted:
                continue
            try:
                actor = self._ray.get_actor(name, namespace=POOL_NAMESPACE)
                if not self._ray.get(actor.adopt.remote(self._owner, blob), timeout=POOL_ADOPT_TIMEOUT_S):
                    continue
            except Exception:  # noqa: BLE001 - a pooled worker that died or does not answer is skipped
                continue
            return self._pooled_handle(actor, name)
        taken = set(names) | self._adopted
        name = next(f"{POOL_PREFIX}{i}" for i in range(len(taken) + 1) if f"{POOL_PREFIX}{i}" not in taken)
        fresh: Any = self._pool_cls.options(  # type: ignore[union-attr]
            name=name, namespace=POOL_NAMESPACE, lifetime="detached"
        ).remote()
        fresh.adopt.remote(self._owner, blob)
        return self._pooled_handle(fresh, name)

    def _pooled_handle(self, actor: Any, name: str) -> _RayHandle:
        self._adopted.add(name)
        handle = _RayHandle(actor)
        handle.pool_name = name
        return handle


def make_executor(
    kind: str,
    ray_address: str | None = None,
    state: State | None = None,
    *,
    worker_processes: int | None = None,
) -> Executor:
    """``ray`` without an address joins the state's `eventing ray start` instance when it is up
    (~0.1 s), else starts a Ray instance of its own for the run (~2.5 s). ``worker_processes``: the
    functions' workers share that many Ray worker processes (None: $EVENTING_WORKER_PROCESSES, else one
    process per worker); the in-process executor has one process whatever it is."""
    if kind == "in-process":
        return InProcessExecutor()
    if kind == "ray":
        if not ray_address and state is not None:
            from eventing.workers.ray_instance import running

            instance = running(state.runtime_dir())
            if instance is not None:
                return RayExecutor(join_local=instance.address, worker_processes=worker_processes)
        windows = state is not None and windows_deployed(state)
        return RayExecutor(ray_address, worker_processes=worker_processes, windows=windows)
    raise EventingError(f"unknown executor {kind!r}; use 'ray' or 'in-process'")


def windows_deployed(state: State) -> bool:
    """Whether a function with a window is deployed: then a new local Ray instance's idle worker processes
    import numpy and pyarrow while it starts (eventing.workers.ray_setup), instead of each window worker at
    its first rows."""
    return any(
        record.definition.get("window") and record.state.value != "undeployed"
        for record in state.metadata.list_functions()
    )


def _again(error: BaseException) -> BaseException:
    """An error that crossed from a Ray actor, raised again as its own class (its way out kept)."""
    again = type(error)(*error.args)
    again.fix = getattr(error, "fix", None)  # type: ignore[attr-defined]
    return again
