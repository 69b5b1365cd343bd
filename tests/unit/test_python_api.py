"""The Python API (`eventing.Eventing`): the same operations as the CLI, driven from Python."""

from __future__ import annotations

import pytest

import eventing
from eventing import Eventing, EventingError, FunctionDefinition, RunSummary, Write
from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from functions import FUNCTIONS_DIR


def test_the_public_names_are_exactly_the_documented_ones():
    assert sorted(eventing.__all__) == ["Eventing", "EventingError", "FunctionDefinition", "RunSummary", "Write",
                                        "__version__"]
    for name in eventing.__all__:
        assert getattr(eventing, name) is not None
    with pytest.raises(AttributeError):
        eventing.NoSuchThing  # noqa: B018


def test_a_function_runs_end_to_end_from_python(tmp_path):
    app = Eventing(tmp_path / "data", executor="in-process")
    app.create_bucket("customers")
    app.create_bucket("emails", partitions=4)
    assert app.load("customers", documents=50, mutations=200, seed=3) == 200
    record = app.deploy(FUNCTIONS_DIR / "fn_email.json")
    assert record.state.value == "deployed"

    summary = app.run(until_caught_up=True)
    assert isinstance(summary, RunSummary) and not summary.errors
    stats = app.stats("fn_email")
    assert stats["mutations_seen"] == 200
    assert stats["on_update_success"] + stats["on_delete_success"] + stats.get("no_handler", 0) <= 200
    assert app.bucket("emails").stats()["documents"] > 0 and app.bucket("emails").stats()["partitions"] == 4
    assert sum(w["vbuckets"] for w in app.vbucket_map("fn_email")["workers"]) == 1024

    app.pause("fn_email")
    app.undeploy("fn_email")
    app.delete("fn_email")


def test_a_definition_given_as_data_needs_its_handler_and_writes_go_through_write(tmp_path):
    app = Eventing(tmp_path / "data", executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    defn = FunctionDefinition.from_dict({"name": "copy", "source_bucket": "src",
                                         "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}]})
    with pytest.raises(EventingError, match="handler's source"):
        app.deploy(defn)
    app.deploy(defn, "def on_update(doc, meta):\n    dst[meta.id] = doc\n")
    app.upsert("src", "a", {"x": 1})
    app.remove("src", "a")
    assert app.write("src", [Write("b", OP_UPDATE, encode_document({"x": 2})), Write("c", OP_DELETE)]) == 1
    assert not app.run().errors
    assert app.bucket("dst").get("b") == {"x": 2}
    assert app.bucket("dst").get("a") == {"x": 1}
