"""The set-up of a local Ray instance's worker processes (eventing.workers.ray_setup): Ray's serialization
context is built while pyarrow and starlette are hidden, and both import as usual afterwards."""

from __future__ import annotations

import json
import subprocess
import sys

from eventing.workers.executor import light_worker_env
from eventing.workers.ray_setup import SETUP_HOOK, SETUP_HOOK_ENV, WINDOWS_ENV, worker_process_setup

# Run in a fresh interpreter: the test process may have imported pyarrow already.
PROBE = r"""
import json, sys, types
import ray._private.worker as ray_worker
from eventing.workers.ray_setup import worker_process_setup

seen = {}

class FakeWorker:
    def get_serialization_context(self):
        for name in ("pyarrow", "starlette"):
            try:
                __import__(name)
                seen[name] = "imported"
            except ModuleNotFoundError:
                seen[name] = "hidden"

ray_worker.global_worker = FakeWorker()
worker_process_setup()
after = {name: name in sys.modules for name in ("pyarrow", "starlette")}
import pyarrow
table = pyarrow.table({"a": [1, 2, 3]})
print(json.dumps({"during": seen, "after": after, "sum": pyarrow.compute.sum(table["a"]).as_py()}))
"""


def test_the_context_is_built_without_pyarrow_and_starlette_which_import_afterwards():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["during"] == {"pyarrow": "hidden", "starlette": "hidden"}
    assert result["after"] == {"pyarrow": False, "starlette": False}  # nothing left behind in sys.modules
    assert result["sum"] == 6


def test_a_failing_context_build_is_swallowed_and_modules_restored(monkeypatch):
    import ray._private.worker as ray_worker

    class Broken:
        def get_serialization_context(self):
            raise RuntimeError("not connected")

    monkeypatch.setattr(ray_worker, "global_worker", Broken())
    before = {name: sys.modules.get(name) for name in ("pyarrow", "starlette")}
    worker_process_setup()  # never raises: a raising set-up would end the worker
    assert {name: sys.modules.get(name) for name in ("pyarrow", "starlette")} == before


def test_light_worker_env_names_the_hook_unless_turned_off_or_another_hook_is_set(monkeypatch):
    monkeypatch.delenv("EVENTING_RAY_LIGHT_WORKERS", raising=False)
    monkeypatch.delenv(SETUP_HOOK_ENV, raising=False)
    assert light_worker_env() == {SETUP_HOOK_ENV: SETUP_HOOK}
    monkeypatch.setenv("EVENTING_RAY_LIGHT_WORKERS", "0")
    assert light_worker_env() == {}
    monkeypatch.delenv("EVENTING_RAY_LIGHT_WORKERS")
    monkeypatch.setenv(SETUP_HOOK_ENV, "my.own.hook")
    assert light_worker_env() == {}
    assert light_worker_env(windows=True) == {}


def test_light_worker_env_of_a_run_with_windows_has_the_workers_import_numpy_and_pyarrow(monkeypatch):
    monkeypatch.delenv("EVENTING_RAY_LIGHT_WORKERS", raising=False)
    monkeypatch.delenv(SETUP_HOOK_ENV, raising=False)
    assert light_worker_env(windows=True) == {SETUP_HOOK_ENV: SETUP_HOOK, WINDOWS_ENV: "1"}


def test_ray_loads_the_hook_by_its_name():
    from ray._common.utils import load_class

    assert load_class(SETUP_HOOK) is worker_process_setup


PRELOAD_PROBE = r"""
import json, sys
import ray._private.worker as ray_worker
from eventing.workers.ray_setup import worker_process_setup

class FakeWorker:
    def get_serialization_context(self):
        pass

ray_worker.global_worker = FakeWorker()
worker_process_setup()
print(json.dumps({name: name in sys.modules for name in (
    "eventing.workers.hosting", "eventing.workers.worker", "numpy", "pyarrow", "pandas"
)}))
"""


def _preloaded() -> dict[str, bool]:
    """Which modules a worker process's set-up imported (PRELOAD_PROBE in a fresh interpreter)."""
    out = subprocess.run(
        [sys.executable, "-c", PRELOAD_PROBE], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_set_up_imports_what_a_worker_starts_with_but_not_numpy_or_pyarrow(monkeypatch):
    monkeypatch.delenv(WINDOWS_ENV, raising=False)
    assert _preloaded() == {
        "eventing.workers.hosting": True,
        "eventing.workers.worker": True,
        "numpy": False,
        "pyarrow": False,
        "pandas": False,
    }


def test_the_set_up_of_an_instance_for_windows_imports_numpy_and_pyarrow_but_not_pandas(monkeypatch):
    monkeypatch.setenv(WINDOWS_ENV, "1")
    assert _preloaded() == {
        "eventing.workers.hosting": True,
        "eventing.workers.worker": True,
        "numpy": True,
        "pyarrow": True,
        "pandas": False,
    }


def test_windows_deployed_tells_whether_a_deployed_function_has_a_window(tmp_path):
    from eventing.control import lifecycle
    from eventing.core.definition import FunctionDefinition
    from eventing.storage.bucket import LocalBucket
    from eventing.storage.state import as_state
    from eventing.workers.executor import windows_deployed

    data_dir = str(tmp_path)
    LocalBucket.create(data_dir, "src").close()
    plain = {"name": "plain", "source_bucket": "src"}
    window = {"kind": "tumbling", "size": "1m", "time_field": "ts", "aggregates": [{"op": "count"}]}
    lifecycle.save_function(
        data_dir, FunctionDefinition.from_dict(plain), "def on_update(doc, meta):\n    pass\n"
    )
    windowed = FunctionDefinition.from_dict({"name": "windowed", "source_bucket": "src", "window": window})
    lifecycle.save_function(data_dir, windowed, '"""Window-only."""\n')
    state = as_state(data_dir)
    lifecycle.deploy(data_dir, "plain")
    assert not windows_deployed(state)  # saved, not deployed
    lifecycle.deploy(data_dir, "windowed")
    assert windows_deployed(state)
    lifecycle.undeploy(data_dir, "windowed")
    assert not windows_deployed(state)


def test_a_module_that_cannot_be_imported_is_left_to_the_worker_start(monkeypatch):
    from eventing.workers import ray_setup

    monkeypatch.setattr(ray_setup, "PRELOAD", ("eventing.no_such_module", "json"))
    monkeypatch.delitem(sys.modules, "eventing.no_such_module", raising=False)
    ray_setup.preload()  # never raises
    assert "eventing.no_such_module" not in sys.modules
