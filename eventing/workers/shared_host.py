"""Worker processes shared by several functions (`eventing run --worker-processes N`).

By default each worker is a process of its own (a Ray actor per `WorkerCore`). With N worker processes set,
each process is a `SharedWorkerHost` holding the cores of several functions by core id, and the service's
supervisors get one `SharedHandle` per core, which they call as they call a worker of its own: calls to one
host run one at a time in the order sent (a synchronous actor), so steps of different functions take turns
first-come first-served, at most CREDITS per core (eventing.control.supervisor).

`SharedHosts` is the driver's bookkeeping: which host holds which core, where a new core goes (the live host
of its Ray node holding the fewest, a new one while fewer than N are up), and what a death, a kill and a
release do:

- a host that dies (kill -9, a segfault, the hang guard ending it) fails every call of every core it held
  with WorkerDied, so each supervisor restarts its cores from their checkpoints, in another host;
- killing or releasing one core drops only that core (its calls already sent still run first); the host
  ends with its last core;
- a host that has not answered a drop within DROP_TIMEOUT_S is unresponsive and is ended.

See docs/benchmarks.md, "Many functions on one machine", for what sharing costs and what it keeps.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any, Protocol

from eventing.workers.hosting import WorkerHost, _Done
from eventing.workers.worker_died import WorkerDied

# A drop waits behind the calls already queued on its host: up to CREDITS steps of every core there, each
# a slice of ~0.1 s or one handler call of up to execution_timeout (60 s by default), which the hang guard
# ends 2 s past it. A host still silent after this long is stuck outside a handler: it is ended.
DROP_TIMEOUT_S = 90.0
ENV = "EVENTING_WORKER_PROCESSES"


def worker_processes_setting(value: int | str | None = None) -> int:
    """How many shared worker processes a run uses: `value` if given, else $EVENTING_WORKER_PROCESSES;
    0 (the default) gives each worker a process of its own."""
    from eventing.errors import ConfigError

    raw = os.environ.get(ENV, "") if value is None else value
    if raw in ("", None):
        return 0
    try:
        count = int(raw)
    except ValueError:
        raise ConfigError(f"{ENV}={raw!r} is not a number of worker processes (0: one per worker)") from None
    if count < 0:
        raise ConfigError(f"worker processes must be 0 (one per worker) or more, not {count}")
    return count


class CoreGone(WorkerDied):
    """A call to a core its host no longer holds (dropped by kill or release): the worker is gone."""


class SharedWorkerHost:
    """What runs inside one shared worker process: a WorkerHost per core, by core id."""

    def __init__(self, own_process: bool = True):
        # own_process: a Ray actor. Its cores' hang guards may end it (every core here then restarts from its
        # checkpoints); a sandboxed core's child that ends fails that core alone.
        self.own_process = own_process
        self.cores: dict[str, WorkerHost] = {}

    def add(self, core_id: str, spec: Any) -> int:
        self.cores[core_id] = WorkerHost(spec, own_process=self.own_process, shared=True)
        return os.getpid()

    def call(self, core_id: str, method: str, *args: Any) -> Any:
        host = self.cores.get(core_id)
        if host is None:
            raise CoreGone(f"worker {core_id} is no longer held by its process")
        return host.call(method, *args)

    def drop(self, core_id: str) -> int:
        """End one core (its hang guard's thread, its sandbox, its files); returns how many are left."""
        host = self.cores.pop(core_id, None)
        if host is not None and host.core is not None:
            try:
                host.core.close()
            except Exception:  # noqa: BLE001 - a core that cannot close cleanly is dropped all the same
                pass
        return len(self.cores)

    def held(self) -> list[str]:
        return sorted(self.cores)

    def pid(self) -> int:
        return os.getpid()


class HostBackend(Protocol):
    """How SharedHosts reaches its hosts: Ray actors, or objects in this process (tests)."""

    def start_host(self, node: str | None) -> Any: ...
    def send(self, actor: Any, method: str, *args: Any) -> Any: ...
    def end_host(self, actor: Any) -> None: ...
    def finished(self, futures: list[Any]) -> list[Any]: ...
    def sender(self, future: Any) -> Any:
        """An identity of the host a future's call went to (compared with `identity`), or None."""

    def identity(self, actor: Any) -> Any: ...


class _Host:
    __slots__ = ("actor", "node", "cores", "dead", "drops", "ident")

    def __init__(self, actor: Any, node: str | None, ident: Any):
        self.actor = actor
        self.node = node
        self.ident = ident
        self.cores: set[str] = set()
        self.dead = False
        self.drops: list[tuple[Any, float]] = []  # (future of a drop, when it is overdue)


class SharedHandle:
    """One core in a shared host: what a supervisor holds for a worker."""

    __slots__ = ("hosts", "host", "core_id")

    def __init__(self, hosts: SharedHosts, host: _Host, core_id: str):
        self.hosts, self.host, self.core_id = hosts, host, core_id

    def call(self, method: str, *args: Any) -> Any:
        return self.hosts.backend.send(self.host.actor, "call", self.core_id, method, *args)


class SharedHosts:
    """The driver's side: places cores on at most `processes` live hosts per Ray node (None: unpinned)."""

    def __init__(self, processes: int, backend: HostBackend):
        assert processes > 0
        self.processes = processes
        self.backend = backend
        self.hosts: list[_Host] = []  # live ones, in the order started
        self._serial = itertools.count()
        self.started = 0  # hosts started so far (a restart after a death starts one more)

    def start_worker(self, spec: Any, payload: Any, node: str | None = None) -> SharedHandle:
        self.check()
        live = [h for h in self.hosts if h.node == node]
        if len(live) < self.processes:
            actor = self.backend.start_host(node)
            host = _Host(actor, node, self.backend.identity(actor))
            self.hosts.append(host)
            self.started += 1
        else:
            host = min(live, key=lambda h: len(h.cores))  # the first of the least loaded: a function's
            # workers land on different hosts while there are as many hosts as it has workers
        core_id = f"{spec.function}/{spec.worker_id}/{next(self._serial)}"
        host.cores.add(core_id)
        self.backend.send(host.actor, "add", core_id, payload)  # runs before any call of the core (in order)
        return SharedHandle(self, host, core_id)

    def kill(self, handle: SharedHandle) -> None:
        """End one core: dropped from its live host, the host ended with its last core."""
        host = handle.host
        if handle.core_id not in host.cores:
            return
        host.cores.discard(handle.core_id)
        if host.dead:
            return
        if not host.cores:
            self._end(host)
            return
        host.drops.append(
            (self.backend.send(host.actor, "drop", handle.core_id), time.monotonic() + DROP_TIMEOUT_S)
        )

    release = kill  # a core that stopped cleanly goes as a killed one: no pool of shared hosts to return to

    def died(self, future: Any) -> None:
        """A call failed because its host's process is gone: every core there is gone with it."""
        ident = self.backend.sender(future)
        for host in self.hosts:
            if ident is not None and host.ident == ident:
                self._end(host)
                return

    def end(self, host: _Host) -> None:
        """End one host (tests: its process crashing); its cores' calls fail with WorkerDied."""
        self._end(host)

    def check(self) -> None:
        """End the hosts that left a drop unanswered for DROP_TIMEOUT_S; forget answered drops."""
        pending = [f for h in self.hosts for f, _ in h.drops]
        if not pending:
            return
        done = {id(f) for f in self.backend.finished(pending)}
        now = time.monotonic()
        for host in list(self.hosts):
            host.drops = [(f, due) for f, due in host.drops if id(f) not in done]
            if any(now >= due for _, due in host.drops):
                self._end(host)

    def _end(self, host: _Host) -> None:
        host.dead = True
        host.drops = []
        if host in self.hosts:
            self.hosts.remove(host)
        try:
            self.backend.end_host(host.actor)
        except Exception:  # noqa: BLE001 - already gone is fine
            pass


# -- backends -----------------------------------------------------------------------------------------


class RayHostBackend:
    """Shared hosts as Ray actors (num_cpus=0, as a worker of its own), pinned to a Ray node if named."""

    def __init__(self, ray: Any):
        self._ray = ray
        self._cls = ray.remote(num_cpus=0, max_restarts=0)(SharedWorkerHost)

    def start_host(self, node: str | None) -> Any:
        options: dict[str, Any] = {}
        if node:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        return self._cls.options(**options).remote(True)

    def send(self, actor: Any, method: str, *args: Any) -> Any:
        return getattr(actor, method).remote(*args)

    def end_host(self, actor: Any) -> None:
        self._ray.kill(actor, no_restart=True)

    def finished(self, futures: list[Any]) -> list[Any]:
        done, _ = self._ray.wait(futures, num_returns=len(futures), timeout=0)
        return done

    def sender(self, future: Any) -> Any:
        try:
            return future.task_id().actor_id()
        except Exception:  # noqa: BLE001 - not an actor call's future
            return None

    def identity(self, actor: Any) -> Any:
        return actor._actor_id


class _LocalHost:
    """A shared host in this process, standing in for a process (tests): `dead` once 'crashed'."""

    def __init__(self) -> None:
        self.host = SharedWorkerHost(own_process=False)
        self.dead = False


class LocalHostBackend:
    """Shared hosts as objects in this process: each call runs at once and returns a _Done."""

    def start_host(self, node: str | None) -> _LocalHost:
        return _LocalHost()

    def send(self, actor: _LocalHost, method: str, *args: Any) -> _Done:
        if actor.dead:
            return _Done(error=WorkerDied("the worker process ended"), sender=actor)
        try:
            return _Done(getattr(actor.host, method)(*args), sender=actor)
        except Exception as exc:  # noqa: BLE001 - delivered to the caller through result()
            return _Done(error=exc, sender=actor)

    def end_host(self, actor: _LocalHost) -> None:
        if actor.dead:
            return
        actor.dead = True
        for core_id in list(actor.host.cores):
            actor.host.drop(core_id)

    def finished(self, futures: list[Any]) -> list[Any]:
        return list(futures)

    def sender(self, future: Any) -> Any:
        return getattr(future, "sender", None)

    def identity(self, actor: Any) -> Any:
        return actor
