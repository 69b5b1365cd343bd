"""A sandboxed window-only function whose handler has no code (a docstring) runs its worker without the
sandbox's child: nothing of its author's runs, so there is nothing to confine, and the child's cost a
mutation would only halve the window's speed. One whose handler has any code still runs in the child;
both write the same window rows."""

from __future__ import annotations

import pytest

from eventing.control import lifecycle
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.storage.factory import create_bucket
from eventing.storage.values import Write
from eventing.workers.hosting import WorkerHost
from eventing.workers.sandbox.host import SandboxedCore
from eventing.workers.sandbox.landlock import sandbox_unavailable
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata.factory import open_store
from sharding import NUM_VBUCKETS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable())),
]

T0 = 1_767_225_600_000
WINDOW = {
    "kind": "tumbling",
    "size": "1m",
    "time_field": "ts",
    "group_by": ["country"],
    "aggregates": ["count", {"op": "sum", "field": "amount"}],
}
DOCUMENTS = 300


def _rows_written(data_dir: str, name: str, handler: str) -> tuple[type, int]:
    defn = FunctionDefinition.from_dict(
        {"name": name, "source_bucket": "src", "isolation": "sandbox", "window": WINDOW}
    )
    lifecycle.save_function(data_dir, defn, handler)
    lifecycle.deploy(data_dir, name)
    generation = open_store(data_dir).get_function(name).generation
    host = WorkerHost(
        WorkerSpec(data_dir, name, generation, "n1/w0", tuple(range(NUM_VBUCKETS)), isolation="sandbox")
    )
    host.call("start")
    try:
        kind = type(host.core)
        report = host.call("step", None, 0.0)
        while not report.caught_up:
            report = host.call("step", None, 0.0)
        host.call("stop")
    finally:
        host.call("close")
    return kind, open_store(data_dir).counters(name)["window_rows_written"]


def test_a_window_only_handler_without_code_runs_unconfined_and_one_with_code_sandboxed(data_dir):
    source = create_bucket(data_dir, "src")
    source.write(
        [
            Write(f"k{i}", OP_UPDATE, encode_document({"ts": T0 + i, "country": "KR", "amount": i}))
            for i in range(DOCUMENTS)
        ]
    )

    docstring = _rows_written(data_dir, "fn_docstring", '"""Window-only: the window does the work."""\n')
    with_code = _rows_written(data_dir, "fn_with_code", "import math\n")

    assert docstring == (WorkerCore, DOCUMENTS)
    assert with_code == (SandboxedCore, DOCUMENTS)
