"""`sandbox_writable`: a sandboxed handler writes in the folders a full admin granted it (a call log) and
still nowhere else; a grant that would open the data directory, or names nothing, stops the deploy with
one line. What the sandbox refuses (a write elsewhere, a module it cannot import) is named, with its fixes,
in the dead letter or the deploy's error."""

from __future__ import annotations

import os

import pytest

from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.errors import ConfigError, HandlerLoadError
from eventing.storage.factory import create_bucket, open_bucket
from eventing.storage.values import Write
from eventing.testing import deploy_function
from eventing.workers.executor import InProcessExecutor
from eventing.workers.sandbox.landlock import sandbox_unavailable
from metadata.factory import open_store

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable())),
]

HANDLER = """
import os


def on_update(doc, meta):
    with open(CALL_LOG, "a") as f:  # granted
        f.write(meta.id + "\\n")
    try:
        with open(os.path.join(OUTSIDE, meta.id), "w") as f:  # not granted
            f.write("x")
        outside = "ok"
    except OSError as exc:
        outside = type(exc).__name__
    out[meta.id] = {"outside": outside}
"""
DOCUMENTS = 10


def _definition(granted: list[str], call_log: str, outside: str) -> FunctionDefinition:
    return FunctionDefinition.from_dict(
        {
            "name": "fn_logged",
            "source_bucket": "src",
            "isolation": "sandbox",
            "sandbox_writable": granted,
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
            "constants": {"CALL_LOG": call_log, "OUTSIDE": outside},
        }
    )


def test_a_sandboxed_handler_appends_to_its_call_log_in_a_granted_folder_and_nowhere_else(data_dir, tmp_path):
    granted, outside = tmp_path / "logs", tmp_path / "outside"
    granted.mkdir()
    outside.mkdir()
    source = create_bucket(data_dir, "src")
    source.write([Write(f"k{i}", OP_UPDATE, encode_document({"v": i})) for i in range(DOCUMENTS)])
    call_log = granted / "calls.log"
    deploy_function(data_dir, _definition([str(granted)], str(call_log), str(outside)), HANDLER)

    summary = EventingService(
        data_dir, InProcessExecutor(), until_caught_up=True, functions=["fn_logged"]
    ).run()

    assert summary.functions["fn_logged"].handled == DOCUMENTS, summary
    assert sorted(call_log.read_text().split()) == sorted(f"k{i}" for i in range(DOCUMENTS))
    docs = {key: doc for key, doc, _ in open_bucket(data_dir, "out").scan()}
    assert sorted(docs) == sorted(f"k{i}" for i in range(DOCUMENTS))
    assert all(doc["outside"] == "PermissionError" for doc in docs.values()), docs
    assert list(outside.iterdir()) == []
    assert not open_store(data_dir, create=False).dlq_rows("fn_logged")


@pytest.mark.parametrize("where", ["data directory", "holds the data directory", "missing"])
def test_a_grant_that_would_open_the_data_directory_or_names_nothing_stops_the_deploy(
    data_dir, tmp_path, where
):
    create_bucket(data_dir, "src")
    path = {
        "data directory": os.path.join(data_dir, "buckets"),
        "holds the data directory": os.path.dirname(os.path.abspath(data_dir)),
        "missing": str(tmp_path / "not-made"),
    }[where]
    with pytest.raises(ConfigError) as refused:
        deploy_function(data_dir, _definition([path], str(tmp_path / "calls.log"), str(tmp_path)), HANDLER)
    message = str(refused.value)
    assert "sandbox_writable of function 'fn_logged'" in message and path in message
    assert ("does not exist" in message) == (where == "missing")


def test_the_ledger_harness_grants_its_call_log_so_a_sandboxed_ledger_records_every_call(data_dir, tmp_path):
    from eventing.testing import LEDGER_HANDLER, check_ledger, ledger_definition, load_source, read_call_log

    source = load_source(data_dir, 50, 400, seed=3)
    calls = tmp_path / "calls.log"
    defn = ledger_definition("fn_l", "src", "ledger", workers=2, call_log=str(calls), isolation="sandbox")
    assert defn.sandbox_writable == (str(calls),) and calls.exists()
    deploy_function(data_dir, defn, LEDGER_HANDLER)
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors, summary.errors
    report = check_ledger(source, open_bucket(data_dir, "ledger"))
    assert report.ok and report.handled == 400, report.summary()
    assert sum(len(seqs) for seqs in read_call_log(calls).values()) == 400  # none refused, none dead-lettered


REFUSED = """
def on_update(doc, meta):
    with open(OUTSIDE + "/" + meta.id, "w") as f:  # not granted: the sandbox refuses it
        f.write("x")
"""


@pytest.mark.parametrize("isolation", ["sandbox", "none"])
def test_a_refused_write_dead_letters_with_the_sandbox_and_its_fix_named(data_dir, tmp_path, isolation):
    outside = tmp_path / "outside"
    outside.mkdir()
    create_bucket(data_dir, "src").upsert("k1", {"v": 1})
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_refused",
            "source_bucket": "src",
            "isolation": isolation,
            "constants": {"OUTSIDE": str(outside)},
        }
    )
    deploy_function(data_dir, defn, REFUSED)
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True, functions=["fn_refused"]).run()
    rows = open_store(data_dir, create=False).dlq_rows("fn_refused")
    if isolation == "none":  # unconfined, the write goes through and names nothing
        assert rows == [] and (outside / "k1").exists()
        return
    (row,) = rows
    assert row.error.startswith("PermissionError: ") and "the sandbox may have refused it" in row.error, (
        row.error
    )
    assert '"sandbox_writable"' in row.error and '"isolation": "none"' in row.error
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("isolation", ["sandbox", "none"])
def test_a_module_a_sandboxed_handler_cannot_import_stops_the_deploy_with_the_sandbox_named(
    data_dir, isolation
):
    create_bucket(data_dir, "src")
    defn = FunctionDefinition.from_dict(
        {"name": "fn_imports", "source_bucket": "src", "isolation": isolation}
    )
    handler = "import no_such_module_here\n\n\ndef on_update(doc, meta):\n    pass\n"
    with pytest.raises(HandlerLoadError) as refused:
        deploy_function(data_dir, defn, handler)
    message = str(refused.value)
    assert "ModuleNotFoundError: No module named 'no_such_module_here'" in message
    assert ("in the sandbox a handler imports from" in message) == (isolation == "sandbox"), message


OWN_REFUSAL = """
def on_update(doc, meta):
    raise PermissionError("not this account")
"""


def test_a_handlers_own_permission_error_is_not_blamed_on_the_sandbox(data_dir):
    create_bucket(data_dir, "src").upsert("k1", {"v": 1})
    defn = FunctionDefinition.from_dict({"name": "fn_own", "source_bucket": "src", "isolation": "sandbox"})
    deploy_function(data_dir, defn, OWN_REFUSAL)
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True, functions=["fn_own"]).run()
    (row,) = open_store(data_dir, create=False).dlq_rows("fn_own")
    assert row.error == "PermissionError: not this account"
