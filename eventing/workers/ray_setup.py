"""Set-up of a Ray worker process of a local Ray instance (a run's own, or `eventing ray start`'s), run by
Ray before the process takes its first task.

Ray builds a worker's serialization context on its first task and registers there serializers for Ray
Data and Ray Serve types of every package it finds installed: it imports pyarrow (with numpy) and
starlette (with anyio) into every worker process. That is ~40 MB of each worker's ~125 MB of RSS, and a
machine running 20 functions of 2 workers holds 40 of them. A worker imports pyarrow itself only when its
function has a window (eventing.windows.runtime.row_writer); no Arrow or Starlette object crosses a Ray
call to or from a worker (window rows go through files). So the context is built here with those two
packages hidden, and they import as usual afterwards; an Arrow object sent through Ray would still travel,
pickled by pyarrow itself instead of Ray's Arrow serializer. See docs/benchmarks.md, 'Many functions'.

Then it imports the modules a worker's start imports (``PRELOAD``, ~0.2 s of CPU, ~7 MB that every process
hosting a worker holds anyway; no numpy or pyarrow): Ray starts a new instance with one idle worker
process per CPU, and a worker actor that lands on one starts without paying for them. An instance started
for a run with a windowed function deployed (``WINDOWS_ENV``, eventing.workers.ray_session.init_ray) has
its processes import numpy and pyarrow too (``WINDOW_PRELOAD``, ~0.08 s of CPU, the ~40 MB above), which
a window worker otherwise imports at its first rows.
"""

from __future__ import annotations

import importlib
import os
import sys

# Ray's name for the environment variable naming a worker's set-up function (ray_constants); workers of a
# local instance inherit the raylet's environment, so setting it there reaches them without a runtime_env.
SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
SETUP_HOOK = "eventing.workers.ray_setup.worker_process_setup"
NOT_FOR_SERIALIZATION = ("pyarrow", "starlette")
PRELOAD = ("eventing.workers.hosting", "eventing.workers.worker")
WINDOWS_ENV = "EVENTING_RAY_WINDOW_WORKERS"  # "1": the instance runs a windowed function's workers
WINDOW_PRELOAD = ("numpy", "pyarrow")


def worker_process_setup() -> None:
    """Build this worker's Ray serialization context with pyarrow and starlette hidden, then import what a
    worker's start needs; never raises (a set-up that fails would end the worker)."""
    hidden = [name for name in NOT_FOR_SERIALIZATION if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # `import name` raises ModuleNotFoundError
    try:
        import ray._private.worker as ray_worker

        ray_worker.global_worker.get_serialization_context()
    except Exception:  # noqa: BLE001 - Ray builds the context itself on the first task, as without this
        pass
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
    preload()


def preload() -> None:
    """Import ``PRELOAD`` (and ``WINDOW_PRELOAD`` where ``WINDOWS_ENV`` is "1"); never raises: a module that
    cannot be imported (a node without one of the project's dependencies) is left to the worker's start,
    which names it in one line."""
    names = PRELOAD + (WINDOW_PRELOAD if os.environ.get(WINDOWS_ENV) == "1" else ())
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - WorkerHost.call("start") imports it again and says what is missing
            return
