"""What runs inside a worker's process: `WorkerHost` builds the worker core (or its sandboxed stand-in) and
answers calls on it; `PooledWorkerHost` is one kept up between runs by a kept Ray instance. Also the answer
of an in-process call (`_Done`) and the line for a node that lacks one of the project's packages."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from eventing.errors import EventingError

if TYPE_CHECKING:
    from eventing.workers.worker import WorkerCore, WorkerSpec


# What the service asks of a worker's core (a WorkerCore, or a SandboxedCore that forwards these to its
# child), by name, and the method each calls; nothing else is served.
CORE_CALLS: dict[str, Callable[[Any], Callable[..., Any]]] = {
    "step": lambda core: core.step,
    "stop": lambda core: core.stop,
    "assign_vbuckets": lambda core: core.assign_vbuckets,
    "revoke_vbuckets": lambda core: core.revoke_vbuckets,
    "owned": lambda core: core.owned,
    "flush_effects": lambda core: core.flush_effects,  # a sandboxed child's, when a step's tail failed
    "close": lambda core: core.close,
}


class WorkerHost:
    """What runs inside the worker process: builds the core lazily so start-up errors reach the caller.

    On Ray the spec arrives pickled and the worker modules are imported in ``start``: a node that lacks
    one of the project's dependencies then answers ``start`` with one line naming it, where an import
    while Ray builds the actor would only kill the actor with a page of traceback."""

    def __init__(self, spec: WorkerSpec | bytes, own_process: bool = False, shared: bool = False):
        self.spec = spec
        self.own_process = own_process  # a Ray actor: the worker may end its process if a handler hangs
        # One of several functions' cores in a shared process (eventing.workers.shared_host): a sandboxed
        # core's child that ends fails this core alone instead of ending the process.
        self.shared = shared
        self.core: WorkerCore | None = None

    def call(self, method: str, *args: Any) -> Any:
        if method == "respec":  # a worker started ahead of time (a standby's) learns what it serves
            assert self.core is None, "respec after start"
            self.spec = args[0]
            return None
        if method == "start":
            try:
                import pickle

                from eventing.workers.worker import WorkerCore

                if isinstance(self.spec, bytes):
                    self.spec = pickle.loads(self.spec)
            except ImportError as exc:
                raise missing_dependency(f"No module named '{exc.name}'") or EventingError(str(exc)) from None
            assert not isinstance(self.spec, bytes)
            record = None
            if self.spec.isolation == "sandbox":
                record = _codeless_record(self.spec)
                if record is None:
                    from eventing.workers.sandbox.host import SandboxedCore

                    self.core = SandboxedCore(  # type: ignore[assignment]
                        self.spec, own_process=self.own_process and not self.shared
                    )
                    return os.getpid()
            # A codeless handler's worker runs the very record checked (a source saved since runs sandboxed
            # when the worker starts again).
            self.core = WorkerCore(self.spec, recycle_on_hang=self.own_process, record=record)
            return os.getpid()
        assert self.core is not None, "worker not started"
        served = CORE_CALLS.get(method)
        if served is None:
            raise EventingError(f"{method!r} is not a call a worker serves")
        return served(self.core)(*args)


def _codeless_record(spec: WorkerSpec) -> Any:
    """The function's record when its handler has no code for a sandbox to confine, else None. A handler
    without any (a window-only function's docstring: eventing.execution.static_check.runs_no_code) runs
    nothing of its author's, so its worker runs here, without the sandbox's child and its cost a mutation
    (reading for it, decoding there, the rows coming back): the window rows are the worker's own work."""
    from eventing.core.definition import FunctionDefinition
    from eventing.execution.static_check import runs_no_code

    store = spec.data_access().metadata()
    try:
        record = store.get_function(spec.function)
    finally:
        store.close()
    language = FunctionDefinition.from_dict(record.definition).language
    return record if runs_no_code(record.source, language) else None


class PooledWorkerHost(WorkerHost):
    """A worker process kept up between runs by a kept Ray instance (`eventing ray start`). A run adopts it
    (a new spec, a fresh core) instead of starting a process (~1 s: Python, Ray and the project's imports)
    and gives it back after a clean stop; a worker that died, hung or was killed is simply gone. One run at
    a time: `adopt` refuses while another run's calls are recent (a run whose driver died stops calling)."""

    def __init__(self) -> None:
        super().__init__(b"", own_process=True)
        self.owner: str | None = None
        self.last_call = 0.0

    def adopt(self, owner: str, spec: bytes) -> bool:
        if self.owner not in (None, owner) and time.monotonic() - self.last_call < POOL_STALE_S:
            return False
        self._drop_core()
        self.owner, self.spec, self.last_call = owner, spec, time.monotonic()
        return True

    def ready(self) -> int:
        """Import the worker's modules now, so a run that adopts this process does not wait for them."""
        import eventing.workers.worker  # noqa: F401

        return os.getpid()

    def release(self, owner: str) -> None:
        if self.owner == owner:
            self._drop_core()
            self.owner = None

    def call(self, method: str, *args: Any) -> Any:
        self.last_call = time.monotonic()
        return super().call(method, *args)

    def _drop_core(self) -> None:
        core, self.core = self.core, None
        if core is not None:
            try:
                core.close()
            except Exception:  # noqa: BLE001 - a core that cannot close cleanly is dropped all the same
                pass


POOL_NAMESPACE = "eventing"  # the namespace a run joining a kept instance uses: its pooled workers' names
POOL_PREFIX = "eventing-worker-"
POOL_STALE_S = 30.0  # a pooled worker whose run has not called for this long may be adopted by another


class _Done:
    __slots__ = ("value", "error", "sender")

    def __init__(self, value: Any = None, error: BaseException | None = None, sender: Any = None):
        self.value, self.error = value, error
        self.sender = sender  # the shared host that answered, if any (eventing.workers.shared_host)


_MISSING_MODULE = re.compile(r"No module named '([^']+)'")


def missing_dependency(text: str) -> EventingError | None:
    """A worker that died importing a package its node lacks, as one line naming the package and the fix."""
    found = _MISSING_MODULE.search(text)
    if found is None:
        return None
    name = found.group(1).split(".")[0]
    return EventingError(
        f"a Ray node cannot run eventing workers: Python package '{name}' is not installed there; install "
        "the project's dependencies on every node (`pip install ray msgpack msgspec pyarrow ...`, as in "
        f"pyproject.toml) with the same Python version, then run again"
    )
