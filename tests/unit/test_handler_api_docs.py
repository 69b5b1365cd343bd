"""Every example of docs/handler-api.md (a python handler block followed by its json definition) deploys and
runs on the in-process runtime without a dead letter."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.storage.bucket import LocalBucket
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store

DOC = Path(__file__).resolve().parents[2] / "docs" / "handler-api.md"
PAIR = re.compile(r"```python\n(.*?)```\s*```json\n(.*?)```", re.S)
EXAMPLES = PAIR.findall(DOC.read_text())


def test_the_document_has_an_example_per_feature():
    assert len(EXAMPLES) >= 7


@pytest.mark.parametrize("handler,definition", EXAMPLES, ids=[json.loads(d)["name"] for _, d in EXAMPLES])
def test_example_runs_without_a_dead_letter(data_dir, handler, definition):
    LocalBucket.create(data_dir, "src").upsert("order-1", {"total": 40, "email": "ada@example.com"})
    LocalBucket.create(data_dir, "dst")
    defn = FunctionDefinition.from_dict(json.loads(definition))
    lifecycle.save_function(data_dir, defn, handler)
    lifecycle.deploy(data_dir, defn.name)
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    store = open_store(data_dir)
    assert store.dlq_rows(defn.name) == []
    assert store.counters(defn.name).get("on_update_success") == 1
