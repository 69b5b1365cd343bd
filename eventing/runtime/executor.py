"""Where worker cores run: Ray actors (the real runtime) or in-process (fast unit tests), one interface."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from eventing.errors import EventingError
from eventing.runtime.worker import WorkerCore, WorkerSpec


class WorkerDied(Exception):
    """The worker process is gone (killed, crashed); the supervisor restarts it from its checkpoints."""


class WorkerHandle(Protocol):
    def call(self, method: str, *args: Any) -> Any: ...


class Executor(Protocol):
    name: str

    def start_worker(self, spec: WorkerSpec, ray_node_id: str | None = None) -> Any: ...
    def wait(self, futures: list[Any], timeout: float) -> list[Any]: ...
    def result(self, future: Any) -> Any: ...
    def kill(self, handle: Any) -> None: ...


class WorkerHost:
    """What runs inside the worker process: builds the core lazily so start-up errors reach the caller."""

    def __init__(self, spec: WorkerSpec, own_process: bool = False):
        self.spec = spec
        self.own_process = own_process  # a Ray actor: the worker may end its process if a handler hangs
        self.core: WorkerCore | None = None

    def call(self, method: str, *args: Any) -> Any:
        if method == "respec":  # a worker started ahead of time (a standby's) learns what it serves
            assert self.core is None, "respec after start"
            self.spec = args[0]
            return None
        if method == "start":
            self.core = WorkerCore(self.spec, recycle_on_hang=self.own_process)
            return os.getpid()
        assert self.core is not None, "worker not started"
        return getattr(self.core, method)(*args)


# -- in-process ---------------------------------------------------------------------------------------


class _Done:
    __slots__ = ("value", "error")

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value, self.error = value, error


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
    """Runs worker cores in the calling process, one call at a time: deterministic and fast to start."""

    name = "in-process"

    def start_worker(self, spec: WorkerSpec, ray_node_id: str | None = None) -> _LocalHandle:
        return _LocalHandle(WorkerHost(spec))

    def wait(self, futures: list[Any], timeout: float) -> list[Any]:
        return list(futures)

    def result(self, future: _Done) -> Any:
        if future.error is not None:
            raise future.error
        return future.value

    def kill(self, handle: _LocalHandle) -> None:
        handle.dead = True
        if handle.host.core is not None:
            handle.host.core.close()


# -- Ray ----------------------------------------------------------------------------------------------


FORWARDED_ENV = (
    "EVENTING_METADATA_URL",
    "EVENTING_COUCHBASE_USERNAME",
    "EVENTING_COUCHBASE_PASSWORD",
    "EVENTING_STORE_WAIT_S",
)


def init_ray(address: str | None = None, *, num_cpus: int | None = None) -> None:
    """Start a local Ray instance, or join the cluster at `address`, once per process."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Workers must import this project the way the driver does (an editable install or a checkout).
    root = str(Path(__file__).resolve().parents[2])  # the folder holding eventing/, metadata/, sharding/
    env = {"PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    # Workers on other machines must open the same metadata store as the driver.
    for name in FORWARDED_ENV:
        if os.environ.get(name):
            env[name] = os.environ[name]
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": True,
        "logging_level": "ERROR",
        "configure_logging": True,
    }
    if address:
        kwargs["address"] = address
        kwargs["runtime_env"] = {"env_vars": env}
    elif num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    try:
        if address:
            ray.init(**kwargs)
        else:
            # A local instance's workers inherit the environment its raylet starts with. A runtime_env
            # would do the same through Ray's runtime-env agent, at ~0.4 s more per worker start.
            with _environment(env):
                ray.init(**kwargs)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        target = address or "a local Ray instance"
        raise EventingError(f"cannot start or join {target}: {exc}; check --ray-address or `ray status`") from None


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _RayHandle:
    def __init__(self, actor: Any):
        self.actor = actor

    def call(self, method: str, *args: Any) -> Any:
        return self.actor.call.remote(method, *args)


class RayExecutor:
    """Each worker is a Ray actor with num_cpus=0, so more workers than cores can run (4 on 2 cores)."""

    name = "ray"

    def __init__(self, address: str | None = None):
        import ray

        init_ray(address)
        self._ray = ray
        self._actor_cls = ray.remote(num_cpus=0, max_restarts=0)(WorkerHost)

    def start_worker(self, spec: WorkerSpec, ray_node_id: str | None = None) -> _RayHandle:
        """Start a worker actor; pinned to a Ray node when its eventing node names one."""
        options: dict[str, Any] = {}
        if ray_node_id:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=ray_node_id, soft=False)
        return _RayHandle(self._actor_cls.options(**options).remote(spec, True))

    def wait(self, futures: list[Any], timeout: float) -> list[Any]:
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
            RayActorError,
            RayTaskError,
            WorkerCrashedError,
        )

        try:
            return self._ray.get(future)
        except (RayActorError, ActorDiedError, ActorUnavailableError, WorkerCrashedError) as exc:
            raise WorkerDied(str(exc).splitlines()[0]) from None
        except RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            if isinstance(cause, EventingError):
                raise type(cause)(*cause.args) from None
            raise

    def kill(self, handle: _RayHandle) -> None:
        try:
            self._ray.kill(handle.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead is fine
            pass


def make_executor(kind: str, ray_address: str | None = None) -> Executor:
    if kind == "in-process":
        return InProcessExecutor()
    if kind == "ray":
        return RayExecutor(ray_address)
    raise EventingError(f"unknown executor {kind!r}; use 'ray' or 'in-process'")
