"""eventing: Couchbase-Eventing-style mutation processing on Ray, with event-time windows on PySpark.

The Python API is `Eventing` (eventing.api): buckets, deploy, run, stats, verify from Python. Handler
authors need only `eventing.handler` (Meta, DeleteOptions, log); bindings arrive as globals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eventing.errors import EventingError

__version__ = "0.1.0"

__all__ = ["Eventing", "EventingError", "FunctionDefinition", "RunSummary", "Write", "__version__"]

# Imported on first use: every Ray worker and CLI command imports this package, and the API pulls in the
# whole runtime (~0.6 s), which a worker or `eventing bucket get` does not need.
_LAZY = {
    "Eventing": "eventing.api",
    "FunctionDefinition": "eventing.core.definition",
    "RunSummary": "eventing.control.service",
    "Write": "eventing.storage.values",
}

if TYPE_CHECKING:
    from eventing.api import Eventing
    from eventing.control.service import RunSummary
    from eventing.core.definition import FunctionDefinition
    from eventing.storage.values import Write


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'eventing' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
